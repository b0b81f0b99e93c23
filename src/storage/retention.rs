//! Retention: deleting finished messages (with their attempts, receipts and fan-out links) and
//! unmatched receipts older than their age, one bounded batch per transaction.
//!
//! Only final states are ever read here (`delivered`, `canceled`, `expired`; `dead_letter` on
//! its own, longer age): the state is in the selecting statement *and* in the delete itself. On
//! PostgreSQL the batch's rows are locked with `FOR UPDATE SKIP LOCKED`, so a concurrent replay
//! or a second Herald process never waits on retention (and retention never deletes a row that
//! a replay moved back to `scheduled` meanwhile). The state lists are literal SQL, so the
//! planner uses the partial indexes `herald_outbox_done` and `herald_outbox_dead_letters` (and
//! `herald_receipts_unmatched_age` for unmatched receipts).

use chrono::{DateTime, Utc};

use super::{Db, StorageError};

/// Which finished messages a batch purges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// `delivered`, `canceled`, `expired`.
    Done,
    /// `dead_letter` (kept longer).
    DeadLetter,
}

impl Finished {
    /// The state predicate, literal (see the module note).
    fn predicate(self) -> &'static str {
        match self {
            Finished::Done => "state IN ('delivered', 'canceled', 'expired')",
            Finished::DeadLetter => "state = 'dead_letter'",
        }
    }
}

/// What one batch (one transaction) deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PurgedBatch {
    pub messages: usize,
    pub attempts: usize,
    pub receipts: usize,
    pub fanouts: usize,
}

/// One batch's body; `$lock` are the row-lock methods (PostgreSQL) or nothing (SQLite, behind
/// its writer lock). Evaluates to the batch and the ordering keys (key, destination) of the
/// messages it deleted.
macro_rules! purge_messages {
    ($conn:expr, $schema:ident, $which:expr, $before:expr, $limit:expr $(, $lock:ident)*) => {{
        use diesel::prelude::*;
        use diesel::sql_types::Bool;
        use crate::storage::$schema::{herald_attempts as a, herald_fanouts as f, herald_outbox as o,
            herald_receipts as r};
        let victims: Vec<(i64, String, Option<String>, String)> = o::table
            .filter(diesel::dsl::sql::<Bool>($which.predicate()))
            .filter(o::updated_at.lt($before))
            .select((o::id, o::event_id, o::ordering_key, o::destination))
            .order((o::updated_at, o::id))
            .limit($limit)
            $(.$lock())*
            .load($conn)?;
        if victims.is_empty() {
            return Ok((PurgedBatch::default(), Vec::new()));
        }
        let ids: Vec<i64> = victims.iter().map(|v| v.0).collect();
        let mut keys: Vec<(String, String)> = victims
            .iter()
            .filter_map(|v| Some((v.2.clone()?, v.3.clone())))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let event_ids: Vec<&str> = victims.iter().map(|v| v.1.as_str()).collect();
        let receipts = diesel::delete(r::table.filter(r::message_id.eq_any(&ids))).execute($conn)?;
        let attempts = diesel::delete(a::table.filter(a::message_id.eq_any(&ids))).execute($conn)?;
        let fanouts =
            diesel::delete(f::table.filter(f::message_event_id.eq_any(&event_ids))).execute($conn)?;
        let messages = diesel::delete(
            o::table
                .filter(o::id.eq_any(&ids))
                .filter(diesel::dsl::sql::<Bool>($which.predicate())),
        )
        .execute($conn)?;
        Ok((PurgedBatch { messages, attempts, receipts, fanouts }, keys))
    }};
}

/// Unmatched receipts (no message ever claimed them) received before `$before`.
macro_rules! purge_unmatched {
    ($conn:expr, $schema:ident, $before:expr, $limit:expr $(, $lock:ident)*) => {{
        use diesel::prelude::*;
        use crate::storage::$schema::herald_receipts as r;
        let ids: Vec<i64> = r::table
            .filter(r::message_id.is_null())
            .filter(diesel::dsl::sql::<diesel::sql_types::Bool>("outcome = 'unmatched'"))
            .filter(r::received_at.lt($before))
            .select(r::id)
            .order((r::received_at, r::id))
            .limit($limit)
            $(.$lock())*
            .load($conn)?;
        if ids.is_empty() {
            return Ok(0);
        }
        diesel::delete(r::table.filter(r::id.eq_any(&ids)).filter(r::message_id.is_null()))
            .execute($conn)
    }};
}

