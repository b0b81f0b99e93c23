DROP TRIGGER herald_outbox_notify ON herald_outbox;
CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM herald_listeners WHERE seen_at > now() - interval '30 seconds') THEN
        PERFORM pg_notify('herald_outbox', '');
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER herald_outbox_notify AFTER INSERT ON herald_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_notify();
