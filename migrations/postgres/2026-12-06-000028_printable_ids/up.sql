-- event_id and destination are shown in logs, on terminals (herald explain, herald dlq list) and
-- on the admin page; an application's INSERT could store control characters in them (an event
-- id with ESC[31m and a newline forged a log line and drove the terminal of whoever ran `herald
-- dlq list`; a right-to-left override turned Herald's own words around it backwards). The API
-- already takes only visible ASCII in an event id. Refused at the insert from now on, by the
-- defaults trigger every insert runs already (no trigger more on the hot path); rows stored
-- before are left as they are (a CHECK would be tested at each of their updates too, and a
-- message whose outcome cannot be written is worse than one shown oddly).
CREATE OR REPLACE FUNCTION herald_outbox_defaults() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.event_id ~ '[\u0001-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]'
        OR NEW.destination ~ '[\u0001-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]' THEN
        RAISE EXCEPTION 'herald_outbox_printable: event_id and destination must hold no control or bidirectional-formatting characters'
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.next_attempt_at IS NULL AND NEW.state IN ('scheduled', 'retryable') THEN
        NEW.next_attempt_at := NEW.scheduled_at;
    END IF;
    RETURN NEW;
END
$$;
