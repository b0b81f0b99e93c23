DROP TABLE herald_endpoints;
