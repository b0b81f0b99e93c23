-- Fan-out (destination 'type:EVENT.TYPE') and retention.
--
-- herald_subscriptions: which endpoint subscribes to which event-type pattern. Written by Herald
-- at start-up (herald serve, herald migrate) from [endpoints.NAME] event_types — the config file
-- is the source of truth; this copy lets the SQL ways in expand a fan-out inside the caller's
-- own transaction.
CREATE TABLE herald_subscriptions (
    endpoint  TEXT NOT NULL,
    pattern   TEXT NOT NULL,
    PRIMARY KEY (endpoint, pattern)
);

-- herald_fanouts: one row per child of a fan-out, so the children are found from the original
-- event id (GET /v1/messages/{event_id}) and a repeated event id creates nothing new.
CREATE TABLE herald_fanouts (
    event_id          TEXT NOT NULL,
    endpoint          TEXT NOT NULL,
    event_type        TEXT NOT NULL,
    message_event_id  TEXT NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, endpoint)
);
CREATE INDEX herald_fanouts_message ON herald_fanouts (message_event_id);

-- The matching rule of src/domain/event_type.rs: '*' is every type, 'P.*' every type with one or
-- more segments after 'P.', anything else exactly that type.
CREATE FUNCTION herald_type_matches(p_pattern TEXT, p_type TEXT) RETURNS BOOLEAN
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_pattern = '*'
        OR p_pattern = p_type
        OR (right(p_pattern, 2) = '.*'
            AND length(p_type) > length(p_pattern) - 1
            AND left(p_type, length(p_pattern) - 1) = left(p_pattern, length(p_pattern) - 1))
$$;

-- A webhook row inserted with destination 'type:EVENT.TYPE' — by a plain INSERT or
-- herald_enqueue(...) — becomes one row per subscribed endpoint, in the same statement and so in
-- the caller's transaction: event id '{event_id}:{endpoint}', destination 'endpoint:{endpoint}',
-- every other column copied (future columns too: the copy is of the whole row). The 'type:' row
-- itself is not stored (the trigger returns NULL: the INSERT reports 0 rows, herald_enqueue
-- returns NULL). An event id already fanned out is a no-op. An invalid event type, or a type no
-- endpoint subscribes to, raises an exception: the caller's transaction fails, nothing is
-- half-written. SECURITY DEFINER: an application role needs only INSERT on herald_outbox.
CREATE FUNCTION herald_outbox_fanout() RETURNS trigger
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
-- After herald_outbox_defaults (triggers fire in name order), so next_attempt_at is filled in.
CREATE TRIGGER herald_outbox_fanout BEFORE INSERT ON herald_outbox
    FOR EACH ROW WHEN (NEW.channel = 'webhook' AND NEW.destination LIKE 'type:%')
    EXECUTE FUNCTION herald_outbox_fanout();

-- Retention reads finished rows by age; only those rows are in these indexes. Their predicates
-- are written exactly as retention's statements write them (literal SQL), so both planners use
-- them.
CREATE INDEX herald_outbox_done ON herald_outbox (updated_at)
    WHERE state IN ('delivered', 'canceled', 'expired');
CREATE INDEX herald_outbox_dead ON herald_outbox (updated_at) WHERE state = 'dead_letter';
CREATE INDEX herald_receipts_unmatched_age ON herald_receipts (received_at)
    WHERE message_id IS NULL AND outcome = 'unmatched';

-- Autovacuum for queue tables (see README, "Retention"). herald_outbox: every message is
-- updated several times (claim, outcome) and deleted by retention, and those updates touch
-- indexed columns, so they are not HOT: dead tuples pile up fast. Vacuum after 1 % of the table
-- (plus 1,000 rows) has changed instead of the default 20 %, and do not throttle that vacuum
-- (cost delay 0: the table's hot part is small and the claim index must stay lean). Fillfactor
-- 90 leaves room on each page so a new row version can stay on its page.
ALTER TABLE herald_outbox SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0,
    fillfactor = 90
);
-- herald_attempts and herald_receipts: insert-mostly, deleted in batches by retention. Vacuum
-- after 5 % dead (default 20 %), and after 5 % new rows (keeps the visibility map current, so
-- index-only reads stay cheap).
ALTER TABLE herald_attempts SET (
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05
);
ALTER TABLE herald_receipts SET (
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05
);
