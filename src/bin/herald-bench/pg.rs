//! A throwaway PostgreSQL cluster for the benchmarks: initdb on a free loopback port, fsync ON
//! (durability as in production), `pg_stat_statements` loaded. It stops itself and removes its
//! files when the benchmark process exits.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::{Connection, QueryableByName, RunQueryDsl};

pub struct Cluster {
    pub base: String,
    pub bin: PathBuf,
    pub port: u16,
    pub dir: PathBuf,
    /// The databases [`Cluster::fresh`] made, until [`Cluster::drop_databases`].
    made: std::sync::Mutex<Vec<String>>,
}

pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn bin_dir() -> Option<PathBuf> {
    if let Ok(out) = Command::new("sh")
        .args(["-c", "command -v initdb"])
        .output()
    {
        let p = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !p.is_empty() {
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

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

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

impl Cluster {
    pub fn start() -> Result<Cluster> {
        let bin = bin_dir().context("no PostgreSQL server binaries (initdb) found")?;
        let root = is_root();
        let port = free_port()?;
        let dir =
            std::env::temp_dir().join(format!("herald-bench-pg-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        if root {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                bail!("cannot chown {} to postgres", dir.display());
            }
        }
        let data = dir.join("data");
        let init = sh(
            &format!(
                "'{}/initdb' -D '{}' -U herald --auth=trust -E UTF8 >'{}/initdb.log' 2>&1",
                bin.display(),
                data.display(),
                dir.display()
            ),
            root,
        )
        .status()?;
        if !init.success() {
            bail!("initdb failed; see {}/initdb.log", dir.display());
        }
        // fsync, synchronous_commit and full_page_writes stay at their (durable) defaults.
        // `HERALD_BENCH_PG_OPTIONS` adds server settings (`-c name=value …`) to try one's own:
        // the figures are then those of that configuration, not the defaults'.
        let extra = server_options(&std::env::var("HERALD_BENCH_PG_OPTIONS").unwrap_or_default())?;
        let script = format!(
            "'{bin}/postgres' -D '{data}' -p {port} -c listen_addresses=127.0.0.1 -k '{dir}' \
             -c max_connections=300 -c shared_buffers=256MB \
             -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all \
             {extra} >'{dir}/postgres.log' 2>&1 & pg=$!; \
             while [ -d /proc/{parent} ] && kill -0 $pg 2>/dev/null; do sleep 1; done; \
             kill -INT $pg 2>/dev/null; wait $pg; rm -rf '{dir}'",
            bin = bin.display(),
            data = data.display(),
            dir = dir.display(),
            parent = std::process::id(),
        );
        #[allow(clippy::zombie_processes)]
        sh(&script, root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start postgres")?;
        let c = Cluster {
            base: format!("postgres://herald@127.0.0.1:{port}"),
            bin,
            port,
            dir,
            made: Default::default(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match PgConnection::establish(&c.url("postgres")) {
                Ok(mut conn) => {
                    conn.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")?;
                    break;
                }
                Err(e) if Instant::now() > deadline => bail!("PostgreSQL did not start: {e}"),
                // Waiting for a server process to accept connections: no hook to wait on.
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        Ok(c)
    }

    pub fn url(&self, db: &str) -> String {
        format!("{}/{db}", self.base)
    }

    /// A fresh database, Herald's migrations applied, `pg_stat_statements` installed.
    pub fn fresh(&self, name: &str) -> Result<String> {
        let mut admin = PgConnection::establish(&self.url("postgres"))?;
        // Two statements: neither may run inside a transaction block.
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))?;
        admin.batch_execute(&format!("CREATE DATABASE {name}"))?;
        self.made
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(name.to_owned());
        let url = self.url(name);
        let db = herald::storage::Db::connect(&url, &herald::storage::PoolOptions::default())?;
        db.migrate()?;
        drop(db);
        PgConnection::establish(&url)?
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")?;
        Ok(url)
    }

    /// Drops the databases made so far (between scenarios), so that autovacuum of a finished
    /// scenario's tables cannot run during the next one — likely why `claim_p99_ms_at_1m`
    /// measured 6.7 ms after the other scenarios in one `all` run and 3.5–4.1 ms alone (3.3 ms
    /// in `all` since; one run each way). A database that cannot be dropped is kept on the list.
    pub fn drop_databases(&self) -> Result<()> {
        let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        let mut admin = PgConnection::establish(&self.url("postgres"))?;
        let mut failed = Vec::new();
        for name in std::mem::take(&mut *made) {
            if let Err(e) =
                admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            {
                failed.push((name, e));
            }
        }
        let why: Vec<String> = failed.iter().map(|(n, e)| format!("{n}: {e}")).collect();
        made.extend(failed.into_iter().map(|(n, _)| n));
        if !why.is_empty() {
            bail!("cannot drop {}", why.join("; "));
        }
        Ok(())
    }

    /// pgbench for `window` with `clients` clients running `script` (a pgbench script).
    pub fn pgbench(&self, db: &str, clients: usize, window: Duration, script: &str) -> Result<f64> {
        let path = std::env::temp_dir().join(format!("herald-bench-{}.sql", std::process::id()));
        std::fs::write(&path, script)?;
        let out = Command::new(self.bin.join("pgbench"))
            .args(["-n", "-c", &clients.to_string(), "-j", "2", "-T"])
            .arg(window.as_secs().max(1).to_string())
            .arg("-f")
            .arg(&path)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "herald",
                db,
            ])
            .output()
            .context("run pgbench")?;
        let _ = std::fs::remove_file(&path);
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| {
                l.strip_prefix("tps = ")
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|v| v.parse().ok())
            })
            .with_context(|| {
                format!(
                    "pgbench said: {text}{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    }
}

/// Counters of one database, read before and after a measured phase.
#[derive(Debug, Clone, Copy, Default)]
pub struct DbStats {
    /// Committed plus rolled-back transactions (`pg_stat_database`).
    pub xacts: i64,
    /// Total execution time of every statement except the benchmark's own, in ms
    /// (`pg_stat_statements`).
    pub exec_ms: f64,
    /// Calls of those statements.
    pub calls: i64,
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    xacts: i64,
    #[diesel(sql_type = diesel::sql_types::Double)]
    exec_ms: f64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    calls: i64,
}

/// Marks the benchmark's own statements so that they are left out of [`DbStats`].
pub const MARK: &str = "/* herald-bench */";

impl DbStats {
    /// Reads the counters. `pg_stat_database` is updated by each backend at the end of its
    /// transactions (and flushed at most every second in PostgreSQL 15): `pg_stat_force_next_flush`
    /// does not reach other backends, so callers wait a second after the phase before reading.
    pub fn read(conn: &mut PgConnection) -> Result<DbStats> {
        conn.batch_execute("SELECT pg_stat_clear_snapshot()")?;
        let r: Row = diesel::sql_query(format!(
            "{MARK} SELECT (SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
             WHERE datname = current_database()) AS xacts, \
             COALESCE((SELECT sum(total_exec_time) FROM pg_stat_statements s \
               JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = current_database() \
               AND s.query NOT LIKE '%herald-bench%'), 0)::float8 AS exec_ms, \
             COALESCE((SELECT sum(calls) FROM pg_stat_statements s \
               JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = current_database() \
               AND s.query NOT LIKE '%herald-bench%'), 0)::bigint AS calls"
        ))
        .get_result(conn)?;
        Ok(DbStats {
            xacts: r.xacts,
            exec_ms: r.exec_ms,
            calls: r.calls,
        })
    }

    pub fn since(self, before: DbStats) -> DbStats {
        DbStats {
            xacts: self.xacts - before.xacts,
            exec_ms: self.exec_ms - before.exec_ms,
            calls: self.calls - before.calls,
        }
    }
}

/// The top statements by total time since the last reset (for the report's profile notes).
pub fn top_statements(conn: &mut PgConnection, n: i64) -> Result<Vec<(String, i64, f64)>> {
    #[derive(QueryableByName)]
    struct S {
        #[diesel(sql_type = diesel::sql_types::Text)]
        query: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        calls: i64,
        #[diesel(sql_type = diesel::sql_types::Double)]
        total: f64,
    }
    let rows: Vec<S> = diesel::sql_query(format!(
        "{MARK} SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 110) AS query, calls::bigint AS calls, \
         total_exec_time::float8 AS total FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
         WHERE d.datname = current_database() AND query NOT LIKE '%herald-bench%' \
         ORDER BY total_exec_time DESC LIMIT {n}"
    ))
    .load(conn)?;
    Ok(rows
        .into_iter()
        .map(|s| (s.query, s.calls, s.total))
        .collect())
}

/// The server settings of `HERALD_BENCH_PG_OPTIONS`, checked and written back as
/// `-c name=value` words for the server's command line (which a shell reads): only `-c` pairs of
/// plain names and values, and none of the settings the bench itself relies on.
pub fn server_options(text: &str) -> Result<String> {
    const OWN: [&str; 5] = [
        "port",
        "listen_addresses",
        "unix_socket_directories",
        "shared_preload_libraries",
        "max_connections",
    ];
    let plain = |s: &str, extra: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.".contains(c) || extra.contains(c))
    };
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut out = Vec::new();
    for pair in words.chunks(2) {
        let [flag, setting] = pair else {
            bail!("HERALD_BENCH_PG_OPTIONS: {pair:?} is not `-c name=value`");
        };
        let Some((name, value)) = setting.split_once('=') else {
            bail!("HERALD_BENCH_PG_OPTIONS: {setting:?} is not `name=value`");
        };
        if *flag != "-c" || !plain(name, "") || !plain(value, ":/+-") {
            bail!(
                "HERALD_BENCH_PG_OPTIONS: `{flag} {setting}` is not `-c name=value` with a plain \
                 name and value (letters, digits, _ . : / + -)"
            );
        }
        if OWN.contains(&name.to_ascii_lowercase().as_str()) {
            bail!("HERALD_BENCH_PG_OPTIONS: {name} is the bench's own setting");
        }
        out.push(format!("-c {name}={value}"));
    }
    Ok(out.join(" "))
}

#[cfg(test)]
mod tests {
    use super::server_options;

    #[test]
    fn server_options_take_plain_settings_only() {
        assert_eq!(server_options("").unwrap(), "");
        assert_eq!(
            server_options("-c wal_compression=lz4  -c checkpoint_timeout=30min").unwrap(),
            "-c wal_compression=lz4 -c checkpoint_timeout=30min"
        );
        for bad in [
            "-c wal_compression=lz4 #",
            "-c a=b;rm",
            "-c a='b'",
            "-c a=$(x)",
            "wal_compression=lz4",
            "-c",
            "-c port=1",
            "-c Max_Connections=5",
            "-x a=b",
        ] {
            assert!(server_options(bad).is_err(), "{bad}");
        }
    }
}
