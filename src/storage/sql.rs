//! The SQL that differs between the backends: the claim, the database's clock, the locked read
//! of expired leases and the batched outcome update. [`pg`] and [`sqlite`] give each the same
//! name, so the per-table query bodies (compiled once per backend by `per_backend!`) call
//! `sql::claim_rows(…)` and get their backend's arm.

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text};

use crate::domain::policies::Policies;

use super::models::{
    Applied, ExpiredLease, MatchedMessage, NewAttempt, NewOutboxRow, NewReceipt, Now, OutboxRow,
    OutcomeRecord, PendingReceipt, Reconciled, Unmatched,
};

diesel::define_sql_function! {
    #[sql_name = "COALESCE"]
    fn coalesce_text(x: Nullable<Text>, y: Nullable<Text>) -> Nullable<Text>;
}

#[derive(diesel::QueryableByName)]
struct IdRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// Whether something is held by another transaction (`pg_key_rows_busy`, `pg_key_lock_busy`).
#[derive(diesel::QueryableByName)]
struct BusyRow {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    busy: bool,
}

/// "Now" on PostgreSQL: the database's clock, moved by the caller's shift (`$1`, microseconds).
/// `now()` is fixed for the transaction, so the planner evaluates this once and can still use the
/// due index.
macro_rules! pg_now {
    () => {
        "(now() + $1::float8 * interval '1 microsecond')"
    };
}

/// The ordering gate of the claim, for the candidate row `c`: an unkeyed row passes at once (one
/// NULL test, nothing else); a keyed row only when it is its key's head — no earlier place of its
/// key is still open (waiting, due, in flight, or a dead or unconfirmed head that blocks, i.e. not
/// released). Written as "the first open place that counts is not before `c`", an `ORDER BY …
/// LIMIT 1` walk of `herald_outbox_ordering_open` (the predicate below is that index's) that
/// stops at the first entry that counts: for a head, itself (after any released dead heads). A
/// `NOT EXISTS` form lets PostgreSQL pick a sequential scan for a hot key (it expects to find an
/// earlier place at once, and there is none). Fails closed: no row found is no claim.
/// `key_head!()` tests the outbox row named `c`; `key_head!("t")` the one named `t`.
macro_rules! key_head {
    () => {
        key_head!("c")
    };
    ($c:literal) => {
        concat!(
            "(",
            $c,
            ".ordering_key IS NULL OR ",
            $c,
            ".ordering_seq <= (
        SELECT h.ordering_seq FROM herald_outbox AS h
        WHERE h.ordering_key = ",
            $c,
            ".ordering_key AND h.destination = ",
            $c,
            ".destination
          AND h.state IN ('scheduled', 'retryable', 'sending', 'dead_letter', 'unconfirmed')
          AND (h.state IN ('scheduled', 'retryable', 'sending') OR h.ordering_released_at IS NULL)
        ORDER BY h.ordering_seq LIMIT 1))"
        )
    };
}

/// The claim's gate for a row of `herald_outbox` read without an alias ([`key_head!`]).
pub const KEY_HEAD_OF_OUTBOX: &str = key_head!("herald_outbox");

/// The PostgreSQL claim: lock due rows with SKIP LOCKED in a CTE (never `id IN (subquery)`,
/// which can lock more rows than its LIMIT), lease them, count the attempt, return their ids.
/// The update finds its rows by `id = ANY(ARRAY(…))`, an index scan of the primary key: a join
/// with the CTE let the planner pick a hash join over a sequential scan of the whole outbox
/// (measured: 1.8 ms per claim at 10,000 rows, growing with the table).
/// A due row whose `expires_at` has passed becomes `expired` in the same statement: no lease, no
/// attempt, no request. Every time is the database's ([`pg_now!`]); the lease is `$4` µs long.
/// A row inserted by plain SQL gets the policy in force at its first claim: its endpoint's own
/// where `$6` (`{"endpoint:NAME": [name, version]}`, NULL when no endpoint has one) names its
/// destination, else the global version (`$5`) and name (`$7`: the column's default,
/// `default`, is not the global policy's name when `retry_policy_name` renames it).
/// The predicate and order match the partial index `herald_outbox_due` exactly; the state list is
/// literal SQL, not bound parameters, so the planner can match the index.
pub const PG_CLAIM_SQL: &str = concat!(
    "WITH due AS (
    SELECT id FROM herald_outbox AS c
    WHERE state IN ('scheduled', 'retryable') AND next_attempt_at <= ",
    pg_now!(),
    "
      AND ",
    key_head!(),
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
    retry_policy_version = COALESCE(o.retry_policy_version, $6 -> o.destination ->> 1, $5),
    retry_policy = CASE WHEN o.retry_policy_version IS NULL
        THEN COALESCE($6 -> o.destination ->> 0, $7) ELSE o.retry_policy END,
    message_key = COALESCE(o.message_key, CASE WHEN o.channel = 'email'
        THEN encode(substring(sha256(convert_to(o.event_id, 'UTF8')) FROM 1 FOR 16), 'hex') END),
    updated_at = t.now
FROM t
WHERE o.id = ANY(ARRAY(SELECT id FROM due))
RETURNING o.*"
);

/// The SQLite claim: the same predicate, order and lease in one statement; it runs inside
/// `BEGIN IMMEDIATE` behind the writer lock, which is what makes it exclusive. One process, so
/// its clock is the only one: `?1` now, `?4` the lease's end. Unlike PostgreSQL's, it does not
/// set the Message-ID key of an email inserted by plain SQL: SQLite rewrites an index entry for
/// every column an `UPDATE` sets, changed or not, so `message_key = COALESCE(message_key, …)`
/// rewrote the key's index entry at every claim of every email (a random page of that index
/// each). [`SQLITE_SET_MESSAGE_KEY_SQL`] sets it for the claimed emails without one.
/// The limit is written `(?2 + 0)`, not `?2`: SQLite looks at the value bound to a bare
/// parameter in `LIMIT` while it plans (`sqlite3ExprIsInteger`), which marks the statement to
/// be compiled again whenever that parameter is bound anew — at every claim (seen with a
/// `perf probe` on `sqlite3Reprepare`: once per claim). The claim's order comes from
/// `herald_outbox_due`, so the planner has nothing to gain from knowing the limit.
/// `?5`, `?6` and `?7` are PostgreSQL's `$5`, `$6` and `$7` (the map as JSON text, read with `json_each`
/// only when it is set; `retry_policy`, which the claim now also sets, is in no index).
pub const SQLITE_CLAIM_SQL: &str = concat!(
    "UPDATE herald_outbox
SET state = CASE WHEN expires_at <= ?1 THEN 'expired' ELSE 'sending' END,
    attempts = CASE WHEN expires_at <= ?1 THEN attempts ELSE attempts + 1 END,
    lease_owner = CASE WHEN expires_at <= ?1 THEN NULL ELSE ?3 END,
    lease_until = CASE WHEN expires_at <= ?1 THEN NULL ELSE ?4 END,
    next_attempt_at = CASE WHEN expires_at <= ?1 THEN NULL ELSE next_attempt_at END,
    retry_policy_version = COALESCE(retry_policy_version, CASE WHEN ?6 IS NOT NULL THEN
        (SELECT json_extract(value, '$[1]') FROM json_each(?6) WHERE key = destination) END, ?5),
    retry_policy = CASE WHEN retry_policy_version IS NULL THEN COALESCE(CASE WHEN ?6 IS NOT NULL
        THEN (SELECT json_extract(value, '$[0]') FROM json_each(?6) WHERE key = destination) END,
        ?7) ELSE retry_policy END,
    updated_at = ?1
WHERE id IN (
    SELECT id FROM herald_outbox AS c
    WHERE state IN ('scheduled', 'retryable') AND next_attempt_at <= ?1
      AND ",
    key_head!(),
    "
    ORDER BY next_attempt_at, id
    LIMIT (?2 + 0)
)
RETURNING *"
);

/// `text` with its `RETURNING` clause (`star`: `RETURNING o.*`, `RETURNING *`) listing the
/// outbox's columns instead, as this build's schema names them and in its order, each
/// `table_ref` (how the rendered list qualifies a column) replaced by `prefix`. A `*` would
/// follow the database: a column added by a newer Herald's migration during a rolling upgrade
/// would break the older processes' claims (more columns than their row type, and PostgreSQL
/// refuses a prepared statement whose result changed); named columns keep them working.
fn returning_outbox_columns<DB, T>(text: &str, star: &str, table_ref: &str, prefix: &str) -> String
where
    DB: diesel::backend::Backend + Default,
    DB::QueryBuilder: Default,
    T: diesel::Table
        + diesel::query_dsl::methods::SelectDsl<<T as diesel::Table>::AllColumns>
        + Default,
    <T as diesel::query_dsl::methods::SelectDsl<<T as diesel::Table>::AllColumns>>::Output:
        diesel::query_builder::QueryFragment<DB>,
{
    let select = T::default().select(T::all_columns());
    let rendered = diesel::debug_query::<DB, _>(&select).to_string();
    let list = rendered
        .strip_prefix("SELECT ")
        .and_then(|r| r.split(" FROM ").next())
        .map(|l| l.replace(table_ref, prefix));
    match (text.rsplit_once(star), list) {
        (Some((head, tail)), Some(list)) => format!("{head}RETURNING {list}{tail}"),
        _ => text.to_owned(),
    }
}

/// Run first in the hot transactions — the claim, the outcome batch, the reconciler's pass, the
/// lease watchdog's pass — so that their statements walk their indexes whatever the statistics
/// say (one round trip; the settings end with the transaction). Those statements stay prepared on each connection,
/// and PostgreSQL keeps a generic plan until the table is analyzed. A Herald that ran them on
/// an empty or small table (a fresh install; a quiet outbox kept small by retention and
/// analyzed while small) cached plans made for a tiny table, and a burst of rows then got, until autovacuum's next analyze, a sequential scan
/// of the whole table per statement — measured by hand at 200,000 rows: 84 ms per claim of 100,
/// 24 ms per outcome batch — or, for the claim, a bitmap scan of every due row plus a sort
/// (8–12 ms per claim at 20,000 rows in `dispatch_pg`).
/// Test: `concurrency::hot_statements_keep_to_their_indexes_after_an_empty_outbox`.
///
/// JIT goes off with them: a statement with no index to walk (the insert trigger's look at
/// `herald_listeners`, run by every insert into the outbox: the reconciler's status webhooks,
/// the group enqueue) is then costed at the disable cost (10¹⁰), far above `jit_above_cost`,
/// and PostgreSQL JIT-compiled it: 20–60 ms a statement, measured (`EXPLAIN ANALYZE`: "JIT …
/// Inlining 46 ms"). Test: `concurrency::hot_transactions_never_jit_compile`.
pub fn pg_keep_to_indexes(conn: &mut diesel::pg::PgConnection) -> diesel::QueryResult<()> {
    diesel::connection::SimpleConnection::batch_execute(
        conn,
        "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL jit = off",
    )
}

