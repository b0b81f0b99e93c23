-- PostgreSQL's migration of this name lets the insert trigger skip the wake-up of a sender that
-- is awake. SQLite has no NOTIFY: nothing to change.
SELECT 1;
