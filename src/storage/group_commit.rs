//! Group commit: concurrent requests' writes are committed together, in one transaction, by one
//! writer thread per [`Db`] handle and kind — one fsync shared by the group. Two writers use it:
//! ingest's ([`ReceiptWriter`]) and `POST /v1/messages`' ([`MessageWriter`]).
//!
//! Invariants:
//! - A request is answered only after the commit that holds its writes returned (the reply is
//!   sent after `COMMIT`); durability is unchanged, only the fsync is shared.
//! - Each request stays whole-or-nothing: a replay (or any error) in one request rolls back that
//!   request alone (a savepoint per request, taken only when the savepoint-free attempt of the
//!   group failed), never its neighbours'.
//! - A group whose transaction fails to commit answers every request in it with
//!   [`StorageError::Unavailable`] (503 + Retry-After at the edge): nothing of it was stored.
//! - The writer waits for more requests at most [`GROUP_WAIT`], and only while some request is
//!   between its verification and its submission ([`GroupWriter::begin`]); an idle Herald
//!   commits a lone request at once.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::models::{NewOutboxRow, NewReceipt, OutboxRow};
use super::receipts::{Abort, Stored, store_unless_replayed};
use super::{Db, StorageError};
use crate::domain::InvalidField;

/// The longest the writer waits for more requests before committing a group. Short: under load
/// the group forms by itself while the previous commit runs (requests queue meanwhile), and a
/// longer wait was dead time for the writer — measured with `herald-bench --quick ingest_pg`,
/// 1 ms gave about 6,000–6,400 receipts/s (p50 2.1–2.4 ms), 200 µs and no wait at all both
/// about 7,000 (p50 1.9 ms).
pub const GROUP_WAIT: Duration = Duration::from_micros(200);
/// The most requests in one group.
pub const GROUP_MAX: usize = 256;

/// Called inside each group's transaction just before its commit, with the number of requests
/// in the group; an error rolls the group back (tests: holding or failing a commit). An ingest
/// group without replay keys is one insert, and the hook runs just before it: on PostgreSQL that
/// insert commits by itself, so an error there means nothing of the group was written.
pub type BeforeCommit = Box<dyn Fn(usize) -> Result<(), StorageError> + Send + Sync>;

/// One request in a writer's queue: what it asks to write, and where its answer goes.
struct Job<P, A> {
    payload: P,
    reply: tokio::sync::oneshot::Sender<Result<A, StorageError>>,
}

/// One ingest request: its source's receipts (see [`ReceiptWriter::store`]).
pub struct Receipts {
    source: String,
    receipts: Vec<NewReceipt>,
    now: DateTime<Utc>,
}

#[derive(Default)]
struct Shared {
    /// Requests past verification, not yet submitted: worth waiting for.
    coming: AtomicUsize,
    /// Requests submitted, not yet taken into a group.
    queued: AtomicUsize,
    /// Groups committed.
    commits: AtomicUsize,
    /// Groups whose merged write the database refused, written again request by request.
    split: AtomicUsize,
    /// The keys (event ids) of the requests being written alone ([`Reply::Alone`]), and how
    /// many were in all.
    alone: Mutex<HashSet<String>>,
    alone_total: AtomicUsize,
    before_commit: Mutex<Option<BeforeCommit>>,
    /// How long a request waits for its group's commit ([`WRITE_DEADLINE`]; tests shorten it).
    deadline_ms: AtomicU64,
}

/// How long a request waits for the commit of its group before it is answered as the database
/// being unavailable (503): a database that holds the write — a server that stopped answering
/// on a connection still open (its kernel still acknowledging, so no TCP timeout fires), or a
/// lock an application's transaction holds on the same event id — kept the request waiting for
/// as long (a walk-through saw a `POST /v1/messages` hang past 30 s). The write itself goes on
/// and may commit later: the client's retry with the same event id then finds it (200), as an
/// ingest provider's retry finds its receipt (a duplicate).
pub const WRITE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
#[error("the database did not commit the write within {0} ms")]
struct TooSlow(u64);

/// Whether `e` is a request's answer at [`WRITE_DEADLINE`]: its write goes on and may commit
/// after it.
pub fn is_past_deadline(e: &StorageError) -> bool {
    matches!(e, StorageError::Unavailable(source) if source.is::<TooSlow>())
}

