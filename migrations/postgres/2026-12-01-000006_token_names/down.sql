ALTER TABLE herald_outbox DROP COLUMN enqueued_by;
