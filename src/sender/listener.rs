//! The wake-up for rows committed by others: PostgreSQL's LISTEN/NOTIFY, or SQLite's watch.
//!
//! PostgreSQL: LISTEN/NOTIFY wake-up. A dedicated connection (application_name
//! [`APPLICATION_NAME`]) LISTENs on `herald_outbox`, then registers in `herald_listeners` and
//! renews its row every [`CHECK_EVERY`]; the trigger on `herald_outbox` notifies once per
//! transaction that inserted a due row (or a keyed row waiting behind its key's head), at commit
//! — and only while some listener's row is fresh (30 s), so polling-only
//! deployments pay no notify-queue lock on their commits, and no sender has promised to stay
//! awake ([`super::awake`]). The row is removed when the thread
//! stops; a crashed process's row simply goes stale. Notifications
//! are drained every few milliseconds (no query is sent to do so) and folded into one wake-up
//! (the debounce); polling remains the fallback, and a broken connection is re-opened.
//!
//! SQLite has no notifications between processes: a thread with a connection of its own waits
//! for the database's WAL file to be written (inotify on Linux; elsewhere it looks every 10 ms),
//! then looks whether another connection committed a row worth waking for (the trigger's rule;
//! see [`crate::storage::watch`]), every [`DRAIN_EVERY`] until the writes stop. An idle database
//! costs a look a second. A failing watch is opened again with backoff; polling remains the
//! fallback.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use diesel::Connection;
use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::storage::{Db, OwnWrites};

/// The application_name of the LISTEN connection: the insert trigger notifies only while a
/// session with this name is connected to the database.
pub const APPLICATION_NAME: &str = "herald-listen";

/// How often pending notifications are drained.
const DRAIN_EVERY: Duration = Duration::from_millis(2);
/// How often a reconnect backoff looks whether Herald is stopping: a shutdown waits at most this
/// long for the thread, and an outage costs 20 wake-ups a second, not 500.
const STOP_POLL: Duration = Duration::from_millis(50);
/// How often the registration is renewed (which also checks the connection). The trigger counts
/// a registration as live for 30 s: three renewals.
pub const CHECK_EVERY: Duration = Duration::from_secs(10);

/// Registers (or renews) this listener, and forgets registrations stale for an hour.
const REGISTER_SQL: &str = "INSERT INTO herald_listeners (owner, seen_at) VALUES ($1, now()) \
     ON CONFLICT (owner) DO UPDATE SET seen_at = now()";
const FORGET_STALE_SQL: &str =
    "DELETE FROM herald_listeners WHERE seen_at < now() - interval '1 hour'";

fn register(conn: &mut PgConnection, me: &str) -> bool {
    use diesel::RunQueryDsl;
    diesel::sql_query(REGISTER_SQL)
        .bind::<diesel::sql_types::Text, _>(me)
        .execute(conn)
        .is_ok()
        && conn.batch_execute(FORGET_STALE_SQL).is_ok()
}

fn unregister(conn: &mut PgConnection, me: &str) {
    use diesel::RunQueryDsl;
    let _ = diesel::sql_query("DELETE FROM herald_listeners WHERE owner = $1")
        .bind::<diesel::sql_types::Text, _>(me)
        .execute(conn);
}

/// Starts the listener thread for the database at `url`, which `db` is open on (LISTEN on
/// PostgreSQL, the watch on SQLite); it ends when `stop` is set.
pub fn spawn(
    db: &Db,
    url: String,
    wake: Arc<Notify>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let own = db.own_writes();
    let thread = match crate::storage::sqlite_path(&url).map(str::to_owned) {
        Some(path) => std::thread::Builder::new()
            .name("herald-watch".into())
            .spawn(move || watch_loop(&path, own, &wake, &stop)),
        None => std::thread::Builder::new()
            .name("herald-listen".into())
            .spawn(move || listen_loop(&url, &wake, &stop)),
    };
    thread.unwrap_or_else(|e| panic!("cannot start the wake-up thread (LISTEN or watch): {e}"))
}