/// One request's outcome inside a group.
type JobResult<A> = Result<A, StorageError>;

/// How a writer commits a group: every request's answer, or `Err` when the group's transaction
/// failed as a whole (nothing of it committed).
type CommitFn<P, A> = fn(&Db, &[Job<P, A>], &Shared) -> Result<Vec<Reply<A>>, StorageError>;

/// How a writer writes one request alone, in a transaction of its own ([`Reply::Alone`]), and
/// the key that makes two requests one (an event id): one of a key at a time.
struct Alone<P, A> {
    write: fn(&Db, &P) -> JobResult<A>,
    key: fn(&P) -> &str,
}

impl<P, A> Clone for Alone<P, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P, A> Copy for Alone<P, A> {}

/// One request's answer from its group's commit.
enum Reply<A> {
    /// Its answer, sent once the group committed.
    Now(JobResult<A>),
    /// To be written alone, off the writer thread, in a transaction of its own that waits as
    /// long as it must: in the group it waited longer than [`PG_GROUP_LOCK_TIMEOUT`] for a lock
    /// another transaction holds (an application's transaction inserting the same event id, not
    /// yet committed), and the group went on without it — so that one such transaction holds up
    /// its own event id, not every request behind it (a walk-through: one open transaction made
    /// every plain `POST /v1/messages` wait, then answer 503, for as long as it stayed open).
    Alone,
}

/// How long a statement of a group of messages waits for a lock another transaction holds on
/// PostgreSQL before the group goes on without the request that waits (`SET LOCAL
/// lock_timeout`; see [`Reply::Alone`]). Herald's own writers hold an event id's lock for a
/// commit's time, milliseconds.
pub const PG_GROUP_LOCK_TIMEOUT: Duration = Duration::from_millis(200);

/// How long the statements of a group written again request by request wait for such a lock,
/// each: short, since the merged write waited [`PG_GROUP_LOCK_TIMEOUT`] already — with several
/// requests held, their waits add up before the rest of the group is answered.
pub const PG_ONE_BY_ONE_LOCK_TIMEOUT: Duration = Duration::from_millis(20);

/// The most requests written alone at once, and at most a quarter of the database pool's
/// connections (each holds one while it waits): beyond, and for a second request of a key
/// already being written alone (a client's retry), a request is answered 503 at once — nothing
/// of it was written (its savepoint was rolled back). A review: 32 of them waiting without end
/// on an application's locks could hold every one of 10 pooled connections, and Herald with
/// them.
const ALONE_MAX: usize = 32;

/// How long a request written alone waits for a lock (`lock_timeout`): its requester has been
/// answered by then ([`WRITE_DEADLINE`]), and its retry asks again.
pub const ALONE_LOCK_TIMEOUT: Duration = WRITE_DEADLINE;

/// The handle on one database's writer of one kind: cheap to clone. The writer thread ends when
/// the last handle is dropped.
pub struct GroupWriter<P, A> {
    tx: Sender<Job<P, A>>,
    shared: Arc<Shared>,
}

