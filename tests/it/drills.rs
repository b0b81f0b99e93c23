//! Failure drills: the real `herald serve` killed with SIGKILL mid-send, PostgreSQL stopped and
//! started under a running Herald, two Herald processes on one database with one killed, and
//! receivers misbehaving at scale. Each ends by checking that nothing was lost, that every
//! duplicate carried its original's event id, and that every message is in the state the
//! classification table prescribes. Each prints its figures on a line starting with `DRILL`
//! (`cargo test --test it drills -- --nocapture`); random moments come from a seeded RNG whose seed
//! is printed (`HERALD_DRILL_SEED=N` repeats a run).
//!
//! Timing: short leases (6 s, the least a 500 ms webhook timeout allows), 20 ms polls, a 50 ms
//! retry base; every wait ends as soon as its condition holds, under a generous deadline.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::{Connection, QueryableByName, RunQueryDsl};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::binary::{Herald, client, free_addr};
use crate::support::receiver::Recorded;
use crate::support::{Backend, Receiver, Reply, TestDb};

/// Lease of every drill process; the watchdog sweeps every half lease.
const LEASE_SECONDS: u64 = 6;
const WEBHOOK_TIMEOUT_MS: u64 = 500;
const CONCURRENCY: usize = 16;
/// Bound on any one drill's wait for its end state.
const SETTLE_WITHIN: Duration = Duration::from_secs(90);

