//! Ordered delivery's bookkeeping (README, "Ordered delivery"). A keyed message waits
//! (`scheduled`, `next_attempt_at` NULL: outside the due index) while an earlier place of its key
//! is open; a key's head is its first open place that still counts — not a dead or unconfirmed
//! message released by the `skip` policy or an explicit skip. Whenever a head ends, the next place
//! becomes due ([`release_heads`]); the watchdog's pass over every waiting key
//! ([`release_waiting`]) catches what a race left waiting. Releasing is idempotent: it only ever
//! makes a key's head due, and the claim's own gate (`sql::key_head!`) is what keeps order.

use super::models::{Now, OutboxRow};
use super::{Db, StorageError, per_backend};

/// What an explicit skip did.
#[derive(Debug, Clone, PartialEq)]
pub enum SkipWrite {
    /// The head was released; `due` are the messages of its key that became due.
    Done {
        row: Box<OutboxRow>,
        due: usize,
    },
    /// Nothing to skip: not keyed, not dead or unconfirmed, or already released.
    NotBlocking(Box<OutboxRow>),
    NotFound,
}

per_backend! {
    use chrono::{DateTime, Utc};
    use diesel::dsl::sql;
    use diesel::prelude::*;
    use diesel::sql_types::Bool;

    use crate::domain::State;
    use crate::storage::models::*;
    use super::SkipWrite;
    use self::schema::herald_outbox as o;

    /// The predicate of `herald_outbox_ordering_open`, as literal SQL (so the planner matches
    /// the partial index), and "still counts" (not a released dead head).
    fn open_counting() -> diesel::expression::SqlLiteral<Bool> {
        sql::<Bool>(
            "ordering_key IS NOT NULL \
             AND state IN ('scheduled', 'retryable', 'sending', 'dead_letter', 'unconfirmed') \
             AND (state IN ('scheduled', 'retryable', 'sending') OR ordering_released_at IS NULL)",
        )
    }

    /// Makes the heads of the keys of `ids` due where they wait and no message of the key is in
    /// flight; returns how many.
    pub fn release_heads(conn: &mut Conn, ids: &[i64]) -> QueryResult<usize> {
        if ids.is_empty() {
            return Ok(0);
        }
        Ok(sql::release_heads(conn, crate::storage::sql::Heads::Of(ids))?.len())
    }

    /// [`release_heads`] in the transaction of the outcomes that ended `ids` (each its key's one
    /// message in flight): without the check for another in flight.
    pub fn release_ended_heads(conn: &mut Conn, ids: &[i64]) -> QueryResult<usize> {
        if ids.is_empty() {
            return Ok(0);
        }
        Ok(sql::release_heads(conn, crate::storage::sql::Heads::Ended(ids))?.len())
    }

    /// [`release_heads`] over every key with a waiting message. Kept to its indexes like the
    /// claim: a statement without parameters keeps its first plan until the table is analyzed.
    pub fn release_waiting(conn: &mut Conn) -> QueryResult<usize> {
        sql::keep_to_indexes(conn)?;
        Ok(sql::release_heads(conn, crate::storage::sql::Heads::Waiting)?.len())
    }

    /// Dead or unconfirmed messages of `ids` stop holding their keys (the `skip` policy).
    pub fn mark_released(conn: &mut Conn, at: DateTime<Utc>, ids: &[i64]) -> QueryResult<usize> {
        if ids.is_empty() {
            return Ok(0);
        }
        diesel::update(
            o::table
                .filter(o::id.eq_any(ids))
                .filter(o::ordering_key.is_not_null())
                .filter(o::state.eq_any([State::DeadLetter, State::Unconfirmed]))
                .filter(o::ordering_released_at.is_null()),
        )
        .set(o::ordering_released_at.eq(Some(at)))
        .execute(conn)
    }

    /// The head of a key: its first open place that still counts.
    pub fn key_head(conn: &mut Conn, key: &str, destination: &str) -> QueryResult<Option<OutboxRow>> {
        o::table
            .filter(o::ordering_key.eq(key))
            .filter(o::destination.eq(destination))
            .filter(open_counting())
            .order(o::ordering_seq)
            .first(conn)
            .optional()
    }

    /// The place just before `seq` in a key: the message a keyed message waited behind.
    pub fn key_predecessor(conn: &mut Conn, key: &str, destination: &str, seq: i64) -> QueryResult<Option<OutboxRow>> {
        o::table
            .filter(o::ordering_key.eq(key))
            .filter(o::destination.eq(destination))
            .filter(o::ordering_seq.lt(seq))
            .order(o::ordering_seq.desc())
            .first(conn)
            .optional()
    }

    /// Keys held by a dead or unconfirmed head that was not released.
    pub fn blocked_keys(conn: &mut Conn) -> QueryResult<i64> {
        let keys: Vec<(Option<String>, String)> = o::table
            .filter(sql::<Bool>(
                "ordering_key IS NOT NULL AND state IN ('dead_letter', 'unconfirmed') \
                 AND ordering_released_at IS NULL",
            ))
            .select((o::ordering_key, o::destination))
            .distinct()
            .load(conn)?;
        Ok(keys.len() as i64)
    }

    /// A replayed keyed message takes its place in its key again: it waits when another message
    /// of the key is in flight, or an earlier place is still open, or another transaction holds
    /// a message of the key right now (on PostgreSQL: a claim not yet committed, which would put
    /// it in flight; the release after that message's outcome, or the periodic one, lets it go);
    /// else it is due now. Not when
    /// a later one is merely due or waiting for a retry: the claim takes a key's places in order,
    /// so that one waits for the replayed message anyway, and the replayed one waiting too held
    /// the key still until the periodic release. On PostgreSQL it first takes the key's insert
    /// lock, never waiting for it: where another transaction holds it (an insert into the key
    /// still open), the message waits too ([`sql::key_lock_busy`]).
    pub fn rejoin(conn: &mut Conn, id: i64) -> QueryResult<()> {
        let Some(row) = o::table.filter(o::id.eq(id)).first::<OutboxRow>(conn).optional()? else {
            return Ok(());
        };
        let (Some(key), Some(seq)) = (row.ordering_key.as_deref(), row.ordering_seq) else {
            return Ok(());
        };
        // First the key's insert lock, without waiting (`sql::key_lock_busy`): held, no insert
        // into the key is open, and any that comes next waits for this transaction.
        let busy = sql::key_lock_busy(conn, key, &row.destination)?
            || sql::key_rows_busy(conn, key, &row.destination, id)?;
        let others = o::table
            .filter(o::ordering_key.eq(key))
            .filter(o::destination.eq(&row.destination))
            .filter(o::id.ne(id))
            .filter(open_counting());
        let in_flight: i64 = others
            .filter(o::state.eq(State::Sending))
            .count()
            .get_result(conn)?;
        let earlier: i64 = o::table
            .filter(o::ordering_key.eq(key))
            .filter(o::destination.eq(&row.destination))
            .filter(o::ordering_seq.lt(seq))
            .filter(open_counting())
            .count()
            .get_result(conn)?;
        if busy || in_flight > 0 || earlier > 0 {
            diesel::update(o::table.filter(o::id.eq(id)).filter(o::state.eq(State::Scheduled)))
                .set(o::next_attempt_at.eq(None::<DateTime<Utc>>))
                .execute(conn)?;
        }
        Ok(())
    }

    /// An explicit skip: a dead or unconfirmed head stops holding its key, and the next place
    /// becomes due. The message itself stays as it is (it can still be replayed).
    pub fn skip(
        conn: &mut Conn,
        now: &Now,
        event_id: &str,
        who: &str,
        reason: &str,
    ) -> QueryResult<SkipWrite> {
        use self::schema::herald_skips as sk;
        let at = sql::now(conn, now)?;
        let Some(row) = o::table.filter(o::event_id.eq(event_id)).first::<OutboxRow>(conn).optional()? else {
            return Ok(SkipWrite::NotFound);
        };
        if mark_released(conn, at, &[row.id])? == 0 {
            return Ok(SkipWrite::NotBlocking(Box::new(row)));
        }
        // Audited in the same transaction, as a replay is.
        diesel::insert_into(sk::table)
            .values((
                sk::message_id.eq(row.id),
                sk::who.eq(who),
                sk::reason.eq(reason),
                sk::from_state.eq(row.state),
                sk::skipped_at.eq(at),
            ))
            .execute(conn)?;
        let due = release_heads(conn, &[row.id])?;
        let row = o::table.filter(o::id.eq(row.id)).first::<OutboxRow>(conn)?;
        Ok(SkipWrite::Done { row: Box::new(row), due })
    }

    pub fn skips_of(conn: &mut Conn, message_id: i64) -> QueryResult<Vec<SkipRow>> {
        use self::schema::herald_skips as sk;
        sk::table
            .filter(sk::message_id.eq(message_id))
            .order(sk::id)
            .load(conn)
    }
}

