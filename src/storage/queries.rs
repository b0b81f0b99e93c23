//! Query bodies. `backend_queries!` compiles the shared ones once per backend against that
//! backend's schema; the claim, whose SQL differs, is given per backend.

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Integer, Nullable, Text};

use super::models::{
    Applied, LeaseSweep, NewOutboxRow, NewReceipt, OutboxRow, OutcomeRecord, ReceiptRow,
};
use super::{Db, StorageError};

diesel::define_sql_function! {
    #[sql_name = "COALESCE"]
    fn coalesce_text(x: Nullable<Text>, y: Nullable<Text>) -> Nullable<Text>;
}
diesel::define_sql_function! {
    #[sql_name = "COALESCE"]
    fn coalesce_int(x: Nullable<Integer>, y: Integer) -> Integer;
}

#[derive(diesel::QueryableByName)]
struct IdRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// The PostgreSQL claim: lock due rows with SKIP LOCKED in a CTE (never `id IN (subquery)`,
/// which can lock more rows than its LIMIT), lease them, count the attempt, return their ids.
/// A due row whose `expires_at` has passed becomes `expired` in the same statement: no lease, no
/// attempt, no request.
/// The predicate and order match the partial index `herald_outbox_due` exactly; the state list is
/// literal SQL, not bound parameters, so the planner can match the index.
pub const PG_CLAIM_SQL: &str = "\
WITH due AS (
    SELECT id FROM herald_outbox
    WHERE state IN ('scheduled', 'retryable') AND next_attempt_at <= $1
    ORDER BY next_attempt_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE herald_outbox AS o
SET state = CASE WHEN o.expires_at <= $1 THEN 'expired' ELSE 'sending' END,
    attempts = CASE WHEN o.expires_at <= $1 THEN o.attempts ELSE o.attempts + 1 END,
    lease_owner = CASE WHEN o.expires_at <= $1 THEN NULL ELSE $3 END,
    lease_until = CASE WHEN o.expires_at <= $1 THEN NULL ELSE $4 END,
    next_attempt_at = CASE WHEN o.expires_at <= $1 THEN NULL ELSE o.next_attempt_at END,
    updated_at = $1
FROM due
WHERE o.id = due.id
RETURNING o.id";

/// The SQLite claim: the same predicate, order and lease in one statement; it runs inside
/// `BEGIN IMMEDIATE` behind the writer lock, which is what makes it exclusive.
pub const SQLITE_CLAIM_SQL: &str = "\
UPDATE herald_outbox
SET state = CASE WHEN expires_at <= ?1 THEN 'expired' ELSE 'sending' END,
    attempts = CASE WHEN expires_at <= ?1 THEN attempts ELSE attempts + 1 END,
    lease_owner = CASE WHEN expires_at <= ?1 THEN NULL ELSE ?3 END,
    lease_until = CASE WHEN expires_at <= ?1 THEN NULL ELSE ?4 END,
    next_attempt_at = CASE WHEN expires_at <= ?1 THEN NULL ELSE next_attempt_at END,
    updated_at = ?1
WHERE id IN (
    SELECT id FROM herald_outbox
    WHERE state IN ('scheduled', 'retryable') AND next_attempt_at <= ?1
    ORDER BY next_attempt_at, id
    LIMIT ?2
)
RETURNING id";

/// One `lease_expired` attempt row for every `sending` row whose lease ran out, written by the
/// watchdog before it moves the rows on. Placeholders: 1 now, 2 policy version, 3 default
/// max attempts (`$n` on PostgreSQL, `?n` on SQLite).
fn sweep_attempts_sql(placeholder: char) -> &'static str {
    const SQL: &str = "\
INSERT INTO herald_attempts (message_id, event_id, attempt_number, started_at, finished_at, duration_ms,
    request_fingerprint, class, error_kind, delay_reason, policy_version, lease_owner, next_state)
