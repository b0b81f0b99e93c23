-- Ordered delivery per key (README, "Ordered delivery"); the columns as on PostgreSQL:
--   ordering_key          optional, 1–255 visible ASCII characters; NULL: no ordering.
--   ordering_seq          the message's place in its key (destination + key). SQLite has one
--                         writer at a time, so places follow commit order by construction.
--   ordering_policy       'block' | 'skip' | NULL (the endpoint's policy, else 'block').
--   ordering_released_at  when a dead or unconfirmed head stopped holding its key.
-- A message waiting behind its key's head is 'scheduled' with next_attempt_at NULL (not due).
ALTER TABLE herald_outbox ADD COLUMN ordering_key TEXT CONSTRAINT herald_outbox_ordering_key_check
    CHECK (ordering_key IS NULL OR (length(ordering_key) BETWEEN 1 AND 255
                                    AND ordering_key NOT GLOB '*[^!-~]*'));
ALTER TABLE herald_outbox ADD COLUMN ordering_seq BIGINT;
ALTER TABLE herald_outbox ADD COLUMN ordering_policy TEXT CONSTRAINT herald_outbox_ordering_policy_check
    CHECK (ordering_policy IS NULL OR ordering_policy IN ('block', 'skip'));
ALTER TABLE herald_outbox ADD COLUMN ordering_released_at TEXT;

CREATE UNIQUE INDEX herald_outbox_ordering ON herald_outbox (ordering_key, destination, ordering_seq)
    WHERE ordering_key IS NOT NULL;
CREATE INDEX herald_outbox_ordering_open ON herald_outbox (ordering_key, destination, ordering_seq)
    WHERE ordering_key IS NOT NULL
      AND state IN ('scheduled', 'retryable', 'sending', 'dead_letter', 'unconfirmed');

-- next_attempt_at defaults to scheduled_at for unkeyed rows; keyed rows get theirs below.
DROP TRIGGER herald_outbox_defaults;
CREATE TRIGGER herald_outbox_defaults AFTER INSERT ON herald_outbox
    FOR EACH ROW WHEN NEW.next_attempt_at IS NULL AND NEW.state IN ('scheduled', 'retryable')
        AND NEW.ordering_key IS NULL
BEGIN
    UPDATE herald_outbox SET next_attempt_at = NEW.scheduled_at WHERE id = NEW.id;
END;

-- A keyed message's place (the next in its key) and whether it waits: it does while an earlier
-- message of its key is open (not finished, or a dead head that still blocks).
CREATE TRIGGER herald_outbox_ordering AFTER INSERT ON herald_outbox
    FOR EACH ROW WHEN NEW.ordering_key IS NOT NULL
BEGIN
    UPDATE herald_outbox SET
        ordering_seq = (SELECT COALESCE(MAX(s.ordering_seq), 0) + 1 FROM herald_outbox AS s
                        WHERE s.ordering_key = NEW.ordering_key
                          AND s.destination = NEW.destination AND s.id <> NEW.id),
        next_attempt_at = CASE
            WHEN NEW.state = 'scheduled' AND EXISTS (
                SELECT 1 FROM herald_outbox AS h
                WHERE h.ordering_key = NEW.ordering_key AND h.destination = NEW.destination
                  AND h.id <> NEW.id
                  AND h.state IN ('scheduled', 'retryable', 'sending', 'dead_letter', 'unconfirmed')
                  AND (h.state IN ('scheduled', 'retryable', 'sending')
                       OR h.ordering_released_at IS NULL))
            THEN NULL
            WHEN NEW.state IN ('scheduled', 'retryable')
            THEN COALESCE(NEW.next_attempt_at, NEW.scheduled_at)
            ELSE NEW.next_attempt_at END
    WHERE id = NEW.id;
END;

-- The fan-out copies the ordering columns to each child (each child's place is its own).
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
        created_at, updated_at, retry_policy_version, state_reason, message_key,
        ordering_key, ordering_policy)
    SELECT NEW.event_id || ':' || m.endpoint, NEW.channel, 'endpoint:' || m.endpoint, NEW.payload,
        NEW.state, NEW.scheduled_at,
        COALESCE(NEW.next_attempt_at,
                 CASE WHEN NEW.state IN ('scheduled', 'retryable') THEN NEW.scheduled_at END),
        NEW.attempts, NEW.max_attempts, NEW.retry_policy, NEW.semantics, NEW.expires_at,
        NEW.lease_until, NEW.lease_owner, NEW.provider_message_id, NEW.last_error_class,
        NEW.delivery_status, NEW.delivery_status_at, NEW.created_at, NEW.updated_at,
        NEW.retry_policy_version, NEW.state_reason, NEW.message_key,
        NEW.ordering_key, NEW.ordering_policy
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
