//! Support's reads and writes: a message by fingerprint prefix, its replays, the dead-letter
//! listing, and the replay itself — one transaction that reads the message, lets the caller's
//! pure decision judge it, and writes the new attempt series fenced on the state and attempt
//! count it read, with its audit row.

use super::models::{
    DeadLetterQuery, LastAttempt, Now, OutboxRow, RedriveResult, ReplayDecision, ReplayRow,
    ReplayWrite,
};
use super::{Db, StorageError, per_backend};

per_backend! {
    use chrono::{DateTime, Utc};
    use diesel::prelude::*;

    use crate::domain::{AttemptClass, Channel, State};
    use crate::storage::models::*;
    use self::schema::herald_outbox as o;
    use self::schema::herald_replays as rp;
    use self::schema::herald_attempts as a;

    type Backend = <Conn as diesel::Connection>::Backend;
    type Condition = Box<dyn BoxableExpression<o::table, Backend, SqlType = diesel::sql_types::Bool>>;

    /// Messages whose fingerprint starts with `prefix` (lower-case hex), at most `limit`, by
    /// fingerprint. The range keeps to the fingerprint index; the LIKE states the meaning.
    pub fn find_by_fingerprint_prefix(
        conn: &mut Conn,
        prefix: &str,
        limit: i64,
    ) -> QueryResult<Vec<OutboxRow>> {
        o::table
            .filter(o::request_fingerprint.ge(prefix))
            .filter(o::request_fingerprint.lt(format!("{prefix}g")))
            .filter(o::request_fingerprint.like(format!("{prefix}%")))
            // The newest first: several are listed, and a search that matches more shows the
            // newest (it was fingerprint order, which left the newest out).
            .order(o::id.desc())
            .limit(limit)
            .load(conn)
    }

    pub fn find_by_id(conn: &mut Conn, id: i64) -> QueryResult<Option<OutboxRow>> {
        o::table.filter(o::id.eq(id)).first(conn).optional()
    }

    pub fn replays_of(conn: &mut Conn, message_id: i64) -> QueryResult<Vec<ReplayRow>> {
        rp::table
            .filter(rp::message_id.eq(message_id))
            .order(rp::id)
            .load(conn)
    }

    /// The fenced write of one replay: a new attempt series due now, the history kept.
    fn write_replay(conn: &mut Conn, at: DateTime<Utc>, r: &NewReplay) -> QueryResult<Option<ReplayRow>> {
        let n = diesel::update(
            o::table
                .filter(o::id.eq(r.message_id))
                .filter(o::state.eq(r.from_state))
                .filter(o::attempts.eq(r.attempts)),
        )
        .set((
            o::state.eq(State::Scheduled),
            o::next_attempt_at.eq(Some(at)),
            o::attempt_base.eq(r.attempts),
            o::last_error_class.eq(None::<AttemptClass>),
            o::state_reason.eq(None::<String>),
            // The delivery status starts over with the new series (the receipts of the earlier
            // ones stay in the timeline): a status from an earlier send says nothing of this
            // one, and one without an event time would outrank the new sends' by precedence.
            o::delivery_status.eq(None::<String>),
            o::delivery_status_at.eq(None::<DateTime<Utc>>),
            o::lease_owner.eq(None::<String>),
            o::lease_until.eq(None::<DateTime<Utc>>),
            r.expires_at.map(|e| o::expires_at.eq(e)),
            o::ordering_released_at.eq(None::<DateTime<Utc>>),
            // The earlier send's provider id is the replay's (`provider_message_id_before`):
            // left on the row, a late receipt naming it counted as the new send's whenever the
            // new send recorded no id of its own.
            o::provider_message_id.eq(None::<String>),
            o::updated_at.eq(at),
        ))
        .execute(conn)?;
        if n != 1 {
            return Ok(None);
        }
        // A keyed message takes its place in its key again (it may have to wait its turn).
        q::rejoin(conn, r.message_id)?;
        let after = match r.expires_at {
            Some(e) => e,
            None => r.expires_at_before,
        };
        diesel::insert_into(rp::table)
            .values((
                rp::message_id.eq(r.message_id),
                rp::event_id.eq(&r.event_id),
                rp::who.eq(&r.who),
                rp::reason.eq(&r.reason),
                rp::from_state.eq(r.from_state),
                rp::forced.eq(r.forced),
                rp::series_start.eq(r.attempts + 1),
                rp::expires_at_before.eq(r.expires_at_before),
                rp::expires_at_after.eq(after),
                rp::replayed_at.eq(at),
                rp::provider_message_id_before.eq(&r.provider_message_id_before),
                rp::ordering_released_at_before.eq(r.ordering_released_at_before),
                rp::ended_at_before.eq(r.ended_at_before),
            ))
            .returning(rp::all_columns)
            .get_result(conn)
            .map(Some)
    }

    /// Reads message `id`, asks `decide` (pure) what to write, and writes it fenced — in the
    /// caller's transaction.
    pub fn replay<E>(
        conn: &mut Conn,
        now: &Now,
        id: i64,
        decide: &ReplayDecision<'_, E>,
    ) -> QueryResult<ReplayWrite<E>> {
        let at = sql::now(conn, now)?;
        let Some(row) = find_by_id(conn, id)? else {
            return Ok(ReplayWrite::Moved);
        };
        let plan = match decide(&row, at) {
            Ok(p) => p,
            Err(e) => return Ok(ReplayWrite::Refused(e)),
        };
        match write_replay(conn, at, &plan)? {
            Some(replay) => {
                let row = find_by_id(conn, id)?.ok_or(diesel::result::Error::NotFound)?;
                Ok(ReplayWrite::Done { row: Box::new(row), replay })
            }
            None => Ok(ReplayWrite::Moved),
        }
    }

    /// The filters of a dead-letter query as one condition (keyset position included).
    fn dead_letter_condition(query: &DeadLetterQuery) -> Condition {
        let mut cond: Condition = Box::new(o::state.eq(State::DeadLetter));
        if let Some(class) = query.class {
            cond = Box::new(cond.and(o::last_error_class.assume_not_null().eq(class)));
        }
        if let Some(reason) = &query.state_reason {
            cond = Box::new(cond.and(o::state_reason.assume_not_null().eq(reason.clone())));
        }
        if let Some(channel) = query.channel {
            cond = Box::new(cond.and(o::channel.eq(channel)));
        }
        if let Some(since) = query.since {
            cond = Box::new(cond.and(o::updated_at.ge(since)));
        }
        if let Some(until) = query.until {
            cond = Box::new(cond.and(o::updated_at.lt(until)));
        }
        if let Some((t, id)) = query.after {
            cond = Box::new(cond.and(o::updated_at.gt(t).or(o::updated_at.eq(t).and(o::id.gt(id)))));
        }
        match &query.destination {
            None => {}
            Some(DestinationMatch::Endpoint(name)) => {
                cond = Box::new(cond.and(o::destination.eq(crate::domain::endpoint_destination(name))));
            }
            Some(DestinationMatch::Host(forms)) => {
                // Host names and email domains compare without case (the forms are lower-cased).
                let dest = || crate::storage::support::lower(o::destination);
                let mut any: Condition = Box::new(false.into_sql::<diesel::sql_types::Bool>());
                for host in forms {
                    let h = crate::storage::support::escape_like(host);
                    // `ada@example.com`, or with a display name, `Ada <ada@example.com>`.
                    any = Box::new(
                        any.or(o::channel.eq(Channel::Email).and(
                            dest()
                                .like(format!("%@{h}"))
                                .escape('\\')
                                .or(dest().like(format!("%@{h}>")).escape('\\')),
                        )),
                    );
                    // A scheme's own port given (`host:80`, `host:443`) also finds the URLs of
                    // that scheme written without it, which are the same destination.
                    let (bare, default_of) = match host.rsplit_once(':') {
                        Some((b, "80")) if !b.ends_with(':') => (b, Some("http")),
                        Some((b, "443")) if !b.ends_with(':') => (b, Some("https")),
                        _ => (host.as_str(), None),
                    };
                    // (scheme, host as written, whether any port may follow it)
                    let mut urls: Vec<(&str, String, bool)> = ["http", "https"]
                        .into_iter()
                        .map(|sc| (sc, host.clone(), host.ends_with(']') || !host.contains(':')))
                        .collect();
                    urls.extend(default_of.map(|sc| (sc, bare.to_owned(), false)));
                    for (scheme, host, any_port) in urls {
                        let h = crate::storage::support::escape_like(&host);
                        any = Box::new(any.or(dest().eq(format!("{scheme}://{host}"))));
                        // A backslash ends the host as a slash does (the URL parser reads it so;
                        // LIKE writes it escaped).
                        let seps: &[&str] = if any_port {
                            &["", "/%", ":%", "?%", "#%", "\\\\%"]
                        } else {
                            &["", "/%", "?%", "#%", "\\\\%"]
                        };
                        for sep in seps {
                            if !sep.is_empty() {
                                let p = format!("{scheme}://{h}{sep}");
                                any = Box::new(any.or(o::channel.eq(Channel::Webhook).and(dest().like(p).escape('\\'))));
                            }
                            // With credentials before the host (`http://user:pass@host/…`, a
                            // row written by SQL: listed under its host, it was not found by
                            // it; a walk-through). The part before the `@` is the user part
                            // only when it holds no `/`, `?` or `#` (else the `@` is in the
                            // path, the query or the fragment of another host's URL).
                            let at = format!("{scheme}://%@{h}{sep}");
                            let mut userinfo: Condition = Box::new(o::channel.eq(Channel::Webhook).and(dest().like(at).escape('\\')));
                            // (A backslash too: the URL parser reads it as a slash, and LIKE
                            // writes it escaped.)
                            for not_in_authority in ["/", "?", "#", "\\\\"] {
                                let elsewhere = format!("{scheme}://%{not_in_authority}%@{h}{sep}");
                                userinfo = Box::new(userinfo.and(dest().not_like(elsewhere).escape('\\')));
                            }
                            any = Box::new(any.or(userinfo));
                        }
                    }
                }
                cond = Box::new(cond.and(any));
            }
        }
        cond
    }

    /// Dead letters matching `query`, ordered by (dead-lettered time, id); up to `query.limit`.
    pub fn dead_letters(conn: &mut Conn, query: &DeadLetterQuery) -> QueryResult<Vec<OutboxRow>> {
        o::table
            .filter(dead_letter_condition(query))
            .order((o::updated_at, o::id))
            .limit(query.limit)
            .load(conn)
    }

    /// The last attempt row of each of `ids` (by attempt number, then row id).
    pub fn last_attempts(conn: &mut Conn, ids: &[i64]) -> QueryResult<Vec<LastAttempt>> {
        let rows: Vec<LastAttempt> = a::table
            .filter(a::message_id.eq_any(ids))
            .order((a::message_id, a::attempt_number.desc(), a::id.desc()))
            .select((a::message_id, a::attempt_number, a::response_status, a::error_kind, a::class))
            .load(conn)?;
        let mut last: Vec<LastAttempt> = Vec::new();
        for r in rows {
            if last.last().map(|l| l.message_id) != Some(r.message_id) {
                last.push(r);
            }
        }
        Ok(last)
    }

    /// The bulk redrive: the dead letters `query` lists (one more than its limit, to tell
    /// whether more matched), each judged by `decide` and written fenced, in this transaction.
    pub fn redrive<E>(
        conn: &mut Conn,
        now: &Now,
        query: &DeadLetterQuery,
        decide: &ReplayDecision<'_, E>,
    ) -> QueryResult<RedriveResult<E>> {
        let at = sql::now(conn, now)?;
        let mut rows = dead_letters(conn, &DeadLetterQuery { limit: query.limit + 1, ..query.clone() })?;
        let more = rows.len() as i64 > query.limit;
        rows.truncate(usize::try_from(query.limit).unwrap_or(0));
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let result = match decide(&row, at) {
                Err(e) => ReplayWrite::Refused(e),
                Ok(plan) => match write_replay(conn, at, &plan)? {
                    Some(replay) => {
                        let now_row = find_by_id(conn, row.id)?.ok_or(diesel::result::Error::NotFound)?;
                        ReplayWrite::Done { row: Box::new(now_row), replay }
                    }
                    None => ReplayWrite::Moved,
                },
            };
            out.push((row, result));
        }
        Ok((out, more, at))
    }
}

