//! Storing one ingest request's receipts, replays refused.
//!
//! Invariant: a request is stored whole or not at all. A receipt whose replay key (a one-time
//! value the signature covers where the body is not: Mailgun's token) was seen with a
//! *different* event of the same source (`herald_replay_keys`, which keeps every key with the
//! event it first came with, a duplicate's too) is a replay: the transaction is rolled back and
//! nothing of the request is stored. The same event again under its own key is a duplicate, a
//! no-op. The check runs after the insert, in the same transaction, so two concurrent requests
//! racing with one key cannot both pass: on PostgreSQL the second insert waits for the first to
//! commit and its check then sees the first's row; SQLite has one writer.

use chrono::{DateTime, Utc};

use super::models::{
    MatchedMessage, NewReceipt, Now, PendingReceipt, ReceiptDecision, ReceiptRow, ReconcilePass,
};
use super::{Db, StorageError, per_backend};

per_backend! {
    use chrono::{DateTime, Utc};
    use diesel::prelude::*;

    use crate::storage::models::*;
    use self::schema::herald_receipt_queue as rq;
    use self::schema::herald_receipts as r;

    /// Stores receipts, ignoring those whose (source, provider_event_id) exists; returns
    /// how many were new.
    pub fn insert_receipts(
        conn: &mut Conn,
        source: &str,
        receipts: &[NewReceipt],
        now: DateTime<Utc>,
    ) -> QueryResult<usize> {
        // In key order: two requests carrying overlapping events (a provider retrying a batch
        // while the first try is still in flight) then wait on each other's rows in the same
        // order and never deadlock (a 40P01 is one of the errors the driver cannot tell apart
        // from a bug).
        let mut rows: Vec<(&str, &NewReceipt, DateTime<Utc>)> =
            receipts.iter().map(|x| (source, x, now)).collect();
        rows.sort_by(|a, b| a.1.provider_event_id.cmp(&b.1.provider_event_id));
        Ok(insert_receipts_returning(conn, &rows)?.len())
    }

    /// Stores the receipts of several requests (each with its source and arrival time),
    /// ignoring those whose (source, provider_event_id) exists; returns the keys that were new.
    /// The caller passes the rows in key order (see [`insert_receipts`] on deadlocks); a key
    /// given twice is stored once, and returned once. Kept
    /// prepared: on PostgreSQL one `unnest` insert, on SQLite one insert per row (see
    /// `sql::insert_receipts_returning`).
    pub fn insert_receipts_returning(
        conn: &mut Conn,
        rows: &[(&str, &NewReceipt, DateTime<Utc>)],
    ) -> QueryResult<Vec<(String, String)>> {
        sql::insert_receipts_returning(conn, rows)
    }

    /// A message's receipts, in event-time order (the history).
    pub fn receipts_of_message(conn: &mut Conn, message_id: i64) -> QueryResult<Vec<ReceiptRow>> {
        r::table
            .filter(r::message_id.eq(message_id))
            // Receipts without an event time first, on both backends (as `judge` orders them).
            .order((r::event_time.is_not_null(), r::event_time.asc(), r::id.asc()))
            .load(conn)
    }

    /// One reconciler pass over up to `limit` receipts of the queue that are due (a new one at
    /// once, an unmatched one at its next try), locked so that several reconcilers never take
    /// the same one. Each is matched to its message — by Herald's event id, else by the provider's
    /// message id — and, in event-time order, `decide`d against the message as it is now (its
    /// row locked; a message another reconciler holds is left for the next pass, never waited
    /// for, so two reconcilers cannot deadlock). Unmatched receipts are tried again later with
    /// backoff. Returns what the pass did; committed with everything it decided.
    pub fn reconcile(
        conn: &mut Conn,
        now: &Now,
        limit: i64,
        message_id_domain: &str,
        rules: crate::storage::models::MatchRules<'_>,
        decide: &dyn Fn(&PendingReceipt, &MatchedMessage) -> ReceiptDecision,
    ) -> QueryResult<ReconcilePass> {
        use std::collections::HashMap;

        use crate::domain::{AttemptClass, Channel, State};
        use self::schema::herald_outbox as o;
        sql::keep_to_indexes(conn)?;
        let at = sql::now(conn, now)?;
        let mut batch = sql::pending_receipts(conn, at, limit)?;
        batch.sort_by_key(|a| (crate::reconcile::ordering_time(a.event_time, a.received_at), a.id));
        // Correlation for the whole batch at once: by Herald's event id, else by Herald's own
        // email Message-ID, else by the provider's message id (the newest message carrying it),
        // each only among the messages the receipt's source may speak for (`may_match`: a
        // source's `matches`).
        type Found = (i64, Channel, String);
        let allowed = |r: &PendingReceipt, f: &Found| (rules.may_match)(&r.source, f.1, &f.2);
        let provider_first = |r: &PendingReceipt| (rules.provider_id_first)(&r.source);
        let event_ids: Vec<&str> = batch.iter().filter_map(|r| r.herald_event_id.as_deref()).collect();
        let by_event: HashMap<String, Found> = o::table
            .filter(o::event_id.eq_any(&event_ids))
            .select((o::event_id, o::id, o::channel, o::destination))
            .load::<(String, i64, Channel, String)>(conn)?
            .into_iter()
            .map(|(e, id, ch, d)| (e, (id, ch, d)))
            .collect();
        let of_event = |r: &PendingReceipt| {
            r.herald_event_id
                .as_ref()
                .and_then(|e| by_event.get(e))
                .filter(|f| allowed(r, f))
        };
        let unresolved = |r: &&PendingReceipt| of_event(r).is_none();
        let key_of = |r: &PendingReceipt| {
            r.provider_message_id
                .as_deref()
                .and_then(|p| crate::domain::parse_email_message_key(p, message_id_domain))
        };
        let keys: Vec<String> = batch.iter().filter(unresolved).filter_map(key_of).collect();
        let mut by_key: HashMap<String, Found> = HashMap::new();
        if !keys.is_empty() {
            let found: Vec<(Option<String>, i64, Channel, String)> = o::table
                .filter(o::message_key.eq_any(&keys))
                .select((o::message_key, o::id, o::channel, o::destination))
                .load(conn)?;
            by_key.extend(found.into_iter().filter_map(|(k, id, ch, d)| k.map(|k| (k, (id, ch, d)))));
        }
        let of_key = |r: &PendingReceipt| {
            key_of(r)
                .and_then(|k| by_key.get(&k))
                .filter(|f| allowed(r, f))
        };
        // With and without angle brackets: a Message-ID is quoted either way (Mailgun's API
        // answers `<id@domain>`, its receipts carry `id@domain`).
        let bare = |p: &str| crate::storage::receipts::bare_message_id(p).to_owned();
        // Every receipt's, also one its event id names: whether the message carries that id
        // now, or a replay replaced it (below), says which of its sends the receipt speaks of.
        let provider_ids: Vec<String> = batch
            .iter()
            .filter_map(|r| r.provider_message_id.as_deref())
            .flat_map(|p| [bare(p), format!("<{}>", bare(p))])
            .collect();
        // Each with its creation time (`holder_of`).
        let mut by_provider: HashMap<String, Vec<(Found, DateTime<Utc>)>> = HashMap::new();
        if !provider_ids.is_empty() {
            // In id order: the newest message carrying an id wins (short provider ids, such as
            // an SMTP queue id, can come round again), among those not created after the event.
            type Holder = (Option<String>, i64, Channel, String, DateTime<Utc>);
            let found: Vec<Holder> = o::table
                .filter(o::provider_message_id.eq_any(&provider_ids))
                .select((o::provider_message_id, o::id, o::channel, o::destination, o::created_at))
                .order(o::id.asc())
                .load(conn)?;
            for (p, id, ch, d, created) in found {
                if let Some(p) = p {
                    by_provider.entry(bare(&p)).or_default().push(((id, ch, d), created));
                }
            }
        }
        // An id may also be that of a send before a replay, which the new send wrote over (a
        // late bounce of the first send): each replay kept the id it replaced. Tried after the
        // messages that carry the id now (newest replay first), for every id, so that a current
        // holder the source may not speak for does not hide it; such a receipt is history of
        // the earlier send whatever its event time (below).
        let mut replaced: HashMap<String, Vec<(Found, DateTime<Utc>)>> = HashMap::new();
        if !provider_ids.is_empty() {
            use self::schema::herald_replays as rp;
            // The replaced id, the replay's time, and the message as `Found` has it.
            type ReplacedRow = (Option<String>, DateTime<Utc>, i64, Channel, String);
            let found: Vec<ReplacedRow> = rp::table
                .inner_join(o::table.on(o::id.eq(rp::message_id)))
                .filter(rp::provider_message_id_before.eq_any(&provider_ids))
                .select((rp::provider_message_id_before, rp::replayed_at, o::id, o::channel, o::destination))
                .order(rp::id.asc())
                .load(conn)?;
            for (p, at, id, ch, d) in found {
                if let Some(p) = p {
                    replaced.entry(bare(&p)).or_default().push(((id, ch, d), at));
                }
            }
        }
        // The messages carrying the receipt's provider id now, each with its creation time.
        let holders = |r: &PendingReceipt| r.provider_message_id.as_ref().and_then(|p| by_provider.get(&bare(p)));
        let of_provider = |r: &PendingReceipt| {
            holders(r).and_then(|found| crate::storage::receipts::holder_of(found, r.event_time, |f| allowed(r, f)))
        };
        // The newest carrying the id that its source may speak for, whenever created (as for a
        // receipt without an event time): for one whose event is older than all of them (a
        // clock far off), once nothing else names its message.
        let of_provider_newest = |r: &PendingReceipt| {
            holders(r).and_then(|found| crate::storage::receipts::holder_of(found, None, |f| allowed(r, f)))
        };
        // The replay whose replaced id names the receipt's message, when nothing else does.
        let of_replaced = |r: &PendingReceipt| {
            r.provider_message_id
                .as_ref()
                .and_then(|p| replaced.get(&bare(p)))
                .and_then(|found| found.iter().rev().find(|(f, _)| allowed(r, f)))
        };
        let target = |r: &PendingReceipt| -> Option<(i64, Option<DateTime<Utc>>)> {
            let current = if provider_first(r) {
                of_provider(r).or_else(|| of_event(r)).or_else(|| of_key(r))
            } else {
                of_event(r).or_else(|| of_key(r)).or_else(|| of_provider(r))
            };
            match current {
                // Named by its event id (or Message-ID), but with a provider id the message no
                // longer carries and a replay replaced: a receipt of the send before that
                // replay (SendGrid's, Mailgun's, Postmark's carry both ids).
                Some(f) => {
                    let earlier = r.provider_message_id.as_deref().and_then(|p| {
                        let p = bare(p);
                        let carried = by_provider.get(&p).is_some_and(|v| v.iter().any(|x| x.0.0 == f.0));
                        if carried {
                            return None;
                        }
                        replaced.get(&p)?.iter().rev().find(|(x, _)| x.0 == f.0).map(|(_, at)| *at)
                    });
                    Some((f.0, earlier))
                }
                None => of_replaced(r)
                    .map(|(f, at)| (f.0, Some(*at)))
                    .or_else(|| of_provider_newest(r).map(|f| (f.0, None))),
            }
        };
        // A message its ids name, but not one its source may speak for (`matches`): for good
        // when an id Herald wrote names it (its event id, unless that is only an echoed
        // reference; its email Message-ID); by a provider id or a reference, the message it
        // speaks of may still be written (a report faster than the send's outcome), so it is
        // tried again as any unmatched one.
        let named_for_good = |r: &PendingReceipt| {
            (!provider_first(r)
                && r.herald_event_id.as_ref().is_some_and(|e| by_event.contains_key(e)))
                || key_of(r).is_some_and(|k| by_key.contains_key(&k))
        };

        let ids: Vec<i64> = batch.iter().filter_map(|r| target(r).map(|t| t.0)).collect();
        // Held by another reconciler right now: not in the map, its receipts wait for the
        // next pass (never waited for, so two reconcilers cannot deadlock).
        let mut messages: HashMap<i64, MatchedMessage> = sql::lock_messages(conn, &ids)?
            .into_iter()
            .map(|m| (m.id, m))
            .collect();
        let mut changed: Vec<i64> = Vec::new();
        let mut settled: Vec<i64> = Vec::new();
        let mut done: Vec<Reconciled> = Vec::with_capacity(batch.len());
        let mut unmatched: Vec<Unmatched> = Vec::new();
        let mut pass = ReconcilePass::default();
        for receipt in &batch {
            let Some((id, replaced_at)) = target(receipt) else {
                // Tried again with growing waits for a day after it arrived, the last try at
                // its day's end ([`next_unmatched_try`]); then it stays listed (and counted)
                // as unmatched, no longer tried. One that names no message at all can never
                // match one: no more tries.
                let tries = receipt.match_attempts.saturating_add(1);
                let (next, reason) = if !crate::storage::receipts::names_a_message(receipt) {
                    (None, crate::storage::receipts::NAMES_NO_MESSAGE)
                } else if named_for_good(receipt) {
                    (None, crate::storage::receipts::NOT_ITS_MESSAGE)
                } else {
                    match crate::storage::receipts::next_unmatched_try(receipt.received_at, at, tries) {
                        Some(next) => (Some(next), crate::storage::receipts::STILL_UNMATCHED),
                        None => (None, "no message with its event id or provider message id within a day: no longer tried"),
                    }
                };
                unmatched.push(Unmatched { receipt_id: receipt.id, tries, next, reason });
                pass.unmatched += 1;
                continue;
            };
            let Some(message) = messages.get_mut(&id) else {
                continue;
            };
            // Named only by the id of a send before a replay: that send's, whatever its time.
            let d = match replaced_at {
                Some(at) => ReceiptDecision {
                    outcome: "superseded",
                    reason: format!(
                        "of a send before the replay at {}, named by the provider message id that send had: kept in the history",
                        at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                    ),
                    new_status: None,
                    settle: false,
                    enqueue: Vec::new(),
                },
                None => decide(receipt, message),
            };
            if let Some((status, status_at)) = &d.new_status {
                message.delivery_status = Some(status.clone());
                message.delivery_status_at = *status_at;
                pass.status_changes += 1;
                changed.push(id);
            }
            if d.settle {
                message.state = State::Delivered;
                pass.settled += 1;
                settled.push(id);
                changed.push(id);
            }
            for m in &d.enqueue {
                q::insert_message(conn, m)?;
            }
            done.push(Reconciled {
                receipt_id: receipt.id,
                message_id: id,
                outcome: d.outcome,
                reason: d.reason,
            });
            pass.matched += 1;
        }
        sql::mark_reconciled(conn, at, &done)?;
        sql::mark_unmatched(conn, &unmatched)?;
        // Each changed message written once, with what the whole batch made of it.
        changed.sort_unstable();
        changed.dedup();
        let statuses: Vec<&MatchedMessage> = changed.iter().map(|id| &messages[id]).collect();
        sql::write_statuses(conn, &statuses)?;
        // Only the messages this pass settled (it found them `unconfirmed`, or dead-lettered by
        // the deadline after their proof was stored): a receipt for a message that was
        // `delivered` already has nothing to settle, and no key to release.
        for &id in &settled {
            let was = messages[&id].state_reason.as_deref();
            diesel::update(
                o::table
                    .filter(o::id.eq(id))
                    .filter(o::state.eq_any([State::Unconfirmed, State::DeadLetter])),
            )
            .set((
                o::state.eq(State::Delivered),
                o::last_error_class.eq(None::<AttemptClass>),
                // The dead letter's reason goes with it.
                o::state_reason.eq(was.filter(|r| *r != UNCONFIRMED_DEADLINE_REASON)),
                o::updated_at.eq(at),
            ))
            .execute(conn)?;
        }
        // A settled head of an ordering key no longer holds it.
        q::release_heads(conn, &settled)?;
        Ok(pass)
    }

    /// `unconfirmed` messages: those with a stored receipt of an `accepting` type that arrived
    /// after their last replay, if any (one that arrived while the message was still `sending`,
    /// say) become `delivered`; those that no
    /// receipt settled within `deadline` move to `dead_letter` with
    /// `state_reason = 'unconfirmed'`, for a person to decide. Returns (settled, expired).
    pub fn settle_or_expire_unconfirmed(
        conn: &mut Conn,
        now: &Now,
        deadline: std::time::Duration,
        accepting: &[&str],
    ) -> QueryResult<(usize, usize)> {
        use crate::domain::{AttemptClass, State};
        use diesel::dsl::exists;
        use self::schema::herald_outbox as o;
        sql::keep_to_indexes(conn)?;
        let at = sql::now(conn, now)?;
        use self::schema::herald_replays as rp;
        use self::schema::herald_attempts as a;
        // Only a receipt that arrived after the message's last replay, of an event no older
        // than it, speaks for the send that made it `unconfirmed`: one of an earlier series (a
        // force-replayed `delivered`, an earlier send's receipt arriving late) says nothing
        // about the new one ([`MatchedMessage::replayed_after`]).
        let proven = exists(
            r::table
                .filter(r::message_id.eq(o::id.nullable()))
                .filter(r::event_type.eq_any(accepting))
                .filter(diesel::dsl::not(exists(
                    rp::table
                        .filter(rp::message_id.eq(o::id))
                        .filter(rp::replayed_at.gt(r::received_at)),
                )))
                .filter(diesel::dsl::not(exists(
                    rp::table
                        .filter(rp::message_id.eq(o::id))
                        .filter(diesel::dsl::sql::<diesel::sql_types::Bool>(
                            sql::REPLAY_AFTER_EVENT,
                        )),
                )))
                // Judged of no send when it was reconciled (no request had begun then): that
                // judgement stands, whatever request began within the clocks' slack after.
                // (One not reconciled yet has no outcome, and counts.)
                .filter(r::outcome.is_null().or(r::outcome.ne(crate::storage::receipts::NO_SEND)))
                // Stored once a request of this series that may have left had begun (while it
                // was still being sent, say), not before: that one speaks of no send of it.
                .filter(exists(
                    a::table
                        .filter(a::message_id.eq(o::id))
                        .filter(a::attempt_number.gt(o::attempt_base))
                        .filter(a::class.ne(AttemptClass::NotSent))
                        .filter(diesel::dsl::sql::<diesel::sql_types::Bool>(
                            sql::ATTEMPT_BEFORE_RECEIPT,
                        )),
                )),
        );
        let settled: Vec<i64> = diesel::update(
            o::table
                .filter(o::state.eq(State::Unconfirmed))
                .filter(proven),
        )
        .set((
            o::state.eq(State::Delivered),
            o::last_error_class.eq(None::<AttemptClass>),
            o::updated_at.eq(at),
        ))
        .returning(o::id)
        .get_results(conn)?;
        q::release_heads(conn, &settled)?;
        let settled = settled.len();
        let before = at - chrono::Duration::from_std(deadline).unwrap_or(chrono::Duration::MAX);
        let expired = diesel::update(
            o::table
                .filter(o::state.eq(State::Unconfirmed))
                .filter(o::updated_at.lt(before)),
        )
        .set((
            o::state.eq(State::DeadLetter),
            o::state_reason.eq(Some(UNCONFIRMED_DEADLINE_REASON)),
            o::updated_at.eq(at),
        ))
        .execute(conn)?;
        Ok((settled, expired))
    }

    /// Receipts no message has claimed yet — still tried (in the queue after a try that found
    /// nothing) or no longer tried (`outcome = 'unmatched'`) — how many, and the oldest `limit`
    /// of them after the receipt id `after`, as [`with_queue`] shows them, and whether more
    /// follow. Read in one snapshot: a receipt given up between the two lists' reads was in
    /// neither, and a page skipped it (a review).
    pub fn unmatched_receipts(
        conn: &mut Conn,
        after: i64,
        limit: i64,
    ) -> QueryResult<(i64, Vec<ReceiptRow>, bool)> {
        conn.transaction(|conn| {
            if !sql::SNAPSHOT_READ.is_empty() {
                diesel::sql_query(sql::SNAPSHOT_READ).execute(conn)?;
            }
            unmatched_page(conn, after, limit)
        })
    }

    fn unmatched_page(
        conn: &mut Conn,
        after: i64,
        limit: i64,
    ) -> QueryResult<(i64, Vec<ReceiptRow>, bool)> {
        let count = unmatched_count(conn)?;
        // One more of each list than the page: whether any follows.
        let mut ids: Vec<i64> = given_up().filter(r::id.gt(after)).select(r::id).order(r::id).limit(limit + 1).load(conn)?;
        ids.extend(
            still_tried()
                .filter(rq::receipt_id.gt(after))
                .select(rq::receipt_id)
                .order(rq::receipt_id)
                .limit(limit + 1)
                .load::<i64>(conn)?,
        );
        ids.sort_unstable();
        let limit = usize::try_from(limit).unwrap_or(0);
        let more = ids.len() > limit;
        ids.truncate(limit);
        let rows = r::table.filter(r::id.eq_any(&ids)).order(r::id).load(conn)?;
        Ok((count, with_queue(conn, rows)?, more))
    }

    /// How many receipts match no message yet: still tried, or no longer
    /// (`herald_receipts_unmatched_age`).
    pub fn unmatched_count(conn: &mut Conn) -> QueryResult<i64> {
        let given_up: i64 = given_up().count().get_result(conn)?;
        let still_tried: i64 = still_tried().count().get_result(conn)?;
        Ok(given_up + still_tried)
    }

    /// Receipts no longer tried that matched no message.
    fn given_up() -> r::BoxedQuery<'static, <Conn as diesel::Connection>::Backend> {
        r::table
            .filter(r::message_id.is_null())
            .filter(r::outcome.eq("unmatched"))
            .filter(r::reconciled_at.is_null())
            .into_boxed()
    }

    /// Receipts on the queue after a try that found no message.
    fn still_tried() -> rq::BoxedQuery<'static, <Conn as diesel::Connection>::Backend> {
        rq::table.filter(rq::tries.gt(0)).into_boxed()
    }

    /// `rows` as a person reads them: a receipt still in the reconciler's queue after a try
    /// that found no message says `unmatched`, how often it was tried and when it is tried next
    /// (its own row says nothing until it leaves the queue).
    pub fn with_queue(conn: &mut Conn, mut rows: Vec<ReceiptRow>) -> QueryResult<Vec<ReceiptRow>> {
        let waiting: Vec<i64> = rows.iter().filter(|x| x.outcome.is_none()).map(|x| x.id).collect();
        if waiting.is_empty() {
            return Ok(rows);
        }
        let queued: std::collections::HashMap<i64, (i32, DateTime<Utc>)> = rq::table
            .filter(rq::receipt_id.eq_any(&waiting))
            .filter(rq::tries.gt(0))
            .select((rq::receipt_id, (rq::tries, rq::due_at)))
            .load(conn)?
            .into_iter()
            .collect();
        for x in &mut rows {
            if let Some((tries, due)) = queued.get(&x.id) {
                x.outcome = Some("unmatched".into());
                x.outcome_reason = Some(crate::storage::receipts::STILL_UNMATCHED.into());
                x.match_attempts = *tries;
                x.next_match_at = Some(*due);
            }
        }
        Ok(rows)
    }

    pub fn receipts_of_source(
        conn: &mut Conn,
        source: &str,
    ) -> QueryResult<Vec<ReceiptRow>> {
        let rows = r::table
            .filter(r::source.eq(source))
            .order(r::id)
            .load(conn)?;
        with_queue(conn, rows)
    }
}