impl<P, A> Clone for GroupWriter<P, A> {
    fn clone(&self) -> Self {
        GroupWriter {
            tx: self.tx.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<P, A> std::fmt::Debug for GroupWriter<P, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupWriter")
    }
}

/// Ingest's writer: a request's receipts, stored unless replayed.
pub type ReceiptWriter = GroupWriter<Receipts, Stored>;

/// What `POST /v1/messages` gets back for a message (not a fan-out): (created, the stored
/// row), or why its event id cannot be used.
pub type Enqueued = Result<(bool, OutboxRow), Vec<InvalidField>>;

/// `POST /v1/messages`' writer: messages other than fan-outs; on PostgreSQL only those without
/// an ordering key (see [`MessageWriter::enqueue`]).
pub type MessageWriter = GroupWriter<NewOutboxRow, Enqueued>;

/// A request on its way to the writer (see [`GroupWriter::begin`]).
pub struct Coming {
    shared: Arc<Shared>,
}

impl Drop for Coming {
    fn drop(&mut self) {
        self.shared.coming.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the group writer has stopped")]
struct WriterGone;

#[derive(Debug, thiserror::Error)]
#[error("the group commit failed: {0}")]
struct GroupFailed(String);

impl<P: Send + 'static, A: Send + 'static> GroupWriter<P, A> {
    /// Starts the writer thread `name` for `db`, committing with `commit`; `what` names its
    /// requests in logs.
    fn start(
        db: Db,
        name: &str,
        what: &'static str,
        commit: CommitFn<P, A>,
        alone: Option<Alone<P, A>>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel();
        let shared = Arc::new(Shared {
            deadline_ms: AtomicU64::new(
                u64::try_from(WRITE_DEADLINE.as_millis()).unwrap_or(u64::MAX),
            ),
            ..Shared::default()
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || run(db, rx, s, what, commit, alone))?;
        Ok(GroupWriter { tx, shared })
    }

    /// Marks a request as coming (call before verifying it; drop the guard once it is submitted
    /// or refused): the writer waits for it, up to [`GROUP_WAIT`], before committing a group.
    pub fn begin(&self) -> Coming {
        self.shared.coming.fetch_add(1, Ordering::AcqRel);
        Coming {
            shared: self.shared.clone(),
        }
    }

    /// Writes `payload` with the next group; returns once that group committed (or failed).
    async fn submit(&self, coming: Coming, payload: P) -> Result<A, StorageError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        let sent = self.tx.send(Job { payload, reply });
        // Queued (or refused): no longer on its way.
        drop(coming);
        if sent.is_err() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(StorageError::Unavailable(Box::new(WriterGone)));
        }
        let deadline = self.shared.deadline_ms.load(Ordering::Acquire);
        match tokio::time::timeout(std::time::Duration::from_millis(deadline), answer).await {
            Ok(answer) => {
                answer.unwrap_or_else(|_| Err(StorageError::Unavailable(Box::new(WriterGone))))
            }
            Err(_) => Err(StorageError::Unavailable(Box::new(TooSlow(deadline)))),
        }
    }

    /// Sets how long a request waits for its group's commit (tests; [`WRITE_DEADLINE`] else).
    pub fn set_deadline(&self, deadline: std::time::Duration) {
        let ms = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX);
        self.shared.deadline_ms.store(ms, Ordering::Release);
    }

    /// Requests submitted and waiting for a group.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire)
    }

    /// Groups committed so far.
    pub fn commits(&self) -> usize {
        self.shared.commits.load(Ordering::Acquire)
    }

    /// Groups whose merged write the database refused (not an outage), written again request
    /// by request (tests: a merged write that works is never one of them).
    pub fn split_groups(&self) -> usize {
        self.shared.split.load(Ordering::Acquire)
    }

    /// Requests written alone so far, their group having gone on without them ([`Reply::Alone`]).
    pub fn written_alone(&self) -> usize {
        self.shared.alone_total.load(Ordering::Acquire)
    }

    /// Installs (or removes) the before-commit hook.
    pub fn set_before_commit(&self, hook: Option<BeforeCommit>) {
        *self
            .shared
            .before_commit
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = hook;
    }
}

impl ReceiptWriter {
    /// Starts the receipt writer thread for `db`.
    pub fn spawn(db: Db) -> std::io::Result<ReceiptWriter> {
        Self::start(db, "herald-receipts", "receipts", commit_receipts, None)
    }

    /// Stores one request's receipts with the next group; returns once that group committed
    /// (or failed). See [`Db::store_unless_replayed`] for what is stored.
    pub async fn store(
        &self,
        coming: Coming,
        source: &str,
        receipts: Vec<NewReceipt>,
        now: DateTime<Utc>,
    ) -> Result<Stored, StorageError> {
        let payload = Receipts {
            source: source.to_owned(),
            // PostgreSQL text cannot hold NUL; a provider's free text (an SMTP diagnostic) may.
            receipts: receipts.iter().map(NewReceipt::without_nul).collect(),
            now,
        };
        self.submit(coming, payload).await
    }
}

