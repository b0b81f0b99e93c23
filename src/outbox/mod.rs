//! The way in: validate a notification intent and write it into `herald_outbox`.
//!
//! [`enqueue`] runs on the caller's own diesel connection, so inside the caller's transaction the
//! message commits — or rolls back — with the business change that caused it. The HTTP API and
//! the library share [`NewMessage::plan`], so every way in produces the same rows.
//!
//! A webhook to `type:EVENT.TYPE` is a **fan-out**: one row per endpoint subscribed to the type
//! (`[endpoints.NAME] event_types`, as stored in `herald_subscriptions`), each with its own event
//! id `{event_id}:{endpoint}` and destination `endpoint:{endpoint}`, written in one transaction
//! with their `herald_fanouts` links ([`FanOutPlan::expand`] decides the rows; storage writes
//! them). No subscriber is a refusal naming `destination`, never a silent no-op.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::channels::webhook::{AllowList, Endpoint};
use crate::channels::{email, webhook};
use crate::domain::event_type::{EventType, subscribers};
use crate::domain::{
    Channel, EventId, Fingerprint, FingerprintInput, InvalidField, Semantics, State,
};
use crate::storage::fanout::{Expand, FanoutChild, FanoutRow, StoredFanout};
use crate::storage::models::{NewOutboxRow, OutboxRow};
use crate::storage::{Db, StorageError, queries};

/// The longest `destination` taken, in bytes: a URL or a mailbox with its display name.
pub const MAX_DESTINATION_BYTES: usize = 2048;

/// A notification intent, as an application states it.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub event_id: String,
    pub channel: Channel,
    /// A URL, `endpoint:NAME` or `type:EVENT.TYPE` (webhook), or the recipient address (email).
    pub destination: String,
    /// Webhook: `{"body": …, "headers"?: {…}}`. Email: `{"subject", "text"?, "html"?, …}`.
    pub payload: Value,
    /// Not before this time; default now.
    pub scheduled_at: Option<DateTime<Utc>>,
    /// Never send after this time.
    pub expires_at: Option<DateTime<Utc>>,
    pub semantics: Semantics,
    /// Default: the retry policy's `max_attempts`.
    pub max_attempts: Option<u32>,
    /// Messages with the same key and destination are attempted one at a time, in their order
    /// (README, "Ordered delivery"). `None`: no ordering.
    pub ordering_key: Option<String>,
    /// What the key does when this message ends dead or unconfirmed; `None`: its endpoint's
    /// `ordering_policy`, else `block`.
    pub ordering_policy: Option<crate::domain::OrderingPolicy>,
}

impl NewMessage {
    /// A webhook whose request body is exactly `body` serialized.
    pub fn webhook(
        event_id: impl Into<String>,
        destination: impl Into<String>,
        body: Value,
    ) -> Self {
        Self {
            event_id: event_id.into(),
            channel: Channel::Webhook,
            destination: destination.into(),
            payload: serde_json::json!({ "body": body }),
            scheduled_at: None,
            expires_at: None,
            semantics: Semantics::AtLeastOnce,
            max_attempts: None,
            ordering_key: None,
            ordering_policy: None,
        }
    }

    /// An email to `to` with a plain-text body.
    pub fn email(
        event_id: impl Into<String>,
        to: impl Into<String>,
        subject: impl Into<String>,
        text: impl Into<String>,
    ) -> Self {
        Self {
            event_id: event_id.into(),
            channel: Channel::Email,
            destination: to.into(),
            payload: serde_json::json!({ "subject": subject.into(), "text": text.into() }),
            scheduled_at: None,
            expires_at: None,
            semantics: Semantics::AtLeastOnce,
            max_attempts: None,
            ordering_key: None,
            ordering_policy: None,
        }
    }

    /// Validates every field and resolves defaults; all problems at once, each naming its field.
    /// A `type:` destination (a fan-out, several rows) is refused here: use [`NewMessage::plan`].
    pub fn prepare(
        &self,
        limits: &Limits,
        now: DateTime<Utc>,
    ) -> Result<NewOutboxRow, Vec<InvalidField>> {
        match self.plan(limits, now)? {
            Prepared::Message(row) => Ok(row),
            Prepared::FanOut(_) => Err(vec![InvalidField::new(
                "destination",
                "a type: destination fans out to several messages; enqueue it with enqueue or plan",
            )]),
        }
    }

