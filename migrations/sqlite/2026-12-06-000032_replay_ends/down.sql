ALTER TABLE herald_replays DROP COLUMN ended_at_before;
ALTER TABLE herald_replays DROP COLUMN ordering_released_at_before;