/// Why a receipt that is still tried matches no message (shown while it waits in the queue).
pub(crate) const STILL_UNMATCHED: &str = "no message with its event id or provider message id yet";

/// The outcome of a receipt of no send of its message: no request of it had begun when it
/// arrived. The settle pass does not count it as proof for a request that began later.
pub const NO_SEND: &str = "no_send";

/// Why a receipt whose Herald-written id (its event id, its email Message-ID) names a message its
/// source may not speak for (`matches`) is not tried again: no try would change whose it is.
pub(crate) const NOT_ITS_MESSAGE: &str = "the message it names is not one its source may speak for (the source's matches): not tried again";

/// Why a receipt that carries neither Herald's event id nor a provider message id is not tried
/// again: nothing in it can ever match a message (a provider's event about something Herald did
/// not send, or a source whose events carry no id where Herald looks for one).
pub(crate) const NAMES_NO_MESSAGE: &str =
    "it carries no event id and no provider message id to match a message by: not tried again";

/// Whether `r` carries an id a message could be found by: Herald's event id, or a provider
/// message id (which also holds Herald's own email `Message-ID`). An empty one names nothing.
pub(crate) fn names_a_message(r: &PendingReceipt) -> bool {
    let named = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.is_empty());
    named(&r.herald_event_id) || named(&r.provider_message_id)
}

