//! Storage: the only module that speaks SQL.
//!
//! Two typed r2d2 pools (PostgreSQL, SQLite), chosen from the URL scheme. Query bodies that are
//! the same on both backends are written once in [`queries`] and compiled once per backend
//! against that backend's schema; where the SQL differs (the claim) each backend has its own arm.
//!
//! SQLite: WAL, `busy_timeout`, `synchronous=FULL` (an acknowledged write survives power loss),
//! and every write transaction is `BEGIN IMMEDIATE` behind one in-process writer lock.

pub mod admin;
pub mod attempts;
pub mod endpoints;
pub mod fanout;
pub mod group_commit;
pub mod models;
pub mod ordering;
pub mod outbox;
pub mod payload;
pub(crate) mod prepared;
pub mod queries;
pub mod receipts;
pub mod retention;
pub mod retry_policies;
pub mod settings;
pub(crate) mod sql;
pub mod sqlite_time;
pub mod stats;
pub mod support;
pub mod watch;
#[rustfmt::skip]
pub mod schema_pg;
#[rustfmt::skip]
pub mod schema_sqlite;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::RunQueryDsl;
use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool, PooledConnection};
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sqlite::SqliteConnection;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

pub const PG_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");
pub const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

/// The PostgreSQL pool, with the last connection error of its connections that no wait changes
/// ([`Db::first_connection`]).
#[derive(Clone)]
pub struct PgPool {
    pool: Pool<PgManager>,
    refused: Refusal,
}

impl std::ops::Deref for PgPool {
    type Target = Pool<PgManager>;

    fn deref(&self) -> &Pool<PgManager> {
        &self.pool
    }
}

/// The last connection error of a [`PgManager`]'s, and whether no wait changes it
/// ([`refused_for_good`]). Read only at start ([`Db::first_connection`]): never cleared.
type Refusal = Arc<Mutex<Option<(String, bool)>>>;
pub type SqlitePool = Pool<ConnectionManager<SqliteConnection>>;

/// A storage failure. `Unavailable` means "try again later" (503 + Retry-After at the edge).
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("database unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("database query failed")]
    Query(#[source] DieselError),
    #[error("database migration failed: {0}")]
    Migration(String),
    #[error("unsupported database URL {0:?}: use sqlite://PATH or postgres://…")]
    BadUrl(String),
    /// PostgreSQL refused Herald's connection for a reason no wait changes
    /// ([`refused_for_good`]): found by [`Db::first_connection`].
    #[error("the database refused the connection: {0}")]
    Refused(String),
}

impl StorageError {
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StorageError::Unavailable(_))
    }

    /// What went wrong, safe to log: the kind, constraint and table — never the values (a
    /// PostgreSQL error detail can quote a whole row, payload and addresses included).
    pub fn log_safe(&self) -> String {
        match self {
            StorageError::Query(DieselError::DatabaseError(kind, info)) => format!(
                "{kind:?} on {}.{}",
                info.table_name().unwrap_or("?"),
                info.constraint_name().unwrap_or("?")
            ),
            StorageError::Query(e) => match e {
                DieselError::NotFound => "row not found".into(),
                DieselError::DeserializationError(_) => "a stored value could not be read".into(),
                DieselError::SerializationError(_) => "a value could not be written".into(),
                _ => "query failed".into(),
            },
            StorageError::Unavailable(_) => "database unavailable".into(),
            StorageError::Migration(m) => format!("migration failed: {m}"),
            StorageError::BadUrl(u) => format!("bad database URL {u}"),
            StorageError::Refused(why) => format!("refused by the database: {why}"),
        }
    }
}

impl From<DieselError> for StorageError {
    fn from(e: DieselError) -> Self {
        if is_unavailable(&e) {
            StorageError::Unavailable(Box::new(e))
        } else {
            StorageError::Query(e)
        }
    }
}

impl From<r2d2::Error> for StorageError {
    fn from(e: r2d2::Error) -> Self {
        // No connection could be had: refused, too many connections (53300), starting up or
        // shutting down (57P03), timed out waiting for the pool.
        StorageError::Unavailable(Box::new(e))
    }
}

/// Whether an error means "the database is not usable right now, try again" rather than "this
/// query is wrong". PostgreSQL: by the error's kind, which diesel derives from the SQLSTATE —
/// class 08 (connection exception) and any error after which the connection is gone (57P01
/// admin shutdown, 57P02 crash shutdown: the server ends the session) are `ClosedConnection` or
/// `UnableToSendCommand`; 40001 is `SerializationFailure` (retryable); 25006 is
/// `ReadOnlyTransaction` (a standby after a failover). Never by message text, which follows the
/// server's `lc_messages`. SQLite has no SQLSTATE: its fixed (never translated) result strings for
/// SQLITE_BUSY and SQLITE_LOCKED are what it gives.
fn is_unavailable(e: &DieselError) -> bool {
    match e {
        DieselError::DatabaseError(kind, info) => match kind {
            DatabaseErrorKind::ClosedConnection
            | DatabaseErrorKind::UnableToSendCommand
            | DatabaseErrorKind::SerializationFailure
            | DatabaseErrorKind::ReadOnlyTransaction => true,
            DatabaseErrorKind::Unknown => is_sqlite_busy(info.message()),
            _ => false,
        },
        _ => false,
    }
}

/// SQLite's own strings for SQLITE_BUSY and SQLITE_LOCKED (`sqlite3_errstr`).
fn is_sqlite_busy(message: &str) -> bool {
    matches!(
        message,
        "database is locked" | "database table is locked" | "database is busy"
    )
}

/// diesel's PostgreSQL connection manager, whose connection errors never quote the URL's
/// password. libpq's do: `invalid percent-encoded token: "ab%zz9"` for a password with a raw `%`,
/// or a host name made of a piece of a password with an unencoded `@` or `/`; and r2d2 carries
/// that text into the error `herald serve` and `herald migrate` print when they stop.
pub struct PgManager {
    inner: ConnectionManager<PgConnection>,
    secrets: UrlSecrets,
    server_side: ServerKeepalive,
    refused: Refusal,
}

impl PgManager {
    fn new(url: &str, idle_in_transaction: Duration) -> Self {
        let url = pg_url_with_keepalive(url);
        let mut server_side = ServerKeepalive::of_url(&url);
        // 0: left as the server has it (behind a pooler in transaction mode, whose server
        // connections other clients share).
        let ms = u32::try_from(idle_in_transaction.as_millis()).unwrap_or(i32::MAX as u32);
        if ms > 0 {
            server_side = server_side.with("idle_in_transaction_session_timeout", ms);
        }
        Self {
            server_side,
            inner: ConnectionManager::new(url.clone()),
            secrets: url_secrets(&url),
            refused: Refusal::default(),
        }
    }
}

