DROP FUNCTION herald_cancel(TEXT);
