-- Validates herald_outbox_last_error_class_check (added NOT VALID by the previous migration) over
-- the rows already there: a scan under SHARE UPDATE EXCLUSIVE, which lets the applications'
-- inserts and Herald's own updates go on meanwhile (a migration of its own: in the same
-- transaction, the previous one's ACCESS EXCLUSIVE lock would still be held).
ALTER TABLE herald_outbox VALIDATE CONSTRAINT herald_outbox_last_error_class_check;
