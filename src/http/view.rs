//! The views the `/v1/messages`, `/v1/receipts`, `/v1/endpoints`, `/v1/ingest` and `/readyz`
//! handlers answer with; each is also its schema in `/openapi.json`.

use crate::domain::policies::Policies;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::{AttemptClass, Channel, Semantics, State};
use crate::outbox::FanOut;
use crate::storage::models::{OutboxRow, ReceiptRow};

pub(crate) fn ts(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// `GET /v1/messages/{event_id}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessageView {
    pub event_id: String,
    pub channel: Channel,
    pub destination: String,
    pub state: State,
    pub attempts: i32,
    pub max_attempts: i64,
    pub semantics: Semantics,
    pub retry_policy: String,
    /// The policy version it was enqueued under (set at the first claim for a plain SQL insert).
    pub retry_policy_version: Option<String>,
    /// The version of its destination's policy as configured now, which the sender retries it
    /// by (a replay runs under it) and whose budget `max_attempts` shows when the message sets
    /// none of its own.
    pub retry_policy_version_now: String,
    pub fingerprint: Option<String>,
    #[schema(format = DateTime)]
    pub scheduled_at: String,
    #[schema(format = DateTime)]
    pub next_attempt_at: Option<String>,
    #[schema(format = DateTime)]
    pub expires_at: Option<String>,
    pub last_error_class: Option<AttemptClass>,
    pub provider_message_id: Option<String>,
    pub delivery_status: Option<String>,
    #[schema(format = DateTime)]
    pub delivery_status_at: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// Why it is in its state when the state alone does not say (`unconfirmed`).
    pub state_reason: Option<String>,
    /// Its ordering key, place and own head-of-line policy (left out when unkeyed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering_seq: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering_policy: Option<crate::domain::OrderingPolicy>,
    /// The head-of-line policy that applies to a keyed message: its own, else its endpoint's as
    /// configured now, else `block` (left out when unkeyed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering_policy_applied: Option<crate::domain::OrderingPolicy>,
    /// The event id of the dead or unconfirmed head that holds its key ("blocked by"), or of
    /// the replayed head a message already due waits behind; to a `send` token, `(another
    /// client's message)` when another client enqueued that head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    /// The receipt history, in event-time order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipts: Option<Vec<ReceiptView>>,
}

/// One receipt in a message's history: identifiers and types only, never the provider's body
/// (it holds addresses).
#[derive(Debug, Serialize, ToSchema)]
pub struct ReceiptView {
    pub source: String,
    pub provider_event_id: String,
    pub event_type: String,
    pub provider_type: String,
    #[schema(format = DateTime)]
    pub event_time: Option<String>,
    #[schema(format = DateTime)]
    pub received_at: String,
    #[schema(format = DateTime)]
    pub reconciled_at: Option<String>,
    /// `applied`, `superseded`, `no_send`, `unchanged` or `history`.
    pub outcome: Option<String>,
    pub outcome_reason: Option<String>,
}

impl ReceiptView {
    pub fn new(r: &ReceiptRow) -> Self {
        Self {
            source: r.source.clone(),
            // A composite id (Postmark's) can hold the recipient's address.
            provider_event_id: crate::telemetry::mask_emails_in(&r.provider_event_id),
            event_type: r.event_type.clone(),
            // The provider's own word, as it sent it: an address there is masked too.
            provider_type: crate::telemetry::mask_emails_in_words(&r.provider_type),
            event_time: r.event_time.as_ref().map(ts),
            received_at: ts(&r.received_at),
            reconciled_at: r.reconciled_at.as_ref().map(ts),
            outcome: r.outcome.clone(),
            outcome_reason: r
                .outcome_reason
                .as_deref()
                .map(crate::telemetry::mask_emails_in_words),
        }
    }
}

impl MessageView {
    /// [`MessageView::new`] as `who` may see it: a `support` token sees another client's
    /// destination masked (`https://host/…`, `a***@e***.com`), as every support tool shows it —
    /// the message view and the skip and cancel answers showed it whole, path, query and
    /// address (a walk-through). The client that enqueued it, and `admin`, see it as written.
    pub fn for_caller(row: &OutboxRow, policies: &Policies, who: &crate::auth::Principal) -> Self {
        let mut view = Self::new(row, policies);
        if who.scope == crate::auth::Scope::Support
            && row.enqueued_by.as_deref() != Some(who.name.as_str())
        {
            view.destination =
                crate::support::view::mask_destination(row.channel, &row.destination);
        }
        view
    }