/// The seed of a drill's random moments: `HERALD_DRILL_SEED`, else the clock; printed.
fn rng_for(drill: &str) -> StdRng {
    let seed = std::env::var("HERALD_DRILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("DRILL {drill} seed={seed}");
    StdRng::seed_from_u64(seed)
}

/// `herald serve` on `db_url` with the drills' fast settings, `extra` on top; healthy on return.
async fn serve(db_url: &str, extra: &[(&str, &str)], toml: Option<&str>) -> (Herald, String) {
    let listen = free_addr();
    let base = format!("http://{listen}");
    let lease = LEASE_SECONDS.to_string();
    let timeout = WEBHOOK_TIMEOUT_MS.to_string();
    let concurrency = CONCURRENCY.to_string();
    let mut env = vec![
        ("HERALD_LISTEN", listen.as_str()),
        ("HERALD_DATABASE_URL", db_url),
        ("HERALD_POLL_INTERVAL_MS", "20"),
        ("HERALD_LEASE_SECONDS", lease.as_str()),
        ("HERALD_WEBHOOK_TIMEOUT_MS", timeout.as_str()),
        ("HERALD_SENDER_CONCURRENCY", concurrency.as_str()),
        ("HERALD_RETRY_BASE_SECONDS", "0.05"),
        ("HERALD_RETRY_CAP_SECONDS", "0.5"),
        ("HERALD_RETRY_AFTER_MAX_SECONDS", "1"),
        ("HERALD_RECONCILE_INTERVAL_MS", "100"),
    ];
    env.extend_from_slice(extra);
    let mut h = Herald::spawn_with_config(&["serve"], &env, toml);
    h.wait_healthy(&base).await;
    (h, base)
}

impl Herald {
    /// SIGKILL, and the process reaped: no shutdown path of its own runs.
    pub(crate) fn sigkill(&mut self) {
        self.child.kill().expect("SIGKILL herald");
        self.child.wait().expect("reap herald");
    }
}

/// Raw SQL on a plain connection, as an application would run it.
fn sql(backend: Backend, url: &str, statements: &str) {
    match backend {
        Backend::Postgres => diesel::pg::PgConnection::establish(url)
            .unwrap()
            .batch_execute(statements)
            .unwrap(),
        Backend::Sqlite => {
            let path = herald::storage::sqlite_path(url).unwrap();
            let mut c = diesel::sqlite::SqliteConnection::establish(path).unwrap();
            c.batch_execute("PRAGMA busy_timeout = 10000").unwrap();
            c.batch_execute(statements).unwrap();
        }
    }
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// `SELECT count(*) AS n FROM …` (the query given whole).
fn count(backend: Backend, url: &str, query: &str) -> i64 {
    let rows: Vec<Count> = match backend {
        Backend::Postgres => {
            let mut c = diesel::pg::PgConnection::establish(url).unwrap();
            diesel::sql_query(query).load(&mut c).unwrap()
        }
        Backend::Sqlite => {
            let path = herald::storage::sqlite_path(url).unwrap();
            let mut c = diesel::sqlite::SqliteConnection::establish(path).unwrap();
            c.batch_execute("PRAGMA busy_timeout = 10000").unwrap();
            diesel::sql_query(query).load(&mut c).unwrap()
        }
    };
    rows[0].n
}

/// `n` webhook messages `{prefix}-{i}` (body `{"n": i}`) to `url`, in one plain-SQL statement.
fn enqueue_by_sql(backend: Backend, db_url: &str, prefix: &str, n: usize, url: &str) {
    let statement = match backend {
        Backend::Postgres => format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             SELECT '{prefix}-' || i, 'webhook', '{url}', \
                    jsonb_build_object('body', jsonb_build_object('n', i)) \
             FROM generate_series(1, {n}) AS i"
        ),
        Backend::Sqlite => format!(
            "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) \
             INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             SELECT '{prefix}-' || i, 'webhook', '{url}', \
                    json_object('body', json_object('n', i)) FROM s"
        ),
    };
    sql(backend, db_url, &statement);
}

/// Waits (bounded) until `SELECT count(*)…` reaches `want`.
async fn wait_count(backend: Backend, url: &str, query: &str, want: i64, what: &str) {
    let deadline = Instant::now() + SETTLE_WITHIN;
    loop {
        let (u, q) = (url.to_owned(), query.to_owned());
        let n = tokio::task::spawn_blocking(move || count(backend, &u, &q))
            .await
            .unwrap();
        if n >= want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {n} of {want} within {SETTLE_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Requests per `webhook-id`, after checking that each request's body is its own message's
/// (`{"n": i}` for `{prefix}-{i}`): a duplicate carries its original's event id, never another's.
fn requests_by_id(requests: &[Recorded], prefix: &str) -> HashMap<String, Vec<Recorded>> {
    let mut by_id: HashMap<String, Vec<Recorded>> = HashMap::new();
    for r in requests {
        let id = r
            .header("webhook-id")
            .expect("every request carries webhook-id");
        assert_eq!(
            r.header("idempotency-key"),
            Some(id),
            "Idempotency-Key is the event id"
        );
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            Some(id.to_owned()),
            body["n"].as_i64().map(|n| format!("{prefix}-{n}")),
            "the request for body {body} carries another message's event id"
        );
        by_id.entry(id.to_owned()).or_default().push(r.clone());
    }
    by_id
}

// --- Drill 1: SIGKILL while sending -------------------------------------------------------------

const KILL_MESSAGES: usize = 1200;
const KILLS: usize = 3;

async fn sigkill_while_sending(backend: Backend) {
    let mut rng = rng_for(&format!("sigkill-{backend:?}"));
    let db = TestDb::new(backend);
    let rx = Receiver::start().await;
    enqueue_by_sql(backend, &db.url, "kill", KILL_MESSAGES, &rx.url);
    let started = Instant::now();
    let mut in_flight_at_kill = Vec::new();
    for _ in 0..KILLS {
        let (mut h, _) = serve(&db.url, &[], None).await;
        // A random moment while it sends: after a random number of further requests, plus a
        // random few milliseconds.
        let seen = rx.requests().len();
        let more = rng.random_range(50..250);
        rx.wait_for(seen + more, 60).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..30))).await;
        let pid = h.child.id();
        h.sigkill();
        let leased = count(
            backend,
            &db.url,
            &format!(
                "SELECT count(*) AS n FROM herald_outbox \
                 WHERE state = 'sending' AND lease_owner LIKE 'herald-{pid}-%'"
            ),
        );
        in_flight_at_kill.push(leased);
    }
    // The last process finishes the work, the dead ones' leases included.
    let (mut h, _) = serve(&db.url, &[], None).await;
    wait_count(
        backend,
        &db.url,
        "SELECT count(*) AS n FROM herald_outbox WHERE state = 'delivered'",
        KILL_MESSAGES as i64,
        "delivered",
    )
    .await;
    let took = started.elapsed();
    assert!(h.terminate().await.success(), "{}", h.stderr());

    assert_eq!(
        count(backend, &db.url, "SELECT count(*) AS n FROM herald_outbox"),
        KILL_MESSAGES as i64
    );
    let requests = rx.requests();
    let by_id = requests_by_id(&requests, "kill");
    let expected: HashSet<String> = (1..=KILL_MESSAGES).map(|i| format!("kill-{i}")).collect();
    let seen: HashSet<String> = by_id.keys().cloned().collect();
    assert_eq!(
        seen, expected,
        "the receiver saw every event id, and no other"
    );
    let duplicates = requests.len() - by_id.len();
    eprintln!(
        "DRILL sigkill backend={backend:?} messages={KILL_MESSAGES} kills={KILLS} \
         requests={} duplicates={duplicates} duplicates_per_kill={:.1} \
         leased_at_kill={in_flight_at_kill:?} took_ms={}",
        requests.len(),
        duplicates as f64 / KILLS as f64,
        took.as_millis()
    );
    // A duplicate is a send whose outcome died with its process: only a row still leased to a
    // killed process (counted right after each kill, before the next process started) can be
    // sent again.
    let leased: i64 = in_flight_at_kill.iter().sum();
    assert!(
        duplicates as i64 <= leased,
        "{duplicates} duplicates, but only {leased} rows were leased to the killed processes"
    );
    assert!(
        in_flight_at_kill.iter().any(|&n| n > 0),
        "no kill caught a process mid-send: {in_flight_at_kill:?}"
    );
}

crate::both_backends!(sigkill_while_sending);

// --- Drill 2: the database restarted while sending and ingesting --------------------------------

/// One request of a load loop: when it was sent and answered, what came back.
#[derive(Debug, Clone)]
struct Answered {
    id: String,
    sent: Instant,
    answered: Instant,
    /// `None`: no HTTP answer at all.
    status: Option<u16>,
}

/// Posts signed receipts (`kind = "ingest"`) or messages (`"message"`) one after another until
/// `stop`, each with a fresh id; returns every request's fate.
async fn load_loop(
    kind: &'static str,
    lane: usize,
    base: String,
    rx_url: String,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<Answered> {
    use hmac::{Hmac, Mac};
    let http = client();
    let mut out = Vec::new();
    let mut i = 0usize;
    while !*stop.borrow() {
        i += 1;
        let id = format!("{kind}-{lane}-{i}");
        let sent = Instant::now();
        let request = if kind == "ingest" {
            let body = serde_json::to_vec(&json!({
                "id": id, "type": "delivered", "herald_event_id": format!("kill-{i}")
            }))
            .unwrap();
            let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"drill-esp").unwrap();
            mac.update(&body);
            http.post(format!("{base}/v1/ingest/esp"))
                .header("x-signature", hex::encode(mac.finalize().into_bytes()))
                .body(body)
        } else {
            http.post(format!("{base}/v1/messages"))
                .json(&crate::support::app::webhook(
                    &id,
                    &rx_url,
                    json!({"id": id}),
                ))
        };
        let status = request
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16());
        out.push(Answered {
            id,
            sent,
            answered: Instant::now(),
            status,
        });
    }
    out
}

