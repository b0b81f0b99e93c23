//! `herald_endpoints`: named endpoints Herald disabled by itself, shared by every process.

use chrono::{DateTime, Utc};

use super::{Db, StorageError, per_backend};

/// How soon after an endpoint is enabled its waiting messages are due: past the senders'
/// reread of the disabled endpoints (every second), so that none still takes the endpoint for
/// disabled and puts them back for another wait.
pub const ENABLED_DUE_IN: std::time::Duration = std::time::Duration::from_secs(2);

/// One disabled endpoint.
#[derive(Debug, Clone, PartialEq, diesel::Queryable)]
pub struct DisabledEndpoint {
    pub name: String,
    pub disabled_at: DateTime<Utc>,
    pub reason: Option<String>,
}

per_backend! {
    use chrono::{DateTime, Utc};
    use diesel::prelude::*;

    use self::schema::herald_endpoints as e;
    use crate::storage::endpoints::DisabledEndpoint;

    /// Marks `name` disabled unless it already is; `true` when this call disabled it.
    pub fn disable_endpoint(
        conn: &mut Conn,
        name: &str,
        reason: &str,
        now: DateTime<Utc>,
    ) -> QueryResult<bool> {
        // Inside the write transaction: a new row, or the existing one if it is enabled.
        let inserted = diesel::insert_into(e::table)
            .values((
                e::name.eq(name),
                e::disabled_at.eq(Some(now)),
                e::disabled_reason.eq(Some(reason)),
                e::updated_at.eq(now),
            ))
            .on_conflict(e::name)
            .do_nothing()
            .execute(conn)?;
        if inserted > 0 {
            return Ok(true);
        }
        let changed = diesel::update(e::table.filter(e::name.eq(name)).filter(e::disabled_at.is_null()))
            .set((
                e::disabled_at.eq(Some(now)),
                e::disabled_reason.eq(Some(reason)),
                e::updated_at.eq(now),
            ))
            .execute(conn)?;
        Ok(changed > 0)
    }

    /// Enables `name`; `true` when it was disabled. Its messages waiting for that (put back
    /// `retryable` while it was disabled) become due within [`ENABLED_DUE_IN`] rather than at
    /// the end of their wait, in the same transaction.
    pub fn enable_endpoint(conn: &mut Conn, name: &str, now: DateTime<Utc>) -> QueryResult<bool> {
        let changed = diesel::update(e::table.filter(e::name.eq(name)).filter(e::disabled_at.is_not_null()))
            .set((
                e::disabled_at.eq(None::<DateTime<Utc>>),
                e::disabled_reason.eq(None::<String>),
                e::updated_at.eq(now),
            ))
            .execute(conn)?;
        if changed > 0 {
            release_enabled(conn, name, now)?;
        }
        Ok(changed > 0)
    }

    /// Makes the messages that wait for `name` (put back `retryable` as `not_sent` while it was
    /// disabled) due within [`ENABLED_DUE_IN`](crate::storage::endpoints::ENABLED_DUE_IN); those
    /// in a backoff of their own (a 5xx's, a `Retry-After`) keep it. Repeating it changes nothing.
    pub fn release_enabled(conn: &mut Conn, name: &str, now: DateTime<Utc>) -> QueryResult<usize> {
        use self::schema::herald_outbox as o;
        let due = now + chrono::TimeDelta::seconds(crate::storage::endpoints::ENABLED_DUE_IN.as_secs() as i64);
        diesel::update(
            o::table
                .filter(o::destination.eq(crate::domain::endpoint_destination(name)))
                .filter(o::state.eq(crate::domain::State::Retryable))
                .filter(o::last_error_class.eq(crate::domain::AttemptClass::NotSent))
                .filter(o::next_attempt_at.gt(due)),
        )
        .set(o::next_attempt_at.eq(due))
        .execute(conn)
    }

    pub fn disabled_endpoints(conn: &mut Conn) -> QueryResult<Vec<DisabledEndpoint>> {
        e::table
            .filter(e::disabled_at.is_not_null())
            .select((e::name, e::disabled_at.assume_not_null(), e::disabled_reason))
            .order(e::name)
            .load(conn)
    }
}

impl Db {
    pub fn disable_endpoint(
        &self,
        name: &str,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::disable_endpoint(c, name, reason, now)?) }
    }

    pub fn enable_endpoint(&self, name: &str, now: DateTime<Utc>) -> Result<bool, StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::enable_endpoint(c, name, now)?) }
    }

    /// See [`queries::pg::release_enabled`](super::queries::pg::release_enabled).
    pub fn release_enabled(&self, name: &str, now: DateTime<Utc>) -> Result<usize, StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::release_enabled(c, name, now)?) }
    }

    pub fn disabled_endpoints(&self) -> Result<Vec<DisabledEndpoint>, StorageError> {
        crate::storage::db_run! { self, read |c, q| Ok(q::disabled_endpoints(c)?) }
    }
}
