//! Support: explain a send, replay it, list and redrive dead letters. The HTTP handlers, the CLI
//! and the admin page all call these functions; they parse nothing of HTTP and print nothing.
//!
//! Invariants: nothing here shows a body, a provider's response text, an address in clear, a URL
//! path or query, or a secret (the views in [`view`] are the only way out); a replay keeps the
//! event id and fingerprint, starts a new attempt series under the sender's current policy, keeps
//! the history and is audited in the same transaction, fenced on the state it was decided on;
//! nothing replays on its own, so a replayed message that dead-letters again stays dead.

pub mod narrative;
pub mod render;
pub mod view;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::clock::Now;
use crate::domain::{AttemptClass, Channel, InvalidField, State};
use crate::storage::models::{
    DeadLetterQuery, DestinationMatch, NewReplay, OutboxRow, ReplayWrite,
};
use crate::storage::{Db, StorageError};

use self::view::{DeadLetterEntry, Explanation, ReplayEntry, fingerprint_of_row, ts};

/// The shortest fingerprint prefix accepted.
pub const MIN_PREFIX: usize = 8;
/// How many candidates an ambiguous prefix lists.
pub const MAX_CANDIDATES: usize = 10;
/// The longest replay reason, in characters.
pub const MAX_REASON: usize = 500;
/// A dead-letter page: default and largest size.
pub const LIST_DEFAULT: u32 = 50;
pub const LIST_MAX: u32 = 1000;
/// A bulk redrive: default and largest bound.
pub const REDRIVE_DEFAULT: u32 = 100;
pub const REDRIVE_MAX: u32 = 1000;

/// How support names a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// A fingerprint or a unique prefix of it (at least [`MIN_PREFIX`] hex digits, lower-cased).
    Fingerprint(String),
    EventId(String),
}

impl Lookup {
    /// A fingerprint or prefix as typed: 8 to 64 hex digits, either case.
    pub fn fingerprint(raw: &str) -> Result<Self, InvalidField> {
        let p = raw.trim().to_ascii_lowercase();
        if (MIN_PREFIX..=64).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(Lookup::Fingerprint(p))
        } else {
            Err(InvalidField::new(
                "fingerprint",
                format!(
                    "must be {MIN_PREFIX} to 64 hex digits (a fingerprint or a unique prefix of one)"
                ),
            ))
        }
    }

    pub fn event_id(raw: &str) -> Self {
        Lookup::EventId(raw.to_owned())
    }
}

/// One message a fingerprint prefix matches.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Candidate {
    pub fingerprint: Option<String>,
    pub event_id: String,
    pub state: State,
    #[schema(format = DateTime)]
    pub created_at: String,
}

impl Candidate {
    fn of(r: &OutboxRow) -> Self {
        Self {
            fingerprint: r.request_fingerprint.clone(),
            event_id: r.event_id.clone(),
            state: r.state,
            created_at: ts(&r.created_at),
        }
    }
}

/// Why a message cannot be replayed now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("it is sending: an attempt is in flight; wait for its outcome")]
    InFlight,
    #[error("it is {0}: it will be sent anyway; there is nothing to replay")]
    Pending(State),
    /// Waiting, but behind its ordering key's dead or unconfirmed head: it will not be sent
    /// until that one is dealt with (it said "it will be sent anyway"; a walk-through found it).
    #[error(
        "it is {0} and waits behind {1}, the head of its ordering key, which is dead or \
         unconfirmed: replay, cancel or skip {1} to let it go"
    )]
    Blocked(State, String),
    #[error("it was canceled; a canceled message cannot be replayed")]
    Canceled,
    /// Each way in names its own means: the API's `force` field, `herald replay --force`, the
    /// admin page's box ([`cli_hint`] adds the flag on the command line).
    #[error("{0}; a replay sends it again (with the same event id) and needs force")]
    NeedsForce(Delivered),
    #[error("its expires_at ({0}) is not in the future: give it a later time, or clear it")]
    WouldExpire(String),
}

/// Why a message counts as delivered for a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Delivered {
    #[error("it is delivered")]
    State,
    /// Dead or unconfirmed by its sends, but a provider's receipt says it arrived (a redrive
    /// of every dead letter sent such messages again; found by a support walk-through).
    #[error("its receipts say it arrived (delivery_status delivered or complained)")]
    ByReceipts,
}

