-- The retry policy version a message was enqueued under (name@hash of parameters and
-- classification table). Herald's own ways in set it; a plain INSERT leaves it NULL and the first
-- claim fills in the version then in force.
ALTER TABLE herald_outbox ADD COLUMN retry_policy_version TEXT;

-- The wake-up follows Herald's `listen_notify` setting: when every Herald process on this
-- database polls instead of listening, Herald stores listen_notify = 'off' in herald_settings and
-- inserts no longer take PostgreSQL's notify-queue lock at commit. No row (or 'on') notifies.
CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM herald_settings WHERE key = 'listen_notify' AND value = 'off') THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('herald_outbox', '');
    RETURN NULL;
END
$$;
