-- Fan-out (destination 'type:EVENT.TYPE') and retention.
--
-- herald_subscriptions: which endpoint subscribes to which event-type pattern, written by Herald
-- at start-up (herald serve, herald migrate) from [endpoints.NAME] event_types.
CREATE TABLE herald_subscriptions (
    endpoint  TEXT NOT NULL,
    pattern   TEXT NOT NULL,
    PRIMARY KEY (endpoint, pattern)
);

-- herald_fanouts: one row per child of a fan-out (children found from the original event id).
CREATE TABLE herald_fanouts (
    event_id          TEXT NOT NULL,
    endpoint          TEXT NOT NULL,
    event_type        TEXT NOT NULL,
    message_event_id  TEXT NOT NULL,
    created_at        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')),
    PRIMARY KEY (event_id, endpoint)
);
CREATE INDEX herald_fanouts_message ON herald_fanouts (message_event_id);

-- A webhook row inserted with destination 'type:EVENT.TYPE' becomes one row per subscribed
-- endpoint in the same statement (so in the caller's transaction): event id
-- '{event_id}:{endpoint}', destination 'endpoint:{endpoint}', the other columns copied (the
-- columns listed here). The 'type:' row itself is not stored (RAISE(IGNORE): the INSERT reports
-- 0 changes). An event id already fanned out is a no-op. An invalid event type or a type no
-- endpoint subscribes to aborts the statement (RAISE(ABORT): the statement's changes are undone,
-- the caller's transaction stays open and the caller decides). Matching as in
-- src/domain/event_type.rs.
CREATE TRIGGER herald_outbox_fanout BEFORE INSERT ON herald_outbox
    FOR EACH ROW WHEN NEW.channel = 'webhook' AND substr(NEW.destination, 1, 5) = 'type:'
BEGIN
    SELECT RAISE(ABORT, 'herald: destination is not a valid event type (type:order.placed)')
    WHERE length(substr(NEW.destination, 6)) NOT BETWEEN 1 AND 200
       OR substr(NEW.destination, 6) GLOB '*[^A-Za-z0-9_.-]*'
       OR substr(NEW.destination, 6, 1) = '.'
       OR substr(NEW.destination, -1) = '.'
       OR instr(substr(NEW.destination, 6), '..') > 0;
    SELECT RAISE(IGNORE)
    WHERE EXISTS (SELECT 1 FROM herald_fanouts WHERE event_id = NEW.event_id);
    SELECT RAISE(ABORT, 'herald: no endpoint subscribes to this event type')
    WHERE NOT EXISTS (
        SELECT 1 FROM herald_subscriptions AS s
        WHERE s.pattern = '*' OR s.pattern = substr(NEW.destination, 6)
           OR (substr(s.pattern, -2) = '.*'
               AND length(substr(NEW.destination, 6)) > length(s.pattern) - 1
               AND substr(substr(NEW.destination, 6), 1, length(s.pattern) - 1)
                   = substr(s.pattern, 1, length(s.pattern) - 1)));
    INSERT INTO herald_outbox (event_id, channel, destination, payload, state, scheduled_at,
        next_attempt_at, attempts, max_attempts, retry_policy, semantics, expires_at, lease_until,
        lease_owner, provider_message_id, last_error_class, delivery_status, delivery_status_at,
        created_at, updated_at, retry_policy_version, state_reason, message_key)
    SELECT NEW.event_id || ':' || m.endpoint, NEW.channel, 'endpoint:' || m.endpoint, NEW.payload,
        NEW.state, NEW.scheduled_at,
        COALESCE(NEW.next_attempt_at,
                 CASE WHEN NEW.state IN ('scheduled', 'retryable') THEN NEW.scheduled_at END),
        NEW.attempts, NEW.max_attempts, NEW.retry_policy, NEW.semantics, NEW.expires_at,
        NEW.lease_until, NEW.lease_owner, NEW.provider_message_id, NEW.last_error_class,
        NEW.delivery_status, NEW.delivery_status_at, NEW.created_at, NEW.updated_at,
        NEW.retry_policy_version, NEW.state_reason, NEW.message_key
    FROM (SELECT DISTINCT s.endpoint FROM herald_subscriptions AS s
          WHERE s.pattern = '*' OR s.pattern = substr(NEW.destination, 6)
             OR (substr(s.pattern, -2) = '.*'
                 AND length(substr(NEW.destination, 6)) > length(s.pattern) - 1
                 AND substr(substr(NEW.destination, 6), 1, length(s.pattern) - 1)
                     = substr(s.pattern, 1, length(s.pattern) - 1))) AS m
    WHERE NOT EXISTS (SELECT 1 FROM herald_outbox WHERE event_id = NEW.event_id || ':' || m.endpoint)
    ORDER BY m.endpoint;
    INSERT INTO herald_fanouts (event_id, endpoint, event_type, message_event_id, created_at)
    SELECT NEW.event_id, m.endpoint, substr(NEW.destination, 6), NEW.event_id || ':' || m.endpoint,
        NEW.created_at
    FROM (SELECT DISTINCT s.endpoint FROM herald_subscriptions AS s
          WHERE s.pattern = '*' OR s.pattern = substr(NEW.destination, 6)
             OR (substr(s.pattern, -2) = '.*'
                 AND length(substr(NEW.destination, 6)) > length(s.pattern) - 1
                 AND substr(substr(NEW.destination, 6), 1, length(s.pattern) - 1)
                     = substr(s.pattern, 1, length(s.pattern) - 1))) AS m;
    SELECT RAISE(IGNORE);
END;

-- Retention reads finished rows by age; only those rows are in these indexes. Their predicates
-- are written exactly as retention's statements write them (literal SQL), so both planners use
-- them.
CREATE INDEX herald_outbox_done ON herald_outbox (updated_at)
    WHERE state IN ('delivered', 'canceled', 'expired');
CREATE INDEX herald_outbox_dead ON herald_outbox (updated_at) WHERE state = 'dead_letter';
CREATE INDEX herald_receipts_unmatched_age ON herald_receipts (received_at)
    WHERE message_id IS NULL AND outcome = 'unmatched';
