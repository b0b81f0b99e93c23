//! What support sees of a message: identifiers, times, classes, statuses and Herald's own
//! reasons — never a body, a provider's response text, an address in clear, a URL path or query,
//! or a secret. Every view here is built from rows by these functions only, so that is the one
//! place to check.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

use crate::domain::{AttemptClass, Channel, Semantics, State};
use crate::storage::models::{AttemptRow, LastAttempt, OutboxRow, ReceiptRow, ReplayRow};
use crate::telemetry::{mask_email, mask_emails_in, mask_url};

/// RFC 3339 in UTC with microseconds, as the rest of the API writes times.
pub fn ts(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// A destination as support may see it: a webhook URL reduced to scheme and host (no path,
/// query or credentials), `endpoint:NAME` as it is (the name is configuration, not data), an
/// email address masked (`u***@e***.com`).
pub fn mask_destination(channel: Channel, destination: &str) -> String {
    match channel {
        Channel::Email => mask_email(destination),
        Channel::Webhook if crate::domain::endpoint_name(destination).is_some() => {
            destination.to_owned()
        }
        Channel::Webhook => mask_url(destination),
    }
}

/// Free text a person typed (a replay reason) with every word that holds an `@` masked: a
/// support engineer may paste a customer's address into it.
pub use crate::telemetry::mask_emails_in_words as mask_free_text;

/// The explanation of one message (`GET /v1/sends/{fingerprint}`, `herald explain`).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Explanation {
    pub event_id: String,
    pub fingerprint: Option<String>,
    pub channel: Channel,
    /// Masked: see [`mask_destination`].
    pub destination: String,
    pub semantics: Semantics,
    /// The API token that enqueued it (`None`: SQL or the library).
    pub enqueued_by: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub scheduled_at: String,
    #[schema(format = DateTime)]
    pub expires_at: Option<String>,
    #[schema(format = DateTime)]
    pub updated_at: String,
    pub state: State,
    pub state_reason: Option<String>,
    pub last_error_class: Option<AttemptClass>,
    #[schema(format = DateTime)]
    pub next_attempt_at: Option<String>,
    /// While `sending`: until when the sender that claimed it holds it (after then a running
    /// Herald's lease watchdog takes it back).
    #[schema(format = DateTime)]
    pub lease_until: Option<String>,
    pub delivery_status: Option<String>,
    #[schema(format = DateTime)]
    pub delivery_status_at: Option<String>,
    pub provider_message_id: Option<String>,
    /// Every attempt ever made.
    pub attempts: i32,
    /// The attempt budget of a series.
    pub max_attempts: i64,
    /// The attempt number the current series started at (1 unless replayed).
    pub series_start: i32,
    /// Attempts made in the current series (what the budget counts).
    pub series_attempts: i32,
    pub retry_policy: String,
    pub retry_policy_version: Option<String>,
    pub attempt_timeline: Vec<AttemptEntry>,
    pub receipt_timeline: Vec<ReceiptEntry>,
    pub replays: Vec<ReplayEntry>,
    /// Its ordering key and where it stands in it (left out for an unkeyed message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering: Option<OrderingFacts>,
    /// Its named endpoint is disabled and it waits for it (left out otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_disabled: Option<EndpointDisabled>,
    /// One plain-language paragraph built from the facts above.
    pub explanation: String,
}

/// The disabled endpoint a waiting message is bound to (README, "Automatic disabling").
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct EndpointDisabled {
    pub endpoint: String,
    #[schema(format = DateTime)]
    pub since: String,
    pub reason: Option<String>,
}