fn run<P: Send + 'static, A: Send + 'static>(
    db: Db,
    rx: Receiver<Job<P, A>>,
    shared: Arc<Shared>,
    what: &'static str,
    commit: CommitFn<P, A>,
    alone: Option<Alone<P, A>>,
) {
    while let Ok(first) = rx.recv() {
        let mut group = vec![first];
        let deadline = Instant::now() + GROUP_WAIT;
        while group.len() < GROUP_MAX {
            match rx.try_recv() {
                Ok(job) => {
                    group.push(job);
                    continue;
                }
                Err(TryRecvError::Disconnected) => break,
                Err(TryRecvError::Empty) => {}
            }
            // Nothing queued: wait only for requests already on their way.
            if shared.coming.load(Ordering::Acquire) == 0 {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match rx.recv_timeout(left) {
                Ok(job) => group.push(job),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        shared.queued.fetch_sub(group.len(), Ordering::AcqRel);
        // A panic in a commit (a bug) answers its group 503 and leaves the writer running: every
        // later request would otherwise be refused with it.
        let results = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            commit(&db, &group, &shared)
        }))
        .unwrap_or_else(|_| {
            Err(StorageError::Unavailable(Box::new(GroupFailed(
                "the group's commit panicked".into(),
            ))))
        });
        match results {
            Ok(results) => {
                shared.commits.fetch_add(1, Ordering::AcqRel);
                for (job, result) in group.into_iter().zip(results) {
                    match (result, alone) {
                        // A requester that went away no longer needs the answer.
                        (Reply::Now(result), _) => {
                            let _ = job.reply.send(result);
                        }
                        (Reply::Alone, Some(write)) => write_alone(&db, &shared, job, write),
                        (Reply::Alone, None) => {
                            let _ = job.reply.send(Err(StorageError::Unavailable(Box::new(
                                GroupFailed("no way to write a request alone".into()),
                            ))));
                        }
                    }
                }
            }
            Err(e) => {
                let why = e.log_safe();
                tracing::warn!(requests = group.len(), writes = what, reason = %why, "group commit failed; every request in it is asked to retry");
                for job in group {
                    let _ = job
                        .reply
                        .send(Err(StorageError::Unavailable(Box::new(GroupFailed(
                            why.clone(),
                        )))));
                }
            }
        }
    }
}

/// How many requests may be written alone at once on `db` ([`ALONE_MAX`]).
fn alone_cap(db: &Db) -> usize {
    match db {
        Db::Pg(pool) => (pool.max_size() as usize / 4).clamp(1, ALONE_MAX),
        Db::Sqlite(_) => 1,
    }
}

/// Writes `job` alone on a thread of its own and answers it from there: one of a key at a
/// time, at most [`alone_cap`] at once; any other is answered 503 at once (nothing of it was
/// written).
fn write_alone<P: Send + 'static, A: Send + 'static>(
    db: &Db,
    shared: &Arc<Shared>,
    job: Job<P, A>,
    alone: Alone<P, A>,
) {
    let busy = |why: &str| StorageError::Unavailable(Box::new(GroupFailed(why.to_owned())));
    let key = (alone.key)(&job.payload).to_owned();
    {
        let mut keys = shared.alone.lock().unwrap_or_else(|p| p.into_inner());
        if keys.contains(&key) {
            let _ = job.reply.send(Err(busy(
                "a request of the same event id is waiting for a lock already",
            )));
            return;
        }
        if keys.len() >= alone_cap(db) {
            let _ = job.reply.send(Err(busy(
                "too many requests waiting for locks to be written alone",
            )));
            return;
        }
        keys.insert(key.clone());
    }
    let done = |s: &Shared, key: &str| {
        s.alone
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    };
    let (db, s, their_key) = (db.clone(), shared.clone(), key.clone());
    let Job { payload, reply } = job;
    // The reply goes with the thread. If it cannot start, the reply is dropped with it, and
    // the requester is answered 503 as for a writer gone (`GroupWriter::submit`).
    let started = std::thread::Builder::new()
        .name("herald-alone".into())
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                (alone.write)(&db, &payload)
            }))
            .unwrap_or_else(|_| Err(busy("a write alone panicked")));
            done(&s, &their_key);
            let _ = reply.send(r);
        });
    if started.is_ok() {
        shared.alone_total.fetch_add(1, Ordering::AcqRel);
    } else {
        done(shared, &key);
    }
}

