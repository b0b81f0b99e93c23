//! Rows as Rust sees them. Field order is the column order of `schema_*.rs`; the same structs
//! load from both backends (UTC timestamps and JSON map to the same Rust types on each).

use chrono::{DateTime, Utc};
use diesel::Queryable;
use serde::Serialize;

use crate::domain::{AttemptClass, Channel, OrderingPolicy, Semantics, State};

/// One `herald_outbox` row.
#[derive(Debug, Clone, PartialEq, Queryable)]
pub struct OutboxRow {
    pub id: i64,
    pub event_id: String,
    pub channel: Channel,
    pub destination: String,
    /// As read ([`super::payload::ReadPayload`]): one that cannot be read stands in as
    /// `{"herald_unreadable_payload": …}`, never failing the statement that read it.
    #[diesel(deserialize_as = super::payload::ReadPayload)]
    pub payload: serde_json::Value,
    pub state: State,
    pub scheduled_at: DateTime<Utc>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub attempts: i32,
    pub max_attempts: Option<i32>,
    pub retry_policy: String,
    pub semantics: Semantics,
    pub expires_at: Option<DateTime<Utc>>,
    pub lease_until: Option<DateTime<Utc>>,
    pub lease_owner: Option<String>,
    pub request_fingerprint: Option<String>,
    pub provider_message_id: Option<String>,
    pub last_error_class: Option<AttemptClass>,
    pub delivery_status: Option<String>,
    pub delivery_status_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The retry policy version it was enqueued under (filled by the first claim for a plain
    /// SQL insert).
    pub retry_policy_version: Option<String>,
    /// Why it is in its state when the state alone does not say (`unconfirmed`: dead-lettered
    /// after the unconfirmed deadline).
    pub state_reason: Option<String>,
    /// Email only: the key of its deterministic `Message-ID` (see `domain::email_message_key`).
    pub message_key: Option<String>,
    /// The name of the API token that enqueued it (`None`: SQL or the library).
    pub enqueued_by: Option<String>,
    /// `attempts` when the current attempt series began (0 until a replay): the attempt budget
    /// counts `attempts - attempt_base`; `attempts` keeps counting every attempt ever made.
    pub attempt_base: i32,
    /// Messages with the same key and destination go one at a time, in `ordering_seq` order.
    pub ordering_key: Option<String>,
    /// Its place in its key (assigned at insert, in commit order).
    pub ordering_seq: Option<i64>,
    /// Its own head-of-line policy (`None`: its endpoint's, else `block`).
    pub ordering_policy: Option<OrderingPolicy>,
    /// When this dead or unconfirmed head stopped holding its key (`None` while it blocks).
    pub ordering_released_at: Option<DateTime<Utc>>,
}

/// What the watchdog reads of a `sending` row whose lease ran out: what the decision and the
/// attempt row need, never the payload.
#[derive(Debug, Clone, PartialEq, Queryable)]
pub struct ExpiredLease {
    pub id: i64,
    pub event_id: String,
    pub attempts: i32,
    /// Where the current attempt series began (see [`OutboxRow::attempt_base`]).
    pub attempt_base: i32,
    pub max_attempts: Option<i32>,
    pub semantics: Semantics,
    pub lease_owner: Option<String>,
    pub request_fingerprint: Option<String>,
    /// Set by the claim: when the attempt started.
    pub updated_at: DateTime<Utc>,
    pub destination: String,
    pub ordering_key: Option<String>,
    pub ordering_policy: Option<OrderingPolicy>,
    /// A retry after it could never be made: the message ends `expired` instead.
    pub expires_at: Option<DateTime<Utc>>,
    /// With the payload: the request fingerprint of a message written by SQL, which has none
    /// until an outcome records it — here the watchdog's.
    pub channel: crate::domain::Channel,
    #[diesel(deserialize_as = super::payload::ReadPayload)]
    pub payload: serde_json::Value,
}

impl ExpiredLease {
    /// Its stored request fingerprint, else the one its payload defines (`None` when that does
    /// not parse).
    pub fn fingerprint(&self) -> Option<String> {
        self.request_fingerprint.clone().or_else(|| {
            crate::outbox::fingerprint_of(
                self.channel,
                &self.destination,
                &self.event_id,
                &self.payload,
            )
            .map(|f| f.as_str().to_owned())
        })
    }
}

/// One `herald_attempts` row.
#[derive(Debug, Clone, PartialEq, Queryable)]
pub struct AttemptRow {
    pub id: i64,
    pub message_id: i64,
    pub event_id: String,
    pub attempt_number: i32,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub duration_ms: i64,
    pub request_fingerprint: Option<String>,
    pub response_status: Option<i32>,
    pub error_kind: Option<String>,
    pub class: AttemptClass,
    pub retry_after: Option<String>,
    pub delay_ms: Option<i64>,
    pub delay_reason: Option<String>,
    pub policy_version: String,
    pub provider_message_id: Option<String>,
    pub response_excerpt: Option<String>,
    pub lease_owner: Option<String>,
    /// The state the attempt led to, or `lease_lost` when the fence refused its outcome.
    pub next_state: String,
}

/// A message to insert; defaults already resolved.
#[derive(Debug, Clone)]
pub struct NewOutboxRow {
    pub event_id: String,
    pub channel: Channel,
    pub destination: String,
    pub payload: serde_json::Value,
    /// Not before; `None` = now: the database's `now()` on PostgreSQL (one clock for every
    /// process), `now` on SQLite.
    pub scheduled_at: Option<DateTime<Utc>>,
    pub max_attempts: Option<i32>,
    pub retry_policy: String,
    /// `None` from the library (the first claim fills in the version in force then).
    pub retry_policy_version: Option<String>,
    /// Email only: the key of its deterministic `Message-ID`.
    pub message_key: Option<String>,
    pub semantics: Semantics,
    pub expires_at: Option<DateTime<Utc>>,
    pub request_fingerprint: Option<String>,
    /// The name of the API token that enqueued it over HTTP.
    pub enqueued_by: Option<String>,
    pub ordering_key: Option<String>,
    pub ordering_policy: Option<OrderingPolicy>,
    pub now: DateTime<Utc>,
}

pub use crate::clock::Now;

/// What one attempt (or a send that was skipped) did to one claimed message.
#[derive(Debug, Clone)]
pub struct OutcomeRecord {
    pub message_id: i64,
    pub event_id: String,
    /// The attempt number the claim gave this send (`attempts` after the claim).
    pub claimed_attempt: i32,
    /// `attempts` to store: the claimed number, or one less when no request was made.
    pub attempts_after: i32,
    pub state: State,
    /// When to try again, by the process's clock (SQLite stores this).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The same as a delay from "now" (PostgreSQL adds it to the database's clock).
    pub retry_delay_ms: Option<i64>,
    pub error_class: Option<AttemptClass>,
    pub request_fingerprint: Option<String>,
    /// Whether the row had its request fingerprint when it was claimed (the API's rows, from
    /// their insert): then SQLite's outcome update leaves the column alone. Either way, a
    /// fingerprint already stored is never replaced.
    pub fingerprint_in_row: bool,
    pub provider_message_id: Option<String>,
    /// `None` when no request was made (expired before sending): no attempt row.
    pub attempt: Option<NewAttempt>,
    /// A keyed message's head-of-line policy in force (its own, else its endpoint's, else
    /// `block`); `None` for an unkeyed message, which costs the outcome write nothing more.
    pub ordering: Option<OrderingPolicy>,
    /// Other messages to make due at once in the same transaction, where they still wait as
    /// `retryable` for later: those its destination's outage cost an attempt, when this answer
    /// shows it back (`sender::throttle::Observed::back`). Empty for nearly every outcome.
    pub due_now: Vec<i64>,
}

/// An attempt row to insert.
#[derive(Debug, Clone)]
pub struct NewAttempt {
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub duration_ms: i64,
    pub response_status: Option<i32>,
    pub error_kind: Option<String>,
    pub class: AttemptClass,
    pub retry_after: Option<String>,
    pub delay_ms: Option<i64>,
    pub delay_reason: Option<String>,
    pub policy_version: String,
    pub response_excerpt: Option<String>,
}

/// Result of applying one outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The row was still leased to us and now carries the outcome.
    Yes,
    /// The lease had been lost (expired and reclaimed, or canceled): only the attempt was
    /// recorded, with `next_state = 'lease_lost'`.
    LeaseLost,
    /// The lease had been lost, but the answer was a definite 2xx for an `at_most_once` message
    /// the watchdog had moved to `unconfirmed` at this very attempt: the message is `delivered`.
    Settled,
}