    /// Validates the message and says what it becomes: one row, or a fan-out to expand over the
    /// stored subscriptions in the enqueue transaction.
    pub fn plan<'a>(
        &self,
        limits: &Limits<'a>,
        now: DateTime<Utc>,
    ) -> Result<Prepared<'a>, Vec<InvalidField>> {
        let row = self.validate(limits, now)?;
        let target = (self.channel == Channel::Webhook)
            .then(|| webhook::WebhookTarget::parse(&self.destination).ok())
            .flatten();
        Ok(match target {
            Some(webhook::WebhookTarget::Type(event_type)) => Prepared::FanOut(FanOutPlan {
                message: self.clone(),
                event_id: row.event_id,
                event_type,
                limits: limits.clone(),
                now,
            }),
            _ => Prepared::Message(row),
        })
    }

    fn validate(
        &self,
        limits: &Limits,
        now: DateTime<Utc>,
    ) -> Result<NewOutboxRow, Vec<InvalidField>> {
        let mut errors = Vec::new();
        let event_id = EventId::parse(&self.event_id)
            .map_err(|e| errors.push(e))
            .ok();
        // Parsed once here, and used again for the request fingerprint below.
        let mut webhook_payload = None;
        // Its ordering indexes hold it whole, and a PostgreSQL index entry holds ~2.7 KB.
        if self.destination.len() > MAX_DESTINATION_BYTES {
            errors.push(InvalidField::new(
                "destination",
                format!("is longer than {MAX_DESTINATION_BYTES} bytes"),
            ));
        }
        // As the table refuses them (`herald_outbox_printable`): a URL parser drops a tab or a
        // line feed, the stored text keeps it, and it reaches logs and terminals raw.
        if crate::telemetry::holds_unprintable(&self.destination) {
            errors.push(InvalidField::new(
                "destination",
                "must not contain control or bidirectional-formatting characters",
            ));
        }
        match self.channel {
            Channel::Webhook => {
                // The named endpoint, whose configured headers a message's own may not set.
                let mut endpoint = None;
                match webhook::WebhookTarget::parse_written(&self.destination) {
                    Ok(webhook::WebhookTarget::Endpoint(name)) => {
                        endpoint = limits.endpoints.and_then(|known| known.get(&name));
                        if let Some(known) = limits.endpoints
                            && !known.contains_key(&name)
                        {
                            errors.push(InvalidField::new(
                                "destination",
                                format!("no endpoint named {name:?} is configured"),
                            ));
                        }
                    }
                    Ok(webhook::WebhookTarget::Url(url)) => {
                        if let Some(allow) = limits.allow_networks
                            && let Err(r) = webhook::ssrf::check_url_literal(&url, allow)
                        {
                            errors.push(InvalidField::new(
                                "destination",
                                format!(
                                    "refused by the SSRF guard: {r}; Herald sends only to public \
                                     addresses unless the network is in allow_networks \
                                     (HERALD_ALLOW_NETWORKS)"
                                ),
                            ));
                        }
                    }
                    Ok(webhook::WebhookTarget::Type(_)) => {}
                    Err(e) => errors.push(e),
                }
                match webhook::WebhookPayload::parse(&self.payload) {
                    Ok(p) => {
                        let written = p.check_written();
                        // Both go in one request: receivers take one header block. Only where
                        // the message adds headers of its own: an endpoint over the budget by
                        // itself was named at start and is sent as configured.
                        if written.is_ok()
                            && !p.headers.is_empty()
                            && let Some(e) = endpoint
                            && let Err(over) = webhook::check_header_budget(
                                "payload.headers",
                                p.headers
                                    .iter()
                                    .chain(&e.headers)
                                    .map(|(k, v)| (k.as_str(), v.as_str())),
                                Some(&e.name),
                            )
                        {
                            errors.push(over);
                        }
                        if let Err(e) = written {
                            errors.push(e);
                        }
                        // The endpoint's would be sent instead, this one dropped unseen.
                        for (header, _) in &p.headers {
                            if let Some(e) = endpoint.filter(|e| e.sets_header(header)) {
                                errors.push(InvalidField::new(
                                    format!("payload.headers.{header}"),
                                    format!(
                                        "is set by endpoint {:?}'s configuration, which the \
                                         request carries instead",
                                        e.name
                                    ),
                                ));
                            }
                        }
                        webhook_payload = Some(p);
                    }
                    Err(e) => errors.push(e),
                }
            }
            Channel::Email => {
                if let Err(e) = email::parse_recipient(&self.destination) {
                    errors.push(e);
                }
                if let Err(e) = email::EmailPayload::parse_all(&self.payload) {
                    errors.extend(e);
                }
            }
        }
        // PostgreSQL's text and jsonb cannot hold NUL: refuse it here, on every way in and on
        // both backends alike, naming where it is.
        if self.destination.contains('\0') {
            errors.push(InvalidField::new(
                "destination",
                "must not contain a NUL character",
            ));
        }
        if let Some(path) = nul_path(&self.payload, "payload") {
            errors.push(InvalidField::new(path, "must not contain a NUL character"));
        }
        // An email's request bytes for its fingerprint are this very serialization.
        let json = serde_json::to_vec(&self.payload).ok();
        let size = json.as_ref().map_or(usize::MAX, Vec::len);
        if size > limits.max_payload_bytes {
            errors.push(InvalidField::new(
                "payload",
                format!(
                    "is {size} bytes; the limit is {} bytes",
                    limits.max_payload_bytes
                ),
            ));
        }
        if let Some(n) = self.max_attempts
            && !(1..=100).contains(&n)
        {
            errors.push(InvalidField::new(
                "max_attempts",
                "must be between 1 and 100",
            ));
        }
        if let Some(key) = &self.ordering_key
            && let Err(e) = crate::domain::OrderingKey::parse(key)
        {
            errors.push(e);
        }
        // A policy says what a key does when its head ends; without a key it would be kept and
        // never read.
        if self.ordering_policy.is_some() && self.ordering_key.is_none() {
            errors.push(InvalidField::new(
                "ordering_policy",
                "applies only to a message with an ordering_key",
            ));
        }
        for (field, t) in [
            ("scheduled_at", self.scheduled_at),
            ("expires_at", self.expires_at),
        ] {
            if let Some(Err(e)) = t.map(|t| crate::domain::storable_time(field, t)) {
                errors.push(e);
            }
        }
        // As they will be stored (a leap second the next minute's first, to the microsecond):
        // `23:59:60` scheduled and the next `00:00:00` expiring were taken, and stored equal.
        let scheduled_at = self.scheduled_at.map_or(now, trunc);
        match self.expires_at.map(trunc) {
            // Taken, it would only ever be `expired`, never sent.
            Some(expires) if expires <= now => errors.push(InvalidField::new(
                "expires_at",
                "has passed already: it must be later than now",
            )),
            Some(expires) if expires <= scheduled_at => errors.push(InvalidField::new(
                "expires_at",
                "must be later than scheduled_at",
            )),
            _ => {}
        }
        let Some(event_id) = event_id.filter(|_| errors.is_empty()) else {
            return Err(errors);
        };
        let request = match (self.channel, webhook_payload) {
            (Channel::Webhook, Some(p)) => Some(RequestBytes::of_webhook(p)),
            (Channel::Email, _) => json.map(RequestBytes::of_email),
            (Channel::Webhook, None) => None,
        };
        let fingerprint =
            request.map(|r| r.fingerprint(self.channel, &self.destination, event_id.as_str()));
        Ok(NewOutboxRow {
            event_id: event_id.as_str().to_owned(),
            channel: self.channel,
            destination: self.destination.clone(),
            payload: self.payload.clone(),
            scheduled_at: self.scheduled_at.map(trunc),
            max_attempts: self.max_attempts.map(|n| n as i32),
            retry_policy: limits.policies.map_or_else(
                || "default".to_owned(),
                |p| p.of(&self.destination).name.clone(),
            ),
            // A fan-out's children copy its row: none recorded, each child's first claim
            // records its own endpoint's.
            retry_policy_version: limits
                .policies
                .filter(|_| !self.destination.starts_with("type:"))
                .map(|p| p.of(&self.destination).version.clone()),
            message_key: (self.channel == Channel::Email)
                .then(|| crate::domain::email_message_key(event_id.as_str())),
            semantics: self.semantics,
            expires_at: self.expires_at.map(trunc),
            request_fingerprint: fingerprint.map(|f| f.as_str().to_owned()),
            enqueued_by: None,
            ordering_key: self.ordering_key.clone(),
            ordering_policy: self.ordering_policy,
            now,
        })
    }
}

