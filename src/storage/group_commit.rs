//! Group commit for ingest: concurrent requests' receipts are committed together, in one
//! transaction, by one writer thread per [`Db`] handle — one fsync shared by the group.
//!
//! Invariants:
//! - A request is answered only after the commit that holds its receipts returned (the reply is
//!   sent after `COMMIT`); durability is unchanged, only the fsync is shared.
//! - Each request stays whole-or-nothing: a replay (or any error) in one request rolls back that
//!   request alone (a savepoint per request, taken only when the savepoint-free attempt of the
//!   group failed), never its neighbours'.
//! - A group whose transaction fails to commit answers every request in it with
//!   [`StorageError::Unavailable`] (503 + Retry-After at the edge): nothing of it was stored.
//! - The writer waits for more requests at most [`GROUP_WAIT`], and only while some request is
//!   between its verification and its submission ([`ReceiptWriter::begin`]); an idle Herald
//!   commits a lone request at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::models::NewReceipt;
use super::receipts::{Abort, Stored, store_unless_replayed};
use super::{Db, StorageError};

/// The longest the writer waits for more requests before committing a group. Short: under load
/// the group forms by itself while the previous commit runs (requests queue meanwhile), and a
/// longer wait was dead time for the writer — measured with `herald-bench --quick ingest_pg`,
/// 1 ms gave about 6,000–6,400 receipts/s (p50 2.1–2.4 ms), 200 µs and no wait at all both
/// about 7,000 (p50 1.9 ms).
pub const GROUP_WAIT: Duration = Duration::from_micros(200);
/// The most requests in one group.
pub const GROUP_MAX: usize = 256;

/// Called inside each group's transaction just before its commit, with the number of requests
/// in the group; an error rolls the group back (tests: holding or failing a commit).
pub type BeforeCommit = Box<dyn Fn(usize) -> Result<(), StorageError> + Send + Sync>;

struct Job {
    source: String,
    receipts: Vec<NewReceipt>,
    now: DateTime<Utc>,
    reply: tokio::sync::oneshot::Sender<Result<Stored, StorageError>>,
}

#[derive(Default)]
struct Shared {
    /// Requests past verification, not yet submitted: worth waiting for.
    coming: AtomicUsize,
    /// Requests submitted, not yet taken into a group.
    queued: AtomicUsize,
    /// Groups committed.
    commits: AtomicUsize,
    before_commit: Mutex<Option<BeforeCommit>>,
}

/// The handle on one database's receipt writer: cheap to clone. The writer thread ends when
/// the last handle is dropped.
#[derive(Clone)]
pub struct ReceiptWriter {
    tx: Sender<Job>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ReceiptWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReceiptWriter")
    }
}

/// A request on its way to the writer (see [`ReceiptWriter::begin`]).
pub struct Coming {
    shared: Arc<Shared>,
}

impl Drop for Coming {
    fn drop(&mut self) {
        self.shared.coming.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the receipt writer has stopped")]
struct WriterGone;

#[derive(Debug, thiserror::Error)]
#[error("the group commit failed: {0}")]
struct GroupFailed(String);

impl ReceiptWriter {
    /// Starts the writer thread for `db`.
    pub fn spawn(db: Db) -> std::io::Result<ReceiptWriter> {
        let (tx, rx) = std::sync::mpsc::channel();
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        std::thread::Builder::new()
            .name("herald-receipts".into())
            .spawn(move || run(db, rx, s))?;
        Ok(ReceiptWriter { tx, shared })
    }

    /// Marks a request as coming (call before verifying it; drop the guard once it is submitted
    /// or refused): the writer waits for it, up to [`GROUP_WAIT`], before committing a group.
    pub fn begin(&self) -> Coming {
        self.shared.coming.fetch_add(1, Ordering::AcqRel);
        Coming {
            shared: self.shared.clone(),
        }
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
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job {
            source: source.to_owned(),
            // PostgreSQL text cannot hold NUL; a provider's free text (an SMTP diagnostic) may.
            receipts: receipts.iter().map(NewReceipt::without_nul).collect(),
            now,
            reply,
        };
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        let sent = self.tx.send(job);
        // Queued (or refused): no longer on its way.
        drop(coming);
        if sent.is_err() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(StorageError::Unavailable(Box::new(WriterGone)));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(StorageError::Unavailable(Box::new(WriterGone))))
    }

    /// Requests submitted and waiting for a group.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire)
    }