#[derive(Debug, thiserror::Error)]
pub enum SupportError {
    #[error(
        "no message with that fingerprint or event id (a finished message is deleted by \
         retention: retention_delivered_days, retention_dead_letter_days)"
    )]
    NotFound,
    #[error("the prefix matches {} messages{}; give more digits", .0.len(), if *.1 { " or more" } else { "" })]
    Ambiguous(Vec<Candidate>, bool),
    /// The event id is a fan-out's (`destination = "type:…"`): its messages are its children,
    /// each with an event id of its own.
    #[error("that event id is a fan-out's: each of its {} messages has an event id of its own (EVENT_ID:ENDPOINT){}; name one of them", .1, if .1 > &.0.len() { format!(", {} listed", .0.len()) } else { String::new() })]
    FanOut(Vec<Candidate>, usize),
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<InvalidField>),
    #[error("cannot replay: {0}")]
    Refused(Refusal),
    #[error("the message changed while it was being replayed; look at it again")]
    Moved,
    #[error("cannot skip: {0}")]
    NotSkippable(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl SupportError {
    /// A fan-out's own event id: its messages, at most as many as an ambiguous prefix names,
    /// with how many there are.
    pub fn fan_out(children: &[OutboxRow]) -> Self {
        SupportError::FanOut(
            children
                .iter()
                .take(MAX_CANDIDATES)
                .map(Candidate::of)
                .collect(),
            children.len(),
        )
    }

    /// The messages to choose from: an ambiguous prefix's, or a fan-out's children.
    pub fn candidates(&self) -> Option<&[Candidate]> {
        match self {
            SupportError::Ambiguous(c, _) | SupportError::FanOut(c, _) => Some(c),
            _ => None,
        }
    }
}

impl From<InvalidField> for SupportError {
    fn from(e: InvalidField) -> Self {
        SupportError::Invalid(vec![e])
    }
}

impl From<Vec<InvalidField>> for SupportError {
    fn from(e: Vec<InvalidField>) -> Self {
        SupportError::Invalid(e)
    }
}

/// The message `lookup` names: 404 when none, ambiguous when a prefix matches several.
pub fn find(db: &Db, lookup: &Lookup) -> Result<OutboxRow, SupportError> {
    match lookup {
        Lookup::EventId(id) => match db.find_by_event_id(id)? {
            Some(row) => Ok(row),
            None => Err(no_message(db, id)?),
        },
        Lookup::Fingerprint(prefix) => {
            let mut rows = db.find_by_fingerprint_prefix(prefix, MAX_CANDIDATES as u32 + 1)?;
            match rows.len() {
                0 => Err(SupportError::NotFound),
                1 => Ok(rows.remove(0)),
                n => {
                    let more = n > MAX_CANDIDATES;
                    rows.truncate(MAX_CANDIDATES);
                    Err(SupportError::Ambiguous(
                        rows.iter().map(Candidate::of).collect(),
                        more,
                    ))
                }
            }
        }
    }
}

/// Why no message has event id `id`: none has (404), or it is a fan-out's own, which names its
/// messages (those retention has not purged; 409 `fan-out`).
fn no_message(db: &Db, id: &str) -> Result<SupportError, StorageError> {
    let children = db.fanout_messages(id)?;
    Ok(if children.is_empty() {
        SupportError::NotFound
    } else {
        SupportError::fan_out(&children)
    })
}

/// Everything that happened to a message, with its paragraph. `default_max_attempts`: the
/// policy's budget, for messages without their own.
pub fn explain(
    db: &Db,
    lookup: &Lookup,
    policies: &crate::domain::policies::Policies,
) -> Result<Explanation, SupportError> {
    let row = find(db, lookup)?;
    let attempts = db.attempts_of(row.id)?;
    let receipts = db.receipts_of_message(row.id)?;
    let replays = db.replays_of(row.id)?;
    let head = db.key_head(&row)?;
    // A message that sets no budget has its policy's: the one its current series' last attempt
    // recorded, as kept (the configuration may have changed since, or this may be `herald
    // explain` run with another one); else its destination's now — its endpoint's own, if any.
    // Only for a series that has ended: one still being retried is decided by the sender's
    // configuration, which the view shows too. The lookup is a help, never a failure (a role
    // without SELECT on the table, a database not migrated to it).
    let ended = !matches!(
        row.state,
        State::Scheduled | State::Retryable | State::Sending
    );
    let recorded = attempts
        .iter()
        .rfind(|a| ended && a.attempt_number > row.attempt_base)
        .and_then(|a| match db.policy_budget(&a.policy_version) {
            Ok(budget) => budget,
            Err(e) => {
                tracing::warn!(error = %e, "the kept retry policy could not be read; the configured budget is shown");
                None
            }
        })
        .and_then(|n| u32::try_from(n).ok());
    let budget = recorded.unwrap_or(policies.of(&row.destination).max_attempts);
    let mut e = Explanation::facts(&row, &attempts, &receipts, &replays, budget);
    e.ordering = view::OrderingFacts::new(&row, head.as_ref(), policies);
    // Its last explicit skip, from the audit: a replay since has cleared the release (the
    // message took its place again), and the skip is still what happened (a walk-through saw it
    // vanish from the explanation once the skipped message was replayed).
    if let Some(o) = e.ordering.as_mut()
        && let Some(skip) = db.skips_of(row.id)?.pop()
    {
        o.skipped_by = Some(skip.who);
        o.skip_reason = Some(view::mask_free_text(&skip.reason));
        o.skipped_at = Some(view::ts(&skip.skipped_at));
    }
    if let Some(o) = e.ordering.as_mut()
        && let Some(p) = db.key_predecessor(&row)?
    {
        // What happened to its hold on the key: each explicit skip, its release now, the final
        // state it is in (ends); each replay (it holds the key again).
        let final_state = matches!(p.state, State::Delivered | State::Canceled | State::Expired);
        let mut history: Vec<Hold> = db
            .skips_of(p.id)?
            .into_iter()
            .map(|s| Hold::End {
                at: s.skipped_at,
                skipped_by: Some(s.who),
                release: true,
            })
            .collect();
        let mut now = Vec::new();
        if let Some(r) = p.ordering_released_at
            && !history.iter().any(|e| e.at() == r)
        {
            now.push(Hold::End {
                at: r,
                skipped_by: None,
                release: true,
            });
        }
        if final_state {
            now.push(Hold::End {
                at: p.updated_at,
                skipped_by: None,
                release: false,
            });
        }
        // Each replay, and how the message had stopped holding the key before it (the replay
        // cleared its release and rewrote its updated_at; kept with the replay since 000032).
        for r in db.replays_of(p.id)? {
            if let Some(at) = r.ordering_released_at_before
                && !history.iter().any(|e| e.at() == at)
            {
                history.push(Hold::End {
                    at,
                    skipped_by: None,
                    release: true,
                });
            }
            if let Some(at) = r.ended_at_before {
                history.push(Hold::End {
                    at,
                    skipped_by: None,
                    release: false,
                });
            }
            history.push(Hold::Again { at: r.replayed_at });
        }
        let due = row.scheduled_at.max(row.created_at);
        let (ended, released, skipped_by) = match end_for(history, now, due) {
            Some(Hold::End {
                at,
                skipped_by,
                release,
            }) => (Some(at), release.then_some(at), skipped_by),
            _ => (None, None, None),
        };
        o.before = Some(view::PlaceBefore {
            event_id: p.event_id,
            state: p.state,
            released_at: released.as_ref().map(view::ts),
            skipped_by,
            ended_at: ended.as_ref().map(view::ts),
        });
    }
    if let Some(name) = crate::domain::endpoint_name(&row.destination)
        && matches!(row.state, State::Scheduled | State::Retryable)
    {
        e.endpoint_disabled = db
            .disabled_endpoints()?
            .into_iter()
            .find(|d| d.name == name)
            .map(|d| view::EndpointDisabled {
                endpoint: d.name,
                since: view::ts(&d.disabled_at),
                reason: d.reason,
            });
    }
    e.explanation = narrative::narrate(&e);
    Ok(e)
}

/// A change in a keyed message's hold on its key, for [`end_for`].
#[derive(Debug, Clone, PartialEq)]
enum Hold {
    /// It stopped holding it: a release (an explicit skip, named; or the `skip` policy), or a
    /// final state (`release` false).
    End {
        at: DateTime<Utc>,
        skipped_by: Option<String>,
        release: bool,
    },
    /// A replay: it holds the key again.
    Again { at: DateTime<Utc> },
}

impl Hold {
    fn at(&self) -> DateTime<Utc> {
        match self {
            Hold::End { at, .. } | Hold::Again { at } => *at,
        }
    }
}

/// When the place before a keyed message stopped holding the key for that message, due at
/// `due`: if it held the key then, its first end after; if it had stopped by then (and not been
/// replayed since), the first end of that stop. `None` while it holds the key still.
/// `history` (its skips and replays) is in time order; `now` (its release now, the final state
/// it is in) comes after all of it whatever its times say (a cancel stamped by Herald's clock
/// may read earlier than a replay stamped by the database's).
fn end_for(mut history: Vec<Hold>, now: Vec<Hold>, due: DateTime<Utc>) -> Option<Hold> {
    history.sort_by_key(Hold::at);
    let mut stopped: Option<Hold> = None;
    let mut latest = DateTime::<Utc>::MIN_UTC;
    for e in history.into_iter().chain(now) {
        // In the order above, each no earlier than the one before it.
        latest = latest.max(e.at());
        let by_then = latest <= due;
        match e {
            Hold::Again { .. } if by_then => stopped = None,
            end @ Hold::End { .. } if by_then => stopped = stopped.or(Some(end)),
            // After `due`: the stop it had made by then, else its first end since.
            end @ Hold::End { .. } => return stopped.or(Some(end)),
            Hold::Again { .. } => {
                if stopped.is_some() {
                    return stopped;
                }
            }
        }
    }
    stopped
}

/// Why a replay is done, as a person wrote it: required, at most [`MAX_REASON`] characters, no
/// control characters (it is shown in tables and logs of names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason(String);

impl Reason {
    pub fn parse(raw: &str) -> Result<Self, InvalidField> {
        let r = raw.trim();
        if r.is_empty() {
            return Err(InvalidField::new("reason", "is required: say why"));
        }
        if r.chars().count() > MAX_REASON {
            return Err(InvalidField::new(
                "reason",
                format!("must be at most {MAX_REASON} characters"),
            ));
        }
        // Nor bidirectional formatting (a right-to-left override, the line separator): it is
        // logged and shown beside Herald's own words, which it would turn around.
        if crate::telemetry::holds_unprintable(r) {
            return Err(InvalidField::new(
                "reason",
                "must not contain control or bidirectional-formatting characters (line breaks, \
                 tabs, U+202E …)",
            ));
        }
        Ok(Self(r.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A replay as asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayRequest {
    pub reason: Reason,
    /// Needed to replay a `delivered` message.
    pub force: bool,
    /// `None`: keep `expires_at`; `Some(None)`: clear it; `Some(Some(t))`: set it to `t`.
    pub expires_at: Option<Option<DateTime<Utc>>>,
}

fn parse_time(field: &str, v: &Value) -> Result<Option<DateTime<Utc>>, InvalidField> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => crate::domain::parse_time(field, s).map(Some),
        _ => Err(InvalidField::new(field, "must be an RFC 3339 time or null")),
    }
}

/// The body as a JSON object; a key given twice is refused, as in a message (which of the two
/// counts would be the parser's choice).
fn as_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, Vec<InvalidField>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => {
            let twice = crate::domain::keys_given_twice(body);
            if twice.is_empty() { Ok(o) } else { Err(twice) }
        }
        Ok(_) => Err(vec![InvalidField::new("body", "must be a JSON object")]),
        Err(e) => Err(vec![InvalidField::of_json(body, &e)]),
    }
}

fn parse_reason_value(v: Option<&Value>) -> Result<Reason, InvalidField> {
    match v {
        Some(Value::String(s)) => Reason::parse(s),
        None | Some(Value::Null) => Err(InvalidField::new("reason", "is required: say why")),
        Some(_) => Err(InvalidField::new("reason", "must be a string")),
    }
}

/// `POST /v1/sends/{fingerprint}/replay` body: `{"reason", "force"?, "expires_at"?}`.
pub fn parse_replay_body(body: &[u8]) -> Result<ReplayRequest, Vec<InvalidField>> {
    let obj = as_object(body)?;
    let mut errors = Vec::new();
    for k in obj.keys() {
        if !["reason", "force", "expires_at"].contains(&k.as_str()) {
            errors.push(InvalidField::new(k.clone(), "is not a known field"));
        }
    }
    let reason = parse_reason_value(obj.get("reason"))
        .map_err(|e| errors.push(e))
        .ok();
    let force = match obj.get("force") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            errors.push(InvalidField::new("force", "must be true or false"));
            false
        }
    };
    let expires_at = obj
        .get("expires_at")
        .map(|v| parse_time("expires_at", v))
        .transpose()
        .map_err(|e| errors.push(e))
        .ok()
        .flatten();
    match reason {
        Some(reason) if errors.is_empty() => Ok(ReplayRequest {
            reason,
            force,
            expires_at,
        }),
        _ => Err(errors),
    }
}

