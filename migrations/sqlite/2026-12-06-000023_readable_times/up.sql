-- As PostgreSQL's migration of this name: every time an application writes into herald_outbox
-- must be one Herald can read back. The columns' checks test the spelling only, so
-- '2026-02-30 00:00:00+00:00' or '2026-01-01 10:00:00abc+00:00' was stored, and the claim, which
-- reads whole rows, failed at it every time: nothing was sent any more.
--
-- scheduled_at, next_attempt_at and expires_at, which compare as text: a real date and time of
-- the years 0001-9999, in UTC, written 'YYYY-MM-DD HH:MM:SS[.fraction of 1-9 digits]+00:00' (the
-- date and whole seconds checked by SQLite's own calendar, without the fraction, which
-- datetime() would round to the millisecond). The other times, which Herald only reads: a real
-- date, then a time from HH:MM on that SQLite reads (ISO 8601 with 'T' or ' ', 'Z', an offset or
-- none, as `concurrency::sqlite_claim_reads_timestamps_in_any_format_an_application_writes`
-- writes them), and no other character after the date (SQLite's parser skips the spaces around
-- a zone that diesel's refuses). SQLite cannot add a CHECK to a table: a trigger refuses the INSERT, and with it
-- the application's statement.
CREATE TRIGGER herald_outbox_readable_times BEFORE INSERT ON herald_outbox
    FOR EACH ROW WHEN NOT (
    (NEW.scheduled_at IS NULL OR (NEW.scheduled_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*+00:00'
        AND substr(NEW.scheduled_at, 1, 4) <> '0000'
        AND datetime(substr(NEW.scheduled_at, 1, 19), '+0 seconds') IS substr(NEW.scheduled_at, 1, 19)
        AND (length(NEW.scheduled_at) = 25 OR (substr(NEW.scheduled_at, 20, 1) = '.' AND length(NEW.scheduled_at) BETWEEN 27 AND 35
            AND substr(NEW.scheduled_at, 21, length(NEW.scheduled_at) - 26) NOT GLOB '*[^0-9]*'))))
    AND (NEW.next_attempt_at IS NULL OR (NEW.next_attempt_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*+00:00'
        AND substr(NEW.next_attempt_at, 1, 4) <> '0000'
        AND datetime(substr(NEW.next_attempt_at, 1, 19), '+0 seconds') IS substr(NEW.next_attempt_at, 1, 19)
        AND (length(NEW.next_attempt_at) = 25 OR (substr(NEW.next_attempt_at, 20, 1) = '.' AND length(NEW.next_attempt_at) BETWEEN 27 AND 35
            AND substr(NEW.next_attempt_at, 21, length(NEW.next_attempt_at) - 26) NOT GLOB '*[^0-9]*'))))
    AND (NEW.expires_at IS NULL OR (NEW.expires_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*+00:00'
        AND substr(NEW.expires_at, 1, 4) <> '0000'
        AND datetime(substr(NEW.expires_at, 1, 19), '+0 seconds') IS substr(NEW.expires_at, 1, 19)
        AND (length(NEW.expires_at) = 25 OR (substr(NEW.expires_at, 20, 1) = '.' AND length(NEW.expires_at) BETWEEN 27 AND 35
            AND substr(NEW.expires_at, 21, length(NEW.expires_at) - 26) NOT GLOB '*[^0-9]*'))))
    AND (NEW.lease_until IS NULL OR (NEW.lease_until GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9][ T][0-9][0-9]:[0-9][0-9]*'
        AND substr(NEW.lease_until, 1, 4) <> '0000' AND datetime(NEW.lease_until) IS NOT NULL
        AND substr(NEW.lease_until, 12) NOT GLOB '*[^0-9:.Z+-]*'
        AND datetime(substr(NEW.lease_until, 1, 10) || ' ' || substr(NEW.lease_until, 12, 5), '+0 seconds') IS substr(NEW.lease_until, 1, 10) || ' ' || substr(NEW.lease_until, 12, 5) || ':00'))
    AND (NEW.delivery_status_at IS NULL OR (NEW.delivery_status_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9][ T][0-9][0-9]:[0-9][0-9]*'
        AND substr(NEW.delivery_status_at, 1, 4) <> '0000' AND datetime(NEW.delivery_status_at) IS NOT NULL
        AND substr(NEW.delivery_status_at, 12) NOT GLOB '*[^0-9:.Z+-]*'
        AND datetime(substr(NEW.delivery_status_at, 1, 10) || ' ' || substr(NEW.delivery_status_at, 12, 5), '+0 seconds') IS substr(NEW.delivery_status_at, 1, 10) || ' ' || substr(NEW.delivery_status_at, 12, 5) || ':00'))
    AND (NEW.created_at IS NULL OR (NEW.created_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9][ T][0-9][0-9]:[0-9][0-9]*'
        AND substr(NEW.created_at, 1, 4) <> '0000' AND datetime(NEW.created_at) IS NOT NULL
        AND substr(NEW.created_at, 12) NOT GLOB '*[^0-9:.Z+-]*'
        AND datetime(substr(NEW.created_at, 1, 10) || ' ' || substr(NEW.created_at, 12, 5), '+0 seconds') IS substr(NEW.created_at, 1, 10) || ' ' || substr(NEW.created_at, 12, 5) || ':00'))
    AND (NEW.updated_at IS NULL OR (NEW.updated_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9][ T][0-9][0-9]:[0-9][0-9]*'
        AND substr(NEW.updated_at, 1, 4) <> '0000' AND datetime(NEW.updated_at) IS NOT NULL
        AND substr(NEW.updated_at, 12) NOT GLOB '*[^0-9:.Z+-]*'
        AND datetime(substr(NEW.updated_at, 1, 10) || ' ' || substr(NEW.updated_at, 12, 5), '+0 seconds') IS substr(NEW.updated_at, 1, 10) || ' ' || substr(NEW.updated_at, 12, 5) || ':00'))
    AND (NEW.ordering_released_at IS NULL OR (NEW.ordering_released_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9][ T][0-9][0-9]:[0-9][0-9]*'
        AND substr(NEW.ordering_released_at, 1, 4) <> '0000' AND datetime(NEW.ordering_released_at) IS NOT NULL
        AND substr(NEW.ordering_released_at, 12) NOT GLOB '*[^0-9:.Z+-]*'
        AND datetime(substr(NEW.ordering_released_at, 1, 10) || ' ' || substr(NEW.ordering_released_at, 12, 5), '+0 seconds') IS substr(NEW.ordering_released_at, 1, 10) || ' ' || substr(NEW.ordering_released_at, 12, 5) || ':00'))
)
BEGIN
    SELECT RAISE(ABORT, 'herald_outbox: a time is not a real time Herald can read (scheduled_at, next_attempt_at, expires_at: YYYY-MM-DD HH:MM:SS[.fraction]+00:00) within the years 0001-9999');