/// [`pg_keep_to_indexes`], and a lock another transaction holds waited for at most
/// `lock_timeout` (one round trip): a group of messages' settings. Lifted before the commit
/// ([`pg_wait_for_locks`]).
pub fn pg_group_settings(
    conn: &mut diesel::pg::PgConnection,
    lock_timeout: std::time::Duration,
) -> diesel::QueryResult<()> {
    diesel::connection::SimpleConnection::batch_execute(
        conn,
        &format!(
            "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL jit = \
             off; SET LOCAL lock_timeout = {}",
            lock_timeout.as_millis().max(1)
        ),
    )
}

/// Lock waits without a bound again, for the rest of the transaction: its `COMMIT` waits for
/// the lock PostgreSQL takes to queue its notifications behind every other committing
/// notifier's (held through their WAL flushes, a synchronous standby's answer), which a group's
/// short `lock_timeout` would have turned into a failed group (a review).
pub fn pg_wait_for_locks(conn: &mut diesel::pg::PgConnection) -> diesel::QueryResult<()> {
    diesel::connection::SimpleConnection::batch_execute(conn, "SET LOCAL lock_timeout = 0")
}

/// SQLite: Herald never runs `ANALYZE` there, so its planner has no statistics to go stale and
/// plans a statement the same whatever the table's size: nothing to set.
pub fn sqlite_keep_to_indexes(
    _conn: &mut diesel::sqlite::SqliteConnection,
) -> diesel::QueryResult<()> {
    Ok(())
}

/// The rows the claim changed, as they now are (`RETURNING` the outbox's columns: no second
/// `SELECT`), in claim order.
pub fn pg_claim_rows(
    conn: &mut diesel::pg::PgConnection,
    now: &Now,
    limit: i64,
    owner: &str,
    lease: std::time::Duration,
    policies: &Policies,
) -> diesel::QueryResult<Vec<OutboxRow>> {
    use super::schema_pg::herald_outbox as o;
    use diesel::RunQueryDsl;
    use diesel::sql_types::Double;
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        returning_outbox_columns::<diesel::pg::Pg, o::table>(
            PG_CLAIM_SQL,
            "RETURNING o.*",
            "\"herald_outbox\".",
            "o.",
        )
    });
    let mut rows: Vec<OutboxRow> = super::prepared::cached(sql)
        .bind::<Double, _>(now.shift_micros())
        .bind::<BigInt, _>(limit)
        .bind::<Text, _>(owner)
        .bind::<Double, _>(lease.as_micros() as f64)
        .bind::<Text, _>(&policies.global().version)
        .bind::<Nullable<diesel::sql_types::Jsonb>, _>(policies.claim_map())
        .bind::<Text, _>(&policies.global().name)
        .typed::<diesel::dsl::SqlTypeOf<<o::table as diesel::Table>::AllColumns>>()
        .load(conn)?;
    rows.sort_by_key(claim_order);
    Ok(rows)
}

/// The order rows were claimed in (the due index's): `RETURNING` does not keep it. Expired
/// rows (no `next_attempt_at` any more) are not sent and may come anywhere.
fn claim_order(r: &OutboxRow) -> (Option<DateTime<Utc>>, i64) {
    (r.next_attempt_at, r.id)
}

pub fn sqlite_claim_rows(
    conn: &mut diesel::sqlite::SqliteConnection,
    now: &Now,
    limit: i64,
    owner: &str,
    lease: std::time::Duration,
    policies: &Policies,
) -> diesel::QueryResult<Vec<OutboxRow>> {
    use super::schema_sqlite::herald_outbox as o;
    use crate::storage::sqlite_time::SqliteTime;
    use diesel::prelude::*;
    let lease_until = now.local + chrono::Duration::from_std(lease).unwrap_or_default();
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        returning_outbox_columns::<diesel::sqlite::Sqlite, o::table>(
            SQLITE_CLAIM_SQL,
            "RETURNING *",
            "`herald_outbox`.",
            "",
        )
    });
    let mut rows: Vec<OutboxRow> = super::prepared::cached(sql)
        .bind::<SqliteTime, _>(now.local)
        .bind::<BigInt, _>(limit)
        .bind::<Text, _>(owner)
        .bind::<SqliteTime, _>(lease_until)
        .bind::<Text, _>(&policies.global().version)
        .bind::<Nullable<Text>, _>(policies.claim_map().map(|m| m.to_string()))
        .bind::<Text, _>(&policies.global().name)
        .typed::<diesel::dsl::SqlTypeOf<<o::table as diesel::Table>::AllColumns>>()
        .load(conn)?;
    for row in rows
        .iter_mut()
        .filter(|r| r.channel == crate::domain::Channel::Email && r.message_key.is_none())
    {
        let key = crate::domain::email_message_key(&row.event_id);
        super::prepared::cached_const!(SQLITE_SET_MESSAGE_KEY_SQL)
            .bind::<Text, _>(&key)
            .bind::<BigInt, _>(row.id)
            .execute(conn)?;
        row.message_key = Some(key);
    }
    rows.sort_by_key(claim_order);
    Ok(rows)
}

/// The Message-ID key of a claimed email inserted by plain SQL (its first claim), set only where
/// there is none, in the claim's transaction.
pub const SQLITE_SET_MESSAGE_KEY_SQL: &str =
    "UPDATE herald_outbox SET message_key = ?1 WHERE id = ?2 AND message_key IS NULL";

#[derive(diesel::QueryableByName)]
struct PgTime {
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    now: DateTime<Utc>,
}

/// Within a transaction: PostgreSQL cancels each of its further statements that runs longer
/// than `limit`, waiting for a lock included (a scrape behind a lock on the outbox gives up
/// rather than keep its connection for as long as the lock is held).
pub fn pg_limit_statements(
    conn: &mut diesel::pg::PgConnection,
    limit: std::time::Duration,
) -> diesel::QueryResult<()> {
    use diesel::RunQueryDsl;
    diesel::sql_query(format!(
        "SET LOCAL statement_timeout = {}",
        limit.as_millis().max(1)
    ))
    .execute(conn)
    .map(drop)
}

/// SQLite's readers wait for no writer's lock: nothing to limit.
pub fn sqlite_limit_statements(
    _conn: &mut diesel::sqlite::SqliteConnection,
    _limit: std::time::Duration,
) -> diesel::QueryResult<()> {
    Ok(())
}

/// The database's "now" (moved by the shift), for statements built with the query builder.
pub fn pg_now(
    conn: &mut diesel::pg::PgConnection,
    now: &Now,
) -> diesel::QueryResult<DateTime<Utc>> {
    use diesel::RunQueryDsl;
    let t: PgTime = super::prepared::cached_const!(concat!("SELECT ", pg_now!(), " AS now"))
        .bind::<diesel::sql_types::Double, _>(now.shift_micros())
        .get_result(conn)?;
    Ok(t.now)
}

pub fn sqlite_now(
    _conn: &mut diesel::sqlite::SqliteConnection,
    now: &Now,
) -> diesel::QueryResult<DateTime<Utc>> {
    Ok(now.local)
}

/// The columns of [`ExpiredLease`], in its field order.
macro_rules! expired_lease_columns {
    ($o:ident) => {
        (
            $o::id,
            $o::event_id,
            $o::attempts,
            $o::attempt_base,
            $o::max_attempts,
            $o::semantics,
            $o::lease_owner,
            $o::request_fingerprint,
            $o::updated_at,
            $o::destination,
            $o::ordering_key,
            $o::ordering_policy,
            $o::expires_at,
            $o::channel,
            $o::payload,
        )
    };
}

/// How many expired leases one watchdog pass handles at most (the next pass takes the rest).
const SWEEP_BATCH: i64 = 500;

/// The watchdog's read: `sending` rows whose lease ran out by `at`, with `$lock` (the row locks
/// on PostgreSQL; nothing on SQLite, whose sweep runs behind the writer lock already).
macro_rules! expired_leases {
    ($conn:expr, $schema:ident, $at:expr $(, $lock:ident)*) => {{
        use super::$schema::herald_outbox as o;
        use diesel::prelude::*;
        // The state as literal SQL, not a bound parameter. Bound (`state = $1`), the statement
        // was cached, and a generic plan cannot use the partial index `herald_outbox_leased`
        // (its predicate must be provable from the query's text): the plan cached on an empty
        // outbox scanned and sorted the whole table. diesel never caches a statement holding
        // literal SQL, so this one is planned afresh, for its index, at every pass.
        o::table
            .filter(diesel::dsl::sql::<diesel::sql_types::Bool>("state = 'sending'"))
            .filter(o::lease_until.lt($at))
            .select(expired_lease_columns!(o))
            .order(o::id)
            .limit(SWEEP_BATCH)
            $(.$lock())*
            .load($conn)
    }};
}

/// Expired leases, locked: a second watchdog skips them, and an outcome arriving meanwhile waits
/// for the sweep to commit and then fails its fence.
pub fn pg_expired_leases(
    conn: &mut diesel::pg::PgConnection,
    at: DateTime<Utc>,
) -> diesel::QueryResult<Vec<ExpiredLease>> {
    expired_leases!(conn, schema_pg, at, for_update, skip_locked)
}

/// SQLite: the sweep runs in `BEGIN IMMEDIATE` behind the writer lock, exclusive already.
pub fn sqlite_expired_leases(
    conn: &mut diesel::sqlite::SqliteConnection,
    at: DateTime<Utc>,
) -> diesel::QueryResult<Vec<ExpiredLease>> {
    expired_leases!(conn, schema_sqlite, at)
}

/// The SQLite outcome update of one row, with the fence: applied only while the row is still
/// `sending`, leased to this owner, at the attempt that was claimed. `$more`: further columns
/// to set.
macro_rules! sqlite_update_outcome {
    ($more:literal) => {
        concat!(
            "UPDATE herald_outbox
SET state = ?1, attempts = ?2, next_attempt_at = ?3, lease_owner = NULL, lease_until = NULL,
    last_error_class = ?4, provider_message_id = COALESCE(?5, provider_message_id),
    updated_at = ?6",
            $more,
            "
WHERE id = ?7 AND state = 'sending' AND lease_owner = ?8 AND attempts = ?9"
        )
    };
}

/// The outcome update of a row that has its request fingerprint (the API's rows, from their
/// insert): the column is not named, see [`SQLITE_UPDATE_OUTCOME_FINGERPRINT_SQL`].
pub const SQLITE_UPDATE_OUTCOME_SQL: &str = sqlite_update_outcome!("");

