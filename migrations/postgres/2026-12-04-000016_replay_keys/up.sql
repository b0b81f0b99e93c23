-- Every one-time signature value a source's events came with (Mailgun's token, Plivo's nonce),
-- and the event it came with: a value seen with one event and then with another is a replay.
-- Until now the value was only kept on the stored receipt, so one that came with a provider's
-- retry of an event already stored (signed anew) was never kept, and could be used once more for
-- another event within the signature's tolerance. Deleted at the unmatched receipts' age
-- (`retention_unmatched_receipt_days`): by then a Mailgun signature is far outside its
-- tolerance (Plivo signs no timestamp, but its V3 signature covers the parameters, so its nonce
-- serves no other event).
CREATE TABLE herald_replay_keys (
    source             TEXT NOT NULL,
    replay_key         TEXT NOT NULL,
    provider_event_id  TEXT NOT NULL,
    seen_at            TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (source, replay_key)
);
CREATE INDEX herald_replay_keys_seen ON herald_replay_keys (seen_at);
INSERT INTO herald_replay_keys (source, replay_key, provider_event_id, seen_at)
    SELECT source, replay_key, provider_event_id, received_at
    FROM herald_receipts WHERE replay_key IS NOT NULL
    ON CONFLICT DO NOTHING;