/// A message id without the angle brackets it may be quoted in (Mailgun's API answers
/// `<id@domain>`, its receipts carry `id@domain`), or the spaces around it.
pub(crate) fn bare_message_id(p: &str) -> &str {
    p.trim().trim_start_matches('<').trim_end_matches('>')
}

/// Which of the messages carrying a receipt's provider id (oldest first, each with its creation
/// time) the receipt speaks of: the newest its source may speak for (`allowed`) that was already
/// there when the receipt's event happened — created at most [`CREATED_SLACK`] after it, clocks
/// being a little apart. A short provider id such as an SMTP relay's queue id comes round
/// again: a late bounce of the first mail under it is not the second's. Without an event time,
/// the newest it may speak for; with one older than all of them, none (the reconciler then
/// tries the sends a replay replaced, and at last the newest: a clock far off).
pub(crate) fn holder_of<F>(
    found: &[(F, DateTime<Utc>)],
    event_time: Option<DateTime<Utc>>,
    allowed: impl Fn(&F) -> bool,
) -> Option<&F> {
    let mut may = found.iter().rev().filter(|(f, _)| allowed(f));
    match event_time {
        None => may.next(),
        Some(event) => may.find(|(_, created)| *created <= event + CREATED_SLACK),
    }
    .map(|(f, _)| f)
}

