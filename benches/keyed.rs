//! Ordered delivery's cost: Herald's production sender loop on PostgreSQL dispatching keyed
//! messages, against the same loop dispatching unkeyed messages measured in the same run (the
//! baseline), on the same machine and receiver.
//!
//! `cargo bench --bench keyed` (optionally `-- N [HOT]`: messages of the unkeyed and keyed runs,
//! default 50,000; messages of the hot-key run, default N / 10 — one key is one message at a
//! time, so it runs at one round trip per message and is measured on fewer). Prints
//! `RESULT <name> value=… baseline=… ratio=… unit=msg/s` lines:
//! - `dispatch_pg_unkeyed`: the baseline itself (ratio 1);
//! - `dispatch_pg_keyed`: N messages over 1,000 keys (inserted round-robin over the keys);
//! - `dispatch_pg_hot_key`: HOT messages in one key.
//!
//! Rows are inserted first with `herald_enqueue` in transactions of 1,000 (not timed); the clock
//! runs from starting the sender to the last row `delivered`.
#![allow(clippy::unwrap_used)] // tests and benchmarks fail loudly; src/ may not unwrap

#[path = "../tests/it/support/mod.rs"]
#[allow(dead_code, unused_imports)]
mod support;

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::{Connection, RunQueryDsl};
use support::app::spawn_app_with;
use support::{Backend, Receiver};

const CONCURRENCY: usize = 64;
const KEYS: usize = 1_000;

fn main() {
    let mut nums = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse::<usize>().ok());
    let n = nums.next().unwrap_or(50_000).clamp(1_000, 200_000);
    let hot = nums.next().unwrap_or(n / 10).clamp(100, 200_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    for line in rt.block_on(run(n, hot)) {
        println!("{line}");
    }
}

/// The scenarios, as `RESULT` lines (callable from a benchmark command).
pub async fn run(n: usize, hot: usize) -> Vec<String> {
    herald::channels::install_crypto_provider();
    eprintln!(
        "keyed benchmark (PostgreSQL): {n} unkeyed, {n} over {KEYS} keys, {hot} in one key; \
         {CONCURRENCY} concurrent sends"
    );
    let unkeyed = dispatch(n, |_| None).await;
    let keyed = dispatch(n, |i| Some(format!("order-{}", i % KEYS))).await;
    let hot_key = dispatch(hot, |_| Some("order-hot".to_owned())).await;
    let line = |name: &str, v: f64| {
        format!(
            "RESULT {name} value={v:.0} baseline={unkeyed:.0} ratio={:.3} unit=msg/s",
            v / unkeyed
        )
    };
    vec![
        line("dispatch_pg_unkeyed", unkeyed),
        line("dispatch_pg_keyed", keyed),
        line("dispatch_pg_hot_key", hot_key),
    ]
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// Messages/s of the production sender loop over `n` messages, `key(i)` the i-th's ordering key.
async fn dispatch(n: usize, key: impl Fn(usize) -> Option<String>) -> f64 {
    let extra = format!(
        "sender_concurrency = {CONCURRENCY}\nsender_batch_size = 100\npoll_interval_ms = 1000\n"
    );
    let app = spawn_app_with(Backend::Postgres, &extra).await;
    let rx = Receiver::start().await;
    let mut sql = Vec::with_capacity(n / 1000 + 1);
    let mut tx = String::from("BEGIN;");
    for i in 0..n {
        let k = key(i).map_or("NULL".to_owned(), |k| format!("'{k}'"));
        tx.push_str(&format!(
            "SELECT herald_enqueue('bench-{i}', 'webhook', '{}', \
             '{{\"body\": {{\"type\": \"order.placed\", \"id\": {i}}}}}'::jsonb, \
             p_ordering_key => {k});",
            rx.url
        ));
        if i % 1000 == 999 || i == n - 1 {
            tx.push_str("COMMIT;");
            sql.push(std::mem::replace(&mut tx, String::from("BEGIN;")));
        }
    }
    let url = app.test_db.url.clone();
    tokio::task::spawn_blocking(move || {
        let mut c = PgConnection::establish(&url).unwrap();
        for tx in sql {
            c.batch_execute(&tx).unwrap();
        }
        // Fresh statistics, as autovacuum would have them after a bulk load.
        c.batch_execute("ANALYZE herald_outbox;").unwrap();
        if std::env::var_os("HERALD_BENCH_EXPLAIN").is_some() {
            explain_claim(&mut c);
        }
    })
    .await
    .unwrap();
    let start = Instant::now();
    let sender = app.start_sender();
    let url = app.test_db.url.clone();
    let elapsed = tokio::task::spawn_blocking(move || {
        let mut c = PgConnection::establish(&url).unwrap();
        loop {
            let done: Count = diesel::sql_query(
                "SELECT count(*) AS n FROM herald_outbox WHERE state = 'delivered'",
            )
            .get_result(&mut c)
            .unwrap();
            if done.n as usize >= n {
                return start.elapsed();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .unwrap();
    sender.stop().await;
    assert_eq!(rx.requests().len(), n, "every message sent exactly once");
    app.stop().await;
    n as f64 / elapsed.as_secs_f64()
}

#[derive(diesel::QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = diesel::sql_types::Text, column_name = "QUERY PLAN")]
    line: String,
}

/// The claim's plan as PostgreSQL chooses it now (`HERALD_BENCH_EXPLAIN=1`), on stderr.
fn explain_claim(c: &mut PgConnection) {
    use diesel::sql_types::{BigInt, Double, Text};
    let plan: Vec<PlanLine> = diesel::sql_query(format!(
        "EXPLAIN (COSTS OFF) {}",
        herald::storage::queries::PG_CLAIM_SQL
    ))
    .bind::<Double, _>(0.0)
    .bind::<BigInt, _>(100)
    .bind::<Text, _>("explain")
    .bind::<Double, _>(1e6)
    .bind::<Text, _>("v")
    .bind::<diesel::sql_types::Nullable<diesel::sql_types::Jsonb>, _>(None::<serde_json::Value>)
    .bind::<Text, _>("default")
    .load(c)
    .unwrap();
    for p in plan {
        eprintln!("  {}", p.line);
    }
}
