CREATE INDEX herald_receipts_pending ON herald_receipts (id)
    WHERE reconciled_at IS NULL AND outcome IS NULL;
CREATE INDEX herald_receipts_unmatched ON herald_receipts (next_match_at)
    WHERE reconciled_at IS NULL AND outcome = 'unmatched';
-- Unmatched receipts still tried carry their tries and next try again.
UPDATE herald_receipts AS r
SET outcome = 'unmatched', outcome_reason = 'no message with its event id or provider message id yet',
    match_attempts = q.tries, next_match_at = q.due_at
FROM herald_receipt_queue AS q
WHERE r.id = q.receipt_id AND q.tries > 0;
DROP TRIGGER herald_receipts_dequeue ON herald_receipts;
DROP FUNCTION herald_receipts_dequeue();
DROP TRIGGER herald_receipts_enqueue ON herald_receipts;
DROP FUNCTION herald_receipts_enqueue();
DROP TABLE herald_receipt_queue;
