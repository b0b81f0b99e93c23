-- As PostgreSQL's migration of this name, which validates the error-class constraint over the
-- rows already there. SQLite's trigger checks inserts only, and the previous migration cleared
-- the values it refuses: nothing to do.
SELECT 1;
