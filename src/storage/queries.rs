//! Query bodies. `backend_queries!` compiles the shared ones once per backend against that
//! backend's schema; the claim, whose SQL differs, is given per backend.

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Integer, Nullable, Text};

use crate::domain::State;

use super::models::{
    Applied, LeaseDecision, LeaseSweep, NewOutboxRow, NewReceipt, Now, OutboxRow, OutcomeRecord,
    ReceiptRow,
};
use super::{Db, StorageError};

diesel::define_sql_function! {
    #[sql_name = "COALESCE"]
    fn coalesce_text(x: Nullable<Text>, y: Nullable<Text>) -> Nullable<Text>;
}

#[derive(diesel::QueryableByName)]
struct IdRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// "Now" on PostgreSQL: the database's clock, moved by the caller's shift (`$1`, microseconds).
/// `now()` is fixed for the transaction, so the planner evaluates this once and can still use the
/// due index.
macro_rules! pg_now {
    () => {
        "(now() + $1::float8 * interval '1 microsecond')"
    };
}

/// The PostgreSQL claim: lock due rows with SKIP LOCKED in a CTE (never `id IN (subquery)`,
/// which can lock more rows than its LIMIT), lease them, count the attempt, return their ids.
/// A due row whose `expires_at` has passed becomes `expired` in the same statement: no lease, no
/// attempt, no request. Every time is the database's ([`pg_now!`]); the lease is `$4` µs long.
/// A row inserted by plain SQL gets the policy version in force (`$5`) at its first claim.
/// The predicate and order match the partial index `herald_outbox_due` exactly; the state list is
/// literal SQL, not bound parameters, so the planner can match the index.
pub const PG_CLAIM_SQL: &str = concat!(
    "WITH due AS (
    SELECT id FROM herald_outbox
    WHERE state IN ('scheduled', 'retryable') AND next_attempt_at <= ",
    pg_now!(),
    "
    ORDER BY next_attempt_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), t AS (SELECT ",
    pg_now!(),
    " AS now)
UPDATE herald_outbox AS o
SET state = CASE WHEN o.expires_at <= t.now THEN 'expired' ELSE 'sending' END,
    attempts = CASE WHEN o.expires_at <= t.now THEN o.attempts ELSE o.attempts + 1 END,
    lease_owner = CASE WHEN o.expires_at <= t.now THEN NULL ELSE $3 END,
    lease_until = CASE WHEN o.expires_at <= t.now THEN NULL
                       ELSE t.now + $4::float8 * interval '1 microsecond' END,
    next_attempt_at = CASE WHEN o.expires_at <= t.now THEN NULL ELSE o.next_attempt_at END,
    retry_policy_version = COALESCE(o.retry_policy_version, $5),
    updated_at = t.now
FROM due, t
WHERE o.id = due.id
RETURNING o.id"
);

/// The SQLite claim: the same predicate, order and lease in one statement; it runs inside
/// `BEGIN IMMEDIATE` behind the writer lock, which is what makes it exclusive. One process, so
/// its clock is the only one: `?1` now, `?4` the lease's end.
pub const SQLITE_CLAIM_SQL: &str = "\
UPDATE herald_outbox
SET state = CASE WHEN expires_at <= ?1 THEN 'expired' ELSE 'sending' END,
    attempts = CASE WHEN expires_at <= ?1 THEN attempts ELSE attempts + 1 END,
    lease_owner = CASE WHEN expires_at <= ?1 THEN NULL ELSE ?3 END,
    lease_until = CASE WHEN expires_at <= ?1 THEN NULL ELSE ?4 END,
    next_attempt_at = CASE WHEN expires_at <= ?1 THEN NULL ELSE next_attempt_at END,
    retry_policy_version = COALESCE(retry_policy_version, ?5),
    updated_at = ?1
WHERE id IN (
    SELECT id FROM herald_outbox
    WHERE state IN ('scheduled', 'retryable') AND next_attempt_at <= ?1
    ORDER BY next_attempt_at, id
    LIMIT ?2
)
RETURNING id";