/// A skip as asked for: why (required, as for a replay).
#[derive(Debug, Clone, PartialEq)]
pub struct SkipRequest {
    pub reason: Reason,
}

/// `POST /v1/messages/{event_id}/skip` body: `{"reason"}`.
pub fn parse_skip_body(body: &[u8]) -> Result<SkipRequest, Vec<InvalidField>> {
    let obj = as_object(body)?;
    let mut errors: Vec<InvalidField> = obj
        .keys()
        .filter(|k| k.as_str() != "reason")
        .map(|k| InvalidField::new(k.clone(), "is not a known field"))
        .collect();
    let reason = parse_reason_value(obj.get("reason"))
        .map_err(|e| errors.push(e))
        .ok();
    match reason {
        Some(reason) if errors.is_empty() => Ok(SkipRequest { reason }),
        _ => Err(errors),
    }
}

/// Skips the dead or unconfirmed head of an ordering key (README, "Ordered delivery"): it stops
/// holding its key and the key's next message becomes due; the message itself stays as it is
/// (it can still be replayed). Logged with who and why.
pub fn skip(
    db: &Db,
    now: Now,
    event_id: &str,
    req: &SkipRequest,
    who: &str,
) -> Result<OutboxRow, SupportError> {
    use crate::storage::ordering::SkipWrite;
    let reason = view::mask_free_text(req.reason.as_str());
    match db.skip_head(event_id, now, who, &reason)? {
        SkipWrite::Done { row, due } => {
            tracing::info!(
                event_id = %crate::telemetry::LogEventId(&row.event_id),
                who,
                due,
                "ordering key released by an explicit skip"
            );
            Ok(*row)
        }
        SkipWrite::NotBlocking(row) => Err(SupportError::NotSkippable(match &row.ordering_key {
            None => "it has no ordering key".to_owned(),
            Some(_) if row.ordering_released_at.is_some() => {
                "it no longer holds its ordering key (released already: skipped, or under the skip policy)"
                    .to_owned()
            }
            Some(_) => format!(
                "it is {}; only a dead_letter or unconfirmed head holds its key",
                row.state
            ),
        })),
        SkipWrite::NotFound => Err(no_message(db, event_id)?),
    }
}

/// The replay decision, pure: which states may be replayed (`dead_letter`, `unconfirmed`,
/// `expired`; `delivered` only with force), and the write that does it at `at`.
pub fn plan_replay(
    row: &OutboxRow,
    req: &ReplayRequest,
    who: &str,
    at: DateTime<Utc>,
) -> Result<NewReplay, Refusal> {
    let forced = match row.state {
        State::DeadLetter | State::Unconfirmed | State::Expired
            if row
                .delivery_status
                .as_deref()
                .is_some_and(crate::reconcile::says_it_arrived) =>
        {
            if !req.force {
                return Err(Refusal::NeedsForce(Delivered::ByReceipts));
            }
            true
        }
        State::DeadLetter | State::Unconfirmed | State::Expired => false,
        State::Delivered if req.force => true,
        State::Delivered => return Err(Refusal::NeedsForce(Delivered::State)),
        State::Canceled => return Err(Refusal::Canceled),
        State::Sending => return Err(Refusal::InFlight),
        s @ (State::Scheduled | State::Retryable) => return Err(Refusal::Pending(s)),
    };
    let after = match req.expires_at {
        Some(e) => e,
        None => row.expires_at,
    };
    if let Some(t) = after
        && t <= at
    {
        return Err(Refusal::WouldExpire(ts(&t)));
    }
    Ok(NewReplay {
        message_id: row.id,
        event_id: row.event_id.clone(),
        from_state: row.state,
        attempts: row.attempts,
        who: who.to_owned(),
        reason: req.reason.as_str().to_owned(),
        forced,
        expires_at: req.expires_at,
        expires_at_before: row.expires_at,
        provider_message_id_before: row.provider_message_id.clone(),
        ordering_released_at_before: row.ordering_released_at,
        ended_at_before: matches!(row.state, State::Delivered | State::Expired)
            .then_some(row.updated_at),
    })
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Replayed {
    pub event_id: String,
    pub fingerprint: Option<String>,
    /// `scheduled`, due now.
    pub state: State,
    #[schema(format = DateTime)]
    pub next_attempt_at: Option<String>,
    pub replay: ReplayEntry,
}

/// Replays one message: `who` is the audit's name (the API token's name, or `cli:USER`).
pub fn replay(
    db: &Db,
    now: Now,
    lookup: &Lookup,
    req: &ReplayRequest,
    who: &str,
) -> Result<Replayed, SupportError> {
    let row = find(db, lookup)?;
    refuse_a_passed_expiry(req.expires_at, now)?;
    let written = db.replay(now, row.id, &|row, at| plan_replay(row, req, who, at))?;
    match written {
        ReplayWrite::Done { row, replay } => {
            tracing::info!(
                event_id = %crate::telemetry::LogEventId(&row.event_id),
                from_state = %replay.from_state,
                forced = replay.forced,
                series_start = replay.series_start,
                who = %replay.who,
                "message replayed"
            );
            Ok(Replayed {
                event_id: row.event_id.clone(),
                fingerprint: fingerprint_of_row(&row),
                state: row.state,
                next_attempt_at: row.next_attempt_at.as_ref().map(ts),
                replay: ReplayEntry::new(&replay),
            })
        }
        ReplayWrite::Refused(Refusal::Pending(s)) => {
            // Waiting, yes; but behind what? (The refusal stands when that cannot be read.)
            let row = OutboxRow { state: s, ..row };
            let head = db.key_head(&row).ok().flatten();
            Err(SupportError::Refused(
                match crate::storage::ordering::blocked_by(&row, head.as_ref()) {
                    // Behind a dead or unconfirmed head only: one replayed and open again goes
                    // first on its own, and this one after it (pending).
                    Some(h) if h.state.is_terminal() => Refusal::Blocked(s, h.event_id.clone()),
                    _ => Refusal::Pending(s),
                },
            ))
        }
        ReplayWrite::Refused(r) => Err(SupportError::Refused(r)),
        ReplayWrite::Moved => Err(SupportError::Moved),
    }
}

/// The position after which a dead-letter page starts: the last entry's dead-lettered time and
/// id, written as an opaque token (`v1:` + microseconds + id, base64url) — a client passes it
/// back as it got it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub at: DateTime<Utc>,
    pub id: i64,
}

