-- Fewer index writes per message (README, "Performance"). Each claim and each outcome writes a
-- new row version into every index whose predicate the row matches.
-- 1. The fingerprint index holds only rows that have a fingerprint: a row inserted by plain SQL
--    gets its fingerprint at its first attempt, so its claim no longer writes a NULL entry.
--    Lookups (`request_fingerprint = …`) imply NOT NULL and still use it.
DROP INDEX herald_outbox_fingerprint;
CREATE INDEX herald_outbox_fingerprint ON herald_outbox (request_fingerprint)
    WHERE request_fingerprint IS NOT NULL;
-- 2. herald_outbox_dead (updated_at) WHERE state = 'dead_letter' is covered by
--    herald_outbox_dead_letters (updated_at, id) with the same predicate.
DROP INDEX herald_outbox_dead;
