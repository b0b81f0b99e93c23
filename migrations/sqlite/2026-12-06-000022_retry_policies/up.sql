-- As PostgreSQL's migration of this name: every retry policy version Herald has run with.
CREATE TABLE herald_retry_policies (
    version      TEXT PRIMARY KEY NOT NULL,
    name         TEXT NOT NULL,
    max_attempts INTEGER NOT NULL,
    parameters   TEXT NOT NULL,
    recorded_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now'))
);
