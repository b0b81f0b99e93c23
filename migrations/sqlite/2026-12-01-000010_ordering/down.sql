DROP TRIGGER herald_outbox_fanout;
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

DROP TRIGGER herald_outbox_ordering;
DROP TRIGGER herald_outbox_defaults;
CREATE TRIGGER herald_outbox_defaults AFTER INSERT ON herald_outbox
    FOR EACH ROW WHEN NEW.next_attempt_at IS NULL AND NEW.state IN ('scheduled', 'retryable')
BEGIN
    UPDATE herald_outbox SET next_attempt_at = NEW.scheduled_at WHERE id = NEW.id;
END;
DROP INDEX herald_outbox_ordering_open;
DROP INDEX herald_outbox_ordering;
ALTER TABLE herald_outbox DROP COLUMN ordering_released_at;
ALTER TABLE herald_outbox DROP COLUMN ordering_policy;
ALTER TABLE herald_outbox DROP COLUMN ordering_seq;
ALTER TABLE herald_outbox DROP COLUMN ordering_key;