SELECT id, event_id, attempts, updated_at, #1, 0, request_fingerprint, 'ambiguous', 'lease_expired',
    'the lease of ' || COALESCE(lease_owner, '?') || ' expired before it recorded an outcome', #2, NULL,
    CASE WHEN semantics = 'at_most_once' THEN 'unconfirmed'
         WHEN attempts >= COALESCE(max_attempts, #3) THEN 'dead_letter'
         ELSE 'retryable' END
FROM herald_outbox
WHERE state = 'sending' AND lease_until < #1";
    static PG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static SQLITE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let cell = if placeholder == '$' { &PG } else { &SQLITE };
    cell.get_or_init(|| SQL.replace('#', &placeholder.to_string()))
}

macro_rules! backend_queries {
    ($name:ident, $conn:ty, $schema:ident, $ts:ty, $placeholder:literal, $claim_sql:expr, $update_outcomes:path) => {
        pub mod $name {
            use chrono::{DateTime, Utc};
            use diesel::prelude::*;
            use diesel::sql_types::{BigInt, Text};

            use super::{IdRow, coalesce_int, coalesce_text};
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
                        o::channel.eq(&m.channel),
                        o::destination.eq(&m.destination),
                        o::payload.eq(&m.payload),
                        o::scheduled_at.eq(m.scheduled_at),
                        o::next_attempt_at.eq(Some(m.scheduled_at)),
                        o::max_attempts.eq(m.max_attempts),
                        o::retry_policy.eq(&m.retry_policy),
                        o::semantics.eq(&m.semantics),
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
                        .filter(o::state.eq_any(["scheduled", "retryable"])),
                )
                .set((
                    o::state.eq("canceled"),
                    o::next_attempt_at.eq(None::<DateTime<Utc>>),
                    o::updated_at.eq(now),
                ))
                .execute(conn)?;
                Ok(n == 1)
            }

            /// Leases up to `limit` due rows to `owner` and returns them, with how many due rows
            /// expired instead (the claim transaction).
            pub fn claim(
                conn: &mut Conn,
                now: DateTime<Utc>,
                limit: i64,
                owner: &str,
                lease_until: DateTime<Utc>,
            ) -> QueryResult<(Vec<OutboxRow>, usize)> {
                let ids: Vec<IdRow> = diesel::sql_query($claim_sql)
                    .bind::<$ts, _>(now)
                    .bind::<BigInt, _>(limit)
                    .bind::<Text, _>(owner)
                    .bind::<$ts, _>(lease_until)
                    .load(conn)?;
                if ids.is_empty() {
                    return Ok((Vec::new(), 0));
                }
                let ids: Vec<i64> = ids.into_iter().map(|r| r.id).collect();
                let mut rows = find_by_ids(conn, &ids)?;
                rows.retain(|r| r.state == "sending");
                let expired = ids.len() - rows.len();
                Ok((rows, expired))
            }

            /// Writes a batch of outcomes: each row only if still leased to `owner` for that
            /// attempt (a fence against a lease that expired and was claimed again), and one
            /// attempt row per request made.
            pub fn record_outcomes(
                conn: &mut Conn,
                owner: &str,
                now: DateTime<Utc>,
                outcomes: &[OutcomeRecord],
            ) -> QueryResult<Vec<Applied>> {
                let applied = $update_outcomes(conn, owner, now, outcomes)?;
                insert_attempts(conn, owner, outcomes)?;
                Ok(applied)
            }

            /// The fenced outcome update, one statement per row.
            #[allow(dead_code)]
            pub fn update_outcomes_each(
                conn: &mut Conn,
                owner: &str,
                now: DateTime<Utc>,
                outcomes: &[OutcomeRecord],
            ) -> QueryResult<Vec<Applied>> {
                let mut applied = Vec::with_capacity(outcomes.len());
                for x in outcomes {
                    let n = diesel::update(
                        o::table
                            .filter(o::id.eq(x.message_id))
                            .filter(o::state.eq("sending"))
                            .filter(o::lease_owner.eq(owner))
                            .filter(o::attempts.eq(x.claimed_attempt)),
                    )
                    .set((
                        o::state.eq(&x.state),
                        o::attempts.eq(x.attempts_after),
                        o::next_attempt_at.eq(x.next_attempt_at),
                        o::lease_owner.eq(None::<String>),
                        o::lease_until.eq(None::<DateTime<Utc>>),
                        o::last_error_class.eq(&x.error_class),
                        o::provider_message_id.eq(coalesce_text(
                            x.provider_message_id.as_deref(),
                            o::provider_message_id,
                        )),
                        o::request_fingerprint.eq(coalesce_text(
                            o::request_fingerprint,
                            x.request_fingerprint.as_deref(),
                        )),
                        o::updated_at.eq(now),
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
                owner: &str,
                outcomes: &[OutcomeRecord],
            ) -> QueryResult<()> {
                let rows: Vec<_> = outcomes
                    .iter()
                    .filter_map(|x| x.attempt.as_ref().map(|t| (x, t)))
                    .map(|(x, t)| {
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
                            a::class.eq(&t.class),
                            a::retry_after.eq(&t.retry_after),
                            a::delay_ms.eq(t.delay_ms),
                            a::delay_reason.eq(&t.delay_reason),
                            a::policy_version.eq(&t.policy_version),
                            (
                                a::provider_message_id.eq(&x.provider_message_id),
                                a::response_excerpt.eq(&t.response_excerpt),
                                a::lease_owner.eq(Some(owner)),
                                a::next_state.eq(&x.state),
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

            /// The watchdog: `sending` rows whose lease ran out go back to `retryable`
            /// (`unconfirmed` under at_most_once, `dead_letter` when the budget is spent).
            pub fn sweep_expired_leases(
                conn: &mut Conn,
                now: DateTime<Utc>,
                default_max_attempts: i32,
                policy_version: &str,
            ) -> QueryResult<LeaseSweep> {
                // The attempt that never reported back gets its row in the timeline first.
                diesel::sql_query(super::sweep_attempts_sql($placeholder))
                    .bind::<$ts, _>(now)
                    .bind::<Text, _>(policy_version)
                    .bind::<diesel::sql_types::Integer, _>(default_max_attempts)
                    .execute(conn)?;
                let expired = || {
                    o::table
                        .filter(o::state.eq("sending"))
                        .filter(o::lease_until.lt(now))
                };
                let to_unconfirmed =
                    diesel::update(expired().filter(o::semantics.eq("at_most_once")))
                        .set((
                            o::state.eq("unconfirmed"),
                            o::last_error_class.eq("ambiguous"),
                            o::next_attempt_at.eq(None::<DateTime<Utc>>),
                            o::lease_owner.eq(None::<String>),
                            o::lease_until.eq(None::<DateTime<Utc>>),
                            o::updated_at.eq(now),
                        ))
                        .execute(conn)?;
                let to_dead_letter =
                    diesel::update(expired().filter(
                        o::attempts.ge(coalesce_int(o::max_attempts, default_max_attempts)),
                    ))
                    .set((
                        o::state.eq("dead_letter"),
                        o::last_error_class.eq("exhausted"),
                        o::next_attempt_at.eq(None::<DateTime<Utc>>),
                        o::lease_owner.eq(None::<String>),
                        o::lease_until.eq(None::<DateTime<Utc>>),
                        o::updated_at.eq(now),
                    ))
                    .execute(conn)?;
                let to_retryable = diesel::update(expired())
                    .set((
                        o::state.eq("retryable"),
                        o::last_error_class.eq("ambiguous"),
                        o::next_attempt_at.eq(Some(now)),
                        o::lease_owner.eq(None::<String>),
                        o::lease_until.eq(None::<DateTime<Utc>>),
                        o::updated_at.eq(now),
                    ))
                    .execute(conn)?;
                Ok(LeaseSweep {
                    to_retryable,
                    to_unconfirmed,
                    to_dead_letter,
                })
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
    diesel::sql_types::Timestamptz,
    '$',
    super::PG_CLAIM_SQL,
    super::pg_update_outcomes
);
backend_queries!(
    sqlite,
    diesel::sqlite::SqliteConnection,
    schema_sqlite,
    diesel::sql_types::TimestamptzSqlite,
    '?',
    super::SQLITE_CLAIM_SQL,
    self::update_outcomes_each
);

/// The PostgreSQL outcome update: the whole batch in one statement over `unnest`ed arrays, with
/// the same fence as [`sqlite::update_outcomes_each`] (one round trip instead of one per row).
pub const PG_UPDATE_OUTCOMES_SQL: &str = "\
UPDATE herald_outbox AS o
SET state = v.state, attempts = v.attempts_after, next_attempt_at = v.next_attempt_at,
    lease_owner = NULL, lease_until = NULL, last_error_class = v.error_class,
    provider_message_id = COALESCE(v.provider_message_id, o.provider_message_id),
    request_fingerprint = COALESCE(o.request_fingerprint, v.fingerprint), updated_at = $2
FROM unnest($3::bigint[], $4::int[], $5::int[], $6::text[], $7::timestamptz[], $8::text[], $9::text[], $10::text[])
    AS v(id, claimed, attempts_after, state, next_attempt_at, error_class, fingerprint, provider_message_id)
WHERE o.id = v.id AND o.state = 'sending' AND o.lease_owner = $1 AND o.attempts = v.claimed
RETURNING o.id";

fn pg_update_outcomes(
    conn: &mut diesel::pg::PgConnection,
    owner: &str,
    now: DateTime<Utc>,
    outcomes: &[OutcomeRecord],
) -> diesel::QueryResult<Vec<Applied>> {
    use diesel::RunQueryDsl;
    use diesel::sql_types::{Array, Timestamptz};
    let col = |f: fn(&OutcomeRecord) -> Option<String>| outcomes.iter().map(f).collect::<Vec<_>>();
    let updated: Vec<IdRow> = diesel::sql_query(PG_UPDATE_OUTCOMES_SQL)
        .bind::<Text, _>(owner)
        .bind::<Timestamptz, _>(now)
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
        .bind::<Array<Nullable<Timestamptz>>, _>(
            outcomes
                .iter()
                .map(|x| x.next_attempt_at)
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Nullable<Text>>, _>(col(|x| x.error_class.clone()))
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

    pub fn find_by_event_id(&self, event_id: &str) -> Result<Option<OutboxRow>, StorageError> {
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
        crate::db_run! { self, write |c, q| {
            let changed = q::cancel(c, event_id, now)?;
            Ok((changed, q::find_by_event_id(c, event_id)?))
        }}
    }

    /// The claim transaction: committed when this returns, before any network call.
    pub fn claim(
        &self,
        now: DateTime<Utc>,
        limit: u32,
        owner: &str,
        lease_until: DateTime<Utc>,
    ) -> Result<(Vec<OutboxRow>, usize), StorageError> {
        let limit = i64::from(limit);
        crate::db_run! { self, write |c, q| Ok(q::claim(c, now, limit, owner, lease_until)?) }
    }

    pub fn record_outcomes(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        outcomes: &[OutcomeRecord],
    ) -> Result<Vec<Applied>, StorageError> {
        crate::db_run! { self, write |c, q| Ok(q::record_outcomes(c, owner, now, outcomes)?) }
    }

    pub fn sweep_expired_leases(
        &self,
        now: DateTime<Utc>,
        default_max_attempts: u32,
        policy_version: &str,
    ) -> Result<LeaseSweep, StorageError> {
        let max = i32::try_from(default_max_attempts).unwrap_or(i32::MAX);
        crate::db_run! { self, write |c, q| Ok(q::sweep_expired_leases(c, now, max, policy_version)?) }
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
