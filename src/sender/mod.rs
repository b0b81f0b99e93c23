//! The sender: claim due rows with a lease (committed before any network call), send them
//! concurrently, classify, decide, and write the outcomes back in batches.
//!
//! Invariants: no database transaction is open while a request is in flight; an outcome is
//! written only if the row is still leased to this sender for that attempt (a fence against a
//! lease that expired and was claimed again); a lease that runs out is returned by the watchdog.

pub mod decide;
pub mod listener;
pub mod policy;
pub mod throttle;

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::{Notify, Semaphore, mpsc, watch};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::channels::Outgoing;
use crate::channels::email::EmailChannel;
use crate::channels::webhook::WebhookChannel;
use crate::clock::Clock;
use crate::domain::{AttemptClass, Channel, State};
use crate::storage::models::{
    Applied, ExpiredLease, LeaseDecision, LeaseSweep, NewAttempt, OutboxRow, OutcomeRecord,
};
use crate::storage::{Db, StorageError};

use self::decide::{AttemptFacts, decide, series_attempt};
use self::throttle::{Answer, Throttle};

/// The throttle key of the SMTP relay: every email goes through the one relay configured.
const SMTP_RELAY: &str = "smtp";
use self::policy::RetryPolicy;

/// How long the loop waits for send slots to free up before claiming a smaller batch.
const CLAIM_LINGER: Duration = Duration::from_millis(5);

/// How the sender runs.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    pub owner: String,
    pub lease: Duration,
    pub batch_size: u32,
    pub concurrency: u32,
    pub poll_interval: Duration,
    pub policy: RetryPolicy,
}