/// The outcome update of a row claimed without its request fingerprint (inserted by plain SQL):
/// its first outcome sets it, `?10`. Two statements, chosen per row, because SQLite rewrites
/// the index entry of every column an `UPDATE` sets, changed or not (see [`SQLITE_CLAIM_SQL`]):
/// naming the column in every outcome update rewrote the random-keyed `herald_outbox_fingerprint`
/// entry of every API row at every outcome, and a separate `UPDATE` for the rows without one
/// rewrote the whole row a second time (3 % of Herald's CPU in `herald-bench email_smtp`, inside
/// the writer lock).
pub const SQLITE_UPDATE_OUTCOME_FINGERPRINT_SQL: &str =
    sqlite_update_outcome!(", request_fingerprint = COALESCE(request_fingerprint, ?10)");

/// The PostgreSQL outcome update: the whole batch in one statement over `unnest`ed arrays, with
/// the same fence as [`sqlite::update_outcomes`] (one round trip instead of one per row).
/// Each row is found by a primary-key probe per outcome (a nested loop over the `unnest`ed
/// arrays: `o.id = v.id` is the only join condition). An extra `o.id = ANY($3)` made the planner
/// scan the primary key for the whole array once per outcome and filter (quadratic: 9,900 rows
/// joined and thrown away per batch of 100, 2.9 of its 5.8 ms, and the largest single cost of the
/// database in `dispatch_pg`'s profile). The fence on the state is written
/// `(o.state || '') = 'sending'` on purpose: as a plain `o.state = 'sending'` it let the planner
/// walk the partial index `herald_outbox_leased`, whose dead entries (every message passes
/// through `sending`) pile up until vacuum — 5 ms per batch at 10,000 messages, 10 ms at 20,000.
/// The expression matches no index predicate, so only the primary key is used.
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
WHERE o.id = v.id AND (o.state || '') = 'sending'
  AND o.lease_owner = $2 AND o.attempts = v.claimed
RETURNING o.id"
);

pub fn pg_update_outcomes(
    conn: &mut diesel::pg::PgConnection,
    owner: &str,
    now: &Now,
    _at: DateTime<Utc>,
    outcomes: &[OutcomeRecord],
) -> diesel::QueryResult<Vec<Applied>> {
    use diesel::RunQueryDsl;
    use diesel::sql_types::{Array, Double};
    let col = |f: fn(&OutcomeRecord) -> Option<String>| outcomes.iter().map(f).collect::<Vec<_>>();
    let updated: Vec<IdRow> = super::prepared::cached_const!(PG_UPDATE_OUTCOMES_SQL)
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
        .bind::<Array<Text>, _>(outcomes.iter().map(|x| x.state).collect::<Vec<_>>())
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

/// One bind array of a batched (`unnest`) statement: `f` of every row, in row order.
fn column<'a, T, U>(rows: &'a [T], f: impl Fn(&'a T) -> U) -> Vec<U> {
    rows.iter().map(f).collect()
}

/// The start of both backends' attempt-row inserts, the columns in bind order.
macro_rules! insert_attempts_into {
    () => {
        "INSERT INTO herald_attempts (message_id, event_id, attempt_number, started_at, \
         finished_at, duration_ms, request_fingerprint, response_status, error_kind, class, \
         retry_after, delay_ms, delay_reason, policy_version, provider_message_id, \
         response_excerpt, lease_owner, next_state)\n"
    };
}

/// The outcomes that made a request, with their attempt and how their write applied: one
/// attempt row each.
fn attempts_made<'a>(
    outcomes: &'a [OutcomeRecord],
    applied: &'a [Applied],
) -> impl Iterator<Item = (&'a OutcomeRecord, &'a NewAttempt, &'a Applied)> {
    outcomes
        .iter()
        .zip(applied)
        .filter_map(|(x, a)| x.attempt.as_ref().map(|t| (x, t, a)))
}

/// The attempt rows of a batch in one statement whose text does not depend on the row count
/// (one array per column, `unnest`ed), so it stays prepared; duplicates of
/// `herald_attempts_once` are skipped as the query-builder insert does.
pub const PG_INSERT_ATTEMPTS_SQL: &str = concat!(
    insert_attempts_into!(),
    "SELECT v.message_id, v.event_id, v.attempt_number, v.started_at, v.finished_at, v.duration_ms,
    v.request_fingerprint, v.response_status, v.error_kind, v.class, v.retry_after, v.delay_ms,
    v.delay_reason, v.policy_version, v.provider_message_id, v.response_excerpt, $1, v.next_state
FROM unnest($2::bigint[], $3::text[], $4::int[], $5::timestamptz[], $6::timestamptz[],
    $7::bigint[], $8::text[], $9::int[], $10::text[], $11::text[], $12::text[], $13::bigint[],
    $14::text[], $15::text[], $16::text[], $17::text[], $18::text[])
    AS v(message_id, event_id, attempt_number, started_at, finished_at, duration_ms,
         request_fingerprint, response_status, error_kind, class, retry_after, delay_ms,
         delay_reason, policy_version, provider_message_id, response_excerpt, next_state)
ON CONFLICT DO NOTHING"
);

pub fn pg_insert_attempts(
    conn: &mut diesel::pg::PgConnection,
    owner: Option<&str>,
    outcomes: &[OutcomeRecord],
    applied: &[Applied],
) -> diesel::QueryResult<()> {
    use diesel::RunQueryDsl;
    use diesel::sql_types::{Array, Timestamptz};
    let made: Vec<_> = attempts_made(outcomes, applied).collect();
    if made.is_empty() {
        return Ok(());
    }
    super::prepared::cached_const!(PG_INSERT_ATTEMPTS_SQL)
        .bind::<Nullable<Text>, _>(owner)
        .bind::<Array<BigInt>, _>(column(&made, |(x, _, _)| x.message_id))
        .bind::<Array<Text>, _>(column(&made, |(x, _, _)| x.event_id.as_str()))
        .bind::<Array<Integer>, _>(column(&made, |(x, _, _)| x.claimed_attempt))
        .bind::<Array<Timestamptz>, _>(column(&made, |(_, t, _)| t.started_at))
        .bind::<Array<Timestamptz>, _>(column(&made, |(_, t, _)| t.finished_at))
        .bind::<Array<BigInt>, _>(column(&made, |(_, t, _)| t.duration_ms))
        .bind::<Array<Nullable<Text>>, _>(column(&made, |(x, _, _)| {
            x.request_fingerprint.as_deref()
        }))
        .bind::<Array<Nullable<Integer>>, _>(column(&made, |(_, t, _)| t.response_status))
        .bind::<Array<Nullable<Text>>, _>(column(&made, |(_, t, _)| t.error_kind.as_deref()))
        .bind::<Array<Text>, _>(column(&made, |(_, t, _)| t.class.as_str()))
        .bind::<Array<Nullable<Text>>, _>(column(&made, |(_, t, _)| t.retry_after.as_deref()))
        .bind::<Array<Nullable<BigInt>>, _>(column(&made, |(_, t, _)| t.delay_ms))
        .bind::<Array<Nullable<Text>>, _>(column(&made, |(_, t, _)| t.delay_reason.as_deref()))
        .bind::<Array<Text>, _>(column(&made, |(_, t, _)| t.policy_version.as_str()))
        .bind::<Array<Nullable<Text>>, _>(column(&made, |(x, _, _)| {
            x.provider_message_id.as_deref()
        }))
        .bind::<Array<Nullable<Text>>, _>(column(&made, |(_, t, _)| t.response_excerpt.as_deref()))
        .bind::<Array<Text>, _>(column(&made, |(x, _, a)| a.next_state(x.state)))
        .execute(conn)?;
    Ok(())
}

/// The key of a receipt a receipt insert stored (`RETURNING source, provider_event_id`).
#[derive(diesel::QueryableByName)]
struct ReceiptKey {
    #[diesel(sql_type = Text)]
    source: String,
    #[diesel(sql_type = Text)]
    provider_event_id: String,
}

/// Receipts of a group in one statement whose text does not depend on the row count, so it
/// stays prepared: rows in the order given (key order, see `insert_receipts`), those whose key
/// exists skipped; returns the `(source, provider_event_id)` of the new ones.
pub const PG_INSERT_RECEIPTS_SQL: &str = "INSERT INTO herald_receipts (source, provider_event_id, \
    event_type, provider_type, event_time, received_at, herald_event_id, provider_message_id, raw, \
    replay_key)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[],
    $6::timestamptz[], $7::text[], $8::text[], $9::jsonb[], $10::text[])
ON CONFLICT DO NOTHING
RETURNING source, provider_event_id";

pub fn pg_insert_receipts_returning(
    conn: &mut diesel::pg::PgConnection,
    rows: &[(&str, &NewReceipt, DateTime<Utc>)],
) -> diesel::QueryResult<Vec<(String, String)>> {
    use diesel::RunQueryDsl;
    use diesel::sql_types::{Array, Jsonb, Timestamptz};
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let new: Vec<ReceiptKey> = super::prepared::cached_const!(PG_INSERT_RECEIPTS_SQL)
        .bind::<Array<Text>, _>(column(rows, |r| r.0))
        .bind::<Array<Text>, _>(column(rows, |r| r.1.provider_event_id.as_str()))
        .bind::<Array<Text>, _>(column(rows, |r| r.1.event_type.as_str()))
        .bind::<Array<Text>, _>(column(rows, |r| r.1.provider_type.as_str()))
        .bind::<Array<Nullable<Timestamptz>>, _>(column(rows, |r| r.1.event_time))
        .bind::<Array<Timestamptz>, _>(column(rows, |r| r.2))
        .bind::<Array<Nullable<Text>>, _>(column(rows, |r| r.1.herald_event_id.as_deref()))
        .bind::<Array<Nullable<Text>>, _>(column(rows, |r| r.1.provider_message_id.as_deref()))
        .bind::<Array<Jsonb>, _>(column(rows, |r| &r.1.raw))
        .bind::<Array<Nullable<Text>>, _>(column(rows, |r| r.1.replay_key.as_deref()))
        .load(conn)?;
    Ok(new
        .into_iter()
        .map(|k| (k.source, k.provider_event_id))
        .collect())
}

/// PostgreSQL: the group enqueue's plain messages in one kept-prepared `unnest` insert, in the
/// order given (a multi-row `VALUES` changes its text with the row count: parsed and planned
/// again for every group, 0.27 ms a group of about 10). The columns are those of the single
/// insert (`outbox::insert_message`); a `scheduled_at` not given is `now()`, as the column's
/// default, and a `next_attempt_at` left NULL is filled in from it by the insert trigger, as
/// for one message. Rows go in in the order given (`WITH ORDINALITY`: ids, and which of two
/// rows with one event id is stored, follow it). Ids already there are skipped; the stored rows
/// come back. Test: `group_commit::the_group_insert_stores_what_a_single_insert_stores`.
pub const PG_INSERT_MESSAGES_SQL: &str = "INSERT INTO herald_outbox (event_id, channel, \
    destination, payload, scheduled_at, next_attempt_at, max_attempts, retry_policy, \
    retry_policy_version, message_key, semantics, expires_at, request_fingerprint, enqueued_by, \
    ordering_key, ordering_policy, created_at, updated_at)
