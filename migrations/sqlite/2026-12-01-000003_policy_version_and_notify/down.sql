ALTER TABLE herald_outbox DROP COLUMN retry_policy_version;
