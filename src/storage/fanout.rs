//! `herald_subscriptions` and `herald_fanouts`: fan-out (`destination = "type:EVENT.TYPE"`).
//!
//! A fan-out writes one `herald_outbox` row per subscribed endpoint and one `herald_fanouts` row
//! linking each to the original event id, all in the caller's transaction; an event id already
//! fanned out writes nothing and returns the children it has. The subscriptions are Herald's copy
//! of `[endpoints.NAME] event_types`, replaced at start-up.

use chrono::{DateTime, Utc};
use diesel::Queryable;

use super::models::{NewOutboxRow, OutboxRow};
use super::{Db, StorageError, per_backend};
use crate::domain::InvalidField;

/// One `herald_fanouts` row: a child of the fan-out `event_id`.
#[derive(Debug, Clone, PartialEq, Queryable)]
pub struct FanoutRow {
    pub event_id: String,
    pub endpoint: String,
    pub event_type: String,
    /// The child's own event id, `{event_id}:{endpoint}`.
    pub message_event_id: String,
    pub created_at: DateTime<Utc>,
}

/// A child row to write, as the caller's expansion decided it.
#[derive(Debug, Clone)]
pub struct FanoutChild {
    pub endpoint: String,
    pub event_type: String,
    pub row: NewOutboxRow,
}

/// A fan-out as stored: whether this call created it, and its children with their messages
/// (`None` once retention purged a child's message).
#[derive(Debug, Clone)]
pub struct StoredFanout {
    pub created: bool,
    pub children: Vec<(FanoutRow, Option<OutboxRow>)>,
}

/// The expansion of a fan-out over the stored subscriptions (`(endpoint, pattern)` pairs): the
/// child rows, or why there are none (no subscriber, a child that does not validate).
pub type Expand<'a> =
    &'a dyn Fn(&[(String, String)]) -> Result<Vec<FanoutChild>, Vec<InvalidField>>;

