-- As PostgreSQL's migration of this name: an application's INSERT may not put control or
-- bidirectional-formatting characters in event_id or destination (they reached logs, terminals
-- and the admin page raw). Rows stored before are left as they are. GLOB compares code points.
CREATE TRIGGER herald_outbox_printable BEFORE INSERT ON herald_outbox
    FOR EACH ROW WHEN NEW.event_id GLOB '*[' || char(1) || '-' || char(31) || char(127) || '-' || char(159) || char(8232) || char(8233) || char(8234) || '-' || char(8238) || char(8294) || '-' || char(8297) || ']*' OR NEW.destination GLOB '*[' || char(1) || '-' || char(31) || char(127) || '-' || char(159) || char(8232) || char(8233) || char(8234) || '-' || char(8238) || char(8294) || '-' || char(8297) || ']*'
BEGIN
    SELECT RAISE(ABORT, 'herald_outbox_printable: event_id and destination must hold no control or bidirectional-formatting characters');
END;
