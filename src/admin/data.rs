//! What the admin pages show, and the one place they get it from: the seam where the support
//! module (explain, replay, dead letters) plugs in.
//!
//! Everything here is already redacted: [`MessageFacts`], [`AttemptFacts`] and [`ReceiptFacts`]
//! have no field for a payload, a response excerpt or a provider's raw receipt, and the
//! destination is masked when they are built — a template cannot show what it is never given.

use chrono::{DateTime, Utc};

use crate::auth::Principal;
use crate::domain::{AttemptClass, Channel, Semantics, State};
use crate::storage::admin::{DeadLetterFilter, HourCount, MessageSummary};
use crate::storage::models::{AttemptRow, OutboxRow, ReceiptRow};
use crate::storage::{Db, StorageError};
use crate::telemetry::mask_emails_in;

/// A destination as the admin page shows it: as support shows it everywhere
/// ([`crate::support::view::mask_destination`]) — a URL reduced to scheme and host, also one not
/// spelled with `://` (`http:/host/path`, which the URL parser takes; the page showed such a
/// one whole), an address to `u***@e***.com`, a configured endpoint's name as it is.
pub use crate::support::view::mask_destination;

/// One message, without its payload.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageFacts {
    pub event_id: String,
    pub channel: Channel,
    /// Masked ([`mask_destination`]).
    pub destination: String,
    pub state: State,
    pub state_reason: Option<String>,
    pub delivery_status: Option<String>,
    pub delivery_status_at: Option<DateTime<Utc>>,
    pub attempts: i32,
    /// `attempts` when the current series began (a replay starts a new one).
    pub attempt_base: i32,
    pub max_attempts: Option<i32>,
    pub semantics: Semantics,
    pub fingerprint: Option<String>,
    pub last_error_class: Option<AttemptClass>,
    pub provider_message_id: Option<String>,
    pub enqueued_by: Option<String>,
    pub retry_policy: String,
    pub retry_policy_version: Option<String>,
    pub created_at: DateTime<Utc>,
    pub scheduled_at: DateTime<Utc>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    /// When it last changed (for a dead letter of the unconfirmed deadline: when that came).
    pub updated_at: DateTime<Utc>,
}

impl MessageFacts {
    pub fn new(row: &OutboxRow) -> Self {
        Self {
            event_id: row.event_id.clone(),
            channel: row.channel,
            destination: mask_destination(row.channel, &row.destination),
            state: row.state,
            state_reason: row.state_reason.clone(),
            delivery_status: row.delivery_status.clone(),
            delivery_status_at: row.delivery_status_at,
            attempts: row.attempts,
            attempt_base: row.attempt_base,
            max_attempts: row.max_attempts,
            semantics: row.semantics,
            fingerprint: row.request_fingerprint.clone(),
            last_error_class: row.last_error_class,
            // A relay's id can carry a domain part (`<…@mg.example.com>`).
            provider_message_id: row.provider_message_id.as_deref().map(mask_emails_in),
            enqueued_by: row.enqueued_by.clone(),
            retry_policy: row.retry_policy.clone(),
            retry_policy_version: row.retry_policy_version.clone(),
            created_at: row.created_at,
            scheduled_at: row.scheduled_at,
            next_attempt_at: row.next_attempt_at,
            expires_at: row.expires_at,
            updated_at: row.updated_at,
        }
    }
}

/// One attempt, without the response excerpt (only Herald's own note from it).
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptFacts {
    pub number: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i64,
    pub status: Option<i32>,
    pub error_kind: Option<String>,
    pub class: AttemptClass,
    pub retry_after: Option<String>,
    pub delay_ms: Option<i64>,
    pub delay_reason: Option<String>,
    /// The state it led to, or `lease_lost`.
    pub next_state: String,
    pub policy_version: String,
    /// Herald's own note (refused recipients, an unsendable payload): see
    /// [`crate::support::view::attempt_note`].
    pub note: Option<String>,
}

impl AttemptFacts {
    pub fn new(a: &AttemptRow) -> Self {
        Self {
            number: a.attempt_number,
            started_at: a.started_at,
            duration_ms: a.duration_ms,
            status: a.response_status,
            error_kind: a.error_kind.clone(),
            class: a.class,
            retry_after: a.retry_after.clone(),
            delay_ms: a.delay_ms,
            delay_reason: a.delay_reason.clone(),
            next_state: a.next_state.clone(),
            policy_version: a.policy_version.clone(),
            note: crate::support::view::attempt_note(
                a.error_kind.as_deref(),
                a.response_excerpt.as_deref(),
            ),
        }
    }
}