/// A throwaway PostgreSQL cluster of the drill's own (it is stopped and started), with its
/// database `herald`, and that database's URL.
async fn own_cluster() -> (crate::support::db::Cluster, String) {
    let cluster = tokio::task::spawn_blocking(crate::support::db::Cluster::start_new)
        .await
        .unwrap();
    cluster.create_database("herald");
    let url = cluster.url_for("herald");
    (cluster, url)
}

/// A `herald serve` (with `env`) on a cluster of its own, one webhook of it in flight: the
/// receiver holds the request until `release` is notified.
struct HeldSend {
    cluster: crate::support::db::Cluster,
    url: String,
    _rx: Receiver,
    release: std::sync::Arc<tokio::sync::Notify>,
    herald: Herald,
}

async fn one_send_held(event_prefix: &str, env: &[(&str, &str)]) -> HeldSend {
    let (cluster, url) = own_cluster().await;
    let rx = Receiver::start().await;
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    rx.script([Reply::Held(release.clone(), 200)]);
    let (herald, _) = serve(&url, env, None).await;
    enqueue_by_sql(Backend::Postgres, &url, event_prefix, 1, &rx.url);
    rx.wait_for(1, 30).await;
    HeldSend {
        cluster,
        url,
        _rx: rx,
        release,
        herald,
    }
}

/// A shutdown with the database down is bounded: a send in flight when PostgreSQL goes away
/// finishes, its outcome cannot be written, and `herald serve` gives up on it at the first failed
/// try once `HERALD_SHUTDOWN_TIMEOUT_SECONDS` have passed since SIGTERM — counted from the signal,
/// not from the flusher's first failure — says so, and exits; before, it tried 20 times, each
/// waiting for the pool's 5 s connection timeout (about two minutes, past any process manager's
/// patience).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_the_database_down_gives_up_on_outcomes_in_time() {
    let held = one_send_held(
        "stop",
        &[
            ("HERALD_SHUTDOWN_TIMEOUT_SECONDS", "2"),
            ("HERALD_WEBHOOK_TIMEOUT_MS", "60000"),
            ("HERALD_LEASE_SECONDS", "70"),
        ],
    )
    .await;
    let (cluster, release, mut h) = (held.cluster, held.release, held.herald);
    let c = &cluster;
    std::thread::scope(|s| s.spawn(|| c.stop_immediately()).join().unwrap());
    let signalled = Instant::now();
    h.sigterm();
    h.wait_for_log("shutting down", Duration::from_secs(10))
        .await;
    // Past the shutdown timeout before the outcome's first try, so that try, the first to fail,
    // gives up; a clock started at the flusher's first failure would try a second time. This
    // wait is the condition itself (time since the signal), not a synchronization.
    tokio::time::sleep(Duration::from_secs(2)).await;
    release.notify_one();
    let status = h.wait_exit(Duration::from_secs(30)).await;
    let took = signalled.elapsed();
    let stderr = h.stderr();
    assert!(status.success(), "{status}; stderr:\n{stderr}");
    let gave_up: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("giving up on writing outcomes"))
        .collect();
    assert_eq!(gave_up.len(), 1, "stderr:\n{stderr}");
    assert!(
        gave_up[0].contains("rows=1")
            && gave_up[0].contains("tries=1 ")
            && gave_up[0].contains("stopping=true"),
        "{}",
        gave_up[0]
    );
    // The 2 s, then one failed try: at most the pool's 5 s connection timeout.
    assert!(
        took < Duration::from_secs(15),
        "exited {took:?} after SIGTERM; stderr:\n{stderr}"
    );
    eprintln!("DRILL shutdown-db-down exited {took:?} after SIGTERM");
}

/// A shutdown with the database hanging rather than down (its processes stopped: connections
/// open, nothing answered) is bounded too. The send in flight ends, its outcome's write waits
/// for an answer that never comes, and no try fails for the flusher to give up on; `herald
/// serve` exits with status 1 at its hard stop, the later of the shutdown timeout and the
/// longest send timeout plus 30 s after the signal, saying why. It waited for ever before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_the_database_hanging_stops_at_the_hard_stop() {
    let held = one_send_held(
        "hang",
        &[
            ("HERALD_SHUTDOWN_TIMEOUT_SECONDS", "1"),
            ("HERALD_WEBHOOK_TIMEOUT_MS", "3000"),
            ("HERALD_LEASE_SECONDS", "60"),
        ],
    )
    .await;
    let (cluster, url, release, mut h) = (held.cluster, held.url, held.release, held.herald);
    cluster.freeze();
    let signalled = Instant::now();
    h.sigterm();
    h.wait_for_log("shutting down", Duration::from_secs(10))
        .await;
    release.notify_one();
    let status = h.wait_exit(Duration::from_secs(60)).await;
    let took = signalled.elapsed();
    let stderr = h.stderr();
    assert_eq!(status.code(), Some(1), "{status}; stderr:\n{stderr}");
    assert!(
        stderr.contains("shutdown has not finished in time") && stderr.contains("seconds=33"),
        "stderr:\n{stderr}"
    );
    cluster.thaw();
    // Nothing was written for the send: its lease holds it until it expires.
    let mut c = diesel::pg::PgConnection::establish(&url).unwrap();
    #[derive(QueryableByName)]
    struct State {
        #[diesel(sql_type = diesel::sql_types::Text)]
        state: String,
    }
    let row: State = diesel::sql_query("SELECT state FROM herald_outbox")
        .get_result(&mut c)
        .unwrap();
    assert_eq!(row.state, "sending");
    eprintln!("DRILL shutdown-db-hanging exited {took:?} after SIGTERM (hard stop 33 s)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_restart_while_sending_and_ingesting() {
    let mut rng = rng_for("db-restart");
    let (cluster, url) = own_cluster().await;
    let c = &cluster;
    load_through_outage(
        "db-restart",
        &mut rng,
        &url,
        &[],
        || c.stop_immediately(),
        || c.start(),
    )
    .await;
}