SELECT e, c, d, p, COALESCE(s, now()), s, m, rp, rv, mk, se, ex, f, eb, ok, op, t, t
FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::timestamptz[], $6::int4[],
    $7::text[], $8::text[], $9::text[], $10::text[], $11::timestamptz[], $12::text[],
    $13::text[], $14::text[], $15::text[], $16::timestamptz[])
    WITH ORDINALITY AS u(e, c, d, p, s, m, rp, rv, mk, se, ex, f, eb, ok, op, t, n)
ORDER BY n
ON CONFLICT (event_id) DO NOTHING
RETURNING *";

/// Inserts `rows` (see [`PG_INSERT_MESSAGES_SQL`]); the rows it stored.
pub fn pg_insert_messages(
    conn: &mut diesel::pg::PgConnection,
    rows: &[&NewOutboxRow],
) -> diesel::QueryResult<Vec<OutboxRow>> {
    use super::schema_pg::herald_outbox as o;
    use diesel::RunQueryDsl;
    use diesel::sql_types::{Array, Jsonb, Timestamptz};
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        returning_outbox_columns::<diesel::pg::Pg, o::table>(
            PG_INSERT_MESSAGES_SQL,
            "RETURNING *",
            "\"herald_outbox\".",
            "",
        )
    });
    super::prepared::cached(sql)
        .bind::<Array<Text>, _>(column(rows, |m| m.event_id.as_str()))
        .bind::<Array<Text>, _>(column(rows, |m| m.channel.as_str()))
        .bind::<Array<Text>, _>(column(rows, |m| m.destination.as_str()))
        .bind::<Array<Jsonb>, _>(column(rows, |m| &m.payload))
        .bind::<Array<Nullable<Timestamptz>>, _>(column(rows, |m| pg_scheduled_at(m)))
        .bind::<Array<Nullable<Integer>>, _>(column(rows, |m| m.max_attempts))
        .bind::<Array<Text>, _>(column(rows, |m| m.retry_policy.as_str()))
        .bind::<Array<Nullable<Text>>, _>(column(rows, |m| m.retry_policy_version.as_deref()))
        .bind::<Array<Nullable<Text>>, _>(column(rows, |m| m.message_key.as_deref()))
        .bind::<Array<Text>, _>(column(rows, |m| m.semantics.as_str()))
        .bind::<Array<Nullable<Timestamptz>>, _>(column(rows, |m| m.expires_at))
        .bind::<Array<Nullable<Text>>, _>(column(rows, |m| m.request_fingerprint.as_deref()))
        .bind::<Array<Nullable<Text>>, _>(column(rows, |m| m.enqueued_by.as_deref()))
        .bind::<Array<Nullable<Text>>, _>(column(rows, |m| m.ordering_key.as_deref()))
        .bind::<Array<Nullable<Text>>, _>(column(rows, |m| m.ordering_policy.map(|p| p.as_str())))
        .bind::<Array<Timestamptz>, _>(column(rows, |m| m.now))
        .typed::<diesel::dsl::SqlTypeOf<<o::table as diesel::Table>::AllColumns>>()
        .load(conn)
}

/// SQLite: one attempt row, duplicates of `herald_attempts_once` skipped as on PostgreSQL.
pub const SQLITE_INSERT_ATTEMPT_SQL: &str = concat!(
    insert_attempts_into!(),
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)
ON CONFLICT DO NOTHING"
);

/// SQLite: the attempt rows, one kept-prepared insert each (in-process, so a statement per row
/// costs no round trip; a multi-row insert's text varies with its row count, so diesel compiled
/// it again for every batch).
pub fn sqlite_insert_attempts(
    conn: &mut diesel::sqlite::SqliteConnection,
    owner: Option<&str>,
    outcomes: &[OutcomeRecord],
    applied: &[Applied],
) -> diesel::QueryResult<()> {
    use crate::storage::sqlite_time::SqliteTime;
    use diesel::RunQueryDsl;
    for (x, t, applied) in attempts_made(outcomes, applied) {
        super::prepared::cached_const!(SQLITE_INSERT_ATTEMPT_SQL)
            .bind::<BigInt, _>(x.message_id)
            .bind::<Text, _>(x.event_id.as_str())
            .bind::<Integer, _>(x.claimed_attempt)
            .bind::<SqliteTime, _>(t.started_at)
            .bind::<SqliteTime, _>(t.finished_at)
            .bind::<BigInt, _>(t.duration_ms)
            .bind::<Nullable<Text>, _>(x.request_fingerprint.as_deref())
            .bind::<Nullable<Integer>, _>(t.response_status)
            .bind::<Nullable<Text>, _>(t.error_kind.as_deref())
            .bind::<Text, _>(t.class.as_str())
            .bind::<Nullable<Text>, _>(t.retry_after.as_deref())
            .bind::<Nullable<BigInt>, _>(t.delay_ms)
            .bind::<Nullable<Text>, _>(t.delay_reason.as_deref())
            .bind::<Text, _>(t.policy_version.as_str())
            .bind::<Nullable<Text>, _>(x.provider_message_id.as_deref())
            .bind::<Nullable<Text>, _>(t.response_excerpt.as_deref())
            .bind::<Nullable<Text>, _>(owner)
            .bind::<Text, _>(applied.next_state(x.state))
            .execute(conn)?;
    }
    Ok(())
}

/// SQLite: one receipt, skipped when its key exists; returns its key when it was new.
pub const SQLITE_INSERT_RECEIPT_SQL: &str = "INSERT INTO herald_receipts (source, \
    provider_event_id, event_type, provider_type, event_time, received_at, herald_event_id, \
    provider_message_id, raw, replay_key)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
ON CONFLICT DO NOTHING
RETURNING source, provider_event_id";

/// SQLite: the receipts, one kept-prepared insert each, in the order given (in-process, so a
/// statement per row costs no round trip; the query builder's multi-row insert was compiled
/// again for every group, its text varying with the row count).
pub fn sqlite_insert_receipts_returning(
    conn: &mut diesel::sqlite::SqliteConnection,
    rows: &[(&str, &NewReceipt, DateTime<Utc>)],
) -> diesel::QueryResult<Vec<(String, String)>> {
    use crate::storage::sqlite_time::SqliteTime;
    use diesel::RunQueryDsl;
    use diesel::sql_types::Json;
    let mut new = Vec::new();
    for (source, x, now) in rows {
        let key: Vec<ReceiptKey> = super::prepared::cached_const!(SQLITE_INSERT_RECEIPT_SQL)
            .bind::<Text, _>(*source)
            .bind::<Text, _>(x.provider_event_id.as_str())
            .bind::<Text, _>(x.event_type.as_str())
            .bind::<Text, _>(x.provider_type.as_str())
            .bind::<Nullable<SqliteTime>, _>(x.event_time)
            .bind::<SqliteTime, _>(*now)
            .bind::<Nullable<Text>, _>(x.herald_event_id.as_deref())
            .bind::<Nullable<Text>, _>(x.provider_message_id.as_deref())
            .bind::<Json, _>(&x.raw)
            .bind::<Nullable<Text>, _>(x.replay_key.as_deref())
            .load(conn)?;
        new.extend(key.into_iter().map(|k| (k.source, k.provider_event_id)));
    }
    Ok(new)
}

/// The reconciler's read: the receipts of `herald_receipt_queue` that are due — new ones at
/// their arrival, unmatched ones at their next try — oldest due first (index
/// `herald_receipt_queue_due`: it never walks past a receipt that is not due), each with its
/// receipt's columns (a primary-key probe) and its tries so far. `{lock}` is the lock clause:
/// on PostgreSQL the queue rows are locked and another reconciler skips them; SQLite's pass runs
/// behind the writer lock.
macro_rules! pending_receipts_sql {
    ($at:literal, $limit:literal, $lock:literal) => {
        concat!(
            "SELECT r.id, r.source, r.provider_event_id, r.event_type, r.provider_type, \
             r.event_time, r.received_at, r.herald_event_id, r.provider_message_id, q.tries
FROM herald_receipt_queue AS q JOIN herald_receipts AS r ON r.id = q.receipt_id
WHERE q.due_at <= ",
            $at,
            "
ORDER BY q.due_at, q.receipt_id
LIMIT ",
            $limit,
            $lock
        )
    };
}

pub const PG_PENDING_RECEIPTS_SQL: &str =
    pending_receipts_sql!("$1", "$2", "\nFOR UPDATE OF q SKIP LOCKED");
/// The limit as `(?2 + 0)`: see [`SQLITE_CLAIM_SQL`].
pub const SQLITE_PENDING_RECEIPTS_SQL: &str = pending_receipts_sql!("?1", "(?2 + 0)", "");

/// The body of both backends' pending read: `$sql` with `at` and `limit` bound, the rows typed
/// with `$time` (each backend's timestamp type).
macro_rules! load_pending_receipts {
    ($conn:expr, $sql:expr, $time:ty, $at:expr, $limit:expr) => {{
        use diesel::RunQueryDsl;
        super::prepared::cached_const!($sql)
            .bind::<$time, _>($at)
            .bind::<BigInt, _>($limit)
            .typed::<(
                BigInt,
                Text,
                Text,
                Text,
                Text,
                Nullable<$time>,
                $time,
                Nullable<Text>,
                Nullable<Text>,
                Integer,
            )>()
            .load($conn)
    }};
}

/// Pending receipts that are due, their queue rows locked; another reconciler skips them.
pub fn pg_pending_receipts(
    conn: &mut diesel::pg::PgConnection,
    at: DateTime<Utc>,
    limit: i64,
) -> diesel::QueryResult<Vec<PendingReceipt>> {
    load_pending_receipts!(
        conn,
        PG_PENDING_RECEIPTS_SQL,
        diesel::sql_types::Timestamptz,
        at,
        limit
    )
}

/// SQLite: the pass runs behind the writer lock, exclusive already.
pub fn sqlite_pending_receipts(
    conn: &mut diesel::sqlite::SqliteConnection,
    at: DateTime<Utc>,
    limit: i64,
) -> diesel::QueryResult<Vec<PendingReceipt>> {
    load_pending_receipts!(
        conn,
        SQLITE_PENDING_RECEIPTS_SQL,
        crate::storage::sqlite_time::SqliteTime,
        at,
        limit
    )
}

