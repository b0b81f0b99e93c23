//! Reconciler throughput on PostgreSQL (fsync on): receipts applied per second with a backlog of
//! pending receipts, as a ratio against the rate at which the same receipts were stored in the
//! same run on the same cluster (Herald's own multi-row receipt insert, 500 per transaction —
//! what ingest does). Both numbers come from this run; the machine's noise affects both.
//!
//! `cargo bench --bench reconcile` (100,000 receipts for 10,000 messages; `-- N` for another
//! count, at least 1,000).
#![allow(clippy::unwrap_used)] // tests and benchmarks fail loudly; src/ may not unwrap

#[path = "../tests/it/support/mod.rs"]
#[allow(dead_code, unused_imports)]
mod support;

use std::sync::Arc;
use std::time::Instant;

use diesel::Connection;
use diesel::connection::SimpleConnection;
use herald::storage::models::NewReceipt;
use support::Backend;
use support::db::TestDb;

const PER_MESSAGE: usize = 10;

fn main() {
    let receipts: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100_000)
        .clamp(1_000, 1_000_000);
    // SAFETY: set before any thread exists; read once by the test harness when it starts PostgreSQL.
    unsafe { std::env::set_var("HERALD_TEST_PG_DURABLE", "1") };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(receipts));
}

async fn run(total: usize) {
    let messages = total / PER_MESSAGE;
    let test_db = TestDb::new(Backend::Postgres);
    let mut c = diesel::pg::PgConnection::establish(&test_db.url).unwrap();
    c.batch_execute(&format!(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload, state) \
         SELECT 'm-' || g, 'webhook', 'https://x.example/h', '{{\"body\": 1}}', 'delivered' \
         FROM generate_series(1, {messages}) g"
    ))
    .unwrap();
    let settings = herald::config::Settings::from_toml(&support::app::base_toml(
        &test_db.url,
        "reconcile_batch_size = 500\n",
    ))
    .unwrap();
    let clock = Arc::new(herald::clock::SystemClock);
    let herald = tokio::task::spawn_blocking(move || {
        herald::app::Herald::build(settings, clock, false).unwrap()
    })
    .await
    .unwrap();
    let kinds = ["queued", "sent", "deferred", "delivered", "opened"];
    let t0 = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
    let all: Vec<NewReceipt> = (0..total)
        .map(|i| {
            let m = i % messages + 1;
            let k = i / messages;
            NewReceipt {
                provider_event_id: format!("r-{i}"),
                event_type: kinds[k % kinds.len()].into(),
                provider_type: kinds[k % kinds.len()].into(),
                event_time: Some(t0 + chrono::Duration::seconds(k as i64)),
                herald_event_id: Some(format!("m-{m}")),
                provider_message_id: None,
                raw: serde_json::json!({"id": i}),
                replay_key: None,
            }
        })
        .collect();

    // Baseline: storing them, as ingest does (one transaction per 500).
    let db = herald.db.clone();
    let started = Instant::now();
    let stored = tokio::task::spawn_blocking(move || {
        let now = chrono::Utc::now();
        let mut n = 0;
        for chunk in all.chunks(500) {
            match db.store_unless_replayed("bench", chunk, now).unwrap() {
                herald::storage::receipts::Stored::Receipts { new, .. } => n += new,
                other => panic!("{other:?}"),
            }
        }
        n
    })
    .await
    .unwrap();
    let insert_s = started.elapsed().as_secs_f64();
    assert_eq!(stored, total);

    let started = Instant::now();
    let applied = herald.reconciler.run_until_idle().await.unwrap();
    let apply_s = started.elapsed().as_secs_f64();
    assert_eq!(applied, total, "every receipt applied once");

    let insert_rate = total as f64 / insert_s;
    let apply_rate = total as f64 / apply_s;
    println!(
        "reconciler on PostgreSQL (fsync on), {total} pending receipts for {messages} messages, \
         batches of 500, 2 cores"
    );
    println!(
        "baseline   storing them (multi-row insert, 500/tx): {insert_rate:>9.0} receipts/s ({insert_s:.1} s)"
    );
    println!(
        "reconcile  applying them (one pass per 500):        {apply_rate:>9.0} receipts/s ({apply_s:.1} s)"
    );
    println!(
        "RESULT reconcile_throughput value={apply_rate:.0} baseline={insert_rate:.0} ratio={:.2} unit=receipts/s",
        apply_rate / insert_rate
    );
}