/// What a validated message becomes.
#[derive(Debug, Clone)]
pub enum Prepared<'a> {
    /// One row.
    Message(NewOutboxRow),
    /// `type:EVENT.TYPE`: one row per subscribed endpoint, decided in the enqueue transaction.
    FanOut(FanOutPlan<'a>),
}

/// A validated fan-out, waiting for the subscriptions of the transaction that writes it.
#[derive(Debug, Clone)]
pub struct FanOutPlan<'a> {
    message: NewMessage,
    event_id: String,
    event_type: EventType,
    limits: Limits<'a>,
    now: DateTime<Utc>,
}

impl FanOutPlan<'_> {
    /// The original event id (the children's ids are `{event_id}:{endpoint}`).
    pub fn event_id(&self) -> &str {
        &self.event_id
    }

    pub fn event_type(&self) -> &EventType {
        &self.event_type
    }

    /// The child rows over `subscriptions` (`(endpoint, pattern)` pairs): one per subscribed
    /// endpoint, in name order, each validated as an `endpoint:NAME` message of its own. No
    /// subscriber is a refusal naming `destination`.
    pub fn expand(
        &self,
        subscriptions: &[(String, String)],
    ) -> Result<Vec<FanoutChild>, Vec<InvalidField>> {
        let names = subscribers(
            subscriptions.iter().map(|(e, p)| (e.as_str(), p.as_str())),
            &self.event_type,
        );
        if names.is_empty() {
            return Err(vec![InvalidField::new(
                "destination",
                format!(
                    "no endpoint subscribes to event type {:?}; subscribe one with \
                     [endpoints.NAME] event_types",
                    self.event_type.as_str()
                ),
            )]);
        }
        let mut errors = Vec::new();
        let mut children = Vec::new();
        for name in names {
            let child = NewMessage {
                event_id: format!("{}:{name}", self.event_id),
                destination: crate::domain::endpoint_destination(&name),
                ..self.message.clone()
            };
            match child.validate(&self.limits, self.now) {
                Ok(row) => children.push(FanoutChild {
                    endpoint: name,
                    event_type: self.event_type.as_str().to_owned(),
                    row,
                }),
                Err(e) => errors.extend(e.into_iter().map(|mut e| {
                    if e.field == "event_id" {
                        e.message = format!(
                            "the fan-out event id {:?} (event_id:endpoint) {}",
                            child.event_id, e.message
                        );
                    }
                    e
                })),
            }
        }
        if errors.is_empty() {
            Ok(children)
        } else {
            errors.dedup();
            Err(errors)
        }
    }
}

