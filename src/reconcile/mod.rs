//! Reconciliation: stored receipts become delivery status **by event time, never by arrival
//! order**. A background task (never the HTTP handler) matches each pending receipt to its
//! message and applies it; a receipt is an input, never a command: it changes what Herald knows
//! about a delivery and never causes a send of the message (a status callback is a new message
//! of its own, through the same outbox).
//!
//! The decision is a pure function ([`judge`]): a message's delivery status is the status
//! receipt with the greatest key `(event time, precedence)` — a maximum, so every arrival order
//! of the same receipts ends in the same status, and duplicates change nothing.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, watch};
use tracing::{info, warn};

use crate::clock::Clock;
use crate::domain::{Channel, State};
use crate::metrics::{DeadLetterReason, Metrics};
use crate::outbox::{Limits, NewMessage};
use crate::storage::models::{MatchedMessage, PendingReceipt, ReceiptDecision, ReconcilePass};
use crate::storage::{Db, StorageError};

/// How long the background loop waits after being woken by stored receipts before its pass:
/// receipts stored meanwhile join the same pass (one transaction for many requests).
pub const WAKE_LINGER: Duration = Duration::from_millis(20);

/// Delivery statuses, lowest precedence first: at equal event times the later entry wins.
/// Providers without event times (Twilio) are ordered by this alone, which is their status
/// lattice (`queued < sent < delivered < failed`).
pub const PRECEDENCE: &[&str] = &[
    "queued",
    "sent",
    "deferred",
    "delivered",
    "failed",
    "dropped",
    "bounced",
    "complained",
];

/// Receipts that say something about the recipient, not the delivery: kept in the history,
/// the delivery status unchanged.
pub const ENGAGEMENT: &[&str] = &["opened", "clicked", "unsubscribed", "read"];

/// Whether a delivery status says the message reached its recipient: `delivered`, or a
/// complaint (which outranks it, and comes only from a recipient who got it).
pub fn says_it_arrived(status: &str) -> bool {
    matches!(status, "delivered" | "complained")
}

/// Where a status is in [`PRECEDENCE`]; `None` for anything else.
pub fn precedence(status: &str) -> Option<usize> {
    PRECEDENCE.iter().position(|s| *s == status)
}

/// What a receipt does to a message whose delivery status is `current` (set by an event at
/// `current_at`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It becomes the delivery status.
    Applied { previous: Option<String> },
    /// Older than the current status (or equally old and of lower precedence): history only.
    Superseded { reason: String },
    /// Of no send of the message: no request of it (of its series, after a replay) had begun
    /// when the receipt arrived. History only, and it settles nothing later either.
    OfNoSend { reason: String },
    /// The same status at the same event time: a repeat.
    Unchanged,
    /// Not a delivery status (engagement, or outside the vocabulary): history only.
    History { reason: String },
}

/// The pure decision. Order: event time first (a receipt without one sorts before every receipt
/// with one), then [`PRECEDENCE`].
pub fn judge(
    current: Option<&str>,
    current_at: Option<DateTime<Utc>>,
    event_type: &str,
    event_time: Option<DateTime<Utc>>,
) -> Verdict {
    let Some(rank) = precedence(event_type) else {
        let reason = if ENGAGEMENT.contains(&event_type) {
            format!("{event_type} is engagement: kept in the history, delivery status unchanged")
        } else {
            format!("{event_type} is not a delivery status: kept in the history")
        };
        return Verdict::History { reason };
    };
    // A current status outside the table (written by hand, say) ranks below every status at its
    // own event time: it still only moves forward.
    let current_key = current.map(|c| (current_at, precedence(c)));
    let key = (event_time, Some(rank));
    match current_key {
        None => Verdict::Applied {
            previous: current.map(str::to_owned),
        },
        Some(cur) if key > cur => Verdict::Applied {
            previous: current.map(str::to_owned),
        },
        Some(cur) if key == cur => Verdict::Unchanged,
        Some((at, _)) => {
            let current = current.unwrap_or("?");
            let reason = if event_time < at {
                format!(
                    "older than the current status {current} (event time {} < {})",
                    show(event_time),
                    show(at)
                )
            } else if event_time.is_none() {
                // A provider without event times (Twilio): only the status order decides.
                format!(
                    "without event times the status order decides: the current status {current} \
                     ranks above {event_type}"
                )
            } else {
                format!("same event time as the current status {current}, which takes precedence")
            };
            Verdict::Superseded { reason }
        }
    }
}