impl Applied {
    /// What the attempt row records as the state the outcome led to.
    pub fn next_state(&self, decided: State) -> &'static str {
        match self {
            Applied::Yes | Applied::Settled => decided.as_str(),
            Applied::LeaseLost => "lease_lost",
        }
    }
}

/// What the watchdog does with one expired lease (the sender's pure decision, as storage
/// writes it).
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseDecision {
    pub state: State,
    pub error_class: Option<AttemptClass>,
    /// From the sweep's "now"; `None` for a final state.
    pub delay_ms: Option<i64>,
    pub reason: String,
    pub policy_version: String,
    /// As [`OutcomeRecord::ordering`].
    pub ordering: Option<OrderingPolicy>,
}

/// What `/metrics` reads of the database at scrape time, by the database's clock (`at`).
#[derive(Debug, Clone, PartialEq)]
pub struct DbStats {
    /// "Now" for the ages below (the database's clock on PostgreSQL, moved by the shift).
    pub at: DateTime<Utc>,
    /// Messages per state; states without messages are left out.
    pub by_state: Vec<(State, i64)>,
    /// The earliest `next_attempt_at` of a due message (scheduled or retryable, due by `at`).
    pub oldest_due: Option<DateTime<Utc>>,
    /// When the oldest receipt the reconciler has not looked at yet arrived.
    pub oldest_pending_receipt: Option<DateTime<Utc>>,
    /// Receipts that match no message yet.
    pub unmatched_receipts: i64,
    /// Ordering keys held by a dead or unconfirmed head (README, "Ordered delivery").
    pub blocked_keys: i64,
}

