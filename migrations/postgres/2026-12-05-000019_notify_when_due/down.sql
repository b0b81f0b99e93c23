CREATE OR REPLACE FUNCTION herald_outbox_defaults() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.next_attempt_at IS NULL AND NEW.state IN ('scheduled', 'retryable') THEN
        NEW.next_attempt_at := NEW.scheduled_at;
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM herald_listeners WHERE seen_at > now() - interval '30 seconds') THEN
        PERFORM pg_notify('herald_outbox', '');
    END IF;
    RETURN NULL;
END
$$;
