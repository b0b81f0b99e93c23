ALTER TABLE herald_attempts ADD CONSTRAINT herald_attempts_message_id_fkey
    FOREIGN KEY (message_id) REFERENCES herald_outbox (id) ON DELETE CASCADE;
