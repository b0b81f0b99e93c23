-- Ordered delivery per key (README, "Ordered delivery").
--   ordering_key          optional, 1–255 visible ASCII characters. Messages with the same key
--                         and the same destination are attempted one at a time, in their order.
--                         NULL (the default): no ordering, exactly as before.
--   ordering_seq          the message's place in its key (destination + key): assigned by the
--                         insert trigger under a per-key transaction lock, so it follows the
--                         order in which the inserting transactions commit.
--   ordering_policy       what a key does when its head ends dead_letter or unconfirmed:
--                         'block' (the key waits) or 'skip' (the rest proceed); NULL: the
--                         endpoint's policy, else 'block'.
--   ordering_released_at  when a dead or unconfirmed head stopped holding its key (skip policy,
--                         or an explicit skip); NULL while it blocks.
-- A message that waits behind its key's head is 'scheduled' with next_attempt_at NULL: it is
-- not in herald_outbox_due, so neither the claim nor the unkeyed path ever walks past it. When
-- the head ends, the next message of the key gets its next_attempt_at.
ALTER TABLE herald_outbox ADD COLUMN ordering_key TEXT;
ALTER TABLE herald_outbox ADD COLUMN ordering_seq BIGINT;
ALTER TABLE herald_outbox ADD COLUMN ordering_policy TEXT;
ALTER TABLE herald_outbox ADD COLUMN ordering_released_at TIMESTAMPTZ;
ALTER TABLE herald_outbox ADD CONSTRAINT herald_outbox_ordering_key_check
    CHECK (ordering_key IS NULL OR (length(ordering_key) BETWEEN 1 AND 255 AND ordering_key ~ '^[!-~]+$'));
ALTER TABLE herald_outbox ADD CONSTRAINT herald_outbox_ordering_policy_check
    CHECK (ordering_policy IS NULL OR ordering_policy IN ('block', 'skip'));

-- Every keyed message, by its place: the next place of a key, and no two messages in one place.
CREATE UNIQUE INDEX herald_outbox_ordering ON herald_outbox (ordering_key, destination, ordering_seq)
    WHERE ordering_key IS NOT NULL;
-- The keyed messages not finished yet (waiting, due, in flight, or a dead head): what the claim
-- looks at before a keyed message (only the places before it) and what releases a key.
CREATE INDEX herald_outbox_ordering_open ON herald_outbox (ordering_key, destination, ordering_seq)
    WHERE ordering_key IS NOT NULL
      AND state IN ('scheduled', 'retryable', 'sending', 'dead_letter', 'unconfirmed');

-- The place of a keyed message, under a transaction-scoped advisory lock on (destination, key):
-- a second transaction inserting into the same key waits here until the first commits or rolls
-- back, then sees its messages. So places follow commit order, and a message never commits
-- ahead of an earlier place that is still uncommitted. It waits (next_attempt_at NULL) while an
-- earlier message of its key is open. Under REPEATABLE READ or SERIALIZABLE the second
-- transaction cannot see the first's rows: it takes the same place and fails on
-- herald_outbox_ordering (retry it like a serialization failure) — never out of order.
-- (The open place is looked up as ORDER BY … LIMIT 1, a walk of herald_outbox_ordering_open that
-- stops at the first entry; an EXISTS lets the planner pick a sequential scan for a hot key.)
CREATE FUNCTION herald_outbox_ordering() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_open BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(1751477356, hashtext(NEW.destination || chr(10) || NEW.ordering_key));
    SELECT COALESCE(max(ordering_seq), 0) + 1 INTO NEW.ordering_seq FROM herald_outbox
    WHERE ordering_key = NEW.ordering_key AND destination = NEW.destination;
    IF NEW.state = 'scheduled' THEN
        SELECT h.ordering_seq INTO v_open FROM herald_outbox h
        WHERE h.ordering_key = NEW.ordering_key AND h.destination = NEW.destination
          AND h.state IN ('scheduled', 'retryable', 'sending', 'dead_letter', 'unconfirmed')
          AND (h.state IN ('scheduled', 'retryable', 'sending') OR h.ordering_released_at IS NULL)
        ORDER BY h.ordering_seq LIMIT 1;
        IF v_open IS NOT NULL THEN
            NEW.next_attempt_at := NULL;
        END IF;
    END IF;
    RETURN NEW;
END
$$;
-- After herald_outbox_defaults and herald_outbox_fanout (name order): a fan-out's children each
-- get their place in their own endpoint's key.
CREATE TRIGGER herald_outbox_ordering BEFORE INSERT ON herald_outbox
    FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION herald_outbox_ordering();

DROP FUNCTION herald_enqueue(TEXT, TEXT, TEXT, JSONB, TIMESTAMPTZ, TIMESTAMPTZ, TEXT, INTEGER);
CREATE FUNCTION herald_enqueue(
    p_event_id        TEXT,
    p_channel         TEXT,
    p_destination     TEXT,
    p_payload         JSONB,
    p_scheduled_at    TIMESTAMPTZ DEFAULT now(),
    p_expires_at      TIMESTAMPTZ DEFAULT NULL,
    p_semantics       TEXT DEFAULT 'at_least_once',
    p_max_attempts    INTEGER DEFAULT NULL,
    p_ordering_key    TEXT DEFAULT NULL,
    p_ordering_policy TEXT DEFAULT NULL
) RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    v_id BIGINT;
BEGIN
    INSERT INTO herald_outbox (event_id, channel, destination, payload, scheduled_at, expires_at,
                               semantics, max_attempts, ordering_key, ordering_policy)
    VALUES (p_event_id, p_channel, p_destination, p_payload, p_scheduled_at, p_expires_at,
            p_semantics, p_max_attempts, p_ordering_key, p_ordering_policy)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        SELECT id INTO v_id FROM herald_outbox WHERE event_id = p_event_id;
    END IF;
    RETURN v_id;
END
$$;
