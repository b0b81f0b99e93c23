CREATE OR REPLACE FUNCTION herald_outbox_ordering() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_open BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(1751477356, hashtext(NEW.destination || chr(10) || NEW.ordering_key));
    SELECT COALESCE(max(ordering_seq), 0) + 1 INTO NEW.ordering_seq FROM herald_outbox
    WHERE ordering_key = NEW.ordering_key AND destination = NEW.destination;
    IF NEW.state = 'scheduled' THEN
        SELECT h.ordering_seq INTO v_open FROM herald_outbox h
        WHERE h.ordering_key = NEW.ordering_key AND h.destination = NEW.destination
          AND h.state IN ('scheduled', 'retryable', 'sending', 'dead_letter', 'unconfirmed')
          AND (h.state IN ('scheduled', 'retryable', 'sending') OR h.ordering_released_at IS NULL)
        ORDER BY h.ordering_seq LIMIT 1;
        IF v_open IS NOT NULL THEN
            NEW.next_attempt_at := NULL;
        END IF;
    END IF;
    RETURN NEW;
END
$$;
DROP TABLE herald_ordering_locks;
