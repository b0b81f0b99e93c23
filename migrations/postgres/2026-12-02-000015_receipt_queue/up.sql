-- The reconciler's work queue, beside the receipts: one narrow row per receipt still to be
-- matched (README, "How delivery status is decided").
--   due_at  when the reconciler takes it next: its arrival, then after each try that found no
--           message the next try of the unmatched schedule
--   tries   how many tries found no message so far (0: not tried yet, "pending")
-- A receipt leaves the queue when it is matched and applied, or when its unmatched day is over
-- (then `outcome = 'unmatched'` on the receipt). Its row in herald_receipts is written when it
-- arrives and once more when it leaves: a try that finds nothing rewrites only this row (about
-- 40 bytes and two index entries) instead of the receipt (about 1 KiB, and an entry in each of
-- its indexes; measured in `herald-bench ingest_pg`: 60 % of the database's time).
CREATE TABLE herald_receipt_queue (
    receipt_id  BIGINT PRIMARY KEY,
    due_at      TIMESTAMPTZ NOT NULL,
    tries       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX herald_receipt_queue_due ON herald_receipt_queue (due_at, receipt_id);
-- Rewritten and deleted all the time, and small: vacuum early, unthrottled.
ALTER TABLE herald_receipt_queue SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

-- Every stored receipt is queued in its own statement, whoever inserts it (Herald's ingest, or
-- an operator's INSERT): one trigger call per statement, over the rows it stored (a duplicate
-- skipped by ON CONFLICT DO NOTHING is not among them). Due at once: its arrival time comes from
-- the Herald host's clock, and the reconciler compares with the database's, so never later
-- than the database's now.
CREATE FUNCTION herald_receipts_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO herald_receipt_queue (receipt_id, due_at)
    SELECT id, LEAST(received_at, now()) FROM herald_new_receipts;
    RETURN NULL;
END
$$;
CREATE TRIGGER herald_receipts_enqueue AFTER INSERT ON herald_receipts
    REFERENCING NEW TABLE AS herald_new_receipts
    FOR EACH STATEMENT EXECUTE FUNCTION herald_receipts_enqueue();
-- A receipt deleted (by retention, which only deletes receipts off the queue, or by hand) takes
-- its queue row along: the queue never holds a receipt that is gone.
CREATE FUNCTION herald_receipts_dequeue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM herald_receipt_queue WHERE receipt_id IN (SELECT id FROM herald_gone_receipts);
    RETURN NULL;
END
$$;
CREATE TRIGGER herald_receipts_dequeue AFTER DELETE ON herald_receipts
    REFERENCING OLD TABLE AS herald_gone_receipts
    FOR EACH STATEMENT EXECUTE FUNCTION herald_receipts_dequeue();

-- The receipts waiting now: new ones, and unmatched ones still tried (their tries and next try
-- move to the queue; their receipt rows say nothing until they leave it).
INSERT INTO herald_receipt_queue (receipt_id, due_at, tries)
SELECT id, COALESCE(next_match_at, received_at), match_attempts FROM herald_receipts
WHERE reconciled_at IS NULL
  AND (outcome IS NULL OR (outcome = 'unmatched' AND next_match_at IS NOT NULL));
UPDATE herald_receipts
SET outcome = NULL, outcome_reason = NULL, match_attempts = 0, next_match_at = NULL
WHERE id IN (SELECT receipt_id FROM herald_receipt_queue) AND outcome IS NOT NULL;

-- The queue replaces both: the receipts no longer need an index on columns the reconciler
-- writes while they wait. (An older Herald still reconciling during an upgrade reads receipts
-- from their own rows and leaves them on the queue: a newer one then applies them again, which
-- changes no status — the same receipt is `unchanged` — only the outcome the receipt shows.)
DROP INDEX herald_receipts_pending;
DROP INDEX herald_receipts_unmatched;
