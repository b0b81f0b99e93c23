CREATE INDEX herald_outbox_dead ON herald_outbox (updated_at) WHERE state = 'dead_letter';
DROP INDEX herald_outbox_fingerprint;
CREATE INDEX herald_outbox_fingerprint ON herald_outbox (request_fingerprint);
