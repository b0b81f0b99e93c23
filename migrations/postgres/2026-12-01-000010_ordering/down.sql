DROP FUNCTION herald_enqueue(TEXT, TEXT, TEXT, JSONB, TIMESTAMPTZ, TIMESTAMPTZ, TEXT, INTEGER, TEXT, TEXT);
CREATE FUNCTION herald_enqueue(
    p_event_id     TEXT,
    p_channel      TEXT,
    p_destination  TEXT,
    p_payload      JSONB,
    p_scheduled_at TIMESTAMPTZ DEFAULT now(),
    p_expires_at   TIMESTAMPTZ DEFAULT NULL,
    p_semantics    TEXT DEFAULT 'at_least_once',
    p_max_attempts INTEGER DEFAULT NULL
) RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    v_id BIGINT;
BEGIN
    INSERT INTO herald_outbox (event_id, channel, destination, payload, scheduled_at, expires_at,
                               semantics, max_attempts)
    VALUES (p_event_id, p_channel, p_destination, p_payload, p_scheduled_at, p_expires_at,
            p_semantics, p_max_attempts)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        SELECT id INTO v_id FROM herald_outbox WHERE event_id = p_event_id;
    END IF;
    RETURN v_id;
END
$$;
DROP TRIGGER herald_outbox_ordering ON herald_outbox;
DROP FUNCTION herald_outbox_ordering();
DROP INDEX herald_outbox_ordering_open;
DROP INDEX herald_outbox_ordering;
ALTER TABLE herald_outbox DROP CONSTRAINT herald_outbox_ordering_policy_check;
ALTER TABLE herald_outbox DROP CONSTRAINT herald_outbox_ordering_key_check;
ALTER TABLE herald_outbox DROP COLUMN ordering_released_at;
ALTER TABLE herald_outbox DROP COLUMN ordering_policy;
ALTER TABLE herald_outbox DROP COLUMN ordering_seq;
ALTER TABLE herald_outbox DROP COLUMN ordering_key;
