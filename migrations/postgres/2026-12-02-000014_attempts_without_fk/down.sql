-- NOT VALID: attempt rows whose message was deleted by hand meanwhile (nothing cascaded) do not
-- stop the way down; new rows are checked again.
ALTER TABLE herald_attempts ADD CONSTRAINT herald_attempts_message_id_fkey
    FOREIGN KEY (message_id) REFERENCES herald_outbox (id) ON DELETE CASCADE NOT VALID;