/// Commits the group. Without replay keys in it: one multi-row insert for the whole group.
/// With them: first one transaction without savepoints (the common case: nothing to undo); if a
/// request aborted, again with a savepoint per request so that only it is undone. So too when
/// the database refused the multi-row insert of a group of several requests (not merely
/// unavailable: a value it cannot store): again request by request, each in its savepoint, so
/// that only the request holding that value fails, never its neighbours.
/// `Err` when the group's transaction failed as a whole (nothing of it committed).
fn commit_receipts(
    db: &Db,
    group: &[Job<Receipts, Stored>],
    shared: &Shared,
) -> Result<Vec<Reply<Stored>>, StorageError> {
    receipts_answers(db, group, shared).map(|r| r.into_iter().map(Reply::Now).collect())
}

fn receipts_answers(
    db: &Db,
    group: &[Job<Receipts, Stored>],
    shared: &Shared,
) -> Result<Vec<JobResult<Stored>>, StorageError> {
    let replay_keys = group
        .iter()
        .any(|j| j.payload.receipts.iter().any(|x| x.replay_key.is_some()));
    let first = if replay_keys {
        Body::OneByOne { savepoints: false }
    } else {
        Body::Merged
    };
    match commit_once(db, group, shared, first) {
        Err(GroupError::OneAborted) => one_by_one_in_savepoints(db, group, shared),
        // A group of one too: its request alone then gets the refusal (500), not a 503.
        Err(GroupError::Storage(e)) if !e.is_unavailable() => {
            tracing::warn!(requests = group.len(), reason = %e.log_safe(), "the database refused a group of receipts; storing it request by request");
            shared.split.fetch_add(1, Ordering::AcqRel);
            one_by_one_in_savepoints(db, group, shared)
        }
        Err(GroupError::Storage(e)) => Err(e),
        Ok(r) => Ok(r),
    }
}

fn one_by_one_in_savepoints(
    db: &Db,
    group: &[Job<Receipts, Stored>],
    shared: &Shared,
) -> Result<Vec<JobResult<Stored>>, StorageError> {
    match commit_once(db, group, shared, Body::OneByOne { savepoints: true }) {
        Ok(r) => Ok(r),
        Err(GroupError::OneAborted) => Err(StorageError::Unavailable(Box::new(GroupFailed(
            "a request aborted inside its savepoint".into(),
        )))),
        Err(GroupError::Storage(e)) => Err(e),
    }
}

/// How a group's transaction stores it.
#[derive(Debug, Clone, Copy)]
enum Body {
    /// One multi-row insert for the whole group (no replay keys in it).
    Merged,
    /// Request by request, each in a savepoint of its own or not.
    OneByOne { savepoints: bool },
}

enum GroupError {
    /// A request aborted (a replay or an error of its own) in the savepoint-free attempt.
    OneAborted,
    Storage(StorageError),
}

impl From<diesel::result::Error> for GroupError {
    fn from(e: diesel::result::Error) -> Self {
        GroupError::Storage(e.into())
    }
}

impl From<StorageError> for GroupError {
    fn from(e: StorageError) -> Self {
        GroupError::Storage(e)
    }
}

fn before_commit(shared: &Shared, n: usize) -> Result<(), StorageError> {
    match &*shared
        .before_commit
        .lock()
        .unwrap_or_else(|p| p.into_inner())
    {
        Some(hook) => hook(n),
        None => Ok(()),
    }
}

/// Turns one request's transaction-body result into its answer.
fn answer(r: Result<(usize, usize), Abort>) -> JobResult<Stored> {
    match r {
        Ok((new, duplicates)) => Ok(Stored::Receipts { new, duplicates }),
        Err(Abort::Replayed(n)) => Ok(Stored::Replayed(n)),
        Err(Abort::Storage(e)) => Err(e),
    }
}

