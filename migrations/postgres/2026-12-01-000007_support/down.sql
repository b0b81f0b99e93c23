DROP INDEX herald_outbox_dead_letters;
DROP TABLE herald_replays;
ALTER TABLE herald_outbox DROP COLUMN attempt_base;
