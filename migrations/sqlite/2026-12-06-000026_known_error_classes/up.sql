-- As PostgreSQL's migration of this name: last_error_class is read back as one of Herald's
-- classes, and the claim reads whole rows, so one row inserted with a class Herald does not know
-- failed every claim. Such values are cleared first, then refused at the insert (SQLite cannot
-- add a CHECK to a table). An UPDATE is not checked: Herald's own outcome updates write this
-- column, and a trigger on them would cost every outcome (the table contract is INSERT).
UPDATE herald_outbox SET last_error_class = NULL
 WHERE last_error_class NOT IN ('accepted', 'conflict', 'rate_limited', 'transient', 'not_sent', 'ambiguous', 'permanent', 'exhausted');
CREATE TRIGGER herald_outbox_last_error_class_check BEFORE INSERT ON herald_outbox
    FOR EACH ROW WHEN NEW.last_error_class NOT IN ('accepted', 'conflict', 'rate_limited', 'transient', 'not_sent', 'ambiguous', 'permanent', 'exhausted')
BEGIN
    SELECT RAISE(ABORT, 'herald_outbox_last_error_class_check: last_error_class must be NULL or one of accepted, conflict, rate_limited, transient, not_sent, ambiguous, permanent, exhausted');
END;
