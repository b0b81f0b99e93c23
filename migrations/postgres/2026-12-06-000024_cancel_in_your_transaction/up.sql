-- herald_cancel(event_id): the application cancels a message inside its own transaction (DESIGN:
-- "scheduled|retryable → canceled (application cancels in its own transaction)"), as
-- POST /v1/messages/{event_id}/cancel does: a scheduled or retryable message, or a keyed
-- dead_letter or unconfirmed head that holds its key, becomes canceled; nothing is sent for it
-- once the transaction commits, and a rollback undoes the cancel. Returns the message's state
-- afterwards ('canceled': now or before; anything else: it could not be canceled, being in
-- flight or finished), NULL when no message has that event id (a fan-out's own id included:
-- cancel its messages by their own ids). The next message of a canceled head's ordering key is
-- made due by Herald's periodic release (within its poll interval).
--
-- SECURITY DEFINER, and executable by no one until granted: an application role needs only
-- GRANT EXECUTE ON FUNCTION herald_cancel(TEXT) TO app — no UPDATE on the outbox.
CREATE FUNCTION herald_cancel(p_event_id TEXT) RETURNS TEXT
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_state TEXT;
BEGIN
    UPDATE herald_outbox
       SET state = 'canceled', next_attempt_at = NULL, updated_at = now()
     WHERE event_id = p_event_id
       AND (state IN ('scheduled', 'retryable')
            OR (ordering_key IS NOT NULL AND state IN ('dead_letter', 'unconfirmed')
                AND ordering_released_at IS NULL));
    SELECT state INTO v_state FROM herald_outbox WHERE event_id = p_event_id;
    RETURN v_state;
END
$$;
REVOKE EXECUTE ON FUNCTION herald_cancel(TEXT) FROM PUBLIC;

-- A SECURITY DEFINER function runs with its owner's rights: it looks up names in Herald's schema
-- and then pg_temp, never in a schema (or a temporary table) of its caller's that comes first.
-- The fan-out trigger's function, which runs so too, gets the same.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION herald_cancel(TEXT) SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION herald_outbox_fanout() SET search_path = %I, pg_temp',
                   current_schema());
END
$$;
