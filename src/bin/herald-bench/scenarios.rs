//! The scenarios. Each is bounded (a message count or a time window, and a time limit on
//! waits) and returns its figures; the baselines are measured here, in the same run.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::sqlite::SqliteConnection;
use diesel::{Connection, QueryableByName, RunQueryDsl};

use crate::peers::{HttpReceiver, SmtpServer};
use crate::pg::DbStats;
pub use crate::pg::MARK;
use crate::proc::HeraldProc;
use crate::{Ctx, Figure, Target};

/// Concurrent sends: Herald's `sender_concurrency` and the baseline client's.
pub const CONCURRENCY: usize = 64;
/// Concurrent ingest clients (and pgbench clients for the baseline).
pub const INGEST_CLIENTS: usize = 16;
/// The longest any wait for deliveries may take.
pub const WAIT_LIMIT: Duration = Duration::from_secs(600);

/// The webhook body every dispatch scenario sends (and the baseline client too).
/// The statements that took the most database time since the last reset, on stderr (where the
/// profile in the README's Performance section starts).
fn print_top_statements(conn: &mut PgConnection) -> Result<()> {
    eprintln!("   top statements (total ms, calls):");
    for (q, calls, total) in crate::pg::top_statements(conn, 8)? {
        eprintln!("   {total:>9.1} ms {calls:>7}  {q}");
    }
    Ok(())
}

/// The SQL expression of row `i`'s payload: `{"body": …}` of about 250 bytes.
pub fn body_json_sql() -> &'static str {
    "jsonb_build_object('body', jsonb_build_object('type', 'order.placed', 'data', \
     jsonb_build_object('id', i, 'note', repeat('x', 200))))"
}

fn baseline_payload() -> Vec<u8> {
    serde_json::to_vec(
        &serde_json::json!({"type": "order.placed", "data": {"id": 1, "note": "x".repeat(200)}}),
    )
    .unwrap_or_default()
}

/// Sender settings of every dispatch scenario. `destination_max_in_flight` defaults to half of
/// `sender_concurrency`; with a single receiver it is raised to the full concurrency, so that
/// Herald and the baseline run the same number of requests at once.
fn sender_toml(poll_ms: u64) -> String {
    format!(
        "sender_concurrency = {CONCURRENCY}\nsender_batch_size = 100\n\
         destination_max_in_flight = {CONCURRENCY}\npoll_interval_ms = {poll_ms}\n"
    )
}

/// The same HTTP client (reqwest), concurrency, receiver and payload, with no database: in this
/// process, or (`child`) from a process of its own ([`in_child`]), so that each request crosses
/// processes, as Herald's do. Measured once a run each.
fn http_baseline(ctx: &mut Ctx, child: bool) -> Result<f64> {
    let n = ctx.sizes.dispatch_messages;
    let cached = if child {
        &mut ctx.http_baseline_in_child
    } else {
        &mut ctx.http_baseline
    };
    if let Some(b) = *cached {
        return Ok(b);
    }
    let rate = ctx.rt.block_on(async move {
        let rx = HttpReceiver::start().await?;
        match child {
            false => http_clients(rx.url.clone(), n).await,
            true => in_child("http", &rx.url, n).await,
        }
    })?;
    *cached = Some(rate);
    Ok(rate)
}

