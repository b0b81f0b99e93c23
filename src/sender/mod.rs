//! The sender: claim due rows with a lease (committed before any network call), send them
//! concurrently, classify, decide, and write the outcomes back in batches.
//!
//! Invariants: no database transaction is open while a request is in flight; an outcome is
//! written only if the row is still leased to this sender for that attempt (a fence against a
//! lease that expired and was claimed again); a lease that runs out is returned by the watchdog.

pub mod awake;
pub mod decide;
pub mod disable;
pub mod limits;
pub mod listener;
pub mod policy;
pub mod throttle;

use futures_util::FutureExt;
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
use crate::health::Heartbeat;
use crate::metrics::{DeadLetterReason, Metrics};
use crate::storage::models::{
    Applied, ExpiredLease, LeaseDecision, LeaseSweep, NewAttempt, OutboxRow, OutcomeRecord,
};
use crate::storage::{Db, StorageError};

use self::decide::{
    AttemptFacts, decide, not_before_pause, series_attempt, too_late, within_expiry,
};
use self::disable::Streaks;
use self::limits::{Limit, Limits};
use self::policy::RetryPolicy;
use self::throttle::{Answer, SMTP_RELAY, Throttle};

/// How long the claim loop waits for room among the claimed rows before it claims a smaller
/// batch.
const CLAIM_LINGER: Duration = Duration::from_millis(5);

/// How the sender runs.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    pub owner: String,
    pub lease: Duration,
    /// The longest a send may take (the longest send timeout): a claimed row starts its send
    /// only while its lease has at least this long left.
    pub longest_send: Duration,
    pub batch_size: u32,
    pub concurrency: u32,
    pub poll_interval: Duration,
    pub policy: RetryPolicy,
    /// `[endpoints.NAME.retry]` by endpoint name; any other destination uses `policy`.
    pub endpoint_policies: std::collections::BTreeMap<String, RetryPolicy>,
    pub limits: LimitsConfig,
    /// How long a shutdown keeps trying to write outcomes that fail to be written (the database
    /// down): past it, counted from the signal, the flusher gives up on them (see
    /// [`give_up_writing_outcomes`]).
    pub shutdown_timeout: Duration,
    /// Stay awake while claims keep finding rows, so that applications' inserts skip the
    /// wake-up ([`awake`]): for a sender woken by LISTEN/NOTIFY on PostgreSQL.
    pub keep_awake: bool,
}

/// Per-destination limits beyond a named endpoint's own (see [`limits`]).
#[derive(Debug, Clone, Default)]
pub struct LimitsConfig {
    /// Sends in flight to one destination (host or SMTP relay) unless configured otherwise.
    pub default_max_in_flight: u32,
    /// `[destinations."HOST"]`, by lower-case host.
    pub hosts: std::collections::BTreeMap<String, Limit>,
    /// The SMTP relay's.
    pub smtp: Limit,
}

impl LimitsConfig {
    /// The limit of a host (or the relay): as configured, the default cap filling a gap.
    fn with_default_cap(&self, configured: Option<Limit>) -> Limit {
        let mut l = configured.unwrap_or_default();
        l.max_in_flight = l.max_in_flight.or(Some(self.default_max_in_flight));
        l
    }
}

/// What [`Sender::clear`] decided for a claimed row.
#[allow(clippy::large_enum_variant)] // `Held` is moved once, into the outcomes; boxing it buys nothing
pub enum Clearance {
    /// Send it. Boxed: the send task holds it across every await, and a send task's size is
    /// what each spawn allocates and copies (see [`Sender::send_cleared`]).
    Go(Box<Cleared>),
    /// Put back without a request: the outcome to write.
    Held(OutcomeRecord),
}

/// A claimed row cleared by [`Sender::clear`]: its places under its destination's limits are
/// held until the send is over.
pub struct Cleared {
    row: OutboxRow,
    base: OutcomeRecord,
    /// The pause key: a webhook URL's scheme, host and port, or the SMTP relay.
    destination: Option<String>,
    endpoint: Option<String>,
    /// `None`: over a cap on sends in flight when cleared; the send waits briefly for a place.
    permit: Option<limits::Permit>,
    bound: Vec<(String, Limit)>,
    /// A webhook's request body, serialized once for both its fingerprint and its request.
    body: Option<bytes::Bytes>,
    /// The destination's host for the send's log span, found once at the clearance.
    host: Option<String>,
    /// The database's clock less this process's, as the claim saw it: the claim's time (the
    /// row's `updated_at`, the database's on PostgreSQL) less this process's reading when the
    /// claim began. It is never less than the true difference (the claim took some time), so a
    /// check by it errs toward "expired", never toward a late send.
    db_offset: chrono::Duration,
}

impl LimitsConfig {
    /// `[destinations."HOST:PORT"]`, else `[destinations."HOST"]`.
    fn host_limit(&self, host: &str, key: &str) -> Option<Limit> {
        let host_port = key.split_once("://").map_or(key, |(_, hp)| hp);
        self.hosts
            .get(host_port)
            .or_else(|| self.hosts.get(host))
            .copied()
    }
}

/// The outcome of a claimed row before anything happened to it: still `sending`, its attempt
/// the claimed one.
fn outcome_of(row: &OutboxRow) -> OutcomeRecord {
    OutcomeRecord {
        message_id: row.id,
        event_id: row.event_id.clone(),
        claimed_attempt: row.attempts,
        attempts_after: row.attempts,
        state: State::Sending,
        next_attempt_at: None,
        retry_delay_ms: None,
        error_class: None,
        request_fingerprint: None,
        fingerprint_in_row: row.request_fingerprint.is_some(),
        provider_message_id: None,
        attempt: None,
        ordering: None,
        due_now: Vec::new(),
    }
}

/// How many claimed rows may wait for a send slot (see [`Sender::run`]): at most a batch, and
/// no more than there are slots, so that a row waits for about one send at most before its own.
fn ready_room(cfg: &SenderConfig) -> u32 {
    cfg.batch_size.min(cfg.concurrency).max(1)
}

/// Aborts the task when dropped (a `run` dropped before its end takes its claim loop along).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A claimed row on its way from the claim loop to a send slot.
struct Claimed {
    row: OutboxRow,
    /// Its place among the rows waiting for a slot (see [`Sender::run`]).
    place: tokio::sync::OwnedSemaphorePermit,
    /// When its claim began: its lease started no earlier.
    at: chrono::DateTime<chrono::Utc>,
}

/// How long a send over its destination's cap waits for a place before it is put back.
const CAP_PATIENCE: Duration = Duration::from_millis(100);

/// How long a message of a disabled endpoint is put back for before it is looked at again:
/// enabling the endpoint makes its waiting messages due at once (`Db::enable_endpoint`), so this
/// only bounds the cost of a backlog held meanwhile (every message claimed and put back once a
/// period: 30 s made a backlog of 1,000 a hundred claims a second, each logged).
const DISABLED_WAIT: Duration = Duration::from_secs(300);
/// How long after it sees an endpoint enabled the sender releases its waiting messages again at
/// each reread (see `refresh_disabled`).
const ENABLED_RELEASE_FOR: chrono::TimeDelta = chrono::TimeDelta::seconds(5);
/// How often the sender rereads which endpoints are disabled (it knows at once of its own).
const DISABLED_REFRESH: chrono::TimeDelta = chrono::TimeDelta::seconds(1);

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

/// See [`Sender::set_before_send`].
pub type BeforeSend = Box<dyn Fn(&str) + Send + Sync>;

struct Inner {
    before_send: std::sync::OnceLock<BeforeSend>,
    db: Db,
    clock: Arc<dyn Clock>,
    config: SenderConfig,
    /// `config`'s policies as the claim records them on rows written without one.
    policies: Arc<crate::domain::policies::Policies>,
    webhook: WebhookChannel,
    email: EmailChannel,
    wake: Arc<Notify>,
    throttle: Arc<Throttle>,
    limits: Arc<Limits>,
    streaks: Streaks,
    /// The endpoints disabled in the database, as last read, and when.
    disabled: std::sync::Mutex<(Option<chrono::DateTime<chrono::Utc>>, Vec<String>)>,
    metrics: Metrics,
    heartbeat: Arc<Heartbeat>,
    /// Ended keyed messages whose key an uncommitted insert held when their outcome was written
    /// (`Db::release_rechecked`): released again on the loop's next iterations.
    recheck: std::sync::Mutex<Recheck>,
    /// Claims (message id, attempt) this process still holds: claimed by the production loop and
    /// waiting for a send slot, in flight, or with their outcome on its way to the database
    /// (queued for the flusher, or in a batch it has not written yet). This process's watchdog
    /// leaves their rows alone even once their lease has run out (see
    /// [`give_up_writing_outcomes`]); the entry goes when the outcome is written, or given up
    /// on.
    unwritten: std::sync::Mutex<std::collections::HashSet<(i64, i32)>>,
    /// The times messages this process wrote back as `retryable` become due, within
    /// [`DUE_HORIZON`] (put back by a destination's limit or pause, or a backoff): the idle loop
    /// wakes for each rather than at its next poll, so held messages go when their slot comes.
    next_due: std::sync::Mutex<std::collections::BTreeSet<std::time::Instant>>,
    /// Endpoints this process saw enabled, and when (see `refresh_disabled`).
    enabled_recently: std::sync::Mutex<Vec<(String, chrono::DateTime<chrono::Utc>)>>,
}

