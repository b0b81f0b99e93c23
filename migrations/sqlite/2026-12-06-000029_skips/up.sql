-- As PostgreSQL's migration of this name: skips of a key's head, audited. Times as in
-- herald_outbox.
CREATE TABLE herald_skips (
    id          INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL,
    message_id  BIGINT NOT NULL REFERENCES herald_outbox (id) ON DELETE CASCADE,
    who         TEXT NOT NULL,
    reason      TEXT NOT NULL,
    from_state  TEXT NOT NULL,
    skipped_at  TEXT NOT NULL
);
CREATE INDEX herald_skips_message ON herald_skips (message_id, id);