/// Deletes at most `?2` replay keys first seen before `?1` (oldest first), by row: the table's
/// key is (source, replay_key).
pub const PG_PURGE_REPLAY_KEYS_SQL: &str = "DELETE FROM herald_replay_keys WHERE ctid IN (\
    SELECT ctid FROM herald_replay_keys WHERE seen_at < $1 ORDER BY seen_at LIMIT $2)";
/// See [`PG_PURGE_REPLAY_KEYS_SQL`].
pub const SQLITE_PURGE_REPLAY_KEYS_SQL: &str = "DELETE FROM herald_replay_keys WHERE rowid IN (\
    SELECT rowid FROM herald_replay_keys WHERE seen_at < ?1 ORDER BY seen_at LIMIT ?2)";

/// PostgreSQL: each purge keeps to its indexes (`sql::keep_to_indexes`): its `DELETE`s by
/// `= ANY($1)` stay prepared, and a plan made while the tables were small would outlive them.
pub mod pg {
    use super::*;
    type Conn = diesel::pg::PgConnection;

    /// A batch, and the insert-lock rows (`herald_ordering_locks`) of its messages' keys that
    /// no message is left in.
    pub fn purge_messages(
        conn: &mut Conn,
        which: Finished,
        before: DateTime<Utc>,
        limit: i64,
    ) -> diesel::QueryResult<PurgedBatch> {
        crate::storage::sql::pg_keep_to_indexes(conn)?;
        let (batch, keys) = batch(conn, which, before, limit)?;
        forget_keys(conn, &keys)?;
        Ok(batch)
    }

    fn batch(
        conn: &mut Conn,
        which: Finished,
        before: DateTime<Utc>,
        limit: i64,
    ) -> diesel::QueryResult<(PurgedBatch, Vec<(String, String)>)> {
        purge_messages!(
            conn,
            schema_pg,
            which,
            before,
            limit,
            for_update,
            skip_locked
        )
    }

    /// Deletes the insert-lock rows of `keys` (ordering key, destination) whose key has no
    /// message left. First the rows are taken without waiting (an insert into the key holds its
    /// row until it commits: that key is left alone); then, in a statement of its own (a fresh
    /// snapshot), those whose key has no message are deleted. So a message committed before
    /// the row was taken is seen and keeps it, and an insert after that waits for this
    /// transaction and then writes the row anew.
    fn forget_keys(conn: &mut Conn, keys: &[(String, String)]) -> diesel::QueryResult<usize> {
        use diesel::RunQueryDsl;
        use diesel::sql_types::{Array, Text};
        #[derive(diesel::QueryableByName)]
        struct Key {
            #[diesel(sql_type = Text)]
            ordering_key: String,
            #[diesel(sql_type = Text)]
            destination: String,
        }
        if keys.is_empty() {
            return Ok(0);
        }
        let (k, d): (Vec<&str>, Vec<&str>) =
            keys.iter().map(|(k, d)| (k.as_str(), d.as_str())).unzip();
        let taken: Vec<Key> = diesel::sql_query(
            "SELECT l.ordering_key, l.destination FROM herald_ordering_locks AS l \
             WHERE (l.ordering_key, l.destination) IN (SELECT * FROM unnest($1::text[], $2::text[])) \
             FOR UPDATE SKIP LOCKED",
        )
        .bind::<Array<Text>, _>(&k)
        .bind::<Array<Text>, _>(&d)
        .load(conn)?;
        if taken.is_empty() {
            return Ok(0);
        }
        let (k, d): (Vec<String>, Vec<String>) = taken
            .into_iter()
            .map(|t| (t.ordering_key, t.destination))
            .unzip();
        diesel::sql_query(
            "DELETE FROM herald_ordering_locks AS l \
             WHERE (l.ordering_key, l.destination) IN (SELECT * FROM unnest($1::text[], $2::text[])) \
               AND NOT EXISTS (SELECT 1 FROM herald_outbox AS o \
                   WHERE o.ordering_key = l.ordering_key AND o.destination = l.destination)",
        )
        .bind::<Array<Text>, _>(&k)
        .bind::<Array<Text>, _>(&d)
        .execute(conn)
    }