/// How far ahead a due time is noted (see [`Inner::next_due`]); a later one is left to the poll.
const DUE_HORIZON: Duration = Duration::from_secs(600);

/// The most due times [`Inner::next_due`] keeps: beyond them, the latest are left to the poll.
const DUE_NOTES: usize = 1024;

type DueNotes = std::sync::Mutex<std::collections::BTreeSet<std::time::Instant>>;

/// Notes `at` (see [`Inner::next_due`]); true when it is now the soonest, so an idle loop that
/// chose its sleep before must be woken to choose again.
fn note_due(notes: &DueNotes, at: std::time::Instant) -> bool {
    let mut notes = notes.lock().unwrap_or_else(|p| p.into_inner());
    notes.insert(at);
    while notes.len() > DUE_NOTES {
        notes.pop_last();
    }
    notes.first() == Some(&at)
}

/// How long until the soonest noted due time after `claimed_at`; those at or before it are
/// forgotten (the claim that began then saw their rows). `None` when none is left.
fn due_wait(notes: &DueNotes, claimed_at: std::time::Instant) -> Option<Duration> {
    let mut notes = notes.lock().unwrap_or_else(|p| p.into_inner());
    while notes.first().is_some_and(|at| *at <= claimed_at) {
        notes.pop_first();
    }
    notes
        .first()
        .map(|at| at.saturating_duration_since(std::time::Instant::now()))
}

/// When the shutdown signal of one [`Sender::run`] came: set by a task of that run as it comes,
/// or by its flusher, whichever sees it first.
type StoppingSince = Arc<std::sync::OnceLock<tokio::time::Instant>>;

/// The keys to release again ([`Inner::recheck`]), and when the newest of them was found busy.
#[derive(Debug, Default)]
struct Recheck {
    ids: Vec<i64>,
    newest: Option<std::time::Instant>,
}

impl Recheck {
    /// Keys found busy at `now`.
    fn add(&mut self, ids: Vec<i64>, now: std::time::Instant) {
        if !ids.is_empty() {
            self.ids.extend(ids);
            self.newest = Some(now);
        }
    }

    /// Keys taken for a look and not released (still busy, or the look failed).
    fn put_back(&mut self, ids: Vec<i64>) {
        self.ids.extend(ids);
        if self.ids.is_empty() {
            self.newest = None;
        }
    }

    /// How long the idle loop may sleep before it looks again: as long as the newest key has
    /// waited so far, at least [`RECHECK_FIRST`] and at most [`RECHECK_MAX`]; `None` when no
    /// key waits.
    fn wait(&self, now: std::time::Instant) -> Option<Duration> {
        let newest = self.newest.filter(|_| !self.ids.is_empty())?;
        Some(
            now.saturating_duration_since(newest)
                .clamp(RECHECK_FIRST, RECHECK_MAX),
        )
    }
}

fn lock_recheck(m: &std::sync::Mutex<Recheck>) -> std::sync::MutexGuard<'_, Recheck> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// While some key waits for an insert to end ([`Inner::recheck`]), the loop looks again on every
/// iteration — a wake-up included, and the insert's commit wakes it (its notification, or the
/// HTTP enqueue's wake-up) — and an idle loop sleeps no longer than [`Recheck::wait`]: at first
/// this long, then as long as the newest busy key has waited (an application holding its
/// transaction open is looked at less and less often), up to [`RECHECK_MAX`] — and never longer
/// than `poll_interval`, whose periodic release also covers these keys.
const RECHECK_FIRST: Duration = Duration::from_millis(20);
const RECHECK_MAX: Duration = Duration::from_secs(1);

