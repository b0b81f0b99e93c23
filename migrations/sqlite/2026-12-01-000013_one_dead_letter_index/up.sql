-- herald_outbox_dead_letters (updated_at, id) serves the dead-letter listing and retention alike;
-- a second partial index on dead letters only cost a write per dead-lettering.
DROP INDEX herald_outbox_dead;