/// libpq's text on one line (it adds a line with a hint, and ends with a line break): a start-up
/// failure is one line, as is each logged error.
fn one_line(text: &str) -> String {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether a connection error is one that no wait changes: the server's refusal of the user,
/// the password or the database (`FATAL:  password authentication failed`, `… does not exist`,
/// `no pg_hba.conf entry`, `… is not permitted to log in`), or a URL libpq cannot use (`invalid
/// sslmode value`, SSL required of a server without it). Read from libpq's English text: one
/// in another language (the server's `lc_messages`) is not recognized and is waited for as any
/// other (the pool's connection timeout), as is every other error — a refused or unanswered
/// connection, a server starting up or shutting down, too many clients: those pass.
fn refused_for_good(message: &str) -> bool {
    const FOR_GOOD: [&str; 8] = [
        "password authentication failed",
        "authentication failed for user",
        "no pg_hba.conf entry",
        "is not permitted to log in",
        "permission denied for database",
        "server does not support SSL",
        "no password supplied",
        "SCRAM authentication requires libpq",
    ];
    let fatal_missing = message.contains("FATAL:")
        && (message.contains("database \"") || message.contains("role \""))
        && message.contains("does not exist");
    fatal_missing || FOR_GOOD.iter().any(|f| message.contains(f)) || message.starts_with("invalid ")
}

/// The server's end of each of Herald's sessions keeps the watch the URL sets for Herald's end:
/// `keepalives_idle`, `keepalives_interval`, `keepalives_count` and `tcp_user_timeout` (libpq's,
/// with [`PG_KEEPALIVE_DEFAULTS`]) set the session's `tcp_keepalives_idle`,
/// `tcp_keepalives_interval`, `tcp_keepalives_count` and `tcp_user_timeout` — each only where
/// nothing else set it (`postgresql.conf`, `ALTER ROLE` or `ALTER DATABASE … SET`, the URL's
/// `options`: what the server reports as its default).
///
/// Why: when Herald gives up on a connection across a network partition, the server's session
/// of it lives on, in the middle of whatever it was doing — a claim not yet committed holding
/// its rows, a group of receipts holding their keys — and nothing reaches it to say the client
/// has gone: it waits for a next command. The server's own keepalive probes are what end it,
/// and by the system's defaults the first goes after two hours. Meanwhile the claimed rows are
/// skipped by every other claim, a provider's retry of those receipts waits on their keys, and
/// each such session holds a connection slot. With the same watch as the client's, the server
/// finds such a session gone within about 15 s by default (the drill
/// `drills::network_partition_while_sending_and_ingesting`).
///
/// Best effort: where the statement fails (a server or pooler without these settings), the
/// connection is used as it is, and a warning says so.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerKeepalive(Vec<(&'static str, u32)>);

impl ServerKeepalive {
    /// Read from a `postgres://` URL's query (after [`pg_url_with_keepalive`]): the client's
    /// keepalive settings unless its `keepalives` is a number that is 0 (as libpq reads it),
    /// and its `tcp_user_timeout`; each only when a whole number from 1 to the server's
    /// limit, 2³¹ − 1 (`0` leaves the system's default, on both ends).
    pub fn of_url(url: &str) -> Self {
        let params = pg_url_params(url);
        let value = |name: &str| params.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v);
        let keepalives = value("keepalives").is_none_or(|v| v.trim().parse::<i64>() != Ok(0));
        let mut settings = Vec::new();
        for (client, server, only_with_keepalives) in [
            ("keepalives_idle", "tcp_keepalives_idle", true),
            ("keepalives_interval", "tcp_keepalives_interval", true),
            ("keepalives_count", "tcp_keepalives_count", true),
            ("tcp_user_timeout", "tcp_user_timeout", false),
        ] {
            if only_with_keepalives && !keepalives {
                continue;
            }
            if let Some(n) = value(client)
                .and_then(|v| v.trim().parse::<u32>().ok())
                .filter(|n| (1..=i32::MAX as u32).contains(n))
            {
                settings.push((server, n));
            }
        }
        ServerKeepalive(settings)
    }

    /// These settings and `name` = `value`.
    pub fn with(mut self, name: &'static str, value: u32) -> Self {
        self.0.push((name, value));
        self
    }

    /// The settings, as (the server's name, its value).
    pub fn settings(&self) -> &[(&'static str, u32)] {
        &self.0
    }

    /// The statement that sets them where the server reports them at their default (a setting
    /// the server does not have, `tcp_user_timeout` before PostgreSQL 12, is passed over); a
    /// plain statement, no parameters (the names are Herald's, the values numbers). `None`:
    /// nothing to set.
    pub fn statement(&self) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        let values: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| format!("('{k}', '{v}')"))
            .collect();
        Some(format!(
            "SELECT set_config(d.name, d.value, false) FROM (VALUES {}) AS d(name, value) \
             JOIN pg_settings AS s ON s.name = d.name WHERE s.source = 'default'",
            values.join(", ")
        ))
    }

    /// Runs [`ServerKeepalive::statement`] on `conn`; where it fails, warns (the kind of error
    /// only) and leaves the session as it is.
    pub fn apply(&self, conn: &mut PgConnection) {
        use diesel::connection::SimpleConnection;
        let Some(statement) = self.statement() else {
            return;
        };
        if let Err(e) = conn.batch_execute(&statement) {
            tracing::warn!(
                reason = %StorageError::from(e).log_safe(),
                "could not set the server's keepalive for this database session; its end keeps the server's own settings"
            );
        }
    }
}

/// How long the server lets one of Herald's sessions sit idle inside a transaction before it
/// ends it (`idle_in_transaction_session_timeout`, set like the keepalives, where the server,
/// database or role leaves it at its default): a Herald transaction never waits on anything but
/// its own statements (no network call inside one), so a session idle in one for this long is
/// a process that stopped (`SIGSTOP`, `docker pause`, a VM stall, a debugger) holding what its
/// claim locked — a key's due head, which every other claim then skips, and the key's row, on
/// which the application's inserts into that key wait. Without it, they wait as long as the
/// process stays stopped; the lease does not help, since nothing was committed. Its connection
/// fails its next statement and the pool replaces it (a walk-through found the stop).
pub const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(10);

/// libpq's TCP settings Herald adds to a `postgres://` URL that does not set them itself: a
/// connection whose peer vanished without a word (a failover, a network partition, a NAT that
/// forgot it) fails within about 15 s, and the pool replaces it, instead of waiting for an
/// answer for ever (with the system's defaults, the first keepalive probe goes after two
/// hours). The user timeout ends a connection whose sent request is not acknowledged for 15 s;
/// keepalive probes start after 10 s of silence on one that waits for an answer, and once one
/// is out, the user timeout decides on Linux: it ends 15 s after the last thing it heard
/// (`keepalives_count` counts only where the user timeout is 0). Neither fires on a healthy
/// connection to a busy server: the server's system acknowledges and answers probes whatever
/// PostgreSQL is doing. Unix-socket connections ignore them. Measured by hand (a 90 s partition
/// under a request every 200 ms, `scripts/partition-by-hand`): requests sent during it were
/// answered after 7.7 s (median) and 20.2–20.3 s at most with these values, 20.8 s and 65.4 s
/// with the earlier 60 s user timeout and 30 s idle.
pub const PG_KEEPALIVE_DEFAULTS: [(&str, &str); 5] = [
    ("keepalives", "1"),
    ("keepalives_idle", "10"),
    ("keepalives_interval", "5"),
    ("keepalives_count", "3"),
    ("tcp_user_timeout", "15000"),
];

/// `url` with each of [`PG_KEEPALIVE_DEFAULTS`] its query string does not name already,
/// appended: the URL's own text is kept as it is.
pub fn pg_url_with_keepalive(url: &str) -> String {
    let query = pg_query_start(url).map(|q| &url[q + 1..]);
    let named: Vec<String> = pg_url_params(url).into_iter().map(|(k, _)| k).collect();
    let added: Vec<String> = PG_KEEPALIVE_DEFAULTS
        .iter()
        .filter(|(k, _)| !named.iter().any(|n| n == k))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if added.is_empty() {
        return url.to_owned();
    }
    let joint = match query {
        None => "?",
        Some(q) if q.is_empty() || q.ends_with('&') => "",
        Some(_) => "&",
    };
    format!("{url}{joint}{}", added.join("&"))
}

/// A `postgres://` URL's query parameters, in order, keys and values `%XX`-decoded as libpq
/// decodes them (a key without `=` has an empty value).
fn pg_url_params(url: &str) -> Vec<(String, String)> {
    let Some(q) = pg_query_start(url) else {
        return Vec::new();
    };
    url[q + 1..]
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decoded(k), percent_decoded(v))
        })
        .collect()
}