/// Counts from one watchdog pass over expired leases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseSweep {
    pub to_retryable: usize,
    pub to_unconfirmed: usize,
    pub to_dead_letter: usize,
    /// Its retry would have come after its `expires_at`.
    pub to_expired: usize,
}

impl LeaseSweep {
    pub fn total(&self) -> usize {
        self.to_retryable + self.to_unconfirmed + self.to_dead_letter + self.to_expired
    }

    /// Counts one row moved to `state`.
    pub fn count(&mut self, state: State) {
        match state {
            State::Unconfirmed => self.to_unconfirmed += 1,
            State::DeadLetter => self.to_dead_letter += 1,
            State::Expired => self.to_expired += 1,
            _ => self.to_retryable += 1,
        }
    }
}

impl OutcomeRecord {
    /// The watchdog's record of an attempt whose lease ran out at `at` before its sender wrote
    /// an outcome: class `ambiguous`, error kind `lease_expired`, no lease owner.
    pub fn lease_expired(row: &ExpiredLease, d: &LeaseDecision, at: DateTime<Utc>) -> Self {
        let owner = row.lease_owner.as_deref().unwrap_or("?");
        Self {
            message_id: row.id,
            event_id: row.event_id.clone(),
            claimed_attempt: row.attempts,
            attempts_after: row.attempts,
            state: d.state,
            next_attempt_at: d.delay_ms.map(|ms| at + chrono::Duration::milliseconds(ms)),
            retry_delay_ms: d.delay_ms,
            error_class: d.error_class,
            request_fingerprint: row.request_fingerprint.clone(),
            fingerprint_in_row: row.request_fingerprint.is_some(),
            provider_message_id: None,
            attempt: Some(NewAttempt {
                // The claim set updated_at: the attempt started then.
                started_at: row.updated_at,
                finished_at: at,
                duration_ms: (at - row.updated_at).num_milliseconds().max(0),
                response_status: None,
                error_kind: Some("lease_expired".into()),
                class: AttemptClass::Ambiguous,
                retry_after: None,
                delay_ms: d.delay_ms,
                delay_reason: Some(format!(
                    "the lease of {owner} expired before it recorded an outcome; {}",
                    d.reason
                )),
                policy_version: d.policy_version.clone(),
                response_excerpt: None,
            }),
            ordering: d.ordering,
            due_now: Vec::new(),
        }
    }
}

/// One verified, normalized provider event, ready to store.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NewReceipt {
    /// The provider's event id, or the composite key PROVIDERS.md names where it has none.
    pub provider_event_id: String,
    /// Herald's vocabulary (`delivered`, `bounced`, …), or `other`.
    pub event_type: String,
    /// The provider's own type string.
    pub provider_type: String,
    /// When the provider says it happened (never the arrival time); `None` where it gives none.
    pub event_time: Option<DateTime<Utc>>,
    /// Herald's event id, when the provider echoes it (custom args, metadata, tags, headers).
    pub herald_event_id: Option<String>,
    pub provider_message_id: Option<String>,
    /// The event as the provider sent it.
    pub raw: serde_json::Value,
    /// A one-time value covered by the signature where the body is not (Mailgun's token): a
    /// second, different event under it is a replay and is not stored.
    #[serde(skip)]
    pub replay_key: Option<String>,
}