/// The group body when no request carries a replay key (nothing can abort a request): every
/// receipt of the group in one multi-row insert, in key order, each key once; each request is
/// told which of its receipts were new. The before-commit hook runs before the insert: on
/// PostgreSQL the insert is the group's whole write, committed by itself (see [`commit_once`]).
/// Running it again after it committed stores nothing more (each key is stored once); its
/// receipts are then told apart as duplicates. Compiled once per backend.
macro_rules! merged_body {
    ($conn:expr, $q:ident, $group:expr, $shared:expr) => {{
        let conn = $conn;
        let mut rows: Vec<(&str, &NewReceipt, DateTime<Utc>)> = $group
            .iter()
            .map(|job| &job.payload)
            .flat_map(|job| {
                job.receipts
                    .iter()
                    .map(move |x| (job.source.as_str(), x, job.now))
            })
            .collect();
        rows.sort_by(|a, b| (a.0, &a.1.provider_event_id).cmp(&(b.0, &b.1.provider_event_id)));
        rows.dedup_by(|a, b| a.0 == b.0 && a.1.provider_event_id == b.1.provider_event_id);
        before_commit($shared, $group.len())?;
        let mut new: std::collections::HashSet<(String, String)> =
            $q::insert_receipts_returning(conn, &rows)?
                .into_iter()
                .collect();
        // The first request (in arrival order) that carries a new key stored it; any other
        // carrying it (the provider retrying while the first try was in flight) has a duplicate.
        let out: Vec<JobResult<Stored>> = $group
            .iter()
            .map(|job| &job.payload)
            .map(|job| {
                let stored = job
                    .receipts
                    .iter()
                    .filter(|x| new.remove(&(job.source.clone(), x.provider_event_id.clone())))
                    .count();
                Ok(Stored::Receipts {
                    new: stored,
                    duplicates: job.receipts.len() - stored,
                })
            })
            .collect();
        Ok(out)
    }};
}

/// The group body, compiled once per backend.
macro_rules! group_body {
    ($conn:expr, $q:ident, $schema:ident, $group:expr, $shared:expr, $savepoints:expr) => {{
        let conn = $conn;
        let mut out: Vec<JobResult<Stored>> = Vec::with_capacity($group.len());
        for job in $group.iter().map(|job| &job.payload) {
            let (source, receipts, now) = (job.source.as_str(), job.receipts.as_slice(), job.now);
            if $savepoints {
                // A nested transaction is a savepoint: an abort undoes this request alone.
                let r = ::diesel::Connection::transaction(conn, |c| -> Result<_, Abort> {
                    store_unless_replayed!(c, $q, $schema, source, receipts, now)
                });
                out.push(answer(r));
            } else {
                let r = (|| -> Result<_, Abort> {
                    store_unless_replayed!(&mut *conn, $q, $schema, source, receipts, now)
                })();
                match r {
                    Ok(x) => out.push(answer(Ok(x))),
                    Err(_) => return Err(GroupError::OneAborted),
                }
            }
        }
        before_commit($shared, $group.len())?;
        Ok(out)
    }};
}

fn commit_once(
    db: &Db,
    group: &[Job<Receipts, Stored>],
    shared: &Shared,
    body: Body,
) -> Result<Vec<JobResult<Stored>>, GroupError> {
    let savepoints = match body {
        Body::Merged => {
            return match db {
                // One statement (the receipts' insert, their queue rows by its trigger), committed
                // by itself: no `BEGIN` and `COMMIT` round trips, a shorter turn of the writer.
                Db::Pg(pool) => {
                    use super::queries::pg as q;
                    super::pg_autocommit(
                        pool,
                        |c: &mut diesel::pg::PgConnection| -> Result<_, GroupError> {
                            merged_body!(c, q, group, shared)
                        },
                    )
                }
                Db::Sqlite(sq) => {
                    use super::queries::sqlite as q;
                    let _w = sq.lock_writer();
                    let mut conn = sq.pool.get().map_err(StorageError::from)?;
                    conn.immediate_transaction(
                        |c: &mut diesel::sqlite::SqliteConnection| -> Result<_, GroupError> {
                            merged_body!(c, q, group, shared)
                        },
                    )
                }
            };
        }
        Body::OneByOne { savepoints } => savepoints,
    };
    match db {
        Db::Pg(pool) => {
            use super::queries::pg as q;
            super::pg_transaction(
                pool,
                |c: &mut diesel::pg::PgConnection| -> Result<_, GroupError> {
                    group_body!(c, q, schema_pg, group, shared, savepoints)
                },
            )
        }
        Db::Sqlite(sq) => {
            use super::queries::sqlite as q;
            let _w = sq.lock_writer();
            let mut conn = sq.pool.get().map_err(StorageError::from)?;
            conn.immediate_transaction(
                |c: &mut diesel::sqlite::SqliteConnection| -> Result<_, GroupError> {
                    group_body!(c, q, schema_sqlite, group, shared, savepoints)
                },
            )
        }
    }
}