fn pg_claim_ids(
    conn: &mut diesel::pg::PgConnection,
    now: &Now,
    limit: i64,
    owner: &str,
    lease: std::time::Duration,
    policy_version: &str,
) -> diesel::QueryResult<Vec<i64>> {
    use diesel::RunQueryDsl;
    use diesel::sql_types::Double;
    let rows: Vec<IdRow> = diesel::sql_query(PG_CLAIM_SQL)
        .bind::<Double, _>(now.shift_micros())
        .bind::<BigInt, _>(limit)
        .bind::<Text, _>(owner)
        .bind::<Double, _>(lease.as_micros() as f64)
        .bind::<Text, _>(policy_version)
        .load(conn)?;
    Ok(rows.into_iter().map(|r| r.id).collect())
}

fn sqlite_claim_ids(
    conn: &mut diesel::sqlite::SqliteConnection,
    now: &Now,
    limit: i64,
    owner: &str,
    lease: std::time::Duration,
    policy_version: &str,
) -> diesel::QueryResult<Vec<i64>> {
    use diesel::RunQueryDsl;
    use diesel::sql_types::TimestamptzSqlite;
    let lease_until = now.local + chrono::Duration::from_std(lease).unwrap_or_default();
    let rows: Vec<IdRow> = diesel::sql_query(SQLITE_CLAIM_SQL)
        .bind::<TimestamptzSqlite, _>(now.local)
        .bind::<BigInt, _>(limit)
        .bind::<Text, _>(owner)
        .bind::<TimestamptzSqlite, _>(lease_until)
        .bind::<Text, _>(policy_version)
        .load(conn)?;
    Ok(rows.into_iter().map(|r| r.id).collect())
}

#[derive(diesel::QueryableByName)]
struct PgTime {
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    now: DateTime<Utc>,
}

/// The database's "now" (moved by the shift), for statements built with the query builder.
fn pg_now(conn: &mut diesel::pg::PgConnection, now: &Now) -> diesel::QueryResult<DateTime<Utc>> {
    use diesel::RunQueryDsl;
    let t: PgTime = diesel::sql_query(concat!("SELECT ", pg_now!(), " AS now"))
        .bind::<diesel::sql_types::Double, _>(now.shift_micros())
        .get_result(conn)?;
    Ok(t.now)
}

fn sqlite_now(
    _conn: &mut diesel::sqlite::SqliteConnection,
    now: &Now,
) -> diesel::QueryResult<DateTime<Utc>> {
    Ok(now.local)
}

/// How many expired leases one watchdog pass handles at most (the next pass takes the rest).
const SWEEP_BATCH: i64 = 500;

/// Expired leases, locked: a second watchdog skips them, and an outcome arriving meanwhile waits
/// for the sweep to commit and then fails its fence.
fn pg_expired_leases(
    conn: &mut diesel::pg::PgConnection,
    at: DateTime<Utc>,
) -> diesel::QueryResult<Vec<OutboxRow>> {
    use super::schema_pg::herald_outbox as o;
    use diesel::prelude::*;
    o::table
        .filter(o::state.eq(State::Sending))
        .filter(o::lease_until.lt(at))
        .order(o::id)
        .limit(SWEEP_BATCH)
        .for_update()
        .skip_locked()
        .load(conn)
}

/// SQLite: the sweep runs in `BEGIN IMMEDIATE` behind the writer lock, exclusive already.
fn sqlite_expired_leases(
    conn: &mut diesel::sqlite::SqliteConnection,
    at: DateTime<Utc>,
) -> diesel::QueryResult<Vec<OutboxRow>> {
    use super::schema_sqlite::herald_outbox as o;
    use diesel::prelude::*;
    o::table
        .filter(o::state.eq(State::Sending))
        .filter(o::lease_until.lt(at))
        .order(o::id)
        .limit(SWEEP_BATCH)
        .load(conn)
}

