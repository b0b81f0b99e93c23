//! `herald_outbox`: the way in, the claim, outcomes and the watchdog. Every write that moves a
//! message is fenced on the state (and lease) it expects, so a stale writer changes nothing.

use chrono::{DateTime, Utc};

use super::models::{
    Applied, ExpiredLease, LeaseDecision, LeaseSweep, NewOutboxRow, Now, OutboxRow, OutcomeRecord,
};
use super::{Db, StorageError, per_backend};
use crate::domain::policies::Policies;

per_backend! {
    use chrono::{DateTime, Utc};
    use diesel::prelude::*;

    use crate::storage::models::*;
    use crate::domain::{AttemptClass, Semantics, State};
    use crate::storage::sql::coalesce_text;
    use crate::domain::policies::Policies;
    use self::schema::herald_outbox as o;

    /// Inserts a message; `None` when its event id is already there.
    pub fn insert_message(conn: &mut Conn, m: &NewOutboxRow) -> QueryResult<Option<i64>> {
        diesel::insert_into(o::table)
            .values((
                o::event_id.eq(&m.event_id),
                o::channel.eq(m.channel),
                o::destination.eq(&m.destination),
                o::payload.eq(&m.payload),
                // None: the column default (`now()`), and the insert trigger copies it to
                // next_attempt_at.
                sql::scheduled_at(m).map(|t| o::scheduled_at.eq(t)),
                sql::scheduled_at(m).map(|t| o::next_attempt_at.eq(Some(t))),
                o::max_attempts.eq(m.max_attempts),
                o::retry_policy.eq(&m.retry_policy),
                o::retry_policy_version.eq(&m.retry_policy_version),
                o::message_key.eq(&m.message_key),
                o::semantics.eq(m.semantics),
                o::expires_at.eq(m.expires_at),
                o::request_fingerprint.eq(&m.request_fingerprint),
                o::enqueued_by.eq(&m.enqueued_by),
                o::ordering_key.eq(&m.ordering_key),
                o::ordering_policy.eq(m.ordering_policy),
                o::created_at.eq(m.now),
                o::updated_at.eq(m.now),
            ))
            .on_conflict(o::event_id)
            .do_nothing()
            .returning(o::id)
            .get_result(conn)
            .optional()
    }

    /// The messages with these event ids (those there are).
    pub fn find_by_event_ids(conn: &mut Conn, event_ids: &[&str]) -> QueryResult<Vec<OutboxRow>> {
        o::table.filter(o::event_id.eq_any(event_ids)).load(conn)
    }

    pub fn find_by_event_id(
        conn: &mut Conn,
        event_id: &str,
    ) -> QueryResult<Option<OutboxRow>> {
        o::table
            .filter(o::event_id.eq(event_id))
            .first(conn)
            .optional()
    }

    /// `scheduled|retryable → canceled`, and a keyed `dead_letter|unconfirmed` head that
    /// holds its key (canceling it releases the key); returns whether the row changed.
    pub fn cancel(
        conn: &mut Conn,
        event_id: &str,
        now: DateTime<Utc>,
    ) -> QueryResult<bool> {
        let blocking_head = o::ordering_key
            .is_not_null()
            .and(o::state.eq_any([State::DeadLetter, State::Unconfirmed]))
            .and(o::ordering_released_at.is_null());
        let n = diesel::update(
            o::table
                .filter(o::event_id.eq(event_id))
                .filter(o::state.eq_any([State::Scheduled, State::Retryable]).or(blocking_head)),
        )
        .set((
            o::state.eq(State::Canceled),
            o::next_attempt_at.eq(None::<DateTime<Utc>>),
            o::updated_at.eq(now),
        ))
        .execute(conn)?;
        if n == 1 {
            let ids: Vec<i64> = o::table
                .filter(o::event_id.eq(event_id))
                .filter(o::ordering_key.is_not_null())
                .select(o::id)
                .load(conn)?;
            q::release_heads(conn, &ids)?;
        }
        Ok(n == 1)
    }

    /// Leases up to `limit` due rows to `owner` for `lease` and returns them, with how
    /// many due rows expired instead (the claim transaction).
    pub fn claim(
        conn: &mut Conn,
        now: &Now,
        limit: i64,
        owner: &str,
        lease: std::time::Duration,
        policies: &Policies,
    ) -> QueryResult<(Vec<OutboxRow>, usize)> {
        sql::keep_to_indexes(conn)?;
        let mut rows = sql::claim_rows(conn, now, limit, owner, lease, policies)?;
        if rows.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let claimed = rows.len();
        let expired: Vec<i64> = rows
            .iter()
            .filter(|r| r.state != State::Sending && r.ordering_key.is_some())
            .map(|r| r.id)
            .collect();
        rows.retain(|r| r.state == State::Sending);
        // Each keyed row still its key's head, seen after the claim (`sql::claimed_not_heads`);
        // else the whole claim is undone, and `Db::claim` makes it again.
        let keyed: Vec<i64> = rows.iter().filter(|r| r.ordering_key.is_some()).map(|r| r.id).collect();
        if !sql::claimed_not_heads(conn, &keyed)?.is_empty() {
            return Err(diesel::result::Error::RollbackTransaction);
        }
        // An expired head no longer holds its key.
        q::release_heads(conn, &expired)?;
        let expired = claimed - rows.len();
        Ok((rows, expired))
    }

    /// Writes a batch of outcomes: each row only if still leased to `owner` for that
    /// attempt (a fence against a lease that expired and was claimed again), and one
    /// attempt row per request made, saying what really became of it (`lease_lost`
    /// when the fence refused it). Also returns the ended keyed messages whose key was
    /// busy with an insert (`sql::busy_keys`): to be released again once it is free.
    pub fn record_outcomes(
        conn: &mut Conn,
        owner: &str,
        now: &Now,
        outcomes: &[OutcomeRecord],
    ) -> QueryResult<(Vec<Applied>, Vec<i64>)> {
        sql::keep_to_indexes(conn)?;
        let at = sql::now(conn, now)?;
        let mut applied = sql::update_outcomes(conn, owner, now, at, outcomes)?;
        let back: Vec<i64> = outcomes.iter().flat_map(|x| x.due_now.iter().copied()).collect();
        if !back.is_empty() {
            make_due(conn, at, &back)?;
        }
        for (a, x) in applied.iter_mut().zip(outcomes) {
            if *a == Applied::LeaseLost
                && x.state == State::Delivered
                && settle_late(conn, at, x)?
            {
                *a = Applied::Settled;
            }
        }
        q::insert_attempts(conn, Some(owner), outcomes, &applied)?;
        let busy = end_heads(conn, at, outcomes.iter().zip(&applied).filter(|(_, a)| **a != Applied::LeaseLost).map(|(x, _)| x))?;
        Ok((applied, busy))
    }

    /// Makes `ids` due at `at` where they still wait as `retryable` for later (see
    /// `OutcomeRecord::due_now`); returns how many. Ended, canceled, claimed again or due
    /// already: left alone.
    fn make_due(conn: &mut Conn, at: DateTime<Utc>, ids: &[i64]) -> QueryResult<usize> {
        diesel::update(
            o::table
                .filter(o::id.eq_any(ids))
                .filter(o::state.eq(State::Retryable))
                .filter(o::next_attempt_at.gt(at)),
        )
        .set((o::next_attempt_at.eq(Some(at)), o::updated_at.eq(at)))
        .execute(conn)
    }

    /// Keyed messages whose outcome ended their turn: a dead or unconfirmed one under `skip`
    /// stops holding its key, and each key's next place becomes due where its head is done.
    /// Nothing at all for a batch without keyed messages. Returns those of them whose key an
    /// uncommitted insert holds (`sql::busy_keys`).
    fn end_heads<'a>(
        conn: &mut Conn,
        at: DateTime<Utc>,
        outcomes: impl Iterator<Item = &'a OutcomeRecord>,
    ) -> QueryResult<Vec<i64>> {
        let mut skip = Vec::new();
        let mut ended = Vec::new();
        for x in outcomes {
            let Some(policy) = x.ordering else { continue };
            match x.state {
                State::DeadLetter | State::Unconfirmed => {
                    if policy == crate::domain::OrderingPolicy::Skip {
                        skip.push(x.message_id);
                    }
                    ended.push(x.message_id);
                }
                State::Delivered | State::Canceled | State::Expired => ended.push(x.message_id),
                State::Scheduled | State::Sending | State::Retryable => {}
            }
        }
        // Before the release: its statement must see every insert that held a key's lock.
        let busy = sql::busy_keys(conn, &ended)?;
        q::mark_released(conn, at, &skip)?;
        q::release_ended_heads(conn, &ended)?;
        Ok(busy)
    }

    /// Releases the keys of `ids` again where no insert holds them now; returns how many
    /// messages became due and the ids whose key is still busy.
    pub fn release_rechecked(conn: &mut Conn, ids: &[i64]) -> QueryResult<(usize, Vec<i64>)> {
        let busy = sql::busy_keys(conn, ids)?;
        let free: Vec<i64> = ids.iter().copied().filter(|id| !busy.contains(id)).collect();
        // With the check for a message in flight: one may have been claimed since those outcomes.
        Ok((q::release_heads(conn, &free)?, busy))
    }

    /// A definite 2xx that comes back after the watchdog moved its `at_most_once`
    /// message to `unconfirmed` at this same attempt: nothing was sent since, so the
    /// answer settles the message.
    fn settle_late(
        conn: &mut Conn,
        at: DateTime<Utc>,
        x: &OutcomeRecord,
    ) -> QueryResult<bool> {
        // Unconfirmed, or already settled by a receipt: either way nothing was sent since.
        let fenced = |state: State| {
            o::table
                .filter(o::id.eq(x.message_id))
                .filter(o::state.eq(state))
                .filter(o::semantics.eq(Semantics::AtMostOnce))
                .filter(o::attempts.eq(x.claimed_attempt))
                .filter(o::lease_owner.is_null())
        };
        let pmid = coalesce_text(x.provider_message_id.as_deref(), o::provider_message_id);
        let n = diesel::update(fenced(State::Unconfirmed))
            .set((
                o::state.eq(State::Delivered),
                o::last_error_class.eq(None::<AttemptClass>),
                o::next_attempt_at.eq(None::<DateTime<Utc>>),
                o::provider_message_id.eq(pmid),
                o::updated_at.eq(at),
            ))
            .execute(conn)?;
        if n == 1 {
            return Ok(true);
        }
        // Delivered since, by a receipt: it keeps the time it became so (retention counts from
        // it, and support's "ended at"); the answer adds its provider id if it had none.
        let n = diesel::update(fenced(State::Delivered))
            .set((
                o::last_error_class.eq(None::<AttemptClass>),
                o::provider_message_id.eq(pmid),
            ))
            .execute(conn)?;
        Ok(n == 1)
    }

    /// The watchdog: each `sending` row whose lease ran out (by the database's clock on
    /// PostgreSQL) moves to the state `decide` chooses — the sender's own decision for
    /// an ambiguous attempt, with its backoff — and gets its `lease_expired` attempt
    /// row, in one transaction with the rows locked: two watchdogs never both move a
    /// row, and an outcome committed first leaves nothing to move. A row `decide`
    /// leaves (`None`: its sender still holds its outcome, to be written) stays as it is.
    pub fn sweep_expired_leases(
        conn: &mut Conn,
        now: &Now,
        decide: &dyn Fn(&ExpiredLease, DateTime<Utc>) -> Option<LeaseDecision>,
    ) -> QueryResult<LeaseSweep> {
        sql::keep_to_indexes(conn)?;
        let at = sql::now(conn, now)?;
        let mut sweep = LeaseSweep::default();
        let mut outcomes = Vec::new();
        for mut row in sql::expired_leases(conn, at)? {
            let Some(d) = decide(&row, at) else {
                continue;
            };
            // A message written by SQL gets its fingerprint here when its sender's outcome
            // never came: support finds a send by it (a walk-through found one without).
            row.request_fingerprint = row.fingerprint();
            let next = d.delay_ms.map(|ms| at + chrono::Duration::milliseconds(ms));
            let n = diesel::update(
                o::table
                    .filter(o::id.eq(row.id))
                    .filter(o::state.eq(State::Sending))
                    .filter(o::attempts.eq(row.attempts))
                    .filter(o::lease_until.lt(at)),
            )
            .set((
                o::state.eq(d.state),
                o::last_error_class.eq(d.error_class),
                o::next_attempt_at.eq(next),
                o::lease_owner.eq(None::<String>),
                o::lease_until.eq(None::<DateTime<Utc>>),
                o::updated_at.eq(at),
                o::request_fingerprint.eq(&row.request_fingerprint),
            ))
            .execute(conn)?;
            if n == 1 {
                sweep.count(d.state);
                outcomes.push(OutcomeRecord::lease_expired(&row, &d, at));
            }
        }
        let applied = vec![Applied::Yes; outcomes.len()];
        q::insert_attempts(conn, None, &outcomes, &applied)?;
        // A key busy with an insert here waits for the periodic release (expiries are rare).
        end_heads(conn, at, outcomes.iter())?;
        Ok(sweep)
    }
}