impl Cursor {
    pub fn encode(&self) -> String {
        token("v1", &[&self.at.timestamp_micros(), &self.id])
    }

    pub fn decode(raw: &str) -> Result<Self, InvalidField> {
        let bad = || InvalidField::new("after", "is not a cursor this listing gave");
        let [at, id] = token_fields(raw, "v1").ok_or_else(bad)?;
        Ok(Self {
            at: token_time(&at).ok_or_else(bad)?,
            id: id.parse().map_err(|_| bad())?,
        })
    }
}

/// An opaque position: `TAG:field:…`, base64url without padding.
fn token(tag: &str, fields: &[&dyn std::fmt::Display]) -> String {
    let mut text = tag.to_owned();
    for f in fields {
        text.push_str(&format!(":{f}"));
    }
    URL_SAFE_NO_PAD.encode(text)
}

/// The `N` fields of a [`token`] of `tag`, if `raw` is one.
fn token_fields<const N: usize>(raw: &str, tag: &str) -> Option<[String; N]> {
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(raw.trim()).ok()?).ok()?;
    let mut parts = text.split(':');
    (parts.next()? == tag).then_some(())?;
    let fields: Vec<String> = parts.map(str::to_owned).collect();
    fields.try_into().ok()
}

/// A token's time field (µs since the epoch), if a listing can have given it ([`cursor_time`]).
fn token_time(field: &str) -> Option<DateTime<Utc>> {
    field.parse().ok().and_then(cursor_time)
}

/// Where a bulk redrive goes on from (its `next`): past the last dead letter it looked at,
/// among those dead-lettered before the first run of the sweep began — one it redrove that
/// failed again is dead-lettered after that and is not met again (each run would redrive it
/// anew) — and only with the filters it was given (a digest of them: `after` with other
/// filters, or none, would redrive what the first run never selected).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedriveCursor {
    pub at: DateTime<Utc>,
    pub id: i64,
    /// When the sweep's first run began: only dead letters from before it.
    pub until: DateTime<Utc>,
    /// The first 16 hex digits of SHA-256 over the filters.
    pub filters: String,
}

impl RedriveCursor {
    pub fn encode(&self) -> String {
        token(
            "r1",
            &[
                &self.at.timestamp_micros(),
                &self.id,
                &self.until.timestamp_micros(),
                &self.filters,
            ],
        )
    }

    pub fn decode(raw: &str) -> Result<Self, InvalidField> {
        let bad = || InvalidField::new("after", "is not the next of a redrive");
        let [at, id, until, filters] = token_fields(raw, "r1").ok_or_else(bad)?;
        Ok(Self {
            at: token_time(&at).ok_or_else(bad)?,
            id: id.parse().map_err(|_| bad())?,
            until: token_time(&until).ok_or_else(bad)?,
            filters,
        })
    }
}

/// A page cursor's time (µs since the epoch), if a listing can have given it: one far outside
/// years 1–9999 (chrono takes ±262,000 years) would reach the database, which refuses a time
/// before 4713 BC (and answered 500, or the admin page 503).
pub fn cursor_time(micros: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_micros(micros)
        .filter(|at| (1..=9999).contains(&chrono::Datelike::year(at)))
}

/// What a dead-letter listing or redrive selects.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeadLetterFilter {
    /// The class that dead-lettered it (`permanent`, `exhausted`, …).
    pub class: Option<AttemptClass>,
    /// `unconfirmed`: dead-lettered at the unconfirmed deadline (given as `class=unconfirmed`).
    pub state_reason: Option<String>,
    pub destination: Option<DestinationMatch>,
    pub channel: Option<Channel>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
}

impl DeadLetterFilter {
    /// The filter keys: `class`, `destination`, `channel`, `since`, `until`.
    pub const KEYS: &'static [&'static str] =
        &["class", "destination", "channel", "since", "until"];

    /// Sets one filter from its text; `Ok(false)` when `key` is not a filter key.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool, InvalidField> {
        let time = |v: &str| crate::domain::parse_time(key, v.trim());
        match key {
            "class" if value == "unconfirmed" => self.state_reason = Some("unconfirmed".into()),
            "class" => {
                self.class = Some(AttemptClass::parse(value).map_err(|_| {
                    InvalidField::new(
                        "class",
                        format!(
                            "must be one of: {}, unconfirmed",
                            AttemptClass::ALL
                                .iter()
                                .map(|c| c.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )
                })?)
            }
            "destination" => self.destination = Some(parse_destination(value)?),
            "channel" => self.channel = Some(Channel::parse(value)?),
            // `since` is inclusive and `until` exclusive: a range with nothing in it is a
            // mistake (the two swapped), said as one, not an empty list.
            "since" => {
                let t = time(value)?;
                if let Some(u) = self.until.filter(|u| t >= *u) {
                    return Err(InvalidField::new(
                        "since",
                        format!("must be before until ({})", ts(&u)),
                    ));
                }
                self.since = Some(t);
            }
            "until" => {
                let t = time(value)?;
                if let Some(s) = self.since.filter(|s| *s >= t) {
                    return Err(InvalidField::new(
                        "until",
                        format!("must be after since ({})", ts(&s)),
                    ));
                }
                self.until = Some(t);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A digest of the filters, for a redrive's cursor (16 hex digits of SHA-256 over their
    /// canonical text: each as parsed, so equal spellings agree, and never a derive's format,
    /// which a change of version could alter mid-sweep).
    fn digest(&self) -> String {
        use sha2::Digest;
        let micros = |t: Option<DateTime<Utc>>| t.map(|t| t.timestamp_micros().to_string());
        let destination = self.destination.as_ref().map(|d| match d {
            DestinationMatch::Endpoint(name) => crate::domain::endpoint_destination(name),
            DestinationMatch::Host(forms) => forms.join(","),
        });
        let text = [
            self.class.map(|c| c.as_str().to_owned()),
            self.state_reason.clone(),
            destination,
            self.channel.map(|c| c.as_str().to_owned()),
            micros(self.since),
            micros(self.until),
        ]
        .map(Option::unwrap_or_default)
        .join("|");
        hex::encode(sha2::Sha256::digest(text.as_bytes()))[..16].to_owned()
    }

    fn query(&self, after: Option<Cursor>, limit: u32) -> DeadLetterQuery {
        DeadLetterQuery {
            class: self.class,
            state_reason: self.state_reason.clone(),
            destination: self.destination.clone(),
            channel: self.channel,
            since: self.since,
            until: self.until,
            after: after.map(|c| (c.at, c.id)),
            limit: i64::from(limit),
        }
    }
}

/// `endpoint:NAME`, or a host (webhook URLs of that host, email addresses at that domain).
pub fn parse_destination(raw: &str) -> Result<DestinationMatch, InvalidField> {
    let raw = raw.trim();
    if let Some(name) = crate::domain::endpoint_name(raw) {
        if crate::domain::is_endpoint_name(name) {
            return Ok(DestinationMatch::Endpoint(name.to_owned()));
        }
        return Err(InvalidField::new(
            "destination",
            "endpoint:NAME needs a valid endpoint name",
        ));
    }
    let refused = || {
        InvalidField::new(
            "destination",
            "must be a host name (hooks.example.com, 10.0.0.7:8080, example.com for email) or endpoint:NAME",
        )
    };
    let host = raw.to_lowercase();
    // An internationalized name is looked for in both forms, `bücher.example` and
    // `xn--bcher-kva.example`: a destination is stored as it was written.
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port))
            if !name.starts_with('[') && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            (name, &host[name.len()..])
        }
        _ => (host.as_str(), ""),
    };
    let ascii = if name.is_ascii() {
        host.clone()
    } else {
        format!(
            "{}{port}",
            idna::domain_to_ascii(name).map_err(|_| refused())?
        )
    };
    if ascii.is_empty()
        || ascii.len() > 253
        || !ascii
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':' | b'[' | b']'))
    {
        return Err(refused());
    }
    let mut forms = vec![ascii];
    if forms[0].contains("xn--") {
        let (unicode, checked) = idna::domain_to_unicode(&forms[0][..forms[0].len() - port.len()]);
        let unicode = format!("{unicode}{port}");
        if checked.is_ok() && unicode != forms[0] {
            forms.push(unicode);
        }
    }
    Ok(DestinationMatch::Host(forms))
}

