-- An attempt row no longer checks its message with a foreign key. The check ran a query and took
-- a row lock on the message (SELECT … FOR KEY SHARE) for every attempt row inserted: in
-- `herald-bench dispatch_pg` one statement per delivered message, and a third of the attempt
-- insert's time (README, "Performance"). Herald writes an attempt only for a message it claimed,
-- in the transaction that writes that claim's outcome (or the watchdog's, with the row locked),
-- and retention deletes a message's attempts before the message itself, in one transaction.
ALTER TABLE herald_attempts DROP CONSTRAINT herald_attempts_message_id_fkey;