impl SenderConfig {
    /// A lease owner unique to this process: `herald-<pid>-<random>`.
    pub fn new_owner() -> String {
        format!(
            "herald-{}-{:08x}",
            std::process::id(),
            rand::rng().random::<u32>()
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SenderError {
    #[error("{}", .0.log_safe())]
    Storage(#[from] StorageError),
    #[error("a blocking database task failed")]
    Join(#[from] tokio::task::JoinError),
}

/// Sends what is due. Cheap to clone.
#[derive(Clone)]
pub struct Sender {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    clock: Arc<dyn Clock>,
    config: SenderConfig,
    webhook: WebhookChannel,
    email: EmailChannel,
    wake: Arc<Notify>,
    throttle: Throttle,
}

impl Sender {
    pub fn new(
        db: Db,
        clock: Arc<dyn Clock>,
        config: SenderConfig,
        webhook: WebhookChannel,
        email: EmailChannel,
        wake: Arc<Notify>,
    ) -> Self {
        let throttle = Throttle::new(config.policy.base);
        Self {
            inner: Arc::new(Inner {
                db,
                clock,
                config,
                webhook,
                email,
                wake,
                throttle,
            }),
        }
    }

    pub fn owner(&self) -> &str {
        &self.inner.config.owner
    }

    /// Notified when new rows may be due (HTTP enqueue, PostgreSQL NOTIFY).
    pub fn wake_handle(&self) -> Arc<Notify> {
        self.inner.wake.clone()
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Db) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, SenderError> {
        let db = self.inner.db.clone();
        let span = tracing::Span::current();
        Ok(tokio::task::spawn_blocking(move || span.in_scope(|| f(&db))).await??)
    }

    /// The claim transaction: leases up to `limit` due rows and commits.
    pub async fn claim(&self, limit: u32) -> Result<Vec<OutboxRow>, SenderError> {
        let now = self.inner.clock.storage_now();
        let lease = self.inner.config.lease;
        let owner = self.inner.config.owner.clone();
        let version = self.inner.config.policy.version.clone();
        let (rows, expired) = self
            .blocking(move |db| db.claim(now, limit, &owner, lease, &version))
            .await?;
        if expired > 0 {
            info!(
                expired,
                "due messages past their expires_at marked expired; no request made"
            );
        }
        Ok(rows)
    }

    /// Sends one claimed row and decides what happens next. Never touches the database.
    pub async fn process(&self, row: OutboxRow) -> OutcomeRecord {
        let span = info_span!("send", event_id = %row.event_id, attempt = row.attempts);
        self.process_inner(row).instrument(span).await
    }

    async fn process_inner(&self, row: OutboxRow) -> OutcomeRecord {
        let now = self.inner.clock.now();
        let policy = &self.inner.config.policy;
        let fingerprint = crate::outbox::fingerprint_of(
            row.channel,
            &row.destination,
            &row.event_id,
            &row.payload,
        )
        .map(|f| f.as_str().to_owned());
        let base = OutcomeRecord {
            message_id: row.id,
            event_id: row.event_id.clone(),
            claimed_attempt: row.attempts,
            attempts_after: row.attempts,
            state: State::Sending,
            next_attempt_at: None,
            retry_delay_ms: None,
            error_class: None,
            request_fingerprint: fingerprint,
            provider_message_id: None,
            attempt: None,
        };
        let outgoing = Outgoing {
            event_id: &row.event_id,
            destination: &row.destination,
            payload: &row.payload,
        };
        // The destination it is bound to; while that is slowed down, the message is put back
        // for after the pause's end (spread over a tenth of the pause more, so that the held
        // messages do not all return at one instant) without a request and without spending an
        // attempt.
        let destination = match row.channel {
            Channel::Webhook => self.inner.webhook.destination_key(&row.destination),
            Channel::Email => Some(SMTP_RELAY.to_owned()),
        };
        if let Some(until) = destination
            .as_deref()
            .and_then(|d| self.inner.throttle.paused_until(d, now))
        {
            let wait = (until - now).num_milliseconds().max(0);
            info!(%until, "destination slowed down: put back without a request");
            return put_back(base, row.attempts, now, wait, AttemptClass::RateLimited);
        }
        let report = match row.channel {
            Channel::Webhook => self.inner.webhook.send(&outgoing).await,
            Channel::Email => self.inner.email.send(&outgoing).await,
        };
        if report.error_kind.as_deref() == Some("pool_timeout") {
            // Every SMTP connection stayed busy for the whole attempt: this message was never
            // tried, so no attempt is spent on it (more sends in flight than the pool's size
            // must not dead-letter mail that never left).
            info!("no SMTP connection free in time: put back without an attempt");
            let wait = policy.base.as_millis() as i64;
            return put_back(base, row.attempts, now, wait, AttemptClass::NotSent);
        }
        let semantics = row.semantics;
        let max_attempts = row
            .max_attempts
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(policy.max_attempts);
        let facts = AttemptFacts {
            class: report.class,
            retry_after: report.retry_after,
            attempt: series_attempt(row.attempts, row.attempt_base),
            max_attempts,
            semantics,
        };
        let unit: f64 = rand::rng().random();
        let decision = decide(facts, policy, report.finished_at.max(now), unit);
        if let Some(d) = &destination {
            let answer = Answer {
                class: report.class,
                status: report.status,
                // What it asked for, as the policy clamps it (no jitter: the pause is the
                // destination's, the spread comes when messages are put back).
                asked: report
                    .retry_after
                    .map(|asked| policy.after_retry_after(asked, 0.0).delay),
                is_smtp: row.channel == Channel::Email,
            };
            if let Some(until) = self.inner.throttle.observe(d, &answer, report.finished_at) {
                warn!(%until, class = report.class.as_str(), status = report.status, "destination slowed down");
            }
        }
        info!(
            class = report.class.as_str(),
            status = report.status,
            next_state = decision.state.as_str(),
            delay_ms = decision.delay.map(|d| d.as_millis() as u64),
            "attempt classified"
        );
        OutcomeRecord {
            state: decision.state,
            next_attempt_at: decision.next_attempt_at,
            retry_delay_ms: decision.delay.map(|d| d.as_millis() as i64),
            error_class: decision.error_class,
            provider_message_id: report.provider_message_id.clone(),
            attempt: Some(NewAttempt {
                started_at: report.started_at,
                finished_at: report.finished_at,
                duration_ms: (report.finished_at - report.started_at).num_milliseconds(),
                response_status: report.status.map(i32::from),
                error_kind: report.error_kind,
                class: report.class,
                retry_after: report.retry_after_raw,
                delay_ms: decision.delay.map(|d| d.as_millis() as i64),
                delay_reason: Some(decision.reason),
                policy_version: policy.version.clone(),
                response_excerpt: report.excerpt,
            }),
            ..base
        }
    }

    /// Writes outcomes in one transaction.
    pub async fn record(&self, outcomes: Vec<OutcomeRecord>) -> Result<Vec<Applied>, SenderError> {
        let owner = self.inner.config.owner.clone();
        let now = self.inner.clock.storage_now();
        let applied = self
            .blocking(move |db| {
                db.record_outcomes(&owner, now, &outcomes)
                    .map(|a| (a, outcomes))
            })
            .await?;
        for (a, o) in applied.0.iter().zip(&applied.1) {
            match a {
                Applied::LeaseLost => {
                    warn!(event_id = %o.event_id, "lease lost before the outcome was written; attempt recorded as lease_lost")
                }
                Applied::Settled => {
                    info!(event_id = %o.event_id, "a late 2xx settled a message the watchdog had left unconfirmed")
                }
                Applied::Yes => {}
            }
        }
        Ok(applied.0)
    }

    /// One claim, every send concurrently (bounded), one write: returns how many rows it handled.
    pub async fn run_once(&self) -> Result<usize, SenderError> {
        // No more than can be in flight at once: a claimed row waiting for a slot would burn
        // its lease.
        let cfg = &self.inner.config;
        let rows = self.claim(cfg.batch_size.min(cfg.concurrency)).await?;
        let n = rows.len();
        if n == 0 {
            return Ok(0);
        }
        let limit = Arc::new(Semaphore::new(self.inner.config.concurrency as usize));
        let mut tasks = tokio::task::JoinSet::new();
        for row in rows {
            let this = self.clone();
            let limit = limit.clone();
            tasks.spawn(async move {
                let _permit = limit.acquire_owned().await;
                this.process(row).await
            });
        }
        let mut outcomes = Vec::with_capacity(n);
        while let Some(done) = tasks.join_next().await {
            outcomes.push(done?);
        }
        self.record(outcomes).await?;
        Ok(n)
    }

    /// Runs [`Sender::run_once`] until nothing is due; returns the total handled (tests, CLI).
    pub async fn run_until_idle(&self) -> Result<usize, SenderError> {
        let mut total = 0;
        loop {
            let n = self.run_once().await?;
            if n == 0 {
                return Ok(total);
            }
            total += n;
        }
    }

    /// The watchdog pass: expired leases back to `retryable` (or `unconfirmed`/`dead_letter`).
    pub async fn sweep_leases(&self) -> Result<LeaseSweep, SenderError> {
        let now = self.inner.clock.storage_now();
        let policy = self.inner.config.policy.clone();
        let sweep = self
            .blocking(move |db| {
                db.sweep_expired_leases(now, &|row, at| lease_expired_decision(&policy, row, at))
            })
            .await?;
        if sweep.total() > 0 {
            warn!(
                to_retryable = sweep.to_retryable,
                to_unconfirmed = sweep.to_unconfirmed,
                to_dead_letter = sweep.to_dead_letter,
                "expired leases returned"
            );
        }
        Ok(sweep)
    }

    /// The production loop: claims as many rows as there are free send slots, sends each as soon
    /// as it is claimed, and flushes outcomes in batches. Stops claiming when `shutdown` turns
    /// true, lets in-flight sends finish (each is bounded by its timeout), flushes, and returns.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let cfg = &self.inner.config;
        let slots = Arc::new(Semaphore::new(cfg.concurrency as usize));
        let (tx, rx) = mpsc::channel::<OutcomeRecord>(cfg.concurrency as usize * 2);
        let flusher = tokio::spawn(self.clone().flush_loop(rx));
        let sweep_every = (cfg.lease / 2).max(Duration::from_secs(1));
        let mut next_sweep = tokio::time::Instant::now();
        let mut failures = 0u32;
        info!(owner = %cfg.owner, "sender started");
        loop {
            if *shutdown.borrow() {
                break;
            }
            if tokio::time::Instant::now() >= next_sweep {
                if let Err(e) = self.sweep_leases().await {
                    warn!(error = %e, "lease watchdog failed; will retry");
                }
                next_sweep = tokio::time::Instant::now() + sweep_every;
            }
            // While many sends are in flight, let some finish so the next claim is a batch rather
            // than a trickle of one-row transactions (waits at most CLAIM_LINGER).
            let want = cfg.batch_size.min(cfg.concurrency).div_ceil(2);
            if (slots.available_permits() as u32) < want {
                tokio::select! {
                    p = tokio::time::timeout(CLAIM_LINGER, slots.acquire_many(want)) => drop(p),
                    _ = shutdown.changed() => {}
                }
            }
            let free = slots.available_permits() as u32;
            if free == 0 {
                tokio::select! {
                    p = slots.clone().acquire_owned() => drop(p),
                    _ = shutdown.changed() => {}
                }
                continue;
            }
            let rows = match self.claim(free.min(cfg.batch_size)).await {
                Ok(rows) => {
                    failures = 0;
                    rows
                }
                Err(e) => {
                    failures += 1;
                    warn!(error = %e, failures, "claim failed; backing off");
                    let pause = cfg.poll_interval * failures.min(10);
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = shutdown.changed() => {}
                    }
                    continue;
                }
            };
            let full = rows.len() as u32 == free.min(cfg.batch_size);
            for row in rows {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    break;
                };
                let this = self.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let outcome = this.process(row).await;
                    // The flusher outlives every sender task: it stops when all senders drop tx.
                    let _ = tx.send(outcome).await;
                    drop(permit);
                });
            }
            if !full {
                tokio::select! {
                    _ = self.inner.wake.notified() => debug!("woken"),
                    _ = tokio::time::sleep(cfg.poll_interval) => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
        info!("sender stopping: waiting for in-flight sends");
        let _all = slots.acquire_many(cfg.concurrency).await;
        drop(tx);
        if let Err(e) = flusher.await {
            warn!(error = %e, "outcome flusher ended abnormally");
        }
        info!("sender stopped");
    }

    async fn flush_loop(self, mut rx: mpsc::Receiver<OutcomeRecord>) {
        const MAX_BATCH: usize = 256;
        const LINGER: Duration = Duration::from_millis(2);
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            // Whatever else finishes within a moment joins this write: fewer, larger
            // transactions (the outcome of a send is delayed by at most LINGER).
            let deadline = tokio::time::Instant::now() + LINGER;
            while batch.len() < MAX_BATCH {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(o)) => batch.push(o),
                    _ => break,
                }
            }
            let mut tries = 0u32;
            loop {
                match self.record(batch.clone()).await {
                    Ok(_) => break,
                    Err(e) => {
                        tries += 1;
                        // Outcomes not written are not lost work: their leases expire and the
                        // watchdog returns the rows. Keep trying for a while first.
                        if tries >= 20 {
                            warn!(error = %e, rows = batch.len(), "giving up on writing outcomes; leases will expire");
                            break;
                        }
                        warn!(error = %e, tries, "writing outcomes failed; retrying");
                        tokio::time::sleep(Duration::from_millis(100 * u64::from(tries))).await;
                    }
                }
            }
        }
    }
}