impl MessageWriter {
    /// Starts the message writer thread for `db`.
    pub fn spawn(db: Db) -> std::io::Result<MessageWriter> {
        Self::start(
            db,
            "herald-messages",
            "messages",
            commit_messages,
            Some(Alone {
                write: |db, row| db.enqueue_waiting_at_most(row, ALONE_LOCK_TIMEOUT),
                key: |row| row.event_id.as_str(),
            }),
        )
    }

    /// Enqueues one message row with the next group; returns once that group committed (or
    /// failed), with what [`Db::enqueue`] returns: (created, the stored row), or the event id
    /// refused because a fan-out holds it. On PostgreSQL `POST /v1/messages` sends plain rows
    /// without an ordering key here: a keyed row takes its key's insert lock, and two groups
    /// holding several keys each could wait on each other's (or on an application's); keyed
    /// rows keep a transaction of their own ([`Db::enqueue`]). On SQLite, with one writer at a
    /// time, keyed rows come here too. A keyed row is written request by request, each as
    /// [`Db::enqueue`] writes it; requests of one key in one group take their places in
    /// event-id order (none was answered before the others were sent, so none came first).
    pub async fn enqueue(
        &self,
        coming: Coming,
        row: NewOutboxRow,
    ) -> Result<Enqueued, StorageError> {
        self.submit(coming, row).await
    }
}

/// Commits a group of messages. On PostgreSQL, when no row is keyed: the event ids' locks
/// (in key order), one look for fan-outs holding them, one prepared insert returning the
/// stored rows and a read of the ids already there, for the whole group. Otherwise, or when the
/// database refused the merged insert (a value it cannot store), request by request, each in a
/// savepoint, as [`Db::enqueue`] writes one: only the request holding that value fails.
///
/// On PostgreSQL a group's statements wait at most [`PG_GROUP_LOCK_TIMEOUT`] for a lock another
/// transaction holds: the merged write that waits longer fails, and is written request by
/// request; a request that fails there is written alone ([`Reply::Alone`]), so the one whose
/// event id an open transaction holds waits by itself, and so does one holding a value the
/// database refuses (which fails alone as it failed in the group: 500).
fn commit_messages(
    db: &Db,
    group: &[Job<NewOutboxRow, Enqueued>],
    shared: &Shared,
) -> Result<Vec<Reply<Enqueued>>, StorageError> {
    let now = |r: Vec<JobResult<Enqueued>>| r.into_iter().map(Reply::Now).collect();
    match db {
        Db::Pg(pool) => {
            if group.iter().all(|j| j.payload.ordering_key.is_none()) {
                let r = super::pg_transaction(pool, |c: &mut diesel::pg::PgConnection| {
                    pg_merged_messages(c, group, shared)
                });
                match r {
                    // A group of one too: its request alone then gets the database's refusal
                    // (500), not the 503 of a failed group, which would have it retried for ever.
                    Err(e) if !e.is_unavailable() => {
                        tracing::warn!(requests = group.len(), reason = %e.log_safe(), "the database refused a group of messages, or a lock held it; writing it request by request");
                        shared.split.fetch_add(1, Ordering::AcqRel);
                    }
                    r => return r.map(now),
                }
            }
            use super::queries::pg as q;
            let r: Vec<JobResult<Enqueued>> =
                super::pg_transaction(pool, |c: &mut diesel::pg::PgConnection| {
                    super::sql::pg_group_settings(c, PG_ONE_BY_ONE_LOCK_TIMEOUT)?;
                    let r = messages_one_by_one!(&mut *c, q, group, shared)?;
                    super::sql::pg_wait_for_locks(c)?;
                    Ok::<_, StorageError>(r)
                })?;
            Ok(r.into_iter()
                .map(|r| match r {
                    Err(e) if !e.is_unavailable() => Reply::Alone,
                    r => Reply::Now(r),
                })
                .collect())
        }
        Db::Sqlite(sq) => {
            use super::queries::sqlite as q;
            sq.write(|c| messages_one_by_one!(c, q, group, shared))
                .map(now)
        }
    }
}

