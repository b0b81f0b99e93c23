-- The retry policy version a message was enqueued under (name@hash of parameters and
-- classification table). Herald's own ways in set it; a plain INSERT leaves it NULL and the first
-- claim fills in the version then in force.
ALTER TABLE herald_outbox ADD COLUMN retry_policy_version TEXT;

-- The wake-up follows where Herald listens: the insert trigger notifies only while some Herald
-- process holds a LISTEN connection on this database (its application_name is 'herald-listen').
-- With every sender polling (listen_notify = false, or behind a transaction-mode PgBouncer),
-- application commits never take PostgreSQL's notify-queue lock. pg_stat_activity's
-- application_name is readable by every role, so an application role with nothing but INSERT on
-- herald_outbox can still insert. A listener that connects during a long transaction may miss
-- its notification; the poll interval covers that.
CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_stat_activity
               WHERE datname = current_database() AND application_name = 'herald-listen') THEN
        PERFORM pg_notify('herald_outbox', '');
    END IF;
    RETURN NULL;
END
$$;