/// A listing's `limit`: a whole number from 1 to `max`, else refused naming `limit`.
pub(crate) fn parse_limit(raw: &str, max: u32) -> Result<u32, InvalidField> {
    match raw.trim().parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(InvalidField::new(
            "limit",
            format!("must be a whole number from 1 to {max}"),
        )),
    }
}

/// A dead-letter listing request: filters, position and page size.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListRequest {
    pub filter: DeadLetterFilter,
    pub after: Option<Cursor>,
    pub limit: Option<u32>,
}

/// `GET /v1/dead-letters` query pairs: the filter keys, `after` and `limit`; anything else is
/// named as not known, and so is a key given twice (`limit=1&limit=3` took the last without a
/// word, found by an input audit).
pub fn parse_list_query(pairs: &[(String, String)]) -> Result<ListRequest, Vec<InvalidField>> {
    let mut req = ListRequest::default();
    let mut errors = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (k, v) in pairs {
        if !seen.insert(k.as_str()) {
            if !errors.iter().any(|e: &InvalidField| e.field == *k) {
                errors.push(InvalidField::new(
                    k.clone(),
                    "is given more than once; give it once",
                ));
            }
            continue;
        }
        let r = match k.as_str() {
            "after" => Cursor::decode(v).map(|c| req.after = Some(c)),
            "limit" => parse_limit(v, LIST_MAX).map(|n| req.limit = Some(n)),
            _ => match req.filter.set(k, v) {
                Ok(true) => Ok(()),
                Ok(false) => Err(InvalidField::new(k.clone(), "is not a known parameter")),
                Err(e) => Err(e),
            },
        };
        if let Err(e) = r {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(req)
    } else {
        Err(errors)
    }
}

/// A page of dead letters.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DeadLetterPage {
    pub dead_letters: Vec<DeadLetterEntry>,
    /// Pass as `after` for the next page; `None` on the last page.
    pub next: Option<String>,
}

/// Dead letters by (dead-lettered time, id): a page is stable under concurrent inserts (a new
/// dead letter is later than every page already read, so it comes last).
pub fn dead_letters(db: &Db, req: &ListRequest) -> Result<DeadLetterPage, SupportError> {
    let limit = req.limit.unwrap_or(LIST_DEFAULT).clamp(1, LIST_MAX);
    let (mut rows, last) = db.dead_letters(&req.filter.query(req.after, limit + 1))?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next = more.then(|| rows.last()).flatten().map(|r| {
        Cursor {
            at: r.updated_at,
            id: r.id,
        }
        .encode()
    });
    Ok(DeadLetterPage {
        dead_letters: rows
            .iter()
            .map(|r| DeadLetterEntry::new(r, last.iter().find(|l| l.message_id == r.id)))
            .collect(),
        next,
    })
}

/// A bulk redrive as asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct RedriveRequest {
    pub filter: DeadLetterFilter,
    pub reason: Reason,
    /// At most this many (default [`REDRIVE_DEFAULT`], at most [`REDRIVE_MAX`]).
    pub limit: u32,
    /// As [`ReplayRequest::expires_at`], for every message redriven.
    pub expires_at: Option<Option<DateTime<Utc>>>,
    /// Only dead letters after this position (the `next` of a redrive before): past the ones it
    /// skipped, which are still dead letters.
    pub after: Option<RedriveCursor>,
}

/// `POST /v1/dead-letters/redrive` body: `{"reason", "limit"?, "expires_at"?}` and the filter
/// keys as strings.
pub fn parse_redrive_body(body: &[u8]) -> Result<RedriveRequest, Vec<InvalidField>> {
    let obj = as_object(body)?;
    let mut errors = Vec::new();
    let mut filter = DeadLetterFilter::default();
    let mut limit = REDRIVE_DEFAULT;
    let mut expires_at = None;
    let mut after = None;
    for (k, v) in &obj {
        match k.as_str() {
            "reason" => {}
            "after" => match v {
                Value::String(c) => match RedriveCursor::decode(c) {
                    Ok(c) => after = Some(c),
                    Err(e) => errors.push(e),
                },
                Value::Null => {}
                _ => errors.push(InvalidField::new("after", "must be a string")),
            },
            // `null` is absent, as for every other optional key (it was refused).
            "limit" if v.is_null() => {}
            "limit" => match v.as_u64() {
                Some(n) if (1..=u64::from(REDRIVE_MAX)).contains(&n) => limit = n as u32,
                _ => errors.push(InvalidField::new(
                    "limit",
                    format!("must be a whole number from 1 to {REDRIVE_MAX}"),
                )),
            },
            "expires_at" => match parse_time("expires_at", v) {
                Ok(t) => expires_at = Some(t),
                Err(e) => errors.push(e),
            },
            key if DeadLetterFilter::KEYS.contains(&key) => match v {
                Value::String(s) => {
                    if let Err(e) = filter.set(key, s) {
                        errors.push(e);
                    }
                }
                Value::Null => {}
                _ => errors.push(InvalidField::new(key, "must be a string")),
            },
            _ => errors.push(InvalidField::new(k.clone(), "is not a known field")),
        }
    }
    let reason = parse_reason_value(obj.get("reason"))
        .map_err(|e| errors.push(e))
        .ok();
    match reason {
        Some(reason) if errors.is_empty() => Ok(RedriveRequest {
            filter,
            reason,
            limit,
            expires_at,
            after,
        }),
        _ => Err(errors),
    }
}

/// One message a bulk redrive replayed.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Redriven {
    pub event_id: String,
    pub fingerprint: Option<String>,
    pub from_state: State,
    pub series_start: i32,
}

/// One message a bulk redrive left alone, and why.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Skipped {
    pub event_id: String,
    pub fingerprint: Option<String>,
    pub reason: String,
}

/// What a bulk redrive did.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct RedriveReport {
    pub limit: u32,
    pub redriven: Vec<Redriven>,
    pub skipped: Vec<Skipped>,
    /// More dead letters matched than the limit: run it again with `after` = `next`.
    pub more: bool,
    /// With `more`: the position after the last dead letter this redrive looked at, redriven or
    /// skipped. Passed back as `after`, the next run starts past the ones it skipped (without
    /// it, each run would take up its limit with the same skipped ones again).
    pub next: Option<String>,
}

/// Replays up to `req.limit` dead letters matching the filter, oldest first, each audited like a
/// single replay, in one transaction.
pub fn redrive(
    db: &Db,
    now: Now,
    req: &RedriveRequest,
    who: &str,
) -> Result<RedriveReport, SupportError> {
    // A time already past would leave every message redriven to expire again at once: bad
    // input, refused whole, not a skip per message.
    refuse_a_passed_expiry(req.expires_at, now)?;
    let limit = req.limit.clamp(1, REDRIVE_MAX);
    let one = ReplayRequest {
        reason: req.reason.clone(),
        force: false,
        expires_at: req.expires_at,
    };
    let filters = req.filter.digest();
    let mut query = req.filter.query(
        req.after.as_ref().map(|c| Cursor { at: c.at, id: c.id }),
        limit,
    );
    if let Some(c) = &req.after {
        if c.filters != filters {
            return Err(InvalidField::new(
                "after",
                "is the next of a redrive with other filters: give it with the same filters",
            )
            .into());
        }
        query.until = Some(query.until.map_or(c.until, |u| u.min(c.until)));
    }
    // The first run's own time (the database's, as the dead letters' times are) bounds the
    // sweep: what it redrives and fails again is dead-lettered after it.
    let (results, more, at) =
        db.redrive(now, &query, &|row, at| plan_replay(row, &one, who, at))?;
    let sweep_began = req.after.as_ref().map_or(at, |c| c.until);
    let next = more.then(|| results.last()).flatten().map(|(row, _)| {
        RedriveCursor {
            at: row.updated_at,
            id: row.id,
            until: sweep_began,
            filters: filters.clone(),
        }
        .encode()
    });
    let mut report = RedriveReport {
        limit,
        redriven: Vec::new(),
        skipped: Vec::new(),
        more,
        next,
    };
    for (row, result) in results {
        match result {
            ReplayWrite::Done { replay, .. } => report.redriven.push(Redriven {
                event_id: row.event_id.clone(),
                fingerprint: fingerprint_of_row(&row),
                from_state: replay.from_state,
                series_start: replay.series_start,
            }),
            ReplayWrite::Refused(r) => report.skipped.push(Skipped {
                event_id: row.event_id.clone(),
                fingerprint: fingerprint_of_row(&row),
                reason: r.to_string(),
            }),
            ReplayWrite::Moved => report.skipped.push(Skipped {
                event_id: row.event_id.clone(),
                fingerprint: fingerprint_of_row(&row),
                reason: "it changed while being redriven".into(),
            }),
        }
    }
    tracing::info!(
        redriven = report.redriven.len(),
        skipped = report.skipped.len(),
        more = report.more,
        who,
        "dead letters redriven"
    );
    Ok(report)
}

