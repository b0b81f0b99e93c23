-- The retry policy version a message was enqueued under (name@hash of parameters and
-- classification table). Herald's own ways in set it; a plain INSERT leaves it NULL and the first
-- claim fills in the version then in force. (SQLite has no NOTIFY: nothing else changes.)
ALTER TABLE herald_outbox ADD COLUMN retry_policy_version TEXT;