/// How long after a receipt's event a message carrying its provider id may have been created
/// and still be the one it speaks of ([`holder_of`]): providers that date an event to the
/// minute (Vonage's `message-timestamp`: up to a minute early; with 5 s here a Vonage receipt
/// went to the message its application reference named instead), and clocks apart.
const CREATED_SLACK: chrono::Duration = chrono::Duration::minutes(2);

/// How long an unmatched receipt is tried again.
const UNMATCHED_FOR: chrono::Duration = chrono::Duration::days(1);

/// The longest wait between two tries of an unmatched receipt.
pub(crate) const UNMATCHED_MAX_WAIT: chrono::Duration = chrono::Duration::hours(1);

/// How long an unmatched receipt waits after its `tries`-th try: 2 s, 4 s, 8 s, … doubling up to
/// [`UNMATCHED_MAX_WAIT`]. Each try costs a pass a read of the receipt and a rewrite of its
/// queue row (`herald_receipt_queue`), so the waits keep growing: a receipt that never matches
/// (a provider account shared with mail Herald did not send) is tried 35 times in its day
/// ([`next_unmatched_try`]). With waits capped at 512 s it was tried 176 times. The early tries
/// are the ones that match: a provider faster than the application's commit, or than the
/// sender's outcome write.
pub(crate) fn unmatched_retry_wait(tries: i32) -> chrono::Duration {
    let doubling = chrono::Duration::seconds(1i64 << tries.clamp(1, 12));
    doubling.min(UNMATCHED_MAX_WAIT)
}