per_backend! {
    use diesel::prelude::*;

    use crate::storage::fanout::{Expand, FanoutRow, StoredFanout};
    use crate::storage::models::OutboxRow;
    use crate::domain::InvalidField;
    use self::schema::herald_subscriptions as s;
    use self::schema::herald_fanouts as f;
    use self::schema::herald_outbox as o;

    /// Every `(endpoint, pattern)` subscription.
    pub fn load_subscriptions(conn: &mut Conn) -> QueryResult<Vec<(String, String)>> {
        s::table
            .select((s::endpoint, s::pattern))
            .order((s::endpoint, s::pattern))
            .load(conn)
    }

    /// Replaces every subscription with `subs` (in the caller's transaction).
    pub fn replace_subscriptions(conn: &mut Conn, subs: &[(String, String)]) -> QueryResult<()> {
        diesel::delete(s::table).execute(conn)?;
        for (endpoint, pattern) in subs {
            diesel::insert_into(s::table)
                .values((s::endpoint.eq(endpoint), s::pattern.eq(pattern)))
                .on_conflict_do_nothing()
                .execute(conn)?;
        }
        Ok(())
    }

    /// The children of the fan-out `event_id`, by endpoint name, with their messages.
    pub fn fanout_of(
        conn: &mut Conn,
        event_id: &str,
    ) -> QueryResult<Vec<(FanoutRow, Option<OutboxRow>)>> {
        let rows: Vec<FanoutRow> = f::table
            .filter(f::event_id.eq(event_id))
            .order(f::endpoint)
            .load(conn)?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = rows.iter().map(|r| r.message_event_id.as_str()).collect();
        let messages: Vec<OutboxRow> = o::table.filter(o::event_id.eq_any(&ids)).load(conn)?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let m = messages.iter().find(|m| m.event_id == r.message_event_id).cloned();
                (r, m)
            })
            .collect())
    }

    /// Writes the fan-out `event_id` unless it exists: `expand` turns the stored subscriptions
    /// into child rows (or refuses); each child and its link are inserted, a child whose event id
    /// exists already is left as it is. `Ok(Err(…))`: refused, nothing written.
    pub fn enqueue_fanout(
        conn: &mut Conn,
        event_id: &str,
        expand: Expand<'_>,
    ) -> QueryResult<Result<StoredFanout, Vec<InvalidField>>> {
        let existing = fanout_of(conn, event_id)?;
        if !existing.is_empty() {
            return Ok(Ok(StoredFanout { created: false, children: existing }));
        }
        let subs = load_subscriptions(conn)?;
        let children = match expand(&subs) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        // One logical outcome per event id: the fan-out's own id must not be a plain message's,
        // and no child's id may be taken — refused, nothing written.
        let plain: i64 = o::table.filter(o::event_id.eq(event_id)).count().get_result(conn)?;
        if plain > 0 {
            return Ok(Err(vec![InvalidField::new(
                "event_id",
                "is already the event id of a message that is not a fan-out",
            )]));
        }
        let ids: Vec<&str> = children.iter().map(|c| c.row.event_id.as_str()).collect();
        let taken: Vec<String> = o::table
            .filter(o::event_id.eq_any(&ids))
            .select(o::event_id)
            .load(conn)?;
        if let Some(t) = taken.first() {
            return Ok(Err(vec![InvalidField::new(
                "event_id",
                format!("the fan-out child event id {t:?} is already taken by another message"),
            )]));
        }
        let mut created = false;
        for (i, c) in children.iter().enumerate() {
            if q::insert_message(conn, &c.row)?.is_none() {
                // Taken between the check and the insert by a concurrent writer, whose commit the
                // insert waited for. The same fan-out written by a retry of this very request
                // (nothing of ours is written yet: it takes its first child first): that one
                // stands, as when it came first.
                if i == 0 {
                    let existing = fanout_of(conn, event_id)?;
                    if !existing.is_empty() {
                        return Ok(Ok(StoredFanout { created: false, children: existing }));
                    }
                }
                // Anything else: undo it all.
                return Err(diesel::result::Error::RollbackTransaction);
            }
            let n = diesel::insert_into(f::table)
                .values((
                    f::event_id.eq(event_id),
                    f::endpoint.eq(&c.endpoint),
                    f::event_type.eq(&c.event_type),
                    f::message_event_id.eq(&c.row.event_id),
                    f::created_at.eq(c.row.now),
                ))
                .on_conflict_do_nothing()
                .execute(conn)?;
            created |= n == 1;
        }
        Ok(Ok(StoredFanout { created, children: fanout_of(conn, event_id)? }))
    }
}

impl Db {
    /// Replaces the stored subscriptions with `subs` (start-up), in one transaction.
    pub fn sync_subscriptions(&self, subs: &[(String, String)]) -> Result<(), StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::replace_subscriptions(c, subs)?) }
    }

    pub fn subscriptions(&self) -> Result<Vec<(String, String)>, StorageError> {
        crate::storage::db_run! { self, read |c, q| Ok(q::load_subscriptions(c)?) }
    }

    /// The fan-out `event_id` and its children, in one transaction (see
    /// [`queries::pg::enqueue_fanout`](super::queries::pg::enqueue_fanout)).
    pub fn enqueue_fanout(
        &self,
        event_id: &str,
        expand: Expand<'_>,
    ) -> Result<Result<StoredFanout, Vec<InvalidField>>, StorageError> {
        crate::storage::db_run! { self, write |c, q| {
            q::lock_event_id(c, event_id)?;
            Ok(q::enqueue_fanout(c, event_id, expand)?)
        } }
    }

    /// The children of the fan-out `event_id`; empty when it is not a fan-out.
    pub fn fanout_of(
        &self,
        event_id: &str,
    ) -> Result<Vec<(FanoutRow, Option<OutboxRow>)>, StorageError> {
        if event_id.contains('\0') {
            return Ok(Vec::new());
        }
        crate::storage::db_run! { self, read |c, q| Ok(q::fanout_of(c, event_id)?) }
    }

    /// The messages of the fan-out `event_id` that retention has not purged, by endpoint;
    /// empty when it is not a fan-out.
    pub fn fanout_messages(&self, event_id: &str) -> Result<Vec<OutboxRow>, StorageError> {
        Ok(self
            .fanout_of(event_id)?
            .into_iter()
            .filter_map(|(_, m)| m)
            .collect())
    }
}
