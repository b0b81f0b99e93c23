-- The wake-up only for a row that is due. The insert trigger notified for every inserting
-- statement, so a message scheduled for later woke every listening Herald for a claim that found
-- nothing, and the application's commit took PostgreSQL's notify-queue lock, which makes
-- notifying commits wait for one another (README, How it works → Wake-up). Such a row is found
-- by the senders' periodic claim (poll_interval_ms) once it is due, as before: the NOTIFY at its
-- commit never found it anyway.
--
-- The statement trigger now sees the rows its statement inserted (a transition table: the rows
-- as stored, after the BEFORE triggers, so a row ON CONFLICT DO NOTHING skipped does not count)
-- and notifies when a Herald listens and one of them is due within a second of the clock (the
-- second covers a commit a moment after the insert), or is a keyed row waiting behind its key's
-- head: a sender whose outcome found that key's lock held by this very insert releases the key
-- when the insert's commit wakes it. A statement in a savepoint rolled back takes its
-- notification with it, as before. Every inserting statement now keeps its rows until its end
-- (the transition table); only when a Herald listens are they read. Measured against marking
-- the transaction from the row trigger (a transaction-local setting): that cost 4-5 % of
-- pgbench's single-row inserts when nobody listens; this costs nothing measurable there
-- (README, How it works → Wake-up).
CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM herald_listeners WHERE seen_at > now() - interval '30 seconds')
       AND EXISTS (SELECT 1 FROM herald_inserted
                   WHERE next_attempt_at <= clock_timestamp() + interval '1 second'
                      OR (next_attempt_at IS NULL AND ordering_key IS NOT NULL
                          AND state = 'scheduled')) THEN
        PERFORM pg_notify('herald_outbox', '');
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER herald_outbox_notify ON herald_outbox;
CREATE TRIGGER herald_outbox_notify AFTER INSERT ON herald_outbox
    REFERENCING NEW TABLE AS herald_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_notify();