/// Drill: the network between Herald and PostgreSQL cut without a word mid-run — every packet
/// dropped, no reset, no "unreachable", new connections left waiting (`support::link`) — then
/// mended. Unlike a restart, nothing tells Herald: each connection must find out by its own
/// timeouts, and the server's sessions of the connections Herald gave up on live on after the
/// link is back, in the middle of whatever transaction they were in. The URL sets the client's
/// timeouts short (`PARTITION_URL_TIMEOUTS`), as an operator who wants a quick failover would;
/// Herald carries them over to the server's side of each session, so the server ends those
/// sessions too, and their row locks (a claim that never committed, a group of receipts)
/// do not hold messages and receipts back until the system's keepalive (two hours) finds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_partition_while_sending_and_ingesting() {
    let mut rng = rng_for("partition");
    let cluster = tokio::task::spawn_blocking(crate::support::db::Cluster::start_behind_link)
        .await
        .unwrap();
    cluster.create_database("herald");
    let url = format!("{}?{PARTITION_URL_TIMEOUTS}", cluster.url_for("herald"));
    let link = cluster.link();
    let pool = PARTITION_POOL.to_string();
    load_through_outage(
        "partition",
        &mut rng,
        &url,
        &[("HERALD_DATABASE_POOL_SIZE", pool.as_str())],
        || link.cut(),
        || link.mend(),
    )
    .await;
    // The server's side, Herald stopped: its own sessions ended with it, and no session of a
    // connection it gave up on during the partition is left (each would hold a connection slot,
    // and one cut in a transaction its locks, until the system's keepalive found it).
    let sessions = "SELECT count(*) AS n FROM pg_stat_activity \
                    WHERE datname = 'herald' AND backend_type = 'client backend' \
                    AND pid <> pg_backend_pid()";
    let stopped = Instant::now();
    let deadline = stopped + Duration::from_secs(30);
    loop {
        let (u, q) = (url.clone(), sessions.to_owned());
        let n = tokio::task::spawn_blocking(move || count(Backend::Postgres, &u, &q))
            .await
            .unwrap();
        if n == 0 {
            eprintln!(
                "DRILL partition server_sessions_gone_after_exit_ms={}",
                stopped.elapsed().as_millis()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{n} sessions left on the server after Herald stopped: sessions of connections \
             it gave up on were never ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A write across a partition fails after one connection's `tcp_user_timeout`, not after each
/// pooled connection's in turn: `storage::pg_transaction` tries the next connection only when
/// a `BEGIN` failed at once (a connection the server closed), and here every one of the pool's
/// 6 connections would take 1 s to fail, then the pool's own 5 s wait for a new one. With the
/// retry unbounded, this write took 13.6 s; now about 1.4 s, and the bound is 3 s. Once the
/// link is mended, writes succeed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_across_a_partition_fails_after_one_connections_timeout() {
    use herald::storage::{Db, PoolOptions};
    const POOL: u32 = 6;
    let cluster = tokio::task::spawn_blocking(crate::support::db::Cluster::start_behind_link)
        .await
        .unwrap();
    cluster.create_database("herald");
    let url = format!(
        "{}?tcp_user_timeout=1000&keepalives_idle=30",
        cluster.url_for("herald")
    );
    let (took, after) = tokio::task::spawn_blocking(move || {
        let options = PoolOptions {
            max_size: POOL,
            ..PoolOptions::default()
        };
        let db = Db::connect(&url, &options).unwrap();
        db.migrate().unwrap();
        // Every connection of the pool opened, then idle in it.
        let Db::Pg(pool) = &db else { unreachable!() };
        let held: Vec<_> = (0..POOL).map(|_| pool.get().unwrap()).collect();
        drop(held);
        assert_eq!(pool.state().idle_connections, POOL);
        cluster.link().cut();
        let began = Instant::now();
        let cut = db.release_waiting();
        let took = began.elapsed();
        assert!(
            cut.as_ref().is_err_and(|e| e.is_unavailable()),
            "across the partition: {cut:?}"
        );
        cluster.link().mend();
        // The connections not tried carry on; a broken one fails once, at once, and the next
        // is tried.
        let after = db.release_waiting();
        (took, after.map_err(|e| e.to_string()))
    })
    .await
    .unwrap();
    eprintln!("DRILL partition-write failed_after_ms={}", took.as_millis());
    assert!(
        took < Duration::from_secs(3),
        "the write across the partition took {took:?}"
    );
    assert_eq!(after, Ok(0), "a write once the link is mended");
}

/// The partition drill's client timeouts, in the database URL: an unacknowledged request fails
/// after 2 s, and so does one waiting for an answer 2 s after it last heard anything (probes
/// from 1 s of silence; once one is out, the user timeout decides).
const PARTITION_URL_TIMEOUTS: &str =
    "tcp_user_timeout=2000&keepalives_idle=1&keepalives_interval=1&keepalives_count=2";
/// The partition drill's pool size.
const PARTITION_POOL: u32 = 6;

/// An outage under load, the part the restart and partition drills share: a backlog of
/// webhooks enqueued by SQL, then two loops posting signed receipts and one posting messages;
/// at a random moment while the backlog is sent, `begin` (the outage); 12 s later `end`. Load
/// goes on until sending has resumed, then a second longer. Checks that the same process rode
/// it out; that every request was answered (within the loops' 30 s), 2xx or 503 and nothing
/// else, and 503 when it was sent and answered while the database was out of reach; that every
/// acknowledged receipt is stored and every acknowledged message and the whole backlog
/// delivered and received; and readiness after. Prints the figures as `DRILL {drill} …`.
async fn load_through_outage(
    drill: &str,
    rng: &mut StdRng,
    url: &str,
    env: &[(&str, &str)],
    begin: impl FnOnce() + Send,
    end: impl FnOnce() + Send,
) {
    let rx = Receiver::start().await;
    let toml = "[sources.esp]\nscheme = \"hmac\"\nsecrets = [\"drill-esp\"]\n";
    let (mut h, base) = serve(url, env, Some(toml)).await;
    const BACKLOG: usize = 600;
    enqueue_by_sql(Backend::Postgres, url, "kill", BACKLOG, &rx.url);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut loops = Vec::new();
    for (kind, lane) in [("ingest", 0), ("ingest", 1), ("message", 0)] {
        loops.push(tokio::spawn(load_loop(
            kind,
            lane,
            base.clone(),
            rx.url.clone(),
            stop_rx.clone(),
        )));
    }
    // The outage begins at a random moment while the backlog is being sent.
    rx.wait_for(rng.random_range(50..250), 60).await;
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..50))).await;
    std::thread::scope(|s| s.spawn(begin).join().unwrap());
    let stopped = Instant::now();
    // Long enough for requests to begin and end within it: a request waits up to the pool's
    // 5 s connection timeout before its 503, and the first ones began before the outage.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let starting = Instant::now();
    std::thread::scope(|s| s.spawn(end).join().unwrap());
    let up = Instant::now();
    // Load goes on until both ingest and sending have recovered, then a little longer.
    let deadline = up + SETTLE_WITHIN;
    let sent_after_up = loop {
        if let Some(r) = rx.requests().iter().find(|r| r.at > up) {
            break r.at;
        }
        assert!(Instant::now() < deadline, "sending never resumed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop_tx.send(true).unwrap();
    let mut answers: Vec<(&str, Answered)> = Vec::new();
    for (l, kind) in loops.into_iter().zip(["ingest", "ingest", "message"]) {
        answers.extend(l.await.unwrap().into_iter().map(|a| (kind, a)));
    }
    assert!(
        h.child.try_wait().unwrap().is_none(),
        "the same process rode out the outage:\n{}",
        h.stderr()
    );

    // While it was down: 503, never 2xx; at any time: 2xx or 503, nothing else.
    let mut down_503 = 0;
    let mut slowest_while_down = Duration::ZERO;
    for (kind, a) in &answers {
        let status = a
            .status
            .unwrap_or_else(|| panic!("{kind} {} got no answer", a.id));
        assert!(
            (200..300).contains(&status) || status == 503,
            "{kind} {}: {status}",
            a.id
        );
        if a.sent >= stopped && a.answered <= starting {
            assert_eq!(status, 503, "{kind} {} answered {status} while down", a.id);
            down_503 += 1;
        }
        if a.sent >= stopped && a.sent <= starting {
            slowest_while_down = slowest_while_down.max(a.answered.duration_since(a.sent));
        }
    }
    if down_503 == 0 {
        for (kind, a) in &answers {
            if a.answered >= stopped && a.sent <= up {
                eprintln!(
                    "{kind} {} sent {:?} answered {:?} (after the outage began) {:?}",
                    a.id,
                    a.sent.checked_duration_since(stopped),
                    a.answered.duration_since(stopped),
                    a.status
                );
            }
        }
    }
    assert!(
        down_503 > 0,
        "no request was answered while the database was out of reach"
    );
    let first_ingest_ok = answers
        .iter()
        .filter(|(k, a)| *k == "ingest" && a.answered > up && a.status == Some(200))
        .map(|(_, a)| a.answered)
        .min()
        .expect("ingest recovered");

    // Nothing acknowledged is lost: every 2xx receipt is stored, every 2xx message delivered
    // (with the backlog), and received.
    let acked = |kind: &str| -> Vec<String> {
        answers
            .iter()
            .filter(|(k, a)| *k == kind && a.status.is_some_and(|s| (200..300).contains(&s)))
            .map(|(_, a)| a.id.clone())
            .collect()
    };
    let receipts = acked("ingest");
    let messages = acked("message");
    // `IN (NULL)` when there are none: `IN ()` is not SQL.
    let list = |ids: &[String]| {
        if ids.is_empty() {
            return "NULL".to_owned();
        }
        ids.iter()
            .map(|i| format!("'{i}'"))
            .collect::<Vec<_>>()
            .join(",")
    };
    assert_eq!(
        count(
            Backend::Postgres,
            url,
            &format!(
                "SELECT count(*) AS n FROM herald_receipts WHERE provider_event_id IN ({})",
                list(&receipts)
            )
        ),
        receipts.len() as i64,
        "an acknowledged receipt is missing"
    );
    // Counted among the acknowledged only: a request answered 503 whose commit went through
    // (its answer lost with the connection) is stored and sent too, and counting every
    // delivered row could reach the total while an acknowledged message still waits.
    let total = BACKLOG + messages.len();
    wait_count(
        Backend::Postgres,
        url,
        &format!(
            "SELECT count(*) AS n FROM herald_outbox WHERE state = 'delivered' \
             AND (event_id LIKE 'kill-%' OR event_id IN ({}))",
            list(&messages)
        ),
        total as i64,
        "acknowledged messages delivered",
    )
    .await;
    let seen: HashSet<String> = rx.event_ids().into_iter().collect();
    for id in messages.iter().chain(
        (1..=BACKLOG)
            .map(|i| format!("kill-{i}"))
            .collect::<Vec<_>>()
            .iter(),
    ) {
        assert!(seen.contains(id), "{id} acknowledged but never received");
    }
    let r = client().get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200, "ready again after the outage");
    let duplicates = rx.requests().len() - seen.len();
    eprintln!(
        "DRILL {drill} down_ms={} ingest_recovery_ms={} sending_recovery_ms={} \
         answered_503_while_down={down_503} slowest_answer_while_down_ms={} receipts_acked={} \
         messages_acked={} backlog={BACKLOG} duplicates={duplicates}",
        starting.duration_since(stopped).as_millis(),
        first_ingest_ok.duration_since(up).as_millis(),
        sent_after_up.duration_since(up).as_millis(),
        slowest_while_down.as_millis(),
        receipts.len(),
        messages.len(),
    );
    assert!(h.terminate().await.success(), "{}", h.stderr());
}

