//! SQLite's counterpart of PostgreSQL's LISTEN/NOTIFY: a look, on a connection of its own,
//! whether a row worth waking the sender for was committed since the last look — by an
//! application's own transaction (the outbox's first way in), a script, or Herald itself.
//!
//! SQLite has no notifications between processes, so the look is cheap instead: one statement
//! over the rows added since the last look (`id` is the rowid, and `AUTOINCREMENT` never hands
//! out an id again, so they are the rows whose id is above the largest seen: with none, one seek
//! in the table's b-tree). SQLite has one writer at a time and an id is taken inside its writing
//! transaction, so rows become visible in id order: none can appear below the largest seen.
//!
//! Worth waking for means what the PostgreSQL trigger notifies for (migration 000019): a row due
//! within a second of `now` (the second covers a commit a moment after the insert), or a keyed
//! row waiting behind its key's head (the sender then releases the key). A row scheduled for
//! later is the periodic claim's, and an outcome or a claim adds no row: neither wakes anyone.
//!
//! A row an application inserts with an id of its own choosing, below the largest seen, is not
//! seen: the periodic claim finds it.
//!
//! When to look: every commit appends to the database's WAL file, so on Linux the watch waits for
//! the kernel to say that file was written (inotify on the WAL beside the file a symbolic link
//! leads to, one write reported at a time), and an idle database costs nothing. Elsewhere, for
//! a `file:` URI, or where inotify cannot be had (its per-user limits), it looks every
//! [`POLL_EVERY`], and tries for inotify again now and then
//! ([`InsertWatch::try_file_events_again`]).

use std::time::Duration;

use crate::storage::sqlite_time::SqliteTime;
use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Nullable};
use diesel::sqlite::SqliteConnection;
use diesel::{QueryResult, RunQueryDsl};

use super::StorageError;
use super::prepared::cached_const;

/// The largest id now: one seek down the table's b-tree (one aggregate, so SQLite's `max`
/// shortcut applies), where [`ADDED_SQL`] from 0 would read every row.
const NEWEST_SQL: &str = "SELECT max(id) AS newest FROM herald_outbox";

/// The rows added since the last look: the largest id among them, and whether one is worth a
/// wake-up. One range scan of the rowid from the largest id seen.
const ADDED_SQL: &str = "SELECT max(id) AS newest, \
     max(next_attempt_at <= ?2 \
         OR (next_attempt_at IS NULL AND ordering_key IS NOT NULL AND state = 'scheduled')) AS due \
     FROM herald_outbox WHERE id > ?1";

#[derive(diesel::QueryableByName)]
struct Newest {
    #[diesel(sql_type = Nullable<BigInt>)]
    newest: Option<i64>,
}

#[derive(diesel::QueryableByName)]
struct Added {
    #[diesel(sql_type = Nullable<BigInt>)]
    newest: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    due: Option<i64>,
}

/// How often a watch without file events looks.
pub const POLL_EVERY: Duration = Duration::from_millis(10);

/// A watch on one SQLite database's outbox; see the module docs.
pub struct InsertWatch {
    conn: SqliteConnection,
    newest: i64,
    /// The WAL file's writes, where the system reports them; else why not.
    writes: Result<wal_writes::WalWrites, String>,
    /// The database's path, where file events were asked for (to try them again).
    asked: Option<std::path::PathBuf>,
}

impl InsertWatch {
    /// Opens the watch on the database at `path` (a file path, as `Db::connect` takes it from
    /// the URL), taking its bearings: what is there now does not count as added. `file_events`:
    /// wait for the WAL file's writes where the system reports them (false: look every
    /// [`POLL_EVERY`], as where it does not).
    pub fn open(path: &str, file_events: bool) -> Result<InsertWatch, StorageError> {
        // Watching from before the bearings are taken: no commit falls between the two.
        let asked = file_events.then(|| std::path::PathBuf::from(path));
        let writes = match &asked {
            Some(path) => file_writes(path),
            None => Err("not asked for".to_owned()),
        };
        let mut conn = super::side_connection(path)?;
        let newest = cached_const!(NEWEST_SQL)
            .get_result::<Newest>(&mut conn)?
            .newest
            .unwrap_or(0);
        Ok(InsertWatch {
            conn,
            newest,
            writes,
            asked,
        })
    }

