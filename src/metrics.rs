//! Metrics in the Prometheus text format (`GET /metrics`).
//!
//! Each built Herald owns one [`Metrics`] (its own registry, nothing process-global), handed to
//! the sender, the reconciler and the HTTP handlers: several Heralds in one process (the tests)
//! never mix their counts. Counters and histograms are recorded where the event happens; the
//! gauges that describe the database (messages by state, the oldest due message, reconciler lag)
//! are read by one query each at scrape time ([`crate::storage::models::DbStats`]).
//!
//! Invariant: **every label value comes from a finite set** — a channel, state or class of the
//! contract, a verdict below, a lease's next state, or a *configured* source name. No label ever
//! carries an address, URL, host, path or event id; the methods take typed values to keep it so.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::domain::{AttemptClass, Channel, State};
use crate::sender::throttle::Paused;
use crate::storage::WalState;
use crate::storage::models::DbStats;

/// The `source` label of a request to a source that is not configured (not a valid source name,
/// so it never collides with one; the path's text itself is never a label).
pub const UNKNOWN_SOURCE: &str = "(unknown)";

/// The Content-Type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What became of one receipt of a verified request (`herald_receipts_total{verdict}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiptVerdict {
    /// Stored (new).
    Stored,
    /// Already stored: acknowledged, a no-op.
    Duplicate,
    /// Its one-time signature value was already used by another event: the request was refused.
    Replayed,
}

impl ReceiptVerdict {
    pub const ALL: &'static [ReceiptVerdict] = &[
        ReceiptVerdict::Stored,
        ReceiptVerdict::Duplicate,
        ReceiptVerdict::Replayed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReceiptVerdict::Stored => "stored",
            ReceiptVerdict::Duplicate => "duplicate",
            ReceiptVerdict::Replayed => "replayed",
        }
    }
}

/// How one `POST /v1/ingest/{source}` request was answered (`herald_ingest_requests_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngestVerdict {
    /// 200: every receipt stored or a duplicate.
    Accepted,
    /// 401: a replayed signature; nothing stored.
    Replayed,
    /// 401: the signature (or credentials, or timestamp) did not verify.
    SignatureRefused,
    /// 400: verified but not understood.
    BadRequest,
    /// 413: over the body limit.
    TooLarge,
    /// 503: the verifier could not decide now (a signing certificate out of reach).
    Unverifiable,
    /// 503: storage unavailable; nothing stored.
    Unavailable,
    /// 500: Herald itself failed.
    Error,
    /// 404: no such source.
    UnknownSource,
}

impl IngestVerdict {
    pub const ALL: &'static [IngestVerdict] = &[
        IngestVerdict::Accepted,
        IngestVerdict::Replayed,
        IngestVerdict::SignatureRefused,
        IngestVerdict::BadRequest,
        IngestVerdict::TooLarge,
        IngestVerdict::Unverifiable,
        IngestVerdict::Unavailable,
        IngestVerdict::Error,
        IngestVerdict::UnknownSource,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            IngestVerdict::Accepted => "accepted",
            IngestVerdict::Replayed => "replayed",
            IngestVerdict::SignatureRefused => "signature_refused",
            IngestVerdict::BadRequest => "bad_request",
            IngestVerdict::TooLarge => "too_large",
            IngestVerdict::Unverifiable => "unverifiable",
            IngestVerdict::Unavailable => "unavailable",
            IngestVerdict::Error => "error",
            IngestVerdict::UnknownSource => "unknown_source",
        }
    }

    /// The verdict of a refusal by its HTTP status (a replay is named where it is found).
    pub fn of_status(status: u16) -> Self {
        match status {
            200..=299 => IngestVerdict::Accepted,
            401 | 403 => IngestVerdict::SignatureRefused,
            // A body that stalled (408), or with a coding Herald does not decode (415), is the
            // client's, as a malformed one is.
            400 | 408 | 415 | 422 => IngestVerdict::BadRequest,
            413 => IngestVerdict::TooLarge,
            404 => IngestVerdict::UnknownSource,
            503 => IngestVerdict::Unavailable,
            _ => IngestVerdict::Error,
        }
    }
}