    /// `policies`: the budget of a message that sets none is its destination's policy's.
    pub fn new(row: &OutboxRow, policies: &Policies) -> Self {
        Self {
            event_id: row.event_id.clone(),
            channel: row.channel,
            destination: row.destination.clone(),
            state: row.state,
            attempts: row.attempts,
            max_attempts: row
                .max_attempts
                .map(i64::from)
                .unwrap_or_else(|| i64::from(policies.of(&row.destination).max_attempts)),
            semantics: row.semantics,
            retry_policy: row.retry_policy.clone(),
            retry_policy_version: row.retry_policy_version.clone(),
            retry_policy_version_now: policies.of(&row.destination).version.clone(),
            fingerprint: row.request_fingerprint.clone(),
            scheduled_at: ts(&row.scheduled_at),
            next_attempt_at: row.next_attempt_at.as_ref().map(ts),
            expires_at: row.expires_at.as_ref().map(ts),
            last_error_class: row.last_error_class,
            provider_message_id: row.provider_message_id.clone(),
            delivery_status: row.delivery_status.clone(),
            delivery_status_at: row.delivery_status_at.as_ref().map(ts),
            created_at: ts(&row.created_at),
            updated_at: ts(&row.updated_at),
            state_reason: row.state_reason.clone(),
            ordering_key: row.ordering_key.clone(),
            ordering_seq: row.ordering_seq,
            ordering_policy: row.ordering_policy,
            ordering_policy_applied: policies.ordering_of(
                row.ordering_key.is_some(),
                row.ordering_policy,
                &row.destination,
            ),
            blocked_by: None,
            receipts: None,
        }
    }
}

/// A fan-out (`destination = "type:EVENT.TYPE"`): `POST /v1/messages` and
/// `GET /v1/messages/{event_id}` of the original event id.
#[derive(Debug, Serialize, ToSchema)]
pub struct FanOutView {
    pub event_id: String,
    pub channel: Channel,
    pub destination: String,
    pub event_type: String,
    /// Every endpoint it went to, by name (one child each, event id `{event_id}:{endpoint}`).
    pub endpoints: Vec<String>,
    /// The children's messages (a child purged by retention is no longer listed).
    pub messages: Vec<MessageView>,
}

impl FanOutView {
    pub fn new(f: &FanOut, policies: &Policies, who: &crate::auth::Principal) -> Self {
        Self {
            event_id: f.event_id.clone(),
            channel: Channel::Webhook,
            destination: format!("type:{}", f.event_type),
            event_type: f.event_type.clone(),
            endpoints: f.children.iter().map(|(c, _)| c.endpoint.clone()).collect(),
            messages: f
                .children
                .iter()
                .filter_map(|(_, m)| m.as_ref())
                .map(|m| MessageView::for_caller(m, policies, who))
                .collect(),
        }
    }
}

/// `GET /readyz` when ready.
#[derive(Debug, Serialize, ToSchema)]
pub struct Ready {
    /// Always `ready`.
    #[schema(example = "ready")]
    pub status: &'static str,
}

/// `GET /readyz` when not ready: a problem (`type` …`/not-ready`, status 503) with the reasons.
#[derive(Debug, Serialize, ToSchema)]
pub struct NotReadyProblem {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub title: &'static str,
    pub status: u16,
    /// Every reason's detail, joined by `; `.
    pub detail: String,
    pub reasons: Vec<crate::health::NotReady>,
}

/// One receipt no message has claimed yet (`GET /v1/receipts/unmatched`).
#[derive(Debug, Serialize, ToSchema)]
pub struct UnmatchedReceipt {
    pub receipt: ReceiptView,
    /// The Herald event id the provider echoed, if any.
    pub herald_event_id: Option<String>,
    pub provider_message_id: Option<String>,
    /// How often matching it was tried.
    pub match_attempts: i32,
    /// When it is tried next (`null`: no longer tried).
    #[schema(format = DateTime)]
    pub next_match_at: Option<String>,
}

/// `GET /v1/receipts/unmatched`: how many, and a page of the oldest.
#[derive(Debug, Serialize, ToSchema)]
pub struct UnmatchedReceipts {
    /// All unmatched receipts, not only those listed.
    pub count: i64,
    pub receipts: Vec<UnmatchedReceipt>,
    /// `after` for the next page (`null`: this is the last).
    pub next: Option<i64>,
}

/// One named endpoint (`GET /v1/endpoints`): never its URL path, secrets or headers.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointView {
    pub name: String,
    pub host: Option<String>,
    pub event_types: Vec<String>,
    pub rate_limit_per_second: Option<f64>,
    /// The burst in force: as configured, else the rate rounded up (it read `null` while the
    /// default applied; an operator's walk-through).
    pub burst: Option<u32>,
    pub max_in_flight: Option<u32>,
    pub disable_after_failures: Option<u32>,
    pub disable_after_seconds: Option<u64>,
    pub disabled: bool,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub disabled_at: Option<DateTime<Utc>>,
    pub disabled_reason: Option<String>,
}

/// `GET /v1/endpoints`.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointList {
    pub endpoints: Vec<EndpointView>,
}

/// `POST /v1/endpoints/{name}/enable`.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointEnabled {
    pub name: String,
    /// Always `true`.
    pub enabled: bool,
    /// `false`: it was not disabled.
    pub changed: bool,
}

/// `POST /v1/ingest/{source}`: what was stored.
#[derive(Debug, Serialize, ToSchema)]
pub struct IngestAck {
    /// New receipts stored.
    pub stored: usize,
    /// Receipts already stored before (a provider's retry).
    pub duplicates: usize,
}