    /// Without file events although they were asked for, tries to get them again, keeping the
    /// watch's bearings: the system's limit on inotify instances may have been reached when the
    /// watch opened and freed since, or the WAL file not have been there yet. Whether it has
    /// them now. What is committed while it tries is seen at the next look, as before.
    pub fn try_file_events_again(&mut self) -> bool {
        if self.writes.is_ok() {
            return true;
        }
        let Some(path) = &self.asked else {
            return false;
        };
        self.writes = file_writes(path);
        self.writes.is_ok()
    }

    /// Whether it waits for the WAL file's writes (else it looks every [`POLL_EVERY`]).
    pub fn has_file_events(&self) -> bool {
        self.writes.is_ok()
    }

    /// Why it has no file events (the system's error, say `Too many open files`), if it has none.
    pub fn no_file_events_because(&self) -> Option<&str> {
        self.writes.as_ref().err().map(String::as_str)
    }

    /// Waits until something may have been committed, at most `at_most`: the WAL file was
    /// written (true; its commit may not be visible yet: the sync comes after the write), or
    /// the time is up (false). Without file events it waits [`POLL_EVERY`], whatever
    /// `at_most`, and says true. An error means the file events stopped (the directory went
    /// away, say): open the watch again.
    pub fn wait(&mut self, at_most: Duration) -> Result<bool, StorageError> {
        match &mut self.writes {
            Ok(w) => w
                .wait(at_most)
                .map_err(|e| StorageError::Unavailable(Box::new(e))),
            Err(_) => {
                std::thread::sleep(POLL_EVERY);
                Ok(true)
            }
        }
    }

    /// Whether, since the last look, some connection committed a row due by `now` (within a
    /// second) or a keyed row waiting behind its key's head.
    pub fn look(&mut self, now: DateTime<Utc>) -> Result<bool, StorageError> {
        let added = added(&mut self.conn, self.newest, now)?;
        if let Some(newest) = added.newest {
            self.newest = self.newest.max(newest);
        }
        Ok(added.due.unwrap_or(0) != 0)
    }
}

/// The system's reports of writes to the WAL file of the database at `path`; else why not.
fn file_writes(path: &std::path::Path) -> Result<wal_writes::WalWrites, String> {
    wal_writes::WalWrites::open(path).map_err(|e| e.to_string())
}

fn added(conn: &mut SqliteConnection, above: i64, now: DateTime<Utc>) -> QueryResult<Added> {
    cached_const!(ADDED_SQL)
        .bind::<BigInt, _>(above)
        .bind::<SqliteTime, _>(now + chrono::Duration::seconds(1))
        .get_result::<Added>(conn)
}

/// The WAL file's writes, as inotify reports them (Linux).
#[cfg(target_os = "linux")]
mod wal_writes {
    use std::ffi::CString;
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::time::Duration;

    /// A one-shot inotify watch on the database's WAL file, armed again as soon as it has
    /// reported: under load the WAL is written tens of thousands of times a second, and only the
    /// first write after a report needs one (a watch that stays makes the kernel queue, or
    /// merge, an event at every write, in the writer's time). The WAL is there as long as a
    /// connection is open (Herald's pool keeps some); if it goes, arming fails and the watch is
    /// opened again.
    pub struct WalWrites {
        fd: OwnedFd,
        wal: CString,
        buf: Vec<u8>,
        /// Whether the one-shot watch is in place (nothing read since it was armed).
        armed: bool,
    }

    /// An event's fixed part: `wd`, `mask`, `cookie`, `len`, each 4 bytes; a name of `len`
    /// bytes follows (none for a watch on a file).
    const HEADER: usize = 16;