/// Why a message became a dead letter (`herald_dead_letters_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterReason {
    /// The class that decided it (`permanent`, `exhausted`, …).
    Class(AttemptClass),
    /// `unconfirmed` past the deadline without a settling receipt.
    UnconfirmedDeadline,
}

impl DeadLetterReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::Class(c) => c.as_str(),
            DeadLetterReason::UnconfirmedDeadline => "unconfirmed_deadline",
        }
    }
}

/// The next states of an expired lease (`herald_lease_expiries_total{next_state}`).
pub const LEASE_NEXT_STATES: &[State] = &[
    State::Retryable,
    State::Unconfirmed,
    State::DeadLetter,
    State::Expired,
];

/// The classes after which a message is retried (pre-created series of the retry delay).
const RETRY_CLASSES: &[AttemptClass] = &[
    AttemptClass::RateLimited,
    AttemptClass::Transient,
    AttemptClass::NotSent,
    AttemptClass::Ambiguous,
];

/// Why a claimed message was put back without a request (`herald_held_total{reason}`).
pub const HELD_REASONS: &[&str] = &[
    "paused",
    "rate_limit",
    "max_in_flight",
    "endpoint_disabled",
    "smtp_pool",
    "shutdown",
    "lease",
];

/// Every metric of one Herald. Cheap to clone (shared).
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

struct Inner {
    registry: Registry,
    sources: BTreeSet<String>,
    attempts: IntCounterVec,
    send_duration: HistogramVec,
    retry_delay: HistogramVec,
    dead_letters: IntCounterVec,
    lease_expiries: IntCounterVec,
    held: IntCounterVec,
    endpoints_disabled: IntCounterVec,
    endpoint_disabled_now: IntGaugeVec,
    claim_batch: Histogram,
    receipts: IntCounterVec,
    ingest_requests: IntCounterVec,
    ingest_duration: HistogramVec,
    messages: IntGaugeVec,
    oldest_due: Gauge,
    reconciler_lag: Gauge,
    unmatched: IntGauge,
    blocked_keys: IntGauge,
    wal_frames: IntGauge,
    wal_frames_held: IntGauge,
    checkpoint_failing: IntGauge,
    database_up: IntGauge,
    sender_heartbeat_age: Gauge,
    sender_awake: IntGauge,
    sender_awake_periods: IntCounter,
    paused: IntGaugeVec,
    /// One scrape at a time sets the gauges and renders.
    scrape: Mutex<()>,
    /// One scrape at a time reads the database gauges ([`Metrics::database_read`]).
    database_read: Arc<tokio::sync::Semaphore>,
}

fn secs(start: f64, factor: f64, n: usize) -> Vec<f64> {
    prometheus::exponential_buckets(start, factor, n).unwrap_or_default()
}

impl Metrics {
    /// Leave to read the database gauges, held until the read ends (a scrape that stopped
    /// waiting for it included): scrapes arriving together, or each while a lock on the outbox
    /// holds the one before, share one pooled connection instead of taking one each.
    pub async fn database_read(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.inner.database_read.clone().acquire_owned().await.ok()
    }

