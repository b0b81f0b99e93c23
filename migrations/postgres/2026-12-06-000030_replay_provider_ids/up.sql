-- Receipts of a send before a replay: the provider message id that send had, kept with the
-- replay, so that a late receipt naming it still finds its message (and is judged a receipt of
-- an earlier send) after the new send wrote its own id over the message's. Replays are rare:
-- the partial index costs nothing on the sender's path. Replays made before this migration get
-- the id of the last attempt before their series that recorded one.
ALTER TABLE herald_replays ADD COLUMN provider_message_id_before TEXT;
UPDATE herald_replays r SET provider_message_id_before = (
    SELECT a.provider_message_id FROM herald_attempts a
    WHERE a.message_id = r.message_id AND a.attempt_number < r.series_start
      AND a.provider_message_id IS NOT NULL
    ORDER BY a.attempt_number DESC LIMIT 1);
CREATE INDEX herald_replays_provider_message_id ON herald_replays (provider_message_id_before)
    WHERE provider_message_id_before IS NOT NULL;
