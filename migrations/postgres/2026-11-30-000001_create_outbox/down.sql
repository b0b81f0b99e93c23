DROP TABLE herald_settings;
DROP TABLE herald_attempts;
DROP FUNCTION herald_enqueue(TEXT, TEXT, TEXT, JSONB, TIMESTAMPTZ, TIMESTAMPTZ, TEXT, INTEGER);
DROP TABLE herald_outbox;
DROP FUNCTION herald_outbox_notify();
DROP FUNCTION herald_outbox_defaults();
