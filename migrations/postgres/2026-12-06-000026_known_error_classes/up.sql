-- last_error_class is read back as one of Herald's classes, and the claim reads whole rows: one
-- row an application inserted with a class Herald does not know ('bogus', 'Transient') failed
-- every claim, on every process, and nothing was sent any more. Such values (none Herald wrote)
-- are cleared first, then refused at every insert and update.
UPDATE herald_outbox SET last_error_class = NULL
 WHERE last_error_class NOT IN ('accepted', 'conflict', 'rate_limited', 'transient', 'not_sent', 'ambiguous', 'permanent', 'exhausted');
-- NOT VALID: checked on every insert and update from now on, without scanning the table under
-- the ACCESS EXCLUSIVE lock this statement takes (which applications' inserts would wait on);
-- the next migration validates the rows already there under a lock that lets them go on.
ALTER TABLE herald_outbox ADD CONSTRAINT herald_outbox_last_error_class_check
    CHECK (last_error_class IN ('accepted', 'conflict', 'rate_limited', 'transient', 'not_sent', 'ambiguous', 'permanent', 'exhausted')) NOT VALID;
