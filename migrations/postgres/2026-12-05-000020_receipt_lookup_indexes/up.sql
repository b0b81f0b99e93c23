-- Indexes that only Herald's own queries need (README, "Performance"). Every stored receipt
-- wrote an entry into herald_receipts_herald_event_id and herald_receipts_provider_message_id,
-- and since the reconciler's queue (000015) no statement of Herald's reads receipts by either:
-- the reconciler matches a receipt to its message by looking up the message (herald_outbox's
-- event id, message key and provider message id indexes), and a message's receipts are read by
-- message_id (herald_receipts_message). An operator who looks receipts up by these columns by
-- hand can create an index of their own.
DROP INDEX IF EXISTS herald_receipts_herald_event_id;
DROP INDEX IF EXISTS herald_receipts_provider_message_id;
