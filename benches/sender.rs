//! Sender throughput and insert-to-send latency, as ratios against baselines measured in the same
//! run on the same machine (shared, noisy machines: absolute figures mean little).
//!
//! `cargo bench --bench sender` (optionally `-- N`, messages per backend, default 2000).
//! Prints:
//! - the receiver's own ceiling: plain reqwest POSTs of the same size, same concurrency;
//! - Herald's production sender loop, per backend: messages/s from claim to recorded outcome,
//!   and its ratio to that ceiling;
//! - insert-to-send latency while the loop idles (poll interval 1 s): on PostgreSQL a commit on
//!   another connection, woken by LISTEN/NOTIFY; on SQLite POST /v1/messages, woken in-process.
#![allow(clippy::unwrap_used)] // tests and benchmarks fail loudly; src/ may not unwrap

#[path = "../tests/it/support/mod.rs"]
#[allow(dead_code, unused_imports)]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use support::app::{spawn_app_with, webhook};
use support::{Backend, Receiver};

const CONCURRENCY: usize = 64;

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2000)
        .clamp(100, 50_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(n));
}

fn body(i: usize) -> serde_json::Value {
    json!({"type": "order.placed", "data": {"id": i, "note": "x".repeat(200)}})
}

async fn run(n: usize) {
    herald::channels::install_crypto_provider();
    println!("sender benchmark: {n} messages per backend, {CONCURRENCY} concurrent sends, 2 cores");
    let ceiling = receiver_ceiling(n).await;
    println!("baseline  receiver ceiling (reqwest → receiver): {ceiling:>8.0} req/s");
    for backend in [Backend::Postgres, Backend::Sqlite] {
        let (rate, latency) = sender(backend, n).await;
        println!(
            "{:<9} herald sender: {rate:>8.0} msg/s = {:.2} × ceiling; insert-to-send p50 {:.1} ms, p95 {:.1} ms",
            format!("{backend:?}"),
            rate / ceiling,
            latency.0,
            latency.1,
        );
    }
}

/// The receiver's own ceiling: the same request size and concurrency, no Herald in between.
async fn receiver_ceiling(n: usize) -> f64 {
    let rx = Receiver::start().await;
    let client = reqwest::Client::new();
    let payload = serde_json::to_vec(&body(0)).unwrap();
    let start = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let (client, url, payload, next) = (
            client.clone(),
            rx.url.clone(),
            payload.clone(),
            next.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                let r = client
                    .post(&url)
                    .body(payload.clone())
                    .send()
                    .await
                    .expect("baseline request");
                assert!(r.status().is_success());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn sender(backend: Backend, n: usize) -> (f64, (f64, f64)) {
    // The production poll interval: the wake-ups, not polling, must make latency low.
    let extra = format!(
        "sender_concurrency = {CONCURRENCY}\nsender_batch_size = 100\npoll_interval_ms = 1000\n"
    );
    let app = spawn_app_with(backend, &extra).await;
    let rx = Receiver::start().await;
    // Enqueue everything first (not timed), then time the sender alone.
    let db = app.db.clone();
    let url = rx.url.clone();
    tokio::task::spawn_blocking(move || {
        for i in 0..n {
            let m = herald::outbox::NewMessage::webhook(format!("bench-{i}"), url.clone(), body(i));
            let row = m.prepare(&Default::default(), chrono::Utc::now()).unwrap();
            db.enqueue(&row).unwrap();
        }
    })
    .await
    .unwrap();
    let start = Instant::now();
    let sender = app.start_sender();
    rx.wait_for(n, 300).await;
    // Outcomes are flushed in batches right after the sends: wait for the last to be recorded.
    let db = app.db.clone();
    let last = format!("bench-{}", n - 1);
    loop {
        let db = db.clone();
        let last = last.clone();
        let done = tokio::task::spawn_blocking(move || {
            db.find_by_event_id(&last)
                .unwrap()
                .map(|r| r.state == "delivered")
                .unwrap_or(false)
        })
        .await
        .unwrap();
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();

    // Insert-to-send latency with the loop idle.
    let mut lat = Vec::new();
    for i in 0..30 {
        let seen = rx.requests().len();
        let t = Instant::now();
        if backend == Backend::Postgres {
            // The library path on its own connection: only LISTEN/NOTIFY (or the 1 s poll) wakes
            // the sender.
            let (db, url) = (app.db.clone(), rx.url.clone());
            tokio::task::spawn_blocking(move || {
                let m =
                    herald::outbox::NewMessage::webhook(format!("lat-{i}"), url, json!({"i": i}));
                db.enqueue(&m.prepare(&Default::default(), chrono::Utc::now()).unwrap())
                    .unwrap();
            })
            .await
            .unwrap();
        } else {
            let r = app
                .post_message(webhook(&format!("lat-{i}"), &rx.url, json!({"i": i})))
                .await;
            assert_eq!(r.status(), 201);
        }
        rx.wait_for(seen + 1, 30).await;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    sender.stop().await;
    assert_eq!(
        rx.requests().len(),
        n + 30,
        "every message sent exactly once"
    );
    app.stop().await;
    (rate, (lat[lat.len() / 2], lat[lat.len() * 95 / 100]))
}