diesel::define_sql_function! {
    /// SQL `lower(text)`.
    fn lower(x: diesel::sql_types::Text) -> diesel::sql_types::Text;
}

/// `text` with LIKE's wildcards and escape character escaped (escape character `\`).
pub(crate) fn escape_like(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Db {
    /// Messages whose fingerprint starts with `prefix` (lower-case hex), at most `limit`.
    pub fn find_by_fingerprint_prefix(
        &self,
        prefix: &str,
        limit: u32,
    ) -> Result<Vec<OutboxRow>, StorageError> {
        let limit = i64::from(limit);
        crate::storage::db_run! { self, read |c, q| Ok(q::find_by_fingerprint_prefix(c, prefix, limit)?) }
    }

    pub fn replays_of(&self, message_id: i64) -> Result<Vec<ReplayRow>, StorageError> {
        crate::storage::db_run! { self, read |c, q| Ok(q::replays_of(c, message_id)?) }
    }

    /// One replay in one transaction: read, decide, fenced write, audit row.
    pub fn replay<E>(
        &self,
        now: Now,
        id: i64,
        decide: &ReplayDecision<'_, E>,
    ) -> Result<ReplayWrite<E>, StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::replay(c, &now, id, decide)?) }
    }

    /// A page of dead letters and the last attempt of each.
    pub fn dead_letters(
        &self,
        query: &DeadLetterQuery,
    ) -> Result<(Vec<OutboxRow>, Vec<LastAttempt>), StorageError> {
        crate::storage::db_run! { self, read |c, q| {
            let rows = q::dead_letters(c, query)?;
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            let last = q::last_attempts(c, &ids)?;
            Ok((rows, last))
        }}
    }

    /// The bulk redrive, in one transaction; returns each message judged (as it was before) with
    /// what became of it, and whether more dead letters matched than the limit.
    pub fn redrive<E>(
        &self,
        now: Now,
        query: &DeadLetterQuery,
        decide: &ReplayDecision<'_, E>,
    ) -> Result<RedriveResult<E>, StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::redrive(c, &now, query, decide)?) }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn like_wildcards_are_escaped() {
        assert_eq!(
            super::escape_like("a_b%c\\d.example"),
            "a\\_b\\%c\\\\d.example"
        );
    }
}
