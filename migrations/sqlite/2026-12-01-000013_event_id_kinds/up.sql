-- One event id names one thing: a message, or a fan-out (whose messages are EVENT_ID:ENDPOINT).
-- A plain SQL fan-out refuses a taken event id, as POST /v1/messages and the Rust API do, and
-- writes nothing. (A plain SQL message is not checked against fan-outs: that lookup would run
-- on every insert.) SQLite runs the most recently created trigger first: this one runs before
-- herald_outbox_fanout.
CREATE TRIGGER herald_outbox_fanout_event_id BEFORE INSERT ON herald_outbox
    FOR EACH ROW WHEN NEW.channel = 'webhook' AND substr(NEW.destination, 1, 5) = 'type:'
BEGIN
    -- Its own event id, or one of its messages' (EVENT_ID:ENDPOINT for each subscriber), held
    -- by another message; an event id fanned out already is a no-op (herald_outbox_fanout).
    SELECT RAISE(ABORT, 'herald: this event id is a message''s: a fan-out needs an event id of its own')
    WHERE NOT EXISTS (SELECT 1 FROM herald_fanouts WHERE event_id = NEW.event_id)
      AND EXISTS (
        SELECT 1 FROM herald_outbox
        WHERE event_id = NEW.event_id
           OR event_id IN (
              SELECT NEW.event_id || ':' || s.endpoint FROM herald_subscriptions AS s
              WHERE s.pattern = '*' OR s.pattern = substr(NEW.destination, 6)
                 OR (substr(s.pattern, -2) = '.*'
                     AND length(substr(NEW.destination, 6)) > length(s.pattern) - 1
                     AND substr(substr(NEW.destination, 6), 1, length(s.pattern) - 1)
                         = substr(s.pattern, 1, length(s.pattern) - 1))));
END;
