-- Support: skips of a key's dead or unconfirmed head, audited as replays are (who, when, why,
-- from which state): a skip changes what a key's order means, and was only logged.
CREATE TABLE herald_skips (
    id          BIGSERIAL PRIMARY KEY,
    message_id  BIGINT NOT NULL REFERENCES herald_outbox (id) ON DELETE CASCADE,
    who         TEXT NOT NULL,
    reason      TEXT NOT NULL,
    from_state  TEXT NOT NULL,
    skipped_at  TIMESTAMPTZ NOT NULL
);
CREATE INDEX herald_skips_message ON herald_skips (message_id, id);