/// An `expires_at` given for a replay or a redrive that has passed already: bad input (422
/// naming it, exit 2), since what is replayed would expire again at once. (A kept one that has
/// passed is the message's own state: a refusal, [`Refusal::WouldExpire`].)
fn refuse_a_passed_expiry(
    expires_at: Option<Option<DateTime<Utc>>>,
    now: Now,
) -> Result<(), SupportError> {
    match expires_at {
        Some(Some(t)) if t <= now.local => Err(InvalidField::new(
            "expires_at",
            format!(
                "{} is not in the future: what is replayed would expire again at once; give a later time, or clear it",
                ts(&t)
            ),
        )
        .into()),
        _ => Ok(()),
    }
}

/// Exit status of a support command that succeeded.
pub const EXIT_OK: u8 = 0;
/// No such message, or it cannot be replayed now (or the database failed).
pub const EXIT_REFUSED: u8 = 1;
/// Bad input (a reason, a filter, a prefix) or configuration.
pub const EXIT_INVALID: u8 = 2;
/// A fingerprint prefix that matches several messages.
pub const EXIT_AMBIGUOUS: u8 = 3;

/// For `herald replay`: the flag that answers a refusal, to print after it (the API's problem
/// names the field instead).
pub fn cli_hint(e: &SupportError) -> Option<&'static str> {
    match e {
        SupportError::Refused(Refusal::NeedsForce(_)) => {
            Some("add --force to send it again anyway")
        }
        SupportError::Refused(Refusal::WouldExpire(_)) => {
            Some("add --expires-at TIME (RFC 3339, later than now) or --clear-expires-at")
        }
        _ => None,
    }
}

/// The CLI's exit status for an error.
pub fn exit_code(e: &SupportError) -> u8 {
    match e {
        SupportError::NotFound
        | SupportError::Refused(_)
        | SupportError::Moved
        | SupportError::NotSkippable(_)
        | SupportError::Storage(_) => EXIT_REFUSED,
        SupportError::Invalid(_) => EXIT_INVALID,
        SupportError::Ambiguous(..) | SupportError::FanOut(..) => EXIT_AMBIGUOUS,
    }
}

/// An error as `--json` prints it: a kind, the message, and the candidates of an ambiguous
/// prefix.
pub fn error_json(e: &SupportError) -> Value {
    let kind = match e {
        SupportError::NotFound => "not_found",
        SupportError::Ambiguous(..) => "ambiguous",
        SupportError::FanOut(..) => "fan_out",
        SupportError::Invalid(_) => "invalid",
        SupportError::Refused(_) => "refused",
        SupportError::Moved => "changed",
        SupportError::NotSkippable(_) => "refused",
        SupportError::Storage(_) => "storage",
    };
    let detail = match e {
        SupportError::Storage(s) => s.log_safe(),
        other => other.to_string(),
    };
    let mut v = serde_json::json!({"error": kind, "detail": detail});
    // Which refusal, for scripts.
    if let SupportError::NotSkippable(_) = e {
        v["refusal"] = Value::from("not_skippable");
    }
    if let SupportError::Refused(r) = e {
        v["refusal"] = Value::from(match r {
            Refusal::InFlight => "in_flight",
            Refusal::Pending(_) => "pending",
            Refusal::Blocked(..) => "blocked",
            Refusal::Canceled => "canceled",
            Refusal::NeedsForce(_) => "force_required",
            Refusal::WouldExpire(_) => "would_expire",
        });
    }
    if let Some(c) = e.candidates() {
        v["candidates"] = serde_json::json!(c);
    }
    if let SupportError::Invalid(fields) = e {
        v["fields"] = fields
            .iter()
            .map(|f| Value::String(f.field.clone()))
            .collect();
    }
    v
}

/// The audit's "who" for the CLI: `cli:` and the OS user (`$USER`, else `$LOGNAME`), else
/// `cli:unknown`; only name characters are kept.
pub fn cli_who(user: Option<String>) -> String {
    let name: String = user
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
        .take(64)
        .collect();
    if name.is_empty() {
        "cli:unknown".to_owned()
    } else {
        format!("cli:{name}")
    }
}

