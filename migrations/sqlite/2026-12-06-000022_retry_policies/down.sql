DROP TABLE herald_retry_policies;