/// One receipt, without the provider's body (it holds addresses).
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptFacts {
    pub source: String,
    /// Masked where a provider's composite id holds an address.
    pub provider_event_id: String,
    pub event_type: String,
    pub provider_type: String,
    pub event_time: Option<DateTime<Utc>>,
    pub received_at: DateTime<Utc>,
    pub outcome: Option<String>,
    pub outcome_reason: Option<String>,
}

impl ReceiptFacts {
    pub fn new(r: &ReceiptRow) -> Self {
        Self {
            source: r.source.clone(),
            provider_event_id: mask_emails_in(&r.provider_event_id),
            event_type: r.event_type.clone(),
            provider_type: crate::telemetry::mask_emails_in_words(&r.provider_type),
            event_time: r.event_time,
            received_at: r.received_at,
            outcome: r.outcome.clone(),
            outcome_reason: r
                .outcome_reason
                .as_deref()
                .map(crate::telemetry::mask_emails_in_words),
        }
    }
}

/// A message's page.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageDetail {
    pub message: MessageFacts,
    /// In attempt order.
    pub attempts: Vec<AttemptFacts>,
    /// In event-time order.
    pub receipts: Vec<ReceiptFacts>,
    /// The plain-language paragraph of the support module's explain, once it is wired in.
    pub explanation: Option<String>,
    /// Its replays, in order: who, when, why (as the explanation's audit gives them).
    pub replays: Vec<crate::support::view::ReplayEntry>,
    /// Its explicit skips, in order (`herald_skips`).
    pub skips: Vec<SkipFacts>,
}

/// An explicit skip of a message that held its ordering key: who, when, why (an address in the
/// reason masked, as the explanation shows it).
#[derive(Debug, Clone, PartialEq)]
pub struct SkipFacts {
    pub who: String,
    pub reason: String,
    pub from_state: State,
    pub skipped_at: DateTime<Utc>,
}

/// A message's page by event id. Today from the rows; the wiring step builds it from the
/// support module's explain (and fills [`MessageDetail::explanation`]).
pub fn message_detail(
    db: &Db,
    event_id: &str,
    policies: &crate::domain::policies::Policies,
) -> Result<Option<MessageDetail>, StorageError> {
    let Some(row) = db.find_by_event_id(event_id)? else {
        return Ok(None);
    };
    let attempts = db.attempts_of(row.id)?;
    let receipts = db.receipts_of_message(row.id)?;
    let explained =
        crate::support::explain(db, &crate::support::Lookup::event_id(event_id), policies).ok();
    let (explanation, replays) = match explained {
        Some(e) => (Some(e.explanation), e.replays),
        None => (None, Vec::new()),
    };
    // A help, as the explanation is: a failure to read them leaves them out, not the page.
    let skips = match row.ordering_key {
        Some(_) => db.skips_of(row.id).unwrap_or_else(|e| {
            tracing::warn!(error = %e.log_safe(), "admin page: skips could not be read");
            Vec::new()
        }),
        None => Vec::new(),
    };
    let skips = skips
        .into_iter()
        .map(|s| SkipFacts {
            reason: crate::support::view::mask_free_text(&s.reason),
            who: s.who,
            from_state: s.from_state,
            skipped_at: s.skipped_at,
        })
        .collect();
    Ok(Some(MessageDetail {
        message: MessageFacts::new(&row),
        attempts: attempts.iter().map(AttemptFacts::new).collect(),
        receipts: receipts.iter().map(ReceiptFacts::new).collect(),
        explanation,
        replays,
        skips,
    }))
}

/// What the search box was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// Only an event id fits (too short, or not hex).
    EventId(String),
    /// An event id, else a fingerprint prefix (lowercase hex, at least 8 digits).
    EventIdOrFingerprint(String, String),
    Empty,
}

/// The shortest fingerprint prefix searched for.
pub const MIN_PREFIX: usize = 8;

