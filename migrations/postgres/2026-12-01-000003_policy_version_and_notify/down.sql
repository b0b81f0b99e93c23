CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('herald_outbox', '');
    RETURN NULL;
END
$$;
DROP TABLE herald_listeners;
ALTER TABLE herald_outbox DROP COLUMN retry_policy_version;