    /// Groups committed so far.
    pub fn commits(&self) -> usize {
        self.shared.commits.load(Ordering::Acquire)
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

fn run(db: Db, rx: Receiver<Job>, shared: Arc<Shared>) {
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
        let results = commit_group(&db, &group, &shared);
        match results {
            Ok(results) => {
                shared.commits.fetch_add(1, Ordering::AcqRel);
                for (job, result) in group.into_iter().zip(results) {
                    // A requester that went away no longer needs the answer.
                    let _ = job.reply.send(result);
                }
            }
            Err(e) => {
                let why = e.log_safe();
                tracing::warn!(requests = group.len(), reason = %why, "group commit of receipts failed; every request in it is asked to retry");
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

/// One request's outcome inside a group.
type JobResult = Result<Stored, StorageError>;

/// Commits the group. Without replay keys in it: one multi-row insert for the whole group.
/// With them: first one transaction without savepoints (the common case: nothing to undo); if a
/// request aborted, again with a savepoint per request so that only it is undone. So too when
/// the database refused the multi-row insert of a group of several requests (not merely
/// unavailable: a value it cannot store): again request by request, each in its savepoint, so
/// that only the request holding that value fails, never its neighbours.
/// `Err` when the group's transaction failed as a whole (nothing of it committed).
fn commit_group(db: &Db, group: &[Job], shared: &Shared) -> Result<Vec<JobResult>, StorageError> {
    let replay_keys = group
        .iter()
        .any(|j| j.receipts.iter().any(|x| x.replay_key.is_some()));
    let first = if replay_keys {
        Body::OneByOne { savepoints: false }
    } else {
        Body::Merged
    };
    match commit_once(db, group, shared, first) {
        Err(GroupError::OneAborted) => one_by_one_in_savepoints(db, group, shared),
        Err(GroupError::Storage(e)) if group.len() > 1 && !e.is_unavailable() => {
            tracing::warn!(requests = group.len(), reason = %e.log_safe(), "the database refused a group of receipts; storing it request by request");
            one_by_one_in_savepoints(db, group, shared)
        }
        Err(GroupError::Storage(e)) => Err(e),
        Ok(r) => Ok(r),
    }
}

fn one_by_one_in_savepoints(
    db: &Db,
    group: &[Job],
    shared: &Shared,
) -> Result<Vec<JobResult>, StorageError> {
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
fn answer(r: Result<(usize, usize), Abort>) -> JobResult {
    match r {
        Ok((new, duplicates)) => Ok(Stored::Receipts { new, duplicates }),
        Err(Abort::Replayed(n)) => Ok(Stored::Replayed(n)),
        Err(Abort::Storage(e)) => Err(e),
    }
}

/// The group body when no request carries a replay key (nothing can abort a request): every
/// receipt of the group in one multi-row insert, in key order, each key once; each request is
/// told which of its receipts were new. Compiled once per backend.
macro_rules! merged_body {
    ($conn:expr, $q:ident, $group:expr, $shared:expr) => {{
        let conn = $conn;
        let mut rows: Vec<(&str, &NewReceipt, DateTime<Utc>)> = $group
            .iter()
            .flat_map(|job| {
                job.receipts
                    .iter()
                    .map(move |x| (job.source.as_str(), x, job.now))
            })
            .collect();
        rows.sort_by(|a, b| (a.0, &a.1.provider_event_id).cmp(&(b.0, &b.1.provider_event_id)));
        rows.dedup_by(|a, b| a.0 == b.0 && a.1.provider_event_id == b.1.provider_event_id);
        let mut new: std::collections::HashSet<(String, String)> =
            $q::insert_receipts_returning(conn, &rows)?
                .into_iter()
                .collect();
        before_commit($shared, $group.len())?;
        // The first request (in arrival order) that carries a new key stored it; any other
        // carrying it (the provider retrying while the first try was in flight) has a duplicate.
        let out: Vec<JobResult> = $group
            .iter()
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
        let mut out: Vec<JobResult> = Vec::with_capacity($group.len());
        for job in $group {
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
    group: &[Job],
    shared: &Shared,
    body: Body,
) -> Result<Vec<JobResult>, GroupError> {
    let savepoints = match body {
        Body::Merged => {
            return match db {
                Db::Pg(pool) => {
                    use super::queries::pg as q;
                    super::pg_transaction(
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
