DROP TRIGGER herald_outbox_printable;
