-- Delivery receipts from providers, stored before they are acknowledged. One row per provider
-- event; a retry of the same event is a no-op on herald_receipts_source_event_key.
CREATE TABLE herald_receipts (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL,
    source               TEXT NOT NULL,
    provider_event_id    TEXT NOT NULL,
    event_type           TEXT NOT NULL,
    provider_type        TEXT NOT NULL,
    event_time           TEXT,
    received_at          TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')),
    herald_event_id      TEXT,
    provider_message_id  TEXT,
    raw                  TEXT NOT NULL,
    reconciled_at        TEXT,
    -- A one-time value the signature covers where the body is not signed (Mailgun's token): a
    -- second event under the same signature is a replay and is never stored.
    replay_key           TEXT,
    CONSTRAINT herald_receipts_source_event_key UNIQUE (source, provider_event_id)
);
CREATE UNIQUE INDEX herald_receipts_replay ON herald_receipts (source, replay_key)
    WHERE replay_key IS NOT NULL;
CREATE INDEX herald_receipts_herald_event_id ON herald_receipts (herald_event_id);
CREATE INDEX herald_receipts_provider_message_id ON herald_receipts (provider_message_id);
CREATE INDEX herald_receipts_pending ON herald_receipts (event_time, id) WHERE reconciled_at IS NULL;
