ALTER TABLE herald_receipts RESET (autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_insert_scale_factor, autovacuum_analyze_scale_factor);
ALTER TABLE herald_attempts RESET (autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_insert_scale_factor, autovacuum_analyze_scale_factor);
ALTER TABLE herald_outbox RESET (autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay, fillfactor);
-- As the first migration set them.
ALTER TABLE herald_outbox SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
DROP INDEX herald_receipts_unmatched_age;
DROP INDEX herald_outbox_dead;
DROP INDEX herald_outbox_done;
DROP TRIGGER herald_outbox_fanout ON herald_outbox;
DROP FUNCTION herald_outbox_fanout();
DROP FUNCTION herald_type_matches(TEXT, TEXT);
DROP TABLE herald_fanouts;
DROP TABLE herald_subscriptions;
