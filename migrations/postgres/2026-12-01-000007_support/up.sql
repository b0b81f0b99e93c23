-- Support: replays (redrives) by a person, audited.
--   attempt_base  the value of `attempts` when the current attempt series began (0 until the
--                 first replay): `attempts` keeps counting every attempt ever made, the attempt
--                 budget (max_attempts) counts `attempts - attempt_base`, the attempts of the series.
ALTER TABLE herald_outbox ADD COLUMN attempt_base INTEGER NOT NULL DEFAULT 0;

-- One row per replay: who (the API token's name, or cli:USER), when, why, from which state,
-- whether forced (a delivered message), the attempt number the new series starts at, and
-- expires_at before and after (changed only when the replay asked).
CREATE TABLE herald_replays (
    id                 BIGSERIAL PRIMARY KEY,
    message_id         BIGINT NOT NULL REFERENCES herald_outbox (id) ON DELETE CASCADE,
    event_id           TEXT NOT NULL,
    who                TEXT NOT NULL,
    reason             TEXT NOT NULL,
    from_state         TEXT NOT NULL,
    forced             BOOLEAN NOT NULL,
    series_start       INTEGER NOT NULL,
    expires_at_before  TIMESTAMPTZ,
    expires_at_after   TIMESTAMPTZ,
    replayed_at        TIMESTAMPTZ NOT NULL
);
CREATE INDEX herald_replays_message ON herald_replays (message_id, id);

-- The dead-letter listing walks (updated_at, id) of dead_letter rows only; a dead letter's
-- updated_at is when it was dead-lettered (nothing else updates it while it stays dead).
CREATE INDEX herald_outbox_dead_letters ON herald_outbox (updated_at, id) WHERE state = 'dead_letter';