impl NewReceipt {
    /// The receipt with every NUL character replaced by U+FFFD (PostgreSQL text and JSONB refuse
    /// NUL; the rest of the value is kept as sent).
    pub fn without_nul(&self) -> Self {
        let clean = text_without_nul;
        fn clean_json(v: &serde_json::Value) -> serde_json::Value {
            use serde_json::Value;
            match v {
                Value::String(s) => Value::String(text_without_nul(s)),
                Value::Array(a) => Value::Array(a.iter().map(clean_json).collect()),
                Value::Object(m) => Value::Object(
                    m.iter()
                        .map(|(k, v)| (text_without_nul(k), clean_json(v)))
                        .collect(),
                ),
                other => other.clone(),
            }
        }
        Self {
            provider_event_id: clean(&self.provider_event_id),
            event_type: clean(&self.event_type),
            provider_type: clean(&self.provider_type),
            event_time: self.event_time,
            herald_event_id: self.herald_event_id.as_deref().map(clean),
            provider_message_id: self.provider_message_id.as_deref().map(clean),
            raw: clean_json(&self.raw),
            replay_key: self.replay_key.as_deref().map(clean),
        }
    }
}

/// `s` with every NUL character replaced by U+FFFD: PostgreSQL text and JSONB refuse NUL (and
/// one such value fails the whole statement it is in), SQLite would keep it. Applied to what
/// Herald stores from outside — a receipt's fields, a receiver's message id — the same way, so
/// that an id with a NUL in it still matches itself.
pub fn text_without_nul(s: &str) -> String {
    s.replace('\0', "\u{FFFD}")
}

/// One `herald_receipts` row.
#[derive(Debug, Clone, PartialEq, Queryable)]
pub struct ReceiptRow {
    pub id: i64,
    pub source: String,
    pub provider_event_id: String,
    pub event_type: String,
    pub provider_type: String,
    pub event_time: Option<DateTime<Utc>>,
    pub received_at: DateTime<Utc>,
    pub herald_event_id: Option<String>,
    pub provider_message_id: Option<String>,
    pub raw: serde_json::Value,
    pub reconciled_at: Option<DateTime<Utc>>,
    pub replay_key: Option<String>,
    /// The message it was matched to.
    pub message_id: Option<i64>,
    /// `applied`, `superseded`, `no_send`, `unchanged`, `history` or `unmatched`.
    pub outcome: Option<String>,
    pub outcome_reason: Option<String>,
    pub match_attempts: i32,
    pub next_match_at: Option<DateTime<Utc>>,
}

/// What the reconciler reads of a pending receipt (never the raw body).
#[derive(Debug, Clone, PartialEq, Queryable)]
pub struct PendingReceipt {
    pub id: i64,
    pub source: String,
    pub provider_event_id: String,
    pub event_type: String,
    pub provider_type: String,
    pub event_time: Option<DateTime<Utc>>,
    pub received_at: DateTime<Utc>,
    pub herald_event_id: Option<String>,
    pub provider_message_id: Option<String>,
    pub match_attempts: i32,
}

/// What the reconciler reads of a matched message, locked for the update.
#[derive(Debug, Clone, PartialEq, Queryable)]
pub struct MatchedMessage {
    pub id: i64,
    pub event_id: String,
    pub state: State,
    pub delivery_status: Option<String>,
    pub delivery_status_at: Option<DateTime<Utc>>,
    pub state_reason: Option<String>,
    /// When its state last changed: for a `dead_letter` of `state_reason = 'unconfirmed'`, when
    /// the deadline moved it there.
    pub updated_at: DateTime<Utc>,
    /// When it was last replayed (`herald_replays`), if ever: its sends before that are an
    /// earlier series, whose receipts say nothing of the new one.
    pub replayed_at: Option<DateTime<Utc>>,
    /// How many times it was replayed.
    pub replays: Option<i64>,
    pub created_at: DateTime<Utc>,
    /// When the first request of the current series that may have left began: its earliest
    /// attempt not classified `not_sent` (a refused connection, a failed DNS lookup never
    /// reached anyone). `None` while there is none.
    pub first_request_at: Option<DateTime<Utc>>,
    /// Every attempt ever claimed (a claim counts one, a put-back returns it).
    pub attempts: i32,
    /// `attempts` when the current series began (0 until a replay).
    pub attempt_base: i32,
    /// The attempt rows of the current series.
    pub series_attempt_rows: Option<i64>,
}

