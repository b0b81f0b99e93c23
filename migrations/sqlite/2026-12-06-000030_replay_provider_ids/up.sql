-- As PostgreSQL's migration of this name: the provider message id of the send before a replay.
ALTER TABLE herald_replays ADD COLUMN provider_message_id_before TEXT;
UPDATE herald_replays SET provider_message_id_before = (
    SELECT a.provider_message_id FROM herald_attempts a
    WHERE a.message_id = herald_replays.message_id AND a.attempt_number < herald_replays.series_start
      AND a.provider_message_id IS NOT NULL
    ORDER BY a.attempt_number DESC LIMIT 1);
CREATE INDEX herald_replays_provider_message_id ON herald_replays (provider_message_id_before)
    WHERE provider_message_id_before IS NOT NULL;