/// How many times [`Db::claim`] makes a claim that a replay undid.
const CLAIM_TRIES: usize = 5;

impl Db {
    pub fn insert_message(&self, m: &NewOutboxRow) -> Result<Option<i64>, StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::insert_message(c, m)?) }
    }

    /// The message with this event id. An id with a NUL character cannot be stored on either
    /// backend's text columns as Herald writes them: it is simply not there.
    pub fn find_by_event_id(&self, event_id: &str) -> Result<Option<OutboxRow>, StorageError> {
        if event_id.contains('\0') {
            return Ok(None);
        }
        crate::storage::db_run! { self, read |c, q| Ok(q::find_by_event_id(c, event_id)?) }
    }

    /// Cancels a not-yet-sent message; returns the row as it now is.
    pub fn cancel(
        &self,
        event_id: &str,
        now: DateTime<Utc>,
    ) -> Result<(bool, Option<OutboxRow>), StorageError> {
        if event_id.contains('\0') {
            return Ok((false, None));
        }
        crate::storage::db_run! { self, write |c, q| {
            let changed = q::cancel(c, event_id, now)?;
            Ok((changed, q::find_by_event_id(c, event_id)?))
        }}
    }

    /// The claim transaction: committed when this returns, before any network call.
    pub fn claim(
        &self,
        now: Now,
        limit: u32,
        owner: &str,
        lease: std::time::Duration,
        policies: &Policies,
    ) -> Result<(Vec<OutboxRow>, usize), StorageError> {
        let limit = i64::from(limit);
        // A claim undone because a replay committed under it (`q::claim`) is made again at once,
        // on a fresh snapshot; each try needs another replay of the same key to commit in that
        // instant, so a few tries are plenty. After the last, nothing is claimed this time.
        for _ in 0..CLAIM_TRIES {
            let claimed = crate::storage::db_run! { self, write |c, q| Ok(q::claim(c, &now, limit, owner, lease, policies)?) };
            match claimed {
                Err(StorageError::Query(diesel::result::Error::RollbackTransaction)) => {
                    tracing::debug!("claim undone: a replay of a key it took committed under it");
                }
                r => return r,
            }
        }
        tracing::warn!(
            tries = CLAIM_TRIES,
            "every claim was undone by a replay committing under it; nothing claimed this time"
        );
        Ok((Vec::new(), 0))
    }

    /// PostgreSQL: promises, for `for_ms` ms, that this sender claims again every few ms, so that
    /// applications' inserts meanwhile skip the wake-up (`sql::pg_promise_awake`); the promise
    /// to withdraw with [`Db::settle_awake`]. SQLite: nothing to promise (`None`).
    pub fn promise_awake(&self, for_ms: i64) -> Result<Option<i64>, StorageError> {
        match self {
            Db::Pg(pool) => {
                super::pg_autocommit(pool, |c| Ok(Some(super::sql::pg_promise_awake(c, for_ms)?)))
            }
            Db::Sqlite(_) => Ok(None),
        }
    }

    /// PostgreSQL: withdraws `promise` (unless another sender's replaced it) and says whether
    /// every transaction that may have skipped its wake-up under it has ended; a claim after a
    /// `true` sees their rows (`sql::pg_settle_awake`). SQLite: `true`.
    pub fn settle_awake(&self, promise: i64) -> Result<bool, StorageError> {
        match self {
            Db::Pg(pool) => {
                super::pg_autocommit(pool, |c| Ok(super::sql::pg_settle_awake(c, promise)?))
            }
            Db::Sqlite(_) => Ok(true),
        }
    }

    /// PostgreSQL: wakes every listening sender (NOTIFY), as an insert would (a stopping sender
    /// hands over the rows whose wake-up was skipped under its promise). SQLite: nothing.
    pub fn wake_senders(&self) -> Result<(), StorageError> {
        match self {
            Db::Pg(pool) => super::pg_autocommit(pool, |c| Ok(super::sql::pg_wake_senders(c)?)),
            Db::Sqlite(_) => Ok(()),
        }
    }

    /// The outcome transaction (see the per-backend body): what each outcome did, and the ended
    /// keyed messages to pass to [`Db::release_rechecked`] later.
    pub fn record_outcomes(
        &self,
        owner: &str,
        now: Now,
        outcomes: &[OutcomeRecord],
    ) -> Result<(Vec<Applied>, Vec<i64>), StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::record_outcomes(c, owner, &now, outcomes)?) }
    }

    /// Releases the keys of messages whose outcome found their key busy with an insert (see
    /// `sql::busy_keys`), where the insert has ended; returns how many messages became due and
    /// the ids still busy (to try again when the sender is next woken).
    pub fn release_rechecked(&self, ids: &[i64]) -> Result<(usize, Vec<i64>), StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::release_rechecked(c, ids)?) }
    }

    /// One watchdog pass; `decide` is the sender's decision for an expired lease.
    pub fn sweep_expired_leases(
        &self,
        now: Now,
        decide: &dyn Fn(&ExpiredLease, DateTime<Utc>) -> Option<LeaseDecision>,
    ) -> Result<LeaseSweep, StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::sweep_expired_leases(c, &now, decide)?) }
    }

    /// Inserts a prepared message unless its event id exists, in one transaction
    /// ([`crate::outbox::enqueue_row`]): whether it was created and the stored row, or refused
    /// naming `event_id` when that is a fan-out's.
    pub fn enqueue(
        &self,
        m: &NewOutboxRow,
    ) -> Result<Result<(bool, OutboxRow), Vec<crate::domain::InvalidField>>, StorageError> {
        crate::storage::db_run! { self, write |c, q| {
            q::lock_event_id(c, &m.event_id)?;
            Ok(crate::outbox::enqueue_row(c, m)?)
        } }
    }

    /// [`Db::enqueue`], waiting at most `lock_timeout` for a lock another transaction holds on
    /// PostgreSQL (then an error: nothing written); the commit waits as long as it must
    /// ([`crate::storage::sql::pg_wait_for_locks`]). SQLite: [`Db::enqueue`].
    pub fn enqueue_waiting_at_most(
        &self,
        m: &NewOutboxRow,
        lock_timeout: std::time::Duration,
    ) -> Result<Result<(bool, OutboxRow), Vec<crate::domain::InvalidField>>, StorageError> {
        let Db::Pg(pool) = self else {
            return self.enqueue(m);
        };
        crate::storage::pg_transaction(pool, |c| -> Result<_, StorageError> {
            use crate::storage::queries::pg as q;
            diesel::connection::SimpleConnection::batch_execute(
                c,
                &format!(
                    "SET LOCAL lock_timeout = {}",
                    lock_timeout.as_millis().max(1)
                ),
            )?;
            q::lock_event_id(c, &m.event_id)?;
            let r = crate::outbox::enqueue_row(c, m)?;
            crate::storage::sql::pg_wait_for_locks(c)?;
            Ok(r)
        })
    }
}