/// Where a `postgres://` URL's query string starts (its `?`), read as libpq reads it: a user
/// and password run to the first `@` or `/` after the scheme, so a `?` in a password does not
/// start the query.
fn pg_query_start(url: &str) -> Option<usize> {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[after_scheme..];
    let host = match rest.find(['@', '/']) {
        Some(i) if rest.as_bytes()[i] == b'@' => after_scheme + i + 1,
        _ => after_scheme,
    };
    url[host..].find('?').map(|i| host + i)
}

/// `%XX` decoded, as libpq decodes a query key; anything malformed is kept as written.
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Never the URL nor its password.
impl std::fmt::Debug for PgManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PgManager(..)")
    }
}

impl r2d2::ManageConnection for PgManager {
    type Connection = PgConnection;
    type Error = diesel::r2d2::Error;

    fn connect(&self) -> Result<PgConnection, Self::Error> {
        let mut conn = self.inner.connect().map_err(|e| match e {
            diesel::r2d2::Error::ConnectionError(c) => {
                let text = one_line(&redact(&c.to_string(), &self.secrets));
                *self.refused.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((text.clone(), refused_for_good(&text)));
                diesel::r2d2::Error::ConnectionError(diesel::ConnectionError::BadConnection(text))
            }
            other => other,
        })?;
        self.server_side.apply(&mut conn);
        Ok(conn)
    }

    fn is_valid(&self, conn: &mut PgConnection) -> Result<(), Self::Error> {
        self.inner.is_valid(conn)
    }

    fn has_broken(&self, conn: &mut PgConnection) -> bool {
        self.inner.has_broken(conn)
    }
}

/// What of a database URL must never be shown: each password it holds — after the user in its
/// userinfo, or a `password=` parameter (libpq takes one in a URI's query, and a string with
/// no `@` may be keyword/value text) — as written, and each piece of it between URL
/// delimiters, since libpq splits a password with an unencoded `@` or `/` there and quotes a
/// piece (`"CRET@127.0.0.1"`) as a host name. Longest first.
fn url_secrets(url: &str) -> UrlSecrets {
    let mut passwords: Vec<&str> = Vec::new();
    if let Some((_, rest)) = url.split_once("://")
        && let Some((userinfo, _)) = rest.rsplit_once('@')
        && let Some((_, password)) = userinfo.split_once(':')
    {
        passwords.push(password);
    }
    let lower = url.to_ascii_lowercase();
    for (at, key) in lower.match_indices("password=") {
        let value = &url[at + key.len()..];
        // A keyword/value string may single-quote a value with spaces.
        let value = match value.strip_prefix('\'') {
            Some(quoted) => &quoted[..quoted.find('\'').unwrap_or(quoted.len())],
            None => {
                &value[..value
                    .find(|c: char| c == '&' || c.is_whitespace())
                    .unwrap_or(value.len())]
            }
        };
        passwords.push(value);
    }
    let mut secrets = UrlSecrets::default();
    for password in passwords.into_iter().filter(|p| !p.is_empty()) {
        secrets.passwords.push(password.to_owned());
        secrets.pieces.extend(
            password
                .split(['@', '/', ':', '?', '#'])
                .filter(|p| !p.is_empty())
                .map(str::to_owned),
        );
    }
    for list in [&mut secrets.passwords, &mut secrets.pieces] {
        list.sort_by_key(|s| std::cmp::Reverse(s.len()));
        list.dedup();
    }
    secrets
}

/// The passwords a database URL holds, and their pieces between URL delimiters.
#[derive(Debug, Default)]
struct UrlSecrets {
    passwords: Vec<String>,
    pieces: Vec<String>,
}

impl UrlSecrets {
    /// Whether a value libpq quoted is (or starts with) a password or a piece of one: the piece
    /// itself, a piece with what followed it in the URL (`"CRET@127.0.0.1"`), or anything
    /// holding a password or a piece of three characters or more. A short piece (`p` of
    /// `p@ssw0rd`) inside another word is not: `role "postgres"` stays readable.
    fn in_quoted(&self, value: &str) -> bool {
        self.passwords.iter().any(|p| value.contains(p.as_str()))
            || self.pieces.iter().any(|p| {
                value == p
                    || value
                        .strip_prefix(p.as_str())
                        .is_some_and(|rest| rest.starts_with(['@', '/', ':', '?', '#']))
                    || (p.chars().count() >= 3 && value.contains(p.as_str()))
            })
    }
}

/// `text` without the URL's secrets: every double-quoted value that holds one
/// ([`UrlSecrets::in_quoted`]) is replaced whole by `"…"` (libpq quotes the value it could not
/// use, a piece of the password with what follows it), then each password, whatever its
/// length, and each piece of three characters or more by `…` wherever it still stands.
fn redact(text: &str, secrets: &UrlSecrets) -> String {
    if secrets.passwords.is_empty() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut parts = text.split('"');
    out.push_str(parts.next().unwrap_or_default());
    let rest: Vec<&str> = parts.collect();
    for (i, part) in rest.iter().enumerate() {
        out.push('"');
        // Odd parts are inside quotes, when a closing quote follows.
        let quoted = i % 2 == 0 && i + 1 < rest.len();
        if quoted && secrets.in_quoted(part) {
            out.push('…');
        } else {
            out.push_str(part);
        }
    }
    let out = secrets
        .passwords
        .iter()
        .fold(out, |t, s| t.replace(s.as_str(), "…"));
    secrets
        .pieces
        .iter()
        .filter(|s| s.chars().count() >= 3)
        .fold(out, |t, s| t.replace(s.as_str(), "…"))
}

/// What an unsupported database URL is shown as: its scheme only (`mysql://…`), never the rest,
/// which may carry a password — nor the whole text when it has no `://` (a libpq
/// `host=… password=…` string, a URL whose scheme was forgotten).
fn url_shape(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, _))
            if !scheme.is_empty()
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')) =>
        {
            format!("{scheme}://…")
        }
        _ => "(not a URL)".to_owned(),
    }
}

/// Which backend a [`Db`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// A handle on the database: cheap to clone.
#[derive(Clone)]
pub enum Db {
    Pg(PgPool),
    Sqlite(SqliteDb),
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Db({:?})", self.backend())
    }
}

/// SQLite pool plus the single-writer lock, and the [`Checkpointer`].
#[derive(Clone)]
pub struct SqliteDb {
    pub pool: SqlitePool,
    writer: Arc<Mutex<()>>,
    checkpointer: Arc<Checkpointer>,
    own_writes: OwnWrites,
    /// Last, so that the last handle's drop signals only after its pool and checkpointer have
    /// closed their connections (fields drop in declaration order).
    closing: Arc<Closing>,
}

/// Signals [`Closed`] when dropped: the last handle on a SQLite database is gone.
#[derive(Default)]
struct Closing(Arc<(Mutex<bool>, std::sync::Condvar)>);

impl Drop for Closing {
    fn drop(&mut self) {
        let (done, signal) = &*self.0;
        *done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        signal.notify_all();
    }
}

/// Waits until every handle on a SQLite database has been dropped, wherever it was, and with the
/// last its connections closed. The last connection to close checkpoints the WAL into the
/// database file and removes the `-wal` and `-shm` files; a process that exits before then (a
/// thread still dropping its handle) leaves them, and the database file alone is not the whole
/// database until the next open. See [`Db::closed`].
pub struct Closed(Arc<(Mutex<bool>, std::sync::Condvar)>);

impl Closed {
    /// Whether the last handle was dropped within `within`.
    pub fn wait(&self, within: Duration) -> bool {
        let (done, signal) = &*self.0;
        let done = done.lock().unwrap_or_else(|p| p.into_inner());
        let (done, _) = signal
            .wait_timeout_while(done, within, |d| !*d)
            .unwrap_or_else(|p| p.into_inner());
        *done
    }
}

/// How many write transactions this process's handles on one SQLite database have begun (taken
/// the writer lock for), whether they wrote anything or not: the insert watch tells a stretch of
/// Herald's own commits by it.
#[derive(Debug, Clone, Default)]
pub struct OwnWrites(Arc<std::sync::atomic::AtomicU64>);