macro_rules! backend_queries {
    ($name:ident, $conn:ty, $schema:ident, $claim_ids:path, $db_now:path, $expired_leases:path, $update_outcomes:path) => {
        pub mod $name {
            use chrono::{DateTime, Utc};
            use diesel::prelude::*;

            use super::coalesce_text;
            use crate::domain::{AttemptClass, Semantics, State};
            use crate::storage::models::*;
            use crate::storage::$schema::{
                herald_attempts as a, herald_outbox as o, herald_receipts as r,
                herald_settings as s,
            };

            pub type Conn = $conn;

            /// Inserts a message; `None` when its event id is already there.
            pub fn insert_message(conn: &mut Conn, m: &NewOutboxRow) -> QueryResult<Option<i64>> {
                diesel::insert_into(o::table)
                    .values((
                        o::event_id.eq(&m.event_id),
                        o::channel.eq(m.channel),
                        o::destination.eq(&m.destination),
                        o::payload.eq(&m.payload),
                        o::scheduled_at.eq(m.scheduled_at),
                        o::next_attempt_at.eq(Some(m.scheduled_at)),
                        o::max_attempts.eq(m.max_attempts),
                        o::retry_policy.eq(&m.retry_policy),
                        o::retry_policy_version.eq(&m.retry_policy_version),
                        o::semantics.eq(m.semantics),
                        o::expires_at.eq(m.expires_at),
                        o::request_fingerprint.eq(&m.request_fingerprint),
                        o::created_at.eq(m.now),
                        o::updated_at.eq(m.now),
                    ))
                    .on_conflict(o::event_id)
                    .do_nothing()
                    .returning(o::id)
                    .get_result(conn)
                    .optional()
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

            pub fn find_by_ids(conn: &mut Conn, ids: &[i64]) -> QueryResult<Vec<OutboxRow>> {
                o::table
                    .filter(o::id.eq_any(ids))
                    .order((o::next_attempt_at, o::id))
                    .load(conn)
            }

            pub fn attempts_of(conn: &mut Conn, message_id: i64) -> QueryResult<Vec<AttemptRow>> {
                a::table
                    .filter(a::message_id.eq(message_id))
                    .order((a::attempt_number, a::id))
                    .load(conn)
            }

            /// `scheduled|retryable → canceled`; returns whether the row changed.
            pub fn cancel(
                conn: &mut Conn,
                event_id: &str,
                now: DateTime<Utc>,
            ) -> QueryResult<bool> {
                let n = diesel::update(
                    o::table
                        .filter(o::event_id.eq(event_id))
                        .filter(o::state.eq_any([State::Scheduled, State::Retryable])),
                )
                .set((
                    o::state.eq(State::Canceled),
                    o::next_attempt_at.eq(None::<DateTime<Utc>>),
                    o::updated_at.eq(now),
                ))
                .execute(conn)?;
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
                policy_version: &str,
            ) -> QueryResult<(Vec<OutboxRow>, usize)> {
                let ids = $claim_ids(conn, now, limit, owner, lease, policy_version)?;
                if ids.is_empty() {
                    return Ok((Vec::new(), 0));
                }
                let mut rows = find_by_ids(conn, &ids)?;
                rows.retain(|r| r.state == State::Sending);
                let expired = ids.len() - rows.len();
                Ok((rows, expired))
            }

            /// Writes a batch of outcomes: each row only if still leased to `owner` for that
            /// attempt (a fence against a lease that expired and was claimed again), and one
            /// attempt row per request made, saying what really became of it (`lease_lost`
            /// when the fence refused it).
            pub fn record_outcomes(
                conn: &mut Conn,
                owner: &str,
                now: &Now,
                outcomes: &[OutcomeRecord],
            ) -> QueryResult<Vec<Applied>> {
                let at = $db_now(conn, now)?;
                let mut applied = $update_outcomes(conn, owner, now, at, outcomes)?;
                for (a, x) in applied.iter_mut().zip(outcomes) {
                    if *a == Applied::LeaseLost
                        && x.state == State::Delivered
                        && settle_late(conn, at, x)?
                    {
                        *a = Applied::Settled;
                    }
                }
                insert_attempts(conn, Some(owner), outcomes, &applied)?;
                Ok(applied)
            }

            /// A definite 2xx that comes back after the watchdog moved its `at_most_once`
            /// message to `unconfirmed` at this same attempt: nothing was sent since, so the
            /// answer settles the message.
            fn settle_late(
                conn: &mut Conn,
                at: DateTime<Utc>,
                x: &OutcomeRecord,
            ) -> QueryResult<bool> {
                let n = diesel::update(
                    o::table
                        .filter(o::id.eq(x.message_id))
                        .filter(o::state.eq(State::Unconfirmed))
                        .filter(o::semantics.eq(Semantics::AtMostOnce))
                        .filter(o::attempts.eq(x.claimed_attempt))
                        .filter(o::lease_owner.is_null()),
                )
                .set((
                    o::state.eq(State::Delivered),
                    o::last_error_class.eq(None::<AttemptClass>),
                    o::next_attempt_at.eq(None::<DateTime<Utc>>),
                    o::provider_message_id.eq(coalesce_text(
                        x.provider_message_id.as_deref(),
                        o::provider_message_id,
                    )),
                    o::updated_at.eq(at),
                ))
                .execute(conn)?;
                Ok(n == 1)
            }

            /// The fenced outcome update, one statement per row.
            #[allow(dead_code)]
            pub fn update_outcomes_each(
                conn: &mut Conn,
                owner: &str,
                _now: &Now,
                at: DateTime<Utc>,
                outcomes: &[OutcomeRecord],
            ) -> QueryResult<Vec<Applied>> {
                let mut applied = Vec::with_capacity(outcomes.len());
                for x in outcomes {
                    let n = diesel::update(
                        o::table
                            .filter(o::id.eq(x.message_id))
                            .filter(o::state.eq(State::Sending))
                            .filter(o::lease_owner.eq(owner))
                            .filter(o::attempts.eq(x.claimed_attempt)),
                    )
                    .set((
                        o::state.eq(x.state),
                        o::attempts.eq(x.attempts_after),
                        o::next_attempt_at.eq(x.next_attempt_at),
                        o::lease_owner.eq(None::<String>),
                        o::lease_until.eq(None::<DateTime<Utc>>),
                        o::last_error_class.eq(x.error_class),
                        o::provider_message_id.eq(coalesce_text(
                            x.provider_message_id.as_deref(),
                            o::provider_message_id,
                        )),
                        o::request_fingerprint.eq(coalesce_text(
                            o::request_fingerprint,
                            x.request_fingerprint.as_deref(),
                        )),
                        o::updated_at.eq(at),
                    ))
                    .execute(conn)?;
                    applied.push(if n == 1 {
                        Applied::Yes
                    } else {
                        Applied::LeaseLost
                    });
                }
                Ok(applied)
            }

            fn insert_attempts(
                conn: &mut Conn,
                owner: Option<&str>,
                outcomes: &[OutcomeRecord],
                applied: &[Applied],
            ) -> QueryResult<()> {
                let rows: Vec<_> = outcomes
                    .iter()
                    .zip(applied)
                    .filter_map(|(x, a)| x.attempt.as_ref().map(|t| (x, t, a)))
                    .map(|(x, t, applied)| {
                        (
                            a::message_id.eq(x.message_id),
                            a::event_id.eq(&x.event_id),
                            a::attempt_number.eq(x.claimed_attempt),
                            a::started_at.eq(t.started_at),
                            a::finished_at.eq(t.finished_at),
                            a::duration_ms.eq(t.duration_ms),
                            a::request_fingerprint.eq(&x.request_fingerprint),
                            a::response_status.eq(t.response_status),
                            a::error_kind.eq(&t.error_kind),
                            a::class.eq(t.class),
                            a::retry_after.eq(&t.retry_after),
                            a::delay_ms.eq(t.delay_ms),
                            a::delay_reason.eq(&t.delay_reason),
                            a::policy_version.eq(&t.policy_version),
                            (
                                a::provider_message_id.eq(&x.provider_message_id),
                                a::response_excerpt.eq(&t.response_excerpt),
                                a::lease_owner.eq(owner),
                                a::next_state.eq(applied.next_state(x.state)),
                            ),
                        )
                    })
                    .collect();
                if !rows.is_empty() {
                    diesel::insert_into(a::table)
                        .values(rows)
                        .on_conflict_do_nothing()
                        .execute(conn)?;
                }
                Ok(())
            }

            /// The watchdog: each `sending` row whose lease ran out (by the database's clock on
            /// PostgreSQL) moves to the state `decide` chooses — the sender's own decision for
            /// an ambiguous attempt, with its backoff — and gets its `lease_expired` attempt
            /// row, in one transaction with the rows locked: two watchdogs never both move a
            /// row, and an outcome committed first leaves nothing to move.
            pub fn sweep_expired_leases(
                conn: &mut Conn,
                now: &Now,
                decide: &dyn Fn(&OutboxRow, DateTime<Utc>) -> LeaseDecision,
            ) -> QueryResult<LeaseSweep> {
                let at = $db_now(conn, now)?;
                let mut sweep = LeaseSweep::default();
                let mut outcomes = Vec::new();
                for row in $expired_leases(conn, at)? {
                    let d = decide(&row, at);
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
                    ))
                    .execute(conn)?;
                    if n == 1 {
                        sweep.count(d.state);
                        outcomes.push(OutcomeRecord::lease_expired(&row, &d, at));
                    }
                }
                let applied = vec![Applied::Yes; outcomes.len()];
                insert_attempts(conn, None, &outcomes, &applied)?;
                Ok(sweep)
            }

            /// Stores receipts, ignoring those whose (source, provider_event_id) exists; returns
            /// how many were new.
            pub fn insert_receipts(
                conn: &mut Conn,
                source: &str,
                receipts: &[NewReceipt],
                now: DateTime<Utc>,
            ) -> QueryResult<usize> {
                // Multi-row statements, in chunks well under every bind-parameter limit.
                let mut inserted = 0;
                for chunk in receipts.chunks(500) {
                    let rows: Vec<_> = chunk
                        .iter()
                        .map(|x| {
                            (
                                r::source.eq(source),
                                r::provider_event_id.eq(&x.provider_event_id),
                                r::event_type.eq(&x.event_type),
                                r::provider_type.eq(&x.provider_type),
                                r::event_time.eq(x.event_time),
                                r::received_at.eq(now),
                                r::herald_event_id.eq(&x.herald_event_id),
                                r::provider_message_id.eq(&x.provider_message_id),
                                r::raw.eq(&x.raw),
                                r::replay_key.eq(&x.replay_key),
                            )
                        })
                        .collect();
                    inserted += diesel::insert_into(r::table)
                        .values(rows)
                        .on_conflict_do_nothing()
                        .execute(conn)?;
                }
                Ok(inserted)
            }

            pub fn receipts_of_source(
                conn: &mut Conn,
                source: &str,
            ) -> QueryResult<Vec<ReceiptRow>> {
                r::table
                    .filter(r::source.eq(source))
                    .order(r::id)
                    .load(conn)
            }

            pub fn get_setting(conn: &mut Conn, key: &str) -> QueryResult<Option<String>> {
                s::table
                    .filter(s::key.eq(key))
                    .select(s::value)
                    .first(conn)
                    .optional()
            }

            pub fn put_setting(conn: &mut Conn, key: &str, value: &str) -> QueryResult<()> {
                diesel::insert_into(s::table)
                    .values((s::key.eq(key), s::value.eq(value)))
                    .on_conflict(s::key)
                    .do_update()
                    .set(s::value.eq(value))
                    .execute(conn)?;
                Ok(())
            }

            /// Stores `value` unless the key exists; returns the stored value either way.
            pub fn setting_or_insert(
                conn: &mut Conn,
                key: &str,
                value: &str,
            ) -> QueryResult<String> {
                diesel::insert_into(s::table)
                    .values((s::key.eq(key), s::value.eq(value)))
                    .on_conflict(s::key)
                    .do_nothing()
                    .execute(conn)?;
                s::table.filter(s::key.eq(key)).select(s::value).first(conn)
            }
        }
    };
}

