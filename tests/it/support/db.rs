//! Databases for tests. PostgreSQL: `HERALD_TEST_DATABASE_URL` if given (a role that may
//! CREATE DATABASE), else a throwaway cluster started once per test process (initdb on a free
//! loopback port; it stops itself when the process exits). A template database is migrated once;
//! each test gets its own database cloned from it. SQLite: a fresh file in a temp directory.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::{Connection, RunQueryDsl};
use herald::storage::{Backend, Db, PoolOptions};

const TEMPLATE: &str = "herald_test_template";

/// A database for one test; dropped (PostgreSQL) or deleted (SQLite) with it.
pub struct TestDb {
    pub url: String,
    pub backend: Backend,
    pg_name: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub fn new(backend: Backend) -> Self {
        match backend {
            Backend::Postgres => {
                static N: AtomicU32 = AtomicU32::new(0);
                let server = server();
                let name = format!(
                    "herald_t{}_{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::SeqCst)
                );
                let mut admin = server.admin();
                admin
                    .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {TEMPLATE}"))
                    .unwrap_or_else(|e| panic!("cannot create test database {name}: {e}"));
                TestDb {
                    url: server.url_for(&name),
                    backend,
                    pg_name: Some(name),
                    _dir: None,
                }
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("herald.db").display());
                let db = Db::connect(&url, &PoolOptions::default()).expect("open sqlite");
                db.migrate().expect("migrate sqlite");
                TestDb {
                    url,
                    backend,
                    pg_name: None,
                    _dir: Some(dir),
                }
            }
        }
    }

    /// Another handle on an existing database; dropping it leaves the database alone.
    pub fn attach(url: &str, backend: Backend) -> Self {
        TestDb {
            url: url.to_owned(),
            backend,
            pg_name: None,
            _dir: None,
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = &self.pg_name {
            let _ = server()
                .admin()
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
    }
}

/// An unmigrated, empty PostgreSQL database (migration tests).
pub fn empty_pg_database() -> (String, impl Drop) {
    struct Guard(String);
    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = server()
                .admin()
                .batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.0));
        }
    }
    static N: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "herald_e{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    server()
        .admin()
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("create empty database");
    (server().url_for(&name), Guard(name))
}

struct PgServer {
    /// `postgres://user@host:port` (no database).
    base: String,
    /// Database used for CREATE/DROP DATABASE.
    admin_db: String,
}

impl PgServer {
    fn url_for(&self, db: &str) -> String {
        format!("{}/{db}", self.base)
    }

    fn admin(&self) -> PgConnection {
        PgConnection::establish(&self.url_for(&self.admin_db))
            .expect("connect to the admin database")
    }
}

fn server() -> &'static PgServer {
    static SERVER: OnceLock<PgServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let server = match std::env::var("HERALD_TEST_DATABASE_URL") {
            Ok(url) if !url.is_empty() => from_url(&url),
            _ => start_cluster(),
        };
        let mut admin = server.admin();
        // Left over by an earlier run against the same server.
        let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)"));
        admin
            .batch_execute(&format!("CREATE DATABASE {TEMPLATE}"))
            .expect("create template database");
        let db = Db::connect(
            &server.url_for(TEMPLATE),
            &PoolOptions {
                max_size: 2,
                ..PoolOptions::default()
            },
        )
        .expect("connect to template");
        db.migrate().expect("migrate template");
        drop(db);
        // The pool closes its connections on its own threads: wait (bounded) until none is left,
        // or the first CREATE DATABASE … TEMPLATE finds the template "accessed by other users".
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            #[derive(diesel::QueryableByName)]
            struct Count {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                n: i64,
            }
            let c: Count = diesel::sql_query(format!(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = '{TEMPLATE}'"
            ))
            .get_result(&mut admin)
            .expect("count template connections");
            if c.n == 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "connections to the template database stay open"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        server
    })
}

fn from_url(url: &str) -> PgServer {
    let parsed = url::Url::parse(url).expect("HERALD_TEST_DATABASE_URL is not a URL");
    let admin_db = parsed.path().trim_start_matches('/').to_owned();
    let admin_db = if admin_db.is_empty() {
        "postgres".to_owned()
    } else {
        admin_db
    };
    let mut base = parsed.clone();
    base.set_path("");
    PgServer {
        base: base.as_str().trim_end_matches('/').to_owned(),
        admin_db,
    }
}