/// Marks a pass's applied receipts reconciled and takes them off the queue: one statement for
/// the whole pass.
pub fn pg_mark_reconciled(
    conn: &mut diesel::pg::PgConnection,
    at: DateTime<Utc>,
    done: &[Reconciled],
) -> diesel::QueryResult<()> {
    use diesel::RunQueryDsl;
    use diesel::sql_types::{Array, Timestamptz};
    if done.is_empty() {
        return Ok(());
    }
    super::prepared::cached_const!(
        "WITH dequeued AS (DELETE FROM herald_receipt_queue WHERE receipt_id = ANY($2::bigint[])) \
         UPDATE herald_receipts AS r SET reconciled_at = $1, message_id = v.message_id, \
         outcome = v.outcome, outcome_reason = v.reason \
         FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::text[]) \
             AS v(id, message_id, outcome, reason) \
         WHERE r.id = v.id",
    )
    .bind::<Timestamptz, _>(at)
    .bind::<Array<BigInt>, _>(done.iter().map(|d| d.receipt_id).collect::<Vec<_>>())
    .bind::<Array<BigInt>, _>(done.iter().map(|d| d.message_id).collect::<Vec<_>>())
    .bind::<Array<Text>, _>(done.iter().map(|d| d.outcome).collect::<Vec<_>>())
    .bind::<Array<Text>, _>(done.iter().map(|d| d.reason.as_str()).collect::<Vec<_>>())
    .execute(conn)?;
    Ok(())
}

/// The pass's unmatched receipts, in one statement: those still tried wait in the queue for
/// their next try (only the queue row is written); those whose day is over leave it, and their
/// receipt says `unmatched` from then on, with how often it was tried.
pub fn pg_mark_unmatched(
    conn: &mut diesel::pg::PgConnection,
    unmatched: &[Unmatched],
) -> diesel::QueryResult<()> {
    use diesel::RunQueryDsl;
    use diesel::sql_types::{Array, Timestamptz};
    if unmatched.is_empty() {
        return Ok(());
    }
    super::prepared::cached_const!(
        "WITH v AS (SELECT * FROM unnest($1::bigint[], $2::int[], $3::timestamptz[], $4::text[]) \
             AS v(id, tries, next, reason)), \
         retried AS (UPDATE herald_receipt_queue AS q SET tries = v.tries, due_at = v.next \
             FROM v WHERE q.receipt_id = v.id AND v.next IS NOT NULL), \
         ended AS (DELETE FROM herald_receipt_queue AS q USING v \
             WHERE q.receipt_id = v.id AND v.next IS NULL) \
         UPDATE herald_receipts AS r SET outcome = 'unmatched', outcome_reason = v.reason, \
             match_attempts = v.tries \
         FROM v WHERE r.id = v.id AND v.next IS NULL",
    )
    .bind::<Array<BigInt>, _>(unmatched.iter().map(|u| u.receipt_id).collect::<Vec<_>>())
    .bind::<Array<Integer>, _>(unmatched.iter().map(|u| u.tries).collect::<Vec<_>>())
    .bind::<Array<Nullable<Timestamptz>>, _>(unmatched.iter().map(|u| u.next).collect::<Vec<_>>())
    .bind::<Array<Text>, _>(unmatched.iter().map(|u| u.reason).collect::<Vec<_>>())
    .execute(conn)?;
    Ok(())
}

/// SQLite: statements per receipt (in-process, cheap), kept prepared.
pub fn sqlite_mark_unmatched(
    conn: &mut diesel::sqlite::SqliteConnection,
    unmatched: &[Unmatched],
) -> diesel::QueryResult<()> {
    use crate::storage::sqlite_time::SqliteTime;
    use diesel::RunQueryDsl;
    for u in unmatched {
        match u.next {
            Some(next) => {
                super::prepared::cached_const!(
                    "UPDATE herald_receipt_queue SET tries = ?1, due_at = ?2 WHERE receipt_id = ?3",
                )
                .bind::<Integer, _>(u.tries)
                .bind::<SqliteTime, _>(next)
                .bind::<BigInt, _>(u.receipt_id)
                .execute(conn)?;
            }
            None => {
                sqlite_dequeue(conn, u.receipt_id)?;
                super::prepared::cached_const!(
                    "UPDATE herald_receipts SET outcome = 'unmatched', outcome_reason = ?1, \
                     match_attempts = ?2 WHERE id = ?3",
                )
                .bind::<Text, _>(u.reason)
                .bind::<Integer, _>(u.tries)
                .bind::<BigInt, _>(u.receipt_id)
                .execute(conn)?;
            }
        }
    }
    Ok(())
}

/// SQLite: a receipt off the reconciler's queue.
fn sqlite_dequeue(
    conn: &mut diesel::sqlite::SqliteConnection,
    receipt_id: i64,
) -> diesel::QueryResult<()> {
    use diesel::RunQueryDsl;
    super::prepared::cached_const!("DELETE FROM herald_receipt_queue WHERE receipt_id = ?1")
        .bind::<BigInt, _>(receipt_id)
        .execute(conn)?;
    Ok(())
}

/// Writes the messages' delivery status and its time: one statement for the whole pass.
pub fn pg_write_statuses(
    conn: &mut diesel::pg::PgConnection,
    messages: &[&MatchedMessage],
) -> diesel::QueryResult<()> {
    use diesel::RunQueryDsl;
    use diesel::sql_types::{Array, Nullable, Timestamptz};
    if messages.is_empty() {
        return Ok(());
    }
    super::prepared::cached_const!(
        "UPDATE herald_outbox AS o SET delivery_status = v.status, delivery_status_at = v.at \
         FROM unnest($1::bigint[], $2::text[], $3::timestamptz[]) AS v(id, status, at) \
         WHERE o.id = v.id",
    )
    .bind::<Array<BigInt>, _>(messages.iter().map(|m| m.id).collect::<Vec<_>>())
    .bind::<Array<Nullable<Text>>, _>(
        messages
            .iter()
            .map(|m| m.delivery_status.as_deref())
            .collect::<Vec<_>>(),
    )
    .bind::<Array<Nullable<Timestamptz>>, _>(
        messages
            .iter()
            .map(|m| m.delivery_status_at)
            .collect::<Vec<_>>(),
    )
    .execute(conn)?;
    Ok(())
}

pub fn sqlite_write_statuses(
    conn: &mut diesel::sqlite::SqliteConnection,
    messages: &[&MatchedMessage],
) -> diesel::QueryResult<()> {
    use crate::storage::sqlite_time::SqliteTime;
    use diesel::RunQueryDsl;
    for m in messages {
        super::prepared::cached_const!(
            "UPDATE herald_outbox SET delivery_status = ?1, delivery_status_at = ?2 WHERE id = ?3",
        )
        .bind::<Nullable<Text>, _>(m.delivery_status.as_deref())
        .bind::<Nullable<SqliteTime>, _>(m.delivery_status_at)
        .bind::<BigInt, _>(m.id)
        .execute(conn)?;
    }
    Ok(())
}

/// SQLite: statements per receipt (in-process, cheap), kept prepared.
pub fn sqlite_mark_reconciled(
    conn: &mut diesel::sqlite::SqliteConnection,
    at: DateTime<Utc>,
    done: &[Reconciled],
) -> diesel::QueryResult<()> {
    use crate::storage::sqlite_time::SqliteTime;
    use diesel::RunQueryDsl;
    for d in done {
        sqlite_dequeue(conn, d.receipt_id)?;
        super::prepared::cached_const!(
            "UPDATE herald_receipts SET reconciled_at = ?1, message_id = ?2, outcome = ?3, \
             outcome_reason = ?4 WHERE id = ?5",
        )
        .bind::<SqliteTime, _>(at)
        .bind::<BigInt, _>(d.message_id)
        .bind::<Text, _>(d.outcome)
        .bind::<Text, _>(d.reason.as_str())
        .bind::<BigInt, _>(d.receipt_id)
        .execute(conn)?;
    }
    Ok(())
}

/// The messages of `ids`, in id order, with `$lock`, each with the time of its last replay and
/// the number of its replays (index `herald_replays_message`).
macro_rules! lock_messages {
    ($conn:expr, $schema:ident, $ids:expr $(, $lock:ident)*) => {{
        use super::$schema::herald_outbox as o;
        use super::$schema::herald_replays as rp;
        use super::$schema::herald_attempts as a;
        use diesel::prelude::*;
        let last_replay = rp::table
            .filter(rp::message_id.eq(o::id))
            .order(rp::id.desc())
            .select(rp::replayed_at)
            .single_value();
        let replays = rp::table
            .filter(rp::message_id.eq(o::id))
            .count()
            .single_value();
        let first_request = a::table
            .filter(a::message_id.eq(o::id))
            .filter(a::attempt_number.gt(o::attempt_base))
            .filter(a::class.ne(crate::domain::AttemptClass::NotSent))
            // Attempts are numbered in the order they began.
            .order(a::attempt_number)
            .select(a::started_at)
            .single_value();
        let series_attempt_rows = a::table
            .filter(a::message_id.eq(o::id))
            .filter(a::attempt_number.gt(o::attempt_base))
            .count()
            .single_value();
        o::table
            .filter(o::id.eq_any($ids))
            .select((
                o::id,
                o::event_id,
                o::state,
                o::delivery_status,
                o::delivery_status_at,
                o::state_reason,
                o::updated_at,
                last_replay,
                replays,
                o::created_at,
                first_request,
                o::attempts,
                o::attempt_base,
                series_attempt_rows,
            ))
            .order(o::id)
            $(.$lock())*
            .load($conn)
    }};
}

/// The messages, locked for this transaction, in id order; those another transaction holds are
/// left out (`FOR NO KEY UPDATE SKIP LOCKED`). Locked first, then read by a statement of its
/// own: a row an outcome committed after the locking statement began is locked at its newest
/// version, but that statement's subqueries (the attempts, the replays) would still read its
/// older snapshot — a state of `unconfirmed` beside no attempt row. The read's snapshot is
/// taken after the lock, and sees the whole commit.
pub fn pg_lock_messages(
    conn: &mut diesel::pg::PgConnection,
    ids: &[i64],
) -> diesel::QueryResult<Vec<MatchedMessage>> {
    use super::schema_pg::herald_outbox as o;
    use diesel::prelude::*;
    let locked: Vec<i64> = o::table
        .filter(o::id.eq_any(ids))
        .select(o::id)
        .order(o::id)
        .for_no_key_update()
        .skip_locked()
        .load(conn)?;
    lock_messages!(conn, schema_pg, &locked)
}

/// SQLite: behind the writer lock, exclusive already.
pub fn sqlite_lock_messages(
    conn: &mut diesel::sqlite::SqliteConnection,
    ids: &[i64],
) -> diesel::QueryResult<Vec<MatchedMessage>> {
    lock_messages!(conn, schema_sqlite, ids)
}