    impl WalWrites {
        pub fn open(db: &Path) -> io::Result<WalWrites> {
            if db.as_os_str().as_bytes().starts_with(b"file:") {
                return Err(io::Error::other(
                    "a file: URI (its WAL file's name is not worked out here)",
                ));
            }
            // SQLite keeps the WAL beside the file a symbolic link leads to.
            let mut wal = std::fs::canonicalize(db)?.into_os_string();
            wal.push("-wal");
            let wal = CString::new(wal.as_bytes())?;
            // SAFETY: no pointer is passed; the result is a new descriptor or -1.
            let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `fd` was just opened and nothing else owns it.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let mut w = WalWrites {
                fd,
                wal,
                buf: vec![0; 4096],
                armed: false,
            };
            w.arm()?;
            Ok(w)
        }

        /// Puts the one-shot watch in place (again); fails when the WAL file is gone.
        fn arm(&mut self) -> io::Result<()> {
            // SAFETY: `wal` is a NUL-terminated string that outlives the call.
            let wd = unsafe {
                libc::inotify_add_watch(
                    self.fd.as_raw_fd(),
                    self.wal.as_ptr(),
                    libc::IN_MODIFY | libc::IN_ONESHOT,
                )
            };
            if wd < 0 {
                return Err(io::Error::last_os_error());
            }
            self.armed = true;
            Ok(())
        }

        /// Waits at most `at_most` for the WAL file to be written (or for events to be lost:
        /// the queue overflowed); whether it was. Armed again before it returns, so that the
        /// next write is reported to the next wait.
        pub fn wait(&mut self, at_most: Duration) -> io::Result<bool> {
            let until = std::time::Instant::now() + at_most;
            loop {
                if !self.armed {
                    self.arm()?;
                }
                let left = until.saturating_duration_since(std::time::Instant::now());
                if self.ready(left)? {
                    let written = self.drain()?;
                    if !self.armed {
                        self.arm()?;
                    }
                    if written {
                        return Ok(true);
                    }
                }
                if left.is_zero() {
                    return Ok(false);
                }
            }
        }

        /// Whether events are there to read, waiting at most `at_most`.
        fn ready(&self, at_most: Duration) -> io::Result<bool> {
            let mut ready = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // Rounded up: a wait of less than a millisecond is not a busy loop.
            let ms = i32::try_from(at_most.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
            // SAFETY: one valid `pollfd`, for the length given.
            let n = unsafe { libc::poll(&mut ready, 1, ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                return if e.kind() == io::ErrorKind::Interrupted {
                    Ok(false)
                } else {
                    Err(e)
                };
            }
            Ok(n > 0)
        }

        /// Reads every event queued; whether one was a write (or the queue overflowed). Any
        /// event means the one-shot watch is gone (a write's, and the IN_IGNORED that follows).
        fn drain(&mut self) -> io::Result<bool> {
            let mut written = false;
            loop {
                // SAFETY: `buf` is valid for writes of its length.
                let got = unsafe {
                    libc::read(
                        self.fd.as_raw_fd(),
                        self.buf.as_mut_ptr().cast(),
                        self.buf.len(),
                    )
                };
                if got < 0 {
                    let e = io::Error::last_os_error();
                    match e.kind() {
                        io::ErrorKind::WouldBlock => break,
                        io::ErrorKind::Interrupted => continue,
                        _ => return Err(e),
                    }
                }
                let got = got as usize;
                if got == 0 {
                    break;
                }
                let mut at = 0;
                while at + HEADER <= got {
                    let word = |i: usize| {
                        let b = &self.buf[at + i..at + i + 4];
                        u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
                    };
                    let (mask, len) = (word(4), word(12) as usize);
                    self.armed = false;
                    if mask & (libc::IN_MODIFY | libc::IN_Q_OVERFLOW) != 0 {
                        written = true;
                    }
                    at = (at + HEADER + len).min(got);
                }
            }
            Ok(written)
        }
    }
}

/// No file events outside Linux: the watch looks every [`POLL_EVERY`].
#[cfg(not(target_os = "linux"))]
mod wal_writes {
    use std::io;
    use std::path::Path;
    use std::time::Duration;

    pub enum WalWrites {}

    impl WalWrites {
        pub fn open(_db: &Path) -> io::Result<WalWrites> {
            Err(io::Error::from(io::ErrorKind::Unsupported))
        }

        pub fn wait(&mut self, _at_most: Duration) -> io::Result<bool> {
            match *self {}
        }
    }
}