impl Sender {
    pub fn new(
        db: Db,
        clock: Arc<dyn Clock>,
        config: SenderConfig,
        webhook: WebhookChannel,
        email: EmailChannel,
        wake: Arc<Notify>,
        metrics: Metrics,
    ) -> Self {
        let throttle = Arc::new(Throttle::new(config.policy.base, config.longest_send));
        let heartbeat = Arc::new(Heartbeat::new(Heartbeat::limit_for(
            config.poll_interval,
            config.lease,
        )));
        Self {
            inner: Arc::new(Inner {
                db,
                clock,
                policies: Arc::new(policy::policies(&config.policy, &config.endpoint_policies)),
                config,
                webhook,
                email,
                wake,
                throttle,
                limits: Arc::default(),
                streaks: Streaks::default(),
                disabled: std::sync::Mutex::new((None, Vec::new())),
                metrics,
                heartbeat,
                recheck: std::sync::Mutex::new(Recheck::default()),
                unwritten: std::sync::Mutex::default(),
                next_due: std::sync::Mutex::default(),
                enabled_recently: std::sync::Mutex::default(),
                before_send: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Installs, once, a hook called with each message's event id just before its request
    /// (tests: a send that panics). Returns `false` when one was installed already.
    pub fn set_before_send(&self, hook: BeforeSend) -> bool {
        self.inner.before_send.set(hook).is_ok()
    }

    /// When the production loop's claim loop ([`Sender::run`]) last completed an iteration;
    /// `/readyz` reads it.
    pub fn heartbeat(&self) -> Arc<Heartbeat> {
        self.inner.heartbeat.clone()
    }

    /// This process's pauses of destinations; `/metrics` counts them.
    pub fn throttle(&self) -> Arc<Throttle> {
        self.inner.throttle.clone()
    }

    /// Whether this process holds the claim of `message_id` at `attempt` (see
    /// [`Inner::unwritten`]): its watchdog leaves that row alone. The production loop holds a
    /// claim from just after it commits until its outcome is written.
    pub fn holds_claim(&self, message_id: i64, attempt: i32) -> bool {
        lock_unwritten(&self.inner.unwritten).contains(&(message_id, attempt))
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

    /// Promises to stay awake ([`awake::PROMISE`]); the promise, or `None` where there is
    /// nothing to promise or it failed (then inserts keep notifying: nothing is missed).
    async fn promise_awake(&self) -> Option<i64> {
        let for_ms = awake::PROMISE.as_millis() as i64;
        match self.blocking(move |db| db.promise_awake(for_ms)).await {
            Ok(p) => p,
            Err(e) => {
                debug!(error = %e, "promising to stay awake failed; inserts keep waking");
                None
            }
        }
    }

    /// Withdraws `promise` and says whether the claim after this sees every row whose wake-up
    /// was skipped under it ([`awake`]); `false` when that cannot be told.
    async fn settle_awake(&self, promise: Option<i64>) -> bool {
        // No promise of ours (its statement failed): another's, if any, is withdrawn by its
        // maker; still wait for the transactions that may have seen ours before.
        let promise = promise.unwrap_or(-1);
        match self.blocking(move |db| db.settle_awake(promise)).await {
            Ok(settled) => settled,
            Err(e) => {
                debug!(error = %e, "withdrawing the promise to stay awake failed; will retry");
                false
            }
        }
    }

    /// The claim transaction: leases up to `limit` due rows and commits.
    pub async fn claim(&self, limit: u32) -> Result<Vec<OutboxRow>, SenderError> {
        let now = self.inner.clock.storage_now();
        let lease = self.inner.config.lease;
        let owner = self.inner.config.owner.clone();
        let policies = self.inner.policies.clone();
        let (rows, expired) = self
            .blocking(move |db| db.claim(now, limit, &owner, lease, &policies))
            .await?;
        // The rows are claimed (committed): a failed reread keeps the last list rather than
        // leaving them leased and unsent until their lease runs out.
        // Also after an empty claim while an endpoint is (or was just) disabled: an enabling
        // must be seen, and its held messages released, without a claim that finds rows. And
        // once at start, so that what is disabled is known (and shown: the
        // `herald_endpoint_disabled` gauge) before any message comes.
        let watching = {
            let d = self
                .inner
                .disabled
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            !d.1.is_empty() || d.0.is_none()
        } || !self
            .inner
            .enabled_recently
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        if (!rows.is_empty() || watching)
            && let Err(e) = self.refresh_disabled().await
        {
            warn!(error = %e, "rereading the disabled endpoints failed; using the last list");
        }
        if expired > 0 {
            // An expired head released its key.
            self.inner.wake.notify_one();
            info!(
                expired,
                "due messages past their expires_at marked expired; no request made"
            );
        }
        if !rows.is_empty() {
            self.inner.metrics.claim_batch(rows.len());
        }
        Ok(rows)
    }

    /// Rereads the disabled endpoints when the last read is older than [`DISABLED_REFRESH`]
    /// (only when some endpoint is named at all).
    async fn refresh_disabled(&self) -> Result<(), SenderError> {
        // Any named endpoint, rule or not: one disabled under a rule since taken out of the
        // configuration stays disabled until it is enabled (as `GET /v1/endpoints` says).
        if self.inner.webhook.endpoints().next().is_none() {
            return Ok(());
        }
        let now = self.inner.clock.now();
        let stale = {
            let d = self
                .inner
                .disabled
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            d.0.is_none_or(|at| now - at >= DISABLED_REFRESH || at > now)
        };
        if stale {
            let names: Vec<String> = self
                .blocking(|db| db.disabled_endpoints())
                .await?
                .into_iter()
                .map(|d| d.name)
                .collect();
            let enabled: Vec<String> = {
                let mut d = self
                    .inner
                    .disabled
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let left: Vec<String> =
                    d.1.iter().filter(|n| !names.contains(n)).cloned().collect();
                d.0 = Some(now);
                d.1.clone_from(&names);
                left
            };
            self.inner.metrics.endpoints_disabled_now(
                self.inner.webhook.endpoints().map(|e| e.name.as_str()),
                &names,
            );
            // Failures counted before the enabling (sends in flight when it was disabled) do not
            // start its next streak.
            for name in &enabled {
                self.inner.streaks.reset(name);
            }
            // Enabled since the last read (here or by another process): a message this process
            // put back meanwhile, still taking the endpoint for disabled, would wait its whole
            // DISABLED_WAIT. Released with the enabling's own UPDATE now and at the rereads of
            // the next few seconds, which catch a put-back written after this one.
            let releasing = {
                let mut r = self
                    .inner
                    .enabled_recently
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                r.extend(enabled.into_iter().map(|n| (n, now)));
                // Not one disabled again meanwhile: its put-backs must wait.
                r.retain(|(n, since)| now - *since < ENABLED_RELEASE_FOR && !names.contains(n));
                r.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>()
            };
            for name in releasing {
                let n = name.clone();
                match self.blocking(move |db| db.release_enabled(&n, now)).await {
                    // Due in ENABLED_DUE_IN: the idle loop wakes then, not at its next poll.
                    Ok(released) if released > 0 => {
                        let due =
                            std::time::Instant::now() + crate::storage::endpoints::ENABLED_DUE_IN;
                        if note_due(&self.inner.next_due, due) {
                            self.inner.wake.notify_one();
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        warn!(endpoint = %name, error = %e, "releasing an enabled endpoint's messages failed; they go at the end of their wait");
                    }
                }
            }
        }
        Ok(())
    }

    fn is_disabled(&self, endpoint: &str) -> bool {
        let d = self
            .inner
            .disabled
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        d.1.iter().any(|n| n == endpoint)
    }

    /// Counts an attempt toward its endpoint's streak of failures and disables the endpoint
    /// when the streak trips its rule. Logged as an operational event.
    async fn count_toward_disable(
        &self,
        endpoint: &crate::channels::webhook::Endpoint,
        class: AttemptClass,
        at: chrono::DateTime<chrono::Utc>,
    ) {
        let Some(rule) = endpoint.auto_disable else {
            return;
        };
        let Some(tripped) = self.inner.streaks.observe(&endpoint.name, class, at, rule) else {
            return;
        };
        let reason = format!(
            "{} failed attempts in a row since {}",
            tripped.failures,
            tripped
                .since
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
        let name = endpoint.name.clone();
        let (n, r) = (name.clone(), reason.clone());
        match self
            .blocking(move |db| db.disable_endpoint(&n, &r, at))
            .await
        {
            Ok(changed) => {
                {
                    let mut d = self
                        .inner
                        .disabled
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    if !d.1.contains(&name) {
                        d.1.push(name.clone());
                    }
                }
                if changed {
                    self.inner.metrics.endpoint_disabled(&name);
                    warn!(endpoint = %name, failures = tripped.failures, %reason, "endpoint disabled: its messages wait until it is enabled again");
                }
            }
            Err(e) => warn!(endpoint = %name, error = %e, "could not disable the endpoint"),
        }
    }

    /// Sends one claimed row and decides what happens next. Never touches the database.
    pub async fn process(&self, row: OutboxRow) -> OutcomeRecord {
        match self.clear(row) {
            Clearance::Go(cleared) => self.send_cleared(cleared).await,
            Clearance::Held(held) => held,
        }
    }

    /// A webhook's destination host, for the logs: never its path, query or an address.
    fn host_of(&self, row: &OutboxRow) -> Option<String> {
        match row.channel {
            Channel::Webhook => self.inner.webhook.binding(&row.destination).map(|b| b.host),
            Channel::Email => None,
        }
    }

    /// The checks before a send, without waiting: a disabled endpoint, a paused destination, a
    /// destination's limits. `Held` is the outcome of a message put back without a request.
    /// Called in claim order for a batch, so that messages held for a rate keep their order.
    /// Without the claim's start (a caller with a row in hand): no offset, this process's clock.
    pub fn clear(&self, row: OutboxRow) -> Clearance {
        let at = row.updated_at;
        self.clear_claimed(row, at)
    }

    /// [`Sender::clear`] for a row whose claim began at `claimed` by this process's clock.
    fn clear_claimed(&self, row: OutboxRow, claimed: chrono::DateTime<chrono::Utc>) -> Clearance {
        let host = self.host_of(&row);
        let span = info_span!("send", event_id = %crate::telemetry::LogEventId(&row.event_id), attempt = row.attempts, host = host.as_deref());
        match span.in_scope(|| self.clear_inner(row, host, claimed)) {
            Ok(c) => Clearance::Go(Box::new(c)),
            Err(held) => Clearance::Held(*held),
        }
    }

    fn clear_inner(
        &self,
        row: OutboxRow,
        host: Option<String>,
        claimed: chrono::DateTime<chrono::Utc>,
    ) -> Result<Cleared, Box<OutcomeRecord>> {
        let now = self.inner.clock.now();
        let db_offset = row.updated_at - claimed;
        let request = crate::outbox::RequestBytes::of(row.channel, &row.payload);
        let fingerprint = request.as_ref().map(|r| {
            r.fingerprint(row.channel, &row.destination, &row.event_id)
                .as_str()
                .to_owned()
        });
        let body = request
            .filter(|_| row.channel == Channel::Webhook)
            .map(|r| bytes::Bytes::from(r.body));
        let mut base = OutcomeRecord {
            request_fingerprint: fingerprint,
            ..outcome_of(&row)
        };
        // The destination it is bound to; while that is slowed down, the message is put back
        // for after the pause's end without a request and without spending an attempt.
        let cfg = &self.inner.config.limits;
        let binding = match row.channel {
            Channel::Webhook => self.inner.webhook.binding(&row.destination),
            Channel::Email => None,
        };
        let endpoint = binding.as_ref().and_then(|b| b.endpoint);
        base.ordering = ordering_policy(&row, endpoint);
        let destination = match row.channel {
            Channel::Webhook => binding.as_ref().map(|b| b.key.clone()),
            Channel::Email => Some(SMTP_RELAY.to_owned()),
        };
        if let Some(e) = endpoint
            && self.is_disabled(&e.name)
        {
            // Once per message and period: the disabling itself was the operational event (WARN).
            debug!(endpoint = %e.name, "endpoint disabled: put back without a request");
            self.inner.metrics.held("endpoint_disabled");
            let until = now + chrono::TimeDelta::from_std(DISABLED_WAIT).unwrap_or_default();
            return Err(Box::new(put_back(
                base,
                &row,
                now,
                until,
                AttemptClass::NotSent,
            )));
        }
        if let Some(until) = self.paused(destination.as_deref(), row.id, now) {
            return Err(Box::new(put_back(
                base,
                &row,
                now,
                until,
                AttemptClass::RateLimited,
            )));
        }
        // Its limits: the named endpoint's own, and its host's (or the relay's).
        let endpoint_key = endpoint.map(|e| crate::domain::endpoint_destination(&e.name));
        let (host_key, host_limit) = match &binding {
            Some(b) => (
                b.key.clone(),
                cfg.with_default_cap(cfg.host_limit(&b.host, &b.key)),
            ),
            None => (SMTP_RELAY.to_owned(), cfg.with_default_cap(Some(cfg.smtp))),
        };
        let mut bound: Vec<(&str, Limit)> = Vec::with_capacity(2);
        if let (Some(k), Some(e)) = (&endpoint_key, endpoint)
            && !e.limit.is_none()
        {
            bound.push((k, e.limit));
        }
        if row.channel == Channel::Email || binding.is_some() {
            bound.push((&host_key, host_limit));
        }
        let permit = match self.inner.limits.admit(row.id, &bound, now) {
            Ok(p) => Some(p),
            Err(held) if held.why == limits::HeldBy::InFlight => None,
            Err(held) => {
                debug!(held_by = held.why.as_str(), until = %held.until, "destination limit: put back without a request");
                self.inner.metrics.held(held.why.as_str());
                return Err(Box::new(put_back(
                    base,
                    &row,
                    now,
                    held.until,
                    AttemptClass::RateLimited,
                )));
            }
        };
        let endpoint = endpoint.map(|e| e.name.clone());
        let bound = bound.into_iter().map(|(k, l)| (k.to_owned(), l)).collect();
        Ok(Cleared {
            row,
            base,
            destination,
            endpoint,
            permit,
            bound,
            body,
            host,
            db_offset,
        })
    }

    /// Until when `destination` (a pause key) is slowed down at `now`, if it is: the message is
    /// then put back without a request (logged, and counted as held). Checked at the clearance
    /// and again just before the request.
    fn paused(
        &self,
        destination: Option<&str>,
        message: i64,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        let until = destination.and_then(|d| self.inner.throttle.paused_until(d, message, now))?;
        // Once per message and pause: the pause itself was the operational event (WARN).
        debug!(%until, "destination slowed down: put back without a request");
        self.inner.metrics.held("paused");
        Some(until)
    }

    /// Sends a cleared row and decides what happens next. Never touches the database.
    ///
    /// Its future is what every send task holds, so it is kept small (a send task, this future
    /// and the spawn's captures, is 1,216 bytes in a release build, from 10,408): the cleared
    /// row stays in its box and is read in place rather than moved into the future, and the
    /// SMTP dialogue, seven times a webhook request's state, is boxed only when it runs. Each
    /// spawn allocates and copies a send task whole: at 10 KB, `memmove` alone was 11.5 % of
    /// Herald's CPU samples in `dispatch_pg` (5.8 % after).
    pub async fn send_cleared(&self, cleared: Box<Cleared>) -> OutcomeRecord {
        let span = info_span!("send", event_id = %crate::telemetry::LogEventId(&cleared.row.event_id), attempt = cleared.row.attempts, host = cleared.host.as_deref());
        self.send_inner(cleared).instrument(span).await
    }

    async fn send_inner(&self, mut cleared: Box<Cleared>) -> OutcomeRecord {
        let _permit = match cleared.permit.take() {
            Some(p) => p,
            None => {
                let bound: Vec<(&str, Limit)> = cleared
                    .bound
                    .iter()
                    .map(|(k, l)| (k.as_str(), *l))
                    .collect();
                let clock = self.inner.clock.clone();
                let admitted = self
                    .inner
                    .limits
                    .admit_within(cleared.row.id, &bound, || clock.now(), CAP_PATIENCE)
                    .await;
                match admitted {
                    Ok(p) => p,
                    Err(held) => {
                        let now = self.inner.clock.now();
                        self.inner.metrics.held(held.why.as_str());
                        debug!(held_by = held.why.as_str(), until = %held.until, "destination limit: put back without a request");
                        return put_back(
                            cleared.base,
                            &cleared.row,
                            now,
                            held.until,
                            AttemptClass::RateLimited,
                        );
                    }
                }
            }
        };
        let row = &cleared.row;
        // Claimed before its expires_at, a message may have waited since for a send slot (up to
        // most of its lease) or a place under its destination's cap: once that time has passed it
        // is not sent at all. It ends `expired`, as the claim would have left it: its attempt not
        // spent, no request, no attempt row. By the clock the claim went by (the database's on
        // PostgreSQL), not by this process's, which may be off.
        let now = self.inner.clock.now();
        if row
            .expires_at
            .is_some_and(|at| at <= now + cleared.db_offset)
        {
            info!("expired while waiting to be sent; no request made");
            return expired_unsent(cleared.base, row);
        }
        // A pause that began while it waited for its slot or its place — the 429 of the message
        // before it to the same destination, answered meanwhile — holds it as one that began
        // before its clearance would have: put back until the pause ends, no request, its
        // attempt not spent. (Cleared while that 429 was still on its way, it went 6 ms after
        // it: `binary::a_429_holds_the_destinations_other_messages_for_its_retry_after`.)
        if let Some(until) = self.paused(cleared.destination.as_deref(), row.id, now) {
            return put_back(cleared.base, row, now, until, AttemptClass::RateLimited);
        }
        if let Some(hook) = self.inner.before_send.get() {
            hook(&row.event_id);
        }
        let policy = self.policy_of(cleared.endpoint.as_deref());
        let endpoint = cleared
            .endpoint
            .as_deref()
            .and_then(|n| self.inner.webhook.endpoint(n));
        let outgoing = Outgoing {
            event_id: &row.event_id,
            destination: &row.destination,
            payload: &row.payload,
            semantics: row.semantics,
            body: cleared.body.as_ref(),
        };
        // Latency by the monotonic clock: the wall clock (and a test's) may jump.
        let sending = std::time::Instant::now();
        let report = match row.channel {
            // Stored JSON serde_json cannot read (see `storage::payload`): no request can be
            // made of it; dead-lettered on its own, naming why.
            _ if let Some(why) = crate::storage::payload::unreadable(&row.payload) => {
                crate::channels::SendReport::refused(
                    AttemptClass::Permanent,
                    "invalid_payload",
                    now,
                    format!("the stored payload cannot be read: {why}"),
                )
            }
            Channel::Webhook => self.inner.webhook.send(&outgoing).await,
            // Boxed: the SMTP dialogue's state (5,536 bytes) would make every send task, a
            // webhook's included, that much larger (see `send_cleared`).
            Channel::Email => {
                // Asked again once an SMTP connection is had: the relay may have paused while
                // this message waited for one.
                let destination = cleared.destination.as_deref();
                let still_clear = || {
                    self.paused(destination, row.id, self.inner.clock.now())
                        .is_none()
                };
                Box::pin(self.inner.email.send_while(&outgoing, &still_clear)).await
            }
        };
        let took = sending.elapsed();
        if report.error_kind.as_deref() == Some(crate::channels::email::kind::HELD) {
            // Paused while it waited for an SMTP connection (`paused` counted it): until the
            // pause ends, as one held at its clearance.
            let at = self.inner.clock.now();
            let until = cleared
                .destination
                .as_deref()
                .and_then(|d| self.inner.throttle.paused_until(d, row.id, at))
                .unwrap_or(at);
            // From `at`: the wait for a slot is behind it (PostgreSQL adds `until - at` to its
            // own clock).
            return put_back(cleared.base, row, at, until, AttemptClass::RateLimited);
        }
        if report.error_kind.as_deref() == Some(crate::channels::email::kind::POOL_TIMEOUT) {
            // Every SMTP connection stayed busy for the whole attempt: this message was never
            // tried, so no attempt is spent on it (more sends in flight than the pool's size
            // must not dead-letter mail that never left).
            info!("no SMTP connection free in time: put back without an attempt");
            self.inner.metrics.held("smtp_pool");
            // The base delay from the end of the wait, not from before it: counted from `now`,
            // after half the SMTP timeout spent waiting it had mostly passed, and the message
            // was claimed again at once (on SQLite, whose clock this is).
            let until = report.finished_at.max(now)
                + chrono::TimeDelta::from_std(policy.base).unwrap_or_default();
            return put_back(cleared.base, row, now, until, AttemptClass::NotSent);
        }
        self.inner.metrics.attempt(row.channel, report.class, took);
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
        let decided_at = report.finished_at.max(now);
        let mut decision = within_expiry(decide(facts, policy, decided_at, unit), row.expires_at);
        let about_the_receiver = !report.says_nothing_of_the_receiver();
        let mut due_now = Vec::new();
        if let Some(e) = endpoint.filter(|_| about_the_receiver) {
            self.count_toward_disable(e, report.class, report.finished_at)
                .await;
        }
        if let Some(d) = cleared.destination.as_ref().filter(|_| about_the_receiver) {
            let answer = Answer {
                class: report.class,
                status: report.status,
                // What it asked for, as the policy clamps it (no jitter: the pause is the
                // destination's, the spread comes when messages are put back).
                asked: report
                    .retry_after
                    .map(|asked| policy.after_retry_after(asked, 0.0).delay),
                is_smtp: row.channel == Channel::Email,
                error_kind: report.error_kind.as_deref(),
                message: row.id,
                reused: report.reused_connection,
            };
            let observed = self.inner.throttle.observe(d, &answer, report.finished_at);
            if let Some(until) = observed.paused_until {
                // The pause key: a webhook's scheme, host and port (no path, no query), or `smtp`.
                warn!(%until, destination = d.as_str(), class = report.class.as_str(), status = report.status, error_kind = report.error_kind.as_deref(), "destination slowed down");
                decision = within_expiry(
                    not_before_pause(decision, until, decided_at),
                    row.expires_at,
                );
            }
            if !observed.back.is_empty() {
                info!(
                    destination = d.as_str(),
                    messages = observed.back.len(),
                    "destination back: the messages its outage cost an attempt are due now"
                );
                due_now = observed.back;
            }
        }
        info!(
            class = report.class.as_str(),
            status = report.status,
            next_state = decision.state.as_str(),
            delay_ms = decision.delay.map(|d| d.as_millis() as u64),
            "attempt classified"
        );
        // No receiver accepted a mail written to a file (the decision's words say one did).
        let written_to_file =
            report.error_kind.as_deref() == Some(crate::channels::email::WRITTEN_TO_FILE);
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
                delay_reason: Some(if written_to_file {
                    crate::channels::email::WRITTEN_TO_FILE_WORDS.to_owned()
                } else {
                    decision.reason
                }),
                policy_version: policy.version.clone(),
                response_excerpt: report.excerpt,
            }),
            due_now,
            ..cleared.base
        }
    }

    /// Writes outcomes in one transaction.
    pub async fn record(&self, outcomes: Vec<OutcomeRecord>) -> Result<Vec<Applied>, SenderError> {
        let owner = self.inner.config.owner.clone();
        let now = self.inner.clock.storage_now();
        let ((applied, busy), outcomes) = self
            .blocking(move |db| {
                db.record_outcomes(&owner, now, &outcomes)
                    .map(|a| (a, outcomes))
            })
            .await?;
        if !busy.is_empty() {
            debug!(
                messages = busy.len(),
                "ordering keys busy with an insert: released again once it commits"
            );
            lock_recheck(&self.inner.recheck).add(busy, std::time::Instant::now());
        }
        // Written back as retryable and due within DUE_HORIZON: the idle loop wakes at each
        // (every one of the batch: a rate's held messages come due one slot after another). Its
        // delay from now, after the commit, is never before the time stored: PostgreSQL adds the
        // delay (rounded up to the millisecond) to its clock in the outcome's transaction, which
        // began before now; SQLite stores the time it was decided at plus the delay.
        let instant_now = std::time::Instant::now();
        let mut sooner = false;
        for (o, _) in outcomes
            .iter()
            .zip(&applied)
            .filter(|(o, a)| o.state == State::Retryable && !matches!(a, Applied::LeaseLost))
        {
            let Some(ms) = o.retry_delay_ms.and_then(|ms| u64::try_from(ms).ok()) else {
                continue;
            };
            // Any due time within the horizon, not only within a poll interval: the poll finds a
            // row up to a whole interval late (a rate's slots, 0.5 s apart, went in pairs at
            // each 1 s poll).
            let wait = Duration::from_millis(ms);
            if wait < DUE_HORIZON {
                sooner |= note_due(&self.inner.next_due, instant_now + wait);
            }
        }
        // Messages a destination back from an outage made due now: claim them.
        if sooner || outcomes.iter().any(|o| !o.due_now.is_empty()) {
            self.inner.wake.notify_one();
        }
        // A keyed message that ended made its key's next message due: claim again now (the
        // release is an UPDATE, which no insert notification announces).
        if outcomes.iter().any(|o| {
            o.ordering.is_some()
                && matches!(
                    o.state,
                    State::Delivered | State::DeadLetter | State::Unconfirmed | State::Expired
                )
        }) {
            self.inner.wake.notify_one();
        }
        for (a, o) in applied.iter().zip(&outcomes) {
            self.count_outcome(*a, o);
            match a {
                // A message put back without a request has no attempt to record (a walk-through
                // counted 150 such lines against 51 lease_lost rows).
                Applied::LeaseLost if o.attempt.is_some() => {
                    warn!(event_id = %crate::telemetry::LogEventId(&o.event_id), "lease lost before the outcome was written; attempt recorded as lease_lost")
                }
                Applied::LeaseLost => {
                    info!(event_id = %crate::telemetry::LogEventId(&o.event_id), "lease lost before a message put back without a request was written back; another claim has it")
                }
                Applied::Settled => {
                    info!(event_id = %crate::telemetry::LogEventId(&o.event_id), "a late 2xx settled a message the watchdog had left unconfirmed")
                }
                Applied::Yes => {}
            }
        }
        Ok(applied)
    }

    /// Counts what a committed outcome did: a dead letter, or a retry after an attempt (a message
    /// put back without a request is neither).
    fn count_outcome(&self, applied: Applied, o: &OutcomeRecord) {
        if applied != Applied::Yes {
            return;
        }
        match (o.state, &o.attempt) {
            (State::DeadLetter, _) => {
                let class = o.error_class.unwrap_or(AttemptClass::Permanent);
                self.inner
                    .metrics
                    .dead_letters(DeadLetterReason::Class(class), 1);
            }
            (State::Retryable, Some(attempt)) => {
                let delay = o.retry_delay_ms.unwrap_or(0).max(0) as u64;
                self.inner
                    .metrics
                    .retry_delay(attempt.class, Duration::from_millis(delay));
            }
            _ => {}
        }
    }

    /// One claim, every send concurrently (bounded), one write: returns how many rows it handled.
    pub async fn run_once(&self) -> Result<usize, SenderError> {
        // No more than can be in flight at once: a claimed row waiting for a slot would burn
        // its lease.
        let cfg = &self.inner.config;
        let claimed = self.inner.clock.now();
        let rows = self.claim(cfg.batch_size.min(cfg.concurrency)).await?;
        let n = rows.len();
        if n == 0 {
            return Ok(0);
        }
        let limit = Arc::new(Semaphore::new(self.inner.config.concurrency as usize));
        let mut tasks = tokio::task::JoinSet::new();
        let mut outcomes = Vec::with_capacity(n);
        for row in rows {
            let cleared = match self.clear_claimed(row, claimed) {
                Clearance::Go(c) => c,
                Clearance::Held(held) => {
                    outcomes.push(held);
                    continue;
                }
            };
            let this = self.clone();
            let limit = limit.clone();
            tasks.spawn(async move {
                let _permit = limit.acquire_owned().await;
                this.send_cleared(cleared).await
            });
        }
        while let Some(done) = tasks.join_next().await {
            outcomes.push(done?);
        }
        self.record(outcomes).await?;
        Ok(n)
    }

    /// Runs [`Sender::run_once`] until nothing is due; returns the total handled (tests).
    /// Each round first releases the keys whose insert has ended ([`Sender::release_rechecked`]);
    /// a key still busy with an open insert is left for a later call.
    pub async fn run_until_idle(&self) -> Result<usize, SenderError> {
        let mut total = 0;
        loop {
            self.release_rechecked().await?;
            let n = self.run_once().await?;
            if n == 0 {
                return Ok(total);
            }
            total += n;
        }
    }

    /// The retry policy of a named endpoint's messages (`[endpoints.NAME.retry]`), else the
    /// global one.
    fn policy_of(&self, endpoint: Option<&str>) -> &RetryPolicy {
        endpoint
            .and_then(|n| self.inner.config.endpoint_policies.get(n))
            .unwrap_or(&self.inner.config.policy)
    }

    /// Releases the keys that were busy with an insert when their head's outcome was written,
    /// where the insert has ended (see `Db::release_rechecked`); keeps the others for later.
    pub async fn release_rechecked(&self) -> Result<usize, SenderError> {
        let mut ids = std::mem::take(&mut lock_recheck(&self.inner.recheck).ids);
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return Ok(0);
        }
        let kept = ids.clone();
        let (n, busy) = match self.blocking(move |db| db.release_rechecked(&ids)).await {
            Ok(r) => r,
            Err(e) => {
                lock_recheck(&self.inner.recheck).put_back(kept);
                return Err(e);
            }
        };
        lock_recheck(&self.inner.recheck).put_back(busy);
        if n > 0 {
            debug!(
                released = n,
                "heads of ordering keys made due after an insert ended"
            );
            self.inner.wake.notify_one();
        }
        Ok(n)
    }

    /// How long the idle loop may sleep before looking at the keys to release again; `None`:
    /// there are none.
    fn recheck_wait(&self) -> Option<Duration> {
        lock_recheck(&self.inner.recheck).wait(std::time::Instant::now())
    }

    /// Makes due the head of every key that waits with nothing left to release it (see
    /// `storage::ordering`); returns how many. The production loop runs it every poll interval.
    pub async fn release_waiting(&self) -> Result<usize, SenderError> {
        let n = self.blocking(|db| db.release_waiting()).await?;
        if n > 0 {
            debug!(released = n, "waiting heads of ordering keys made due");
            self.inner.wake.notify_one();
        }
        Ok(n)
    }

    /// The watchdog pass: expired leases back to `retryable` (or `unconfirmed`/`dead_letter`).
    pub async fn sweep_leases(&self) -> Result<LeaseSweep, SenderError> {
        let now = self.inner.clock.storage_now();
        // Each row's endpoint, for its retry and head-of-line policies.
        let endpoints: std::collections::BTreeMap<
            String,
            (RetryPolicy, Option<crate::domain::OrderingPolicy>),
        > = self
            .inner
            .webhook
            .endpoints()
            .map(|e| {
                (
                    crate::domain::endpoint_destination(&e.name),
                    (self.policy_of(Some(&e.name)).clone(), e.ordering_policy),
                )
            })
            .collect();
        let global = self.inner.config.policy.clone();
        // This process's own sends whose outcome is still waiting to be written: their requests
        // were made and answered; returning the rows would make them count again.
        let unwritten = lock_unwritten(&self.inner.unwritten).clone();
        let sweep = self
            .blocking(move |db| {
                db.sweep_expired_leases(now, &|row, at| {
                    if unwritten.contains(&(row.id, row.attempts)) {
                        return None;
                    }
                    let (policy, endpoint_ordering) = endpoints
                        .get(&row.destination)
                        .map_or((&global, None), |(p, o)| (p, *o));
                    let mut d = lease_expired_decision(policy, row, at);
                    d.ordering = crate::domain::OrderingPolicy::effective(
                        row.ordering_key.is_some(),
                        row.ordering_policy,
                        endpoint_ordering,
                    );
                    Some(d)
                })
            })
            .await?;
        let m = &self.inner.metrics;
        m.lease_expiries(State::Retryable, sweep.to_retryable as u64);
        m.lease_expiries(State::Unconfirmed, sweep.to_unconfirmed as u64);
        m.lease_expiries(State::DeadLetter, sweep.to_dead_letter as u64);
        m.lease_expiries(State::Expired, sweep.to_expired as u64);
        m.dead_letters(
            DeadLetterReason::Class(AttemptClass::Exhausted),
            sweep.to_dead_letter as u64,
        );
        if sweep.total() > 0 {
            self.inner.wake.notify_one();
            warn!(
                to_retryable = sweep.to_retryable,
                to_unconfirmed = sweep.to_unconfirmed,
                to_dead_letter = sweep.to_dead_letter,
                "expired leases returned"
            );
        }
        Ok(sweep)
    }

    /// The production loop: a claim loop ([`Sender::claim_loop`]) keeps up to a batch of
    /// claimed rows ready, and this loop sends each, in claim order, as soon as a send slot is
    /// free; outcomes are flushed in batches. The next claim runs while the rows before it are
    /// still being sent, so sends do not wait for a claim's round trips and commit (measured:
    /// with one claim at a time for the free slots, `dispatch_pg`'s sends waited for claims of
    /// 33 rows every 4 ms — README, "Performance"). Stops claiming when `shutdown` turns true,
    /// puts the claimed rows that did not get a slot back without a request, lets in-flight sends
    /// finish (each is bounded by its timeout), flushes, and returns.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let cfg = &self.inner.config;
        let slots = Arc::new(Semaphore::new(cfg.concurrency as usize));
        // Room for the outcomes of several full batches: while one write is in progress (on
        // SQLite, or waiting for the one writer behind a claim), the sends that end queue their
        // outcomes for the next (see `flush_loop`'s MAX_BATCH).
        let (tx, rx) = mpsc::channel::<OutcomeRecord>(cfg.concurrency as usize * 8);
        let stopping_since = StoppingSince::default();
        let flusher = tokio::spawn(self.clone().flush_loop(
            rx,
            shutdown.clone(),
            stopping_since.clone(),
        ));
        // The shutdown's clock starts at the signal, even while the loop is inside a claim that
        // waits for an unavailable database.
        let signalled = {
            let (since, mut shutdown) = (stopping_since, shutdown.clone());
            tokio::spawn(async move {
                if shutdown.wait_for(|&stop| stop).await.is_ok() {
                    since.get_or_init(tokio::time::Instant::now);
                }
            })
        };
        let room = Arc::new(Semaphore::new(ready_room(cfg) as usize));
        let (ready_tx, mut ready) = mpsc::unbounded_channel::<Claimed>();
        let mut claimer = AbortOnDrop(tokio::spawn(self.clone().claim_loop(
            room,
            ready_tx,
            shutdown.clone(),
        )));
        info!(owner = %cfg.owner, "sender started");
        loop {
            // The signal first: once it has come, no new send starts.
            let claimed = tokio::select! {
                biased;
                _ = shutdown.wait_for(|&stop| stop) => None,
                c = ready.recv() => c,
            };
            let Some(Claimed { row, place, at }) = claimed else {
                break;
            };
            // In claim order, before the send (see `clear`): a message held back (a paused
            // destination, a rate, a disabled endpoint) goes back at once, without a slot.
            let cleared = match self.clear_claimed(row, at) {
                Clearance::Go(c) => c,
                Clearance::Held(held) => {
                    let _ = tx.send(held).await;
                    continue;
                }
            };
            let permit = tokio::select! {
                biased;
                _ = shutdown.wait_for(|&stop| stop) => None,
                p = slots.clone().acquire_owned() => p.ok(),
            };
            drop(place);
            let Some(permit) = permit else {
                self.put_back_unsent(&cleared.row, &tx, "shutdown").await;
                break;
            };
            // The lease must outlast the send: a row that waited too long for its slot (every
            // slot held by slow sends) goes back, due at once, rather than be sent so late that
            // its lease could run out mid-send (a send may also wait CAP_PATIENCE for a place
            // under its destination's cap).
            let waited = (self.inner.clock.now() - at).to_std().unwrap_or_default();
            if waited + cfg.longest_send + CAP_PATIENCE >= cfg.lease {
                self.put_back_unsent(&cleared.row, &tx, "lease").await;
                continue;
            }
            let this = self.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let claim = (cleared.row.id, cleared.row.attempts);
                let sent = std::panic::AssertUnwindSafe(this.send_cleared(cleared))
                    .catch_unwind()
                    .await;
                match sent {
                    // The flusher outlives every sender task: it stops when all senders drop tx.
                    Ok(outcome) => {
                        let _ = tx.send(outcome).await;
                    }
                    Err(_) => {
                        // No outcome will come: the row is left to the lease watchdog — this
                        // process's included — as after a crash (the request may have left: an
                        // ambiguous attempt once the lease runs out), not held `sending` for good.
                        tracing::error!(
                            message_id = claim.0,
                            "a send panicked; its row is left to the lease watchdog"
                        );
                        lock_unwritten(&this.inner.unwritten).remove(&claim);
                    }
                }
                drop(permit);
            });
        }
        let stopping = *shutdown.borrow();
        if stopping {
            info!("sender stopping: waiting for in-flight sends");
        } else {
            // Only a panic ends the claim loop before the signal. The heartbeat is left to go
            // stale, so `/readyz` reports the sender stalled.
            tracing::error!(
                "the claim loop ended: this process claims nothing more until it is restarted"
            );
        }
        // The claim loop stops at the signal too; what it claimed and nobody sent goes back.
        while let Some(claimed) = ready.recv().await {
            self.put_back_unsent(&claimed.row, &tx, "shutdown").await;
        }
        if let Err(e) = (&mut claimer.0).await {
            warn!(error = %e, "claim loop ended abnormally");
        }
        let _all = slots.acquire_many(cfg.concurrency).await;
        drop(tx);
        if let Err(e) = flusher.await {
            warn!(error = %e, "outcome flusher ended abnormally");
        }
        signalled.abort();
        if stopping {
            self.inner.heartbeat.stop();
        }
        info!("sender stopped");
    }

