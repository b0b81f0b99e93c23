-- An attempt row no longer checks its message with a foreign key, as on PostgreSQL (see
-- migrations/postgres, same version): Herald writes an attempt only for a message it claimed, in
-- the transaction that writes that claim's outcome, and retention deletes a message's attempts
-- before the message.
-- SQLite cannot drop a constraint: the table is rebuilt without it.
CREATE TABLE herald_attempts_rebuilt (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL,
    message_id           BIGINT NOT NULL,
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
-- Ids keep counting where they were (AUTOINCREMENT never reuses one, even of deleted rows).
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'herald_attempts_rebuilt', seq FROM sqlite_sequence WHERE name = 'herald_attempts';
INSERT INTO herald_attempts_rebuilt SELECT * FROM herald_attempts;
DROP TABLE herald_attempts;
ALTER TABLE herald_attempts_rebuilt RENAME TO herald_attempts;
-- One row per attempt and sender: a retried outcome flush cannot record an attempt twice. The
-- watchdog's rows (an expired lease) have no lease_owner and never collide.
CREATE UNIQUE INDEX herald_attempts_once ON herald_attempts (message_id, attempt_number, lease_owner);