/// A keyed message's place in its key (README, "Ordered delivery").
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct OrderingFacts {
    pub key: String,
    /// Its place in the key.
    pub seq: Option<i64>,
    /// Its own head-of-line policy (`None`: its endpoint's, else `block`).
    pub policy: Option<crate::domain::OrderingPolicy>,
    /// The policy that applies: its own, else its endpoint's as configured now, else `block`.
    pub policy_applied: crate::domain::OrderingPolicy,
    /// The event id of the key's head (its first open place that still counts), if any.
    pub head: Option<String>,
    /// The head's state.
    pub head_state: Option<State>,
    /// The dead or unconfirmed head that holds the key, when that is another message:
    /// "blocked by {event id}"; or the replayed head a message already retrying waits behind
    /// ([`crate::storage::ordering::blocked_by`]).
    pub blocked_by: Option<String>,
    /// When this dead or unconfirmed message stopped holding its key (skip); `None` while it
    /// holds it, also after a replay put it back in its place.
    #[schema(format = DateTime)]
    pub released_at: Option<String>,
    /// Who last skipped it explicitly (`herald skip`, `POST …/skip`), and why and when — also
    /// after a replay since; `None` when it never was (a release by the `skip` head-of-line
    /// policy has no one: `released_at` without `skipped_at`, or a different one).
    pub skipped_by: Option<String>,
    /// Why it was skipped, as the person wrote it (an address in it masked).
    pub skip_reason: Option<String>,
    #[schema(format = DateTime)]
    pub skipped_at: Option<String>,
    /// The place just before it in its key, as it is now: what it waited behind.
    pub before: Option<PlaceBefore>,
}

/// The message just before a keyed one in its key.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PlaceBefore {
    pub event_id: String,
    pub state: State,
    /// When it stopped holding the key for this message ([`PlaceBefore::ended_at`]) by a
    /// release while dead or unconfirmed (a skip, or the `skip` policy) — also when a replay
    /// has put it back in its place since; `None` when it ended otherwise, or not.
    #[schema(format = DateTime)]
    pub released_at: Option<String>,
    /// Who skipped it then (`None`: the `skip` policy, or not skipped).
    pub skipped_by: Option<String>,
    /// When it stopped holding the key for this message: if it held the key when this message
    /// was due, its first end after (an explicit skip, its release now, the final state —
    /// `delivered`, `canceled`, `expired` — it is in); if it had stopped by then (and was not
    /// replayed since, which makes it hold the key again), that end; `None` while it holds it.
    #[schema(format = DateTime)]
    pub ended_at: Option<String>,
}

impl OrderingFacts {
    /// `None` for an unkeyed message; `head` is its key's head (`Db::key_head`).
    pub fn new(
        row: &OutboxRow,
        head: Option<&OutboxRow>,
        policies: &crate::domain::policies::Policies,
    ) -> Option<Self> {
        let key = row.ordering_key.clone()?;
        Some(Self {
            key,
            seq: row.ordering_seq,
            policy: row.ordering_policy,
            policy_applied: policies.ordering_of(true, row.ordering_policy, &row.destination)?,
            head: head.map(|h| h.event_id.clone()),
            head_state: head.map(|h| h.state),
            blocked_by: crate::storage::ordering::blocked_by(row, head).map(|h| h.event_id.clone()),
            released_at: row.ordering_released_at.as_ref().map(ts),
            skipped_by: None,
            skip_reason: None,
            skipped_at: None,
            before: None,
        })
    }
}

/// One attempt in the timeline.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct AttemptEntry {
    pub attempt: i32,
    /// 1 for the first series, 2 after the first replay, …
    pub series: usize,
    #[schema(format = DateTime)]
    pub started_at: String,
    #[schema(format = DateTime)]
    pub finished_at: String,
    pub duration_ms: i64,
    /// The HTTP status or SMTP reply code.
    pub status: Option<i32>,
    /// Why there was no status (`timeout`, `connect`, `lease_expired`, …).
    pub error_kind: Option<String>,
    pub class: AttemptClass,
    /// The Retry-After the receiver sent, as sent.
    pub retry_after: Option<String>,
    /// The delay Herald chose before the next attempt.
    pub delay_ms: Option<i64>,
    /// Why that delay, or why it stopped (Herald's words).
    pub delay_reason: Option<String>,
    pub policy_version: String,
    /// The state the attempt led to, or `lease_lost` (its outcome was not applied).
    pub next_state: String,
    pub provider_message_id: Option<String>,
    /// Herald's own note on the attempt, where it has one worth showing: the recipients an SMTP
    /// server refused at RCPT TO (masked, with their codes — also when the message went to the
    /// others), or what made a payload unsendable. Never the receiver's response body.
    pub note: Option<String>,
}

