-- The wake-up only for a row that is due. The insert trigger notified for every inserting
-- statement, so a message scheduled for later woke every listening Herald for a claim that found
-- nothing, and the application's commit took PostgreSQL's notify-queue lock, which makes
-- notifying commits wait for one another (README, How it works → Wake-up). Such a row is found
-- by the senders' periodic claim (poll_interval_ms) once it is due, as before: the NOTIFY at its
-- commit never found it anyway.
--
-- The row trigger that fills next_attempt_at in marks the transaction when a row is due within a
-- second of the clock (the second covers a commit a moment after the insert): a transaction-local
-- setting, herald.wake. A savepoint rolled back takes its mark back with it. The statement
-- trigger notifies only when the mark is there and a Herald listens. A keyed row that waits
-- behind its key's head is marked too (it is due when its key frees it): one wake-up too many,
-- as before.
CREATE OR REPLACE FUNCTION herald_outbox_defaults() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.next_attempt_at IS NULL AND NEW.state IN ('scheduled', 'retryable') THEN
        NEW.next_attempt_at := NEW.scheduled_at;
    END IF;
    IF NEW.next_attempt_at <= clock_timestamp() + interval '1 second' THEN
        PERFORM set_config('herald.wake', 'on', true);
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('herald.wake', true) = 'on'
       AND EXISTS (SELECT 1 FROM herald_listeners WHERE seen_at > now() - interval '30 seconds') THEN
        PERFORM pg_notify('herald_outbox', '');
    END IF;
    RETURN NULL;
END
$$;