    /// A registry with every series of Herald's metrics, the per-source ones for `sources` (the
    /// configured names: the only sources a label may name). Start-up only.
    pub fn new<'a>(sources: impl IntoIterator<Item = &'a str>) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let histogram = |name: &str, help: &str, labels: &[&str], buckets: Vec<f64>| {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)?;
            registry.register(Box::new(h.clone()))?;
            Ok::<_, prometheus::Error>(h)
        };
        let gauge = |name: &str, help: &str| {
            let g = Gauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, prometheus::Error>(g)
        };
        let int_gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, prometheus::Error>(g)
        };
        let int_gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, prometheus::Error>(g)
        };
        let attempts = counter(
            "herald_attempts_total",
            "Delivery attempts made (a request sent or tried), by channel and classification.",
            &["channel", "class"],
        )?;
        let send_duration = histogram(
            "herald_send_duration_seconds",
            "Duration of one delivery attempt (request to classified answer), by channel.",
            &["channel"],
            vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ],
        )?;
        let retry_delay = histogram(
            "herald_retry_delay_seconds",
            "Delay chosen before the next attempt of a retried message, by the class of the attempt.",
            &["class"],
            secs(1.0, 4.0, 9),
        )?;
        let dead_letters = counter(
            "herald_dead_letters_total",
            "Messages moved to dead_letter, by reason (the deciding class, or unconfirmed_deadline).",
            &["reason"],
        )?;
        let lease_expiries = counter(
            "herald_lease_expiries_total",
            "Expired sending leases returned by the watchdog, by the state they moved to.",
            &["next_state"],
        )?;
        let held = counter(
            "herald_held_total",
            "Claimed messages put back without a request or a spent attempt, by why: paused (the destination asked to slow down, refused the session, or could not be reached), rate_limit, max_in_flight, endpoint_disabled, smtp_pool, shutdown (claimed but not sent when Herald stopped), lease (it waited for a send slot so long that its lease could have run out mid-send).",
            &["reason"],
        )?;
        let endpoints_disabled = counter(
            "herald_endpoints_disabled_total",
            "Named endpoints this process disabled after repeated failures, by configured endpoint name.",
            &["endpoint"],
        )?;
        // What is disabled now, whichever process disabled it, also after a restart (the counter
        // above is this process's only, and gone after a restart; an operator's walk-through).
        let endpoint_disabled_now = int_gauge_vec(
            "herald_endpoint_disabled",
            "1 for a configured named endpoint that is disabled now (by any process; read from the database about once a second while the sender runs), 0 for one that is not.",
            &["endpoint"],
        )?;
        let claim_batch = {
            let h = Histogram::with_opts(
                HistogramOpts::new(
                    "herald_claim_batch_size",
                    "Rows leased by one claim transaction that found work (empty claims are not observed).",
                )
                .buckets(vec![1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0]),
            )?;
            registry.register(Box::new(h.clone()))?;
            h
        };
        let receipts = counter(
            "herald_receipts_total",
            "Receipts of verified ingest requests, by configured source and verdict (stored, duplicate, replayed).",
            &["source", "verdict"],
        )?;
        let ingest_requests = counter(
            "herald_ingest_requests_total",
            "POST /v1/ingest/{source} requests, by configured source and how they were answered.",
            &["source", "verdict"],
        )?;
        let ingest_duration = histogram(
            "herald_ingest_duration_seconds",
            "Time from an ingest request's arrival to its answer (body read, verified, committed), by source.",
            &["source"],
            secs(0.001, 2.5, 12),
        )?;
        let messages = int_gauge_vec(
            "herald_messages",
            "Messages in herald_outbox by state, read at scrape time.",
            &["state"],
        )?;
        let oldest_due = gauge(
            "herald_oldest_due_message_age_seconds",
            "How long the oldest due message (scheduled or retryable, next attempt reached, not held behind an open earlier place of its ordering key) has been waiting; 0 when none.",
        )?;
        let reconciler_lag = gauge(
            "herald_reconciler_lag_seconds",
            "Age of the oldest stored receipt the reconciler has not looked at yet; 0 when none.",
        )?;
        let unmatched = int_gauge(
            "herald_receipts_unmatched",
            "Receipts that match no message yet (tried again with backoff).",
        )?;
        let blocked_keys = int_gauge(
            "herald_ordering_blocked_keys",
            "Ordering keys held by a dead_letter or unconfirmed head (block policy): their later messages wait until it is replayed, canceled or skipped.",
        )?;
        let wal_frames = int_gauge(
            "herald_sqlite_wal_frames",
            "SQLite only: frames written to the WAL since it last started again, copied or not, when Herald's checkpointer last ran.",
        )?;
        let wal_frames_held = int_gauge(
            "herald_sqlite_wal_frames_held",
            "SQLite only: of those, the frames the last checkpoint could not copy because an older read transaction still needed them.",
        )?;
        let checkpoint_failing = int_gauge(
            "herald_sqlite_checkpoint_failing",
            "SQLite only: 1 while Herald's WAL checkpoints fail (a full disk, an I/O error), else 0.",
        )?;
        let database_up = int_gauge(
            "herald_database_up",
            "1 when the scrape could read the database gauges, else 0 (they are then left out).",
        )?;
        let sender_heartbeat_age = gauge(
            "herald_sender_heartbeat_age_seconds",
            "Time since the sender loop last completed an iteration; absent while no sender loop runs.",
        )?;
        let sender_awake = int_gauge(
            "herald_sender_awake",
            "PostgreSQL, listening: 1 while this process's sender has promised to stay awake (inserts skip the NOTIFY) or is withdrawing that promise, else 0.",
        )?;
        let sender_awake_periods = {
            let c = IntCounter::new(
                "herald_sender_awake_periods_total",
                "PostgreSQL, listening: times this process's sender became awake (its claims kept finding rows).",
            )?;
            registry.register(Box::new(c.clone()))?;
            c
        };
        let paused = int_gauge_vec(
            "herald_paused_destinations",
            "Destinations this process holds paused now (asked to slow down, refused Herald's session, or could not be reached; or waiting for a probe's answer after such a pause), by channel: webhook hosts, and the SMTP relay (0 or 1).",
            &["channel"],
        )?;
        let sources: BTreeSet<String> = sources.into_iter().map(str::to_owned).collect();
        // Every series exists from the start, at zero: a rate over a series that appears late
        // misses its first increments, and an operator sees what can be counted.
        for c in Channel::ALL {
            send_duration.with_label_values(&[c.as_str()]);
            for class in AttemptClass::ALL {
                if *class != AttemptClass::Exhausted {
                    attempts.with_label_values(&[c.as_str(), class.as_str()]);
                }
            }
        }
        for class in RETRY_CLASSES {
            retry_delay.with_label_values(&[class.as_str()]);
        }
        for r in [
            DeadLetterReason::Class(AttemptClass::Permanent),
            DeadLetterReason::Class(AttemptClass::Exhausted),
            DeadLetterReason::UnconfirmedDeadline,
        ] {
            dead_letters.with_label_values(&[r.as_str()]);
        }
        for r in HELD_REASONS {
            held.with_label_values(&[r]);
        }
        for s in LEASE_NEXT_STATES {
            lease_expiries.with_label_values(&[s.as_str()]);
        }
        for s in &sources {
            ingest_duration.with_label_values(&[s.as_str()]);
            for v in ReceiptVerdict::ALL {
                receipts.with_label_values(&[s.as_str(), v.as_str()]);
            }
            for v in IngestVerdict::ALL {
                if *v != IngestVerdict::UnknownSource {
                    ingest_requests.with_label_values(&[s.as_str(), v.as_str()]);
                }
            }
        }
        ingest_requests.with_label_values(&[UNKNOWN_SOURCE, IngestVerdict::UnknownSource.as_str()]);
        Ok(Self {
            inner: Arc::new(Inner {
                registry,
                sources,
                attempts,
                send_duration,
                retry_delay,
                dead_letters,
                lease_expiries,
                held,
                endpoints_disabled,
                endpoint_disabled_now,
                claim_batch,
                receipts,
                ingest_requests,
                ingest_duration,
                messages,
                oldest_due,
                reconciler_lag,
                unmatched,
                blocked_keys,
                wal_frames,
                wal_frames_held,
                checkpoint_failing,
                database_up,
                sender_heartbeat_age,
                sender_awake,
                sender_awake_periods,
                paused,
                scrape: Mutex::new(()),
                database_read: Arc::new(tokio::sync::Semaphore::new(1)),
            }),
        })
    }

    /// The label of a source: its configured name, or [`UNKNOWN_SOURCE`] for anything else.
    fn source<'a>(&'a self, name: &'a str) -> &'a str {
        if self.inner.sources.contains(name) {
            name
        } else {
            UNKNOWN_SOURCE
        }
    }

    /// One delivery attempt that made (or tried) a request, and how long it took.
    pub fn attempt(&self, channel: Channel, class: AttemptClass, took: Duration) {
        self.inner
            .attempts
            .with_label_values(&[channel.as_str(), class.as_str()])
            .inc();
        self.inner
            .send_duration
            .with_label_values(&[channel.as_str()])
            .observe(took.as_secs_f64());
    }

    /// A retry scheduled after an attempt of `class`, `delay` from now.
    pub fn retry_delay(&self, class: AttemptClass, delay: Duration) {
        self.inner
            .retry_delay
            .with_label_values(&[class.as_str()])
            .observe(delay.as_secs_f64());
    }

    pub fn dead_letters(&self, reason: DeadLetterReason, n: u64) {
        self.inner
            .dead_letters
            .with_label_values(&[reason.as_str()])
            .inc_by(n);
    }

    /// Expired leases moved to `next_state` by the watchdog.
    pub fn lease_expiries(&self, next_state: State, n: u64) {
        self.inner
            .lease_expiries
            .with_label_values(&[next_state.as_str()])
            .inc_by(n);
    }

    /// A claimed message put back without a request: `reason` is one of [`HELD_REASONS`].
    pub fn held(&self, reason: &'static str) {
        debug_assert!(HELD_REASONS.contains(&reason), "{reason}");
        self.inner.held.with_label_values(&[reason]).inc();
    }

    /// Which configured named endpoints are disabled now (`disabled`, as last read).
    pub fn endpoints_disabled_now<'a>(
        &self,
        configured: impl Iterator<Item = &'a str>,
        disabled: &[String],
    ) {
        for name in configured {
            let now = i64::from(disabled.iter().any(|d| d == name));
            self.inner
                .endpoint_disabled_now
                .with_label_values(&[name])
                .set(now);
        }
    }

    /// A named endpoint (a configured name: bounded) disabled by this process.
    pub fn endpoint_disabled(&self, endpoint: &str) {
        self.inner
            .endpoints_disabled
            .with_label_values(&[endpoint])
            .inc();
    }

    /// The sender's promise to stay awake (`sender::awake`): `before` and `after` a change of
    /// its phase, whether it had promised (or was withdrawing the promise).
    pub fn sender_awake(&self, before: bool, after: bool) {
        if after && !before {
            self.inner.sender_awake_periods.inc();
        }
        self.inner.sender_awake.set(i64::from(after));
    }

    /// A claim that leased `rows` rows (callers skip empty claims).
    pub fn claim_batch(&self, rows: usize) {
        self.inner.claim_batch.observe(rows as f64);
    }

    /// `n` receipts of a verified request of `source`.
    pub fn receipts(&self, source: &str, verdict: ReceiptVerdict, n: u64) {
        self.inner
            .receipts
            .with_label_values(&[self.source(source), verdict.as_str()])
            .inc_by(n);
    }

    /// One ingest request answered, and how long it took (an unknown source has no histogram).
    pub fn ingest_request(&self, source: &str, verdict: IngestVerdict, took: Duration) {
        let source = self.source(source);
        self.inner
            .ingest_requests
            .with_label_values(&[source, verdict.as_str()])
            .inc();
        if source != UNKNOWN_SOURCE {
            self.inner
                .ingest_duration
                .with_label_values(&[source])
                .observe(took.as_secs_f64());
        }
    }

    /// How many receipts of `source` got `verdict` (tests, support).
    pub fn receipts_count(&self, source: &str, verdict: ReceiptVerdict) -> u64 {
        self.inner
            .receipts
            .with_label_values(&[self.source(source), verdict.as_str()])
            .get()
    }

    /// The same, summed over every source.
    pub fn receipts_total(&self, verdict: ReceiptVerdict) -> u64 {
        self.inner
            .sources
            .iter()
            .map(|s| self.receipts_count(s, verdict))
            .sum()
    }

    /// The text exposition: every counter and histogram, and the gauges from `stats` (the
    /// database's, `None` when it could not be read), `wal` (SQLite's WAL, `None` on
    /// PostgreSQL), the sender's last beat and what it holds `paused`.
    pub fn render(
        &self,
        stats: Option<&DbStats>,
        wal: Option<&WalState>,
        sender_last_beat: Option<DateTime<Utc>>,
        paused: Paused,
        now: DateTime<Utc>,
    ) -> Result<String, prometheus::Error> {
        let i = &self.inner;
        let _one = i.scrape.lock().unwrap_or_else(|p| p.into_inner());
        let age = |at: DateTime<Utc>, of: Option<DateTime<Utc>>| {
            of.map(|t| (at - t).num_microseconds().unwrap_or(0).max(0) as f64 / 1e6)
                .unwrap_or(0.0)
        };
        let mut families = Vec::new();
        i.database_up.set(i64::from(stats.is_some()));
        if let Some(s) = stats {
            for state in State::ALL {
                let n = s
                    .by_state
                    .iter()
                    .find(|(st, _)| st == state)
                    .map_or(0, |(_, n)| *n);
                i.messages.with_label_values(&[state.as_str()]).set(n);
            }
            i.oldest_due.set(age(s.at, s.oldest_due));
            i.reconciler_lag.set(age(s.at, s.oldest_pending_receipt));
            i.unmatched.set(s.unmatched_receipts);
            i.blocked_keys.set(s.blocked_keys);
        }
        if let Some(w) = wal {
            i.wal_frames.set(w.frames);
            i.wal_frames_held.set(w.held);
            i.checkpoint_failing.set(i64::from(w.failing));
        }
        i.paused
            .with_label_values(&[Channel::Webhook.as_str()])
            .set(i64::try_from(paused.webhook).unwrap_or(i64::MAX));
        i.paused
            .with_label_values(&[Channel::Email.as_str()])
            .set(i64::from(paused.relay));
        let heartbeat = sender_last_beat.map(|t| age(now, Some(t)));
        if let Some(a) = heartbeat {
            i.sender_heartbeat_age.set(a);
        }
        for f in i.registry.gather() {
            let db_gauge = matches!(
                f.name(),
                "herald_messages"
                    | "herald_oldest_due_message_age_seconds"
                    | "herald_reconciler_lag_seconds"
                    | "herald_receipts_unmatched"
                    | "herald_ordering_blocked_keys"
            );
            let wal_gauge = f.name().starts_with("herald_sqlite_");
            let absent = (db_gauge && stats.is_none())
                || (wal_gauge && wal.is_none())
                || (f.name() == "herald_sender_heartbeat_age_seconds" && heartbeat.is_none());
            if !absent {
                families.push(f);
            }
        }
        TextEncoder::new().encode_to_string(&families)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> DbStats {
        let at = DateTime::from_timestamp(1_700_000_100, 0).unwrap();
        DbStats {
            at,
            by_state: vec![(State::Delivered, 3), (State::Retryable, 1)],
            oldest_due: Some(at - chrono::Duration::milliseconds(2500)),
            oldest_pending_receipt: None,
            unmatched_receipts: 2,
            blocked_keys: 1,
        }
    }

    #[test]
    fn renders_every_series_with_bounded_labels() {
        let m = Metrics::new(["resend", "mg"]).unwrap();
        m.attempt(
            Channel::Webhook,
            AttemptClass::Transient,
            Duration::from_millis(30),
        );
        m.retry_delay(AttemptClass::Transient, Duration::from_secs(2));
        m.dead_letters(DeadLetterReason::Class(AttemptClass::Permanent), 1);
        m.receipts("resend", ReceiptVerdict::Duplicate, 2);
        // A name that is not configured never becomes a label.
        m.receipts("https://evil.example/x", ReceiptVerdict::Stored, 1);
        m.ingest_request("nope/../x", IngestVerdict::UnknownSource, Duration::ZERO);
        let s = stats();
        let wal = WalState {
            frames: 120,
            held: 7,
            failing: false,
        };
        let paused = Paused {
            webhook: 2,
            relay: true,
        };
        let text = m.render(Some(&s), Some(&wal), None, paused, s.at).unwrap();
        for line in [
            "herald_attempts_total{channel=\"webhook\",class=\"transient\"} 1",
            "herald_attempts_total{channel=\"email\",class=\"accepted\"} 0",
            "herald_send_duration_seconds_count{channel=\"webhook\"} 1",
            "herald_retry_delay_seconds_count{class=\"transient\"} 1",
            "herald_dead_letters_total{reason=\"permanent\"} 1",
            "herald_dead_letters_total{reason=\"unconfirmed_deadline\"} 0",
            "herald_receipts_total{source=\"resend\",verdict=\"duplicate\"} 2",
            "herald_receipts_total{source=\"(unknown)\",verdict=\"stored\"} 1",
            "herald_ingest_requests_total{source=\"(unknown)\",verdict=\"unknown_source\"} 1",
            "herald_messages{state=\"delivered\"} 3",
            "herald_messages{state=\"expired\"} 0",
            "herald_oldest_due_message_age_seconds 2.5",
            "herald_reconciler_lag_seconds 0",
            "herald_receipts_unmatched 2",
            "herald_ordering_blocked_keys 1",
            "herald_database_up 1",
            "herald_sqlite_wal_frames 120",
            "herald_sqlite_wal_frames_held 7",
            "herald_sqlite_checkpoint_failing 0",
            "herald_paused_destinations{channel=\"webhook\"} 2",
            "herald_paused_destinations{channel=\"email\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(!text.contains("evil") && !text.contains("nope"));
        assert!(!text.contains("herald_sender_heartbeat_age_seconds"));
        assert_eq!(m.receipts_total(ReceiptVerdict::Duplicate), 2);
    }

    #[test]
    fn without_the_database_its_gauges_are_left_out() {
        let m = Metrics::new(["a"]).unwrap();
        let now = DateTime::from_timestamp(1_700_000_100, 0).unwrap();
        let text = m
            .render(
                None,
                None,
                Some(now - chrono::Duration::seconds(4)),
                Paused::default(),
                now,
            )
            .unwrap();
        assert!(text.contains("herald_database_up 0"), "{text}");
        assert!(
            text.contains("herald_sender_heartbeat_age_seconds 4"),
            "{text}"
        );
        assert!(!text.contains("herald_messages{"), "{text}");
        assert!(!text.contains("herald_oldest_due_message_age_seconds"));
        // Not the database's: there with or without it.
        assert!(
            text.contains("herald_paused_destinations{channel=\"email\"} 0"),
            "{text}"
        );
        // PostgreSQL: no WAL of Herald's to report.
        assert!(!text.contains("herald_sqlite_"), "{text}");
    }

    #[test]
    fn two_instances_never_share_counts() {
        let a = Metrics::new(["s"]).unwrap();
        let b = Metrics::new(["s"]).unwrap();
        a.receipts("s", ReceiptVerdict::Stored, 5);
        assert_eq!(a.receipts_count("s", ReceiptVerdict::Stored), 5);
        assert_eq!(b.receipts_count("s", ReceiptVerdict::Stored), 0);
    }

    #[test]
    fn verdicts_by_status() {
        use IngestVerdict::*;
        for (status, v) in [
            (200, Accepted),
            (401, SignatureRefused),
            (400, BadRequest),
            (408, BadRequest),
            (415, BadRequest),
            (422, BadRequest),
            (413, TooLarge),
            (503, Unavailable),
            (500, Error),
            (404, UnknownSource),
        ] {
            assert_eq!(IngestVerdict::of_status(status), v, "{status}");
        }
    }
}
