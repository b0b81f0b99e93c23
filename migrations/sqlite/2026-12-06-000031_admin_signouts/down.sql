DROP TABLE herald_admin_signouts;