impl Db {
    /// The watchdog's pass over every key with a waiting message: heads that nothing released
    /// (a message committed at the instant its key's head ended; a head removed by retention)
    /// become due. Returns how many.
    pub fn release_waiting(&self) -> Result<usize, StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::release_waiting(c)?) }
    }

    /// The head of a message's key (`None` for an unkeyed message or a key with nothing open).
    pub fn key_head(&self, row: &OutboxRow) -> Result<Option<OutboxRow>, StorageError> {
        let Some(key) = row.ordering_key.as_deref() else {
            return Ok(None);
        };
        crate::storage::db_run! { self, read |c, q| Ok(q::key_head(c, key, &row.destination)?) }
    }

    /// The message just before this one in its key (`None` for an unkeyed message, or the key's
    /// first place).
    pub fn key_predecessor(&self, row: &OutboxRow) -> Result<Option<OutboxRow>, StorageError> {
        let (Some(key), Some(seq)) = (row.ordering_key.as_deref(), row.ordering_seq) else {
            return Ok(None);
        };
        crate::storage::db_run! { self, read |c, q| Ok(q::key_predecessor(c, key, &row.destination, seq)?) }
    }

    /// How many keys a dead or unconfirmed head holds (the `herald_ordering_blocked_keys` gauge).
    pub fn blocked_keys(&self) -> Result<i64, StorageError> {
        crate::storage::db_run! { self, read |c, q| Ok(q::blocked_keys(c)?) }
    }

    /// Releases a blocked key by skipping its dead or unconfirmed head (`event_id`), audited
    /// with `who` and `reason` (`herald_skips`).
    pub fn skip_head(
        &self,
        event_id: &str,
        now: Now,
        who: &str,
        reason: &str,
    ) -> Result<SkipWrite, StorageError> {
        if event_id.contains('\0') {
            return Ok(SkipWrite::NotFound);
        }
        crate::storage::db_run! { self, write |c, q| Ok(q::skip(c, &now, event_id, who, reason)?) }
    }

    /// The explicit skips of message `message_id`, oldest first.
    pub fn skips_of(&self, message_id: i64) -> Result<Vec<super::models::SkipRow>, StorageError> {
        crate::storage::db_run! { self, read |c, q| Ok(q::skips_of(c, message_id)?) }
    }
}

/// Who decides a message is blocked: the head of its key, when that is a dead or unconfirmed
/// message that still holds the key and is not the message itself, and the message still waits
/// to be sent (a canceled or expired one is blocked by nothing). Also an open earlier head
/// (replayed) ahead of a message that was already due (retrying, or released with its due
/// time): that one keeps its due time, which passes while the claim's gate holds it behind the
/// head. (A later place that waits with no due time is not blocked: it is in line.)
pub fn blocked_by<'a>(row: &OutboxRow, head: Option<&'a OutboxRow>) -> Option<&'a OutboxRow> {
    use crate::domain::State;
    let waits = matches!(row.state, State::Scheduled | State::Retryable);
    let due = row.next_attempt_at.is_some();
    head.filter(|h| {
        let dead = matches!(h.state, State::DeadLetter | State::Unconfirmed)
            && h.ordering_released_at.is_none();
        let open_before = !h.state.is_terminal()
            && h.ordering_seq
                .zip(row.ordering_seq)
                .is_some_and(|(h, r)| h < r);
        waits && h.id != row.id && (dead || (due && open_before))
    })
}
