DROP TABLE herald_skips;