/// A message's `scheduled_at` as inserted on PostgreSQL: `None` (not given) is left to the
/// column default, the database's `now()`.
pub fn pg_scheduled_at(m: &NewOutboxRow) -> Option<DateTime<Utc>> {
    m.scheduled_at
}

/// On SQLite (one process, whose clock may be the tests' injected one): `now` when not given.
pub fn sqlite_scheduled_at(m: &NewOutboxRow) -> Option<DateTime<Utc>> {
    Some(m.scheduled_at.unwrap_or(m.now))
}

/// The PostgreSQL arm of each backend-specific query.
/// The settle pass's test that a message's replay came more than
/// [`crate::storage::models::REPLAY_SLACK`] (5 s) after a receipt's event: the receipt is of an
/// earlier send ([`crate::storage::models::MatchedMessage::replayed_after`]). Raw SQL over the
/// two tables' own names, as diesel writes them in the settle pass's subqueries.
/// A time on a whole minute gets a minute more ([`crate::storage::models::replay_slack`]).
pub const PG_REPLAY_AFTER_EVENT: &str = "herald_replays.replayed_at > herald_receipts.event_time \
     + CASE WHEN date_trunc('minute', herald_receipts.event_time) = herald_receipts.event_time \
     THEN interval '65 seconds' ELSE interval '5 seconds' END";
/// [`PG_REPLAY_AFTER_EVENT`] on SQLite, whose times are UTC text (`julianday` reads them; a whole
/// minute is written `…:MM:00+00:00`, no fraction: `sqlite_time::format`).
pub const SQLITE_REPLAY_AFTER_EVENT: &str = "julianday(herald_replays.replayed_at) > \
     julianday(herald_receipts.event_time) + CASE WHEN substr(herald_receipts.event_time, 17) = \
     ':00+00:00' THEN 65.0 ELSE 5.0 END / 86400.0";

/// The first statement of a transaction whose reads must see one snapshot (a listing read in
/// several statements): PostgreSQL's default, READ COMMITTED, gives each statement its own.
pub const PG_SNAPSHOT_READ: &str = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY";
/// [`PG_SNAPSHOT_READ`] on SQLite: nothing to set, a read transaction in WAL mode is one
/// snapshot from its first read on.
pub const SQLITE_SNAPSHOT_READ: &str = "";

/// The settle pass's test that an attempt of the message's current series had started when the
/// receipt arrived: a receipt stored before any request of it was made speaks of no send of it
/// (`MatchedMessage::of_no_send`). Raw SQL over the tables' own names, as diesel writes them.
/// With [`crate::storage::models::RECEIPT_CLOCK_SLACK`] (one second) for clocks apart.
pub const PG_ATTEMPT_BEFORE_RECEIPT: &str =
    "herald_attempts.started_at <= herald_receipts.received_at + interval '1 second'";
/// [`PG_ATTEMPT_BEFORE_RECEIPT`] on SQLite (`julianday` reads its UTC text times).
pub const SQLITE_ATTEMPT_BEFORE_RECEIPT: &str = "julianday(herald_attempts.started_at) <= \
     julianday(herald_receipts.received_at) + 1.0 / 86400.0";

/// Whether diesel's bookkeeping table is there, as one `present` boolean: asked rather than
/// read from the error of a `SELECT` from it, whose words depend on the server's language (and a
/// permission error names the table too).
pub const PG_MIGRATIONS_TABLE_PRESENT: &str =
    "SELECT to_regclass('__diesel_schema_migrations') IS NOT NULL AS present";
/// SQLite's [`PG_MIGRATIONS_TABLE_PRESENT`].
pub const SQLITE_MIGRATIONS_TABLE_PRESENT: &str = "SELECT EXISTS (SELECT 1 FROM sqlite_master \
     WHERE type = 'table' AND name = '__diesel_schema_migrations') AS present";

pub mod pg {
    pub use super::PG_ATTEMPT_BEFORE_RECEIPT as ATTEMPT_BEFORE_RECEIPT;
    pub use super::PG_MIGRATIONS_TABLE_PRESENT as MIGRATIONS_TABLE_PRESENT;
    pub use super::PG_REPLAY_AFTER_EVENT as REPLAY_AFTER_EVENT;
    pub use super::PG_SNAPSHOT_READ as SNAPSHOT_READ;
    pub use super::pg_busy_keys as busy_keys;
    pub use super::pg_claimed_not_heads as claimed_not_heads;
    pub use super::pg_insert_attempts as insert_attempts;
    pub use super::pg_insert_receipts_returning as insert_receipts_returning;
    pub use super::pg_keep_to_indexes as keep_to_indexes;
    pub use super::pg_key_lock_busy as key_lock_busy;
    pub use super::pg_key_rows_busy as key_rows_busy;
    pub use super::pg_limit_statements as limit_statements;
    pub use super::pg_lock_event_id as lock_event_id;
    pub use super::pg_scheduled_at as scheduled_at;
    pub use super::{
        pg_claim_rows as claim_rows, pg_expired_leases as expired_leases, pg_now as now,
        pg_release_heads as release_heads, pg_update_outcomes as update_outcomes,
    };
    pub use super::{
        pg_lock_messages as lock_messages, pg_mark_reconciled as mark_reconciled,
        pg_mark_unmatched as mark_unmatched, pg_pending_receipts as pending_receipts,
        pg_write_statuses as write_statuses,
    };
}

/// The SQLite arm of each backend-specific query.
pub mod sqlite {
    use chrono::{DateTime, Utc};
    use diesel::prelude::*;

    pub use super::SQLITE_ATTEMPT_BEFORE_RECEIPT as ATTEMPT_BEFORE_RECEIPT;
    pub use super::SQLITE_MIGRATIONS_TABLE_PRESENT as MIGRATIONS_TABLE_PRESENT;
    pub use super::SQLITE_REPLAY_AFTER_EVENT as REPLAY_AFTER_EVENT;
    pub use super::SQLITE_SNAPSHOT_READ as SNAPSHOT_READ;

    pub use super::sqlite_busy_keys as busy_keys;
    pub use super::sqlite_claimed_not_heads as claimed_not_heads;
    pub use super::sqlite_insert_attempts as insert_attempts;
    pub use super::sqlite_insert_receipts_returning as insert_receipts_returning;
    pub use super::sqlite_keep_to_indexes as keep_to_indexes;
    pub use super::sqlite_key_lock_busy as key_lock_busy;
    pub use super::sqlite_key_rows_busy as key_rows_busy;
    pub use super::sqlite_limit_statements as limit_statements;
    pub use super::sqlite_lock_event_id as lock_event_id;
    pub use super::sqlite_scheduled_at as scheduled_at;
    pub use super::{
        sqlite_claim_rows as claim_rows, sqlite_expired_leases as expired_leases,
        sqlite_now as now, sqlite_release_heads as release_heads,
    };
    pub use super::{
        sqlite_lock_messages as lock_messages, sqlite_mark_reconciled as mark_reconciled,
        sqlite_mark_unmatched as mark_unmatched, sqlite_pending_receipts as pending_receipts,
        sqlite_write_statuses as write_statuses,
    };
    use crate::storage::models::{Applied, Now, OutcomeRecord};

    type Conn = diesel::sqlite::SqliteConnection;

    /// The fenced outcome update, one statement per row (in-process: no round trip), kept
    /// prepared: diesel never caches a query-builder `UPDATE`, and compiling it again for every
    /// outcome was a third of Herald's CPU in `herald-bench email_smtp` (`sqlite3_prepare_v3`).
    pub fn update_outcomes(
        conn: &mut Conn,
        owner: &str,
        _now: &Now,
        at: DateTime<Utc>,
        outcomes: &[OutcomeRecord],
    ) -> QueryResult<Vec<Applied>> {
        use crate::storage::sqlite_time::SqliteTime;
        use diesel::sql_types::{BigInt, Integer, Nullable, Text};
        let mut applied = Vec::with_capacity(outcomes.len());
        for x in outcomes {
            macro_rules! outcome {
                ($sql:expr) => {
                    crate::storage::prepared::cached_const!($sql)
                        .bind::<Text, _>(x.state)
                        .bind::<Integer, _>(x.attempts_after)
                        .bind::<Nullable<SqliteTime>, _>(x.next_attempt_at)
                        .bind::<Nullable<Text>, _>(x.error_class)
                        .bind::<Nullable<Text>, _>(x.provider_message_id.as_deref())
                        .bind::<SqliteTime, _>(at)
                        .bind::<BigInt, _>(x.message_id)
                        .bind::<Text, _>(owner)
                        .bind::<Integer, _>(x.claimed_attempt)
                };
            }
            let n = match x.request_fingerprint.as_deref() {
                Some(fingerprint) if !x.fingerprint_in_row => {
                    outcome!(super::SQLITE_UPDATE_OUTCOME_FINGERPRINT_SQL)
                        .bind::<Text, _>(fingerprint)
                        .execute(conn)?
                }
                _ => outcome!(super::SQLITE_UPDATE_OUTCOME_SQL).execute(conn)?,
            };
            applied.push(if n == 1 {
                Applied::Yes
            } else {
                Applied::LeaseLost
            });
        }
        Ok(applied)
    }
}

/// The keys' heads released: for each key of `$keys` (a query of `(ordering_key, destination)`),
/// its first open place that still counts (not a released dead head); when that is a waiting
/// message, it becomes due at its `scheduled_at`. Idempotent: a key whose head is due, in
/// flight, retrying or a blocking dead letter is left as it is. Reads `herald_outbox_ordering_open`.
/// With `$idle` (every release but the one after outcomes, [`Heads::Ended`]): a key with any
/// message in flight is left alone, its head or not. A replayed head waits behind a later message
/// in flight (`storage::ordering::rejoin`), and making it due then put two messages of the key in
/// flight at once; that message's outcome releases it. After outcomes the check is not needed
/// (the ended message was its key's one in flight, and nothing behind a waiting head can be
/// claimed) and costs a probe per key, so it is left out there.
macro_rules! release_heads {
    ($keys:expr, $idle:expr) => {
        concat!(
            "WITH k AS (",
            $keys,
            "), head AS (
    SELECT (SELECT h.id FROM herald_outbox AS h
            WHERE h.ordering_key = k.ordering_key AND h.destination = k.destination
              AND h.state IN ('scheduled', 'retryable', 'sending', 'dead_letter', 'unconfirmed')
              AND (h.state IN ('scheduled', 'retryable', 'sending') OR h.ordering_released_at IS NULL)
            ORDER BY h.ordering_seq LIMIT 1) AS id
    FROM k",
            $idle,
            "
)
UPDATE herald_outbox SET next_attempt_at = scheduled_at
WHERE id IN (SELECT id FROM head) AND state = 'scheduled' AND next_attempt_at IS NULL
RETURNING id"
        )
    };
}

