DROP TABLE herald_replay_keys;
