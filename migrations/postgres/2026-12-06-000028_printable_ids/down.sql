CREATE OR REPLACE FUNCTION herald_outbox_defaults() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.next_attempt_at IS NULL AND NEW.state IN ('scheduled', 'retryable') THEN
        NEW.next_attempt_at := NEW.scheduled_at;
    END IF;
    RETURN NEW;
END
$$;