/// When a receipt that arrived at `received_at` and found no message at its `tries`-th try, at
/// `at`, is tried next: after [`unmatched_retry_wait`], but no later than the end of its day
/// ([`UNMATCHED_FOR`] after it arrived), which gets a try of its own; never once its day is over.
pub(crate) fn next_unmatched_try(
    received_at: DateTime<Utc>,
    at: DateTime<Utc>,
    tries: i32,
) -> Option<DateTime<Utc>> {
    let end = received_at + UNMATCHED_FOR;
    (at < end).then(|| (at + unmatched_retry_wait(tries)).min(end))
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
pub(super) enum Abort {
    Replayed(usize),
    Storage(StorageError),
}

impl From<StorageError> for Abort {
    fn from(e: StorageError) -> Self {
        Abort::Storage(e)
    }
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
        use $crate::storage::$schema::herald_replay_keys as k;
        let conn = $conn;
        let inserted = $q::insert_receipts(conn, $source, $receipts, $now)?;
        let mut replayed = 0;
        for x in $receipts {
            let Some(key) = &x.replay_key else { continue };
            // Kept whether its event is new or a duplicate (a provider's retry, signed anew):
            // a value seen with one event is a replay with any other.
            diesel::insert_into(k::table)
                .values((
                    k::source.eq($source),
                    k::replay_key.eq(key),
                    k::provider_event_id.eq(&x.provider_event_id),
                    k::seen_at.eq($now),
                ))
                .on_conflict_do_nothing()
                .execute(conn)?;
            let holder: Option<String> = k::table
                .filter(k::source.eq($source))
                .filter(k::replay_key.eq(key))
                .select(k::provider_event_id)
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
pub(super) use store_unless_replayed;

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
                super::pg_transaction(
                    pool,
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

    /// How many receipts match no message yet, the oldest `limit` of them after the receipt id
    /// `after` (0: from the first), and whether more follow.
    pub fn unmatched_receipts(
        &self,
        after: i64,
        limit: u32,
    ) -> Result<(i64, Vec<ReceiptRow>, bool), StorageError> {
        let limit = i64::from(limit);
        crate::storage::db_run! { self, read |c, q| Ok(q::unmatched_receipts(c, after, limit)?) }
    }

    pub fn receipts_of_message(&self, message_id: i64) -> Result<Vec<ReceiptRow>, StorageError> {
        crate::storage::db_run! { self, read |c, q| Ok(q::receipts_of_message(c, message_id)?) }
    }

    /// One reconciler pass, in one transaction (see `reconcile` in the per-backend bodies).
    pub fn reconcile(
        &self,
        now: Now,
        limit: u32,
        message_id_domain: &str,
        rules: super::models::MatchRules<'_>,
        decide: &dyn Fn(&PendingReceipt, &MatchedMessage) -> ReceiptDecision,
    ) -> Result<ReconcilePass, StorageError> {
        let limit = i64::from(limit);
        crate::storage::db_run! { self, write |c, q| Ok(q::reconcile(c, &now, limit, message_id_domain, rules, decide)?) }
    }

    pub fn settle_or_expire_unconfirmed(
        &self,
        now: Now,
        deadline: std::time::Duration,
        accepting: &[&str],
    ) -> Result<(usize, usize), StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::settle_or_expire_unconfirmed(c, &now, deadline, accepting)?) }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::{
        UNMATCHED_FOR, UNMATCHED_MAX_WAIT, holder_of, next_unmatched_try, unmatched_retry_wait,
    };

    #[test]
    fn a_provider_id_met_again_is_the_newest_message_there_when_its_event_happened() {
        let at = |s: i64| DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::seconds(10_000 + s);
        // Messages 1, 2, 3 carry the id, created at 0, 1000 and 2000; 3's source is another.
        let found = [(1, at(0)), (2, at(1000)), (3, at(2000))];
        let mine = |m: &i32| *m != 3;
        let holder = |event: Option<i64>| holder_of(&found, event.map(at), mine).copied();
        assert_eq!(
            holder(None),
            Some(2),
            "no event time: the newest it may speak for"
        );
        assert_eq!(holder(Some(2500)), Some(2));
        assert_eq!(holder(Some(1000)), Some(2));
        // Created up to 2 minutes after its event: a time given to the minute (Vonage's), a
        // clock a little behind.
        assert_eq!(holder(Some(880)), Some(2));
        assert_eq!(holder(Some(879)), Some(1), "an event before 2 existed: 1's");
        assert_eq!(holder(Some(1)), Some(1));
        assert_eq!(holder(Some(-200)), None, "before all of them: none of them");
        assert_eq!(holder_of(&found, Some(at(500)), |m| *m == 3), None);
        assert_eq!(holder_of(&found, Some(at(2500)), |m| *m == 3), Some(&3));
        assert_eq!(holder_of(&found, Some(at(500)), |_| false), None);
        assert_eq!(holder_of::<i32>(&[], Some(at(500)), |_| true), None);
    }

    #[test]
    fn unmatched_receipts_wait_twice_as_long_each_try_up_to_an_hour() {
        let waits: Vec<i64> = (1..=14)
            .map(|t| unmatched_retry_wait(t).num_seconds())
            .collect();
        assert_eq!(
            waits,
            [
                2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3600, 3600, 3600
            ]
        );
        assert_eq!(unmatched_retry_wait(1_000), UNMATCHED_MAX_WAIT);
        // A count from a corrupt row neither shortens the wait nor overflows the shift.
        assert_eq!(unmatched_retry_wait(0).num_seconds(), 2);
        assert_eq!(unmatched_retry_wait(-5).num_seconds(), 2);
        assert_eq!(unmatched_retry_wait(i32::MAX), UNMATCHED_MAX_WAIT);
    }

    /// The tries a receipt that never matches gets, each pass exactly when it is due: the first
    /// on arrival, the last at the end of its day.
    #[test]
    fn a_receipt_that_never_matches_is_tried_35_times_the_last_at_the_end_of_its_day() {
        let received: DateTime<Utc> = "2026-12-01T00:00:00Z".parse().unwrap();
        let (mut at, mut tries, mut waits) = (received, 1, Vec::new());
        while let Some(next) = next_unmatched_try(received, at, tries) {
            waits.push((next - at).num_seconds());
            at = next;
            tries += 1;
        }
        assert_eq!(tries, 35);
        assert_eq!(at, received + UNMATCHED_FOR, "the last try ends its day");
        assert_eq!(waits.len(), 34);
        assert_eq!(
            waits[..12],
            [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3600]
        );
        assert!(waits[12..33].iter().all(|w| *w == 3600), "{waits:?}");
        assert_eq!(waits[33], 86_400 - 83_294);
        // Past its day (a Herald that was down through its end): no more tries.
        let late = received + UNMATCHED_FOR + chrono::Duration::hours(5);
        assert_eq!(next_unmatched_try(received, late, 3), None);
        // Tried on arrival, the next one follows the schedule.
        assert_eq!(
            next_unmatched_try(received, received, 1),
            Some(received + chrono::Duration::seconds(2))
        );
    }
}