/// Outcomes that cannot be written while the database is unavailable are written once it is
/// back, however many tries that takes: giving up (as the flusher did after 20 tries, whatever
/// the error) made each of those sends count again once its lease ran out — a delivered webhook
/// sent twice. The database here answers the attempt-row insert of one delivered webhook's
/// outcome with a serialization failure (SQLSTATE 40001, "try again later" to Herald) 21 times,
/// from a trigger counting on a sequence, which no rollback resets; each try fails at once, so
/// the test waits only for the flusher's pauses (about 23 s). A second webhook, answered a second
/// later, waits in the flusher's queue behind that batch. The lease (7 s) runs out long before:
/// this process's watchdog must leave both rows alone (the trigger lets its `lease_expired`
/// attempt rows in, and a row it returned would be sent again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_are_written_after_more_failed_tries_than_other_errors_get() {
    const FAILURES: i64 = 21;
    let app = crate::support::app::spawn_app_with(
        Backend::Postgres,
        "lease_seconds = 7\nwebhook_timeout_ms = 2000\n",
    )
    .await;
    let rx = Receiver::start().await;
    rx.script_path("/queued", [Reply::Delayed(1_000, 200)]);
    app.raw_sql(&format!(
        "CREATE SEQUENCE drill_outage;
         CREATE FUNCTION drill_outage() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.event_id = 'outage-1' AND NEW.class = 'accepted'
                AND nextval('drill_outage') <= {FAILURES} THEN
                 RAISE EXCEPTION 'drill: not now' USING ERRCODE = '40001';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER drill_outage BEFORE INSERT ON herald_attempts
             FOR EACH ROW EXECUTE FUNCTION drill_outage();
         INSERT INTO herald_outbox (event_id, channel, destination, payload)
         VALUES ('outage-1', 'webhook', '{}', '{{\"body\": {{}}}}'),
                ('outage-2', 'webhook', '{}', '{{\"body\": {{}}}}');",
        rx.url_for("/stuck"),
        rx.url_for("/queued"),
    ));
    let started = Instant::now();
    let sender = app.start_sender();
    rx.wait_for(2, 30).await;
    let deadline = started + Duration::from_secs(60);
    let delivered = |id: &str| app.row(id).state == herald::domain::State::Delivered;
    while !(delivered("outage-1") && delivered("outage-2")) {
        assert!(
            Instant::now() < deadline,
            "not delivered within 60 s: {:?}, {:?} after {} failed writes",
            app.row("outage-1").state,
            app.row("outage-2").state,
            count(
                Backend::Postgres,
                &app.test_db.url,
                "SELECT last_value AS n FROM drill_outage"
            )
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed();
    sender.stop().await;
    // Every failure was a try of the first outcome, and the next try wrote it.
    assert_eq!(
        count(
            Backend::Postgres,
            &app.test_db.url,
            "SELECT last_value AS n FROM drill_outage"
        ),
        FAILURES + 1
    );
    for id in ["outage-1", "outage-2"] {
        let row = app.row(id);
        assert_eq!((row.attempts, row.lease_owner), (1, None), "{id}");
        assert_eq!(
            count(
                Backend::Postgres,
                &app.test_db.url,
                &format!(
                    "SELECT count(*) AS n FROM herald_attempts WHERE event_id = '{id}' \
                     AND class = 'accepted' AND next_state = 'delivered'"
                )
            ),
            1,
            "{id}"
        );
    }
    let mut sent = rx.event_ids();
    sent.sort();
    assert_eq!(sent, ["outage-1", "outage-2"], "each sent once");
    eprintln!(
        "DRILL outcome-retries failed_writes={FAILURES} delivered_after_ms={}",
        took.as_millis()
    );
}

// --- Drill 3: two Herald processes on one database, one killed mid-batch ------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_one_killed_mid_batch() {
    const MESSAGES: usize = 800;
    const ROLLBACKS: usize = 5;
    let mut rng = rng_for("two-processes");
    let db = TestDb::new(Backend::Postgres);
    let rx = Receiver::start().await;
    enqueue_by_sql(Backend::Postgres, &db.url, "two", MESSAGES, &rx.url);
    let (mut a, _) = serve(&db.url, &[], None).await;
    let (mut b, _) = serve(&db.url, &[], None).await;

    // Meanwhile an application enqueues inside transactions that roll back.
    let (url, rx_url) = (db.url.clone(), rx.url.clone());
    let rollbacks = tokio::task::spawn_blocking(move || {
        let mut c = diesel::pg::PgConnection::establish(&url).unwrap();
        for k in 0..ROLLBACKS {
            c.batch_execute(&format!(
                "BEGIN; \
                 INSERT INTO herald_outbox (event_id, channel, destination, payload) \
                 VALUES ('rolled-back-{k}', 'webhook', '{rx_url}', '{{\"body\": {{\"n\": -1}}}}'); \
                 SELECT pg_sleep(0.2); ROLLBACK;"
            ))
            .unwrap();
        }
    });

    rx.wait_for(rng.random_range(100..300), 60).await;
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..30))).await;
    let pid = a.child.id();
    a.sigkill();
    let leased_to_killed = count(
        Backend::Postgres,
        &db.url,
        &format!(
            "SELECT count(*) AS n FROM herald_outbox \
             WHERE state = 'sending' AND lease_owner LIKE 'herald-{pid}-%'"
        ),
    );
    rollbacks.await.unwrap();
    wait_count(
        Backend::Postgres,
        &db.url,
        "SELECT count(*) AS n FROM herald_outbox WHERE state = 'delivered'",
        MESSAGES as i64,
        "delivered",
    )
    .await;
    assert!(b.terminate().await.success(), "{}", b.stderr());

    let requests = rx.requests();
    for r in &requests {
        let id = r.header("webhook-id").unwrap();
        assert!(
            !id.starts_with("rolled-back-"),
            "a rolled-back enqueue was sent: {id}"
        );
    }
    assert_eq!(
        count(
            Backend::Postgres,
            &db.url,
            "SELECT count(*) AS n FROM herald_outbox WHERE event_id LIKE 'rolled-back-%'"
        ),
        0
    );
    let by_id = requests_by_id(&requests, "two");
    assert_eq!(by_id.len(), MESSAGES, "every message was received");
    // No claim was sent by both while its lease held: a second request for an event id comes
    // only after the first one's lease ran out (claimed at most a send timeout and a moment
    // before its request arrived) and the watchdog returned it.
    let lease = Duration::from_secs(LEASE_SECONDS);
    let slack = Duration::from_millis(WEBHOOK_TIMEOUT_MS + 200);
    let mut resent = Vec::new();
    for (id, rs) in &by_id {
        for pair in rs.windows(2) {
            let gap = pair[1].at.duration_since(pair[0].at);
            assert!(
                gap + slack >= lease,
                "{id} was sent twice {gap:?} apart, within one {lease:?} lease"
            );
        }
        if rs.len() > 1 {
            resent.push(id.clone());
        }
    }
    let duplicates = requests.len() - by_id.len();
    if !resent.is_empty() {
        let list = resent
            .iter()
            .map(|i| format!("'{i}'"))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(
            count(
                Backend::Postgres,
                &db.url,
                &format!(
                    "SELECT count(DISTINCT event_id) AS n FROM herald_attempts \
                     WHERE error_kind = 'lease_expired' AND event_id IN ({list})"
                )
            ),
            resent.len() as i64,
            "every resent message went through the watchdog"
        );
    }
    assert!(
        duplicates as i64 <= leased_to_killed,
        "{duplicates} duplicates, {leased_to_killed} rows leased to the killed process"
    );
    assert_eq!(
        count(
            Backend::Postgres,
            &db.url,
            "SELECT count(*) AS n FROM herald_attempts WHERE next_state = 'lease_lost'"
        ),
        0,
        "no outcome was refused by the fence: no lease was taken over while it held"
    );
    assert!(
        leased_to_killed > 0,
        "the killed process held no claim: not killed mid-batch"
    );
    eprintln!(
        "DRILL two-processes messages={MESSAGES} leased_to_killed={leased_to_killed} \
         duplicates={duplicates} rolled_back={ROLLBACKS} rolled_back_sent=0"
    );
}

