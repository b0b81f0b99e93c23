DROP INDEX herald_receipts_unmatched_age;
DROP INDEX herald_outbox_dead;
DROP INDEX herald_outbox_done;
DROP TRIGGER herald_outbox_fanout;
DROP TABLE herald_fanouts;
DROP TABLE herald_subscriptions;