/// How far after its arrival a receipt's event time is believed: an event is not reported
/// before it happens, so a time further ahead is a provider's clock running ahead, or a wrong
/// value (`9999-12-31`), and would otherwise outrank every later receipt for good.
pub const EVENT_TIME_AHEAD_MAX: chrono::Duration = chrono::Duration::minutes(5);

/// The time a receipt is ordered by: its event time, at most [`EVENT_TIME_AHEAD_MAX`] after its
/// arrival.
pub fn ordering_time(
    event_time: Option<DateTime<Utc>>,
    received_at: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    event_time.map(|t| t.min(received_at + EVENT_TIME_AHEAD_MAX))
}

/// Whether a receipt of this type proves the provider accepted the message (settles an
/// `unconfirmed` one): every status and engagement event does; an unknown type does not.
pub fn proves_acceptance(event_type: &str) -> bool {
    precedence(event_type).is_some() || ENGAGEMENT.contains(&event_type)
}

fn show(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.to_rfc3339_opts(SecondsFormat::Micros, true))
        .unwrap_or_else(|| "none".into())
}

/// `[status_callbacks]`: each delivery-status change is enqueued as a signed webhook to
/// `destination` (an `endpoint:NAME`), through Herald's own outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusCallbacks {
    pub destination: String,
    /// Only these statuses (empty: all).
    pub event_types: Vec<String>,
}

/// The event id of a status callback: `{message event id}:status:{status}`, after the message's
/// n-th replay `{message event id}:status:{status}:replay-{n}` (the status starts over with a
/// replay: a status the earlier send reached is a change again, and is called back); when that
/// would exceed 255 characters, the SHA-256 of the message's event id in its place.
pub fn callback_event_id(event_id: &str, status: &str, replays: i64) -> String {
    let series = if replays > 0 {
        format!(":replay-{replays}")
    } else {
        String::new()
    };
    let id = format!("{event_id}:status:{status}{series}");
    if id.len() <= crate::domain::EventId::MAX_LEN {
        id
    } else {
        format!(
            "{}:status:{status}{series}",
            hex::encode(Sha256::digest(event_id))
        )
    }
}

/// How the reconciler runs.
#[derive(Debug, Clone)]
pub struct ReconcilerConfig {
    pub batch_size: u32,
    pub interval: Duration,
    /// How long an `unconfirmed` message waits for a receipt before `dead_letter`.
    pub unconfirmed_deadline: Duration,
    pub callbacks: Option<StatusCallbacks>,
    /// The retry policies by destination, recorded on the status callbacks it enqueues.
    pub policies: Arc<crate::domain::policies::Policies>,
    /// The domain of Herald's deterministic email `Message-ID`s (receipts quoting one match).
    pub message_id_domain: String,
    /// Each source's `matches` that has any: its receipts speak only for those messages.
    pub matches: std::collections::BTreeMap<String, Vec<String>>,
    /// The sources whose Herald event id is an echoed application reference
    /// ([`crate::storage::models::MatchRules::provider_id_first`]).
    pub provider_id_first: std::collections::BTreeSet<String>,
}