impl OwnWrites {
    pub fn count(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Every SQLite connection's settings. `wal_autocheckpoint` is the writers' own checkpoint,
/// behind the [`Checkpointer`]: a commit that brings the WAL to this many pages checkpoints
/// itself, holding the writer lock, and once that has copied everything the next write starts
/// the WAL again from its beginning (the file keeps its size: about 2,000 pages and that
/// commit's, some 8 MiB). Under steady writes this is how the WAL comes back to its beginning —
/// a passive checkpoint beside the writes never finds all of it copied when the next write
/// begins — but the thread has copied all but its last pass's pages by then. A reader that
/// still needs older pages holds the WAL longer, as with SQLite's default. Measured with 10,000
/// too: no faster, and a WAL of 40 MiB. `journal_size_limit`: when the WAL starts again, a file
/// left larger than 16 MiB by a burst (a bulk insert, a long reader) is cut back to that, rather
/// than kept at its largest until the last connection closes; the steady 8 MiB is left alone.
/// Each connection sets its lock wait (5 s) first, so that it also bounds these statements' own.
const SQLITE_PRAGMAS: &str = "PRAGMA journal_mode = WAL; \
     PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA wal_autocheckpoint = 2000; \
     PRAGMA journal_size_limit = 16777216;";

/// How long a statement waits for SQLite's writer (another process's) before "database is
/// locked": a connection's, set again after the migrations' longer wait.
const SQLITE_BUSY_TIMEOUT: &str = "PRAGMA busy_timeout = 5000";

#[derive(Debug)]
struct SqlitePragmas;

impl CustomizeConnection<SqliteConnection, diesel::r2d2::Error> for SqlitePragmas {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), diesel::r2d2::Error> {
        conn.batch_execute(&format!("{SQLITE_BUSY_TIMEOUT}; {SQLITE_PRAGMAS}"))
            .map_err(diesel::r2d2::Error::QueryError)
    }
}

/// Sets SQLite's library-wide options for a process whose every connection is used by one thread
/// at a time (Herald's: pooled connections, and side connections each owned by its thread): no
/// mutex on each call into a connection or statement (`SQLITE_CONFIG_MULTITHREAD`; the bundled
/// library is built serialized), and no global count of allocated memory
/// (`SQLITE_CONFIG_MEMSTATUS` off: the count takes a global mutex at every allocation). SQLite
/// takes them only before its first connection is opened, so `herald` calls this first thing in
/// `main`, while it has one thread; whether it took them is [`sqlite_threading`]. Not for a
/// library user whose process may use a connection from two threads at once.
///
/// # Safety
/// No other thread may be calling into SQLite meanwhile (SQLite's `sqlite3_config` is not
/// thread-safe), and no connection may ever be used by two threads at once afterwards.
pub unsafe fn configure_sqlite_for_single_thread_connections() -> bool {
    use libsqlite3_sys::{
        SQLITE_CONFIG_MEMSTATUS, SQLITE_CONFIG_MULTITHREAD, SQLITE_OK, sqlite3_config,
    };
    // SAFETY: the caller's promise; each option takes the documented arguments (none; an int).
    let (multithread, no_memstatus) = unsafe {
        (
            sqlite3_config(SQLITE_CONFIG_MULTITHREAD) == SQLITE_OK,
            sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0 as std::ffi::c_int) == SQLITE_OK,
        )
    };
    SQLITE_MULTITHREAD.store(multithread, std::sync::atomic::Ordering::Release);
    multithread && no_memstatus
}

static SQLITE_MULTITHREAD: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// SQLite's threading mode in this process: `multi-thread` once
/// [`configure_sqlite_for_single_thread_connections`] took effect, else `serialized` (the
/// bundled library's default: a mutex on every call).
pub fn sqlite_threading() -> &'static str {
    if SQLITE_MULTITHREAD.load(std::sync::atomic::Ordering::Acquire) {
        "multi-thread"
    } else {
        "serialized"
    }
}

/// A connection of its own to the SQLite database at `path`, outside the pool (the
/// [`Checkpointer`]'s, the insert watch's): Herald's settings, applied with the pool's 5 s lock
/// wait, after which a lock is waited for at most 100 ms, so a thread using it is never held up
/// long and a shutdown never waits long for it. Like every SQLite connection in Herald, it must
/// only ever be used by one thread at a time (no sharing behind `unsafe impl Sync`, no
/// `sqlite3_interrupt` from another thread): `herald` runs SQLite in multi-thread mode
/// ([`configure_sqlite_for_single_thread_connections`]).
fn side_connection(path: &str) -> Result<SqliteConnection, StorageError> {
    use diesel::Connection;
    let mut conn =
        SqliteConnection::establish(path).map_err(|e| StorageError::Unavailable(Box::new(e)))?;
    conn.batch_execute(&format!(
        "PRAGMA busy_timeout = 5000; {SQLITE_PRAGMAS} PRAGMA busy_timeout = 100;"
    ))?;
    Ok(conn)
}

/// How often the [`Checkpointer`] copies the WAL's committed pages into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// A thread with a connection of its own that runs a passive checkpoint every
/// [`CHECKPOINT_EVERY`]: it copies what the WAL holds into the database file without blocking
/// readers or writers, so that writes mostly do not (SQLite's default has the commit that
/// brings the WAL to 1,000 pages copy them all, holding Herald's writer lock, and every write
/// behind it waits). The thread ends when the last clone of its [`SqliteDb`] is dropped.
struct Checkpointer {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    passes: Arc<Passes>,
}

/// What `PRAGMA wal_checkpoint` answers: whether another checkpoint kept it from running, the
/// WAL's pages when it began, and how many of them are in the database file when it ended.
#[derive(diesel::QueryableByName)]
struct CheckpointPass {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    busy: i32,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    log: i32,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    checkpointed: i32,
}

/// The WAL as the [`Checkpointer`]'s last pass left it (the `herald_sqlite_*` gauges).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalState {
    /// The frames (a page each; a page written by several commits is in several) written since
    /// the WAL last started again, copied or not, when the last pass that ran began. It stays
    /// up while nothing is written and drops only when the WAL starts again.
    pub frames: i64,
    /// Of those, the frames it could not copy: a read transaction that began before the latest
    /// of them still needed the older state. Any reader does that for a moment; one that stays
    /// (a backup, a shell left in a transaction) keeps the WAL from starting again, and its
    /// file grows. (For one pass it can also read as all of them, when a writer starts the WAL
    /// again in the instant between the pass's two reads.)
    pub held: i64,
    /// Whether the last pass failed (a full disk, an I/O error).
    pub failing: bool,
}

/// How many passes the [`Checkpointer`] has made (those that ran: not kept off by another
/// checkpoint, not failed) and what the last left, and a way to wait for the next.
#[derive(Default)]
struct Passes {
    state: Mutex<(u64, WalState)>,
    made: std::sync::Condvar,
}

