CREATE INDEX herald_outbox_dead ON herald_outbox (updated_at) WHERE state = 'dead_letter';
