-- PostgreSQL's migration of this version makes the plain SQL fan-out take the event id's lock.
-- SQLite runs every write behind its one writer lock: nothing to do.
SELECT 1;