/// The keys with a waiting message (the watchdog's pass over every key).
macro_rules! waiting_keys {
    () => {
        "SELECT DISTINCT ordering_key, destination FROM herald_outbox
    WHERE ordering_key IS NOT NULL AND state = 'scheduled' AND next_attempt_at IS NULL"
    };
}

/// The clause of [`release_heads!`] that leaves a key with a message in flight alone.
macro_rules! no_key_in_flight {
    () => {
        "
    WHERE NOT EXISTS (SELECT 1 FROM herald_outbox AS s
                      WHERE s.state = 'sending' AND s.ordering_key = k.ordering_key
                        AND s.destination = k.destination)"
    };
}

/// The keys of the messages `$1` / `?1`.
macro_rules! keys_of {
    (pg) => {
        "SELECT DISTINCT ordering_key, destination FROM herald_outbox
    WHERE id = ANY($1::bigint[]) AND ordering_key IS NOT NULL"
    };
    (sqlite) => {
        "SELECT DISTINCT ordering_key, destination FROM herald_outbox
    WHERE id IN (SELECT value FROM json_each(?1)) AND ordering_key IS NOT NULL"
    };
}

pub const PG_RELEASE_SQL: &str = release_heads!(keys_of!(pg), no_key_in_flight!());
pub const SQLITE_RELEASE_SQL: &str = release_heads!(keys_of!(sqlite), no_key_in_flight!());
pub const PG_RELEASE_ENDED_SQL: &str = release_heads!(keys_of!(pg), "");
pub const SQLITE_RELEASE_ENDED_SQL: &str = release_heads!(keys_of!(sqlite), "");
pub const RELEASE_WAITING_SQL: &str = release_heads!(waiting_keys!(), no_key_in_flight!());

/// Whether another transaction holds one of the rows of the key `($1, $2)` other than `$3` that a
/// claim could take or is sending (a claim taking it, an outcome ending it) right now. The free
/// ones are locked (`FOR NO KEY UPDATE SKIP LOCKED`, never waiting, until this transaction
/// ends), so their states as read next are settled. A dead or unconfirmed head held by the
/// reconciler does not count. A replay's `rejoin` reads the key's states to decide whether its
/// message must wait: under READ COMMITTED a claim of a later message not yet committed looked
/// `retryable`, the replayed message was made due, and both went in flight.
pub fn pg_key_rows_busy(
    conn: &mut diesel::pg::PgConnection,
    key: &str,
    destination: &str,
    except: i64,
) -> diesel::QueryResult<bool> {
    use diesel::RunQueryDsl;
    let row: BusyRow = super::prepared::cached_const!(
        "WITH open AS MATERIALIZED (
    SELECT id FROM herald_outbox
    WHERE ordering_key = $1 AND destination = $2 AND id <> $3
      AND state IN ('scheduled', 'retryable', 'sending')
), free AS (
    SELECT id FROM herald_outbox WHERE id = ANY(ARRAY(SELECT id FROM open))
    FOR NO KEY UPDATE SKIP LOCKED
)
SELECT (SELECT count(*) FROM open) > (SELECT count(*) FROM free) AS busy",
    )
    .bind::<Text, _>(key)
    .bind::<Text, _>(destination)
    .bind::<BigInt, _>(except)
    .get_result(conn)?;
    Ok(row.busy)
}

/// The keyed rows of `ids`, just claimed in this transaction, that are not their key's head as
/// a statement of its own sees it ([`key_head!`] again, on a fresh snapshot). The claim's
/// statement judges heads by its own snapshot, and a replay of an earlier (dead, skipped) message
/// of the key may commit after that snapshot was taken but before the claim reached the key's
/// next message: the replay could not see a claim that held no row yet, the claim saw the
/// replayed message still skipped, and both went in flight. This statement starts after the claim
/// took its rows, so it sees any replay that the claim's locks did not keep waiting; a row it
/// returns means the claim is rolled back and made again ([`crate::storage::Db::claim`]).
pub const PG_CLAIMED_NOT_HEADS_SQL: &str = concat!(
    "SELECT c.id FROM herald_outbox AS c WHERE c.id = ANY($1::bigint[]) AND NOT ",
    key_head!()
);

/// See [`PG_CLAIMED_NOT_HEADS_SQL`].
pub fn pg_claimed_not_heads(
    conn: &mut diesel::pg::PgConnection,
    ids: &[i64],
) -> diesel::QueryResult<Vec<i64>> {
    use diesel::RunQueryDsl;
    use diesel::sql_types::Array;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<IdRow> = super::prepared::cached_const!(PG_CLAIMED_NOT_HEADS_SQL)
        .bind::<Array<BigInt>, _>(ids)
        .load(conn)?;
    Ok(rows.into_iter().map(|r| r.id).collect())
}

/// SQLite: the claim runs behind the writer lock, so its statement sees every commit before it.
pub fn sqlite_claimed_not_heads(
    _conn: &mut diesel::sqlite::SqliteConnection,
    _ids: &[i64],
) -> diesel::QueryResult<Vec<i64>> {
    Ok(Vec::new())
}

/// Whether another transaction holds the key's insert lock (its row of `herald_ordering_locks`:
/// an insert into the key not yet committed, an outcome or a retention batch looking at it);
/// when it is free, takes it (`FOR NO KEY UPDATE SKIP LOCKED`, never waiting) until this
/// transaction ends. A replay's `rejoin` reads the key only with it held: an insert into the key
/// then waits for the replay and sees the replayed message open. Where it is busy, the replayed
/// message waits for the periodic release: an insert still open there made a message the replay
/// cannot see, due because the replayed one still looked skipped to it. Never waiting means no
/// deadlock: a redrive replays many keys in one transaction, an application inserts into many in
/// its own order, and a replay holds its message's row (which an insert of the same event id
/// waits for) before it gets here. A key without a row (its messages written past the trigger)
/// counts as free, as in [`pg_busy_keys`].
pub fn pg_key_lock_busy(
    conn: &mut diesel::pg::PgConnection,
    key: &str,
    destination: &str,
) -> diesel::QueryResult<bool> {
    use diesel::RunQueryDsl;
    let row: BusyRow = super::prepared::cached_const!(
        "WITH k AS MATERIALIZED (
    SELECT 1 FROM herald_ordering_locks WHERE ordering_key = $1 AND destination = $2
), l AS MATERIALIZED (
    SELECT 1 FROM herald_ordering_locks WHERE ordering_key = $1 AND destination = $2
    FOR NO KEY UPDATE SKIP LOCKED
)
SELECT (SELECT count(*) FROM k) > (SELECT count(*) FROM l) AS busy",
    )
    .bind::<Text, _>(key)
    .bind::<Text, _>(destination)
    .get_result(conn)?;
    Ok(row.busy)
}

/// SQLite: every write runs behind the writer lock already.
pub fn sqlite_key_lock_busy(
    _conn: &mut diesel::sqlite::SqliteConnection,
    _key: &str,
    _destination: &str,
) -> diesel::QueryResult<bool> {
    Ok(false)
}

/// SQLite: every write runs behind the writer lock; nothing else holds a row.
pub fn sqlite_key_rows_busy(
    _conn: &mut diesel::sqlite::SqliteConnection,
    _key: &str,
    _destination: &str,
    _except: i64,
) -> diesel::QueryResult<bool> {
    Ok(false)
}