pub fn parse_query(q: &str) -> Query {
    let q = q.trim();
    if q.is_empty() {
        Query::Empty
    } else if (MIN_PREFIX..=64).contains(&q.len()) && q.bytes().all(|b| b.is_ascii_hexdigit()) {
        Query::EventIdOrFingerprint(q.to_owned(), q.to_ascii_lowercase())
    } else {
        Query::EventId(q.to_owned())
    }
}

/// What a search found.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// Exactly one message: its event id.
    One(String),
    /// Several messages: a fan-out's, or those sharing the fingerprint prefix (newest first, at
    /// most [`SEARCH_LIMIT`]; `true` when more match).
    Many(Vec<MessageSummary>, bool),
    Nothing,
}

pub const SEARCH_LIMIT: u32 = 20;

/// An exact event id first; then a fingerprint prefix. The wiring step may route the
/// fingerprint case through the support module's lookup.
pub fn search(db: &Db, query: &Query) -> Result<Found, StorageError> {
    let (event_id, prefix) = match query {
        Query::Empty => return Ok(Found::Nothing),
        Query::EventId(e) => (e, None),
        Query::EventIdOrFingerprint(e, p) => (e, Some(p)),
    };
    if db.find_by_event_id(event_id)?.is_some() {
        return Ok(Found::One(event_id.clone()));
    }
    // A fan-out's own event id names no row: its children are the messages (`order-42:billing`).
    let children: Vec<MessageSummary> = db
        .fanout_messages(event_id)?
        .iter()
        .map(MessageSummary::of)
        .collect();
    if !children.is_empty() {
        return Ok(Found::Many(children, false));
    }
    let Some(prefix) = prefix else {
        return Ok(Found::Nothing);
    };
    let mut rows = db.find_by_fingerprint_prefix(prefix, SEARCH_LIMIT + 1)?;
    let more = rows.len() > SEARCH_LIMIT as usize;
    rows.truncate(SEARCH_LIMIT as usize);
    Ok(match rows.len() {
        0 => Found::Nothing,
        1 => Found::One(rows.remove(0).event_id),
        _ => Found::Many(rows.iter().map(MessageSummary::of).collect(), more),
    })
}

/// Where a page of dead letters ends: `(updated_at, id)` of its last row.
pub type Cursor = (DateTime<Utc>, i64);

/// One page of dead letters, with the cursor of the next page when there is one. The wiring
/// step swaps in the support module's listing (richer filters: reason, destination).
pub fn dead_letters(
    db: &Db,
    filter: &DeadLetterFilter,
    page: usize,
) -> Result<(Vec<MessageSummary>, Option<Cursor>), StorageError> {
    let mut rows = db.admin_dead_letters(filter, page as i64 + 1)?;
    let next = if rows.len() > page {
        rows.truncate(page);
        rows.last().map(|r| (r.updated_at, r.id))
    } else {
        None
    };
    Ok((rows, next))
}

/// Attempts by hour and class since `since` (the chart).
pub fn attempt_counts(db: &Db, since: DateTime<Utc>) -> Result<Vec<HourCount>, StorageError> {
    db.attempts_by_hour(since)
}

/// Whether the page offers a replay for a message in `state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayable {
    Yes,
    /// Delivered (or its receipts say so): only with the explicit force box ticked.
    WithForce,
    /// Still on its way (or canceled): nothing to replay.
    No,
}

/// `delivery_status`: what the receipts say (a dead letter they say arrived needs force, as the
/// support replay asks).
pub fn replayable(state: State, delivery_status: Option<&str>) -> Replayable {
    match state {
        State::DeadLetter | State::Unconfirmed | State::Expired
            if delivery_status.is_some_and(crate::reconcile::says_it_arrived) =>
        {
            Replayable::WithForce
        }
        State::DeadLetter | State::Unconfirmed | State::Expired => Replayable::Yes,
        State::Delivered => Replayable::WithForce,
        State::Scheduled | State::Sending | State::Retryable | State::Canceled => Replayable::No,
    }
}

/// A replay asked for on the page.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayRequest {
    pub event_id: String,
    /// Required, trimmed, at most [`MAX_REASON`] characters.
    pub reason: String,
    pub force: bool,
    /// As the support replay's: `None` keeps `expires_at`, `Some(None)` clears it.
    pub expires_at: Option<Option<DateTime<Utc>>>,
    /// Who asked (the session's token name and scope).
    pub by: Principal,
    pub at: DateTime<Utc>,
}