END;

-- The same for an UPDATE of the times Herald itself writes only at the insert (and a replay's
-- expires_at): no cost on the claim's and the outcomes' updates. The others (next_attempt_at,
-- lease_until, updated_at, …), which those updates write, are checked at the insert only: the
-- table contract is INSERT; PostgreSQL's constraints check every update too.
CREATE TRIGGER herald_outbox_readable_times_updated BEFORE UPDATE OF scheduled_at, expires_at, created_at
    ON herald_outbox
    FOR EACH ROW WHEN NOT (
    (NEW.scheduled_at IS NULL OR (NEW.scheduled_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*+00:00'
        AND substr(NEW.scheduled_at, 1, 4) <> '0000'
        AND datetime(substr(NEW.scheduled_at, 1, 19), '+0 seconds') IS substr(NEW.scheduled_at, 1, 19)
        AND (length(NEW.scheduled_at) = 25 OR (substr(NEW.scheduled_at, 20, 1) = '.' AND length(NEW.scheduled_at) BETWEEN 27 AND 35
            AND substr(NEW.scheduled_at, 21, length(NEW.scheduled_at) - 26) NOT GLOB '*[^0-9]*'))))
    AND (NEW.expires_at IS NULL OR (NEW.expires_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*+00:00'
        AND substr(NEW.expires_at, 1, 4) <> '0000'
        AND datetime(substr(NEW.expires_at, 1, 19), '+0 seconds') IS substr(NEW.expires_at, 1, 19)
        AND (length(NEW.expires_at) = 25 OR (substr(NEW.expires_at, 20, 1) = '.' AND length(NEW.expires_at) BETWEEN 27 AND 35
            AND substr(NEW.expires_at, 21, length(NEW.expires_at) - 26) NOT GLOB '*[^0-9]*'))))
    AND (NEW.created_at IS NULL OR (NEW.created_at GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9][ T][0-9][0-9]:[0-9][0-9]*'
        AND substr(NEW.created_at, 1, 4) <> '0000' AND datetime(NEW.created_at) IS NOT NULL
        AND substr(NEW.created_at, 12) NOT GLOB '*[^0-9:.Z+-]*'
        AND datetime(substr(NEW.created_at, 1, 10) || ' ' || substr(NEW.created_at, 12, 5), '+0 seconds') IS substr(NEW.created_at, 1, 10) || ' ' || substr(NEW.created_at, 12, 5) || ':00'))
)
BEGIN
    SELECT RAISE(ABORT, 'herald_outbox: a time is not a real time Herald can read (scheduled_at, expires_at: YYYY-MM-DD HH:MM:SS[.fraction]+00:00) within the years 0001-9999');
END;
