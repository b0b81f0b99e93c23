-- Herald's outbox, attempts and settings on PostgreSQL.
--
-- Table contract for applications: INSERT INTO herald_outbox (event_id, channel, destination, payload)
-- inside your own transaction; every other column has a default. A statement-level trigger wakes
-- Herald's senders (LISTEN herald_outbox) when the transaction commits.

CREATE TABLE herald_outbox (
    id                   BIGSERIAL PRIMARY KEY,
    event_id             TEXT NOT NULL,
    channel              TEXT NOT NULL,
    destination          TEXT NOT NULL,
    payload              JSONB NOT NULL,
    state                TEXT NOT NULL DEFAULT 'scheduled',
    scheduled_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    next_attempt_at      TIMESTAMPTZ,
    attempts             INTEGER NOT NULL DEFAULT 0,
    max_attempts         INTEGER,
    retry_policy         TEXT NOT NULL DEFAULT 'default',
    semantics            TEXT NOT NULL DEFAULT 'at_least_once',
    expires_at           TIMESTAMPTZ,
    lease_until          TIMESTAMPTZ,
    lease_owner          TEXT,
    request_fingerprint  TEXT,
    provider_message_id  TEXT,
    last_error_class     TEXT,
    delivery_status      TEXT,
    delivery_status_at   TIMESTAMPTZ,
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT herald_outbox_event_id_key UNIQUE (event_id),
    CONSTRAINT herald_outbox_event_id_check CHECK (length(event_id) BETWEEN 1 AND 255),
    CONSTRAINT herald_outbox_channel_check CHECK (channel IN ('email', 'webhook')),
    CONSTRAINT herald_outbox_state_check CHECK (state IN ('scheduled', 'sending', 'retryable',
        'delivered', 'dead_letter', 'unconfirmed', 'canceled', 'expired')),
    CONSTRAINT herald_outbox_semantics_check CHECK (semantics IN ('at_least_once', 'at_most_once')),
    CONSTRAINT herald_outbox_max_attempts_check CHECK (max_attempts IS NULL OR max_attempts >= 1),
    CONSTRAINT herald_outbox_payload_check CHECK (jsonb_typeof(payload) = 'object')
);

-- The claim reads exactly this predicate in exactly this order; finished rows fall out of it.
CREATE INDEX herald_outbox_due ON herald_outbox (next_attempt_at, id)
    WHERE state IN ('scheduled', 'retryable');
-- The watchdog looks for expired leases.
CREATE INDEX herald_outbox_leased ON herald_outbox (lease_until) WHERE state = 'sending';
CREATE INDEX herald_outbox_fingerprint ON herald_outbox (request_fingerprint);

-- A hot queue table: vacuum it early.
ALTER TABLE herald_outbox SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

-- next_attempt_at defaults to scheduled_at so a plain INSERT only needs the essentials.
CREATE FUNCTION herald_outbox_defaults() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.next_attempt_at IS NULL AND NEW.state IN ('scheduled', 'retryable') THEN
        NEW.next_attempt_at := NEW.scheduled_at;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER herald_outbox_defaults BEFORE INSERT ON herald_outbox
    FOR EACH ROW EXECUTE FUNCTION herald_outbox_defaults();

-- One notification per inserting statement; PostgreSQL folds identical ones per transaction and
-- delivers them only at commit, so a rolled-back insert never wakes anybody.
CREATE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('herald_outbox', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER herald_outbox_notify AFTER INSERT ON herald_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_notify();

-- herald_enqueue: the SQL way in. Returns the row id; a duplicate event_id is a no-op that
-- returns the existing row's id.
CREATE FUNCTION herald_enqueue(
    p_event_id     TEXT,
    p_channel      TEXT,
    p_destination  TEXT,
    p_payload      JSONB,
    p_scheduled_at TIMESTAMPTZ DEFAULT now(),
    p_expires_at   TIMESTAMPTZ DEFAULT NULL,
    p_semantics    TEXT DEFAULT 'at_least_once',
    p_max_attempts INTEGER DEFAULT NULL
) RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    v_id BIGINT;
BEGIN
    INSERT INTO herald_outbox (event_id, channel, destination, payload, scheduled_at, expires_at,
                               semantics, max_attempts)
    VALUES (p_event_id, p_channel, p_destination, p_payload, p_scheduled_at, p_expires_at,
            p_semantics, p_max_attempts)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        SELECT id INTO v_id FROM herald_outbox WHERE event_id = p_event_id;
    END IF;
    RETURN v_id;
END
$$;

CREATE TABLE herald_attempts (
    id                   BIGSERIAL PRIMARY KEY,
    message_id           BIGINT NOT NULL REFERENCES herald_outbox (id) ON DELETE CASCADE,
    event_id             TEXT NOT NULL,
    attempt_number       INTEGER NOT NULL,
    started_at           TIMESTAMPTZ NOT NULL,
    finished_at          TIMESTAMPTZ NOT NULL,
    duration_ms          BIGINT NOT NULL,
    request_fingerprint  TEXT,
    response_status      INTEGER,
    error_kind           TEXT,
    class                TEXT NOT NULL,
    retry_after          TEXT,
    delay_ms             BIGINT,
    delay_reason         TEXT,
    policy_version       TEXT NOT NULL,
    provider_message_id  TEXT,
    response_excerpt     TEXT,
    lease_owner          TEXT,
    next_state           TEXT NOT NULL
);
-- One row per attempt and sender: a retried outcome flush cannot record an attempt twice. The
-- watchdog's rows (an expired lease) have no lease_owner and never collide.
CREATE UNIQUE INDEX herald_attempts_once ON herald_attempts (message_id, attempt_number, lease_owner);

CREATE TABLE herald_settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
