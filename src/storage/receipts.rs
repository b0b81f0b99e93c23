//! Storing one ingest request's receipts, replays refused.
//!
//! Invariant: a request is stored whole or not at all. A receipt whose replay key (a one-time
//! value the signature covers where the body is not: Mailgun's token) is already held by a
//! *different* event of the same source is a replay: the transaction is rolled back and nothing
//! of the request is stored. The same event again under its own key is a duplicate, a no-op.
//! The check runs after the insert, in the same transaction, so two concurrent requests racing
//! with one key cannot both pass: on PostgreSQL the second insert waits for the first to commit
//! and its check then sees the first's row; SQLite has one writer.

use chrono::{DateTime, Utc};

use super::models::{NewReceipt, ReceiptRow};
use super::{Db, StorageError, per_backend};

per_backend! {
    use chrono::{DateTime, Utc};
    use diesel::prelude::*;

    use crate::storage::models::*;
    use self::schema::herald_receipts as r;

    /// Stores receipts, ignoring those whose (source, provider_event_id) exists; returns
    /// how many were new.
    pub fn insert_receipts(
        conn: &mut Conn,
        source: &str,
        receipts: &[NewReceipt],
        now: DateTime<Utc>,
    ) -> QueryResult<usize> {
        // Multi-row statements, in chunks well under every bind-parameter limit, in key order:
        // two requests carrying overlapping events (a provider retrying a batch while the first
        // try is still in flight) then wait on each other's rows in the same order and never
        // deadlock (a 40P01 is one of the errors the driver cannot tell apart from a bug).
        let mut sorted: Vec<&NewReceipt> = receipts.iter().collect();
        sorted.sort_by(|a, b| a.provider_event_id.cmp(&b.provider_event_id));
        let mut inserted = 0;
        for chunk in sorted.chunks(500) {
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
}

/// What storing a request's receipts came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Committed: `new` receipts stored, `duplicates` already there (each a no-op).
    Receipts { new: usize, duplicates: usize },
    /// Rolled back, nothing stored: this many receipts carry a replay key that a different event
    /// of the source already holds.
    Replayed(usize),
}

/// Why a transaction ended early.
enum Abort {
    Replayed(usize),
    Storage(StorageError),
}

impl From<diesel::result::Error> for Abort {
    fn from(e: diesel::result::Error) -> Self {
        Abort::Storage(e.into())
    }
}

/// The transaction body, compiled once per backend against that backend's schema and queries.
macro_rules! store_unless_replayed {
    ($conn:expr, $q:ident, $schema:ident, $source:expr, $receipts:expr, $now:expr) => {{
        use diesel::prelude::*;
        use $crate::storage::$schema::herald_receipts as r;
        let conn = $conn;
        let inserted = $q::insert_receipts(conn, $source, $receipts, $now)?;
        let mut replayed = 0;
        for x in $receipts {
            let Some(key) = &x.replay_key else { continue };
            let holder: Option<String> = r::table
                .filter(r::source.eq($source))
                .filter(r::replay_key.eq(key))
                .select(r::provider_event_id)
                .first(conn)
                .optional()?;
            if holder.is_some_and(|id| id != x.provider_event_id) {
                replayed += 1;
            }
        }
        if replayed > 0 {
            return Err(Abort::Replayed(replayed));
        }
        Ok((inserted, $receipts.len() - inserted))
    }};
}

impl Db {
    /// Stores a verified request's receipts in one transaction, unless one of them is a replay
    /// (then nothing). Committed when this returns [`Stored::Receipts`]: only then may the
    /// request be acknowledged.
    pub fn store_unless_replayed(
        &self,
        source: &str,
        receipts: &[NewReceipt],
        now: DateTime<Utc>,
    ) -> Result<Stored, StorageError> {
        // PostgreSQL text cannot hold NUL; a provider's free text (an SMTP diagnostic) may.
        let receipts: Vec<NewReceipt> = receipts.iter().map(NewReceipt::without_nul).collect();
        let receipts = receipts.as_slice();
        let result = match self {
            Db::Pg(pool) => {
                use super::queries::pg as q;
                let mut pooled = pool.get()?;
                diesel::Connection::transaction(
                    &mut *pooled,
                    |c: &mut diesel::pg::PgConnection| -> Result<_, Abort> {
                        store_unless_replayed!(c, q, schema_pg, source, receipts, now)
                    },
                )
            }
            Db::Sqlite(db) => {
                use super::queries::sqlite as q;
                let _w = db.lock_writer();
                let mut conn = db.pool.get()?;
                conn.immediate_transaction(
                    |c: &mut diesel::sqlite::SqliteConnection| -> Result<_, Abort> {
                        store_unless_replayed!(c, q, schema_sqlite, source, receipts, now)
                    },
                )
            }
        };
        match result {
            Ok((new, duplicates)) => Ok(Stored::Receipts { new, duplicates }),
            Err(Abort::Replayed(n)) => Ok(Stored::Replayed(n)),
            Err(Abort::Storage(e)) => Err(e),
        }
    }
}

impl Db {
    pub fn receipts_of_source(&self, source: &str) -> Result<Vec<ReceiptRow>, StorageError> {
        crate::storage::db_run! { self, read |c, q| Ok(q::receipts_of_source(c, source)?) }
    }
}