/// What an attempt got back, as every view of it tells it (the explanation's sentence, the
/// admin page's timeline, the sender's reason): a status, or why there was none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer<'a> {
    /// The HTTP status or SMTP reply code.
    Status(i32),
    /// The sender was lost before it recorded an outcome (the lease ran out).
    LeaseExpired,
    /// No SMTP relay is configured: the mail went to the mail directory as an `.eml` file.
    WrittenToFile,
    /// No status, for this reason (`timeout`, `connect`, …).
    Failed(&'a str),
    /// Neither a status nor a reason.
    Nothing,
}

impl<'a> Answer<'a> {
    pub fn of(status: Option<i32>, error_kind: Option<&'a str>) -> Self {
        match (status, error_kind) {
            (Some(s), _) => Answer::Status(s),
            (None, Some("lease_expired")) => Answer::LeaseExpired,
            (None, Some(crate::channels::email::WRITTEN_TO_FILE)) => Answer::WrittenToFile,
            (None, Some(kind)) => Answer::Failed(kind),
            (None, None) => Answer::Nothing,
        }
    }
}

/// The part of an attempt's excerpt that is Herald's own words (see [`AttemptEntry::note`]):
/// the refused-recipient list, or the refusal of a payload Herald could not build. A receiver's
/// body (a webhook's answer, an SMTP server's text) is kept out.
pub fn attempt_note(error_kind: Option<&str>, excerpt: Option<&str>) -> Option<String> {
    let excerpt = excerpt?;
    match error_kind? {
        // Herald's list ends the excerpt, after the server's reply when some were accepted
        // (`…; refused at RCPT TO: …`), alone when none was (`every recipient refused at …`):
        // the last occurrence, so a reply that happens to hold the phrase is not taken.
        crate::channels::email::kind::RECIPIENTS_REFUSED => excerpt
            .rfind("refused at RCPT TO: ")
            .filter(|i| {
                let before = &excerpt[..*i];
                before.is_empty() || before.ends_with("; ") || before.ends_with("every recipient ")
            })
            .map(|i| excerpt[i..].to_owned()),
        // Herald's own words on a destination it would not send to (what `destination` breaks,
        // the SSRF guard's range, an endpoint not configured): never the URL itself. Support
        // read only "could not send it as written (invalid_destination)".
        "invalid_payload"
        | "invalid_destination"
        | "unknown_endpoint"
        | "unexpanded_fanout"
        | crate::channels::webhook::REFUSED_DESTINATION
        | crate::channels::webhook::INVALID_EVENT_ID
        | crate::channels::webhook::INVALID_HEADER
        | crate::channels::email::kind::BARE_LINE_END
        | "unsupported_by_server" => Some(excerpt.to_owned()),
        // Why the TLS handshake or STARTTLS failed, in the SMTP client's words (an untrusted
        // issuer, a name mismatch, no STARTTLS offered): Herald's text, not the relay's; support
        // could not tell those apart ("failed (tls)") without reading the attempts table.
        crate::channels::email::kind::TLS => {
            let mut why = excerpt;
            while let Some(rest) = why.strip_prefix("Connection error: ") {
                why = rest;
            }
            Some(format!("TLS: {why}"))
        }
        _ => None,
    }
}