impl Checkpointer {
    fn start(path: &str) -> Result<Checkpointer, StorageError> {
        // `synchronous = FULL` among the settings: a pass syncs the database file before it
        // marks the WAL's pages copied. A pass that would wait on a lock is left to the next
        // one, and dropping the last handle waits for the pass under way.
        let mut conn = side_connection(path)?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let passes = Arc::new(Passes::default());
        let done = passes.clone();
        let thread = std::thread::Builder::new()
            .name("herald-checkpoint".into())
            .spawn(move || {
                let mut failing = false;
                // Until the sender is dropped (nothing is ever sent on it).
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(CHECKPOINT_EVERY)
                {
                    // Said once when it starts failing (a full disk, an I/O error) and once when
                    // it works again, not ten times a second; the writers' checkpoint still
                    // holds. SQLite's own message: it names the failure, never a value.
                    let pass = diesel::sql_query("PRAGMA wal_checkpoint(PASSIVE)")
                        .get_result::<CheckpointPass>(&mut conn);
                    // Logged before the state's lock is taken: a slow log writer must not hold
                    // up a scrape.
                    match &pass {
                        Err(e) if !failing => {
                            failing = true;
                            let error = match e {
                                DieselError::DatabaseError(_, info) => info.message().to_owned(),
                                _ => "query failed".to_owned(),
                            };
                            tracing::warn!(%error, "WAL checkpoint failed; trying again every pass");
                        }
                        Ok(_) if failing => {
                            failing = false;
                            tracing::info!("WAL checkpoint works again");
                        }
                        _ => {}
                    }
                    let mut state = done.state.lock().unwrap_or_else(|p| p.into_inner());
                    state.1.failing = failing;
                    // Busy: another connection was checkpointing; nothing copied.
                    if let Ok(pass) = pass
                        && pass.busy == 0
                    {
                        let frames = i64::from(pass.log.max(0));
                        let held = (frames - i64::from(pass.checkpointed.max(0))).max(0);
                        *state = (state.0 + 1, WalState { frames, held, failing: false });
                        done.made.notify_all();
                    }
                }
            })
            .map_err(|e| StorageError::Unavailable(Box::new(e)))?;
        Ok(Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
            passes,
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Pool options.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    pub max_size: u32,
    /// How long a caller waits for a pooled connection before `Unavailable`.
    pub connection_timeout: Duration,
    /// PostgreSQL: the sessions' `idle_in_transaction_session_timeout` ([`IDLE_IN_TRANSACTION`]);
    /// zero leaves the server's.
    pub idle_in_transaction: Duration,
    /// PostgreSQL: connections the pool keeps open, which its own threads open ahead of need
    /// (1 for a server). A command that runs and exits takes 0, so the pool opens only the
    /// connection a caller waits for: one still being opened ahead by the pool's thread when the
    /// process exited (libpq in its TLS and Kerberos set-up while the exit tore those libraries
    /// down) crashed `herald migrate` and the support commands after their work, exit 139, 30
    /// of 100 runs over TCP with a password. (A caller that gives up waiting still leaves the
    /// pool's thread trying.)
    pub min_idle: u32,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            max_size: 10,
            connection_timeout: Duration::from_secs(5),
            idle_in_transaction: IDLE_IN_TRANSACTION,
            min_idle: 1,
        }
    }
}

/// Creates the SQLite file, when there is none yet, readable and writable by its owner only
/// (0600): it holds the generated admin token, the webhook signing secret and the admin
/// session key (`herald_settings`), and the messages. SQLite gives its WAL and shared-memory
/// files the database file's permissions. A file that exists keeps its mode (a warning says
/// when others may read it); any other failure is left to SQLite's own open to report.
fn create_private(path: &str) {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if path.starts_with("file:") {
        return;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if let Ok(m) = std::fs::metadata(path)
                && m.is_file()
                && m.permissions().mode() & 0o077 != 0
            {
                tracing::warn!(
                    mode = format!("{:04o}", m.permissions().mode() & 0o7777),
                    "the SQLite database file may be read by other users, and it holds the \
                     generated tokens and secrets and the messages: chmod 600 it (and its -wal \
                     and -shm files)"
                );
            }
        }
        Err(_) => {}
    }
}

/// `sqlite://PATH` → PATH (`sqlite:///abs` → `/abs`); `None` for other schemes.
pub fn sqlite_path(url: &str) -> Option<&str> {
    url.strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
}

impl Db {
    /// Opens a pool for `url` without touching the schema.
    pub fn connect(url: &str, options: &PoolOptions) -> Result<Db, StorageError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let manager = PgManager::new(url, options.idle_in_transaction);
            let refused = manager.refused.clone();
            let pool = Pool::builder()
                .max_size(options.max_size)
                .min_idle(Some(options.min_idle))
                .connection_timeout(options.connection_timeout)
                // No `SELECT 1` on every checkout (a round trip and a transaction each time): a
                // connection that broke fails its first statement, is reported unavailable
                // (503 / retry) and is dropped by the pool as broken.
                .test_on_check_out(false)
                // A database that is down now is an error at the first use, not at start-up.
                .build_unchecked(manager);
            Ok(Db::Pg(PgPool { pool, refused }))
        } else if let Some(path) = sqlite_path(url) {
            if path.is_empty() || path.contains(":memory:") {
                return Err(StorageError::BadUrl(
                    "sqlite needs a file path (an in-memory database is per connection)".into(),
                ));
            }
            create_private(path);
            let pool = Pool::builder()
                .max_size(options.max_size.min(8))
                .connection_timeout(options.connection_timeout)
                // A local file: no connection to recycle. Without r2d2's idle timeout and maximum
                // lifetime no background task reopens one, so the last handle's drop closes every
                // connection on its own thread (see `Closed`).
                .idle_timeout(None)
                .max_lifetime(None)
                // A file on this machine: nothing to ping.
                .test_on_check_out(false)
                .connection_customizer(Box::new(SqlitePragmas))
                .build(ConnectionManager::<SqliteConnection>::new(path))?;
            let checkpointer = Arc::new(Checkpointer::start(path)?);
            Ok(Db::Sqlite(SqliteDb {
                pool,
                writer: Arc::new(Mutex::new(())),
                checkpointer,
                own_writes: OwnWrites::default(),
                closing: Arc::default(),
            }))
        } else {
            Err(StorageError::BadUrl(url_shape(url)))
        }
    }

    /// On SQLite, the count of the write transactions of this handle and its clones; `None` on
    /// PostgreSQL.
    pub fn own_writes(&self) -> Option<OwnWrites> {
        match self {
            Db::Pg(_) => None,
            Db::Sqlite(db) => Some(db.own_writes.clone()),
        }
    }

    /// On SQLite, a way to wait until this handle and all its clones are dropped and the
    /// database closed (see [`Closed`]); `None` on PostgreSQL, where a connection that ends with
    /// the process leaves nothing behind.
    pub fn closed(&self) -> Option<Closed> {
        match self {
            Db::Pg(_) => None,
            Db::Sqlite(db) => Some(Closed(db.closing.0.clone())),
        }
    }

    /// On SQLite, the WAL as Herald's checkpointer last left it; `None` on PostgreSQL.
    pub fn wal_state(&self) -> Option<WalState> {
        match self {
            Db::Pg(_) => None,
            Db::Sqlite(db) => Some(db.wal_state()),
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            Db::Pg(_) => Backend::Postgres,
            Db::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// Waits for a first connection, at most the pool's connection timeout, as any use would;
    /// but a refusal no wait changes ([`refused_for_good`]: a wrong password, a database or
    /// role that does not exist, a URL libpq cannot use) ends the wait at once with it, as
    /// [`StorageError::Refused`] (it took the whole 5 s). Nothing to wait for on SQLite.
    pub fn first_connection(&self) -> Result<(), StorageError> {
        let Db::Pg(pool) = self else {
            return Ok(());
        };
        let deadline = std::time::Instant::now() + pool.connection_timeout();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match pool.get_timeout(left.min(Duration::from_millis(100))) {
                Ok(_) => return Ok(()),
                Err(e) => {
                    let last = pool
                        .refused
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    match last {
                        Some((why, true)) => return Err(StorageError::Refused(why)),
                        // Each short wait takes the pool's last error with it: the last one seen
                        // is said here.
                        Some((why, false)) if left.is_zero() => {
                            return Err(StorageError::Unavailable(
                                format!("timed out waiting for connection: {why}").into(),
                            ));
                        }
                        _ if left.is_zero() => return Err(e.into()),
                        _ => {}
                    }
                }
            }
        }
    }

    /// How long a process waits for another's migrations of the same SQLite file.
    const MIGRATION_WAIT: Duration = Duration::from_secs(600);

    /// Applies pending migrations; returns the versions applied.
    pub fn migrate(&self) -> Result<Vec<String>, StorageError> {
        let applied = match self {
            Db::Pg(pool) => {
                let mut conn = pool.get()?;
                // One migrator at a time when several Herald processes start together.
                diesel::sql_query("SELECT pg_advisory_lock(7244917)").execute(&mut conn)?;
                let r = conn
                    .run_pending_migrations(PG_MIGRATIONS)
                    .map(|v| v.iter().map(|m| m.to_string()).collect());
                diesel::sql_query("SELECT pg_advisory_unlock(7244917)").execute(&mut conn)?;
                r
            }
            Db::Sqlite(db) => {
                let _w = db.lock_writer();
                let mut conn = db.pool.get()?;
                // One migrator at a time when several processes start on one file (two `herald
                // migrate`s on a fresh file: the second failed on "table herald_outbox already
                // exists"): all pending migrations in one write transaction, begun before they
                // are looked up; the other waits for it, then finds none pending. It waits as
                // long as migrations may take on a large file (one rewrites every row), not the
                // 5 s a statement waits for the writer.
                conn.batch_execute(&format!(
                    "PRAGMA busy_timeout = {}",
                    Self::MIGRATION_WAIT.as_millis()
                ))?;
                let r = conn.immediate_transaction(|c| {
                    c.run_pending_migrations(SQLITE_MIGRATIONS)
                        .map(|v| v.iter().map(|m| m.to_string()).collect())
                });
                conn.batch_execute(SQLITE_BUSY_TIMEOUT)?;
                r
            }
        };
        applied.map_err(|e| StorageError::Migration(e.to_string()))
    }

    /// Reverts every migration (tests of down migrations).
    pub fn revert_all(&self) -> Result<(), StorageError> {
        let r = match self {
            Db::Pg(pool) => pool.get()?.revert_all_migrations(PG_MIGRATIONS).map(|_| ()),
            Db::Sqlite(db) => {
                let _w = db.lock_writer();
                db.pool
                    .get()?
                    .revert_all_migrations(SQLITE_MIGRATIONS)
                    .map(|_| ())
            }
        };
        r.map_err(|e| StorageError::Migration(e.to_string()))
    }

    /// A cheap liveness query (`/readyz`).
    pub fn ping(&self) -> Result<(), StorageError> {
        match self {
            Db::Pg(pool) => pool.get()?.batch_execute("SELECT 1")?,
            Db::Sqlite(db) => db.pool.get()?.batch_execute("SELECT 1")?,
        }
        Ok(())
    }
}

