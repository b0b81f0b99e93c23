//! Retention: finished messages (with their attempts, receipts and fan-out links) are deleted in
//! bounded batches after their age; dead letters and unmatched receipts are kept longer; a
//! message in any other state is never deleted. Time moves by the injected clock.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::{Connection, RunQueryDsl};
use herald::retention::{RetentionConfig, run_once};
use herald::storage::retention::PurgedBatch;
use serde_json::json;

use crate::both_backends;
use crate::support::app::{TestApp, spawn_app_with, webhook};
use crate::support::{Backend, Receiver, Reply};

const DAY: Duration = Duration::from_secs(86_400);

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

fn count(app: &TestApp, sql: &str) -> i64 {
    let q = format!("SELECT count(*) AS n FROM {sql}");
    match app.test_db.backend {
        Backend::Postgres => {
            let mut c = diesel::pg::PgConnection::establish(&app.test_db.url).unwrap();
            diesel::sql_query(q).get_result::<Count>(&mut c).unwrap().n
        }
        Backend::Sqlite => {
            let path = herald::storage::sqlite_path(&app.test_db.url).unwrap();
            let mut c = diesel::sqlite::SqliteConnection::establish(path).unwrap();
            diesel::sql_query(q).get_result::<Count>(&mut c).unwrap().n
        }
    }
}

fn insert_receipt(app: &TestApp, id: &str, message_id: Option<i64>) {
    let now = match app.test_db.backend {
        Backend::Postgres => "now()",
        Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')",
    };
    let (mid, outcome, reconciled) = match message_id {
        Some(m) => (m.to_string(), "applied", now),
        None => ("NULL".into(), "unmatched", "NULL"),
    };
    app.raw_sql(&format!(
        "INSERT INTO herald_receipts (source, provider_event_id, event_type, provider_type, raw, \
         message_id, outcome, reconciled_at) \
         VALUES ('src', '{id}', 'delivered', 'delivered', '{{}}', {mid}, '{outcome}', {reconciled})"
    ));
}

fn batch(messages: usize, attempts: usize, receipts: usize, fanouts: usize) -> PurgedBatch {
    PurgedBatch {
        messages,
        attempts,
        receipts,
        fanouts,
    }
}

