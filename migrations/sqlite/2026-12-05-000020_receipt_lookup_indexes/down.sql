CREATE INDEX herald_receipts_herald_event_id ON herald_receipts (herald_event_id);
CREATE INDEX herald_receipts_provider_message_id ON herald_receipts (provider_message_id);