    /// A claimed row that is not sent (Herald is stopping, or it waited too long for a send
    /// slot): written back as due now, without a request and without spending its attempt; the
    /// claim loop is woken once it is written.
    async fn put_back_unsent(
        &self,
        row: &OutboxRow,
        tx: &mpsc::Sender<OutcomeRecord>,
        why: &'static str,
    ) {
        let now = self.inner.clock.now();
        debug!(event_id = %crate::telemetry::LogEventId(&row.event_id), why, "claimed and not sent: put back");
        self.inner.metrics.held(why);
        let back = put_back(outcome_of(row), row, now, now, AttemptClass::NotSent);
        let _ = tx.send(back).await;
    }

    /// Claims rows into `ready` whenever there is `room` for them, until `shutdown`; between
    /// claims, the periodic passes (the lease watchdog, the release of waiting ordering keys).
    /// Waits for a wake-up or the poll interval when a claim found fewer rows than it asked for.
    async fn claim_loop(
        self,
        room: Arc<Semaphore>,
        ready: mpsc::UnboundedSender<Claimed>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let cfg = &self.inner.config;
        let capacity = ready_room(cfg);
        let sweep_every = (cfg.lease / 2).max(Duration::from_secs(1));
        let mut next_sweep = tokio::time::Instant::now();
        let mut next_release = tokio::time::Instant::now();
        let mut failures = 0u32;
        let heartbeat = &self.inner.heartbeat;
        heartbeat.beat(self.inner.clock.now());
        // Staying awake (PostgreSQL, listening), and the last promise made.
        let mut phase = cfg.keep_awake.then(awake::Phase::default);
        let mut promise = None;
        loop {
            if *shutdown.borrow() {
                break;
            }
            // Read before the claim: an iteration whose claim hung never looks fresh.
            let began = self.inner.clock.now();
            if tokio::time::Instant::now() >= next_sweep {
                if let Err(e) = self.sweep_leases().await {
                    warn!(error = %e, "lease watchdog failed; will retry");
                }
                next_sweep = tokio::time::Instant::now() + sweep_every;
            }
            if tokio::time::Instant::now() >= next_release {
                if let Err(e) = self.release_waiting().await {
                    warn!(error = %e, "releasing waiting ordering keys failed; will retry");
                }
                next_release = tokio::time::Instant::now() + cfg.poll_interval;
            }
            if self.recheck_wait().is_some()
                && let Err(e) = self.release_rechecked().await
            {
                warn!(error = %e, "releasing ordering keys after an insert failed; will retry");
            }
            // While the rows claimed before still wait for their slots, let some go so the next
            // claim is a batch rather than a trickle of one-row transactions (waits at most
            // CLAIM_LINGER).
            let want = capacity.div_ceil(2);
            if (room.available_permits() as u32) < want {
                tokio::select! {
                    p = tokio::time::timeout(CLAIM_LINGER, room.acquire_many(want)) => drop(p),
                    _ = shutdown.changed() => {}
                }
            }
            let free = room.available_permits() as u32;
            if free == 0 {
                // No claim until a send ends: an awake sender that stays full for
                // `awake::FULL_FOR` cannot keep its promise, and withdraws it (inserts wake the
                // other senders again), then settles once it has room.
                let waited = tokio::select! {
                    p = tokio::time::timeout(awake::FULL_FOR, room.clone().acquire_owned()) => p.is_ok(),
                    _ = shutdown.changed() => true,
                };
                if !waited && let Some(p) = phase {
                    let next = p.when_full();
                    if next != p {
                        self.settle_awake(promise).await;
                        phase = Some(next);
                    }
                }
                continue;
            }
            // The periodic passes above may have waited for an unavailable database meanwhile.
            if *shutdown.borrow() {
                break;
            }
            // The places of the rows about to be claimed; those the claim does not fill go back
            // when `places` is dropped. Only this loop takes room, so they are there.
            let Ok(mut places) = room.clone().try_acquire_many_owned(free) else {
                continue;
            };
            let settled = match phase {
                Some(p) if p.settles_first() => self.settle_awake(promise).await,
                _ => false,
            };
            let at = self.inner.clock.now();
            let claimed_at = std::time::Instant::now();
            let rows = match self.claim(free).await {
                Ok(rows) => {
                    failures = 0;
                    heartbeat.beat(began);
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
            let full = rows.len() as u32 == free;
            let next =
                phase.map(|p| p.after_claim(std::time::Instant::now(), !rows.is_empty(), settled));
            // Held from now until their outcome is written: this process's watchdog must not
            // return a row that waits here for its slot, even past its lease (an outage that
            // stalls the flusher stalls the sends too); the send loop puts such a row back.
            lock_unwritten(&self.inner.unwritten).extend(rows.iter().map(|r| (r.id, r.attempts)));
            for row in rows {
                let Some(place) = places.split(1) else { break };
                if ready.send(Claimed { row, place, at }).is_err() {
                    // The send loop is gone (dropped): nobody sends or puts back any more.
                    return;
                }
            }
            drop(places);
            // After the rows went to their sends: a promise is one more round trip.
            if let Some(next) = next {
                if let Some(before) = phase {
                    self.inner
                        .metrics
                        .sender_awake(before.has_promised(), next.phase.has_promised());
                }
                phase = Some(next.phase);
                if next.promise {
                    promise = self.promise_awake().await.or(promise);
                }
            }
            if !full {
                let idle = self
                    .recheck_wait()
                    .map_or(cfg.poll_interval, |w| cfg.poll_interval.min(w));
                let idle = due_wait(&self.inner.next_due, claimed_at).map_or(idle, |w| w.min(idle));
                let idle = match next.map(|n| n.wait) {
                    Some(awake::Wait::For(d)) => d.min(idle),
                    Some(awake::Wait::Asleep) | None => idle,
                };
                if !idle.is_zero() {
                    tokio::select! {
                        _ = self.inner.wake.notified() => debug!("woken"),
                        _ = tokio::time::sleep(idle) => {}
                        _ = shutdown.changed() => {}
                    }
                }
            }
        }
        // Stopping: the promise is withdrawn, and once every transaction that may have skipped
        // its wake-up has ended, the other senders are woken for their rows (for at most a
        // promise's length: a database that does not answer is not waited for longer).
        if phase.is_some_and(awake::Phase::has_promised) {
            info!(
                "stopping while awake: waking the other senders once no insert that skipped its \
                 wake-up is open"
            );
            let hand_over = async {
                while !self.settle_awake(promise).await {
                    tokio::time::sleep(awake::CADENCE).await;
                }
                if let Err(e) = self.blocking(|db| db.wake_senders()).await {
                    debug!(error = %e, "waking the other senders failed");
                }
            };
            if tokio::time::timeout(awake::PROMISE, hand_over)
                .await
                .is_err()
            {
                warn!(
                    "stopping while awake: the rows of transactions still open when it stopped \
                     wait for another Herald's poll"
                );
            }
        }
    }

    async fn flush_loop(
        self,
        mut rx: mpsc::Receiver<OutcomeRecord>,
        shutdown: watch::Receiver<bool>,
        stopping_since: StoppingSince,
    ) {
        // A flusher that fell behind catches up in one write of all it holds, up to this many:
        // one commit instead of several. With 256 (and room for twice the concurrency in the
        // channel), `herald-bench email_smtp` ended with three writes of up to 256 outcomes
        // after the last mail; with these two, 3 % more mails/s on the means of thirty pairs
        // (README, "Performance").
        const MAX_BATCH: usize = 1024;
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
            let written = self
                .write_outcomes(&batch, batch.len() == 1, &shutdown, &stopping_since)
                .await;
            if written == Err(NotWritten::Refused) {
                self.write_one_by_one(&batch, &shutdown, &stopping_since)
                    .await;
            }
            // Written, or given up on (then the watchdog may return the rows).
            {
                let mut unwritten = lock_unwritten(&self.inner.unwritten);
                for o in &batch {
                    unwritten.remove(&(o.message_id, o.claimed_attempt));
                }
            }
            // A row put back due at once (claimed and not sent) is claimable now.
            if batch.iter().any(|o| o.retry_delay_ms == Some(0)) {
                self.inner.wake.notify_one();
            }
        }
    }
}

impl Sender {
    /// A batch the database refused, written again one outcome at a time: one row it cannot
    /// take (a value it cannot store) must not cost the others their outcomes — given up on,
    /// their leases would expire and each of their sends count again. Nothing of the refused
    /// write committed (one transaction). Those refused again are tried again in rounds, all of
    /// them each round, with the usual pauses between rounds and [`OUTCOME_TRIES`] rounds in
    /// all (about 19 s, however many they are), then given up on: their leases expire and the
    /// watchdog returns their rows.
    async fn write_one_by_one(
        &self,
        batch: &[OutcomeRecord],
        shutdown: &watch::Receiver<bool>,
        stopping_since: &StoppingSince,
    ) {
        warn!(
            rows = batch.len(),
            "the database refused a batch of outcomes; writing them one at a time"
        );
        let mut refused: Vec<&OutcomeRecord> = batch.iter().collect();
        for round in 1..=OUTCOME_TRIES {
            let mut again = Vec::new();
            for o in refused {
                let one = std::slice::from_ref(o);
                if self
                    .write_outcomes(one, false, shutdown, stopping_since)
                    .await
                    == Err(NotWritten::Refused)
                {
                    again.push(o);
                }
            }
            refused = again;
            let stopping = (*shutdown.borrow()).then(|| {
                stopping_since
                    .get_or_init(tokio::time::Instant::now)
                    .elapsed()
            });
            if refused.is_empty()
                || round == OUTCOME_TRIES
                || stopping.is_some_and(|since| since >= self.inner.config.shutdown_timeout)
            {
                break;
            }
            tokio::time::sleep(outcome_retry_pause(round)).await;
        }
        for o in refused {
            warn!(event_id = %crate::telemetry::LogEventId(&o.event_id), "giving up on writing this outcome; its lease will expire and its send count again");
        }
    }