impl SqliteDb {
    /// Waits (at most `within`) until the [`Checkpointer`] has made `n` passes that began after
    /// this call and ran (see [`Passes`]); whether it did. Such a pass copied what was committed
    /// before this call, unless a read transaction older than it was still open.
    pub fn wait_for_checkpoints(&self, n: u64, within: Duration) -> bool {
        let passes = &self.checkpointer.passes;
        let state = passes.state.lock().unwrap_or_else(|p| p.into_inner());
        // The pass under way now (if any) may have begun before this call: it does not count.
        let target = state.0 + n + 1;
        let (state, _) = passes
            .made
            .wait_timeout_while(state, within, |s| s.0 < target)
            .unwrap_or_else(|p| p.into_inner());
        state.0 >= target
    }

    /// The WAL as the [`Checkpointer`]'s last pass left it (all zero before the first).
    pub fn wal_state(&self) -> WalState {
        self.checkpointer
            .passes
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
    }

    fn lock_writer(&self) -> std::sync::MutexGuard<'_, ()> {
        // A poisoned lock only means another writer panicked; the database itself is consistent.
        let guard = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        // Counted before anything is written: a look that follows this write's WAL frames sees
        // the count moved.
        self.own_writes
            .0
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        guard
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction, one writer at a time.
    pub fn write<T>(
        &self,
        f: impl FnOnce(&mut SqliteConnection) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let _w = self.lock_writer();
        let mut conn = self.pool.get()?;
        conn.immediate_transaction(f)
    }

    pub fn read(
        &self,
    ) -> Result<PooledConnection<ConnectionManager<SqliteConnection>>, StorageError> {
        Ok(self.pool.get()?)
    }
}

/// How soon a pooled connection's `BEGIN` must have failed for [`pg_transaction`] to try the
/// next one: a connection the server closed fails at its first write, in well under a
/// millisecond; one across a partition only after `tcp_user_timeout` (15 s unless the URL sets
/// it).
pub(crate) const RETRY_FAILED_WITHIN: std::time::Duration = std::time::Duration::from_millis(500);

/// Runs `f` in a transaction on a pooled PostgreSQL connection. Connections are not pinged at
/// checkout (a round trip and a transaction each time); one that broke while idle (the database
/// restarted, its backend was terminated) fails at `BEGIN` — before anything of `f` was sent —
/// and is dropped by the pool as broken, and the next connection is tried (at most the pool's
/// size, plus one, in all). Only when that `BEGIN` failed at once ([`RETRY_FAILED_WITHIN`]): a
/// connection the server closed fails on its first write, but across a network partition each
/// one fails only when TCP gives up on it (`tcp_user_timeout`), and trying every pooled
/// connection in turn would keep the caller — an ingest request, whose provider waits — for
/// that long times the pool's size. Always READ COMMITTED, whatever
/// `default_transaction_isolation` the database or role sets: Herald's statements are written
/// for it (each statement sees what committed before it — the claim's re-check of keyed heads, a
/// replay's reads after its key's lock — and `SKIP LOCKED` claims, which a stricter level would
/// turn into serialization failures).
pub(crate) fn pg_transaction<T, E>(
    pool: &PgPool,
    f: impl FnOnce(&mut PgConnection) -> Result<T, E>,
) -> Result<T, E>
where
    E: From<DieselError> + From<StorageError>,
{
    use diesel::r2d2::R2D2Connection;
    let mut f = Some(f);
    on_a_live_connection(pool, |conn| {
        let r = conn
            .build_transaction()
            .read_committed()
            .run(|c| match f.take() {
                Some(f) => f(c),
                None => Err(E::from(DieselError::BrokenTransactionManager)),
            });
        // Again only if `f` never ran (the `BEGIN` failed) and this connection is dead.
        r.map_err(|e| (e, f.is_some() && conn.is_broken()))
    })
}

