//! Email throughput into a local SMTP server (the test suite's SMTP sink on 127.0.0.1), as a ratio
//! against that server's own ceiling measured in the same run: a plain lettre loop — as many
//! connections as Herald's pool, each sending one message after another, no Herald in between —
//! on TCP connections with Nagle off, as Herald opens them. The same loop on lettre's own
//! connections (Nagle on) is printed too: it shows the ~40 ms delayed-ACK stall per message
//! that Herald's connections avoid.
//!
//! `cargo bench --bench email` (optionally `-- N` messages, default 2000). Herald runs its
//! production sender loop on SQLite with the SMTP pool on (`smtp_pool_size`, default 10).
#![allow(clippy::unwrap_used)] // tests and benchmarks fail loudly; src/ may not unwrap

#[path = "../tests/it/support/mod.rs"]
#[allow(dead_code, unused_imports)]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lettre::address::Envelope;
use lettre::transport::smtp::client::AsyncSmtpConnection;
use lettre::transport::smtp::extension::ClientId;
use support::Backend;
use support::app::spawn_app_with;
use support::smtp_sink::SmtpSink;

/// Herald's default SMTP pool size, and the baseline's connection count.
const CONNECTIONS: usize = 10;

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
        .unwrap();
    rt.block_on(run(n));
}

fn message(i: usize) -> Vec<u8> {
    format!(
        "From: Herald <herald@localhost>\r\nTo: user{i}@example.com\r\nSubject: Order {i}\r\n\
         Message-ID: <{i}@bench.localhost>\r\n\r\n{}\r\n",
        "x".repeat(200)
    )
    .into_bytes()
}

async fn run(n: usize) {
    herald::channels::install_crypto_provider();
    println!(
        "email benchmark: {n} messages into the in-test SMTP sink, {CONNECTIONS} connections, 2 cores"
    );
    let nagle = lettre_ceiling(n, false).await;
    println!("reference plain lettre loop, lettre's own connections:   {nagle:>8.0} msg/s");
    let ceiling = lettre_ceiling(n, true).await;
    println!(
        "baseline  plain lettre loop, Nagle off ({CONNECTIONS} connections): {ceiling:>8.0} msg/s"
    );
    let rate = herald_rate(n).await;
    println!(
        "herald    sender loop, SQLite, SMTP pool of {CONNECTIONS}:  {rate:>8.0} msg/s = {:.2} × ceiling",
        rate / ceiling
    );
    println!(
        "RESULT email_throughput value={rate:.0} baseline={ceiling:.0} ratio={:.2} unit=msg/s",
        rate / ceiling
    );
}

/// The sink's ceiling: `CONNECTIONS` lettre connections, each sending one message after another.
async fn lettre_ceiling(n: usize, nodelay: bool) -> f64 {
    let sink = SmtpSink::start().await;
    let addr = sink.url.trim_start_matches("smtp://").to_owned();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let port: u16 = port.parse().unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let (host, next) = (host.to_owned(), next.clone());
        tasks.push(tokio::spawn(async move {
            let hello = ClientId::Domain("bench.localhost".into());
            let mut conn = if nodelay {
                let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
                    .await
                    .unwrap();
                tcp.set_nodelay(true).unwrap();
                AsyncSmtpConnection::connect_with_transport(Box::new(tcp), &hello)
                    .await
                    .unwrap()
            } else {
                AsyncSmtpConnection::connect_tokio1(
                    (host.as_str(), port),
                    Some(Duration::from_secs(10)),
                    &hello,
                    None,
                    None,
                )
                .await
                .unwrap()
            };
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let envelope = Envelope::new(
                    Some("herald@localhost".parse().unwrap()),
                    vec![format!("user{i}@example.com").parse().unwrap()],
                )
                .unwrap();
                conn.send(&envelope, &message(i)).await.unwrap();
            }
            conn.quit().await.ok();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    assert_eq!(sink.accepted().len(), n);
    rate
}

async fn herald_rate(n: usize) -> f64 {
    let sink = SmtpSink::start().await;
    let extra = format!(
        "smtp_url = \"{}\"\nsender_concurrency = 64\nsender_batch_size = 100\npoll_interval_ms = 1000\n",
        sink.url
    );
    let app = spawn_app_with(Backend::Sqlite, &extra).await;
    // Enqueue everything first (not timed), then time the sender alone.
    let db = app.db.clone();
    tokio::task::spawn_blocking(move || {
        for i in 0..n {
            let m = herald::outbox::NewMessage::email(
                format!("mail-{i}"),
                format!("user{i}@example.com"),
                format!("Order {i}"),
                "x".repeat(200),
            );
            db.enqueue(&m.prepare(&Default::default(), chrono::Utc::now()).unwrap())
                .unwrap();
        }
    })
    .await
    .unwrap();
    let start = Instant::now();
    let sender = app.start_sender();
    sink.wait_for_mail(n, Duration::from_secs(600)).await;
    // Outcomes are flushed in batches right after the sends: wait for the last to be recorded.
    let last = format!("mail-{}", n - 1);
    loop {
        let (db, last) = (app.db.clone(), last.clone());
        let done = tokio::task::spawn_blocking(move || {
            db.find_by_event_id(&last)
                .unwrap()
                .is_some_and(|r| r.state == "delivered")
        })
        .await
        .unwrap();
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    sender.stop().await;
    assert_eq!(sink.accepted().len(), n, "every message sent exactly once");
    app.stop().await;
    rate
}