async fn retention_deletes_in_batches_and_leaves_dead_letters(backend: Backend) {
    let rx = Receiver::start().await;
    rx.script_path("/bad", [Reply::Status(400), Reply::Status(400)]);
    rx.script_path("/conflict", [Reply::Status(409)]);
    let app = spawn_app_with(
        backend,
        &format!(
            "retention_batch_size = 3\n[endpoints.e]\nurl = \"{}\"\nevent_types = [\"*\"]\n",
            rx.url
        ),
    )
    .await;
    for i in 0..9 {
        let r = app
            .post_message(webhook(&format!("ok-{i}"), &rx.url, json!({"i": i})))
            .await;
        assert_eq!(r.status(), 201);
    }
    let bad = rx.url_for("/bad");
    for i in 0..2 {
        app.post_message(webhook(&format!("dead-{i}"), &bad, json!({})))
            .await;
    }
    app.post_message(webhook("conflict", &rx.url_for("/conflict"), json!({})))
        .await;
    let r = app
        .post_message(
            json!({"event_id": "fan", "channel": "webhook", "destination": "type:x.y",
                             "payload": {"body": {}}}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let later = (app.clock_now() + chrono::Duration::days(400)).to_rfc3339();
    let mut future = webhook("future", &rx.url, json!({}));
    future["scheduled_at"] = json!(later);
    app.post_message(future.clone()).await;
    future["event_id"] = json!("canceled");
    app.post_message(future).await;
    let r = app
        .http
        .post(format!("{}/v1/messages/canceled/cancel", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    app.run_until_idle().await;
    assert_eq!(app.row("ok-0").state, "delivered");
    assert_eq!(app.row("fan:e").state, "delivered");
    assert_eq!(app.row("dead-1").state, "dead_letter");
    assert_eq!(app.row("conflict").state, "unconfirmed");
    assert_eq!(app.row("future").state, "scheduled");
    insert_receipt(&app, "matched", Some(app.row("ok-0").id));
    insert_receipt(&app, "unmatched", None);

    let config = RetentionConfig {
        batch_size: 3,
        ..app.herald.settings.retention
    };
    assert_eq!(
        (
            config.delivered_days,
            config.dead_letter_days,
            config.unmatched_receipt_days
        ),
        (30, 90, 90),
        "the defaults"
    );
    // Nothing is old enough yet.
    let db = app.db.clone();
    let now = app.clock_now();
    let r = tokio::task::spawn_blocking(move || run_once(&db, &config, now))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.transactions(), 0, "{r:?}");

    // 31 days on: the 11 delivered/canceled messages go, three per transaction, with their
    // 10 attempts, the matched receipt and the fan-out link; the rest stays.
    app.advance(31 * DAY);
    let db = app.db.clone();
    let now = app.clock_now();
    let r = tokio::task::spawn_blocking(move || run_once(&db, &config, now))
        .await
        .unwrap()
        .unwrap();
    let done = &r.done_batches;
    assert_eq!(
        done.iter().map(|b| b.messages).collect::<Vec<_>>(),
        [3, 3, 3, 2],
        "{r:?}"
    );
    assert_eq!(done.iter().map(|b| b.attempts).sum::<usize>(), 10);
    assert_eq!(done.iter().map(|b| b.receipts).sum::<usize>(), 1);
    assert_eq!(done.iter().map(|b| b.fanouts).sum::<usize>(), 1);
    assert!(r.dead_letter_batches.is_empty());
    assert!(r.unmatched_receipt_batches.is_empty());
    assert!(app.db.find_by_event_id("ok-0").unwrap().is_none());
    assert!(app.db.find_by_event_id("canceled").unwrap().is_none());
    assert!(app.db.fanout_of("fan").unwrap().is_empty());
    for kept in ["dead-0", "dead-1", "conflict", "future"] {
        assert!(app.db.find_by_event_id(kept).unwrap().is_some(), "{kept}");
    }
    assert_eq!(count(&app, "herald_outbox"), 4);
    assert_eq!(
        count(&app, "herald_attempts"),
        3,
        "the dead letters' and the 409's"
    );
    assert_eq!(count(&app, "herald_receipts"), 1, "the unmatched one");

    // 91 days on: the dead letters and the unmatched receipt go; the unconfirmed and the
    // scheduled message (90 days untouched) are never deleted.
    app.advance(60 * DAY);
    let db = app.db.clone();
    let now = app.clock_now();
    let r = tokio::task::spawn_blocking(move || run_once(&db, &config, now))
        .await
        .unwrap()
        .unwrap();
    assert!(r.done_batches.is_empty(), "{r:?}");
    assert_eq!(r.dead_letter_batches, [batch(2, 2, 0, 0)]);
    assert_eq!(r.unmatched_receipt_batches, [1]);
    assert_eq!(count(&app, "herald_outbox"), 2);
    assert_eq!(app.row("conflict").state, "unconfirmed");
    assert_eq!(app.row("future").state, "scheduled");
    assert_eq!(count(&app, "herald_receipts"), 0);
    app.stop().await;
}

async fn zero_keeps_forever(backend: Backend) {
    let rx = Receiver::start().await;
    let app = spawn_app_with(backend, "retention_delivered_days = 0\n").await;
    app.post_message(webhook("kept", &rx.url, json!({}))).await;
    app.run_until_idle().await;
    app.advance(3650 * DAY);
    let (db, config, now) = (
        app.db.clone(),
        app.herald.settings.retention,
        app.clock_now(),
    );
    let r = tokio::task::spawn_blocking(move || run_once(&db, &config, now))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.transactions(), 0);
    assert_eq!(app.row("kept").state, "delivered");
    // An age reaching before year 1 keeps forever too, and the other kinds' ages still purge:
    // PostgreSQL refused such a cutoff, which failed the whole pass (9999999 days).
    let config = herald::retention::RetentionConfig {
        delivered_days: 9_999_999,
        dead_letter_days: 1,
        ..config
    };
    let db = app.db.clone();
    let r = tokio::task::spawn_blocking(move || run_once(&db, &config, now))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.transactions(), 0, "{r:?}");
    assert_eq!(app.row("kept").state, "delivered");
    app.stop().await;
}

/// The replay keys of a signed source (Mailgun's tokens) go at the unmatched receipts' age, in
/// batches of their own: by then no signature of theirs is within any tolerance.
async fn replay_keys_go_at_the_unmatched_receipts_age(backend: Backend) {
    use hmac::{Hmac, Mac};
    let app = spawn_app_with(
        backend,
        "retention_batch_size = 2\n[sources.mg]\nscheme = \"mailgun\"\nsecrets = [\"key-1\"]\n",
    )
    .await;
    let t = app.clock_now().timestamp().to_string();
    for (token, id) in [("tok-1", "ev-1"), ("tok-2", "ev-2"), ("tok-3", "ev-1")] {
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(b"key-1").unwrap();
        mac.update(format!("{t}{token}").as_bytes());
        let signature = hex::encode(mac.finalize().into_bytes());
        let body = json!({
            "signature": {"timestamp": t, "token": token, "signature": signature},
            "event-data": {"id": id, "event": "delivered", "timestamp": 1_700_000_000.5}
        });
        let r = app
            .http
            .post(format!("{}/v1/ingest/mg", app.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(
        count(&app, "herald_replay_keys"),
        3,
        "a duplicate's token too"
    );
    let pass = |app: &TestApp| {
        let (db, config, now) = (
            app.db.clone(),
            app.herald.settings.retention,
            app.clock_now(),
        );
        tokio::task::spawn_blocking(move || run_once(&db, &config, now))
    };
    app.advance(89 * DAY);
    let r = pass(&app).await.unwrap().unwrap();
    assert!(r.replay_key_batches.is_empty(), "{r:?}");
    app.advance(2 * DAY);
    let r = pass(&app).await.unwrap().unwrap();
    assert_eq!(r.replay_key_batches, [2, 1]);
    assert_eq!(count(&app, "herald_replay_keys"), 0);
    app.stop().await;
}

/// A pass over a backlog ends between two batches once it is told to stop (a shutdown must
/// not wait for thousands of batches); what it did is reported, and the next pass goes on.
async fn a_pass_stops_between_batches(backend: Backend) {
    let app = spawn_app_with(backend, "").await;
    let rx = Receiver::start().await;
    for i in 0..5 {
        app.post_message(webhook(&format!("old-{i}"), &rx.url, json!({})))
            .await;
    }
    app.run_until_idle().await;
    app.advance(31 * DAY);
    let config = RetentionConfig {
        batch_size: 1,
        ..app.herald.settings.retention
    };
    let (db, now) = (app.db.clone(), app.clock_now());
    let r = tokio::task::spawn_blocking(move || {
        let asked = std::sync::atomic::AtomicUsize::new(0);
        // Stop when asked the third time: two batches done.
        let stop = || asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 2;
        herald::retention::run_until(&db, &config, now, &stop)
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(r.messages(), 2, "{r:?}");
    assert_eq!(count(&app, "herald_outbox"), 3);
    let (db, now) = (app.db.clone(), app.clock_now());
    let r = tokio::task::spawn_blocking(move || run_once(&db, &config, now))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.messages(), 3, "{r:?}");
    app.stop().await;
}

both_backends!(
    retention_deletes_in_batches_and_leaves_dead_letters,
    zero_keeps_forever,
    replay_keys_go_at_the_unmatched_receipts_age,
    a_pass_stops_between_batches
);

/// The real binary: `herald migrate` stores the configured subscriptions (so a plain SQL insert
/// fans out before Herald ever served), and `herald purge` runs one retention pass and prints
/// its batches.
#[test]
fn herald_migrate_and_purge_as_an_operator_runs_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("herald.toml"),
        "retention_batch_size = 1\n[endpoints.one]\nurl = \"https://one.example/h\"\n\
         event_types = [\"order.*\"]\n[endpoints.two]\nurl = \"https://two.example/h\"\n\
         event_types = [\"*\"]\n",
    )
    .unwrap();
    let db_path = dir.path().join("herald.db");
    let run = |verb: &str| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_herald"));
        for (k, _) in std::env::vars() {
            if k.starts_with("HERALD_") || k == "RUST_LOG" {
                cmd.env_remove(k);
            }
        }
        cmd.arg(verb)
            .current_dir(dir.path())
            .env(
                "HERALD_DATABASE_URL",
                format!("sqlite://{}", db_path.display()),
            )
            .output()
            .unwrap()
    };
    let herald = |verb: &str| {
        let out = run(verb);
        assert!(
            out.status.success(),
            "herald {verb}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    herald("migrate");
    let mut c = diesel::sqlite::SqliteConnection::establish(db_path.to_str().unwrap()).unwrap();
    c.batch_execute(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
         VALUES ('o-1', 'webhook', 'type:order.placed', '{\"body\": {}}')",
    )
    .unwrap();
    assert_eq!(
        diesel::sql_query("SELECT count(*) AS n FROM herald_outbox")
            .get_result::<Count>(&mut c)
            .unwrap()
            .n,
        2
    );
    // Delivered long ago (as the sender would have left them), plus one still scheduled.
    c.batch_execute(
        "UPDATE herald_outbox SET state = 'delivered', next_attempt_at = NULL, \
         updated_at = '2020-01-01 00:00:00.000+00:00'; \
         INSERT INTO herald_outbox (event_id, channel, destination, payload, updated_at) \
         VALUES ('waiting', 'webhook', 'https://x.example/h', '{\"body\": {}}', \
                 '2020-01-01 00:00:00.000+00:00')",
    )
    .unwrap();
    let report: serde_json::Value = serde_json::from_str(&herald("purge")).unwrap();
    assert_eq!(
        report["done_batches"],
        json!([
            {"messages": 1, "attempts": 0, "receipts": 0, "fanouts": 1},
            {"messages": 1, "attempts": 0, "receipts": 0, "fanouts": 1}
        ]),
        "{report}"
    );
    let left: Vec<Count> = diesel::sql_query(
        "SELECT count(*) AS n FROM herald_outbox UNION ALL SELECT count(*) FROM herald_fanouts",
    )
    .load(&mut c)
    .unwrap();
    assert_eq!(
        (left[0].n, left[1].n),
        (1, 0),
        "only the scheduled row is left"
    );

    // A pass that fails part way still prints what its committed batches deleted: here the
    // replay keys' table is gone, so the pass fails at its last kind, after the messages.
    c.batch_execute(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload, state, updated_at) \
         VALUES ('old', 'webhook', 'https://x.example/h', '{\"body\": {}}', 'delivered', \
                 '2020-01-01 00:00:00.000+00:00'); \
         ALTER TABLE herald_replay_keys RENAME TO gone",
    )
    .unwrap();
    let out = run("purge");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("retention failed after 1 committed batches (printed above)"),
        "{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["done_batches"],
        json!([{"messages": 1, "attempts": 0, "receipts": 0, "fanouts": 0}]),
        "{report}"
    );
    let left: Count =
        diesel::sql_query("SELECT count(*) AS n FROM herald_outbox WHERE event_id = 'old'")
            .get_result(&mut c)
            .unwrap();
    assert_eq!(left.n, 0, "the batch the report names was deleted");
}
