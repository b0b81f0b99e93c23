//! The reads the admin page needs: messages by fingerprint prefix, a page of dead letters, and
//! attempts counted by hour and class. Summaries only — never a payload.
//!
//! `admin_dead_letters` is deliberately minimal (state, channel, class, newest first); the support
//! module's own dead-letter listing, when it exists, replaces it.

use chrono::{DateTime, Utc};
use diesel::Queryable;

use super::{Db, StorageError, per_backend};
use crate::domain::{AttemptClass, Channel, State};

/// What a listing shows of a message: identity, state, class — no payload.
#[derive(Debug, Clone, PartialEq, Queryable)]
pub struct MessageSummary {
    pub id: i64,
    pub event_id: String,
    pub channel: Channel,
    /// In clear: mask before showing (`telemetry::mask_url` / `mask_email`).
    pub destination: String,
    pub state: State,
    pub attempts: i32,
    pub last_error_class: Option<AttemptClass>,
    pub request_fingerprint: Option<String>,
    pub state_reason: Option<String>,
    pub updated_at: DateTime<Utc>,
}

impl MessageSummary {
    pub fn of(row: &crate::storage::models::OutboxRow) -> Self {
        Self {
            id: row.id,
            event_id: row.event_id.clone(),
            channel: row.channel,
            destination: row.destination.clone(),
            state: row.state,
            attempts: row.attempts,
            last_error_class: row.last_error_class,
            request_fingerprint: row.request_fingerprint.clone(),
            state_reason: row.state_reason.clone(),
            updated_at: row.updated_at,
        }
    }
}

/// Which dead letters to list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeadLetterFilter {
    pub channel: Option<Channel>,
    pub class: Option<AttemptClass>,
    /// Only those the unconfirmed deadline dead-lettered (`class=unconfirmed`, as in
    /// `GET /v1/dead-letters`): they have no class, a person decides whether they arrived.
    pub unconfirmed: bool,
    /// Keyset cursor: only rows older than this `(updated_at, id)`.
    pub before: Option<(DateTime<Utc>, i64)>,
}

/// Attempts of one class started in one hour.
#[derive(Debug, Clone, PartialEq, Eq, diesel::QueryableByName)]
pub struct HourCount {
    /// Hours since the Unix epoch (UTC).
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub hour: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub class: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub n: i64,
}

/// The columns of [`MessageSummary`], in its field order.
macro_rules! summary_columns {
    ($o:ident) => {
        (
            $o::id,
            $o::event_id,
            $o::channel,
            $o::destination,
            $o::state,
            $o::attempts,
            $o::last_error_class,
            $o::request_fingerprint,
            $o::state_reason,
            $o::updated_at,
        )
    };
}

per_backend! {
    use diesel::prelude::*;

    use super::{DeadLetterFilter, MessageSummary};
    use crate::domain::State;
    use self::schema::herald_outbox as o;

    /// Dead letters, newest first (by the time they became one), `limit` from the cursor.
    pub fn admin_dead_letters(
        conn: &mut Conn,
        filter: &DeadLetterFilter,
        limit: i64,
    ) -> QueryResult<Vec<MessageSummary>> {
        let mut q = o::table
            .filter(o::state.eq(State::DeadLetter))
            .select(summary_columns!(o))
            .into_boxed();
        if let Some(c) = filter.channel {
            q = q.filter(o::channel.eq(c));
        }
        if let Some(c) = filter.class {
            q = q.filter(o::last_error_class.eq(c));
        }
        if filter.unconfirmed {
            q = q.filter(o::state_reason.eq(crate::storage::models::UNCONFIRMED_DEADLINE_REASON));
        }
        if let Some((t, id)) = filter.before {
            q = q.filter(o::updated_at.lt(t).or(o::updated_at.eq(t).and(o::id.lt(id))));
        }
        q.order((o::updated_at.desc(), o::id.desc()))
            .limit(limit)
            .load(conn)
    }

    /// Stores a sign-out until the session would have expired, and removes the sign-outs of
    /// sessions expired an hour before `now` (refused by their expiry already, also by a process
    /// whose clock is behind this one's by less than that).
    pub fn record_sign_out(
        conn: &mut Conn,
        session_id: &str,
        expires_at: chrono::DateTime<chrono::Utc>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> QueryResult<()> {
        use self::schema::herald_admin_signouts as so;
        let past = now - chrono::Duration::hours(1);
        diesel::delete(so::table.filter(so::expires_at.lt(past))).execute(conn)?;
        diesel::insert_into(so::table)
            .values((so::session_id.eq(session_id), so::expires_at.eq(expires_at)))
            .on_conflict(so::session_id)
            .do_nothing()
            .execute(conn)?;
        Ok(())
    }

    /// Which of these session ids were signed out.
    pub fn signed_out(conn: &mut Conn, session_ids: &[String]) -> QueryResult<Vec<String>> {
        use self::schema::herald_admin_signouts as so;
        so::table
            .filter(so::session_id.eq_any(session_ids))
            .select(so::session_id)
            .load(conn)
    }
}

/// PostgreSQL: attempts started since `since`, by hour and class.
fn pg_attempts_by_hour(
    conn: &mut diesel::pg::PgConnection,
    since: DateTime<Utc>,
) -> diesel::QueryResult<Vec<HourCount>> {
    use diesel::RunQueryDsl;
    diesel::sql_query(
        "SELECT floor(extract(epoch FROM started_at) / 3600)::bigint AS hour, class, \
         count(*)::bigint AS n FROM herald_attempts WHERE started_at >= $1 \
         GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .bind::<diesel::sql_types::Timestamptz, _>(since)
    .load(conn)
}

/// SQLite: the same, over its text timestamps.
fn sqlite_attempts_by_hour(
    conn: &mut diesel::sqlite::SqliteConnection,
    since: DateTime<Utc>,
) -> diesel::QueryResult<Vec<HourCount>> {
    use diesel::RunQueryDsl;
    diesel::sql_query(
        "SELECT CAST(strftime('%s', started_at) AS INTEGER) / 3600 AS hour, class, \
         COUNT(*) AS n FROM herald_attempts WHERE started_at >= ? \
         GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .bind::<crate::storage::sqlite_time::SqliteTime, _>(since)
    .load(conn)
}

impl Db {
    /// One page of dead letters (see [`DeadLetterFilter`]).
    pub fn admin_dead_letters(
        &self,
        filter: &DeadLetterFilter,
        limit: i64,
    ) -> Result<Vec<MessageSummary>, StorageError> {
        crate::storage::db_run! { self, read |c, q| Ok(q::admin_dead_letters(c, filter, limit)?) }
    }

    /// Records an admin session's sign-out (see `herald_admin_signouts`).
    pub fn record_sign_out(
        &self,
        session_id: &str,
        expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::record_sign_out(c, session_id, expires_at, now)?) }
    }

    /// Which of these admin session ids were signed out.
    pub fn signed_out(&self, session_ids: &[String]) -> Result<Vec<String>, StorageError> {
        crate::storage::db_run! { self, read |c, q| Ok(q::signed_out(c, session_ids)?) }
    }

    /// Attempts started since `since`, counted by hour and class.
    pub fn attempts_by_hour(&self, since: DateTime<Utc>) -> Result<Vec<HourCount>, StorageError> {
        match self {
            Db::Pg(pool) => Ok(pg_attempts_by_hour(&mut *pool.get()?, since)?),
            Db::Sqlite(db) => Ok(sqlite_attempts_by_hour(&mut *db.read()?, since)?),
        }
    }
}
