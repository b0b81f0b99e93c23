-- No wake-up for a sender that is awake. Every application transaction that inserts a due row
-- notified at its commit while a Herald listened, and PostgreSQL holds its notify-queue lock from
-- a notifying commit's pre-commit until that commit is flushed, so such commits flushed one at a
-- time: 16 clients inserting one due row a transaction ran at 0.22 of their rate with nobody
-- listening (README, How it works → Wake-up). A sender that keeps finding rows claims again
-- anyway, so its wake-up is pointless, and now the trigger skips it:
--
-- * herald_awake holds the latest "awake until" a sender promised, in ms since the epoch by the
--   database's clock (0: none). A sender sets it while its claims keep finding rows, and keeps
--   claiming every few ms while it is in the future. A sequence, not a table: its value is read
--   as it is now, whatever the reader's snapshot (a REPEATABLE READ transaction sees a promise
--   withdrawn after it began), and setting it writes no row version.
-- * The trigger, before it looks at the promise, takes the advisory lock (1751477358, 0) shared,
--   held to its commit. A sender stops being awake by withdrawing its promise and then taking
--   that lock once, exclusively, without waiting (pg_try_advisory_xact_lock); it claims once
--   more only after it got it, and until then it keeps claiming every few ms. So every
--   transaction that skipped its notification had committed before that last claim, which sees
--   its rows: nothing waits for the poll because of a promise (README, How it works → Wake-up).
--   A sender that dies awake leaves a promise that lapses within a second; rows whose
--   transactions skipped their notification under it wait for the next poll of any Herald.
CREATE SEQUENCE herald_awake MINVALUE 0 START 0;
GRANT SELECT ON SEQUENCE herald_awake TO PUBLIC;

CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM herald_listeners WHERE seen_at > now() - interval '30 seconds')
       AND EXISTS (SELECT 1 FROM herald_inserted
                   WHERE next_attempt_at <= clock_timestamp() + interval '1 second'
                      OR (next_attempt_at IS NULL AND ordering_key IS NOT NULL
                          AND state = 'scheduled')) THEN
        PERFORM pg_advisory_xact_lock_shared(1751477358, 0);
        IF (SELECT last_value FROM herald_awake)
           <= (extract(epoch FROM clock_timestamp()) * 1000)::bigint THEN
            PERFORM pg_notify('herald_outbox', '');
        END IF;
    END IF;
    RETURN NULL;
END
$$;