impl MatchedMessage {
    /// Whether a receipt that arrived at `received_at` can speak of no request of the current
    /// series: none had begun by then (a receipt kept unmatched since before the message
    /// existed, one for a message scheduled, held, canceled, expired or replayed and not sent
    /// again, or one whose only attempts never left). A request in flight now, with none before
    /// it, counts for a receipt that arrived after the message was created.
    pub fn of_no_send(&self, received_at: DateTime<Utc>) -> bool {
        // The times come from several clocks (the ingest's, the sender's, the database's):
        // a request that began up to a second after the receipt's arrival counts.
        let before = |t: DateTime<Utc>| received_at + RECEIPT_CLOCK_SLACK < t;
        if before(self.created_at) {
            return true;
        }
        match self.first_request_at {
            Some(first) => before(first),
            // A request in flight, with none of the series before it: claimed (the claim set
            // `updated_at`, which nothing else writes while a message is `sending`).
            None if self.state == State::Sending => before(self.updated_at),
            // Attempts whose requests never left (all `not_sent`).
            None if self.series_attempt_rows.unwrap_or(0) > 0 => true,
            // Claimed with no attempt row to say when (a row written by SQL with its history):
            // a request may have been made; counted. Never claimed: none was.
            None => self.attempts <= self.attempt_base,
        }
    }

    /// The time of the message's last replay, where a receipt speaks of a send before it: the
    /// receipt arrived before the replay, or its event is older than the replay (an earlier
    /// send's, arriving late). Its status and its proof of acceptance are then that send's, and
    /// say nothing of the new one. `None` for a receipt of the current series.
    pub fn replayed_after(
        &self,
        event_time: Option<DateTime<Utc>>,
        received_at: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let at = self.replayed_at?;
        of_a_send_before(at, event_time, received_at).then_some(at)
    }

    /// Whether a receipt that proves acceptance and arrived at `received_at` settles it as
    /// `delivered`: an `unconfirmed` message, or one the unconfirmed deadline dead-lettered
    /// after the receipt was stored (the deadline's pass ran before the reconciler got to it).
    pub fn awaits_proof(&self, received_at: DateTime<Utc>) -> bool {
        match self.state {
            State::Unconfirmed => true,
            State::DeadLetter => {
                self.state_reason.as_deref() == Some(UNCONFIRMED_DEADLINE_REASON)
                    && received_at <= self.updated_at
            }
            _ => false,
        }
    }
}

/// How much later than a receipt's arrival a request may have begun and still count for it
/// ([`MatchedMessage::of_no_send`]): the arrival and the request's start are read on different
/// clocks when several Herald processes share a database. (The settle pass's SQL says one
/// second too: `sql::ATTEMPT_BEFORE_RECEIPT`.)
pub const RECEIPT_CLOCK_SLACK: chrono::Duration = chrono::Duration::seconds(1);

/// Whether a receipt of an event at `event_time` that arrived at `received_at` speaks of a send
/// before a replay at `replayed_at`: it arrived before the replay, or its event is more than
/// [`replay_slack`] older than it (an earlier send's, arriving late).
pub fn of_a_send_before(
    replayed_at: DateTime<Utc>,
    event_time: Option<DateTime<Utc>>,
    received_at: DateTime<Utc>,
) -> bool {
    received_at < replayed_at || event_time.is_some_and(|e| e + replay_slack(e) < replayed_at)
}

/// How much older than a replay a receipt's event at `event_time` may be and still be the new
/// send's: [`REPLAY_SLACK`], and a minute more for a time on a whole minute — a provider that
/// dates its events to the minute (Vonage's `scts`) dates the new send's event up to 59 s
/// before the replay. A walk-through: every Vonage receipt of a send replayed after second 5 of
/// its minute was taken for the send before the replay, even one naming the new send's id, and a
/// replayed `unconfirmed` SMS could never be settled. (A time that is on a whole minute by
/// chance gets the minute too.) The settle pass's SQL says the same (`sql::REPLAY_AFTER_EVENT`).
pub fn replay_slack(event_time: DateTime<Utc>) -> chrono::Duration {
    if event_time.timestamp().rem_euclid(60) == 0 && event_time.timestamp_subsec_nanos() == 0 {
        REPLAY_SLACK + chrono::Duration::minutes(1)
    } else {
        REPLAY_SLACK
    }
}

