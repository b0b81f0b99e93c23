//! Reads for `/metrics` and `/readyz`: one cheap query per figure, nothing written, no row
//! locked. The due and pending reads walk the same indexes as the claim and the reconciler
//! (`herald_outbox_due`, `herald_receipt_queue_due`), one row each; the count by state scans the
//! outbox (retention keeps it small), the count of receipts still tried the reconciler's queue.

use diesel::migration::MigrationSource;

use super::models::{DbStats, Now};
use super::{Db, PG_MIGRATIONS, SQLITE_MIGRATIONS, StorageError, per_backend};

/// A row of diesel's own bookkeeping table.
#[derive(diesel::QueryableByName)]
pub(crate) struct AppliedVersion {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub version: String,
}

per_backend! {
    use diesel::prelude::*;
    use diesel::dsl::{count_star, sql};
    use diesel::sql_types::Bool;

    use crate::domain::State;
    use crate::storage::models::{DbStats, Now};
    use crate::storage::stats::AppliedVersion;

    /// The figures of [`DbStats`], by the database's clock.
    pub fn db_stats(conn: &mut Conn, now: &Now) -> QueryResult<DbStats> {
        use self::schema::herald_outbox as o;
        use self::schema::herald_receipt_queue as qr;
        let at = sql::now(conn, now)?;
        let by_state: Vec<(State, i64)> = o::table
            .group_by(o::state)
            .select((o::state, count_star()))
            .load(conn)?;
        // The claim's own predicate, as literal SQL so the planner matches the partial index,
        // and its key gate: a keyed message due but behind an open earlier place of its key (a
        // replayed head, say) is not the sender falling behind; `herald_ordering_blocked_keys`
        // counts those keys.
        let oldest_due: Option<Option<chrono::DateTime<chrono::Utc>>> = o::table
            .filter(sql::<Bool>("state IN ('scheduled', 'retryable')"))
            .filter(o::next_attempt_at.le(at))
            .filter(sql::<Bool>(crate::storage::sql::KEY_HEAD_OF_OUTBOX))
            .order((o::next_attempt_at, o::id))
            .select(o::next_attempt_at)
            .first(conn)
            .optional()?;
        // Not tried yet: due since its arrival (`herald_receipt_queue_due`).
        let oldest_pending_receipt = qr::table
            .filter(qr::tries.eq(0))
            .order((qr::due_at, qr::receipt_id))
            .select(qr::due_at)
            .first(conn)
            .optional()?;
        let unmatched_receipts = q::unmatched_count(conn)?;
        Ok(DbStats {
            at,
            by_state,
            oldest_due: oldest_due.flatten(),
            oldest_pending_receipt,
            unmatched_receipts,
            blocked_keys: q::blocked_keys(conn)?,
        })
    }

    /// [`db_stats`] in one transaction whose statements take at most `limit` each (waiting
    /// for a lock included, on PostgreSQL). A lock on the outbox holds up the first, whose
    /// cancellation ends the read: the connection is back in the pool after `limit`. (Six slow
    /// statements could each take it; SQLite's readers wait for no lock.)
    pub fn db_stats_within(conn: &mut Conn, now: &Now, limit: std::time::Duration) -> QueryResult<DbStats> {
        conn.transaction(|c| {
            sql::limit_statements(c, limit)?;
            db_stats(c, now)
        })
    }

    /// The migration versions recorded as applied; `None` when the bookkeeping table is not
    /// there (a database never migrated).
    pub fn applied_migrations(conn: &mut Conn) -> QueryResult<Option<Vec<String>>> {
        #[derive(diesel::QueryableByName)]
        struct Present {
            #[diesel(sql_type = diesel::sql_types::Bool)]
            present: bool,
        }
        let present = diesel::sql_query(sql::MIGRATIONS_TABLE_PRESENT).get_result::<Present>(conn)?;
        if !present.present {
            return Ok(None);
        }
        // There: any error reading it (a role without SELECT on it) is shown as it is.
        diesel::sql_query("SELECT version FROM __diesel_schema_migrations")
            .load::<AppliedVersion>(conn)
            .map(|rows| Some(rows.into_iter().map(|r| r.version).collect()))
    }
}

impl Db {
    /// The scrape-time figures of `/metrics`, each statement given at most `limit`.
    pub fn db_stats(&self, now: Now, limit: std::time::Duration) -> Result<DbStats, StorageError> {
        crate::storage::db_run! { self, read |c, q| Ok(q::db_stats_within(c, &now, limit)?) }
    }

    /// The migration versions this database records as applied; none when diesel's bookkeeping
    /// table is not there (read only).
    fn applied_versions(&self) -> Result<Vec<String>, StorageError> {
        let applied: Option<Vec<String>> = crate::storage::db_run! { self, read |c, q| Ok::<_, StorageError>(q::applied_migrations(c)?) }?;
        Ok(applied.unwrap_or_default())
    }

    /// Whether no migration was ever applied to this database (read only).
    pub fn never_migrated(&self) -> Result<bool, StorageError> {
        Ok(self.applied_versions()?.is_empty())
    }

    /// The versions of the embedded migrations this database has not applied (read only: never
    /// creates diesel's bookkeeping table, unlike the migration harness).
    pub fn pending_migrations(&self) -> Result<Vec<String>, StorageError> {
        let embedded = self.embedded_versions()?;
        let applied = self.applied_versions()?;
        Ok(embedded
            .into_iter()
            .filter(|v| !applied.contains(v))
            .collect())
    }

    /// The versions this database records as applied that this build does not have: a newer
    /// Herald migrated it (a downgrade, or an old process left running beside new ones), and
    /// this one may misread what those migrations changed (read only).
    pub fn unknown_migrations(&self) -> Result<Vec<String>, StorageError> {
        let embedded = self.embedded_versions()?;
        let mut unknown: Vec<String> = self
            .applied_versions()?
            .into_iter()
            .filter(|v| !embedded.contains(v))
            .collect();
        unknown.sort();
        Ok(unknown)
    }

    fn embedded_versions(&self) -> Result<Vec<String>, StorageError> {
        Ok(match self {
            Db::Pg(_) => MigrationSource::<diesel::pg::Pg>::migrations(&PG_MIGRATIONS)
                .map_err(|e| StorageError::Migration(e.to_string()))?
                .iter()
                .map(|m| m.name().version().to_string())
                .collect(),
            Db::Sqlite(_) => {
                MigrationSource::<diesel::sqlite::Sqlite>::migrations(&SQLITE_MIGRATIONS)
                    .map_err(|e| StorageError::Migration(e.to_string()))?
                    .iter()
                    .map(|m| m.name().version().to_string())
                    .collect()
            }
        })
    }
}