/// SQLite: for this long after the WAL file was last written the watch looks every
/// [`DRAIN_EVERY`]. A write is reported before its commit is (with `synchronous = FULL` the
/// commit is visible only once the WAL is synced), so one look at the report is not enough: this
/// covers a sync of up to a quarter of a second.
const SETTLE: Duration = Duration::from_millis(250);
/// SQLite: otherwise the watch looks once per this long: the safety net for a slower sync, or a
/// file system that reports no writes (the sender's own poll is the other).
const LOOK_ANYWAY: Duration = Duration::from_secs(1);

/// SQLite: the pace of the looks once this process's own writer has begun a write in each of
/// [`OWN_STREAK`] looks' intervals in a row: under sustained load its commits write the WAL all
/// the time and add nothing the sender needs waking for (it wakes itself for what it enqueues),
/// so an application's commit among them may wait this long. Herald's periodic passes (one
/// write transaction a second or so) and a message's claim and outcome never make such a
/// streak.
const AMONG_OWN_WRITES: Duration = Duration::from_millis(10);
/// SQLite: see [`AMONG_OWN_WRITES`].
const OWN_STREAK: u32 = 5;
/// SQLite: how often a watch without file events (but asked for them) tries for them again.
const FILE_EVENTS_AGAIN: Duration = Duration::from_secs(60);

/// SQLite: looks whether a row worth waking for was committed, at most once per
/// [`DRAIN_EVERY`], or per [`AMONG_OWN_WRITES`] while Herald's own writer keeps writing; see
/// [`SETTLE`]. `own`: the count of this process's write transactions (none: no streak).
fn watch_loop(path: &str, own: Option<OwnWrites>, wake: &Notify, stop: &AtomicBool) {
    let own_count = || own.as_ref().map_or(0, OwnWrites::count);
    let mut backoff = Duration::from_millis(200);
    while !stop.load(Ordering::Relaxed) {
        let mut watch = match crate::storage::watch::InsertWatch::open(path, true) {
            Ok(w) => w,
            Err(e) => {
                let error = cause(&e);
                warn!(%error, "cannot watch the SQLite database for inserts; polling only until it works");
                back_off(&mut backoff, stop);
                continue;
            }
        };
        match watch.no_file_events_because() {
            None => info!("watching the SQLite database for inserts"),
            Some(why) => info!(
                why,
                every_ms = crate::storage::watch::POLL_EVERY.as_millis(),
                "watching the SQLite database for inserts by looking: the system reports no \
                 file writes"
            ),
        }
        // Something may have been committed while nobody watched.
        wake.notify_one();
        let mut tried_file_events = Instant::now();
        let mut looked = Instant::now();
        let mut written: Option<Instant> = None;
        let (mut own_seen, mut streak) = (own_count(), 0u32);
        while !stop.load(Ordering::Relaxed) {
            // Looking every 10 ms costs an idle Herald CPU and a busy one throughput: without
            // the system's reports (its inotify limit reached, say), try for them again now and
            // then.
            if !watch.has_file_events() && tried_file_events.elapsed() >= FILE_EVENTS_AGAIN {
                tried_file_events = Instant::now();
                if watch.try_file_events_again() {
                    // A commit between the last look and the new watch was reported to nobody:
                    // look as after a write.
                    written = Some(Instant::now());
                    info!(
                        "watching the SQLite database for inserts: the system reports file writes now"
                    );
                }
            }
            let busy = |w: Option<Instant>| w.is_some_and(|t| t.elapsed() < SETTLE);
            let pace = if streak >= OWN_STREAK {
                AMONG_OWN_WRITES
            } else {
                DRAIN_EVERY
            };
            let at_most = if busy(written) {
                pace.saturating_sub(looked.elapsed())
            } else {
                STOP_POLL
            };
            let step = watch.wait(at_most).and_then(|now_written| {
                if now_written {
                    written = Some(Instant::now());
                }
                if !busy(written) && looked.elapsed() < LOOK_ANYWAY {
                    return Ok(None);
                }
                if let Some(rest) = pace.checked_sub(looked.elapsed()) {
                    std::thread::sleep(rest);
                }
                looked = Instant::now();
                // Read before the look: a write of Herald's that began before it counts in this
                // interval or the next, never in none.
                let count = own_count();
                streak = if count == own_seen {
                    0
                } else {
                    streak.saturating_add(1)
                };
                own_seen = count;
                watch.look(chrono::Utc::now()).map(Some)
            });
            match step {
                Ok(None) => {}
                Ok(Some(woken)) => {
                    backoff = Duration::from_millis(200);
                    if woken {
                        wake.notify_one();
                    }
                }
                Err(e) => {
                    // Once per backoff (growing to 10 s), not 500 times a second.
                    let error = cause(&e);
                    warn!(%error, "watching the SQLite database failed; polling only until it works");
                    back_off(&mut backoff, stop);
                    break;
                }
            }
        }
    }
}