// --- Drill 4: receivers misbehaving at scale ----------------------------------------------------

/// What the receivers answer, as the classification table sees it.
fn class_of(reply: &Reply) -> herald::domain::AttemptClass {
    use herald::domain::AttemptClass;
    use herald::domain::classify::classify_http_status;
    match reply {
        Reply::Status(s)
        | Reply::Full(s, _, _)
        | Reply::Delayed(_, s)
        | Reply::Held(_, s)
        | Reply::Echo(s) => classify_http_status(*s),
        // README "States and classification": a timeout after the request was sent, or the
        // connection lost after sending, is ambiguous.
        Reply::Hang | Reply::Drop => AttemptClass::Ambiguous,
    }
}

/// The end a message must reach when its attempts get `script` in turn (then 200s): the state,
/// its `last_error_class` and the number of attempts, by the sender's own pure decision.
fn expected_end(
    script: &[Reply],
    max_attempts: u32,
    semantics: herald::domain::Semantics,
) -> (
    herald::domain::State,
    Option<herald::domain::AttemptClass>,
    u32,
) {
    use herald::sender::decide::{AttemptFacts, decide};
    let policy =
        herald::sender::policy::RetryPolicy::new("drill".into(), 0.05, 0.5, 15, 1.0, 0.2).unwrap();
    let now = chrono::Utc::now();
    for attempt in 1.. {
        let reply = script
            .get(attempt as usize - 1)
            .unwrap_or(&Reply::Status(200));
        let class = class_of(reply);
        let retry_after = matches!(reply, Reply::Full(429, _, _)).then(|| Duration::from_secs(1));
        let d = decide(
            AttemptFacts {
                class,
                retry_after,
                attempt,
                max_attempts,
                semantics,
            },
            &policy,
            now,
            0.5,
        );
        if d.state != herald::domain::State::Retryable {
            return (d.state, d.error_class, attempt);
        }
    }
    unreachable!()
}

