-- Named endpoints Herald disabled by itself (after `disable_after_failures` failed attempts in a
-- row): shared by every Herald process on the database, re-enabled only by an explicit call
-- (`POST /v1/endpoints/{name}/enable`, `herald endpoint enable NAME`).
CREATE TABLE herald_endpoints (
    name             TEXT PRIMARY KEY NOT NULL,
    disabled_at      TEXT,
    disabled_reason  TEXT,
    updated_at       TEXT NOT NULL
);