/// [`CONCURRENCY`] reqwest tasks posting the baseline payload to `url` (at least `n` requests and
/// at least two seconds: a short burst on a shared machine says more about the neighbours than
/// about the receiver); requests per second.
async fn http_clients(url: String, n: usize) -> Result<f64> {
    let client = reqwest::Client::new();
    let payload = baseline_payload();
    let (next, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let start = Instant::now();
    let window = Duration::from_secs(2);
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let (client, url, payload, next, done) = (
            client.clone(),
            url.clone(),
            payload.clone(),
            next.clone(),
            done.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < n || start.elapsed() < window {
                let r = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(payload.clone())
                    .send()
                    .await?;
                ensure!(
                    r.status().is_success(),
                    "baseline receiver said {}",
                    r.status()
                );
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// `sql`'s one `n` (a count), marked as the benchmark's own statement.
pub fn count_sql(conn: &mut PgConnection, sql: &str) -> Result<i64> {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let r: N = diesel::sql_query(format!("{MARK} {sql}")).get_result(conn)?;
    Ok(r.n)
}

/// What one PostgreSQL dispatch run measured.
struct DispatchRun {
    rate: f64,
    stats: DbStats,
    messages: usize,
    duplicates: usize,
    rss_peak: f64,
}

/// `procs` Herald processes on one fresh database; `n` rows enqueued by one SQL statement;
/// timed from its commit until every row is `delivered`.
fn run_dispatch_pg(ctx: &mut Ctx, db: &str, procs: usize, n: usize) -> Result<DispatchRun> {
    run_dispatch_pg_keyed(ctx, db, procs, n, None)
}

/// As [`run_dispatch_pg`], each row's `ordering_key` the SQL expression `key` of the series
/// number `i` (README, "Ordered delivery"); `None`: unkeyed.
fn run_dispatch_pg_keyed(
    ctx: &mut Ctx,
    db: &str,
    procs: usize,
    n: usize,
    key: Option<&str>,
) -> Result<DispatchRun> {
    let url = ctx.cluster()?.fresh(db)?;
    let (key_col, key_val) = match key {
        Some(k) => (", ordering_key", format!(", {k}")),
        None => ("", String::new()),
    };
    ctx.rt.block_on(async move {
        let rx = HttpReceiver::start().await?;
        let mut own_xacts = 0i64;
        let before = {
            let mut c = PgConnection::establish(&url)?;
            own_xacts += 1;
            DbStats::read(&mut c)?
        };
        let mut herald = Vec::new();
        for _ in 0..procs {
            herald.push(HeraldProc::start(&url, &sender_toml(1000)).await?);
        }
        let mut conn = PgConnection::establish(&url)?;
        let insert = format!(
            "{MARK} INSERT INTO herald_outbox (event_id, channel, destination, payload{key_col}) \
             SELECT 'm-' || i, 'webhook', '{}', {}{key_val} FROM generate_series(1, {n}) AS i",
            rx.url,
            body_json_sql()
        );
        conn.batch_execute(&insert)?;
        own_xacts += 1;
        let start = Instant::now();
        ensure!(
            rx.tally.wait_for(n, WAIT_LIMIT).await,
            "only {} of {n} messages arrived",
            rx.tally.count()
        );
        loop {
            own_xacts += 1;
            let done = count_sql(
                &mut conn,
                "SELECT count(*) AS n FROM herald_outbox WHERE state = 'delivered'",
            )?;
            if done as usize >= n {
                break;
            }
            ensure!(start.elapsed() < WAIT_LIMIT, "outcomes not recorded");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let rate = n as f64 / start.elapsed().as_secs_f64();
        let mut rss_peak = 0.0f64;
        for h in &herald {
            rss_peak = rss_peak.max(h.rss_mib()?.1);
        }
        for h in herald {
            h.stop().await?;
        }
        drop(conn);
        // Backends report their transaction counts when they end.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut c = PgConnection::establish(&url)?;
        let mut stats = DbStats::read(&mut c)?.since(before);
        stats.xacts -= own_xacts;
        if procs == 1 {
            print_top_statements(&mut c)?;
        }
        Ok(DispatchRun {
            rate,
            stats,
            messages: n,
            duplicates: rx.tally.duplicates(),
            rss_peak,
        })
    })
}

/// One Herald process draining `n` rows on a fresh database `db`, msg/s (no duplicate allowed).
pub fn dispatch_rate(ctx: &mut Ctx, db: &str, n: usize) -> Result<f64> {
    let r = run_dispatch_pg(ctx, db, 1, n)?;
    ensure!(r.duplicates == 0, "{} duplicate deliveries", r.duplicates);
    Ok(r.rate)
}

pub fn dispatch_pg(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let baseline = http_baseline(ctx, false)?;
    let in_child = http_baseline(ctx, true)?;
    let n = ctx.sizes.dispatch_messages;
    let r = run_dispatch_pg(ctx, "bench_dispatch", 1, n)?;
    ensure!(r.duplicates == 0, "{} duplicate deliveries", r.duplicates);
    let per = r.messages as f64;
    Ok(vec![
        Figure::measured("dispatch_pg", r.rate, baseline, "msg/s")
            .target(Target::RatioAtLeast(0.25))
            .note(format!(
                "{n} rows by SQL, {CONCURRENCY} concurrent, baseline: reqwest without a database"
            )),
        Figure::measured("dispatch_pg_vs_client_process", r.rate, in_child, "msg/s").note(
            "dispatch_pg's rate; baseline: the same reqwest client from a process of its own, as Herald is",
        ),
        Figure::against_target(
            "db_us_per_message",
            r.stats.exec_ms * 1000.0 / per,
            Target::AtMost(15.0),
            "us",
        )
        .note(format!("pg_stat_statements, {} statements", r.stats.calls)),
        Figure::against_target(
            "tx_per_message",
            r.stats.xacts as f64 / per,
            Target::AtMost(0.05),
            "tx",
        )
        .note(format!("pg_stat_database, {} transactions", r.stats.xacts)),
        Figure::against_target("rss_peak_mib", r.rss_peak, Target::AtMost(128.0), "MiB")
            .note("VmHWM of herald serve during dispatch_pg"),
    ])
}

/// Ordered delivery's cost: `n` rows over 1,000 ordering keys, and fewer rows in one hot key
/// (one message of a key in flight at a time: one round trip each), each against the unkeyed
/// rate measured in this run.
pub fn dispatch_pg_keyed(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let n = ctx.sizes.dispatch_messages;
    let hot = (n / 10).max(100);
    let unkeyed = run_dispatch_pg_keyed(ctx, "bench_unkeyed", 1, n, None)?;
    let keyed = run_dispatch_pg_keyed(ctx, "bench_keyed", 1, n, Some("'order-' || (i % 1000)"))?;
    let hot_key = run_dispatch_pg_keyed(ctx, "bench_hot_key", 1, hot, Some("'order-hot'"))?;
    for (name, r) in [
        ("keyed", &keyed),
        ("hot key", &hot_key),
        ("unkeyed", &unkeyed),
    ] {
        ensure!(
            r.duplicates == 0,
            "{name}: {} duplicate deliveries",
            r.duplicates
        );
    }
    Ok(vec![
        Figure::measured("dispatch_pg_keyed", keyed.rate, unkeyed.rate, "msg/s").note(format!(
            "{n} rows over 1,000 keys; baseline: {n} unkeyed rows in this run"
        )),
        Figure::measured("dispatch_pg_hot_key", hot_key.rate, unkeyed.rate, "msg/s").note(format!(
            "{hot} rows in one key; baseline: {n} unkeyed rows in this run"
        )),
    ])
}

pub fn dispatch_pg_procs(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let n = ctx.sizes.procs_messages;
    // In the order 1, 2, 4, 2, 1 processes, each count's figure the mean of its runs: a drift of
    // the shared machine's load over the scenario weighs on 1 and 2 processes alike, where in the
    // order 1, 2, 4 the 2-process run came a few seconds after its baseline (runs of about 1.3 s,
    // 0.72 to 1.13 of one process in five runs of that order here).
    let mut runs: Vec<(usize, f64)> = Vec::new();
    for (i, procs) in [1usize, 2, 4, 2, 1].into_iter().enumerate() {
        let r = run_dispatch_pg(ctx, &format!("bench_procs_{i}_{procs}"), procs, n)?;
        ensure!(
            r.duplicates == 0,
            "{procs} processes: {} duplicate deliveries",
            r.duplicates
        );
        runs.push((procs, r.rate));
    }
    let of = |procs: usize| -> Vec<f64> {
        runs.iter()
            .filter(|(p, _)| *p == procs)
            .map(|(_, r)| *r)
            .collect()
    };
    let mean = |rates: &[f64]| rates.iter().sum::<f64>() / rates.len() as f64;
    let list = |rates: &[f64]| {
        rates
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(" and ")
    };
    let one = of(1);
    let mut figs = Vec::new();
    for procs in [1usize, 2, 4] {
        let rates = of(procs);
        let mut f = Figure::measured(
            &format!("dispatch_pg_procs_{procs}"),
            mean(&rates),
            mean(&one),
            "msg/s",
        )
        .note(match procs {
            1 => format!(
                "{n} messages a run, 0 duplicates; runs in the order 1, 2, 4, 2, 1 processes, 1 process's {} msg/s",
                list(&rates)
            ),
            _ => format!(
                "{n} messages a run, 0 duplicates; runs in the order 1, 2, 4, 2, 1 processes, this count's {} msg/s; baseline: 1 process",
                list(&rates)
            ),
        });
        if procs == 2 {
            f = f.target(Target::RatioAtLeast(1.0));
        }
        figs.push(f);
    }
    Ok(figs)
}

/// A signed Standard Webhooks receipt of about 1 KiB.
fn receipt(n: usize) -> (String, String, String, Vec<u8>) {
    let id = format!("msg_{n}");
    let body = format!(
        r#"{{"type":"email.delivered","created_at":"2026-11-30T10:00:00Z","data":{{"email_id":"em_{n}","to":["user{n}@example.com"],"subject":"Order {n}","note":"{}"}}}}"#,
        "x".repeat(860)
    )
    .into_bytes();
    let t = chrono::Utc::now().timestamp();
    let sig = herald::crypto::signing::SigningKey::parse(crate::proc::SECRET)
        .map(|k| k.sign(&id, t, &body))
        .unwrap_or_default();
    (id, t.to_string(), sig, body)
}

/// What a window of requests did: how many were answered, per second, and the latencies.
struct Load {
    answered: usize,
    rate: f64,
    p50: f64,
    p99: f64,
}

/// `INGEST_CLIENTS` clients posting receipts for `window`.
async fn ingest_load(base: &str, window: Duration) -> Result<Load> {
    let url = format!("{base}/v1/ingest/bench");
    http_load(window, 200, move |client, n| {
        let (id, t, sig, body) = receipt(n);
        client
            .post(&url)
            .header("webhook-id", id)
            .header("webhook-timestamp", t)
            .header("webhook-signature", sig)
            .header("content-type", "application/json")
            .body(body)
    })
    .await
}

/// `INGEST_CLIENTS` clients each sending the requests `request` builds (its second argument
/// numbers them from 0, across clients) for `window`, one at a time; every answer must be
/// `expect`.
async fn http_load<F>(window: Duration, expect: u16, request: F) -> Result<Load>
where
    F: Fn(&reqwest::Client, usize) -> reqwest::RequestBuilder + Clone + Send + 'static,
{
    let client = reqwest::Client::new();
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let deadline = start + window;
    let mut tasks = Vec::new();
    for _ in 0..INGEST_CLIENTS {
        let (client, next, request) = (client.clone(), next.clone(), request.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let req = request(&client, next.fetch_add(1, Ordering::Relaxed));
                let sent = Instant::now();
                let r = req.send().await?;
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                ensure!(status == expect, "answered {status}: {text}");
                lat.push(sent.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    ensure!(!lat.is_empty(), "no request completed");
    Ok(Load {
        answered: lat.len(),
        rate: lat.len() as f64 / elapsed,
        p50: percentile(&lat, 50.0),
        p99: percentile(&lat, 99.0),
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// SQLite's own single-row `INSERT` + commit (WAL, `synchronous = FULL`) of about 1 KiB from
/// `INGEST_CLIENTS` threads for `window`, one writer at a time (SQLite has one), into a fresh
/// file; rows/s.
fn sqlite_single_insert_baseline(ctx: &Ctx, window: Duration) -> Result<f64> {
    let base_path = ctx.work_dir.join("baseline.db");
    // A fresh file each time: another scenario's baseline left its rows there.
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", base_path.display()));
    }
    let mut c = sqlite_conn(&base_path)?;
    c.batch_execute(
        "CREATE TABLE IF NOT EXISTS bench_single (id INTEGER PRIMARY KEY, v INTEGER NOT NULL, body TEXT NOT NULL)",
    )?;
    drop(c);
    let lock = Arc::new(std::sync::Mutex::new(()));
    let done = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..INGEST_CLIENTS)
        .map(|k| {
            let (lock, done, path) = (lock.clone(), done.clone(), base_path.clone());
            std::thread::spawn(move || -> Result<()> {
                let mut c = sqlite_conn(&path)?;
                let body = "x".repeat(1000);
                let mut v = k as i64;
                while start.elapsed() < window {
                    let _w = lock.lock().unwrap_or_else(|p| p.into_inner());
                    diesel::sql_query("INSERT INTO bench_single (v, body) VALUES (?, ?)")
                        .bind::<diesel::sql_types::BigInt, _>(v)
                        .bind::<diesel::sql_types::Text, _>(&body)
                        .execute(&mut c)?;
                    v += INGEST_CLIENTS as i64;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("baseline thread panicked"))??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// A fresh database `db` of the cluster, and PostgreSQL's single-row `INSERT` + commit of about
/// 1 KiB into a table of its own there, by pgbench with `INGEST_CLIENTS` clients for `window`:
/// (the database's URL, inserts/s).
fn pg_single_insert_baseline(ctx: &mut Ctx, db: &str, window: Duration) -> Result<(String, f64)> {
    let cluster = ctx.cluster()?;
    let url = cluster.fresh(db)?;
    PgConnection::establish(&url)?.batch_execute(
        "CREATE TABLE bench_single (id bigserial PRIMARY KEY, v bigint NOT NULL, body text NOT NULL, \
         at timestamptz NOT NULL DEFAULT now())",
    )?;
    let tps = cluster.pgbench(
        db,
        INGEST_CLIENTS,
        window,
        "\\set v random(1, 1000000000)\nINSERT INTO bench_single (v, body) VALUES (:v, repeat('x', 1000));\n",
    )?;
    Ok((url, tps))
}

pub fn ingest_pg(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let window = Duration::from_secs(ctx.sizes.window_secs);
    let (url, tps) = pg_single_insert_baseline(ctx, "bench_ingest", window)?;
    let mut conn = PgConnection::establish(&url)?;
    conn.batch_execute(&format!("{MARK} SELECT pg_stat_statements_reset()"))?;
    let Load { rate, p50, p99, .. } = ctx.rt.block_on(async {
        let h = HeraldProc::start(&url, "").await?;
        let r = ingest_load(&h.base, window).await;
        h.stop().await?;
        r
    })?;
    print_top_statements(&mut conn)?;
    let note = format!(
        "{INGEST_CLIENTS} clients, ~1 KiB standard-webhooks receipts, {}s",
        window.as_secs()
    );
    Ok(vec![
        Figure::measured("ingest_pg", rate, tps, "receipts/s")
            .target(Target::RatioAtLeast(1.0))
            .note(format!(
                "{note}; baseline: pgbench single-row INSERT, {INGEST_CLIENTS} clients"
            )),
        Figure::measured(
            "ingest_pg_p50_ms",
            p50,
            1000.0 * INGEST_CLIENTS as f64 / tps,
            "ms",
        )
        .note("baseline: pgbench's mean latency (clients / tps)"),
        Figure::measured(
            "ingest_pg_p99_ms",
            p99,
            1000.0 * INGEST_CLIENTS as f64 / tps,
            "ms",
        )
        .note("baseline: pgbench's mean latency (clients / tps)"),
    ])
}

/// `ingest_pg` with receipts that each match a message Herald sent, as a provider's are: every
/// receipt `n` (`email.delivered`, provider message id `em_n`) finds the `delivered` message
/// `sent-n`, loaded by SQL beforehand, and the reconciler applies it (the message's delivery
/// status written, the receipt marked applied) while the load runs. Also measured: how fast the
/// reconciler applied them — every receipt answered, from the window's start until the queue
/// was empty — against the rate they arrived at. Checked: every receipt applied, each to its own
/// message.
pub fn ingest_pg_matched(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let window = Duration::from_secs(ctx.sizes.window_secs);
    // More messages than the load can send receipts for (about 16,000/s at the most here).
    let messages: usize = if ctx.sizes.quick { 100_000 } else { 250_000 };
    let (url, tps) = pg_single_insert_baseline(ctx, "bench_ingest_matched", window)?;
    let mut conn = PgConnection::establish(&url)?;
    conn.batch_execute(&format!(
        "{MARK} INSERT INTO herald_outbox (event_id, channel, destination, payload, state, attempts, \
         provider_message_id) SELECT 'sent-' || i, 'webhook', 'https://x.example/h', \
         '{{\"body\": {{}}}}', 'delivered', 1, 'em_' || i FROM generate_series(0, {}) AS i; \
         {MARK} ANALYZE herald_outbox",
        messages - 1
    ))?;
    conn.batch_execute(&format!("{MARK} SELECT pg_stat_statements_reset()"))?;
    let (load, drained) = ctx.rt.block_on(async {
        let h = HeraldProc::start(&url, "").await?;
        let start = Instant::now();
        let r = async {
            let load = ingest_load(&h.base, window).await?;
            Ok::<_, anyhow::Error>((load, queue_emptied(&mut conn, start).await?))
        }
        .await;
        h.stop().await?;
        r
    })?;
    let Load {
        answered,
        rate,
        p50,
        p99,
    } = load;
    ensure!(
        answered <= messages,
        "{answered} receipts for {messages} messages: raise the number of messages"
    );
    let applied = count_sql(
        &mut conn,
        "SELECT count(*) AS n FROM herald_receipts WHERE outcome = 'applied' \
         AND message_id IS NOT NULL",
    )?;
    let statuses = count_sql(
        &mut conn,
        "SELECT count(*) AS n FROM herald_outbox WHERE delivery_status = 'delivered'",
    )?;
    ensure!(
        applied == answered as i64 && statuses == answered as i64,
        "{answered} receipts answered, {applied} applied, {statuses} messages given their status"
    );
    print_top_statements(&mut conn)?;
    let reconciled = answered as f64 / drained.as_secs_f64();
    Ok(vec![
        Figure::measured("ingest_pg_matched", rate, tps, "receipts/s").note(format!(
            "as ingest_pg, each receipt matching one of {messages} sent messages; p50 {p50:.2} ms, \
             p99 {p99:.2} ms; baseline: pgbench single-row INSERT, {INGEST_CLIENTS} clients"
        )),
        Figure::measured("reconcile_pg_matched", reconciled, rate, "receipts/s").note(format!(
            "{answered} receipts applied, the queue empty {:.1} s after the window began; \
             baseline: the rate they arrived at",
            drained.as_secs_f64()
        )),
    ])
}

/// Waits until the reconciler's queue is empty; the time since `start`.
async fn queue_emptied(conn: &mut PgConnection, start: Instant) -> Result<Duration> {
    loop {
        let queued = count_sql(conn, "SELECT count(*) AS n FROM herald_receipt_queue")?;
        if queued == 0 {
            return Ok(start.elapsed());
        }
        ensure!(
            start.elapsed() < WAIT_LIMIT,
            "the reconciler did not empty its queue: {queued} receipts left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `INGEST_CLIENTS` clients enqueueing webhooks of about 1 KiB through `POST /v1/messages` for
/// `window`, each with an event id of its own and scheduled an hour ahead: the figure is the
/// API's enqueue alone, the sender finding nothing due.
/// `keys`: each message keyed, over that many ordering keys (request `n` in key `n % keys`).
async fn enqueue_load(base: &str, window: Duration, keys: Option<usize>) -> Result<Load> {
    let url = format!("{base}/v1/messages");
    let at = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let note = "x".repeat(860);
    http_load(window, 201, move |client, n| {
        let mut body = serde_json::json!({
            "event_id": format!("enqueue-{n}"),
            "channel": "webhook",
            "destination": "http://127.0.0.1:9/hooks",
            "scheduled_at": at,
            "payload": {"body": {"type": "order.placed", "data": {"id": n, "note": note}}},
        });
        if let Some(keys) = keys {
            body["ordering_key"] = format!("key-{}", n % keys).into();
        }
        client
            .post(&url)
            .bearer_auth(crate::proc::TOKEN)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap_or_default())
    })
    .await
}

/// `POST /v1/messages` on PostgreSQL against pgbench's single-row insert at the same
/// concurrency; every 201 must have left its row.
pub fn enqueue_pg(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let window = Duration::from_secs(ctx.sizes.window_secs);
    let (url, tps) = pg_single_insert_baseline(ctx, "bench_enqueue", window)?;
    let mut conn = PgConnection::establish(&url)?;
    conn.batch_execute(&format!("{MARK} SELECT pg_stat_statements_reset()"))?;
    let load = ctx.rt.block_on(async {
        let h = HeraldProc::start(&url, "").await?;
        let r = enqueue_load(&h.base, window, None).await;
        h.stop().await?;
        r
    })?;
    print_top_statements(&mut conn)?;
    let rows = count_sql(&mut conn, "SELECT count(*) AS n FROM herald_outbox")?;
    ensure!(
        rows as usize == load.answered,
        "{} enqueues answered 201, {rows} rows stored",
        load.answered
    );
    Ok(enqueue_figures(
        "enqueue_pg",
        &load,
        tps,
        "pgbench single-row INSERT",
    ))
}

/// An application inserting outbox rows by SQL, each scheduled an hour ahead (pgbench, one
/// ~1 KiB row a transaction), while a Herald listens, against the same insert while none does
/// (in the same database, before). A notifying commit waits for the one before it; a row not yet
/// due notifies nobody (migration 000019), so the two should be alike. Then rows due at once,
/// with a Herald listening and delivering them: a commit notifies only while no sender has
/// promised to stay awake (migration 000021); and with a Herald polling instead.
pub fn app_insert_pg(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let window = Duration::from_secs(ctx.sizes.window_secs);
    let db = "bench_app_insert";
    let url = ctx.cluster()?.fresh(db)?;
    let mut conn = PgConnection::establish(&url)?;
    let rx = ctx.rt.block_on(HttpReceiver::start())?;
    let later = "INSERT INTO herald_outbox (event_id, channel, destination, payload, scheduled_at) \
                 VALUES ('app-' || nextval('bench_app_ids'), 'webhook', 'https://x.example/h', \
                 jsonb_build_object('body', repeat('x', 1000)), now() + interval '1 hour');\n";
    let due = format!(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
         VALUES ('due-' || nextval('bench_app_ids'), 'webhook', '{}', \
         jsonb_build_object('body', repeat('x', 1000)));\n",
        rx.url
    );
    let listening =
        "SELECT count(*) AS n FROM herald_listeners WHERE seen_at > now() - interval '30 seconds'";
    conn.batch_execute("CREATE SEQUENCE bench_app_ids")?;
    ensure!(
        count_sql(&mut conn, listening)? == 0,
        "a listener is registered"
    );
    // Each phase on as empty a table as the first, no checkpoint owed; emptied only while no
    // Herald is sending from it (a row taken away mid-send would end as `lease_lost`).
    fn phase(ctx: &mut Ctx, db: &str, window: Duration, script: &str) -> Result<f64> {
        ctx.cluster()?.pgbench(db, INGEST_CLIENTS, window, script)
    }
    fn empty(conn: &mut PgConnection) -> Result<()> {
        Ok(conn.batch_execute("TRUNCATE herald_outbox CASCADE; CHECKPOINT")?)
    }
    let alone = phase(ctx, db, window, later)?;
    empty(&mut conn)?;
    let alone_due = phase(ctx, db, window, &due)?;
    empty(&mut conn)?;
    // The way around the NOTIFY lock (README, How it works, Wake-up): a Herald that polls
    // instead; before any Herald has listened, whose registration would keep the trigger
    // notifying for 30 s after it stopped.
    let polling = "listen_notify = false\npoll_interval_ms = 50";
    let h = ctx.rt.block_on(HeraldProc::start(&url, polling))?;
    let due_polled = phase(ctx, db, window, &due);
    ctx.rt.block_on(h.stop())?;
    let due_polled = due_polled?;
    empty(&mut conn)?;
    ensure!(
        count_sql(&mut conn, listening)? == 0,
        "a polling Herald registered as listening"
    );
    let polled = rx.tally.count();
    ensure!(
        polled > 0,
        "the polling Herald delivered none of the due rows"
    );
    let h = ctx.rt.block_on(HeraldProc::start(&url, ""))?;
    let mut beside = || {
        let deadline = Instant::now() + Duration::from_secs(10);
        while count_sql(&mut conn, listening)? == 0 {
            ensure!(
                Instant::now() < deadline,
                "herald serve never registered as listening"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let later = phase(ctx, db, window, later)?;
        // Rows an hour ahead: nothing of them is being sent.
        empty(&mut conn)?;
        Ok((later, phase(ctx, db, window, &due)?))
    };
    let beside = beside();
    ctx.rt.block_on(h.stop())?;
    let (beside, beside_due) = beside?;
    ensure!(
        rx.tally.count() > polled,
        "the listening Herald delivered none of the due rows"
    );
    ensure!(
        rx.tally.duplicates() == 0,
        "{} duplicate deliveries",
        rx.tally.duplicates()
    );
    let what = format!(
        "pgbench, {INGEST_CLIENTS} clients, a ~1 KiB outbox row a transaction, {}s",
        window.as_secs()
    );
    Ok(vec![
        Figure::measured("app_insert_later_pg", beside, alone, "tx/s").note(format!(
            "{what}, scheduled an hour ahead, a Herald listening; baseline: the same, nobody \
             listening"
        )),
        Figure::measured("app_insert_due_pg", beside_due, alone_due, "tx/s").note(format!(
            "{what}, due at once, a Herald listening (a commit notifies unless a sender has \
             promised to stay awake) and delivering them ({} until it stopped); baseline: the same, nobody listening",
            rx.tally.count() - polled
        )),
        Figure::measured("app_insert_due_polled_pg", due_polled, alone_due, "tx/s").note(format!(
            "{what}, due at once, a Herald polling every 50 ms (listen_notify = false) and \
             delivering them ({polled} until it stopped); baseline: the same, nobody listening"
        )),
    ])
}

/// `POST /v1/messages` on SQLite against SQLite's single-row insert.
pub fn enqueue_sqlite(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    enqueue_sqlite_with(ctx, "enqueue_sqlite", None)
}

/// The same with every message keyed, over 1,000 ordering keys.
pub fn enqueue_sqlite_keyed(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    enqueue_sqlite_with(ctx, "enqueue_sqlite_keyed", Some(1000))
}

fn enqueue_sqlite_with(ctx: &mut Ctx, name: &str, keys: Option<usize>) -> Result<Vec<Figure>> {
    let window = Duration::from_secs(ctx.sizes.window_secs);
    let baseline = sqlite_single_insert_baseline(ctx, window)?;
    let (path, url) = fresh_sqlite(ctx, name)?;
    let load = ctx.rt.block_on(async {
        let h = HeraldProc::start(&url, "").await?;
        let r = enqueue_load(&h.base, window, keys).await;
        h.stop().await?;
        r
    })?;
    let rows = count_sqlite(
        &mut sqlite_conn(&path)?,
        "SELECT count(*) AS n FROM herald_outbox",
    )?;
    ensure!(
        rows as usize == load.answered,
        "{} enqueues answered 201, {rows} rows stored",
        load.answered
    );
    let what = match keys {
        Some(keys) => {
            format!("keyed over {keys} keys; baseline: single-row INSERT+commit, synchronous=FULL")
        }
        None => "single-row INSERT+commit, synchronous=FULL".into(),
    };
    Ok(enqueue_figures(name, &load, baseline, &what))
}

fn enqueue_figures(name: &str, load: &Load, baseline: f64, what: &str) -> Vec<Figure> {
    vec![
        Figure::measured(name, load.rate, baseline, "msg/s").note(format!(
            "{INGEST_CLIENTS} clients, ~1 KiB webhooks through POST /v1/messages, scheduled an hour \
             ahead; p50 {:.1} ms, p99 {:.1} ms; baseline: {what}, {INGEST_CLIENTS} clients",
            load.p50, load.p99
        )),
    ]
}

/// An application's connection to Herald's database, on which `latency_run` inserts.
fn app_conn(url: &str) -> Result<Box<dyn SimpleConnection>> {
    Ok(match herald::storage::sqlite_path(url) {
        Some(path) => Box::new(sqlite_conn(std::path::Path::new(path))?),
        None => Box::new(PgConnection::establish(url)?),
    })
}

/// Insert → first attempt, one message every `gap` for `secs`, each inserted by SQL on the
/// benchmark's own connection; (p50, p99) ms and how many.
async fn latency_run(url: &str, extra: &str, secs: u64, gap: Duration) -> Result<Latency> {
    let rx = HttpReceiver::start().await?;
    let h = HeraldProc::start(url, extra).await?;
    let mut conn = app_conn(url)?;
    let mut committed = Vec::new();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut i = 0;
    while Instant::now() < end {
        let id = format!("lat-{i}");
        conn.batch_execute(&format!(
            "{MARK} INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             VALUES ('{id}', 'webhook', '{}', '{{\"body\": {{\"i\": {i}}}}}')",
            rx.url
        ))?;
        committed.push((id, Instant::now()));
        i += 1;
        tokio::time::sleep(gap).await;
    }
    ensure!(
        rx.tally
            .wait_for(committed.len(), Duration::from_secs(30))
            .await,
        "latency: not every message arrived"
    );
    h.stop().await?;
    let mut lat: Vec<f64> = committed
        .iter()
        .filter_map(|(id, t)| {
            rx.tally
                .first_arrival(id)
                .map(|a| a.saturating_duration_since(*t))
        })
        .map(|d| d.as_secs_f64() * 1000.0)
        .collect();
    lat.sort_by(f64::total_cmp);
    Ok((percentile(&lat, 50.0), percentile(&lat, 99.0), lat.len()))
}

/// What [`latency_run`] measured: p50 and p99 in ms, and how many messages.
type Latency = (f64, f64, usize);

/// [`latency_run`] at 50/s on `url` with the wake-up for others' commits (LISTEN/NOTIFY, the
/// insert watch), then on `poll_url` polling only, at the production default interval (1 s):
/// each's [`Latency`].
fn latency_with_and_without_wake_up(
    ctx: &Ctx,
    url: &str,
    poll_url: &str,
) -> Result<(Latency, Latency)> {
    let secs = ctx.sizes.latency_secs;
    let woken = ctx
        .rt
        .block_on(latency_run(url, &sender_toml(1000), secs, LATENCY_GAP))?;
    let polled = ctx.rt.block_on(latency_run(
        poll_url,
        &format!("{}listen_notify = false\n", sender_toml(1000)),
        secs,
        LATENCY_GAP,
    ))?;
    Ok((woken, polled))
}

pub fn latency(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let url = ctx.cluster()?.fresh("bench_latency")?;
    let poll_url = ctx.cluster()?.fresh("bench_latency_poll")?;
    let ((p50, p99, n), (poll50, _, m)) = latency_with_and_without_wake_up(ctx, &url, &poll_url)?;
    Ok(vec![
        Figure::against_target("latency_notify_p50_ms", p50, Target::AtMost(5.0), "ms")
            .note(format!("{n} messages at 50/s, LISTEN/NOTIFY, poll 1 s")),
        Figure::against_target("latency_notify_p99_ms", p99, Target::AtMost(20.0), "ms")
            .note(format!("{n} messages at 50/s")),
        Figure::measured("latency_poll_p50_ms", poll50, 1000.0, "ms").note(format!(
            "{m} messages, polling only; baseline: the poll interval"
        )),
    ])
}

/// The latency scenarios' pace: a message every 20 ms (50/s).
const LATENCY_GAP: Duration = Duration::from_millis(20);

/// `latency_sqlite`'s sparse run: a message every 400 ms, each after the watch has gone quiet
/// (it looks every 2 ms only for 250 ms after the WAL was last written).
const SPARSE_GAP: Duration = Duration::from_millis(400);

/// `latency` on SQLite: an application inserts by SQL on a connection of its own, and Herald's
/// insert watch (SQLite's stand-in for LISTEN/NOTIFY) wakes the sender; the same sparsely, each
/// insert finding the watch quiet; and with `listen_notify = false`, polling only.
pub fn latency_sqlite(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let secs = ctx.sizes.latency_secs;
    let (_, url) = fresh_sqlite(ctx, "latency")?;
    let (_, sparse_url) = fresh_sqlite(ctx, "latency_sparse")?;
    let (_, poll_url) = fresh_sqlite(ctx, "latency_poll")?;
    let (sparse50, sparse99, k) = ctx.rt.block_on(latency_run(
        &sparse_url,
        &sender_toml(1000),
        secs,
        SPARSE_GAP,
    ))?;
    let ((p50, p99, n), (poll50, _, m)) = latency_with_and_without_wake_up(ctx, &url, &poll_url)?;
    Ok(vec![
        Figure::measured("latency_sqlite_p50_ms", p50, poll50, "ms").note(format!(
            "{n} messages at 50/s, the insert watch, poll 1 s; baseline: polling only"
        )),
        Figure::measured("latency_sqlite_p99_ms", p99, poll50, "ms").note(format!(
            "{n} messages at 50/s; baseline: polling only's p50"
        )),
        Figure::measured("latency_sqlite_sparse_p50_ms", sparse50, poll50, "ms").note(format!(
            "{k} messages, one every {} ms, each finding the watch quiet; p99 {sparse99:.2} ms; \
             baseline: polling only's p50",
            SPARSE_GAP.as_millis()
        )),
        Figure::measured("latency_sqlite_poll_p50_ms", poll50, 1000.0, "ms").note(format!(
            "{m} messages, polling only; baseline: the poll interval"
        )),
    ])
}

pub fn claim_at_1m(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let rows = ctx.sizes.claim_rows;
    let url = ctx.cluster()?.fresh("bench_claim")?;
    let mut conn = PgConnection::establish(&url)?;
    // 2 % due now, the rest due tomorrow.
    let due = rows / 50;
    conn.batch_execute(&format!(
        "{MARK} INSERT INTO herald_outbox (event_id, channel, destination, payload, scheduled_at) \
         SELECT 'c-' || i, 'webhook', 'http://127.0.0.1:9/hook', '{{\"body\": {{}}}}', \
         CASE WHEN i <= {due} THEN now() ELSE now() + interval '1 day' END \
         FROM generate_series(1, {rows}) AS i"
    ))?;
    conn.batch_execute("VACUUM ANALYZE herald_outbox")?;
    let db = herald::storage::Db::connect(&url, &herald::storage::PoolOptions::default())?;
    let mut lat = Vec::new();
    let mut claimed = 0usize;
    while claimed < due {
        let now = herald::clock::Now {
            local: chrono::Utc::now(),
            shift: chrono::Duration::zero(),
        };
        let t = Instant::now();
        let (batch, _) = db.claim(
            now,
            100,
            "bench",
            Duration::from_secs(60),
            &bench_policies(),
        )?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        if batch.is_empty() {
            break;
        }
        claimed += batch.len();
        let ids: Vec<String> = batch.iter().map(|r| r.id.to_string()).collect();
        // Finished rows leave the claimable set, as delivered ones do.
        conn.batch_execute(&format!(
            "{MARK} UPDATE herald_outbox SET state = 'delivered', lease_owner = NULL, \
             lease_until = NULL, next_attempt_at = NULL WHERE id IN ({})",
            ids.join(",")
        ))?;
    }
    ensure!(claimed >= due, "claimed {claimed} of {due} due rows");
    ensure!(lat.len() >= 2, "too few claims to measure");
    // The first claim on the connection also prepares the statement and plans it (once per
    // pooled connection, at start-up in a running Herald): reported on its own line, and the
    // percentile is over the claims of a running sender.
    let first = lat.remove(0);
    lat.sort_by(f64::total_cmp);
    Ok(vec![
        Figure::against_target(
            "claim_p99_ms_at_1m",
            percentile(&lat, 99.0),
            Target::AtMost(5.0),
            "ms",
        )
        .note(format!(
            "{rows} rows pending, {due} due, {} claims of 100 after the first, p50 {:.2} ms",
            lat.len(),
            percentile(&lat, 50.0)
        )),
        Figure::measured("claim_first_ms_at_1m", first, percentile(&lat, 50.0), "ms").note(
            "the first claim on a new connection (statement prepared and planned); baseline: p50",
        ),
    ])
}

fn sqlite_conn(path: &std::path::Path) -> Result<SqliteConnection> {
    let mut c = SqliteConnection::establish(&path.display().to_string())?;
    c.batch_execute(
        "PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL",
    )?;
    Ok(c)
}

fn fresh_sqlite(ctx: &Ctx, name: &str) -> Result<(std::path::PathBuf, String)> {
    let path = ctx.work_dir.join(format!("{name}.db"));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let url = format!("sqlite://{}", path.display());
    let db = herald::storage::Db::connect(&url, &herald::storage::PoolOptions::default())?;
    db.migrate()?;
    Ok((path, url))
}

/// The `n` of `sql` (a `SELECT count(*) AS n …`) on SQLite.
fn count_sqlite(conn: &mut SqliteConnection, sql: &str) -> Result<i64> {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let r: N = diesel::sql_query(sql).get_result(conn)?;
    Ok(r.n)
}

/// Waits until `n` rows of the SQLite outbox are `delivered`.
async fn wait_delivered_sqlite(path: &std::path::Path, n: usize, start: Instant) -> Result<()> {
    let mut c = sqlite_conn(path)?;
    loop {
        let done = count_sqlite(
            &mut c,
            "SELECT count(*) AS n FROM herald_outbox WHERE state = 'delivered'",
        )?;
        if done as usize >= n {
            return Ok(());
        }
        if start.elapsed() > WAIT_LIMIT {
            bail!("only {done} of {n} delivered");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn dispatch_sqlite(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let baseline = http_baseline(ctx, false)?;
    let n = ctx.sizes.dispatch_messages;
    let (path, url) = fresh_sqlite(ctx, "dispatch")?;
    let rate = ctx.rt.block_on(async {
        let rx = HttpReceiver::start().await?;
        let h = HeraldProc::start(&url, &sender_toml(50)).await?;
        let mut c = sqlite_conn(&path)?;
        c.batch_execute(&format!(
            "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) \
             INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             SELECT 'm-' || i, 'webhook', '{}', json_object('body', json_object('type', 'order.placed', \
             'data', json_object('id', i, 'note', printf('%.200c', 'x')))) FROM s",
            rx.url
        ))?;
        let start = Instant::now();
        ensure!(rx.tally.wait_for(n, WAIT_LIMIT).await, "only {} arrived", rx.tally.count());
        wait_delivered_sqlite(&path, n, start).await?;
        let rate = n as f64 / start.elapsed().as_secs_f64();
        ensure!(rx.tally.duplicates() == 0, "duplicate deliveries");
        h.stop().await?;
        Ok::<_, anyhow::Error>(rate)
    })?;
    Ok(vec![
        Figure::measured("dispatch_sqlite", rate, baseline, "msg/s")
            .target(Target::AtLeast(5000.0))
            .note(format!(
                "{n} rows by SQL, poll 50 ms; baseline: reqwest without a database"
            )),
    ])
}

pub fn ingest_sqlite(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let window = Duration::from_secs(ctx.sizes.window_secs);
    let baseline = sqlite_single_insert_baseline(ctx, window)?;
    let (_, url) = fresh_sqlite(ctx, "ingest")?;
    let Load { rate, p50, p99, .. } = ctx.rt.block_on(async {
        let h = HeraldProc::start(&url, "").await?;
        let r = ingest_load(&h.base, window).await;
        h.stop().await?;
        r
    })?;
    Ok(vec![
        Figure::measured("ingest_sqlite", rate, baseline, "receipts/s")
            .target(Target::AtLeast(5000.0))
            .note(format!(
                "{INGEST_CLIENTS} clients; p50 {p50:.1} ms, p99 {p99:.1} ms; baseline: single-row INSERT+commit, synchronous=FULL"
            )),
    ])
}

pub fn email_smtp(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    email_run(ctx, EmailRun::Sql)
}

/// `email_smtp` with the rows as Herald's own ways in (`POST /v1/messages`, the Rust API) write
/// them: the Message-ID key and the request fingerprint set at the insert, so that neither the
/// claim nor the outcome has one to add.
pub fn email_smtp_api(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    email_run(ctx, EmailRun::Keyed)
}

/// One way of [`email_smtp_rtt`]'s link: a 10 ms round trip.
const RELAY_ONE_WAY: Duration = Duration::from_millis(5);

/// `email_smtp` with the SMTP server behind a link of 10 ms a round trip ([`DelayedLink`]), as a
/// hosted relay in another data centre is, and a fifth of the mails: on loopback a round trip
/// costs CPU, over a network it costs time, and the pool's 10 sessions wait for it.
pub fn email_smtp_rtt(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    email_run(ctx, EmailRun::Rtt)
}

/// The email scenarios' variants.
#[derive(Clone, Copy, PartialEq)]
enum EmailRun {
    /// Rows by one plain SQL statement, as an application may write them (`email_smtp`).
    Sql,
    /// Rows with their Message-ID key and fingerprint, as Herald's own ways in write them
    /// (`email_smtp_api`).
    Keyed,
    /// Plain SQL rows, a fifth of them, to a server behind [`RELAY_ONE_WAY`] each way
    /// (`email_smtp_rtt`).
    Rtt,
}

fn email_run(ctx: &mut Ctx, run: EmailRun) -> Result<Vec<Figure>> {
    let (n, one_way, db) = match run {
        EmailRun::Sql => (ctx.sizes.email_messages, None, "email"),
        EmailRun::Keyed => (ctx.sizes.email_messages, None, "email_api"),
        EmailRun::Rtt => (
            ctx.sizes.email_messages / 5,
            Some(RELAY_ONE_WAY),
            "email_rtt",
        ),
    };
    let (path, url) = fresh_sqlite(ctx, db)?;
    let (baseline, in_child, rate) = ctx.rt.block_on(async {
        let baseline = lettre_loop(n, one_way).await?;
        let in_child = match run {
            EmailRun::Sql => Some(lettre_loop_in_child(n).await?),
            _ => None,
        };
        let sink = SmtpServer::start().await?;
        let smtp_url = format!("smtp://{}", sink.reached_over(one_way).await?);
        let h = HeraldProc::start(
            &url,
            &format!("sender_concurrency = 256\nsender_batch_size = 256\ndestination_max_in_flight = 256\npoll_interval_ms = 50\nsmtp_url = \"{smtp_url}\"\n"),
        )
        .await?;
        let mut c = sqlite_conn(&path)?;
        if run == EmailRun::Keyed {
            insert_keyed_mails(&mut c, n)?;
        } else {
            c.batch_execute(&format!(
                "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) \
                 INSERT INTO herald_outbox (event_id, channel, destination, payload) \
                 SELECT 'mail-' || i, 'email', 'user' || i || '@example.com', \
                 json_object('subject', 'Order ' || i, 'text', printf('%.200c', 'x')) FROM s"
            ))?;
        }
        let start = Instant::now();
        ensure!(
            sink.tally.wait_for(n, WAIT_LIMIT).await,
            "only {} mails",
            sink.tally.count()
        );
        wait_delivered_sqlite(&path, n, start).await?;
        let rate = n as f64 / start.elapsed().as_secs_f64();
        ensure!(sink.tally.duplicates() == 0, "duplicate mails");
        h.stop().await?;
        Ok::<_, anyhow::Error>((baseline, in_child, rate))
    })?;
    let figure = match run {
        EmailRun::Keyed => {
            Figure::measured("email_smtp_api", rate, baseline, "msg/s").note(format!(
                "{n} mails with their key and fingerprint from the insert, as the API writes them; \
             SQLite, SMTP pool of 10; baseline: plain lettre loop, 10 connections"
            ))
        }
        EmailRun::Rtt => Figure::measured("email_smtp_rtt", rate, baseline, "msg/s").note(format!(
            "{n} mails to a relay {} ms away (a round trip), SQLite, SMTP pool of 10; \
             baseline: plain lettre loop over the same link, 10 connections",
            (RELAY_ONE_WAY * 2).as_millis()
        )),
        EmailRun::Sql => Figure::measured("email_smtp", rate, baseline, "msg/s")
            .target(Target::RatioAtLeast(0.5))
            .note(format!(
                "{n} mails, SQLite, SMTP pool of 10; baseline: plain lettre loop, 10 connections"
            )),
    };
    let mut figures = vec![figure];
    if let Some(in_child) = in_child {
        figures.push(
            Figure::measured("email_smtp_vs_client_process", rate, in_child, "msg/s").note(
                format!(
                    "email_smtp's rate; baseline: the same lettre loop from a process of its own, \
                     as Herald is ({n} mails, 10 connections)"
                ),
            ),
        );
    }
    Ok(figures)
}

/// The mails of `email_smtp`, each with the Message-ID key and the request fingerprint Herald
/// computes for it, in one transaction.
fn insert_keyed_mails(c: &mut SqliteConnection, n: usize) -> Result<()> {
    use diesel::sql_types::Text;
    c.transaction(|c| {
        for i in 1..=n {
            let (event_id, to) = (format!("mail-{i}"), format!("user{i}@example.com"));
            let payload =
                serde_json::json!({"subject": format!("Order {i}"), "text": "x".repeat(200)});
            let fingerprint = herald::outbox::fingerprint_of(
                herald::domain::Channel::Email,
                &to,
                &event_id,
                &payload,
            )
            .context("a fingerprint")?;
            diesel::sql_query(
                "INSERT INTO herald_outbox (event_id, channel, destination, payload, message_key, \
                 request_fingerprint) VALUES (?1, 'email', ?2, ?3, ?4, ?5)",
            )
            .bind::<Text, _>(&event_id)
            .bind::<Text, _>(&to)
            .bind::<Text, _>(payload.to_string())
            .bind::<Text, _>(herald::domain::email_message_key(&event_id))
            .bind::<Text, _>(fingerprint.as_str())
            .execute(c)?;
        }
        Ok::<_, anyhow::Error>(())
    })
}

/// The baseline of the email scenarios: a plain lettre loop, 10 connections, into a fresh
/// [`SmtpServer`] (behind a [`DelayedLink`] with `one_way`), in this process — the client's and
/// the server's tasks share one runtime, so a round trip can complete without the operating
/// system waking another process.
async fn lettre_loop(n: usize, one_way: Option<Duration>) -> Result<f64> {
    let sink = SmtpServer::start().await?;
    let rate = lettre_clients(sink.reached_over(one_way).await?, n).await?;
    ensure_all_mails(&sink, n)?;
    Ok(rate)
}

/// The same lettre loop from a process of its own ([`in_child`]), as Herald runs: every round
/// trip then wakes the client's process and the server's, as it does for Herald.
async fn lettre_loop_in_child(n: usize) -> Result<f64> {
    let sink = SmtpServer::start().await?;
    let rate = in_child("smtp", &sink.addr(), n).await?;
    ensure_all_mails(&sink, n)?;
    Ok(rate)
}

/// A baseline client (`kind`: `smtp`, the lettre loop; `http`, the HTTP baseline's) run from a
/// process of its own — this binary with [`CLIENT_CHILD`] — against `peer`, a server of this
/// process; the rate it measured, from its first request to its last reply.
async fn in_child(kind: &str, peer: &str, n: usize) -> Result<f64> {
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args([CLIENT_CHILD, kind, peer, &n.to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    // At most WAIT_LIMIT, then killed; the runtime serves the peer meanwhile. It prints one
    // line, which the pipe holds until it is read.
    let Some(status) = crate::proc::exited_by(&mut child, WAIT_LIMIT).await? else {
        let _ = child.kill();
        let _ = child.wait();
        bail!("the {kind} child took longer than {WAIT_LIMIT:?}: killed");
    };
    ensure!(status.success(), "the {kind} child failed ({status})");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().context("its stdout")?, &mut out)?;
    out.trim()
        .parse()
        .with_context(|| format!("the {kind} child's rate"))
}

fn ensure_all_mails(sink: &SmtpServer, n: usize) -> Result<()> {
    ensure!(
        sink.tally.count() == n && sink.tally.duplicates() == 0,
        "the baseline sent {} of {n} ({} duplicates)",
        sink.tally.count(),
        sink.tally.duplicates()
    );
    Ok(())
}

/// The argument that makes `herald-bench` the child of [`in_child`]: `herald-bench __client
/// smtp ADDR N` sends N mails to ADDR with the lettre loop, `herald-bench __client http URL N`
/// posts at least N requests to URL with the HTTP baseline's client; either prints its rate.
pub const CLIENT_CHILD: &str = "__client";

/// [`CLIENT_CHILD`]'s work, on a runtime like Herald's (one worker per core).
pub fn client_child(mut args: impl Iterator<Item = String>) -> Result<()> {
    let usage = || anyhow::anyhow!("usage: herald-bench {CLIENT_CHILD} smtp|http PEER N");
    let (Some(kind), Some(peer), Some(n), None) =
        (args.next(), args.next(), args.next(), args.next())
    else {
        return Err(usage());
    };
    let n: usize = n.parse().context("N, a count")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let rate = match kind.as_str() {
        "smtp" => rt.block_on(lettre_clients(peer, n))?,
        "http" => {
            herald::channels::install_crypto_provider();
            rt.block_on(http_clients(peer, n))?
        }
        _ => return Err(usage()),
    };
    println!("{rate}");
    Ok(())
}

/// As many lettre connections as Herald's pool (10) to `addr`, Nagle off as Herald's are,
/// sending `n` mails between them one command at a time (lettre's `send`: MAIL FROM, RCPT TO,
/// DATA, the content), no check before reuse; mails per second.
async fn lettre_clients(addr: String, n: usize) -> Result<f64> {
    use lettre::address::Envelope;
    use lettre::transport::smtp::client::AsyncSmtpConnection;
    use lettre::transport::smtp::extension::ClientId;
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (addr, next) = (addr.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let hello = ClientId::Domain("bench.localhost".into());
            let tcp = tokio::net::TcpStream::connect(addr.as_str()).await?;
            tcp.set_nodelay(true)?;
            let mut conn = AsyncSmtpConnection::connect_with_transport(Box::new(tcp), &hello).await?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let envelope = Envelope::new(
                    Some("herald@localhost".parse()?),
                    vec![format!("user{i}@example.com").parse()?],
                )?;
                let msg = format!(
                    "From: Herald <herald@localhost>\r\nTo: user{i}@example.com\r\nSubject: Order {i}\r\n\
                     Message-ID: <{i}@bench.localhost>\r\n\r\n{}\r\n",
                    "x".repeat(200)
                );
                conn.send(&envelope, msg.as_bytes()).await?;
            }
            conn.quit().await.ok();
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await.context("lettre task")??;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

pub fn rss_idle(ctx: &mut Ctx) -> Result<Vec<Figure>> {
    let (_, url) = fresh_sqlite(ctx, "idle")?;
    let rss = ctx.rt.block_on(async {
        let h = HeraldProc::start(&url, "").await?;
        // Idle: a few poll, reconcile and retention cycles.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (rss, _) = h.rss_mib()?;
        h.stop().await?;
        Ok::<_, anyhow::Error>(rss)
    })?;
    Ok(vec![
        Figure::against_target("rss_idle_mib", rss, Target::AtMost(32.0), "MiB")
            .note("VmRSS of herald serve (SQLite) idle for 3 s"),
    ])
}

/// The claim's policies in `claim`: a global one only, as a Herald without endpoint policies.
fn bench_policies() -> herald::domain::policies::Policies {
    herald::domain::policies::Policies::global_only(herald::domain::policies::PolicyId {
        name: "bench".into(),
        version: "bench-1".into(),
        max_attempts: 15,
    })
}
