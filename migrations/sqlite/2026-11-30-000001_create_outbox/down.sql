DROP TABLE herald_settings;
DROP TABLE herald_attempts;
DROP TRIGGER herald_outbox_defaults;
DROP TABLE herald_outbox;
