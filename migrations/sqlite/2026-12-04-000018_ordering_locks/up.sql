-- PostgreSQL's migration of this name makes a key's insert lock a row (herald_ordering_locks).
-- SQLite has one writer at a time, which orders a key's inserts by itself: nothing to change.
SELECT 1;