pub fn pg_bin_dir() -> Option<PathBuf> {
    if let Ok(out) = Command::new("sh")
        .args(["-c", "command -v initdb"])
        .output()
    {
        let p = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !p.is_empty() {
            // Follow a symlink (e.g. /usr/local/bin/initdb) to the real bin directory.
            let real = std::fs::canonicalize(&p).unwrap_or_else(|_| PathBuf::from(&p));
            return real.parent().map(Path::to_owned);
        }
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs `script` with sh, as the `postgres` user when we are root (PostgreSQL refuses root).
fn sh(script: &str, as_postgres: bool) -> Command {
    let mut c = if as_postgres {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", "sh", "-c", script]);
        c
    } else {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    };
    c.stdin(Stdio::null());
    c
}

fn start_cluster() -> PgServer {
    let bin = pg_bin_dir().expect(
        "no PostgreSQL server binaries (initdb) on PATH or under /usr/lib/postgresql/*/bin; \
         install postgresql or set HERALD_TEST_DATABASE_URL",
    );
    let root = is_root();
    let dir = std::env::temp_dir().join(format!(
        "herald-test-pg-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).expect("create cluster dir");
    if root {
        let ok = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(
            ok,
            "cannot chown the cluster directory to the postgres user"
        );
    }
    let data = dir.join("data");
    let init = sh(
        &format!(
            "'{}/initdb' -D '{}' -U herald --auth=trust -E UTF8 --no-sync >'{}/initdb.log' 2>&1",
            bin.display(),
            data.display(),
            dir.display()
        ),
        root,
    )
    .status()
    .expect("run initdb");
    assert!(
        init.success(),
        "initdb failed; see {}/initdb.log",
        dir.display()
    );
    let port = free_port();
    // Tests trade durability for speed; benchmarks (HERALD_TEST_PG_DURABLE=1) keep every fsync.
    let durability = if std::env::var_os("HERALD_TEST_PG_DURABLE").is_some() {
        ""
    } else {
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    };
    // The server stops itself (and removes its files) once this test process is gone.
    let script = format!(
        "'{bin}/postgres' -D '{data}' -p {port} -c listen_addresses=127.0.0.1 -k '{dir}' \
         {durability} -c max_connections=300 \
         >'{dir}/postgres.log' 2>&1 & pg=$!; \
         while [ -d /proc/{parent} ] && kill -0 $pg 2>/dev/null; do sleep 1; done; \
         kill -INT $pg 2>/dev/null; wait $pg; rm -rf '{dir}'",
        bin = bin.display(),
        data = data.display(),
        dir = dir.display(),
        parent = std::process::id(),
    );
    // Never waited on: the wrapper outlives this function and ends with the test process.
    #[allow(clippy::zombie_processes)]
    sh(&script, root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start postgres");
    let server = PgServer {
        base: format!("postgres://herald@127.0.0.1:{port}"),
        admin_db: "postgres".into(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match PgConnection::establish(&server.url_for("postgres")) {
            Ok(mut c) => {
                if diesel::sql_query("SELECT 1").execute(&mut c).is_ok() {
                    break;
                }
            }
            Err(e) if Instant::now() > deadline => {
                panic!(
                    "the test PostgreSQL did not start: {e}; see {}/postgres.log",
                    dir.display()
                )
            }
            Err(_) => {}
        }
        // Waiting for a server process to accept connections: there is no hook to wait on.
        std::thread::sleep(Duration::from_millis(100));
    }
    server
}

/// A PostgreSQL cluster of one test's own (initdb on a free loopback port), for drills that stop
/// and start the server under a running Herald — which the shared cluster cannot do while other
/// tests use it. Stopped and removed when dropped.
pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    root: bool,
    /// The server's own network namespace and the link to it ([`Cluster::start_behind_link`]);
    /// dropped after the server is stopped (fields drop after `Drop::drop`).
    link: Option<super::link::Link>,
}

impl Cluster {
    /// initdb, then start it (the commits of a test stay durable across a stop: synchronous
    /// commit is on; fsync is off, as the OS keeps the files across a server crash).
    pub fn start_new() -> Self {
        Self::start_on(None)
    }

    /// As [`Cluster::start_new`], but the server runs in a network namespace of its own and is
    /// reached over a [`Link`](super::link::Link) the test can cut ([`Cluster::link`]).
    pub fn start_behind_link() -> Self {
        Self::start_on(Some(super::link::Link::new()))
    }

    fn start_on(link: Option<super::link::Link>) -> Self {
        let bin = pg_bin_dir().expect("no PostgreSQL server binaries (initdb)");
        let root = is_root();
        let dir = std::env::temp_dir().join(format!(
            "herald-drill-pg-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("create cluster dir");
        if root {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "cannot chown the cluster directory");
        }
        let init = sh(
            &format!(
                "'{}/initdb' -D '{}/data' -U herald --auth=trust -E UTF8 --no-sync >'{}/initdb.log' 2>&1",
                bin.display(),
                dir.display(),
                dir.display()
            ),
            root,
        )
        .status()
        .expect("run initdb");
        assert!(
            init.success(),
            "initdb failed; see {}/initdb.log",
            dir.display()
        );
        if let Some(link) = &link {
            // initdb trusts loopback only.
            use std::io::Write;
            std::fs::OpenOptions::new()
                .append(true)
                .open(dir.join("data/pg_hba.conf"))
                .and_then(|mut f| writeln!(f, "host all all {}/32 trust", link.near))
                .expect("let the near end of the link in");
        }
        let cluster = Cluster {
            bin,
            dir,
            port: free_port(),
            root,
            link,
        };
        cluster.start();
        cluster
    }

    /// The link to the server's namespace. Panics for a cluster not started behind one.
    pub fn link(&self) -> &super::link::Link {
        self.link.as_ref().expect("a cluster started behind a link")
    }

    /// Where the server listens: loopback, or the far end of its link.
    fn host(&self) -> &str {
        self.link.as_ref().map_or("127.0.0.1", |l| l.far.as_str())
    }

    /// `postgres://herald@HOST:PORT/DB`.
    pub fn url_for(&self, db: &str) -> String {
        format!("postgres://herald@{}:{}/{db}", self.host(), self.port)
    }

    fn pg_ctl(&self, action: &str) -> bool {
        let script = format!(
            "'{bin}/pg_ctl' -D '{dir}/data' -l '{dir}/postgres.log' -w -t 60 \
             -o \"-p {port} -c listen_addresses={host} -k '{dir}' -c fsync=off \
             -c full_page_writes=off -c max_connections=100\" {action} >>'{dir}/pg_ctl.log' 2>&1",
            bin = self.bin.display(),
            dir = self.dir.display(),
            port = self.port,
            host = self.host(),
        );
        match &self.link {
            Some(link) => link.sh(&script, self.root),
            None => sh(&script, self.root),
        }
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
    }

    /// Starts the server and returns once it accepts connections.
    pub fn start(&self) {
        assert!(
            self.pg_ctl("start"),
            "pg_ctl start failed; see {}/postgres.log",
            self.dir.display()
        );
    }

    /// Stops the server at once (`-m immediate`: every session cut, crash recovery at the next
    /// start) and returns once it is gone.
    pub fn stop_immediately(&self) {
        assert!(
            self.pg_ctl("-m immediate stop"),
            "pg_ctl stop failed; see {}/pg_ctl.log",
            self.dir.display()
        );
    }

    /// SIGSTOP to the server and every process of it: connections stay open (the kernel still
    /// answers for them) but nothing is answered — a database that hangs rather than fails.
    pub fn freeze(&self) {
        assert!(
            self.signal_all("STOP"),
            "cannot stop the server's processes"
        );
    }

    /// SIGCONT: undoes [`Cluster::freeze`].
    pub fn thaw(&self) {
        assert!(
            self.signal_all("CONT"),
            "cannot continue the server's processes"
        );
    }

    /// Sends `signal` to the postmaster, then to its children; whether the postmaster took it.
    fn signal_all(&self, signal: &str) -> bool {
        let Some(pid) = std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().map(str::to_owned))
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        else {
            return false;
        };
        Command::new("sh")
            .args([
                "-c",
                // The server always has children (checkpointer, writers): pkill must match.
                &format!("kill -{signal} {pid} && pkill -{signal} -P {pid}"),
            ])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// A role `name` with `password` that must log in with it over TCP (SCRAM), as a production
    /// database asks: its line goes first in `pg_hba.conf`, then the server reloads. Returns
    /// `postgres://name:password@127.0.0.1:PORT/db`.
    pub fn require_password(&self, name: &str, password: &str, db: &str) -> String {
        PgConnection::establish(&self.url_for("postgres"))
            .expect("connect to the drill cluster")
            .batch_execute(&format!(
                "SET password_encryption = 'scram-sha-256'; \
                 CREATE ROLE {name} LOGIN SUPERUSER PASSWORD '{password}'"
            ))
            .expect("create the role");
        let hba = self.dir.join("data/pg_hba.conf");
        let before = std::fs::read_to_string(&hba).expect("read pg_hba.conf");
        std::fs::write(
            &hba,
            format!("host all {name} 127.0.0.1/32 scram-sha-256\n{before}"),
        )
        .expect("write pg_hba.conf");
        assert!(self.pg_ctl("reload"), "pg_ctl reload failed");
        format!("postgres://{name}:{password}@127.0.0.1:{}/{db}", self.port)
    }

    /// `CREATE DATABASE name`.
    pub fn create_database(&self, name: &str) {
        PgConnection::establish(&self.url_for("postgres"))
            .expect("connect to the drill cluster")
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create database");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A frozen server would not take the stop.
        self.signal_all("CONT");
        let _ = self.pg_ctl("-m immediate stop");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An SQLite read transaction opened, then a row (`event_id`, due in a thousand years, so never
/// sent) committed after it through Herald's writer: the reader still needs the state before
/// the row, so no checkpoint can copy the row's WAL frames until the reader ends (`COMMIT`).
pub fn reader_then_row(
    sq: &herald::storage::SqliteDb,
    event_id: &str,
) -> diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<diesel::sqlite::SqliteConnection>>
{
    let mut reader = sq.pool.get().unwrap();
    reader
        .batch_execute("BEGIN; SELECT count(*) FROM herald_outbox;")
        .unwrap();
    sq.write(|c| {
        Ok(c.batch_execute(&format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload, scheduled_at) \
             VALUES ('{event_id}', 'webhook', 'https://x.example/h', '{{\"body\": {{}}}}', \
             '3026-01-01 00:00:00+00:00')"
        ))?)
    })
    .unwrap();
    reader
}

/// A message's state as the SQLite database file alone holds it (`immutable=1`: its WAL not
/// read); `None` while it is not there (or the file is being written at that instant).
pub fn state_in_database_file(db: &std::path::Path, event_id: &str) -> Option<String> {
    use diesel::{Connection, OptionalExtension, RunQueryDsl};
    #[derive(diesel::QueryableByName)]
    struct State {
        #[diesel(sql_type = diesel::sql_types::Text)]
        state: String,
    }
    let mut c =
        diesel::sqlite::SqliteConnection::establish(&format!("file:{}?immutable=1", db.display()))
            .ok()?;
    diesel::sql_query("SELECT state FROM herald_outbox WHERE event_id = ?")
        .bind::<diesel::sql_types::Text, _>(event_id)
        .get_result::<State>(&mut c)
        .optional()
        .ok()
        .flatten()
        .map(|s| s.state)
}

impl TestDb {
    /// Ends every connection to this PostgreSQL test database that is open now (its backends
    /// terminated; the database itself stays up, as after a restart), waits until the server has
    /// none of them left, and returns how many there were.
    pub async fn end_connections(&self) -> usize {
        let name = self
            .pg_name
            .as_deref()
            .expect("a PostgreSQL test database of its own");
        let mut admin = server().admin();
        #[derive(diesel::QueryableByName)]
        struct Pid {
            #[diesel(sql_type = diesel::sql_types::Integer)]
            pid: i32,
        }
        let ended: Vec<i32> = diesel::sql_query(format!(
            "SELECT pid FROM pg_stat_activity WHERE datname = '{name}'"
        ))
        .load::<Pid>(&mut admin)
        .unwrap()
        .into_iter()
        .map(|p| p.pid)
        .collect();
        assert!(!ended.is_empty(), "the pool holds connections");
        diesel::sql_query("SELECT pg_terminate_backend(pid) FROM unnest($1) AS pid")
            .bind::<diesel::sql_types::Array<diesel::sql_types::Integer>, _>(&ended)
            .execute(&mut admin)
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = diesel::sql_query("SELECT pid FROM pg_stat_activity WHERE pid = ANY($1)")
                .bind::<diesel::sql_types::Array<diesel::sql_types::Integer>, _>(&ended)
                .load::<Pid>(&mut admin)
                .unwrap();
            if left.is_empty() {
                return ended.len();
            }
            assert!(Instant::now() < deadline, "the backends did not end");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
