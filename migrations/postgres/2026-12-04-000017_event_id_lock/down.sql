-- The fan-out trigger of migration 000013, without the event id's lock.
CREATE OR REPLACE FUNCTION herald_outbox_fanout() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    v_type  TEXT := substr(NEW.destination, 6);
    v_child herald_outbox;
    v_sub   RECORD;
    v_n     INTEGER := 0;
BEGIN
    IF length(v_type) > 200 OR v_type !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
        RAISE EXCEPTION 'herald: destination % is not a valid event type', quote_literal(NEW.destination)
            USING ERRCODE = 'check_violation',
                  HINT = 'segments of letters, digits, _ and - separated by single dots (type:order.placed)';
    END IF;
    IF EXISTS (SELECT 1 FROM herald_fanouts WHERE event_id = NEW.event_id) THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM herald_outbox WHERE event_id = NEW.event_id) THEN
        RAISE EXCEPTION 'herald: event id % is a message''s: a fan-out needs an event id of its own',
            quote_literal(NEW.event_id) USING ERRCODE = 'unique_violation';
    END IF;
    FOR v_sub IN
        SELECT DISTINCT endpoint FROM herald_subscriptions
        WHERE herald_type_matches(pattern, v_type) ORDER BY endpoint
    LOOP
        v_child := jsonb_populate_record(NEW, jsonb_build_object(
            'id', nextval(pg_get_serial_sequence('herald_outbox', 'id')),
            'event_id', NEW.event_id || ':' || v_sub.endpoint,
            'destination', 'endpoint:' || v_sub.endpoint,
            'request_fingerprint', NULL));
        INSERT INTO herald_outbox VALUES (v_child.*) ON CONFLICT (event_id) DO NOTHING;
        IF NOT FOUND THEN
            -- The child's event id is taken. By the same fan-out committed meanwhile (this
            -- insert waited for it): a no-op, as an event id fanned out already is. By another
            -- message: refused, as the HTTP path refuses it.
            IF EXISTS (SELECT 1 FROM herald_fanouts
                       WHERE event_id = NEW.event_id AND endpoint = v_sub.endpoint) THEN
                RETURN NULL;
            END IF;
            RAISE EXCEPTION 'herald: event id % is a message''s: a fan-out needs event ids of its own',
                quote_literal(v_child.event_id) USING ERRCODE = 'unique_violation';
        END IF;
        INSERT INTO herald_fanouts (event_id, endpoint, event_type, message_event_id, created_at)
        VALUES (NEW.event_id, v_sub.endpoint, v_type, v_child.event_id, NEW.created_at)
        ON CONFLICT DO NOTHING;
        v_n := v_n + 1;
    END LOOP;
    IF v_n = 0 THEN
        RAISE EXCEPTION 'herald: no endpoint subscribes to event type %', quote_literal(v_type)
            USING ERRCODE = 'check_violation',
                  HINT = 'subscribe an endpoint with [endpoints.NAME] event_types and restart Herald';
    END IF;
    RETURN NULL;
END
$$;
