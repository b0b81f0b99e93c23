-- As PostgreSQL's migration of this name: how a replayed message had stopped holding its
-- ordering key before the replay. Times as in herald_outbox.
ALTER TABLE herald_replays ADD COLUMN ordering_released_at_before TEXT;
ALTER TABLE herald_replays ADD COLUMN ended_at_before TEXT;