/// Which keys [`pg_release_heads`] releases.
#[derive(Debug, Clone, Copy)]
pub enum Heads<'a> {
    /// The keys of these messages.
    Of(&'a [i64]),
    /// The keys of these messages, whose outcomes just ended them (no check for a message in
    /// flight: see [`release_heads!`]).
    Ended(&'a [i64]),
    /// Every key with a waiting message.
    Waiting,
}

/// The keyed messages of `ids` whose key another transaction is inserting into right now (it
/// holds the key's row in `herald_ordering_locks`, locked by the `herald_outbox_ordering`
/// trigger): takes the row of every other key, without waiting, until this transaction ends.
///
/// Why: an insert into a key whose head is still open (in flight) makes the new message wait,
/// and the head's outcome releases it. An outcome committed while that insert was still
/// uncommitted cannot see the new message, and the insert saw the head still open: nobody would
/// release it before the periodic pass. With the row held, a later insert waits for this
/// transaction and then sees the head done; where the row was busy, the caller releases the
/// key again once it is free ([`crate::storage::Db::release_rechecked`]). Never waiting for
/// the row means never deadlocking with an application's transaction that inserts into
/// several keys.
pub fn pg_busy_keys(
    conn: &mut diesel::pg::PgConnection,
    ids: &[i64],
) -> diesel::QueryResult<Vec<i64>> {
    use diesel::RunQueryDsl;
    use diesel::sql_types::Array;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    // Every key's row read whole before the answer (MATERIALIZED, and a join): each one is
    // locked or found busy. A key's row is committed with its first message, so the keys of
    // `ids` (committed messages) have theirs, unless a message was written past the trigger
    // (triggers disabled: `session_replication_role = replica`, a restore with
    // `--disable-triggers`; or an UPDATE of its key or destination). Such a key is taken for
    // free, never waited for: its next insert writes the row.
    let rows: Vec<IdRow> = super::prepared::cached_const!(
        "WITH k AS MATERIALIZED ( \
             SELECT o.id, o.destination, o.ordering_key FROM herald_outbox AS o \
             WHERE o.id = ANY($1::bigint[]) AND o.ordering_key IS NOT NULL), \
         free AS MATERIALIZED ( \
             SELECT l.ordering_key, l.destination FROM herald_ordering_locks AS l \
             WHERE (l.ordering_key, l.destination) IN (SELECT ordering_key, destination FROM k) \
             FOR NO KEY UPDATE SKIP LOCKED) \
         SELECT k.id FROM k \
         JOIN herald_ordering_locks AS l \
             ON l.ordering_key = k.ordering_key AND l.destination = k.destination \
         LEFT JOIN free AS f \
             ON f.ordering_key = k.ordering_key AND f.destination = k.destination \
         WHERE f.ordering_key IS NULL",
    )
    .bind::<Array<BigInt>, _>(ids)
    .load(conn)?;
    Ok(rows.into_iter().map(|r| r.id).collect())
}

/// The advisory lock class of an event id (the second key is the id's `hashtext`):
/// `POST /v1/messages` takes it, in the transaction that writes a plain message or a fan-out,
/// before it looks for the other kind under the same id. Both looks otherwise ran before the
/// other's commit, saw nothing, and both wrote. Only there: one event id per transaction, or
/// one per request of a group (at most `group_commit::GROUP_MAX`, 256) in the group enqueue.
/// The Rust library and plain SQL run in the application's transaction, which may write thousands
/// of messages, and each lock held to the commit takes a slot of PostgreSQL's shared lock table
/// (`max_locks_per_transaction` × connections): "out of shared memory" (why the ordering keys'
/// insert lock is a row of `herald_ordering_locks`, not an advisory lock, since migration
/// 000018).
pub const EVENT_ID_LOCK_CLASS: i32 = 1751477357;

/// Waits for, then holds until the transaction ends, the lock of `event_id` (see
/// [`EVENT_ID_LOCK_CLASS`]). Outside a transaction it is released at once, and guards nothing.
pub fn pg_lock_event_id(
    conn: &mut diesel::pg::PgConnection,
    event_id: &str,
) -> diesel::QueryResult<()> {
    use diesel::RunQueryDsl;
    super::prepared::cached_const!("SELECT pg_advisory_xact_lock($1, hashtext($2))")
        .bind::<Integer, _>(EVENT_ID_LOCK_CLASS)
        .bind::<Text, _>(event_id)
        .execute(conn)?;
    Ok(())
}

/// The advisory lock class of the outbox insert trigger's shared lock (migration 000021), held
/// by every transaction that inserted a due row while a Herald listens, from before it looks
/// whether a sender is awake until it ends: see [`pg_settle_awake`].
pub const AWAKE_LOCK_CLASS: i32 = 1751477358;

/// Promises that this sender claims again every few ms for the next `for_ms` ms (the insert
/// trigger skips the wake-up meanwhile: migration 000021). Returns the promise: its end, in ms
/// since the epoch by the database's clock. Sets the sequence at once, whatever transaction runs.
pub fn pg_promise_awake(
    conn: &mut diesel::pg::PgConnection,
    for_ms: i64,
) -> diesel::QueryResult<i64> {
    use diesel::RunQueryDsl;
    super::prepared::cached_const!(
        "SELECT setval('herald_awake', (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $1)"
    )
    .bind::<BigInt, _>(for_ms)
    .typed::<BigInt>()
    .get_result(conn)
}

/// Withdraws `promise` unless another sender's has replaced it, then says whether no
/// transaction holds [`AWAKE_LOCK_CLASS`] any more — one that may have skipped its wake-up
/// under a promise (without waiting for it, and releasing it at once: run by itself, the
/// statement is its own transaction). Once this says so, a claim sees every row whose wake-up
/// was skipped under `promise`. Two statements, in this order (the lock is tried only after the
/// withdrawal is in effect); run outside a transaction.
pub fn pg_settle_awake(
    conn: &mut diesel::pg::PgConnection,
    promise: i64,
) -> diesel::QueryResult<bool> {
    use diesel::RunQueryDsl;
    super::prepared::cached_const!(
        "SELECT setval('herald_awake', 0) FROM herald_awake WHERE last_value = $1"
    )
    .bind::<BigInt, _>(promise)
    .execute(conn)?;
    super::prepared::cached_const!("SELECT pg_try_advisory_xact_lock($1, 0)")
        .bind::<Integer, _>(AWAKE_LOCK_CLASS)
        .typed::<Bool>()
        .get_result(conn)
}

/// Wakes every listening sender (a NOTIFY, sent at once: run outside a transaction).
pub fn pg_wake_senders(conn: &mut diesel::pg::PgConnection) -> diesel::QueryResult<()> {
    use diesel::RunQueryDsl;
    super::prepared::cached_const!("SELECT pg_notify('herald_outbox', '')").execute(conn)?;
    Ok(())
}

/// [`pg_lock_event_id`] for several event ids at once (the group commit of `POST /v1/messages`):
/// their locks are taken in the order of their keys, so that two transactions taking several
/// never wait on each other in a circle (one taking one lock waits like any other).
pub fn pg_lock_event_ids(
    conn: &mut diesel::pg::PgConnection,
    event_ids: &[&str],
) -> diesel::QueryResult<()> {
    use diesel::RunQueryDsl;
    // The sorted subquery is not flattened into the outer one (it sorts and is DISTINCT), so
    // the locks are taken as its rows come, in key order.
    super::prepared::cached_const!(
        "SELECT pg_advisory_xact_lock($1, s.k) FROM ( \
             SELECT DISTINCT hashtext(e) AS k FROM unnest($2::text[]) AS e ORDER BY 1) AS s",
    )
    .bind::<Integer, _>(EVENT_ID_LOCK_CLASS)
    .bind::<diesel::sql_types::Array<Text>, _>(event_ids)
    .execute(conn)?;
    Ok(())
}

/// SQLite: every write runs behind the writer lock already.
pub fn sqlite_lock_event_id(
    _conn: &mut diesel::sqlite::SqliteConnection,
    _event_id: &str,
) -> diesel::QueryResult<()> {
    Ok(())
}

/// SQLite: inserts and outcomes run one at a time behind the writer lock; no key is ever busy.
pub fn sqlite_busy_keys(
    _conn: &mut diesel::sqlite::SqliteConnection,
    _ids: &[i64],
) -> diesel::QueryResult<Vec<i64>> {
    Ok(Vec::new())
}

/// Releases the heads of the keys of messages `ids` (see [`release_heads!`]); returns the ids
/// that became due.
pub fn pg_release_heads(
    conn: &mut diesel::pg::PgConnection,
    heads: Heads<'_>,
) -> diesel::QueryResult<Vec<i64>> {
    use diesel::RunQueryDsl;
    use diesel::sql_types::Array;
    let rows: Vec<IdRow> = match heads {
        Heads::Of(ids) => super::prepared::cached_const!(PG_RELEASE_SQL)
            .bind::<Array<BigInt>, _>(ids)
            .load(conn)?,
        Heads::Ended(ids) => super::prepared::cached_const!(PG_RELEASE_ENDED_SQL)
            .bind::<Array<BigInt>, _>(ids)
            .load(conn)?,
        Heads::Waiting => super::prepared::cached_const!(RELEASE_WAITING_SQL).load(conn)?,
    };
    Ok(rows.into_iter().map(|r| r.id).collect())
}

pub fn sqlite_release_heads(
    conn: &mut diesel::sqlite::SqliteConnection,
    heads: Heads<'_>,
) -> diesel::QueryResult<Vec<i64>> {
    use diesel::RunQueryDsl;
    let list = |ids: &[i64]| serde_json::to_string(ids).unwrap_or_else(|_| "[]".to_owned());
    let rows: Vec<IdRow> = match heads {
        Heads::Of(ids) => super::prepared::cached_const!(SQLITE_RELEASE_SQL)
            .bind::<Text, _>(list(ids))
            .load(conn)?,
        Heads::Ended(ids) => super::prepared::cached_const!(SQLITE_RELEASE_ENDED_SQL)
            .bind::<Text, _>(list(ids))
            .load(conn)?,
        Heads::Waiting => super::prepared::cached_const!(RELEASE_WAITING_SQL).load(conn)?,
    };
    Ok(rows.into_iter().map(|r| r.id).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The settle pass's SQL and the reconciler's Rust say the same replay slack.
    #[test]
    fn the_replay_slack_is_one_in_rust_and_sql() {
        // And the same slack for clocks apart between a receipt and a request.
        let replay = crate::storage::models::REPLAY_SLACK.num_seconds();
        let clocks = crate::storage::models::RECEIPT_CLOCK_SLACK.num_seconds();
        let minute = replay + 60;
        for (sql, ending) in [
            (
                PG_REPLAY_AFTER_EVENT,
                format!("THEN interval '{minute} seconds' ELSE interval '{replay} seconds' END"),
            ),
            (
                SQLITE_REPLAY_AFTER_EVENT,
                format!("THEN {minute}.0 ELSE {replay}.0 END / 86400.0"),
            ),
            (
                PG_ATTEMPT_BEFORE_RECEIPT,
                format!("interval '{clocks} second'"),
            ),
            (
                SQLITE_ATTEMPT_BEFORE_RECEIPT,
                format!("+ {clocks}.0 / 86400.0"),
            ),
        ] {
            assert!(sql.ends_with(&ending), "{sql}");
        }
    }

    /// The SQLite claim's limit is not a bare parameter (SQLite would compile the statement again
    /// at every claim: see [`SQLITE_CLAIM_SQL`]), and no other bare parameter follows a `LIMIT`.
    #[test]
    fn the_sqlite_claim_limit_is_not_a_bare_parameter() {
        let limits: Vec<&str> = SQLITE_CLAIM_SQL
            .split("LIMIT ")
            .skip(1)
            .map(|rest| rest.split_whitespace().next().unwrap_or_default())
            .collect();
        assert_eq!(limits, ["1))", "(?2"], "{SQLITE_CLAIM_SQL}");
    }

    /// The claims return the schema's columns by name, in its order, and nothing else.
    #[test]
    fn the_claims_return_the_outbox_columns_by_name() {
        let pg = returning_outbox_columns::<
            diesel::pg::Pg,
            super::super::schema_pg::herald_outbox::table,
        >(PG_CLAIM_SQL, "RETURNING o.*", "\"herald_outbox\".", "o.");
        assert!(pg.ends_with("RETURNING o.\"id\", o.\"event_id\", o.\"channel\", o.\"destination\", o.\"payload\", o.\"state\", o.\"scheduled_at\", o.\"next_attempt_at\", o.\"attempts\", o.\"max_attempts\", o.\"retry_policy\", o.\"semantics\", o.\"expires_at\", o.\"lease_until\", o.\"lease_owner\", o.\"request_fingerprint\", o.\"provider_message_id\", o.\"last_error_class\", o.\"delivery_status\", o.\"delivery_status_at\", o.\"created_at\", o.\"updated_at\", o.\"retry_policy_version\", o.\"state_reason\", o.\"message_key\", o.\"enqueued_by\", o.\"attempt_base\", o.\"ordering_key\", o.\"ordering_seq\", o.\"ordering_policy\", o.\"ordering_released_at\""), "{pg}");
        assert!(!pg.contains("o.*"));
        let sqlite = returning_outbox_columns::<
            diesel::sqlite::Sqlite,
            super::super::schema_sqlite::herald_outbox::table,
        >(SQLITE_CLAIM_SQL, "RETURNING *", "`herald_outbox`.", "");
        assert!(sqlite.ends_with("RETURNING `id`, `event_id`, `channel`, `destination`, `payload`, `state`, `scheduled_at`, `next_attempt_at`, `attempts`, `max_attempts`, `retry_policy`, `semantics`, `expires_at`, `lease_until`, `lease_owner`, `request_fingerprint`, `provider_message_id`, `last_error_class`, `delivery_status`, `delivery_status_at`, `created_at`, `updated_at`, `retry_policy_version`, `state_reason`, `message_key`, `enqueued_by`, `attempt_base`, `ordering_key`, `ordering_seq`, `ordering_policy`, `ordering_released_at`"), "{sqlite}");
    }
}