/// How much older than a replay a receipt's event may be and still be the new send's: providers
/// that give whole seconds (SendGrid, Stripe) date an event in the replay's own second before
/// it, and clocks differ by a little. An earlier send's event this close to the replay is taken
/// for the new one's. (The settle pass's SQL says 5 seconds too: `sql::REPLAY_AFTER_EVENT`.) See
/// [`replay_slack`] for a time on a whole minute.
pub const REPLAY_SLACK: chrono::Duration = chrono::Duration::seconds(5);

/// The `state_reason` of a message the unconfirmed deadline moved to `dead_letter`.
pub const UNCONFIRMED_DEADLINE_REASON: &str = "unconfirmed";

/// What the reconciler decided for one matched receipt.
#[derive(Debug, Clone)]
pub struct ReceiptDecision {
    /// `applied`, `superseded`, `no_send`, `unchanged` or `history`.
    pub outcome: &'static str,
    pub reason: String,
    /// The message's new delivery status and the event time that set it.
    pub new_status: Option<(String, Option<DateTime<Utc>>)>,
    /// A message awaiting proof ([`MatchedMessage::awaits_proof`]) that the receipt proves was
    /// accepted: `delivered`.
    pub settle: bool,
    /// Messages to enqueue in the same transaction (status callbacks).
    pub enqueue: Vec<NewOutboxRow>,
}

/// A receipt the reconciler applied, as it is marked.
#[derive(Debug, Clone, PartialEq)]
pub struct Reconciled {
    pub receipt_id: i64,
    pub message_id: i64,
    pub outcome: &'static str,
    pub reason: String,
}

/// A receipt the reconciler matched to no message, as it is marked: tried `tries` times, next
/// at `next` (`None`: no longer tried).
#[derive(Debug, Clone, PartialEq)]
pub struct Unmatched {
    pub receipt_id: i64,
    pub tries: i32,
    pub next: Option<DateTime<Utc>>,
    pub reason: &'static str,
}

/// Counts from one reconciler pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReconcilePass {
    /// Receipts matched to their message and decided (applied, superseded, no_send, unchanged, history).
    pub matched: usize,
    /// Receipts still without a message (tried again later).
    pub unmatched: usize,
    /// Messages whose delivery status changed.
    pub status_changes: usize,
    /// `unconfirmed` messages settled as `delivered` by a receipt.
    pub settled: usize,
}

/// One `herald_replays` row: a replay (redrive) by a person, audited.
#[derive(Debug, Clone, PartialEq, Queryable)]
pub struct ReplayRow {
    pub id: i64,
    pub message_id: i64,
    pub event_id: String,
    /// The API token's name, or `cli:USER`.
    pub who: String,
    pub reason: String,
    pub from_state: State,
    /// A `delivered` message replayed with `force`.
    pub forced: bool,
    /// The attempt number the new series starts at (`attempts + 1` at the replay).
    pub series_start: i32,
    pub expires_at_before: Option<DateTime<Utc>>,
    pub expires_at_after: Option<DateTime<Utc>>,
    pub replayed_at: DateTime<Utc>,
    /// The provider message id of the send before it: a late receipt naming it still finds
    /// the message.
    pub provider_message_id_before: Option<String>,
    /// When the message had stopped holding its ordering key by a release, before the replay
    /// (which clears it); `None` when it had not, or before migration 000032.
    pub ordering_released_at_before: Option<DateTime<Utc>>,
    /// When a `delivered` or `expired` message had reached that state, before the replay
    /// (which rewrites `updated_at`); `None` for other states, or before migration 000032.
    pub ended_at_before: Option<DateTime<Utc>>,
}

/// One `herald_skips` row: an explicit skip of a key's dead or unconfirmed head, audited.
#[derive(Debug, Clone, PartialEq, Queryable)]
pub struct SkipRow {
    pub id: i64,
    pub message_id: i64,
    /// The API token's name, or `cli:USER`.
    pub who: String,
    pub reason: String,
    pub from_state: State,
    pub skipped_at: DateTime<Utc>,
}