/// Whether a receipt of a source with these `matches` may speak for a message of `channel`
/// sent to `destination`: every message when `matches` is empty; else one sent to an
/// `endpoint:NAME` listed, or any email when `email` is.
pub fn may_match(matches: &[String], channel: Channel, destination: &str) -> bool {
    matches.is_empty()
        || matches.iter().any(|m| match m.as_str() {
            "email" => channel == Channel::Email,
            endpoint => channel == Channel::Webhook && endpoint == destination,
        })
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("{}", .0.log_safe())]
    Storage(#[from] StorageError),
    #[error("a blocking database task failed")]
    Join(#[from] tokio::task::JoinError),
}

/// Applies pending receipts. Cheap to clone.
#[derive(Clone)]
pub struct Reconciler {
    db: Db,
    clock: Arc<dyn Clock>,
    config: Arc<ReconcilerConfig>,
    wake: Arc<Notify>,
    metrics: Metrics,
}

impl Reconciler {
    pub fn new(
        db: Db,
        clock: Arc<dyn Clock>,
        config: ReconcilerConfig,
        wake: Arc<Notify>,
        metrics: Metrics,
    ) -> Self {
        Self {
            db,
            clock,
            config: Arc::new(config),
            wake,
            metrics,
        }
    }

    /// Notified when receipts were stored.
    pub fn wake_handle(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// The decision for one matched receipt, as storage applies it.
    fn decide(&self, r: &PendingReceipt, m: &MatchedMessage) -> ReceiptDecision {
        let event_time = ordering_time(r.event_time, r.received_at);
        let earlier = m.replayed_after(event_time, r.received_at);
        let unsent = m.of_no_send(r.received_at);
        let verdict = match earlier {
            // No request of this series was made: the receipt cannot be of it (a message
            // canceled, expired or still scheduled; one replayed and not sent again yet).
            None if unsent && precedence(&r.event_type).is_some() => Verdict::OfNoSend {
                reason: format!(
                    "{} (event time {}, arrived {}): kept in the history",
                    if m.replays.unwrap_or(0) > 0 {
                        "no request of it had begun since its replay when it arrived"
                    } else {
                        "no request of it had begun when it arrived"
                    },
                    show(event_time),
                    show(Some(r.received_at))
                ),
            },
            Some(at) if precedence(&r.event_type).is_some() => Verdict::Superseded {
                reason: format!(
                    // The latest replay: the explanation's `before_replay_at` names the first
                    // that followed the receipt's send, which may be an earlier one.
                    "of a send before the replay at {} (its latest; event time {}, arrived {}): kept in the history",
                    show(Some(at)),
                    show(event_time),
                    show(Some(r.received_at))
                ),
            },
            _ => judge(
                m.delivery_status.as_deref(),
                m.delivery_status_at,
                &r.event_type,
                event_time,
            ),
        };
        let settle = earlier.is_none()
            && !unsent
            && proves_acceptance(&r.event_type)
            && m.awaits_proof(r.received_at);
        let mut enqueue = Vec::new();
        let (outcome, reason, new_status) = match verdict {
            Verdict::Applied { previous } => {
                // A later event of the same status moves its time, not the status: no callback.
                if previous.as_deref() != Some(r.event_type.as_str())
                    && let Some(row) = self.callback(r, m, previous.as_deref())
                {
                    enqueue.push(row);
                }
                (
                    "applied",
                    format!(
                        "delivery status {} → {}",
                        previous.as_deref().unwrap_or("none"),
                        r.event_type
                    ),
                    Some((r.event_type.clone(), event_time)),
                )
            }
            Verdict::Superseded { reason } => ("superseded", reason, None),
            Verdict::OfNoSend { reason } => (crate::storage::receipts::NO_SEND, reason, None),
            Verdict::Unchanged => (
                "unchanged",
                "the same status at the same event time is already applied".into(),
                None,
            ),
            Verdict::History { reason } => ("history", reason, None),
        };
        let reason = if settle {
            let was = match m.state {
                State::DeadLetter => "dead_letter (unconfirmed, stored before the deadline)",
                _ => "unconfirmed",
            };
            format!("{reason}; proves acceptance: {was} → delivered")
        } else {
            reason
        };
        ReceiptDecision {
            outcome,
            reason,
            new_status,
            settle,
            enqueue,
        }
    }

    /// The status callback for a change, if configured and wanted for this status.
    fn callback(
        &self,
        r: &PendingReceipt,
        m: &MatchedMessage,
        previous: Option<&str>,
    ) -> Option<crate::storage::models::NewOutboxRow> {
        let cb = self.config.callbacks.as_ref()?;
        if !cb.event_types.is_empty() && !cb.event_types.contains(&r.event_type) {
            return None;
        }
        let body = json!({
            "event_id": m.event_id,
            "delivery_status": r.event_type,
            "delivery_status_at": ordering_time(r.event_time, r.received_at).map(|t| t.to_rfc3339_opts(SecondsFormat::Micros, true)),
            "previous_status": previous,
            "source": r.source,
            "provider_type": r.provider_type,
            "provider_event_id": crate::telemetry::mask_emails_in(&r.provider_event_id),
        });
        let message = NewMessage::webhook(
            callback_event_id(&m.event_id, &r.event_type, m.replays.unwrap_or(0)),
            cb.destination.clone(),
            body,
        );
        let limits = Limits {
            policies: Some(&self.config.policies),
            ..Limits::default()
        };
        match message.prepare(&limits, self.clock.now()) {
            Ok(row) => Some(row),
            Err(errors) => {
                // Configuration was validated at start; this is a bug, not input.
                warn!(event_id = %crate::telemetry::LogEventId(&m.event_id), errors = errors.len(), "status callback not enqueued: invalid");
                None
            }
        }
    }

    /// One pass: a batch of pending receipts, then the unconfirmed deadline.
    pub async fn run_once(&self) -> Result<ReconcilePass, ReconcileError> {
        self.pass(true).await
    }

    /// A batch of pending receipts, and the unconfirmed deadline when `deadline` (the background
    /// loop checks it once per interval, not on every pass: it is a transaction of its own).
    async fn pass(&self, deadline: bool) -> Result<ReconcilePass, ReconcileError> {
        let this = self.clone();
        let now = self.clock.storage_now();
        let span = tracing::Span::current();
        let (pass, expired) = tokio::task::spawn_blocking(move || {
            span.in_scope(|| -> Result<_, StorageError> {
                let pass = this.db.reconcile(
                    now,
                    this.config.batch_size,
                    &this.config.message_id_domain,
                    crate::storage::models::MatchRules {
                        may_match: &|source, channel, destination| {
                            this.config
                                .matches
                                .get(source)
                                .is_none_or(|m| may_match(m, channel, destination))
                        },
                        provider_id_first: &|source| this.config.provider_id_first.contains(source),
                    },
                    &|r, m| this.decide(r, m),
                )?;
                let accepting: Vec<&str> = PRECEDENCE.iter().chain(ENGAGEMENT).copied().collect();
                let (settled, expired) = if deadline {
                    this.db.settle_or_expire_unconfirmed(
                        now,
                        this.config.unconfirmed_deadline,
                        &accepting,
                    )?
                } else {
                    (0, 0)
                };
                Ok((
                    ReconcilePass {
                        settled: pass.settled + settled,
                        ..pass
                    },
                    expired,
                ))
            })
        })
        .await??;
        if pass.matched + pass.unmatched + pass.settled > 0 {
            info!(
                matched = pass.matched,
                unmatched = pass.unmatched,
                status_changes = pass.status_changes,
                settled = pass.settled,
                "receipts reconciled"
            );
        }
        self.metrics
            .dead_letters(DeadLetterReason::UnconfirmedDeadline, expired as u64);
        if expired > 0 {
            warn!(
                expired,
                "unconfirmed messages past the deadline moved to dead_letter"
            );
        }
        Ok(pass)
    }

    /// Runs passes until one finds nothing to do; returns the receipts applied (tests, CLI).
    pub async fn run_until_idle(&self) -> Result<usize, ReconcileError> {
        let mut total = 0;
        loop {
            let pass = self.run_once().await?;
            if pass.matched + pass.unmatched == 0 {
                return Ok(total);
            }
            total += pass.matched;
        }
    }

    /// The background loop: a pass every `interval`, or soon after receipts were stored (at most
    /// [`WAKE_LINGER`] later, so that receipts arriving together are reconciled in one pass
    /// rather than a pass per request); the unconfirmed deadline once per interval.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut failures = 0u32;
        let mut next_deadline = tokio::time::Instant::now();
        info!("reconciler started");
        while !*shutdown.borrow() {
            let deadline = tokio::time::Instant::now() >= next_deadline;
            let busy = match self.pass(deadline).await {
                Ok(pass) => {
                    failures = 0;
                    if deadline {
                        next_deadline = tokio::time::Instant::now() + self.config.interval;
                    }
                    pass.matched + pass.unmatched >= self.config.batch_size as usize
                }
                Err(e) => {
                    failures += 1;
                    warn!(error = %e, failures, "reconciler pass failed; will retry");
                    false
                }
            };
            if busy {
                continue;
            }
            let pause = self.config.interval * failures.clamp(1, 10);
            tokio::select! {
                _ = self.wake.notified() => {
                    tokio::select! {
                        _ = tokio::time::sleep(WAKE_LINGER) => {}
                        _ = shutdown.changed() => {}
                    }
                }
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.changed() => {}
            }
        }
        info!("reconciler stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Option<DateTime<Utc>> {
        DateTime::from_timestamp(1_700_000_000 + s, 0)
    }

    #[test]
    fn without_event_times_the_reason_names_the_status_order() {
        let Verdict::Superseded { reason } = judge(Some("delivered"), None, "sent", None) else {
            panic!("superseded")
        };
        assert!(reason.contains("status order decides"), "{reason}");
        assert!(reason.contains("delivered ranks above sent"), "{reason}");
    }

    #[test]
    fn a_source_with_matches_speaks_only_for_those_messages() {
        use crate::domain::Channel::{Email, Webhook};
        assert!(may_match(&[], Webhook, "https://x.example/h"));
        assert!(may_match(&[], Email, "ada@example.com"));
        let sms = ["endpoint:sms".to_owned()];
        assert!(may_match(&sms, Webhook, "endpoint:sms"));
        assert!(!may_match(&sms, Webhook, "endpoint:sms2"));
        assert!(!may_match(&sms, Webhook, "https://x.example/h"));
        assert!(!may_match(&sms, Email, "endpoint:sms"));
        let email = ["email".to_owned()];
        assert!(may_match(&email, Email, "ada@example.com"));
        assert!(!may_match(&email, Webhook, "email"));
    }

    #[test]
    fn a_receipt_arrived_or_dated_before_the_last_replay_is_of_an_earlier_send() {
        let m = |replayed_at| MatchedMessage {
            id: 1,
            event_id: "e".into(),
            state: State::Unconfirmed,
            delivery_status: None,
            delivery_status_at: None,
            state_reason: None,
            updated_at: t(0).unwrap(),
            replayed_at,
            replays: None,
            created_at: t(-100).unwrap(),
            first_request_at: t(-100),
            attempts: 1,
            attempt_base: 0,
            series_attempt_rows: Some(1),
        };
        let at = |s| t(s).unwrap();
        // Never replayed: every receipt is of the current series.
        assert_eq!(m(None).replayed_after(t(-50), at(-50)), None);
        let replayed = m(t(0));
        // Arrived before the replay, whatever its event time.
        assert_eq!(replayed.replayed_after(t(5), at(-1)), t(0));
        assert_eq!(replayed.replayed_after(None, at(-1)), t(0));
        // Arrived after it, of an event more than 5 s before it: an earlier send's, late.
        assert_eq!(replayed.replayed_after(t(-6), at(5)), t(0));
        // Arrived after it, of an event at most 5 s before it (a whole-second provider time in
        // the replay's own second, a clock a little behind), at or after it, or without one.
        assert_eq!(replayed.replayed_after(t(-5), at(5)), None);
        assert_eq!(replayed.replayed_after(t(-1), at(5)), None);
        assert_eq!(replayed.replayed_after(t(0), at(5)), None);
        assert_eq!(replayed.replayed_after(t(3), at(5)), None);
        assert_eq!(replayed.replayed_after(None, at(0)), None);
        // An event time on a whole minute (a provider dating to the minute): up to 65 s before.
        let on_minute = |s: i64| chrono::DateTime::from_timestamp(1_796_621_400 + s, 0);
        let replayed = m(on_minute(50));
        assert_eq!(
            replayed.replayed_after(on_minute(0), on_minute(51).unwrap()),
            None
        );
        // Not on a whole minute: 5 s, as before.
        assert_eq!(
            replayed.replayed_after(on_minute(44), on_minute(51).unwrap()),
            on_minute(50)
        );
        assert_eq!(
            replayed.replayed_after(on_minute(-60), on_minute(51).unwrap()),
            on_minute(50)
        );

        // Of no send: by when the receipt arrived against the series' first request.
        // (Clocks apart: a request that began up to a second after the arrival counts.)
        let sent = m(None);
        assert!(sent.of_no_send(at(-102)), "before the message existed");
        assert!(sent.of_no_send(at(-101) - chrono::TimeDelta::microseconds(1)));
        assert!(
            !sent.of_no_send(at(-101)),
            "once its first request began, a second's slack"
        );
        let mut in_flight = m(None);
        (in_flight.state, in_flight.first_request_at) = (State::Sending, None);
        (in_flight.series_attempt_rows, in_flight.attempts) = (Some(0), 1);
        in_flight.updated_at = at(-50);
        assert!(
            !in_flight.of_no_send(at(-50)),
            "a request in flight, claimed then"
        );
        assert!(in_flight.of_no_send(at(-52)), "before the claim");
        let mut never_left = in_flight.clone();
        (never_left.state, never_left.series_attempt_rows) = (State::Retryable, Some(1));
        assert!(never_left.of_no_send(at(-50)), "only not_sent attempts");
        let mut by_sql = never_left.clone();
        by_sql.series_attempt_rows = Some(0);
        assert!(
            !by_sql.of_no_send(at(-50)),
            "claimed, no attempt row to say when"
        );
        by_sql.attempts = 0;
        assert!(by_sql.of_no_send(at(-50)), "never claimed");
    }

    #[test]
    fn an_event_time_is_believed_up_to_five_minutes_after_its_arrival() {
        let arrived = t(0).unwrap();
        assert_eq!(ordering_time(None, arrived), None);
        assert_eq!(ordering_time(t(-3600), arrived), t(-3600));
        assert_eq!(ordering_time(t(299), arrived), t(299));
        assert_eq!(ordering_time(t(300), arrived), t(300));
        assert_eq!(ordering_time(t(301), arrived), t(300));
        let far = DateTime::parse_from_rfc3339("9999-12-31T23:59:59Z")
            .unwrap()
            .to_utc();
        assert_eq!(ordering_time(Some(far), arrived), t(300));
    }

    #[test]
    fn later_event_times_win_whatever_the_arrival_order() {
        assert_eq!(
            judge(Some("delivered"), t(10), "bounced", t(20)),
            Verdict::Applied {
                previous: Some("delivered".into())
            }
        );
        let Verdict::Superseded { reason } = judge(Some("bounced"), t(20), "delivered", t(10))
        else {
            panic!("an older delivered never overwrites a newer bounce")
        };
        assert!(
            reason.starts_with("older than the current status bounced"),
            "{reason}"
        );
        assert_eq!(
            judge(None, None, "sent", t(1)),
            Verdict::Applied { previous: None }
        );
    }

    #[test]
    fn equal_times_resolve_by_precedence() {
        let order = [
            "queued",
            "sent",
            "deferred",
            "delivered",
            "failed",
            "dropped",
            "bounced",
            "complained",
        ];
        for (i, low) in order.iter().enumerate() {
            for high in &order[i + 1..] {
                assert!(
                    matches!(judge(Some(low), t(5), high, t(5)), Verdict::Applied { .. }),
                    "{high} over {low}"
                );
                assert!(
                    matches!(
                        judge(Some(high), t(5), low, t(5)),
                        Verdict::Superseded { .. }
                    ),
                    "{low} under {high}"
                );
            }
            assert_eq!(judge(Some(low), t(5), low, t(5)), Verdict::Unchanged);
        }
    }

    #[test]
    fn without_event_times_the_lattice_decides() {
        // Twilio: queued < sent < delivered, failed above delivered; never backwards.
        assert!(matches!(
            judge(Some("sent"), None, "delivered", None),
            Verdict::Applied { .. }
        ));
        assert!(matches!(
            judge(Some("delivered"), None, "sent", None),
            Verdict::Superseded { .. }
        ));
        assert!(matches!(
            judge(Some("queued"), None, "failed", None),
            Verdict::Applied { .. }
        ));
        // An event with a time sorts after one without.
        assert!(matches!(
            judge(Some("failed"), None, "queued", t(0)),
            Verdict::Applied { .. }
        ));
    }

    #[test]
    fn an_unknown_current_status_still_only_moves_forward() {
        assert!(matches!(
            judge(Some("handwritten"), t(10), "delivered", t(5)),
            Verdict::Superseded { .. }
        ));
        assert!(matches!(
            judge(Some("handwritten"), t(10), "queued", t(10)),
            Verdict::Applied { .. }
        ));
    }

    #[test]
    fn engagement_and_unknown_types_are_history_only() {
        for e in ["opened", "clicked", "unsubscribed", "read", "other"] {
            assert!(
                matches!(
                    judge(Some("delivered"), t(1), e, t(9)),
                    Verdict::History { .. }
                ),
                "{e}"
            );
        }
        assert!(proves_acceptance("opened") && proves_acceptance("bounced"));
        assert!(!proves_acceptance("other"));
    }

    /// Every order of the same receipts (with repeats) ends in the same status: the status is
    /// the maximum key, applied one receipt at a time.
    #[test]
    fn every_arrival_order_ends_in_the_same_status() {
        use rand::seq::SliceRandom;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let types = [
            "queued",
            "sent",
            "deferred",
            "delivered",
            "bounced",
            "complained",
            "opened",
            "failed",
            "dropped",
            "other",
        ];
        for _ in 0..2000 {
            let n = rng.random_range(1..8);
            let mut receipts: Vec<(&str, Option<DateTime<Utc>>)> = (0..n)
                .map(|_| {
                    (
                        types[rng.random_range(0..types.len())],
                        if rng.random_bool(0.2) {
                            None
                        } else {
                            t(rng.random_range(0..4))
                        },
                    )
                })
                .collect();
            // Duplicates, as providers retry.
            let dup = receipts[rng.random_range(0..receipts.len())];
            receipts.push(dup);
            let apply = |rs: &[(&str, Option<DateTime<Utc>>)]| {
                let mut cur: (Option<String>, Option<DateTime<Utc>>) = (None, None);
                for (ty, at) in rs {
                    if let Verdict::Applied { .. } = judge(cur.0.as_deref(), cur.1, ty, *at) {
                        cur = (Some((*ty).to_owned()), *at);
                    }
                }
                cur
            };
            let first = apply(&receipts);
            for _ in 0..5 {
                receipts.shuffle(&mut rng);
                assert_eq!(apply(&receipts), first, "{receipts:?}");
            }
        }
    }

    #[test]
    fn callback_event_ids_fit_the_contract() {
        assert_eq!(
            callback_event_id("order-1", "bounced", 0),
            "order-1:status:bounced"
        );
        // After a replay the status starts over: the same status is another callback.
        assert_eq!(
            callback_event_id("order-1", "bounced", 2),
            "order-1:status:bounced:replay-2"
        );
        let long = "x".repeat(250);
        let id = callback_event_id(&long, "delivered", 0);
        assert!(id.len() <= 255 && id.ends_with(":status:delivered"), "{id}");
        let id = callback_event_id(&long, "delivered", 3);
        assert!(
            id.len() <= 255 && id.ends_with(":status:delivered:replay-3"),
            "{id}"
        );
    }
}
