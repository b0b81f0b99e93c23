-- Every time in herald_outbox must be one Herald can read back: a finite time within the years
-- 1-9999. An application writing by plain SQL could store 'infinity', '-infinity' or a year past
-- chrono's 262143; the claim reads whole rows (RETURNING o.*), so such a row failed every claim
-- it came first in, and with scheduled_at = '-infinity' that is every claim: nothing was sent
-- any more. Now the application's INSERT (or UPDATE) fails instead, naming the constraint, and
-- nothing of its transaction is kept.
--
-- Rows stored before are brought within range first, since every later update of a row is
-- checked (a claim of an old row out of range would fail, and fail again): an expires_at past
-- 9999 (an earlier Herald took '9999-12-31T23:59:59-01:00', year 10000 in UTC) means never, so
-- none; any other time is held to the range's ends ('-infinity' is 0001-01-01, a time past 9999
-- is 9999-12-31 23:59:59.999999; NULL stays NULL: GREATEST and LEAST would make it an end).
-- Then the constraints are checked over the whole table.
UPDATE herald_outbox SET
    scheduled_at = CASE WHEN scheduled_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00' WHEN scheduled_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00' ELSE scheduled_at END,
    next_attempt_at = CASE WHEN next_attempt_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00' WHEN next_attempt_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00' ELSE next_attempt_at END,
    expires_at = CASE WHEN expires_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00' WHEN expires_at > '9999-12-31 23:59:59.999999+00' THEN NULL ELSE expires_at END,
    lease_until = CASE WHEN lease_until < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00' WHEN lease_until > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00' ELSE lease_until END,
    delivery_status_at = CASE WHEN delivery_status_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00' WHEN delivery_status_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00' ELSE delivery_status_at END,
    created_at = CASE WHEN created_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00' WHEN created_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00' ELSE created_at END,
    updated_at = CASE WHEN updated_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00' WHEN updated_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00' ELSE updated_at END,
    ordering_released_at = CASE WHEN ordering_released_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00' WHEN ordering_released_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00' ELSE ordering_released_at END
WHERE NOT (scheduled_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00')
   OR NOT (next_attempt_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00')
   OR NOT (expires_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00')
   OR NOT (lease_until BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00')
   OR NOT (delivery_status_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00')
   OR NOT (created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00')
   OR NOT (updated_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00')
   OR NOT (ordering_released_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00');

-- A receipt's event time becomes a message's delivery_status_at: one stored out of range (a
-- Plivo time of year 10000 was taken) would fail the reconciler's batch at every pass. It is no
-- event time: the receipt is ordered by its arrival, as one without any.
UPDATE herald_receipts SET event_time = NULL
WHERE NOT (event_time BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00');

ALTER TABLE herald_outbox
    ADD CONSTRAINT herald_outbox_scheduled_at_range CHECK (scheduled_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'),
    ADD CONSTRAINT herald_outbox_next_attempt_at_range CHECK (next_attempt_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'),
    ADD CONSTRAINT herald_outbox_expires_at_range CHECK (expires_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'),
    ADD CONSTRAINT herald_outbox_lease_until_range CHECK (lease_until BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'),
    ADD CONSTRAINT herald_outbox_delivery_status_at_range CHECK (delivery_status_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'),
    ADD CONSTRAINT herald_outbox_created_at_range CHECK (created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'),
    ADD CONSTRAINT herald_outbox_updated_at_range CHECK (updated_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'),
    ADD CONSTRAINT herald_outbox_ordering_released_at_range CHECK (ordering_released_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00');
