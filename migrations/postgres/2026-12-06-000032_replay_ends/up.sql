-- How a replayed message had stopped holding its ordering key before the replay (support's
-- explanation of the message after it): the replay clears the release and rewrites updated_at,
-- so a release by the skip policy, or the time a delivered or expired message had reached that
-- state, was lost. Replays made before this migration keep NULL: nothing tells them now.
ALTER TABLE herald_replays ADD COLUMN ordering_released_at_before TIMESTAMPTZ;
ALTER TABLE herald_replays ADD COLUMN ended_at_before TIMESTAMPTZ;
