-- Every time in herald_outbox must be one Herald can read back: a finite time within the years
-- 1-9999. An application writing by plain SQL could store 'infinity', '-infinity' or a year past
-- chrono's 262143; the claim reads whole rows (RETURNING o.*), so such a row failed every claim
-- it came first in, and with scheduled_at = '-infinity' that is every claim: nothing was sent
-- any more. Now the application's INSERT fails instead, naming the constraint, and nothing of its
-- transaction is kept. NOT VALID: rows already stored are not scanned (new rows and every update
-- are checked).
ALTER TABLE herald_outbox
    ADD CONSTRAINT herald_outbox_scheduled_at_range CHECK (scheduled_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT herald_outbox_next_attempt_at_range CHECK (next_attempt_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT herald_outbox_expires_at_range CHECK (expires_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT herald_outbox_lease_until_range CHECK (lease_until BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT herald_outbox_delivery_status_at_range CHECK (delivery_status_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT herald_outbox_created_at_range CHECK (created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT herald_outbox_updated_at_range CHECK (updated_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID,
    ADD CONSTRAINT herald_outbox_ordering_released_at_range CHECK (ordering_released_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID;