pub const MAX_REASON: usize = 500;

/// Why a replay did not happen (shown on the page, in these words).
#[derive(Debug, thiserror::Error)]
pub enum ReplayRefused {
    #[error("No message has that event id.")]
    NotFound,
    /// The support module's own refusal (state not replayable, force needed, …).
    #[error("{0}")]
    Refused(String),
    /// Bad input (a given or kept `expires_at` that has passed), as the API's 422.
    #[error("{0}")]
    Invalid(String),
    #[error("The database is not available; try again.")]
    Storage(#[from] StorageError),
}

/// Replays a message: the support module's replay, once wired in. Blocking (runs off the
/// executor); on `Ok` the sender is woken.
pub trait ReplayHook: Send + Sync {
    fn replay(&self, db: &Db, request: &ReplayRequest) -> Result<(), ReplayRefused>;
}

/// The replay of the support module ([`crate::support::replay`]): the same rules, audit row and
/// fence as `POST /v1/sends/{fingerprint}/replay`, the session's token name as who.
pub struct SupportReplay {
    pub clock: std::sync::Arc<dyn crate::clock::Clock>,
}

impl ReplayHook for SupportReplay {
    fn replay(&self, db: &Db, request: &ReplayRequest) -> Result<(), ReplayRefused> {
        use crate::support::{self, Lookup, Reason, SupportError};
        let reason = Reason::parse(&request.reason)
            .map_err(|e| ReplayRefused::Invalid(format!("The reason {}.", e.message)))?;
        let req = support::ReplayRequest {
            reason,
            force: request.force,
            expires_at: request.expires_at,
        };
        let lookup = Lookup::event_id(&request.event_id);
        match support::replay(
            db,
            self.clock.storage_now(),
            &lookup,
            &req,
            &request.by.name,
        ) {
            Ok(_) => Ok(()),
            Err(SupportError::NotFound) => Err(ReplayRefused::NotFound),
            Err(SupportError::Storage(e)) => Err(ReplayRefused::Storage(e)),
            Err(
                e @ (SupportError::Invalid(_)
                | SupportError::Refused(support::Refusal::WouldExpire(_))),
            ) => Err(ReplayRefused::Invalid(e.to_string())),
            Err(e) => Err(ReplayRefused::Refused(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_by_shape() {
        assert_eq!(parse_query("  "), Query::Empty);
        assert_eq!(
            parse_query("order-1:email"),
            Query::EventId("order-1:email".into())
        );
        assert_eq!(parse_query("abc123"), Query::EventId("abc123".into()));
        assert_eq!(
            parse_query(" DEADBEEF "),
            Query::EventIdOrFingerprint("DEADBEEF".into(), "deadbeef".into())
        );
        let fp = "a".repeat(64);
        assert_eq!(
            parse_query(&fp),
            Query::EventIdOrFingerprint(fp.clone(), fp.clone())
        );
        let long = "a".repeat(65);
        assert_eq!(parse_query(&long), Query::EventId(long.clone()));
    }

    #[test]
    fn destinations_are_masked() {
        assert_eq!(
            mask_destination(Channel::Webhook, "https://hooks.example.com/t/secret?k=1"),
            "https://hooks.example.com/…"
        );
        assert_eq!(
            mask_destination(Channel::Email, "ada@example.com"),
            "a***@e***.com"
        );
        assert_eq!(
            mask_destination(Channel::Webhook, "endpoint:billing"),
            "endpoint:billing"
        );
    }

    #[test]
    fn which_states_can_be_replayed() {
        for s in State::ALL {
            let want = match s {
                State::DeadLetter | State::Unconfirmed | State::Expired => Replayable::Yes,
                State::Delivered => Replayable::WithForce,
                _ => Replayable::No,
            };
            assert_eq!(replayable(*s, None), want, "{s}");
            assert_eq!(replayable(*s, Some("bounced")), want, "{s}");
            let by_receipts = match want {
                Replayable::Yes => Replayable::WithForce,
                other => other,
            };
            assert_eq!(replayable(*s, Some("delivered")), by_receipts, "{s}");
            assert_eq!(replayable(*s, Some("complained")), by_receipts, "{s}");
        }
    }
}
