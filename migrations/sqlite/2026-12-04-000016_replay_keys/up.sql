-- Every one-time signature value a source's events came with (see migrations/postgres, same
-- version).
CREATE TABLE herald_replay_keys (
    source             TEXT NOT NULL,
    replay_key         TEXT NOT NULL,
    provider_event_id  TEXT NOT NULL,
    seen_at            TEXT NOT NULL,
    PRIMARY KEY (source, replay_key)
);
CREATE INDEX herald_replay_keys_seen ON herald_replay_keys (seen_at);
INSERT OR IGNORE INTO herald_replay_keys (source, replay_key, provider_event_id, seen_at)
    SELECT source, replay_key, provider_event_id, received_at
    FROM herald_receipts WHERE replay_key IS NOT NULL;