/// Where in `value` the first NUL character is (in a key or a string), as a dotted path.
fn nul_path(value: &Value, at: &str) -> Option<String> {
    match value {
        Value::String(s) => s.contains('\0').then(|| at.to_owned()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| nul_path(v, &format!("{at}[{i}]"))),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            let path = format!("{at}.{}", k.replace('\0', "\\u0000"));
            if k.contains('\0') {
                Some(path)
            } else {
                nul_path(v, &path)
            }
        }),
        _ => None,
    }
}

fn trunc(t: DateTime<Utc>) -> DateTime<Utc> {
    use chrono::SubsecRound;
    crate::domain::without_leap_second(t).trunc_subsecs(6)
}

/// The request fingerprint of a message, from what the message itself defines (see
/// [`crate::domain::Fingerprint`]); `None` when the payload does not parse.
pub fn fingerprint_of(
    channel: Channel,
    destination: &str,
    event_id: &str,
    payload: &Value,
) -> Option<Fingerprint> {
    Some(RequestBytes::of(channel, payload)?.fingerprint(channel, destination, event_id))
}

/// What a message's request fingerprint covers, as bytes: a webhook's exact request body (its
/// `body` serialized once: the sender sends these very bytes) and its own headers; an email's
/// payload as JSON.
#[derive(Debug)]
pub struct RequestBytes {
    pub body: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

impl RequestBytes {
    /// `None` when the payload does not parse.
    pub fn of(channel: Channel, payload: &Value) -> Option<Self> {
        Some(match channel {
            Channel::Webhook => Self::of_webhook(webhook::WebhookPayload::parse(payload).ok()?),
            Channel::Email => Self::of_email(serde_json::to_vec(payload).ok()?),
        })
    }

    /// A webhook's: its body serialized, and its own headers.
    pub fn of_webhook(p: webhook::WebhookPayload<'_>) -> Self {
        Self {
            body: p.body_bytes(),
            headers: p.headers,
        }
    }

    /// An email's: its payload serialized as JSON (`json`).
    pub fn of_email(json: Vec<u8>) -> Self {
        Self {
            body: json,
            headers: Vec::new(),
        }
    }

    pub fn fingerprint(&self, channel: Channel, destination: &str, event_id: &str) -> Fingerprint {
        Fingerprint::compute(&FingerprintInput {
            channel: channel.as_str(),
            destination,
            event_id,
            body: &self.body,
            headers: &self.headers,
        })
    }
}

/// What validation needs from Herald's configuration.
#[derive(Debug, Clone)]
pub struct Limits<'a> {
    pub max_payload_bytes: usize,
    /// The policy recorded on the row, by its destination (an endpoint's own, else the global);
    /// `None` (the library) records the name `default` and no version, which the first claim
    /// records then.
    pub policies: Option<&'a crate::domain::policies::Policies>,
    /// Configured endpoints; `None` (the library) skips the name check: an unknown endpoint is
    /// then `not_sent` at send time, retried (another process may have it) until the retry
    /// budget is spent, and warned about once per process.
    pub endpoints: Option<&'a BTreeMap<String, Endpoint>>,
    /// The SSRF guard's allow-list: a URL with a refused IP literal is invalid. `None` (the
    /// library) skips the check: the sender refuses such a message (`permanent`, no request).
    pub allow_networks: Option<&'a AllowList>,
}

impl Default for Limits<'_> {
    fn default() -> Self {
        Self {
            max_payload_bytes: 256 * 1024,
            policies: None,
            endpoints: None,
            allow_networks: None,
        }
    }
}

/// Why a cancel request did not cancel.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("no message with that event id")]
    NotFound,
    /// Already sending or finished: only `scheduled` and `retryable` messages can be canceled.
    #[error("it is {0}; only scheduled or retryable messages can be canceled")]
    NotCancelable(State),
    /// The event id is a fan-out's own: it names no message. Cancel each of its messages by its
    /// own event id (listed in the [`FanOut`] its enqueue returned).
    #[error("it is a fan-out's own event id; cancel each of its messages by its own event id")]
    FanOut,
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// `scheduled|retryable → canceled`, in one transaction. A message already `canceled` is
/// returned as it is (canceling twice is not an error); `changed` says whether this call did it.
pub fn cancel(
    db: &Db,
    event_id: &str,
    now: DateTime<Utc>,
) -> Result<(bool, OutboxRow), CancelError> {
    let (changed, row) = db.cancel(event_id, now)?;
    decide_cancel(changed, row)
}