/// One receipt in the timeline, in event-time order.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ReceiptEntry {
    pub source: String,
    /// Masked where a provider's composite id holds an address.
    pub provider_event_id: String,
    pub event_type: String,
    pub provider_type: String,
    /// When the provider says it happened.
    #[schema(format = DateTime)]
    pub event_time: Option<String>,
    /// When Herald received it.
    #[schema(format = DateTime)]
    pub received_at: String,
    #[schema(format = DateTime)]
    pub reconciled_at: Option<String>,
    /// `applied`, `superseded`, `no_send`, `unchanged` or `history`.
    pub outcome: Option<String>,
    pub outcome_reason: Option<String>,
    /// For a message replayed since the send this receipt speaks of (it arrived before that
    /// replay, or its event is more than 5 s older than it): the time of that replay, the first
    /// after its send. `null` for a receipt of the current send.
    #[schema(format = DateTime)]
    pub before_replay_at: Option<String>,
}

/// One replay, as audited.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ReplayEntry {
    #[schema(format = DateTime)]
    pub replayed_at: String,
    pub who: String,
    /// Words holding an `@` masked.
    pub reason: String,
    pub from_state: State,
    pub forced: bool,
    pub series_start: i32,
    #[schema(format = DateTime)]
    pub expires_at_before: Option<String>,
    #[schema(format = DateTime)]
    pub expires_at_after: Option<String>,
}

impl AttemptEntry {
    pub fn new(a: &AttemptRow, replays: &[ReplayRow]) -> Self {
        let series = 1 + replays
            .iter()
            .filter(|r| r.series_start <= a.attempt_number)
            .count();
        Self {
            attempt: a.attempt_number,
            series,
            started_at: ts(&a.started_at),
            finished_at: ts(&a.finished_at),
            duration_ms: a.duration_ms,
            status: a.response_status,
            error_kind: a.error_kind.clone(),
            class: a.class,
            retry_after: a.retry_after.clone(),
            delay_ms: a.delay_ms,
            delay_reason: a.delay_reason.clone(),
            policy_version: a.policy_version.clone(),
            next_state: a.next_state.clone(),
            provider_message_id: a.provider_message_id.clone(),
            note: attempt_note(a.error_kind.as_deref(), a.response_excerpt.as_deref()),
        }
    }
}

impl ReceiptEntry {
    /// `replays`: the message's, oldest first; `carried`: the provider message id it carries
    /// now.
    pub fn new(r: &ReceiptRow, replays: &[ReplayRow], carried: Option<&str>) -> Self {
        // By its provider id, as the reconciler found it: one a replay replaced and the message
        // no longer carries is of the send before that replay (the newest such), whatever its
        // time; else by its arrival and event time.
        let bare = crate::storage::receipts::bare_message_id;
        let replaced = r
            .provider_message_id
            .as_deref()
            .map(bare)
            .filter(|p| carried.map(bare) != Some(p))
            .and_then(|p| {
                replays
                    .iter()
                    .rfind(|x| x.provider_message_id_before.as_deref().map(bare) == Some(p))
            });
        let before_replay_at = replaced
            .or_else(|| {
                replays.iter().find(|p| {
                    crate::storage::models::of_a_send_before(
                        p.replayed_at,
                        r.event_time,
                        r.received_at,
                    )
                })
            })
            .map(|p| ts(&p.replayed_at));
        Self {
            source: r.source.clone(),
            provider_event_id: mask_emails_in(&r.provider_event_id),
            event_type: r.event_type.clone(),
            provider_type: mask_free_text(&r.provider_type),
            event_time: r.event_time.as_ref().map(ts),
            received_at: ts(&r.received_at),
            reconciled_at: r.reconciled_at.as_ref().map(ts),
            outcome: r.outcome.clone(),
            outcome_reason: r.outcome_reason.as_deref().map(mask_free_text),
            before_replay_at,
        }
    }
}

