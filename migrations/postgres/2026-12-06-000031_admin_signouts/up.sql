-- The admin page's sign-outs. Its session cookie is stateless, so "Sign out" only cleared the
-- cookie in that browser and a copy taken before stayed valid for the rest of its 8 hours. A
-- sign-out now stores the session's id until the session would have expired, and every Herald
-- process on the database refuses it. Each sign-out removes the rows already past expiry.
CREATE TABLE herald_admin_signouts (
    session_id  TEXT PRIMARY KEY,
    expires_at  TIMESTAMPTZ NOT NULL
);
