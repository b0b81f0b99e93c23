-- Herald's outbox, attempts and settings on SQLite.
--
-- Table contract for applications: INSERT INTO herald_outbox (event_id, channel, destination, payload)
-- inside your own transaction (BEGIN IMMEDIATE); every other column has a default. Times are UTC
-- text in the form 'YYYY-MM-DD HH:MM:SS[.fff]+00:00'; payload is JSON text.

CREATE TABLE herald_outbox (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL,
    event_id             TEXT NOT NULL,
    channel              TEXT NOT NULL,
    destination          TEXT NOT NULL,
    payload              TEXT NOT NULL,
    state                TEXT NOT NULL DEFAULT 'scheduled',
    scheduled_at         TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')),
    next_attempt_at      TEXT,
    attempts             INTEGER NOT NULL DEFAULT 0,
    max_attempts         INTEGER,
    retry_policy         TEXT NOT NULL DEFAULT 'default',
    semantics            TEXT NOT NULL DEFAULT 'at_least_once',
    expires_at           TEXT,
    lease_until          TEXT,
    lease_owner          TEXT,
    request_fingerprint  TEXT,
    provider_message_id  TEXT,
    last_error_class     TEXT,
    delivery_status      TEXT,
    delivery_status_at   TEXT,
    created_at           TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')),
    updated_at           TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')),
    CONSTRAINT herald_outbox_event_id_key UNIQUE (event_id),
    CONSTRAINT herald_outbox_event_id_check CHECK (length(event_id) BETWEEN 1 AND 255),
    CONSTRAINT herald_outbox_channel_check CHECK (channel IN ('email', 'webhook')),
    CONSTRAINT herald_outbox_state_check CHECK (state IN ('scheduled', 'sending', 'retryable',
        'delivered', 'dead_letter', 'unconfirmed', 'canceled', 'expired')),
    CONSTRAINT herald_outbox_semantics_check CHECK (semantics IN ('at_least_once', 'at_most_once')),
    CONSTRAINT herald_outbox_max_attempts_check CHECK (max_attempts IS NULL OR max_attempts >= 1),
    CONSTRAINT herald_outbox_payload_check CHECK (json_valid(payload) AND json_type(payload) = 'object'),
    -- Times compare as text: refuse any other spelling than Herald's.
    CONSTRAINT herald_outbox_scheduled_at_check CHECK (scheduled_at GLOB
        '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*+00:00'),
    CONSTRAINT herald_outbox_next_attempt_at_check CHECK (next_attempt_at IS NULL OR next_attempt_at GLOB
        '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*+00:00'),
    CONSTRAINT herald_outbox_expires_at_check CHECK (expires_at IS NULL OR expires_at GLOB
        '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]*+00:00')
);

CREATE INDEX herald_outbox_due ON herald_outbox (next_attempt_at, id)
    WHERE state IN ('scheduled', 'retryable');
CREATE INDEX herald_outbox_leased ON herald_outbox (lease_until) WHERE state = 'sending';
CREATE INDEX herald_outbox_fingerprint ON herald_outbox (request_fingerprint);

-- next_attempt_at defaults to scheduled_at so a plain INSERT only needs the essentials.
CREATE TRIGGER herald_outbox_defaults AFTER INSERT ON herald_outbox
    FOR EACH ROW WHEN NEW.next_attempt_at IS NULL AND NEW.state IN ('scheduled', 'retryable')
BEGIN
    UPDATE herald_outbox SET next_attempt_at = NEW.scheduled_at WHERE id = NEW.id;
END;

CREATE TABLE herald_attempts (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL,
    message_id           BIGINT NOT NULL REFERENCES herald_outbox (id) ON DELETE CASCADE,
    event_id             TEXT NOT NULL,
    attempt_number       INTEGER NOT NULL,
    started_at           TEXT NOT NULL,
    finished_at          TEXT NOT NULL,
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
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);