    /// Writes `batch` in one transaction, trying again after each failure. A database that is
    /// only unavailable is waited for as long as [`give_up_writing_outcomes`] says; any other
    /// error gives up after [`OUTCOME_TRIES`] when `patient`, else at once
    /// ([`NotWritten::Refused`]: the caller writes the batch one outcome at a time).
    async fn write_outcomes(
        &self,
        batch: &[OutcomeRecord],
        patient: bool,
        shutdown: &watch::Receiver<bool>,
        stopping_since: &StoppingSince,
    ) -> Result<(), NotWritten> {
        let mut tries = 0u32;
        loop {
            let e = match self.record(batch.to_vec()).await {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            tries += 1;
            let stop = (*shutdown.borrow()).then(|| Stopping {
                since: stopping_since
                    .get_or_init(tokio::time::Instant::now)
                    .elapsed(),
                timeout: self.inner.config.shutdown_timeout,
            });
            if !patient && !is_unavailable(&e) {
                warn!(error = %e, rows = batch.len(), "the database refused outcomes");
                return Err(NotWritten::Refused);
            }
            if give_up_writing_outcomes(&e, tries, stop) {
                warn!(error = %e, rows = batch.len(), tries, stopping = stop.is_some(), "giving up on writing outcomes; leases will expire and those sends count again");
                return Err(NotWritten::GaveUp);
            }
            if tries == 1 || tries.is_multiple_of(10) {
                warn!(error = %e, rows = batch.len(), tries, "writing outcomes failed; retrying");
            }
            tokio::time::sleep(outcome_retry_pause(tries)).await;
        }
    }
}

fn lock_unwritten(
    m: &std::sync::Mutex<std::collections::HashSet<(i64, i32)>>,
) -> std::sync::MutexGuard<'_, std::collections::HashSet<(i64, i32)>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How many failed tries of an outcome write are given up after, when giving up is allowed (see
/// [`give_up_writing_outcomes`]): about 19 s of pauses.
const OUTCOME_TRIES: u32 = 20;

/// Whether the flusher gives up on a batch of outcomes after `tries` failed writes. Outcomes not
/// written are not lost work — their leases expire and the watchdog returns the rows — but each
/// of those sends then counts again: a delivered webhook is sent a second time, an at-most-once
/// one becomes `unconfirmed`. So a database that is only unavailable (down, restarting, failing
/// over, out of connections) is waited for as long as it takes, and only another error gives up
/// after [`OUTCOME_TRIES`]. Leases are no reason to stop: the outcome update
/// is fenced on the lease's owner and attempt, not its time, so it still lands where no watchdog
/// has returned the row meanwhile — this process's own watchdog leaves the rows of the outcomes
/// the flusher holds ([`Inner::unwritten`]) — and is recorded as `lease_lost` where another
/// process's watchdog has. A shutdown is bounded: an unavailable database is waited for until
/// the shutdown timeout has passed since the signal, and then the next failed try gives up,
/// whatever the error (a process manager would kill a process that takes longer anyway, and the
/// outcomes would be as lost).
fn give_up_writing_outcomes(e: &SenderError, tries: u32, stopping: Option<Stopping>) -> bool {
    let unavailable = is_unavailable(e);
    let out_of_tries = tries >= OUTCOME_TRIES && !unavailable;
    match stopping {
        Some(s) => out_of_tries || s.since >= s.timeout,
        None => out_of_tries,
    }
}

/// Why [`Sender::write_outcomes`] left a batch unwritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NotWritten {
    /// The database refused the batch (not merely unavailable), which was not to be retried as
    /// it is: one of its rows may be what the database cannot take.
    Refused,
    /// Given up on ([`give_up_writing_outcomes`]).
    GaveUp,
}

/// The database is down, restarting, failing over or out of connections: waited for.
fn is_unavailable(e: &SenderError) -> bool {
    matches!(e, SenderError::Storage(s) if s.is_unavailable())
}

/// A shutdown in progress, as the outcome flusher sees it.
#[derive(Debug, Clone, Copy)]
struct Stopping {
    /// Since the signal.
    since: Duration,
    /// [`SenderConfig::shutdown_timeout`].
    timeout: Duration,
}

/// The pause after the `tries`-th failed outcome write: 100 ms more each time, at most 2 s.
fn outcome_retry_pause(tries: u32) -> Duration {
    Duration::from_millis(100 * u64::from(tries.clamp(1, 20)))
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
    let d = within_expiry(
        decide(facts, policy, at, rand::rng().random()),
        row.expires_at,
    );
    LeaseDecision {
        state: d.state,
        error_class: d.error_class,
        delay_ms: d.delay.map(|d| d.as_millis() as i64),
        reason: d.reason,
        policy_version: policy.version.clone(),
        ordering: None,
    }
}

/// A keyed message's head-of-line policy: its own, else its endpoint's, else `block`; `None` for
/// an unkeyed message.
pub fn ordering_policy(
    row: &OutboxRow,
    endpoint: Option<&crate::channels::webhook::Endpoint>,
) -> Option<crate::domain::OrderingPolicy> {
    crate::domain::OrderingPolicy::effective(
        row.ordering_key.is_some(),
        row.ordering_policy,
        endpoint.and_then(|e| e.ordering_policy),
    )
}

/// A claimed message that ends `expired` without a request: its claim's attempt not spent, no
/// attempt row, the class it had kept.
fn expired_unsent(base: OutcomeRecord, row: &OutboxRow) -> OutcomeRecord {
    OutcomeRecord {
        state: State::Expired,
        attempts_after: row.attempts - 1,
        next_attempt_at: None,
        retry_delay_ms: None,
        error_class: row.last_error_class,
        ..base
    }
}

/// A claimed message put back without a request: `retryable` until `until`, the claim's attempt
/// not spent, no attempt row; `expired` when `until` is after its `expires_at`.
fn put_back(
    base: OutcomeRecord,
    row: &OutboxRow,
    now: chrono::DateTime<chrono::Utc>,
    until: chrono::DateTime<chrono::Utc>,
    class: AttemptClass,
) -> OutcomeRecord {
    let claimed_attempts = row.attempts;
    // Held until after its expires_at, it could never be sent: it ends `expired` now, as after
    // an answer whose retry would come too late (its attempt not spent, the class it had kept).
    // It read `retryable` until the hold's end.
    if too_late(until, row.expires_at) {
        return expired_unsent(base, row);
    }
    // No spread: the held messages come back at the instant they are held until (the pause's
    // end, their reserved slot) and are claimed in their order; the destination's limits shape
    // what follows. SQLite stores the instant itself; PostgreSQL adds the wait, rounded up to
    // the millisecond, to its own clock.
    let until = until.max(now);
    let wait_us = (until - now).num_microseconds().unwrap_or(i64::MAX);
    OutcomeRecord {
        state: State::Retryable,
        attempts_after: claimed_attempts - 1,
        next_attempt_at: Some(until),
        retry_delay_ms: Some(wait_us.saturating_add(999) / 1000),
        error_class: Some(class),
        ..base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_loop_wakes_for_every_noted_due_time_in_turn() {
        let notes = DueNotes::default();
        let t0 = std::time::Instant::now();
        let s = Duration::from_secs;
        assert_eq!(due_wait(&notes, t0), None);
        // Each note sooner than every other says so: the idle loop is woken to sleep less.
        for (at, soonest) in [(t0 + s(30), true), (t0 + s(10), true), (t0 + s(20), false)] {
            assert_eq!(note_due(&notes, at), soonest);
        }
        // The soonest first; each claim after a due time forgets it, the later ones stay.
        assert!(due_wait(&notes, t0).is_some_and(|w| w <= s(10) && w > s(9)));
        assert!(due_wait(&notes, t0 + s(10)).is_some_and(|w| w <= s(20) && w > s(19)));
        assert!(due_wait(&notes, t0 + s(25)).is_some_and(|w| w <= s(30) && w > s(29)));
        assert_eq!(due_wait(&notes, t0 + s(30)), None);
        // Bounded: beyond DUE_NOTES, the latest go (the poll finds their rows).
        for i in 0..DUE_NOTES as u64 + 10 {
            note_due(&notes, t0 + Duration::from_millis(i));
        }
        let kept = notes.lock().unwrap();
        assert_eq!(kept.len(), DUE_NOTES);
        assert_eq!(
            kept.last(),
            Some(&(t0 + Duration::from_millis(DUE_NOTES as u64 - 1)))
        );
    }

    #[test]
    fn outcomes_are_written_for_as_long_as_the_database_is_only_unavailable() {
        let down = || {
            SenderError::Storage(StorageError::Unavailable(Box::new(std::io::Error::other(
                "connection refused",
            ))))
        };
        let broken = || SenderError::Storage(StorageError::Query(diesel::result::Error::NotFound));
        let secs = Duration::from_secs;
        // Stopping, `since` the signal, with a 20 s shutdown timeout.
        let stopping = |since| {
            Some(Stopping {
                since: secs(since),
                timeout: secs(20),
            })
        };
        for tries in [1, 19] {
            assert!(!give_up_writing_outcomes(&down(), tries, None));
            assert!(!give_up_writing_outcomes(&down(), tries, stopping(0)));
            assert!(!give_up_writing_outcomes(&down(), tries, stopping(19)));
            assert!(!give_up_writing_outcomes(&broken(), tries, None));
            // A shutdown past its timeout gives up at the next failed try, whatever the error.
            assert!(give_up_writing_outcomes(&down(), tries, stopping(20)));
            assert!(give_up_writing_outcomes(&broken(), tries, stopping(21)));
        }
        for tries in [20, 21, 1_000] {
            // Unavailable: never while running; at shutdown, once the timeout has passed, however
            // many tries came before the signal. Any other error: after OUTCOME_TRIES.
            assert!(!give_up_writing_outcomes(&down(), tries, None), "{tries}");
            assert!(
                !give_up_writing_outcomes(&down(), tries, stopping(0)),
                "{tries}"
            );
            assert!(
                !give_up_writing_outcomes(&down(), tries, stopping(19)),
                "{tries}"
            );
            assert!(
                give_up_writing_outcomes(&down(), tries, stopping(20)),
                "{tries}"
            );
            assert!(give_up_writing_outcomes(&broken(), tries, None), "{tries}");
            assert!(
                give_up_writing_outcomes(&broken(), tries, stopping(0)),
                "{tries}"
            );
        }
        let pauses: Vec<u128> = [1, 2, 19, 20, 21, 500]
            .into_iter()
            .map(|t| outcome_retry_pause(t).as_millis())
            .collect();
        assert_eq!(pauses, [100, 200, 1_900, 2_000, 2_000, 2_000]);
        // The tries a non-transient error gets: the pauses between them add up to 19 s.
        let budget: Duration = (1..OUTCOME_TRIES).map(outcome_retry_pause).sum();
        assert_eq!(budget, Duration::from_secs(19));
    }

    #[test]
    fn the_idle_wait_for_a_busy_key_grows_with_how_long_the_newest_has_waited() {
        let t0 = std::time::Instant::now();
        let ms = |n| Duration::from_millis(n);
        let mut r = Recheck::default();
        assert_eq!(r.wait(t0), None);
        r.add(vec![1], t0);
        // Looked at (taken) and still busy: put back, the clock of the newest key runs on.
        let waits: Vec<Option<Duration>> = [0, 10, 50, 300, 1000, 60_000]
            .into_iter()
            .map(|at| {
                let ids = std::mem::take(&mut r.ids);
                r.put_back(ids);
                r.wait(t0 + ms(at))
            })
            .collect();
        assert_eq!(
            waits,
            [ms(20), ms(20), ms(50), ms(300), ms(1000), ms(1000)].map(Some)
        );
        // A key found busy later makes the wait short again, whatever the older one's age.
        r.add(vec![2], t0 + ms(60_000));
        assert_eq!(r.wait(t0 + ms(60_005)), Some(ms(20)));
        assert_eq!(r.ids, [1, 2]);
        // Added while a look was under way, then the look released the older one: the newer
        // key keeps its own age.
        let taken = std::mem::take(&mut r.ids);
        r.add(vec![3], t0 + ms(60_100));
        r.put_back(taken.into_iter().filter(|id| *id != 1).collect());
        assert_eq!(r.wait(t0 + ms(60_110)), Some(ms(20)));
        // Everything released: nothing to wait for.
        let _ = std::mem::take(&mut r.ids);
        r.put_back(Vec::new());
        assert_eq!(r.wait(t0 + ms(60_200)), None);
        assert_eq!(r.newest, None);
    }
}
