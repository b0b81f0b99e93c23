//! Receipt ingest throughput on PostgreSQL through `POST /v1/ingest/{source}`, as a ratio against
//! PostgreSQL's own single-row durable insert rate measured in the same run on the same cluster
//! (pgbench, 4 clients, one INSERT per transaction). The cluster keeps fsync on.
//!
//! `cargo bench --bench ingest` (optionally `-- SECONDS` per measurement, default 5).
//! Two shapes: one event per request (Standard Webhooks: Resend, Svix) and 50 events per request
//! (a SendGrid Event Webhook batch, ECDSA-signed).
#![allow(clippy::unwrap_used)] // tests and benchmarks fail loudly; src/ may not unwrap

#[path = "../tests/it/support/mod.rs"]
#[allow(dead_code, unused_imports)]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use p256::ecdsa::signature::Signer;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::EncodePublicKey;
use support::Backend;
use support::app::spawn_with_workers;
use support::db::TestDb;

const CLIENTS: usize = 16;
const RESEND: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn main() {
    let secs: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(5)
        .clamp(1, 60);
    // SAFETY: set before any thread exists; read once by the test harness when it starts PostgreSQL.
    unsafe { std::env::set_var("HERALD_TEST_PG_DURABLE", "1") };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(Duration::from_secs(secs)));
}

async fn run(window: Duration) {
    herald::channels::install_crypto_provider();
    let test_db = TestDb::new(Backend::Postgres);
    let baseline = pgbench(&test_db.url, window);
    println!(
        "ingest benchmark on PostgreSQL (fsync on), {CLIENTS} HTTP clients, {}s per measurement, 2 cores",
        window.as_secs()
    );
    println!("baseline   pgbench single-row INSERT, 4 clients: {baseline:>8.0} rows/s");

    let key = SigningKey::from_bytes(&[7u8; 32].into()).expect("key");
    let public = base64::engine::general_purpose::STANDARD.encode(
        p256::PublicKey::from(key.verifying_key())
            .to_public_key_der()
            .expect("der")
            .as_bytes(),
    );
    let toml = format!(
        "[sources.resend]\nscheme = \"standard-webhooks\"\nsecrets = [\"{RESEND}\"]\n\
         [sources.sg]\nscheme = \"sendgrid\"\nsecrets = [\"{public}\"]\n"
    );
    let app = Arc::new(spawn_with_workers(test_db, &toml, 2).await);
    for (label, per_request) in [
        ("1 event/request (standard-webhooks)", 1usize),
        ("50 events/request (sendgrid)", 50),
    ] {
        let key = key.clone();
        let make = move |n: usize| -> (String, Vec<(&'static str, String)>, Vec<u8>) {
            if per_request == 1 {
                let id = format!("msg_{n}");
                let body = format!(r#"{{"type":"email.delivered","created_at":"2026-11-30T10:00:00Z","data":{{"email_id":"em_{n}"}}}}"#)
                    .into_bytes();
                let t = chrono::Utc::now().timestamp();
                let sig = herald::crypto::signing::SigningKey::parse(RESEND)
                    .unwrap()
                    .sign(&id, t, &body);
                (
                    "resend".into(),
                    vec![
                        ("svix-id", id),
                        ("svix-timestamp", t.to_string()),
                        ("svix-signature", sig),
                    ],
                    body,
                )
            } else {
                let events: Vec<_> = (0..per_request)
                    .map(|i| serde_json::json!({"event": "delivered", "sg_event_id": format!("ev_{n}_{i}"),
                        "sg_message_id": format!("m{n}.x"), "timestamp": 1_700_000_000 + i, "email": "a@b.example"}))
                    .collect();
                let mut body = serde_json::to_vec(&events).unwrap();
                body.extend_from_slice(b"\r\n");
                let ts = chrono::Utc::now().timestamp().to_string();
                let mut signed = ts.clone().into_bytes();
                signed.extend_from_slice(&body);
                let sig: Signature = key.sign(&signed);
                let sig = base64::engine::general_purpose::STANDARD.encode(sig.to_der().as_bytes());
                (
                    "sg".into(),
                    vec![
                        ("x-twilio-email-event-webhook-signature", sig),
                        ("x-twilio-email-event-webhook-timestamp", ts),
                    ],
                    body,
                )
            }
        };
        let make = Arc::new(make);
        let next = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let deadline = start + window;
        let mut tasks = Vec::new();
        for _ in 0..CLIENTS {
            let (app, make, next) = (app.clone(), make.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                let mut done = 0usize;
                while Instant::now() < deadline {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let (source, headers, body) = make(n);
                    let mut req = app
                        .http
                        .post(format!("{}/v1/ingest/{source}", app.base))
                        .body(body);
                    for (h, v) in headers {
                        req = req.header(h, v);
                    }
                    let r = req.send().await.expect("ingest request");
                    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
                    done += 1;
                }
                done
            }));
        }
        let mut requests = 0;
        for t in tasks {
            requests += t.await.unwrap();
        }
        let elapsed = start.elapsed().as_secs_f64();
        let receipts = (requests * per_request) as f64 / elapsed;
        println!(
            "herald     {label}: {:>8.0} requests/s, {receipts:>8.0} receipts/s = {:.2} × baseline",
            requests as f64 / elapsed,
            receipts / baseline
        );
    }
}

/// pgbench: 4 clients, one single-row INSERT per transaction, for `window`.
fn pgbench(url: &str, window: Duration) -> f64 {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    let mut c = diesel::pg::PgConnection::establish(url).unwrap();
    c.batch_execute("CREATE TABLE IF NOT EXISTS bench_single (id bigserial PRIMARY KEY, v bigint NOT NULL, at timestamptz NOT NULL DEFAULT now())")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("insert.sql");
    std::fs::write(
        &script,
        "\\set v random(1, 1000000000)\nINSERT INTO bench_single (v) VALUES (:v);\n",
    )
    .unwrap();
    let bin = support::db::pg_bin_dir().expect("PostgreSQL binaries");
    let u = url::Url::parse(url).unwrap();
    let out = std::process::Command::new(bin.join("pgbench"))
        .args([
            "-n",
            "-c",
            "4",
            "-j",
            "2",
            "-T",
            &window.as_secs().to_string(),
            "-f",
        ])
        .arg(&script)
        .args([
            "-h",
            u.host_str().unwrap(),
            "-p",
            &u.port().unwrap().to_string(),
            "-U",
            u.username(),
        ])
        .arg(u.path().trim_start_matches('/'))
        .output()
        .expect("run pgbench");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            l.strip_prefix("tps = ")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or_else(|| {
            panic!(
                "pgbench said: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}