/// Cancels a message on the application's own connection, inside its transaction (DESIGN:
/// "application cancels in its own transaction"): nothing is sent for it once the transaction
/// commits, and a rollback undoes the cancel. The same rule as `POST
/// /v1/messages/{event_id}/cancel`: a `scheduled` or `retryable` message, or a keyed
/// `dead_letter`/`unconfirmed` head that holds its key (the key's next message becomes due);
/// `canceled` already is the same answer; in flight or finished is [`CancelError::NotCancelable`].
/// A fan-out's own event id names no message: [`CancelError::FanOut`]; cancel its messages by
/// their own ids.
///
/// ```no_run
/// # use diesel::Connection;
/// # fn run(conn: &mut diesel::pg::PgConnection) -> Result<(), Box<dyn std::error::Error>> {
/// conn.transaction(|conn| {
///     // … the business change (the reservation canceled) …
///     herald::outbox::cancel_in(conn, "reservation-7:reminder")
///         .map_err(|e| diesel::result::Error::QueryBuilderError(e.into()))
/// })?;
/// # Ok(()) }
/// ```
pub fn cancel_in<C: OutboxConnection>(
    conn: &mut C,
    event_id: &str,
) -> Result<(bool, OutboxRow), CancelError> {
    if event_id.contains('\0') {
        return Err(CancelError::NotFound);
    }
    let now = crate::clock::Clock::now(&crate::clock::SystemClock);
    let changed = conn
        .cancel_outbox_row(event_id, now)
        .map_err(StorageError::from)?;
    let row = conn.find_outbox_row(event_id).map_err(StorageError::from)?;
    if row.is_none() && conn.is_fanout(event_id).map_err(StorageError::from)? {
        return Err(CancelError::FanOut);
    }
    decide_cancel(changed, row)
}

/// The cancel decision over what storage reports: changed now, already canceled, or refused.
fn decide_cancel(changed: bool, row: Option<OutboxRow>) -> Result<(bool, OutboxRow), CancelError> {
    let row = row.ok_or(CancelError::NotFound)?;
    if changed || row.state == State::Canceled {
        Ok((changed, row))
    } else {
        Err(CancelError::NotCancelable(row.state))
    }
}

/// What [`enqueue`] did.
// One value per enqueue call, returned once: boxing the row would only cost callers a deref.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Enqueued {
    /// One message.
    Message {
        /// `false` when the event id was already in the outbox (nothing changed).
        created: bool,
        row: OutboxRow,
    },
    /// A fan-out (`type:EVENT.TYPE`).
    FanOut(FanOut),
}

impl Enqueued {
    /// Whether this call wrote anything (`false`: the event id was there already).
    pub fn created(&self) -> bool {
        match self {
            Enqueued::Message { created, .. } => *created,
            Enqueued::FanOut(f) => f.created,
        }
    }

    /// The rows it stands for: the message, or the fan-out's children (those not purged).
    pub fn rows(&self) -> Vec<&OutboxRow> {
        match self {
            Enqueued::Message { row, .. } => vec![row],
            Enqueued::FanOut(f) => f.children.iter().filter_map(|(_, m)| m.as_ref()).collect(),
        }
    }
}

/// A stored fan-out: the original event id and its children.
#[derive(Debug, Clone)]
pub struct FanOut {
    /// `false` when the event id had been fanned out already (nothing changed).
    pub created: bool,
    pub event_id: String,
    pub event_type: String,
    /// Each child link with its message (`None` once retention purged it), by endpoint name.
    pub children: Vec<(FanoutRow, Option<OutboxRow>)>,
}