backend_queries!(
    pg,
    diesel::pg::PgConnection,
    schema_pg,
    super::pg_claim_ids,
    super::pg_now,
    super::pg_expired_leases,
    super::pg_update_outcomes
);
backend_queries!(
    sqlite,
    diesel::sqlite::SqliteConnection,
    schema_sqlite,
    super::sqlite_claim_ids,
    super::sqlite_now,
    super::sqlite_expired_leases,
    self::update_outcomes_each
);

/// The PostgreSQL outcome update: the whole batch in one statement over `unnest`ed arrays, with
/// the same fence as [`sqlite::update_outcomes_each`] (one round trip instead of one per row).
/// Retries are due after their delay by the database's clock ([`pg_now!`]).
pub const PG_UPDATE_OUTCOMES_SQL: &str = concat!(
    "WITH t AS (SELECT ",
    pg_now!(),
    " AS now)
UPDATE herald_outbox AS o
SET state = v.state, attempts = v.attempts_after,
    next_attempt_at = t.now + v.delay_ms * interval '1 millisecond',
    lease_owner = NULL, lease_until = NULL, last_error_class = v.error_class,
    provider_message_id = COALESCE(v.provider_message_id, o.provider_message_id),
    request_fingerprint = COALESCE(o.request_fingerprint, v.fingerprint), updated_at = t.now
FROM t, unnest($3::bigint[], $4::int[], $5::int[], $6::text[], $7::bigint[], $8::text[], $9::text[], $10::text[])
    AS v(id, claimed, attempts_after, state, delay_ms, error_class, fingerprint, provider_message_id)
WHERE o.id = v.id AND o.state = 'sending' AND o.lease_owner = $2 AND o.attempts = v.claimed
RETURNING o.id"
);