impl ReplayEntry {
    pub fn new(r: &ReplayRow) -> Self {
        Self {
            replayed_at: ts(&r.replayed_at),
            who: r.who.clone(),
            reason: mask_free_text(&r.reason),
            from_state: r.from_state,
            forced: r.forced,
            series_start: r.series_start,
            expires_at_before: r.expires_at_before.as_ref().map(ts),
            expires_at_after: r.expires_at_after.as_ref().map(ts),
        }
    }
}

/// The fingerprint a support lookup finds the message by: the stored one. A message inserted by
/// plain SQL has none until its first attempt records it (its sender's outcome, or the lease
/// watchdog's; one that expired before any attempt never gets one); it is found by its event id.
pub fn fingerprint_of_row(row: &OutboxRow) -> Option<String> {
    row.request_fingerprint.clone()
}

impl Explanation {
    /// The facts; the paragraph is filled in by [`super::narrative::narrate`].
    pub fn facts(
        row: &OutboxRow,
        attempts: &[AttemptRow],
        receipts: &[ReceiptRow],
        replays: &[ReplayRow],
        default_max_attempts: u32,
    ) -> Self {
        Self {
            event_id: row.event_id.clone(),
            fingerprint: fingerprint_of_row(row),
            channel: row.channel,
            destination: mask_destination(row.channel, &row.destination),
            semantics: row.semantics,
            enqueued_by: row.enqueued_by.clone(),
            created_at: ts(&row.created_at),
            scheduled_at: ts(&row.scheduled_at),
            expires_at: row.expires_at.as_ref().map(ts),
            updated_at: ts(&row.updated_at),
            state: row.state,
            state_reason: row.state_reason.clone(),
            last_error_class: row.last_error_class,
            next_attempt_at: row.next_attempt_at.as_ref().map(ts),
            lease_until: row.lease_until.as_ref().map(ts),
            delivery_status: row.delivery_status.clone(),
            delivery_status_at: row.delivery_status_at.as_ref().map(ts),
            provider_message_id: row.provider_message_id.clone(),
            attempts: row.attempts,
            max_attempts: row
                .max_attempts
                .map(i64::from)
                .unwrap_or(i64::from(default_max_attempts)),
            series_start: row.attempt_base + 1,
            series_attempts: row.attempts - row.attempt_base,
            retry_policy: row.retry_policy.clone(),
            retry_policy_version: row.retry_policy_version.clone(),
            attempt_timeline: attempts
                .iter()
                .map(|a| AttemptEntry::new(a, replays))
                .collect(),
            receipt_timeline: receipts
                .iter()
                .map(|r| ReceiptEntry::new(r, replays, row.provider_message_id.as_deref()))
                .collect(),
            replays: replays.iter().map(ReplayEntry::new).collect(),
            ordering: None,
            endpoint_disabled: None,
            explanation: String::new(),
        }
    }
}

/// One dead letter in a listing: identifiers, class, attempts, last status — never a body.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DeadLetterEntry {
    pub event_id: String,
    pub fingerprint: Option<String>,
    pub channel: Channel,
    /// Masked: see [`mask_destination`].
    pub destination: String,
    /// The class that dead-lettered it (`permanent`, `exhausted`, …).
    pub class: Option<AttemptClass>,
    /// `unconfirmed`: dead-lettered at the unconfirmed deadline without a receipt.
    pub state_reason: Option<String>,
    /// What the provider's receipts say of it since (`delivered`: a replay or a redrive needs
    /// force, it would be sent again).
    pub delivery_status: Option<String>,
    pub attempts: i32,
    pub series_attempts: i32,
    pub last_attempt: Option<LastAttemptEntry>,
    /// When it was dead-lettered.
    #[schema(format = DateTime)]
    pub dead_lettered_at: String,
    #[schema(format = DateTime)]
    pub created_at: String,
}

/// The last attempt of a dead letter.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct LastAttemptEntry {
    pub attempt: i32,
    pub status: Option<i32>,
    pub error_kind: Option<String>,
    pub class: AttemptClass,
}

