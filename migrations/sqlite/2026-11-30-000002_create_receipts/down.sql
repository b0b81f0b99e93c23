DROP TABLE herald_receipts;
