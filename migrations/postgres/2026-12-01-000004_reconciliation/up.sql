-- Reconciliation: each receipt is matched to its message and applied by the reconciler.
--   message_id      the message it was matched to (NULL while unmatched)
--   outcome         applied | superseded | unchanged | history | unmatched (see the README,
--                   "How delivery status is decided"); outcome_reason says why, in words
--   match_attempts, next_match_at
--                   an unmatched receipt is tried again with backoff until its message appears,
--                   for a day; then next_match_at is NULL and it stays listed as unmatched
-- reconciled_at (already there) is set once the receipt is matched and applied; until then the
-- receipt is pending.
ALTER TABLE herald_receipts ADD COLUMN message_id BIGINT;
ALTER TABLE herald_receipts ADD COLUMN outcome TEXT;
ALTER TABLE herald_receipts ADD COLUMN outcome_reason TEXT;
ALTER TABLE herald_receipts ADD COLUMN match_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE herald_receipts ADD COLUMN next_match_at TIMESTAMPTZ;
DROP INDEX herald_receipts_pending;
CREATE INDEX herald_receipts_pending ON herald_receipts (id)
    WHERE reconciled_at IS NULL AND outcome IS NULL;
CREATE INDEX herald_receipts_unmatched ON herald_receipts (next_match_at)
    WHERE reconciled_at IS NULL AND outcome = 'unmatched';
CREATE INDEX herald_receipts_message ON herald_receipts (message_id) WHERE message_id IS NOT NULL;

-- Why a message is in its state when the state alone does not say (dead_letter after the
-- unconfirmed deadline: 'unconfirmed').
ALTER TABLE herald_outbox ADD COLUMN state_reason TEXT;
-- The reconciler looks at unconfirmed messages every pass (settle from stored receipts, or
-- dead-letter after the deadline): only those rows.
CREATE INDEX herald_outbox_unconfirmed ON herald_outbox (updated_at) WHERE state = 'unconfirmed';
-- The key of Herald's deterministic email Message-ID (<KEY@message_id_domain>): a receipt that
-- carries only the Message-ID finds its email through it. Set at enqueue, or at the first claim
-- for a plain SQL insert.
ALTER TABLE herald_outbox ADD COLUMN message_key TEXT;
CREATE INDEX herald_outbox_message_key ON herald_outbox (message_key) WHERE message_key IS NOT NULL;
-- Receipts that carry only the provider's message id find their message through it.
CREATE INDEX herald_outbox_provider_message_id ON herald_outbox (provider_message_id)
    WHERE provider_message_id IS NOT NULL;