impl DeadLetterEntry {
    pub fn new(row: &OutboxRow, last: Option<&LastAttempt>) -> Self {
        Self {
            event_id: row.event_id.clone(),
            fingerprint: fingerprint_of_row(row),
            channel: row.channel,
            destination: mask_destination(row.channel, &row.destination),
            class: row.last_error_class,
            state_reason: row.state_reason.clone(),
            delivery_status: row.delivery_status.clone(),
            attempts: row.attempts,
            series_attempts: row.attempts - row.attempt_base,
            last_attempt: last.map(|l| LastAttemptEntry {
                attempt: l.attempt_number,
                status: l.response_status,
                error_kind: l.error_kind.clone(),
                class: l.class,
            }),
            dead_lettered_at: ts(&row.updated_at),
            created_at: ts(&row.created_at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_note_is_herald_s_words_never_the_receiver_s() {
        let partial = "250 2.0.0 Ok: queued as Q69; refused at RCPT TO: p***@e***.com 550";
        assert_eq!(
            attempt_note(Some("recipients_refused"), Some(partial)).as_deref(),
            Some("refused at RCPT TO: p***@e***.com 550")
        );
        assert_eq!(
            attempt_note(
                Some("recipients_refused"),
                Some("every recipient refused at RCPT TO: a***@e***.com 550")
            )
            .as_deref(),
            Some("refused at RCPT TO: a***@e***.com 550")
        );
        // The server's reply quoting the phrase is not taken for Herald's list.
        let quoting = "250 ok refused at RCPT TO: you; refused at RCPT TO: p***@e***.com 550";
        assert_eq!(
            attempt_note(Some("recipients_refused"), Some(quoting)).as_deref(),
            Some("refused at RCPT TO: p***@e***.com 550")
        );
        assert_eq!(
            attempt_note(
                Some("invalid_payload"),
                Some("payload.subject: must be one line")
            )
            .as_deref(),
            Some("payload.subject: must be one line")
        );
        // A receiver's body, or no kind: nothing.
        for (kind, excerpt) in [
            (Some("smtp_reply"), "550 user private@example.com unknown"),
            (None, "{\"error\": \"receiver-body-text\"}"),
            (Some("timeout"), "x"),
        ] {
            assert_eq!(attempt_note(kind, Some(excerpt)), None, "{kind:?}");
        }
        assert_eq!(attempt_note(Some("invalid_payload"), None), None);
        let creds = "must not carry credentials; configure an endpoint with auth instead";
        assert_eq!(
            attempt_note(Some("invalid_destination"), Some(creds)).as_deref(),
            Some(creds)
        );
    }

    #[test]
    fn destinations_are_masked_per_channel() {
        assert_eq!(
            mask_destination(
                Channel::Webhook,
                "https://user:pw@hooks.example.com:8443/t/SECRET?token=x"
            ),
            "https://hooks.example.com:8443/…"
        );
        assert_eq!(
            mask_destination(Channel::Webhook, "endpoint:billing"),
            "endpoint:billing"
        );
        assert_eq!(
            mask_destination(Channel::Email, "ada@example.com"),
            "a***@e***.com"
        );
        assert_eq!(mask_destination(Channel::Webhook, "not a url"), "[9 chars]");
    }

    #[test]
    fn free_text_keeps_words_and_masks_addresses() {
        assert_eq!(
            mask_free_text("customer ada@example.com asked, ticket #42"),
            "customer a***@e***.com asked, ticket #42"
        );
        // A provider's event type with an address in it keeps its words (it became
        // `s***@e***.com` whole: a walk-through); an @ however written is found.
        assert_eq!(
            mask_free_text("soft bounce for harry@example.com"),
            "soft bounce for h***@e***.com"
        );
        assert_eq!(
            mask_free_text("bounce for harry&#64;example.com now"),
            "bounce for h***@e***.com now"
        );
    }
}