/// The retry [`pg_transaction`] and [`pg_autocommit`] share: `attempt` runs on a pooled
/// connection and, when it fails, says whether it may run again on the next one (the connection
/// is dead, and running it again loses nothing); it does when it failed at once
/// ([`RETRY_FAILED_WITHIN`]), at most the pool's size, plus one, times in all.
fn on_a_live_connection<T, E>(
    pool: &PgPool,
    mut attempt: impl FnMut(&mut PgConnection) -> Result<T, (E, bool)>,
) -> Result<T, E>
where
    E: From<StorageError>,
{
    let mut tries = pool.max_size() as usize + 1;
    loop {
        let mut conn = pool.get().map_err(|e| E::from(StorageError::from(e)))?;
        let began = std::time::Instant::now();
        match attempt(&mut conn) {
            Ok(t) => return Ok(t),
            Err((_, again)) if again && tries > 1 && began.elapsed() < RETRY_FAILED_WITHIN => {
                tries -= 1
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Runs `f`, one statement committed by itself (autocommit: its answer comes only after its
/// commit), on a pooled PostgreSQL connection, without [`pg_transaction`]'s `BEGIN` and `COMMIT`
/// round trips. A pooled connection that broke while idle fails at the statement, found at once
/// ([`RETRY_FAILED_WITHIN`]), and `f` runs again on the next one, as `pg_transaction` retries a
/// failed `BEGIN`. So `f` must be safe to run twice: a statement whose first run may have
/// committed before its connection broke (the server died just after its commit) must store
/// nothing more the second time (ingest's receipt insert skips the keys it finds).
pub(crate) fn pg_autocommit<T, E>(
    pool: &PgPool,
    mut f: impl FnMut(&mut PgConnection) -> Result<T, E>,
) -> Result<T, E>
where
    E: From<StorageError>,
{
    // A dead connection leaves the pool whenever it failed a statement (`pg_dead`).
    on_a_live_connection(pool, |conn| f(conn).map_err(|e| (e, pg_dead(conn))))
}

/// Whether a connection whose statement just failed is dead (and then marked broken, so that the
/// pool drops it). diesel marks a connection broken when a statement fails on it, but not when
/// the statement's preparation failed — the first use of a statement on that connection — so a
/// simple query, which marks it either way, tells: a round trip on a failure only.
pub(crate) fn pg_dead(conn: &mut PgConnection) -> bool {
    use diesel::connection::SimpleConnection;
    use diesel::r2d2::R2D2Connection;
    conn.is_broken() || (conn.batch_execute("SELECT 1").is_err() && conn.is_broken())
}

/// Runs a body once per backend, with `schema` bound to that backend's schema module and `q`
/// to its compiled [`queries`] module. `read` runs on a pooled connection; `write` in a
/// transaction (`BEGIN IMMEDIATE` behind the writer lock on SQLite).
macro_rules! db_run {
    ($db:expr, read |$conn:ident, $q:ident| $body:expr) => {
        match $db {
            $crate::storage::Db::Pg(pool) => {
                #[allow(unused_imports)]
                use $crate::storage::queries::pg as $q;
                let mut pooled = pool.get()?;
                // A closure: a `?` in the body ends the read here, not the caller.
                let r = (|$conn: &mut ::diesel::pg::PgConnection| -> Result<_, $crate::storage::StorageError> {
                    $body
                })(&mut pooled);
                // A connection that died while idle leaves the pool with the read it failed (a
                // read that found nothing, or a value it could not decode, asks nothing more).
                if r.as_ref().is_err_and(|e| e.is_unavailable()) {
                    $crate::storage::pg_dead(&mut pooled);
                }
                r
            }
            $crate::storage::Db::Sqlite(db) => {
                #[allow(unused_imports)]
                use $crate::storage::queries::sqlite as $q;
                let mut pooled = db.read()?;
                let $conn: &mut ::diesel::sqlite::SqliteConnection = &mut pooled;
                $body
            }
        }
    };
    ($db:expr, write |$conn:ident, $q:ident| $body:expr) => {
        match $db {
            $crate::storage::Db::Pg(pool) => {
                #[allow(unused_imports)]
                use $crate::storage::queries::pg as $q;
                $crate::storage::pg_transaction(
                    pool,
                    |$conn: &mut ::diesel::pg::PgConnection| -> Result<_, $crate::storage::StorageError> { $body },
                )
            }
            $crate::storage::Db::Sqlite(db) => {
                #[allow(unused_imports)]
                use $crate::storage::queries::sqlite as $q;
                db.write(|$conn: &mut ::diesel::sqlite::SqliteConnection| $body)
            }
        }
    };
}

pub(crate) use db_run;

/// Compiles the items given once per backend, as `pub mod pg` and `pub mod sqlite`. In each,
/// `Conn` is that backend's connection, `schema` its diesel schema, `sql` its arm of [`sql`]
/// (the statements that differ) and `q` all of its [`queries`] (to call another table's).
macro_rules! per_backend {
    ($($items:item)*) => {
        pub mod pg {
            #[allow(unused_imports)]
            use $crate::storage::{queries::pg as q, schema_pg as schema, sql::pg as sql};
            type Conn = ::diesel::pg::PgConnection;
            $($items)*
        }
        pub mod sqlite {
            #[allow(unused_imports)]
            use $crate::storage::{queries::sqlite as q, schema_sqlite as schema, sql::sqlite as sql};
            type Conn = ::diesel::sqlite::SqliteConnection;
            $($items)*
        }
    };
}
pub(crate) use per_backend;

#[cfg(test)]
mod tests {
    /// SQLite's migrations run in one transaction ([`super::Db::migrate`]): one diesel would
    /// run outside a transaction (`run_in_transaction = false` in its `metadata.toml`) would
    /// silently run inside it.
    #[test]
    fn no_sqlite_migration_asks_to_run_outside_a_transaction() {
        let dir = crate::repo_path("migrations/sqlite");
        for m in std::fs::read_dir(dir).unwrap() {
            let meta = m.unwrap().path().join("metadata.toml");
            if let Ok(text) = std::fs::read_to_string(&meta) {
                assert!(!text.contains("run_in_transaction"), "{}", meta.display());
            }
        }
    }

    #[test]
    fn a_refusal_no_wait_changes_is_told_from_one_that_passes() {
        use super::{one_line, refused_for_good};
        let at = "connection to server at \"127.0.0.1\", port 5432 failed: ";
        for text in [
            "FATAL:  password authentication failed for user \"herald\"",
            "FATAL:  database \"nodb\" does not exist",
            "FATAL:  role \"nobody\" does not exist",
            "FATAL:  no pg_hba.conf entry for host \"10.0.0.1\", user \"h\", database \"h\", no encryption",
            "FATAL:  role \"h\" is not permitted to log in",
            "FATAL:  permission denied for database \"h\"",
            "server does not support SSL, but SSL was required",
            "fe_sendauth: no password supplied",
        ] {
            assert!(
                refused_for_good(&one_line(&format!("{at}{text}\n"))),
                "{text}"
            );
        }
        assert!(refused_for_good("invalid sslmode value: \"bogus\""));
        for text in [
            "Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?\n",
            "FATAL:  the database system is starting up",
            "FATAL:  the database system is shutting down",
            "FATAL:  sorry, too many clients already",
            "FATAL:  remaining connection slots are reserved for non-replication superuser connections",
            "timeout expired",
            "server closed the connection unexpectedly",
            // Another language: waited for, as any other.
            "FATAL:  Passwort-Authentifizierung für Benutzer »h« fehlgeschlagen",
        ] {
            assert!(
                !refused_for_good(&one_line(&format!("{at}{text}"))),
                "{text}"
            );
        }
        assert!(!refused_for_good(
            "could not translate host name \"db\" to address"
        ));
        assert_eq!(
            one_line(&format!(
                "{at}Connection refused\n\tIs the server running?\n"
            )),
            format!("{at}Connection refused; Is the server running?")
        );
        assert_eq!(one_line("FATAL:  a\n"), "FATAL: a");
    }

    #[test]
    fn a_database_urls_password_is_redacted_from_connection_errors() {
        let secrets = url_secrets("postgres://herald:p@ss/w0rd@db/herald");
        assert_eq!(
            redact("could not translate host name \"ss\" to address", &secrets),
            "could not translate host name \"…\" to address"
        );
        let secrets = url_secrets("postgres://herald:ab%zz9@db/herald");
        assert_eq!(
            redact("invalid percent-encoded token: \"ab%zz9\"", &secrets),
            "invalid percent-encoded token: \"…\""
        );
        assert!(url_secrets("postgres://db/herald").passwords.is_empty());
        assert!(
            url_secrets("postgres://herald@db/herald")
                .passwords
                .is_empty()
        );
        // A short piece of a password inside another quoted word is not hidden (it made every
        // error read `role "…"`), and the whole password is, whatever its length.
        let s = url_secrets("postgres://herald:p@ssw0rd@db/shop");
        assert_eq!(
            redact("role \"postgres\" does not exist; database \"shop\"", &s),
            "role \"postgres\" does not exist; database \"shop\""
        );
        assert_eq!(
            redact("could not translate host name \"ssw0rd@db\"; p@ssw0rd", &s),
            "could not translate host name \"…\"; …"
        );
        let s = url_secrets("postgres://herald:ab@db/x");
        assert_eq!(redact("password ab given", &s), "password … given");
        // libpq quotes a piece with what follows it as the host (found by a walk-through).
        for url in [
            "postgres://herald:PGSE@CRET@127.0.0.1:18798/herald",
            "postgres://herald:PG@SE@CRET@127.0.0.1:18798/herald",
        ] {
            let shown = redact(
                &format!(
                    "could not translate host name \"CRET@127.0.0.1\" to address: Name or \
                     service not known; {url}"
                ),
                &url_secrets(url),
            );
            assert!(!shown.contains("CRET") && !shown.contains("SE@"), "{shown}");
            assert!(shown.starts_with("could not translate host name \"…\" to address"));
        }
        // A password as a parameter: in a URI's query, or keyword/value text after `://`.
        for (url, secret) in [
            (
                "postgres://db/herald?password=PGSECRET&sslmode=disable",
                "PGSECRET",
            ),
            ("postgres://host=127.0.0.1 password=PGSECRET", "PGSECRET"),
            ("postgres://host=127.0.0.1 PASSWORD='p w'", "p w"),
        ] {
            let shown = redact(
                &format!(
                    "could not translate host name \"{}\" to address; {url}",
                    &url[11..]
                ),
                &url_secrets(url),
            );
            assert!(!shown.contains(secret), "{shown}");
        }
        // Nothing else is touched.
        assert_eq!(
            redact(
                "connection refused \"db\" (5432)",
                &url_secrets("postgres://u:pw@db/x")
            ),
            "connection refused \"db\" (5432)"
        );
    }

    use super::*;

    fn db_error(kind: DatabaseErrorKind, message: &str) -> DieselError {
        DieselError::DatabaseError(kind, Box::new(message.to_owned()))
    }

    #[test]
    fn keepalive_settings_are_added_unless_the_url_names_them() {
        let all = "keepalives=1&keepalives_idle=10&keepalives_interval=5&keepalives_count=3\
                   &tcp_user_timeout=15000";
        for (url, expected) in [
            (
                "postgres://h@db/herald",
                format!("postgres://h@db/herald?{all}"),
            ),
            ("postgresql://db", format!("postgresql://db?{all}")),
            (
                "postgres://db/herald?",
                format!("postgres://db/herald?{all}"),
            ),
            (
                "postgres://h@db/herald?sslmode=require&",
                format!("postgres://h@db/herald?sslmode=require&{all}"),
            ),
            (
                "postgres:///herald?host=/var/run/postgresql",
                format!("postgres:///herald?host=/var/run/postgresql&{all}"),
            ),
            // A `?` (and `&`) in a password is the password's, kept as written.
            (
                "postgres://u:pa?s&&s@db/herald",
                format!("postgres://u:pa?s&&s@db/herald?{all}"),
            ),
            // The URL's own values are kept, whether or not their keys are percent-encoded.
            (
                "postgres://h@db/herald?keepalives%5Fidle=5&tcp_user_timeout=0",
                "postgres://h@db/herald?keepalives%5Fidle=5&tcp_user_timeout=0&keepalives=1\
                 &keepalives_interval=5&keepalives_count=3"
                    .to_owned(),
            ),
        ] {
            assert_eq!(pg_url_with_keepalive(url), expected, "{url}");
        }
        let own = format!("postgres://db/herald?{all}");
        assert_eq!(pg_url_with_keepalive(&own), own);
    }

    #[test]
    fn the_servers_end_keeps_the_watch_the_url_sets_for_the_client() {
        let of = |url: &str| ServerKeepalive::of_url(&pg_url_with_keepalive(url));
        let defaults = [
            ("tcp_keepalives_idle", 10),
            ("tcp_keepalives_interval", 5),
            ("tcp_keepalives_count", 3),
            ("tcp_user_timeout", 15_000),
        ];
        assert_eq!(of("postgres://h@db/herald").settings(), defaults);
        for (url, expected) in [
            // The URL's own values, percent-encoded keys and values too.
            (
                "postgres://h@db/herald?keepalives%5Fidle=1&keepalives_interval=%32\
                 &keepalives_count=2&tcp_user_timeout=2000",
                vec![
                    ("tcp_keepalives_idle", 1),
                    ("tcp_keepalives_interval", 2),
                    ("tcp_keepalives_count", 2),
                    ("tcp_user_timeout", 2000),
                ],
            ),
            // Keepalives off: only the user timeout is mirrored.
            (
                "postgres://h@db/herald?keepalives=0",
                vec![("tcp_user_timeout", 15_000)],
            ),
            // 0, or what is not a whole number, leaves the system's default on both ends.
            (
                "postgres://h@db/herald?tcp_user_timeout=0&keepalives_idle=soon\
                 &keepalives_count=-1",
                vec![("tcp_keepalives_interval", 5)],
            ),
            // A `?` and `=` in a password are the password's.
            (
                "postgres://u:p?tcp_user_timeout=5@db/herald",
                defaults.to_vec(),
            ),
            // `keepalives` off as libpq reads it (a number that is 0); past the server's limit.
            (
                "postgres://h@db/herald?keepalives=00&tcp_user_timeout=2147483648",
                vec![],
            ),
            (
                "postgres://h@db/herald?keepalives=2&tcp_user_timeout=2147483647",
                vec![
                    ("tcp_keepalives_idle", 10),
                    ("tcp_keepalives_interval", 5),
                    ("tcp_keepalives_count", 3),
                    ("tcp_user_timeout", 2_147_483_647),
                ],
            ),
        ] {
            assert_eq!(of(url).settings(), expected, "{url}");
        }
        assert!(
            ServerKeepalive::of_url("postgres://h@db/herald")
                .settings()
                .is_empty()
        );
        assert_eq!(
            ServerKeepalive::of_url("postgres://h@db/herald").statement(),
            None
        );
        assert_eq!(
            of("postgres://h@db/herald?keepalives=0&tcp_user_timeout=2000").statement(),
            Some(
                "SELECT set_config(d.name, d.value, false) FROM (VALUES ('tcp_user_timeout', \
                 '2000')) AS d(name, value) JOIN pg_settings AS s ON s.name = d.name \
                 WHERE s.source = 'default'"
                    .to_owned()
            )
        );
    }

    #[test]
    fn an_unsupported_database_url_shows_its_scheme_at_most() {
        for (url, shown) in [
            ("mysql://herald:s3cret@db/herald", "mysql://…"),
            // A libpq key-value string, a URL with its scheme forgotten: not echoed at all.
            ("host=db user=herald password=s3cret", "(not a URL)"),
            ("herald:s3cret@db:5432/herald", "(not a URL)"),
            ("s3cret@x://y", "(not a URL)"),
        ] {
            let m = StorageError::BadUrl(url_shape(url)).to_string();
            assert!(m.contains(shown) && !m.contains("s3cret"), "{url}: {m}");
        }
    }

    #[test]
    fn unavailability_follows_the_error_kind_not_its_text() {
        use DatabaseErrorKind::*;
        for kind in [
            ClosedConnection,
            UnableToSendCommand,
            SerializationFailure,
            ReadOnlyTransaction,
        ] {
            assert!(
                StorageError::from(db_error(kind, "anything")).is_unavailable(),
                "{kind:?}"
            );
        }
        // The old text list: a translated or unexpected text no longer decides anything.
        for (kind, text) in [
            (Unknown, "could not connect to server"),
            (Unknown, "terminating connection"),
            (UniqueViolation, "database is locked"),
            (CheckViolation, "connection refused"),
        ] {
            assert!(
                !StorageError::from(db_error(kind, text)).is_unavailable(),
                "{kind:?} {text}"
            );
        }
        assert!(StorageError::from(db_error(Unknown, "database is locked")).is_unavailable());
        assert!(!StorageError::from(DieselError::NotFound).is_unavailable());
    }
}