/// What SQLite or the system said (a read of the outbox's ids names no value), rather than
/// "database unavailable".
fn cause(e: &crate::storage::StorageError) -> String {
    std::error::Error::source(e).map_or_else(|| e.to_string(), ToString::to_string)
}

/// Waits out `backoff` (less once `stop` is set), then doubles it, up to 10 s.
fn back_off(backoff: &mut Duration, stop: &AtomicBool) {
    sleep_unless_stopped(*backoff, stop);
    *backoff = (*backoff * 2).min(Duration::from_secs(10));
}

/// Sleeps `d`, or less once `stop` is set: a shutdown never waits out a reconnect backoff
/// (up to 10 s).
fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(STOP_POLL));
    }
}

fn listen_loop(url: &str, wake: &Notify, stop: &AtomicBool) {
    let me = format!(
        "herald-listen-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let with_keepalive = crate::storage::pg_url_with_keepalive(url);
    // The server's end keeps the same watch (see `ServerKeepalive`).
    let server_side = crate::storage::ServerKeepalive::of_url(&with_keepalive);
    let mut backoff = Duration::from_millis(200);
    while !stop.load(Ordering::Relaxed) {
        let listening = PgConnection::establish(&with_keepalive)
            .ok()
            .and_then(|mut c| {
                server_side.apply(&mut c);
                // Listening before registering: while registered, nothing is missed.
                c.batch_execute(&format!(
                    "SET application_name = '{APPLICATION_NAME}'; LISTEN herald_outbox"
                ))
                .ok()
                .filter(|_| register(&mut c, &me))
                .map(|_| c)
            });
        let mut conn = match listening {
            Some(c) => c,
            None => {
                warn!("LISTEN connection failed; polling only until it is back");
                back_off(&mut backoff, stop);
                continue;
            }
        };
        info!("listening for herald_outbox notifications");
        backoff = Duration::from_millis(200);
        // Something may have been committed while we were not listening.
        wake.notify_one();
        let mut last_check = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let mut got = false;
            let mut broken = false;
            for n in conn.notifications_iter() {
                match n {
                    Ok(_) => got = true,
                    Err(_) => {
                        broken = true;
                        break;
                    }
                }
            }
            if got {
                wake.notify_one();
            }
            if !broken && last_check.elapsed() >= CHECK_EVERY {
                broken = !register(&mut conn, &me);
                last_check = Instant::now();
            }
            if broken {
                warn!("LISTEN connection lost; reconnecting");
                break;
            }
            std::thread::sleep(DRAIN_EVERY);
        }
        if stop.load(Ordering::Relaxed) {
            unregister(&mut conn, &me);
        }
    }
}
