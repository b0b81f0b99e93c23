CREATE INDEX herald_receipts_pending ON herald_receipts (id)
    WHERE reconciled_at IS NULL AND outcome IS NULL;
CREATE INDEX herald_receipts_unmatched ON herald_receipts (next_match_at)
    WHERE reconciled_at IS NULL AND outcome = 'unmatched';
UPDATE herald_receipts
SET outcome = 'unmatched', outcome_reason = 'no message with its event id or provider message id yet',
    match_attempts = (SELECT q.tries FROM herald_receipt_queue AS q WHERE q.receipt_id = herald_receipts.id),
    next_match_at = (SELECT q.due_at FROM herald_receipt_queue AS q WHERE q.receipt_id = herald_receipts.id)
WHERE id IN (SELECT receipt_id FROM herald_receipt_queue WHERE tries > 0);
DROP TRIGGER herald_receipts_dequeue;
DROP TRIGGER herald_receipts_enqueue;
DROP TABLE herald_receipt_queue;
