-- The name of the API token that enqueued a message over HTTP (NULL: SQL, the library, or
-- before tokens had names). A token with scope `send` sees only its own messages.
ALTER TABLE herald_outbox ADD COLUMN enqueued_by TEXT;
