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
DROP SEQUENCE herald_awake;
