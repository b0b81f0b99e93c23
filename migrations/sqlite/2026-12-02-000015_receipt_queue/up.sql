-- The reconciler's work queue, beside the receipts (see migrations/postgres, same version).
CREATE TABLE herald_receipt_queue (
    receipt_id  INTEGER PRIMARY KEY NOT NULL,
    due_at      TEXT NOT NULL,
    tries       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX herald_receipt_queue_due ON herald_receipt_queue (due_at, receipt_id);

-- Every stored receipt is queued, whoever inserts it (a duplicate skipped by ON CONFLICT DO
-- NOTHING fires nothing).
CREATE TRIGGER herald_receipts_enqueue AFTER INSERT ON herald_receipts
BEGIN
    INSERT INTO herald_receipt_queue (receipt_id, due_at) VALUES (NEW.id, NEW.received_at);
END;
-- A receipt deleted takes its queue row along.
CREATE TRIGGER herald_receipts_dequeue AFTER DELETE ON herald_receipts
BEGIN
    DELETE FROM herald_receipt_queue WHERE receipt_id = OLD.id;
END;

INSERT INTO herald_receipt_queue (receipt_id, due_at, tries)
SELECT id, COALESCE(next_match_at, received_at), match_attempts FROM herald_receipts
WHERE reconciled_at IS NULL
  AND (outcome IS NULL OR (outcome = 'unmatched' AND next_match_at IS NOT NULL));
UPDATE herald_receipts
SET outcome = NULL, outcome_reason = NULL, match_attempts = 0, next_match_at = NULL
WHERE id IN (SELECT receipt_id FROM herald_receipt_queue) AND outcome IS NOT NULL;

DROP INDEX herald_receipts_pending;
DROP INDEX herald_receipts_unmatched;