/// What becomes of a message whose lease ran out: the same [`decide`] as for any ambiguous
/// attempt (`unconfirmed` under at_most_once, `dead_letter` when the budget is spent, else
/// `retryable` after the policy's backoff for that attempt number — so a message whose sends keep
/// killing their process backs off instead of crash-looping the fleet).
pub fn lease_expired_decision(
    policy: &RetryPolicy,
    row: &ExpiredLease,
    at: chrono::DateTime<chrono::Utc>,
) -> LeaseDecision {
    let facts = AttemptFacts {
        class: AttemptClass::Ambiguous,
        retry_after: None,
        attempt: series_attempt(row.attempts, row.attempt_base),
        max_attempts: row
            .max_attempts
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(policy.max_attempts),
        semantics: row.semantics,
    };
    let d = decide(facts, policy, at, rand::rng().random());
    LeaseDecision {
        state: d.state,
        error_class: d.error_class,
        delay_ms: d.delay.map(|d| d.as_millis() as i64),
        reason: d.reason,
        policy_version: policy.version.clone(),
    }
}

/// A claimed message put back without a request: `retryable` after `wait_ms` (plus up to a tenth
/// of it, so that messages put back together do not all return at one instant), the claim's
/// attempt not spent, no attempt row.
fn put_back(
    base: OutcomeRecord,
    claimed_attempts: i32,
    now: chrono::DateTime<chrono::Utc>,
    wait_ms: i64,
    class: AttemptClass,
) -> OutcomeRecord {
    let wait = wait_ms.max(0);
    let wait = wait + (wait as f64 * 0.1 * rand::rng().random::<f64>()) as i64;
    OutcomeRecord {
        state: State::Retryable,
        attempts_after: claimed_attempts - 1,
        next_attempt_at: Some(now + chrono::Duration::milliseconds(wait)),
        retry_delay_ms: Some(wait),
        error_class: Some(class),
        ..base
    }
}
