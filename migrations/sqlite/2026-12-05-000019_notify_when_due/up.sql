-- PostgreSQL's migration of this name notifies only for a row that is due. SQLite has no NOTIFY:
-- nothing to change.
SELECT 1;