fn pg_update_outcomes(
    conn: &mut diesel::pg::PgConnection,
    owner: &str,
    now: &Now,
    _at: DateTime<Utc>,
    outcomes: &[OutcomeRecord],
) -> diesel::QueryResult<Vec<Applied>> {
    use diesel::RunQueryDsl;
    use diesel::sql_types::{Array, Double};
    let col = |f: fn(&OutcomeRecord) -> Option<String>| outcomes.iter().map(f).collect::<Vec<_>>();
    let updated: Vec<IdRow> = diesel::sql_query(PG_UPDATE_OUTCOMES_SQL)
        .bind::<Double, _>(now.shift_micros())
        .bind::<Text, _>(owner)
        .bind::<Array<BigInt>, _>(outcomes.iter().map(|x| x.message_id).collect::<Vec<_>>())
        .bind::<Array<Integer>, _>(
            outcomes
                .iter()
                .map(|x| x.claimed_attempt)
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Integer>, _>(
            outcomes
                .iter()
                .map(|x| x.attempts_after)
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Text>, _>(outcomes.iter().map(|x| x.state.clone()).collect::<Vec<_>>())
        .bind::<Array<Nullable<BigInt>>, _>(
            outcomes
                .iter()
                .map(|x| x.retry_delay_ms)
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Nullable<Text>>, _>(col(|x| x.error_class.map(|c| c.as_str().to_owned())))
        .bind::<Array<Nullable<Text>>, _>(col(|x| x.request_fingerprint.clone()))
        .bind::<Array<Nullable<Text>>, _>(col(|x| x.provider_message_id.clone()))
        .load(conn)?;
    let done: std::collections::HashSet<i64> = updated.into_iter().map(|r| r.id).collect();
    Ok(outcomes
        .iter()
        .map(|x| {
            if done.contains(&x.message_id) {
                Applied::Yes
            } else {
                Applied::LeaseLost
            }
        })
        .collect())
}

/// Storage operations Herald itself performs, on whichever backend it runs.
impl Db {
    pub fn insert_message(&self, m: &NewOutboxRow) -> Result<Option<i64>, StorageError> {
        crate::db_run! { self, write |c, q| Ok(q::insert_message(c, m)?) }
    }

    /// The message with this event id. An id with a NUL character cannot be stored on either
    /// backend's text columns as Herald writes them: it is simply not there.
    pub fn find_by_event_id(&self, event_id: &str) -> Result<Option<OutboxRow>, StorageError> {
        if event_id.contains('\0') {
            return Ok(None);
        }
        crate::db_run! { self, read |c, q| Ok(q::find_by_event_id(c, event_id)?) }
    }

    pub fn attempts_of(
        &self,
        message_id: i64,
    ) -> Result<Vec<super::models::AttemptRow>, StorageError> {
        crate::db_run! { self, read |c, q| Ok(q::attempts_of(c, message_id)?) }
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
        crate::db_run! { self, write |c, q| {
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
        policy_version: &str,
    ) -> Result<(Vec<OutboxRow>, usize), StorageError> {
        let limit = i64::from(limit);
        crate::db_run! { self, write |c, q| Ok(q::claim(c, &now, limit, owner, lease, policy_version)?) }
    }

    pub fn record_outcomes(
        &self,
        owner: &str,
        now: Now,
        outcomes: &[OutcomeRecord],
    ) -> Result<Vec<Applied>, StorageError> {
        crate::db_run! { self, write |c, q| Ok(q::record_outcomes(c, owner, &now, outcomes)?) }
    }

    /// One watchdog pass; `decide` is the sender's decision for an expired lease.
    pub fn sweep_expired_leases(
        &self,
        now: Now,
        decide: &dyn Fn(&OutboxRow, DateTime<Utc>) -> LeaseDecision,
    ) -> Result<LeaseSweep, StorageError> {
        crate::db_run! { self, write |c, q| Ok(q::sweep_expired_leases(c, &now, decide)?) }
    }

    /// Stores (or replaces) a setting.
    pub fn put_setting(&self, key: &str, value: &str) -> Result<(), StorageError> {
        crate::db_run! { self, write |c, q| Ok(q::put_setting(c, key, value)?) }
    }

    pub fn get_setting(&self, key: &str) -> Result<Option<String>, StorageError> {
        crate::db_run! { self, read |c, q| Ok(q::get_setting(c, key)?) }
    }

    pub fn setting_or_insert(&self, key: &str, value: &str) -> Result<String, StorageError> {
        crate::db_run! { self, write |c, q| Ok(q::setting_or_insert(c, key, value)?) }
    }
}

impl Db {
    /// Inserts a prepared message unless its event id exists; returns whether it was created and
    /// the stored row, in one transaction.
    pub fn enqueue(&self, m: &NewOutboxRow) -> Result<(bool, OutboxRow), StorageError> {
        crate::db_run! { self, write |c, q| {
            let created = q::insert_message(c, m)?.is_some();
            let row = q::find_by_event_id(c, &m.event_id)?.ok_or(diesel::result::Error::NotFound)?;
            Ok((created, row))
        }}
    }
}

impl Db {
    /// Stores a request's receipts in one transaction; returns (new, duplicates). Committed
    /// when this returns: only then may the request be acknowledged.
    pub fn store_receipts(
        &self,
        source: &str,
        receipts: &[NewReceipt],
        now: DateTime<Utc>,
    ) -> Result<(usize, usize), StorageError> {
        // PostgreSQL text cannot hold NUL; a provider's free text (an SMTP diagnostic) may.
        let receipts: Vec<NewReceipt> = receipts.iter().map(NewReceipt::without_nul).collect();
        let receipts = receipts.as_slice();
        crate::db_run! { self, write |c, q| {
            let inserted = q::insert_receipts(c, source, receipts, now)?;
            Ok((inserted, receipts.len() - inserted))
        }}
    }

    pub fn receipts_of_source(&self, source: &str) -> Result<Vec<ReceiptRow>, StorageError> {
        crate::db_run! { self, read |c, q| Ok(q::receipts_of_source(c, source)?) }
    }
}
