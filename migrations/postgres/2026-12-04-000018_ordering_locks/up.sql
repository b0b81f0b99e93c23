-- A key's insert lock as a row, not an advisory lock. The ordering trigger took a
-- transaction-scoped advisory lock per key, and each one held to the commit takes a slot of
-- PostgreSQL's shared lock table (`max_locks_per_transaction` × connections, 6,400 by default):
-- one transaction inserting messages of some 15,000 distinct keys failed with "out of shared
-- memory", and while it held them every other session's locks could fail too. A row lock is
-- kept in the row itself, so a transaction may hold any number.
--
-- One row per key (destination + ordering_key) that has messages: the trigger locks it (an
-- upsert, once per key and transaction) before it gives the message its place, so a second
-- transaction inserting into the key waits for the first one's commit or rollback, as before.
-- An outcome that ends a key's head takes the same row without waiting (`FOR NO KEY UPDATE SKIP
-- LOCKED`) to find keys an uncommitted insert is writing to. Retention deletes the row of a key
-- whose messages were all purged.
--   locked_by  the transaction (pg_current_xact_id) that last locked the row: a transaction
--              that finds its own id here holds the lock already. A 64-bit id, unlike xmin (32
--              bits, so a row untouched for 2^32 transactions could match by accident), and
--              left as it is by a subtransaction's rollback along with the lock.
-- Its only update sets locked_by, no key column: a HOT update, which the fill factor leaves
-- room for.
CREATE TABLE herald_ordering_locks (
    ordering_key  TEXT NOT NULL,
    destination   TEXT NOT NULL,
    locked_by     BIGINT,
    PRIMARY KEY (ordering_key, destination)
) WITH (fillfactor = 70);
-- No insert while the rows are written and the trigger replaced (until this migration commits):
-- a key first inserted meanwhile under the old trigger would have no row.
LOCK TABLE herald_outbox IN SHARE MODE;
INSERT INTO herald_ordering_locks (ordering_key, destination)
    SELECT DISTINCT ordering_key, destination FROM herald_outbox WHERE ordering_key IS NOT NULL;

-- The lock first (unless this transaction already holds it, so a bulk insert into one key writes
-- one version of the row, not one per message), then the place, read after
-- the lock (a statement of its own, so under READ COMMITTED it sees what the transaction it
-- waited for committed). The place is the key's last one plus one, read as ORDER BY … DESC
-- LIMIT 1, a walk of herald_outbox_ordering that stops at its first entry: as max() the plan
-- cached while the table was small aggregated every place of the key, the finished ones too, so
-- each insert cost as much as the key had messages (50,000 messages into one key in one
-- transaction: quadratic, minutes). Every lookup here is meant to be an index probe, and the
-- function plans them with sequential scans off: a table analyzed while empty made each one a
-- scan of every row inserted so far (10,000 rows in one statement: over 1,000 keys 13 s, into
-- one key 22 s). Under REPEATABLE READ or SERIALIZABLE a second transaction that waited
-- fails with a serialization failure (SQLSTATE 40001): retry it.
-- SECURITY DEFINER: an application role needs only INSERT on herald_outbox (as for fan-outs);
-- the lookups below needed SELECT on it before, and the lock rows are Herald's own.
CREATE OR REPLACE FUNCTION herald_outbox_ordering() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path FROM CURRENT SET enable_seqscan = off AS $$
DECLARE
    v_open BIGINT;
    v_xact BIGINT := pg_current_xact_id()::text::bigint;
BEGIN
    PERFORM 1 FROM herald_ordering_locks
    WHERE ordering_key = NEW.ordering_key AND destination = NEW.destination
      AND locked_by = v_xact;
    IF NOT FOUND THEN
        INSERT INTO herald_ordering_locks (ordering_key, destination, locked_by)
        VALUES (NEW.ordering_key, NEW.destination, v_xact)
        ON CONFLICT (ordering_key, destination) DO UPDATE SET locked_by = EXCLUDED.locked_by;
    END IF;
    SELECT COALESCE((SELECT h.ordering_seq FROM herald_outbox h
                     WHERE h.ordering_key = NEW.ordering_key AND h.destination = NEW.destination
                       AND h.ordering_seq IS NOT NULL
                     ORDER BY h.ordering_seq DESC LIMIT 1), 0) + 1
    INTO NEW.ordering_seq;
    IF NEW.state = 'scheduled' THEN
        SELECT h.ordering_seq INTO v_open FROM herald_outbox h
        WHERE h.ordering_key = NEW.ordering_key AND h.destination = NEW.destination
          AND h.state IN ('scheduled', 'retryable', 'sending', 'dead_letter', 'unconfirmed')
          AND (h.state IN ('scheduled', 'retryable', 'sending') OR h.ordering_released_at IS NULL)
        ORDER BY h.ordering_seq LIMIT 1;
        IF v_open IS NOT NULL THEN
            NEW.next_attempt_at := NULL;
        END IF;
    END IF;
    RETURN NEW;
END
$$;
