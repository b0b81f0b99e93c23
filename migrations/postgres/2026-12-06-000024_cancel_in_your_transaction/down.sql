ALTER FUNCTION herald_outbox_fanout() SET search_path FROM CURRENT;
DROP FUNCTION herald_cancel(TEXT);