    pub fn purge_unmatched_receipts(
        conn: &mut Conn,
        before: DateTime<Utc>,
        limit: i64,
    ) -> diesel::QueryResult<usize> {
        crate::storage::sql::pg_keep_to_indexes(conn)?;
        purge_unmatched!(conn, schema_pg, before, limit, for_update, skip_locked)
    }

    pub fn purge_replay_keys(
        conn: &mut Conn,
        before: DateTime<Utc>,
        limit: i64,
    ) -> diesel::QueryResult<usize> {
        use diesel::RunQueryDsl;
        use diesel::sql_types::{BigInt, Timestamptz};
        crate::storage::sql::pg_keep_to_indexes(conn)?;
        diesel::sql_query(PG_PURGE_REPLAY_KEYS_SQL)
            .bind::<Timestamptz, _>(before)
            .bind::<BigInt, _>(limit)
            .execute(conn)
    }
}

pub mod sqlite {
    use super::*;
    type Conn = diesel::sqlite::SqliteConnection;

    pub fn purge_messages(
        conn: &mut Conn,
        which: Finished,
        before: DateTime<Utc>,
        limit: i64,
    ) -> diesel::QueryResult<PurgedBatch> {
        batch(conn, which, before, limit).map(|(batch, _)| batch)
    }

    /// SQLite keeps no insert-lock rows (one writer at a time): the keys go unused.
    fn batch(
        conn: &mut Conn,
        which: Finished,
        before: DateTime<Utc>,
        limit: i64,
    ) -> diesel::QueryResult<(PurgedBatch, Vec<(String, String)>)> {
        purge_messages!(conn, schema_sqlite, which, before, limit)
    }

    pub fn purge_unmatched_receipts(
        conn: &mut Conn,
        before: DateTime<Utc>,
        limit: i64,
    ) -> diesel::QueryResult<usize> {
        purge_unmatched!(conn, schema_sqlite, before, limit)
    }

    pub fn purge_replay_keys(
        conn: &mut Conn,
        before: DateTime<Utc>,
        limit: i64,
    ) -> diesel::QueryResult<usize> {
        use crate::storage::sqlite_time::SqliteTime;
        use diesel::RunQueryDsl;
        use diesel::sql_types::BigInt;
        diesel::sql_query(SQLITE_PURGE_REPLAY_KEYS_SQL)
            .bind::<SqliteTime, _>(before)
            .bind::<BigInt, _>(limit)
            .execute(conn)
    }
}

impl Db {
    /// One retention batch of finished messages last changed before `before`: at most `limit`
    /// messages, with their attempts, receipts and fan-out links, in one transaction.
    pub fn purge_messages(
        &self,
        which: Finished,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<PurgedBatch, StorageError> {
        let limit = i64::from(limit.max(1));
        crate::storage::db_run! { self, write |c, q| Ok(q::purge_messages(c, which, before, limit)?) }
    }

    /// One retention batch of unmatched receipts received before `before`, in one transaction.
    pub fn purge_unmatched_receipts(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<usize, StorageError> {
        let limit = i64::from(limit.max(1));
        crate::storage::db_run! { self, write |c, q| Ok(q::purge_unmatched_receipts(c, before, limit)?) }
    }

    /// One retention batch of replay keys first seen before `before`, in one transaction.
    pub fn purge_replay_keys(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<usize, StorageError> {
        let limit = i64::from(limit.max(1));
        crate::storage::db_run! { self, write |c, q| Ok(q::purge_replay_keys(c, before, limit)?) }
    }
}