/// A replay to write: the fence (the state and attempt count it was decided on) and the audit.
#[derive(Debug, Clone, PartialEq)]
pub struct NewReplay {
    pub message_id: i64,
    pub event_id: String,
    pub from_state: State,
    /// `attempts` as read: the new series' base, and part of the fence.
    pub attempts: i32,
    pub who: String,
    pub reason: String,
    pub forced: bool,
    /// `None`: keep `expires_at`; `Some(x)`: set it to `x` (`Some(None)` clears it).
    pub expires_at: Option<Option<DateTime<Utc>>>,
    pub expires_at_before: Option<DateTime<Utc>>,
    /// The message's provider message id as read (its last send's).
    pub provider_message_id_before: Option<String>,
    /// Its release from its ordering key as read, and the time it reached its final state
    /// (`delivered`, `expired`) as read: the replay clears the one and rewrites the other.
    pub ordering_released_at_before: Option<DateTime<Utc>>,
    pub ended_at_before: Option<DateTime<Utc>>,
}

/// What a replay came to in storage.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayWrite<E> {
    /// Written: the message as it now is, and its audit row.
    Done {
        row: Box<OutboxRow>,
        replay: ReplayRow,
    },
    /// The decision refused it; nothing written.
    Refused(E),
    /// The message moved between the read and the fenced write (another replay, the
    /// reconciler); nothing written.
    Moved,
}

/// The pure replay decision a replay's transaction asks: the message as read and the
/// transaction's "now", to the write (or the caller's refusal).
pub type ReplayDecision<'a, E> = dyn Fn(&OutboxRow, DateTime<Utc>) -> Result<NewReplay, E> + 'a;

/// A bulk redrive: each message judged (as it was before) with what became of it, whether
/// more matched than the limit, and the transaction's time (the replays').
pub type RedriveResult<E> = (Vec<(OutboxRow, ReplayWrite<E>)>, bool, DateTime<Utc>);

/// Which destinations a dead-letter listing keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestinationMatch {
    /// `endpoint:NAME` destinations of that name.
    Endpoint(String),
    /// Webhook URLs of this host (any scheme, port, path) and email addresses at this domain,
    /// in each of its forms: lower-cased, its ASCII form (IDNA A-labels) first, then, for an
    /// internationalized name, its Unicode form (a destination is stored as it was written).
    Host(Vec<String>),
}

/// A dead-letter listing: filters, the keyset position and the page size.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeadLetterQuery {
    /// `last_error_class` (the class that decided the dead letter).
    pub class: Option<AttemptClass>,
    /// `state_reason` (`unconfirmed`: dead-lettered at the unconfirmed deadline).
    pub state_reason: Option<String>,
    pub destination: Option<DestinationMatch>,
    pub channel: Option<Channel>,
    /// Dead-lettered at or after.
    pub since: Option<DateTime<Utc>>,
    /// Dead-lettered before.
    pub until: Option<DateTime<Utc>>,
    /// After this (dead-lettered time, id), exclusive.
    pub after: Option<(DateTime<Utc>, i64)>,
    pub limit: i64,
}

/// The last attempt of a message, for listings.
#[derive(Debug, Clone, PartialEq, Queryable)]
pub struct LastAttempt {
    pub message_id: i64,
    pub attempt_number: i32,
    pub response_status: Option<i32>,
    pub error_kind: Option<String>,
    pub class: AttemptClass,
}

/// How the reconciler may match a receipt of a source (by its name) to a message.
#[derive(Clone, Copy)]
pub struct MatchRules<'a> {
    /// Whether a receipt of the source may speak for a message of this channel and destination:
    /// the source's `matches` (every message when it has none).
    pub may_match: &'a dyn Fn(&str, crate::domain::Channel, &str) -> bool,
    /// Whether the source's Herald event id is only a reference the application put in the send
    /// and the provider echoed (Vonage `client-ref`, MessageBird `reference`): the provider's
    /// message id is tried first, the reference only when that finds nothing — an application
    /// reference equal to another message's event id must not take the receipt there.
    pub provider_id_first: &'a dyn Fn(&str) -> bool,
}

impl MatchRules<'_> {
    /// Every source speaks for every message, Herald's event id first.
    pub const OPEN: MatchRules<'static> = MatchRules {
        may_match: &|_, _, _| true,
        provider_id_first: &|_| false,
    };
}