impl FanOut {
    pub fn from_stored(event_id: &str, stored: StoredFanout) -> Self {
        Self {
            created: stored.created,
            event_id: event_id.to_owned(),
            event_type: stored
                .children
                .first()
                .map(|(f, _)| f.event_type.clone())
                .unwrap_or_default(),
            children: stored.children,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    #[error("invalid message: {}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<InvalidField>),
    #[error("database error")]
    Database(#[from] diesel::result::Error),
}

/// A diesel connection Herald can enqueue on: PostgreSQL or SQLite.
pub trait OutboxConnection {
    fn insert_outbox_row(&mut self, row: &NewOutboxRow) -> diesel::QueryResult<Option<i64>>;
    fn find_outbox_row(&mut self, event_id: &str) -> diesel::QueryResult<Option<OutboxRow>>;
    /// Whether `event_id` names a fan-out (its children are in `herald_fanouts`).
    fn is_fanout(&mut self, event_id: &str) -> diesel::QueryResult<bool>;
    /// `scheduled|retryable → canceled` (and a keyed head that holds its key), the key's next
    /// message made due; whether the row changed. See [`cancel_in`].
    fn cancel_outbox_row(
        &mut self,
        event_id: &str,
        now: DateTime<Utc>,
    ) -> diesel::QueryResult<bool>;
    /// Writes a fan-out atomically (a savepoint inside the caller's transaction, a transaction of
    /// its own otherwise); see [`crate::storage::queries::pg::enqueue_fanout`].
    fn enqueue_fanout_rows(
        &mut self,
        event_id: &str,
        expand: Expand<'_>,
    ) -> diesel::QueryResult<Result<StoredFanout, Vec<InvalidField>>>;
}

impl OutboxConnection for diesel::pg::PgConnection {
    fn insert_outbox_row(&mut self, row: &NewOutboxRow) -> diesel::QueryResult<Option<i64>> {
        queries::pg::insert_message(self, row)
    }
    fn find_outbox_row(&mut self, event_id: &str) -> diesel::QueryResult<Option<OutboxRow>> {
        queries::pg::find_by_event_id(self, event_id)
    }
    fn is_fanout(&mut self, event_id: &str) -> diesel::QueryResult<bool> {
        Ok(!queries::pg::fanout_of(self, event_id)?.is_empty())
    }
    fn cancel_outbox_row(
        &mut self,
        event_id: &str,
        now: DateTime<Utc>,
    ) -> diesel::QueryResult<bool> {
        queries::pg::cancel(self, event_id, now)
    }
    fn enqueue_fanout_rows(
        &mut self,
        event_id: &str,
        expand: Expand<'_>,
    ) -> diesel::QueryResult<Result<StoredFanout, Vec<InvalidField>>> {
        diesel::Connection::transaction(self, |c| queries::pg::enqueue_fanout(c, event_id, expand))
    }
}

impl OutboxConnection for diesel::sqlite::SqliteConnection {
    fn insert_outbox_row(&mut self, row: &NewOutboxRow) -> diesel::QueryResult<Option<i64>> {
        queries::sqlite::insert_message(self, row)
    }
    fn find_outbox_row(&mut self, event_id: &str) -> diesel::QueryResult<Option<OutboxRow>> {
        queries::sqlite::find_by_event_id(self, event_id)
    }
    fn is_fanout(&mut self, event_id: &str) -> diesel::QueryResult<bool> {
        Ok(!queries::sqlite::fanout_of(self, event_id)?.is_empty())
    }
    fn cancel_outbox_row(
        &mut self,
        event_id: &str,
        now: DateTime<Utc>,
    ) -> diesel::QueryResult<bool> {
        queries::sqlite::cancel(self, event_id, now)
    }
    fn enqueue_fanout_rows(
        &mut self,
        event_id: &str,
        expand: Expand<'_>,
    ) -> diesel::QueryResult<Result<StoredFanout, Vec<InvalidField>>> {
        diesel::Connection::transaction(self, |c| {
            queries::sqlite::enqueue_fanout(c, event_id, expand)
        })
    }
}

/// Writes `message` into the outbox on the caller's connection — inside the caller's
/// transaction when there is one. A duplicate event id is a no-op that returns the existing row.
/// A `type:EVENT.TYPE` webhook fans out to the endpoints subscribed in `herald_subscriptions`
/// (which Herald writes from its configuration at start-up); no subscriber is
/// [`EnqueueError::Invalid`] naming `destination`. A plain message under a fan-out's event id is
/// [`EnqueueError::Invalid`] naming `event_id`: one event id names one thing.
///
/// ```no_run
/// # use diesel::Connection;
/// # fn demo(conn: &mut diesel::pg::PgConnection) -> Result<(), herald::outbox::EnqueueError> {
/// conn.transaction(|conn| {
///     // … the business change …
///     herald::outbox::enqueue(
///         conn,
///         herald::outbox::NewMessage::webhook(
///             "order-42:placed",
///             "https://example.com/hooks",
///             serde_json::json!({"order": 42}),
///         ),
///     )
/// })?;
/// # Ok(()) }
/// ```
pub fn enqueue<C: OutboxConnection>(
    conn: &mut C,
    message: NewMessage,
) -> Result<Enqueued, EnqueueError> {
    let now = crate::clock::Clock::now(&crate::clock::SystemClock);
    enqueue_with(conn, &message, &Limits::default(), now)
}

/// Why a message cannot take an event id that a fan-out already holds.
pub fn fanout_holds_event_id() -> InvalidField {
    InvalidField::new("event_id", "is already the event id of a fan-out")
}

/// Writes a prepared message unless its event id exists; returns whether it was created and the
/// stored row. Refused naming `event_id` when the id is a fan-out's: one event id names one
/// thing. The check and the insert run on `conn`, in its transaction: the library's (the
/// caller's) and `POST /v1/messages`'s ([`crate::storage::Db::enqueue`]) alike; the HTTP one
/// first takes the event id's lock ([`crate::storage::sql::EVENT_ID_LOCK_CLASS`]).
pub fn enqueue_row<C: OutboxConnection>(
    conn: &mut C,
    row: &NewOutboxRow,
) -> diesel::QueryResult<Result<(bool, OutboxRow), Vec<InvalidField>>> {
    if conn.is_fanout(&row.event_id)? {
        return Ok(Err(vec![fanout_holds_event_id()]));
    }
    let created = conn.insert_outbox_row(row)?.is_some();
    let stored = conn
        .find_outbox_row(&row.event_id)?
        .ok_or(diesel::result::Error::NotFound)?;
    Ok(Ok((created, stored)))
}

/// [`enqueue`] with explicit limits and time (Herald's own API uses this).
pub fn enqueue_with<C: OutboxConnection>(
    conn: &mut C,
    message: &NewMessage,
    limits: &Limits<'_>,
    now: DateTime<Utc>,
) -> Result<Enqueued, EnqueueError> {
    match message.plan(limits, now).map_err(EnqueueError::Invalid)? {
        Prepared::Message(row) => {
            let (created, stored) = enqueue_row(conn, &row)?.map_err(EnqueueError::Invalid)?;
            Ok(Enqueued::Message {
                created,
                row: stored,
            })
        }
        Prepared::FanOut(plan) => {
            let stored = conn
                .enqueue_fanout_rows(plan.event_id(), &|subs| plan.expand(subs))?
                .map_err(EnqueueError::Invalid)?;
            Ok(Enqueued::FanOut(FanOut::from_stored(
                plan.event_id(),
                stored,
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        "2026-11-30T12:00:00Z".parse().unwrap()
    }

    fn fields(r: Result<NewOutboxRow, Vec<InvalidField>>) -> Vec<String> {
        r.unwrap_err().into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn a_good_webhook_prepares_with_defaults_and_a_fingerprint() {
        let m = NewMessage::webhook("e-1", "https://example.com/h", json!({"b": 1, "a": [1, 2]}));
        let row = m.prepare(&Limits::default(), now()).unwrap();
        assert_eq!(
            row.scheduled_at, None,
            "now, by the database clock on PostgreSQL"
        );
        assert_eq!(row.semantics, "at_least_once");
        assert_eq!(row.request_fingerprint.as_deref().map(str::len), Some(64));
    }

    /// The fingerprint written at enqueue is the one computed again from the stored row (the
    /// sender's, support's), for both channels: enqueue reuses the payload it parsed and
    /// serialized while validating.
    #[test]
    fn the_enqueue_fingerprint_is_the_stored_rows() {
        let webhook = NewMessage::webhook(
            "w-1",
            "https://example.com/h",
            json!({"b": "é", "a": [1, 2.5, null]}),
        );
        let mut with_headers = webhook.clone();
        with_headers.event_id = "w-2".into();
        with_headers.payload = json!({"body": {"z": 1, "a": 2}, "headers": {"X-Tenant": "t1"}});
        let email = NewMessage::email("m-1", "ada@example.com", "Hi", "Hello");
        for m in [webhook, with_headers, email] {
            let row = m.prepare(&Limits::default(), now()).unwrap();
            let again =
                fingerprint_of(row.channel, &row.destination, &row.event_id, &row.payload).unwrap();
            assert_eq!(
                row.request_fingerprint.as_deref(),
                Some(again.as_str()),
                "{}",
                row.event_id
            );
        }
    }

    #[test]
    fn every_bad_field_is_named() {
        let mut m = NewMessage::webhook("has space", "ftp://x", json!({"body": 1}));
        m.payload = json!({"headers": {"a": "b"}});
        m.max_attempts = Some(0);
        assert_eq!(
            fields(m.prepare(&Limits::default(), now())),
            ["event_id", "destination", "payload.body", "max_attempts"]
        );
        let m = NewMessage::email("e", "not-an-address", "", "hi");
        assert_eq!(
            fields(m.prepare(&Limits::default(), now())),
            ["destination", "payload.subject"]
        );
    }

    #[test]
    fn a_nul_anywhere_is_refused_with_its_path() {
        let m = NewMessage::webhook("e", "https://x.example/h", json!({"a": ["ok", "b\u{0}d"]}));
        assert_eq!(
            fields(m.prepare(&Limits::default(), now())),
            ["payload.body.a[1]"]
        );
        let mut m = NewMessage::email("e", "a@example.com", "hi", "text");
        m.payload["headers"] = json!({"X-Tag": "v\u{0}"});
        assert_eq!(
            fields(m.prepare(&Limits::default(), now())),
            ["payload.headers.X-Tag"]
        );
        let m = NewMessage::webhook("e", "https://x.example/h", json!({"k\u{0}": 1}));
        assert_eq!(
            fields(m.prepare(&Limits::default(), now())),
            ["payload.body.k\\u0000"]
        );
        let m = NewMessage::webhook("e", "https://x.example/\u{0}", json!({}));
        assert!(fields(m.prepare(&Limits::default(), now())).contains(&"destination".to_owned()));
    }

    #[test]
    fn payload_size_and_expiry_are_checked() {
        let m = NewMessage::webhook("e", "https://x.example/h", json!("x".repeat(100)));
        let limits = Limits {
            max_payload_bytes: 50,
            ..Limits::default()
        };
        assert_eq!(fields(m.prepare(&limits, now())), ["payload"]);
        let mut m = NewMessage::webhook("e", "https://x.example/h", json!({}));
        m.expires_at = Some(now());
        assert_eq!(fields(m.prepare(&Limits::default(), now())), ["expires_at"]);
        // Passed already, though later than a past scheduled_at: it could only expire.
        let hour = chrono::TimeDelta::hours(1);
        m.scheduled_at = Some(now() - hour * 2);
        m.expires_at = Some(now() - hour);
        let e = m.prepare(&Limits::default(), now()).unwrap_err();
        assert_eq!(e[0].field, "expires_at");
        assert!(e[0].message.contains("passed"), "{e:?}");
        // Later than now but not than scheduled_at.
        m.scheduled_at = Some(now() + hour * 2);
        m.expires_at = Some(now() + hour);
        let e = m.prepare(&Limits::default(), now()).unwrap_err();
        assert!(e[0].message.contains("later than scheduled_at"), "{e:?}");
        m.expires_at = Some(now() + hour * 3);
        assert!(m.prepare(&Limits::default(), now()).is_ok());
        // Compared as stored: a leap second is the next minute's first, so expiring then is
        // expiring when it is scheduled (both were taken, and stored equal).
        let at = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap().to_utc();
        m.scheduled_at = Some(at("2030-06-30T23:59:60Z"));
        m.expires_at = Some(at("2030-07-01T00:00:00Z"));
        let e = m.prepare(&Limits::default(), now()).unwrap_err();
        assert!(e[0].message.contains("later than scheduled_at"), "{e:?}");
    }

    /// Times both backends store (years 1–9999 in UTC), and a destination an index entry holds.
    #[test]
    fn times_and_destinations_beyond_what_storage_holds_are_refused() {
        let at = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap().to_utc();
        let mut m = NewMessage::webhook("e", "https://x.example/h", json!({}));
        m.scheduled_at = Some(at("9999-12-31T23:59:59-01:00"));
        assert_eq!(
            fields(m.prepare(&Limits::default(), now())),
            ["scheduled_at"]
        );
        m.scheduled_at = Some(at("9999-12-31T23:59:59Z"));
        m.expires_at = Some(at("9999-12-31T23:59:59Z") + chrono::TimeDelta::days(1));
        assert_eq!(fields(m.prepare(&Limits::default(), now())), ["expires_at"]);
        m.expires_at = None;
        assert!(m.prepare(&Limits::default(), now()).is_ok());
        let url = |n: usize| format!("https://x.example/{}", "a".repeat(n - 18));
        assert_eq!(url(MAX_DESTINATION_BYTES).len(), MAX_DESTINATION_BYTES);
        let m = NewMessage::webhook("e", url(MAX_DESTINATION_BYTES), json!({}));
        assert!(m.prepare(&Limits::default(), now()).is_ok());
        let m = NewMessage::webhook("e", url(MAX_DESTINATION_BYTES + 1), json!({}));
        assert_eq!(
            fields(m.prepare(&Limits::default(), now())),
            ["destination"]
        );
        for bad in [
            "https://x.example/a\nb",
            "https://x.example/\u{202e}",
            "endpoint:a\tb",
        ] {
            let m = NewMessage::webhook("e", bad.to_owned(), json!({}));
            assert!(
                fields(m.prepare(&Limits::default(), now())).contains(&"destination".to_owned()),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn unknown_endpoints_are_refused_when_the_config_is_known() {
        let endpoints = BTreeMap::new();
        let limits = Limits {
            endpoints: Some(&endpoints),
            ..Limits::default()
        };
        let m = NewMessage::webhook("e", "endpoint:billing", json!({}));
        assert_eq!(fields(m.prepare(&limits, now())), ["destination"]);
        assert!(m.prepare(&Limits::default(), now()).is_ok());
    }

    #[test]
    fn refused_literal_addresses_are_invalid_when_the_guard_is_known() {
        let none = AllowList::default();
        let loopback = AllowList::parse(["127.0.0.0/8"]).unwrap();
        let with = |allow| Limits {
            allow_networks: Some(allow),
            ..Limits::default()
        };
        for url in [
            "http://127.0.0.1:9/h",
            "http://10.0.0.1/h",
            "http://[::ffff:169.254.169.254]/latest",
            "http://0x7f000001/h",
        ] {
            let m = NewMessage::webhook("e", url, json!({}));
            let errors = m.prepare(&with(&none), now()).unwrap_err();
            assert_eq!(errors[0].field, "destination", "{url}");
            assert!(
                errors[0].message.contains("SSRF guard"),
                "{}",
                errors[0].message
            );
            assert!(
                m.prepare(&Limits::default(), now()).is_ok(),
                "library: {url}"
            );
        }
        let m = NewMessage::webhook("e", "http://127.0.0.1:9/h", json!({}));
        assert!(m.prepare(&with(&loopback), now()).is_ok());
        // Names are checked when they resolve, at send time.
        let m = NewMessage::webhook("e", "http://localhost:9/h", json!({}));
        assert!(m.prepare(&with(&none), now()).is_ok());
    }

    #[test]
    fn json_serialization_is_canonical() {
        // Fingerprints depend on it: a dependency enabling serde_json's preserve_order would
        // silently change the bytes sent and break this.
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"d":2,"c":3}}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"a":{"c":3,"d":2},"b":1}"#
        );
    }
}