async fn receivers_misbehaving_at_scale(backend: Backend) {
    use herald::domain::{Semantics, State};
    const MESSAGES: usize = 300;
    const RECEIVERS: usize = 4;
    let mut rng = rng_for(&format!("misbehaving-{backend:?}"));
    let app = crate::support::app::spawn_app_with(
        backend,
        &format!(
            "poll_interval_ms = 20\nlease_seconds = {LEASE_SECONDS}\n\
             webhook_timeout_ms = {WEBHOOK_TIMEOUT_MS}\nwebhook_connect_timeout_ms = 250\n\
             retry_base_seconds = 0.05\nretry_cap_seconds = 0.5\nretry_after_max_seconds = 1\n\
             retry_max_attempts = 15\nsender_concurrency = 32\n"
        ),
    )
    .await;
    let mut receivers = Vec::new();
    for _ in 0..RECEIVERS {
        receivers.push(Receiver::start().await);
    }
    let menu = |rng: &mut StdRng| match rng.random_range(0..10) {
        0..=2 => Reply::Status(200),
        3 => Reply::Full(429, vec![("Retry-After".into(), "1".into())], String::new()),
        4 | 5 => Reply::Status(503),
        6 => Reply::Status(409),
        7 => Reply::Hang,
        8 => Reply::Drop,
        _ => Reply::Status(400),
    };
    let mut plan = Vec::new();
    let mut values = Vec::new();
    for i in 0..MESSAGES {
        let script: Vec<Reply> = (0..rng.random_range(0..4))
            .map(|_| menu(&mut rng))
            .collect();
        let max_attempts = rng.random_range(1..=4u32);
        let semantics = if rng.random_bool(0.25) {
            Semantics::AtMostOnce
        } else {
            Semantics::AtLeastOnce
        };
        let rx = &receivers[i % RECEIVERS];
        let path = format!("/m/{i}");
        rx.script_path(&path, script.clone());
        values.push(format!(
            "('mis-{i}', 'webhook', '{}', '{{\"body\": {{\"n\": {i}}}}}', '{semantics}', {max_attempts})",
            rx.url_for(&path)
        ));
        let expected = expected_end(&script, max_attempts, semantics);
        plan.push((format!("mis-{i}"), i % RECEIVERS, path, script, expected));
    }
    app.raw_sql(&format!(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload, semantics, max_attempts) \
         VALUES {}",
        values.join(", ")
    ));
    let started = Instant::now();
    let sender = app.start_sender();
    wait_count(
        backend,
        &app.test_db.url,
        "SELECT count(*) AS n FROM herald_outbox \
         WHERE state IN ('delivered', 'dead_letter', 'unconfirmed')",
        MESSAGES as i64,
        "settled",
    )
    .await;
    let took = started.elapsed();
    sender.stop().await;

    let mut by_state: std::collections::BTreeMap<String, usize> = Default::default();
    let mut requests = 0;
    for (id, r, path, script, (state, class, attempts)) in &plan {
        let row = app.row(id);
        assert_eq!(
            (row.state, row.last_error_class, row.attempts),
            (*state, *class, *attempts as i32),
            "{id}: state, class, attempts"
        );
        let got = receivers[*r].requests_to(path);
        assert_eq!(got.len(), *attempts as usize, "{id}: requests received");
        assert!(
            got.iter()
                .all(|g| g.header("webhook-id") == Some(id.as_str()))
        );
        let rows = app.attempts(id);
        assert_eq!(
            rows.len(),
            *attempts as usize,
            "{id}: one attempt row per request"
        );
        for (k, a) in rows.iter().enumerate() {
            let answered = script
                .get(k)
                .map_or(herald::domain::AttemptClass::Accepted, class_of);
            assert_eq!(a.class, answered, "{id}: attempt {} classified", k + 1);
        }
        assert!(
            row.attempts <= row.max_attempts.unwrap(),
            "{id}: attempt budget respected"
        );
        assert_ne!(row.state, State::Sending);
        *by_state.entry(format!("{state}")).or_default() += 1;
        requests += got.len();
    }
    eprintln!(
        "DRILL misbehaving backend={backend:?} messages={MESSAGES} requests={requests} \
         end_states={by_state:?} took_ms={}",
        took.as_millis()
    );
}

crate::both_backends!(receivers_misbehaving_at_scale);
