-- As PostgreSQL's migration of this name: the admin page's sign-outs, refused by every process
-- until the session would have expired. Times as in herald_outbox.
CREATE TABLE herald_admin_signouts (
    session_id  TEXT PRIMARY KEY NOT NULL,
    expires_at  TEXT NOT NULL
);