/// Each request's message in a savepoint of its own, as [`Db::enqueue`] writes it alone, in
/// event-id order (the locks and rows then come in the order the merged write takes them: a
/// group written again after a deadlock does not run into the same one); the answers in the
/// group's order. Compiled once per backend.
macro_rules! messages_one_by_one {
    ($conn:expr, $q:ident, $group:expr, $shared:expr) => {{
        let conn = $conn;
        let mut order: Vec<usize> = (0..$group.len()).collect();
        order.sort_by(|a, b| {
            $group[*a]
                .payload
                .event_id
                .cmp(&$group[*b].payload.event_id)
        });
        let mut out: Vec<Option<JobResult<Enqueued>>> = (0..$group.len()).map(|_| None).collect();
        for i in order {
            let row = &$group[i].payload;
            out[i] = Some(::diesel::Connection::transaction(
                conn,
                |c| -> Result<Enqueued, StorageError> {
                    $q::lock_event_id(c, &row.event_id)?;
                    Ok(crate::outbox::enqueue_row(c, row)?)
                },
            ));
        }
        before_commit($shared, $group.len())?;
        Ok::<_, StorageError>(out.into_iter().flatten().collect())
    }};
}
use messages_one_by_one;

/// The merged group body on PostgreSQL (no keyed row in the group).
fn pg_merged_messages(
    c: &mut diesel::pg::PgConnection,
    group: &[Job<NewOutboxRow, Enqueued>],
    shared: &Shared,
) -> Result<Vec<JobResult<Enqueued>>, StorageError> {
    use diesel::prelude::*;

    use super::schema_pg::herald_fanouts as f;
    let ids: Vec<&str> = group.iter().map(|j| j.payload.event_id.as_str()).collect();
    // `= ANY(…)` on a table analyzed while small would otherwise be planned as a sequential
    // scan (see `keep_to_indexes`): measured, 1 ms per group's read at 20,000 rows.
    super::sql::pg_group_settings(c, PG_GROUP_LOCK_TIMEOUT)?;
    // As Db::enqueue: the locks first, so that a fan-out of one of these ids that commits
    // meanwhile is seen by the next statements (READ COMMITTED: each its own snapshot).
    super::sql::pg_lock_event_ids(c, &ids)?;
    let fanouts: HashSet<String> = f::table
        .filter(f::event_id.eq_any(&ids))
        .select(f::event_id)
        .load::<String>(c)?
        .into_iter()
        .collect();
    // In event-id order, as the fan-out trigger inserts its children (by endpoint, under one
    // prefix): two transactions inserting several of the same ids wait on each other's index
    // entries in one order, never in a circle. (An application's transaction inserting several
    // of the very ids a group carries, in another order, still can: PostgreSQL then aborts one
    // of the two.) The sort is stable: an event id given twice is stored once (ON CONFLICT DO
    // NOTHING skips the second row), by the first request carrying it. The rows come back as
    // stored (the insert triggers' defaults in them).
    let mut rows: Vec<&NewOutboxRow> = group
        .iter()
        .map(|j| &j.payload)
        .filter(|m| !fanouts.contains(&m.event_id))
        .collect();
    rows.sort_by(|a, b| a.event_id.cmp(&b.event_id));
    let mut stored: HashMap<String, OutboxRow> = super::sql::pg_insert_messages(c, &rows)?
        .into_iter()
        .map(|r| (r.event_id.clone(), r))
        .collect();
    let mut created: HashSet<String> = stored.keys().cloned().collect();
    // Ids that were there already: read as they are.
    let found: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| !stored.contains_key(*id) && !fanouts.contains(*id))
        .collect();
    if !found.is_empty() {
        stored.extend(
            super::queries::pg::find_by_event_ids(c, &found)?
                .into_iter()
                .map(|r| (r.event_id.clone(), r)),
        );
    }
    super::sql::pg_wait_for_locks(c)?;
    before_commit(shared, group.len())?;
    Ok(group
        .iter()
        .map(|j| {
            let id = &j.payload.event_id;
            if fanouts.contains(id) {
                return Ok(Err(vec![crate::outbox::fanout_holds_event_id()]));
            }
            let row = stored
                .get(id)
                .cloned()
                .ok_or(StorageError::from(diesel::result::Error::NotFound))?;
            Ok(Ok((created.remove(id), row)))
        })
        .collect())
}