/// A bulk redrive from the CLI's flags: the filter pairs, the reason, the bound.
pub fn redrive_request(
    pairs: &[(String, String)],
    reason: &str,
    limit: Option<u32>,
    expires_at: Option<Option<DateTime<Utc>>>,
    after: Option<&str>,
) -> Result<RedriveRequest, SupportError> {
    let mut errors = Vec::new();
    let after = after
        .map(RedriveCursor::decode)
        .transpose()
        .map_err(|e| errors.push(e))
        .ok()
        .flatten();
    let mut filter = DeadLetterFilter::default();
    for (k, v) in pairs {
        match filter.set(k, v) {
            Ok(true) => {}
            Ok(false) => errors.push(InvalidField::new(k.clone(), "is not a known filter")),
            Err(e) => errors.push(e),
        }
    }
    let limit = match limit {
        None => REDRIVE_DEFAULT,
        Some(n) if (1..=REDRIVE_MAX).contains(&n) => n,
        Some(_) => {
            errors.push(InvalidField::new(
                "limit",
                format!("must be a whole number from 1 to {REDRIVE_MAX}"),
            ));
            REDRIVE_DEFAULT
        }
    };
    let reason = Reason::parse(reason).map_err(|e| errors.push(e)).ok();
    match reason {
        Some(reason) if errors.is_empty() => Ok(RedriveRequest {
            filter,
            reason,
            limit,
            expires_at,
            after,
        }),
        _ => Err(SupportError::Invalid(errors)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Semantics;

    fn row(state: State) -> OutboxRow {
        let t: DateTime<Utc> = "2026-12-01T10:00:00Z".parse().unwrap();
        OutboxRow {
            id: 7,
            event_id: "e-7".into(),
            channel: Channel::Webhook,
            destination: "https://hooks.example.com/x".into(),
            payload: serde_json::json!({"body": {}}),
            state,
            scheduled_at: t,
            next_attempt_at: None,
            attempts: 3,
            max_attempts: None,
            retry_policy: "default".into(),
            semantics: Semantics::AtLeastOnce,
            expires_at: None,
            lease_until: None,
            lease_owner: None,
            request_fingerprint: Some("ab".repeat(32)),
            provider_message_id: None,
            last_error_class: None,
            delivery_status: None,
            delivery_status_at: None,
            created_at: t,
            updated_at: t,
            retry_policy_version: None,
            state_reason: None,
            message_key: None,
            enqueued_by: None,
            attempt_base: 0,
            ordering_key: None,
            ordering_seq: None,
            ordering_policy: None,
            ordering_released_at: None,
        }
    }

    fn req(force: bool) -> ReplayRequest {
        ReplayRequest {
            reason: Reason::parse("fixed").unwrap(),
            force,
            expires_at: None,
        }
    }

    fn at() -> DateTime<Utc> {
        "2026-12-01T11:00:00Z".parse().unwrap()
    }

    #[test]
    fn an_empty_time_range_is_refused_naming_the_second_bound() {
        let mut f = DeadLetterFilter::default();
        assert!(f.set("until", "2026-12-01T10:00:00Z").unwrap());
        let e = f.set("since", "2026-12-02T10:00:00Z").unwrap_err();
        assert_eq!(e.field, "since");
        let mut f = DeadLetterFilter::default();
        assert!(f.set("since", "2026-12-01T10:00:00Z").unwrap());
        assert_eq!(
            f.set("until", "2026-12-01T10:00:00Z").unwrap_err().field,
            "until"
        );
        assert!(f.set("until", "2026-12-01T10:00:01Z").unwrap());
    }

    #[test]
    fn exit_codes_and_the_cli_name() {
        assert_eq!(exit_code(&SupportError::NotFound), EXIT_REFUSED);
        assert_eq!(
            exit_code(&SupportError::Refused(Refusal::Canceled)),
            EXIT_REFUSED
        );
        assert_eq!(exit_code(&SupportError::Moved), EXIT_REFUSED);
        assert_eq!(exit_code(&SupportError::Invalid(vec![])), EXIT_INVALID);
        assert_eq!(
            exit_code(&SupportError::Ambiguous(vec![], false)),
            EXIT_AMBIGUOUS
        );
        assert_eq!(cli_who(Some("ana".into())), "cli:ana");
        assert_eq!(cli_who(Some("a\nb c".into())), "cli:abc");
        assert_eq!(cli_who(None), "cli:unknown");
        let e = redrive_request(&[("class".into(), "x".into())], "", Some(1001), None, None)
            .unwrap_err();
        assert_eq!(
            error_json(&e)["fields"],
            serde_json::json!(["class", "limit", "reason"])
        );
        let e = SupportError::Refused(Refusal::NeedsForce(Delivered::State));
        assert_eq!(
            (
                error_json(&e)["error"].as_str(),
                error_json(&e)["refusal"].as_str()
            ),
            (Some("refused"), Some("force_required"))
        );
        assert!(error_json(&SupportError::NotFound).get("refusal").is_none());
    }

    #[test]
    fn the_place_before_ended_for_a_message_when_it_stopped_holding_the_key_for_it() {
        let t = |s: u32| at() + chrono::Duration::seconds(i64::from(s));
        let skip = |s| Hold::End {
            at: t(s),
            skipped_by: Some("desk".into()),
            release: true,
        };
        let policy = |s| Hold::End {
            at: t(s),
            skipped_by: None,
            release: true,
        };
        let delivered = |s| Hold::End {
            at: t(s),
            skipped_by: None,
            release: false,
        };
        let again = |s| Hold::Again { at: t(s) };
        // Due before the skip: the skip, though it was replayed and delivered since.
        assert_eq!(
            end_for(vec![skip(10), again(20)], vec![delivered(40)], t(5)),
            Some(skip(10))
        );
        // Due after the skip and before the replay: it was not holding the key then.
        assert_eq!(
            end_for(vec![again(20), skip(10)], vec![delivered(40)], t(15)),
            Some(skip(10))
        );
        // Due after the replay: it held the key again, until delivered.
        assert_eq!(
            end_for(vec![skip(10), again(20)], vec![delivered(40)], t(25)),
            Some(delivered(40))
        );
        // Replayed, dead again, released by the policy after this message was due.
        assert_eq!(
            end_for(vec![skip(10), again(20)], vec![policy(30)], t(25)),
            Some(policy(30))
        );
        // Skipped, then settled delivered by a receipt, both before it was due: the skip.
        assert_eq!(
            end_for(vec![skip(10)], vec![delivered(20)], t(25)),
            Some(skip(10))
        );
        // A final state stamped earlier than the replay (another clock) still comes after it.
        assert_eq!(
            end_for(vec![skip(10), again(20)], vec![delivered(19)], t(25)),
            Some(delivered(19))
        );
        assert_eq!(
            end_for(vec![skip(10), again(20)], vec![delivered(20)], t(20)),
            Some(delivered(20))
        );
        // Replayed and holding it still; never ended; ended before and not since.
        assert_eq!(end_for(vec![skip(10), again(20)], vec![], t(25)), None);
        assert_eq!(end_for(vec![], vec![], t(25)), None);
        assert_eq!(
            end_for(vec![], vec![delivered(3)], t(25)),
            Some(delivered(3))
        );
    }

    #[test]
    fn a_dead_letter_its_receipts_say_was_delivered_replays_only_with_force() {
        for (state, status) in [
            (State::DeadLetter, "delivered"),
            (State::Unconfirmed, "delivered"),
            (State::Expired, "delivered"),
            (State::DeadLetter, "complained"),
        ] {
            let mut r = row(state);
            r.delivery_status = Some(status.into());
            assert_eq!(
                plan_replay(&r, &req(false), "ana", at()).map(|p| p.forced),
                Err(Refusal::NeedsForce(Delivered::ByReceipts)),
                "{state}"
            );
            assert_eq!(
                plan_replay(&r, &req(true), "ana", at()).map(|p| p.forced),
                Ok(true),
                "{state}"
            );
            // Another status (a bounce, a deferral) says it did not arrive: no force needed.
            r.delivery_status = Some("bounced".into());
            assert_eq!(
                plan_replay(&r, &req(false), "ana", at()).map(|p| p.forced),
                Ok(false),
                "{state}"
            );
        }
        let e = Refusal::NeedsForce(Delivered::ByReceipts).to_string();
        assert!(e.starts_with("its receipts say it arrived"), "{e}");
    }

    #[test]
    fn which_states_replay() {
        for state in State::ALL.iter().copied() {
            for force in [false, true] {
                let got = plan_replay(&row(state), &req(force), "ana", at());
                let want = match (state, force) {
                    (State::DeadLetter | State::Unconfirmed | State::Expired, _) => Ok(false),
                    (State::Delivered, true) => Ok(true),
                    (State::Delivered, false) => Err(Refusal::NeedsForce(Delivered::State)),
                    (State::Canceled, _) => Err(Refusal::Canceled),
                    (State::Sending, _) => Err(Refusal::InFlight),
                    (s, _) => Err(Refusal::Pending(s)),
                };
                assert_eq!(
                    got.as_ref().map(|p| p.forced),
                    want.as_ref().map(|f| *f),
                    "{state} force={force}"
                );
                if let Ok(p) = got {
                    assert_eq!(p.from_state, state);
                    assert_eq!(p.attempts, 3, "the fence and the series base");
                    assert_eq!(p.event_id, "e-7");
                    assert_eq!(p.who, "ana");
                    assert_eq!(p.expires_at, None, "expires_at kept unless asked");
                }
            }
        }
    }

    #[test]
    fn expires_at_is_changed_only_when_asked_and_never_left_in_the_past() {
        let mut r = row(State::Expired);
        r.expires_at = Some("2026-12-01T10:30:00Z".parse().unwrap());
        assert_eq!(
            plan_replay(&r, &req(false), "ana", at()),
            Err(Refusal::WouldExpire("2026-12-01T10:30:00.000000Z".into()))
        );
        let clear = ReplayRequest {
            expires_at: Some(None),
            ..req(false)
        };
        let p = plan_replay(&r, &clear, "ana", at()).unwrap();
        assert_eq!(p.expires_at, Some(None));
        assert_eq!(p.expires_at_before, r.expires_at);
        let later: DateTime<Utc> = "2026-12-02T00:00:00Z".parse().unwrap();
        let extend = ReplayRequest {
            expires_at: Some(Some(later)),
            ..req(false)
        };
        assert_eq!(
            plan_replay(&r, &extend, "ana", at()).unwrap().expires_at,
            Some(Some(later))
        );
        let past = ReplayRequest {
            expires_at: Some(Some(at())),
            ..req(false)
        };
        assert!(matches!(
            plan_replay(&r, &past, "ana", at()),
            Err(Refusal::WouldExpire(_))
        ));
        // A future expires_at is kept as it is.
        r.expires_at = Some(later);
        assert_eq!(
            plan_replay(&r, &req(false), "ana", at())
                .unwrap()
                .expires_at,
            None
        );
    }

    #[test]
    fn reasons_are_required_bounded_and_printable() {
        assert_eq!(
            Reason::parse("  endpoint fixed ").unwrap().as_str(),
            "endpoint fixed"
        );
        for bad in ["", "   ", "two\nlines", "tab\there", &"x".repeat(501)] {
            assert_eq!(Reason::parse(bad).unwrap_err().field, "reason", "{bad:?}");
        }
        assert!(Reason::parse(&"é".repeat(500)).is_ok());
    }

    #[test]
    fn replay_bodies_name_their_bad_fields() {
        let ok =
            parse_replay_body(br#"{"reason":"fixed","force":true,"expires_at":null}"#).unwrap();
        assert!(ok.force);
        assert_eq!(ok.expires_at, Some(None));
        let ok = parse_replay_body(br#"{"reason":"fixed"}"#).unwrap();
        assert_eq!((ok.force, ok.expires_at), (false, None));
        let fields = |b: &str| {
            parse_replay_body(b.as_bytes())
                .unwrap_err()
                .into_iter()
                .map(|e| e.field)
                .collect::<Vec<_>>()
        };
        assert_eq!(fields(r#"{}"#), ["reason"]);
        assert_eq!(fields(r#"{"reason":""}"#), ["reason"]);
        assert_eq!(
            fields(r#"{"reason":1,"force":"yes","expires_at":"soon","x":1}"#),
            ["x", "reason", "force", "expires_at"]
        );
        assert_eq!(fields("[]"), ["body"]);
    }

    #[test]
    fn fingerprint_prefixes() {
        assert_eq!(
            Lookup::fingerprint("ABCDEF12").unwrap(),
            Lookup::Fingerprint("abcdef12".into())
        );
        assert!(Lookup::fingerprint(&"a".repeat(64)).is_ok());
        for bad in ["abcdef1", "abcdefgh", &"a".repeat(65), "abcd-ef12"] {
            assert_eq!(
                Lookup::fingerprint(bad).unwrap_err().field,
                "fingerprint",
                "{bad}"
            );
        }
    }

    #[test]
    fn cursors_round_trip_and_refuse_anything_else() {
        let c = Cursor {
            at: "2026-12-01T10:00:00.123456Z".parse().unwrap(),
            id: 42,
        };
        assert_eq!(Cursor::decode(&c.encode()).unwrap(), c);
        for bad in [
            "",
            "x",
            &URL_SAFE_NO_PAD.encode("v2:1:2"),
            &URL_SAFE_NO_PAD.encode("v1:1"),
            &URL_SAFE_NO_PAD.encode("v1:a:2"),
        ] {
            assert_eq!(Cursor::decode(bad).unwrap_err().field, "after", "{bad}");
        }
    }

    #[test]
    fn an_internationalized_host_is_looked_for_in_both_forms() {
        let forms = |raw: &str| match parse_destination(raw) {
            Ok(DestinationMatch::Host(f)) => f,
            other => panic!("{raw}: {other:?}"),
        };
        let both = ["xn--bcher-kva.example", "bücher.example"];
        assert_eq!(forms("Bücher.Example"), both);
        assert_eq!(forms("xn--bcher-kva.EXAMPLE"), both);
        assert_eq!(
            forms("bücher.example:8443"),
            ["xn--bcher-kva.example:8443", "bücher.example:8443"]
        );
        assert_eq!(forms("hooks.example.com"), ["hooks.example.com"]);
        assert_eq!(forms("[::1]:8080"), ["[::1]:8080"]);
        assert_eq!(forms("10.0.0.7:8080"), ["10.0.0.7:8080"]);
        // A name IDNA refuses (a zero-width joiner where it may not stand), and a slash.
        for bad in ["a\u{200d}.example", "bü/cher.example", ""] {
            assert_eq!(
                parse_destination(bad).unwrap_err().field,
                "destination",
                "{bad}"
            );
        }
    }

    #[test]
    fn listing_and_redrive_parameters() {
        let pairs = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect::<Vec<_>>()
        };
        let r = parse_list_query(&pairs(&[
            ("class", "permanent"),
            ("destination", "Hooks.Example.com"),
            ("channel", "webhook"),
            ("since", "2026-12-01T00:00:00Z"),
            ("limit", "10"),
        ]))
        .unwrap();
        assert_eq!(r.filter.class, Some(AttemptClass::Permanent));
        assert_eq!(
            r.filter.destination,
            Some(DestinationMatch::Host(vec!["hooks.example.com".into()]))
        );
        assert_eq!(r.limit, Some(10));
        let r = parse_list_query(&pairs(&[
            ("class", "unconfirmed"),
            ("destination", "endpoint:billing"),
        ]))
        .unwrap();
        assert_eq!(r.filter.state_reason.as_deref(), Some("unconfirmed"));
        assert_eq!(
            r.filter.destination,
            Some(DestinationMatch::Endpoint("billing".into()))
        );
        let fields = |v: &[(&str, &str)]| {
            parse_list_query(&pairs(v))
                .unwrap_err()
                .into_iter()
                .map(|e| e.field)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            fields(&[
                ("class", "late"),
                ("limit", "1001"),
                ("destination", "a/b"),
                ("until", "x"),
                ("page", "2"),
                ("after", "zz")
            ]),
            ["class", "limit", "destination", "until", "page", "after"]
        );
        assert_eq!(fields(&[("limit", "0")]), ["limit"]);
        // Given twice (thrice), named once: which one counts would be a guess.
        assert_eq!(
            fields(&[
                ("limit", "1"),
                ("class", "permanent"),
                ("limit", "3"),
                ("class", "exhausted"),
                ("limit", "2")
            ]),
            ["limit", "class"]
        );

        let r =
            parse_redrive_body(br#"{"reason":"fixed","class":"exhausted","limit":1000}"#).unwrap();
        assert_eq!(
            (r.limit, r.filter.class),
            (1000, Some(AttemptClass::Exhausted))
        );
        assert_eq!(
            parse_redrive_body(br#"{"reason":"fixed"}"#).unwrap().limit,
            REDRIVE_DEFAULT
        );
        assert_eq!(
            parse_redrive_body(br#"{"reason":"fixed","limit":null}"#)
                .unwrap()
                .limit,
            REDRIVE_DEFAULT
        );
        let fields = |b: &str| {
            parse_redrive_body(b.as_bytes())
                .unwrap_err()
                .into_iter()
                .map(|e| e.field)
                .collect::<Vec<_>>()
        };
        assert_eq!(fields(r#"{"reason":"fixed","limit":1001}"#), ["limit"]);
        assert_eq!(fields(r#"{"reason":"fixed","limit":0}"#), ["limit"]);
        assert_eq!(fields(r#"{"limit":5}"#), ["reason"]);
        assert_eq!(
            fields(r#"{"reason":"x","channel":"sms","after":"c"}"#),
            ["after", "channel"]
        );
        let c = RedriveCursor {
            at: "2026-12-01T10:00:00Z".parse().unwrap(),
            id: 7,
            until: "2026-12-01T11:00:00Z".parse().unwrap(),
            filters: "0123456789abcdef".into(),
        };
        let r =
            parse_redrive_body(format!(r#"{{"reason":"x","after":"{}"}}"#, c.encode()).as_bytes())
                .unwrap();
        assert_eq!(r.after, Some(c));
        assert_eq!(
            parse_redrive_body(br#"{"reason":"x","after":null}"#)
                .unwrap()
                .after,
            None
        );
        // A listing's cursor is no redrive's.
        let listed = Cursor {
            at: "2026-12-01T10:00:00Z".parse().unwrap(),
            id: 7,
        };
        assert_eq!(
            fields(&format!(
                r#"{{"reason":"x","after":"{}"}}"#,
                listed.encode()
            )),
            ["after"]
        );
    }
}
