-- The retry policy version a message was enqueued under (name@hash of parameters and
-- classification table). Herald's own ways in set it; a plain INSERT leaves it NULL and the first
-- claim fills in the version then in force.
ALTER TABLE herald_outbox ADD COLUMN retry_policy_version TEXT;

-- The wake-up follows where Herald listens. Each Herald process that LISTENs registers here and
-- renews its row every 10 s (and removes it when it stops); the insert trigger notifies only
-- while a row is fresh (30 s). With every sender polling (listen_notify = false, or behind a
-- transaction-mode PgBouncer), application commits never take PostgreSQL's notify-queue lock.
-- Readable by every role: an application role with nothing but INSERT on herald_outbox can
-- still insert (the trigger runs with its privileges).
CREATE TABLE herald_listeners (
    owner    TEXT PRIMARY KEY,
    seen_at  TIMESTAMPTZ NOT NULL
);
GRANT SELECT ON herald_listeners TO PUBLIC;

CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM herald_listeners WHERE seen_at > now() - interval '30 seconds') THEN
        PERFORM pg_notify('herald_outbox', '');
    END IF;
    RETURN NULL;
END
$$;
