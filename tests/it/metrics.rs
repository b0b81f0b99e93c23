//! `GET /metrics` after a scripted run shows exactly what happened, on both backends, with labels
//! from finite sets only; `/readyz` names each reason it is not ready.

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::both_backends;
use crate::support::app::{TestApp, call_with_storage_down, spawn_app_with, webhook};
use crate::support::prom::{assert_bounded_labels, scrape, value};
use crate::support::{Backend, Receiver, Reply};

/// Every event id of the run carries it: none may show up in the metrics.
const MARK: &str = "evt-9c1b";

fn sources() -> &'static str {
    "ingest_max_body_bytes = 4096\n\
     [sources.esp]\nscheme = \"hmac\"\nsecrets = [\"esp-secret\"]\n\
     [sources.mg]\nscheme = \"mailgun\"\nsecrets = [\"key-1\"]\n"
}

async fn post_esp(app: &TestApp, body: &[u8], secret: &[u8]) -> u16 {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(body);
    app.http
        .post(format!("{}/v1/ingest/esp", app.base))
        .header("x-signature", hex::encode(mac.finalize().into_bytes()))
        .body(body.to_vec())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn post_mailgun(app: &TestApp, event_id: &str, token: &str) -> u16 {
    let t = herald::clock::Clock::now(&*app.clock)
        .timestamp()
        .to_string();
    let mut mac = Hmac::<Sha256>::new_from_slice(b"key-1").unwrap();
    mac.update(format!("{t}{token}").as_bytes());
    let body = json!({
        "signature": {"timestamp": t, "token": token,
                      "signature": hex::encode(mac.finalize().into_bytes())},
        "event-data": {"id": event_id, "event": "delivered"}
    });
    app.http
        .post(format!("{}/v1/ingest/mg", app.base))
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn esp_receipt(id: &str, herald_event_id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"id": id, "type": "delivered", "herald_event_id": herald_event_id}))
        .unwrap()
}

async fn metrics_count_a_scripted_run_with_bounded_labels(backend: Backend) {
    let mail = tempfile::tempdir().unwrap();
    let app = spawn_app_with(
        backend,
        &format!("mail_dir = \"{}\"\n{}", mail.path().display(), sources()),
    )
    .await;
    let rx = Receiver::start().await;
    let (_, before) = scrape(&app.http, &app.base).await;
    let keys_before: std::collections::BTreeSet<String> = before.iter().map(|s| s.key()).collect();

    // Webhooks, each to a path (and event id) of its own: 5 accepted, 2 refused for good, one
    // 503 then 200, one 503 with a budget of one attempt, one 409.
    let id = |kind: &str, i: usize| format!("order-{i}:{kind}:{MARK}");
    let mut ids = Vec::new();
    let mut paths = Vec::new();
    let mut post = async |kind: &str, i: usize, replies: Vec<Reply>, extra: Value| {
        let path = format!("/{kind}/{MARK}-{i}");
        rx.script_path(&path, replies);
        let mut m = webhook(&id(kind, i), &rx.url_for(&path), json!({"i": i}));
        m.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        assert_eq!(app.post_message(m).await.status(), 201);
        ids.push(id(kind, i));
        paths.push(path);
    };
    for i in 0..5 {
        post("ok", i, vec![Reply::Status(200)], json!({})).await;
    }
    for i in 0..2 {
        post("perm", i, vec![Reply::Status(400)], json!({})).await;
    }
    let twice = vec![Reply::Status(503), Reply::Status(200)];
    post("flaky", 0, twice, json!({})).await;
    let once = json!({"max_attempts": 1});
    post("spent", 0, vec![Reply::Status(503)], once).await;
    post("conflict", 0, vec![Reply::Status(409)], json!({})).await;
    // Two emails to addresses of their own.
    let addresses: Vec<String> = (0..2)
        .map(|i| format!("user{i}.{MARK}@example.com"))
        .collect();
    let mut mail_ids = Vec::new();
    for (i, to) in addresses.iter().enumerate() {
        let r = app
            .post_message(json!({
                "event_id": id("mail", i), "channel": "email", "destination": to,
                "payload": {"subject": "Hi", "text": "Hello"},
            }))
            .await;
        assert_eq!(r.status(), 201);
        mail_ids.push(id("mail", i));
    }
    app.run_until_idle().await;
    // The 503 is retried once its backoff (about 1 s) has passed.
    app.advance(Duration::from_secs(10));
    app.run_until_idle().await;
    assert_eq!(app.message(&id("flaky", 0)).await["state"], "delivered");

    // A claim whose sender "dies": the watchdog returns the expired lease.
    post("lease", 0, vec![], json!({})).await;
    assert_eq!(app.herald.sender.claim(10).await.unwrap().len(), 1);
    app.advance(Duration::from_secs(31));
    assert_eq!(
        app.herald.sender.sweep_leases().await.unwrap().to_retryable,
        1
    );
    // Its retry falls due and waits: the oldest due message.
    app.advance(Duration::from_secs(10));

    // Receipts: three stored, one again (a duplicate), one with a bad signature, one too large,
    // a Mailgun signature used twice (the second a replay), one to a source that does not exist.
    let r1 = esp_receipt(&format!("r1-{MARK}"), &id("ok", 0));
    for body in [
        r1.clone(),
        esp_receipt(&format!("r2-{MARK}"), &id("ok", 1)),
        esp_receipt(&format!("r3-{MARK}"), &format!("no-such-message:{MARK}")),
        r1,
    ] {
        assert_eq!(post_esp(&app, &body, b"esp-secret").await, 200);
    }
    let forged = esp_receipt(&format!("r4-{MARK}"), &id("ok", 2));
    assert_eq!(post_esp(&app, &forged, b"not-the-secret").await, 401);
    assert_eq!(post_esp(&app, &vec![b' '; 5000], b"esp-secret").await, 413);
    assert_eq!(
        post_mailgun(&app, &format!("mg-1-{MARK}"), "tok-1").await,
        200
    );
    assert_eq!(
        post_mailgun(&app, &format!("mg-2-{MARK}"), "tok-1").await,
        401
    );
    let r = app
        .http
        .post(format!("{}/v1/ingest/nope-{MARK}", app.base))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // Not reconciled yet: the reconciler is behind by the 5 s that pass now.
    app.advance(Duration::from_secs(5));
    let (_, s) = scrape(&app.http, &app.base).await;
    let lag = value(&s, "herald_reconciler_lag_seconds", &[]);
    assert!((5.0..60.0).contains(&lag), "{lag}");
    assert_eq!(value(&s, "herald_receipts_unmatched", &[]), 0.0);
    app.herald.reconciler.run_until_idle().await.unwrap();

    let (text, s) = scrape(&app.http, &app.base).await;
    assert_bounded_labels(&s, &["esp", "mg"]);
    let keys_after: std::collections::BTreeSet<String> = s.iter().map(|s| s.key()).collect();
    assert_eq!(
        keys_after, keys_before,
        "every series exists from the start; the run added none"
    );
    for needle in ids
        .iter()
        .chain(&mail_ids)
        .chain(&paths)
        .chain(&addresses)
        .map(String::as_str)
        .chain([
            MARK,
            "@",
            "http://",
            rx.url
                .trim_start_matches("http://")
                .trim_end_matches("/hook"),
            "nope-",
        ])
    {
        assert!(!text.contains(needle), "{needle:?} in /metrics:\n{text}");
    }

    let attempts = |channel: &str, class: &str| {
        value(
            &s,
            "herald_attempts_total",
            &[("channel", channel), ("class", class)],
        )
    };
    assert_eq!(attempts("webhook", "accepted"), 6.0);
    assert_eq!(attempts("webhook", "transient"), 2.0);
    assert_eq!(attempts("webhook", "permanent"), 2.0);
    assert_eq!(attempts("webhook", "conflict"), 1.0);
    assert_eq!(attempts("email", "accepted"), 2.0);
    let total: f64 = s
        .iter()
        .filter(|x| x.name == "herald_attempts_total")
        .map(|x| x.value)
        .sum();
    assert_eq!(total, 13.0, "no other attempt counted");
    let count = |name: &str, labels: &[(&str, &str)]| value(&s, name, labels);
    assert_eq!(
        count(
            "herald_send_duration_seconds_count",
            &[("channel", "webhook")]
        ),
        11.0
    );
    assert_eq!(
        count(
            "herald_send_duration_seconds_count",
            &[("channel", "email")]
        ),
        2.0
    );
    // One retry after an attempt (the 503), about 1 s away; the lease's retry is a lease expiry.
    assert_eq!(
        count(
            "herald_retry_delay_seconds_count",
            &[("class", "transient")]
        ),
        1.0
    );
    let delay = count("herald_retry_delay_seconds_sum", &[("class", "transient")]);
    assert!((0.8..=1.2).contains(&delay), "{delay}");
    assert_eq!(
        count(
            "herald_retry_delay_seconds_bucket",
            &[("class", "transient"), ("le", "4")]
        ),
        1.0
    );
    for (reason, n) in [
        ("permanent", 2.0),
        ("exhausted", 1.0),
        ("unconfirmed_deadline", 0.0),
    ] {
        assert_eq!(
            count("herald_dead_letters_total", &[("reason", reason)]),
            n,
            "{reason}"
        );
    }
    for (next, n) in [
        ("retryable", 1.0),
        ("unconfirmed", 0.0),
        ("dead_letter", 0.0),
    ] {
        assert_eq!(
            count("herald_lease_expiries_total", &[("next_state", next)]),
            n,
            "{next}"
        );
    }
    // Every claimed row, the lease's included (13 attempts + 1 claim that never sent).
    assert_eq!(count("herald_claim_batch_size_sum", &[]), 14.0);
    assert!(count("herald_claim_batch_size_count", &[]) >= 3.0);
    for (source, verdict, n) in [
        ("esp", "stored", 3.0),
        ("esp", "duplicate", 1.0),
        ("esp", "replayed", 0.0),
        ("mg", "stored", 1.0),
        ("mg", "replayed", 1.0),
        ("mg", "duplicate", 0.0),
    ] {
        assert_eq!(
            count(
                "herald_receipts_total",
                &[("source", source), ("verdict", verdict)]
            ),
            n,
            "{source} {verdict}"
        );
    }
    for (source, verdict, n) in [
        ("esp", "accepted", 4.0),
        ("esp", "signature_refused", 1.0),
        ("esp", "too_large", 1.0),
        ("esp", "replayed", 0.0),
        ("mg", "accepted", 1.0),
        ("mg", "replayed", 1.0),
        ("(unknown)", "unknown_source", 1.0),
    ] {
        assert_eq!(
            count(
                "herald_ingest_requests_total",
                &[("source", source), ("verdict", verdict)]
            ),
            n,
            "{source} {verdict}"
        );
    }
    assert_eq!(
        count("herald_ingest_duration_seconds_count", &[("source", "esp")]),
        6.0
    );
    assert_eq!(
        count("herald_ingest_duration_seconds_count", &[("source", "mg")]),
        2.0
    );
    for (state, n) in [
        ("delivered", 8.0),
        ("dead_letter", 3.0),
        ("unconfirmed", 1.0),
        ("retryable", 1.0),
        ("scheduled", 0.0),
        ("sending", 0.0),
        ("canceled", 0.0),
        ("expired", 0.0),
    ] {
        assert_eq!(count("herald_messages", &[("state", state)]), n, "{state}");
    }
    // The lease's retry fell due about 1 s after the sweep; 15 s have passed since.
    let oldest = count("herald_oldest_due_message_age_seconds", &[]);
    assert!((13.0..60.0).contains(&oldest), "{oldest}");
    assert_eq!(count("herald_reconciler_lag_seconds", &[]), 0.0);
    // r3 names no message; Mailgun's event carries no Herald event id.
    assert_eq!(count("herald_receipts_unmatched", &[]), 2.0);
    assert_eq!(count("herald_database_up", &[]), 1.0);
    assert!(
        s.iter()
            .all(|x| x.name != "herald_sender_heartbeat_age_seconds"),
        "no sender loop runs in this test"
    );
    app.stop().await;
}

/// `GET /readyz` as JSON: status and body.
async fn readyz(app: &TestApp) -> (u16, Value) {
    let r = app
        .http
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

fn reasons(body: &Value) -> Vec<&str> {
    body["reasons"]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["reason"].as_str()).collect())
        .unwrap_or_default()
}

/// A database migrated to an older version than this Herald's: not ready, and says which.
async fn readyz_names_pending_migrations(backend: Backend) {
    use diesel::Connection;
    use diesel_migrations::MigrationHarness;
    let app = spawn_app_with(backend, "").await;
    assert_eq!(readyz(&app).await.0, 200);
    let url = app.test_db.url.clone();
    let reverted = tokio::task::spawn_blocking(move || match backend {
        Backend::Postgres => diesel::pg::PgConnection::establish(&url)
            .unwrap()
            .revert_last_migration(herald::storage::PG_MIGRATIONS)
            .unwrap()
            .to_string(),
        Backend::Sqlite => {
            let path = herald::storage::sqlite_path(&url).unwrap();
            diesel::sqlite::SqliteConnection::establish(path)
                .unwrap()
                .revert_last_migration(herald::storage::SQLITE_MIGRATIONS)
                .unwrap()
                .to_string()
        }
    })
    .await
    .unwrap();
    let (status, body) = readyz(&app).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(reasons(&body), ["migrations_pending"], "{body}");
    assert_eq!(body["reasons"][0]["pending"], json!([reverted]), "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("herald migrate"),
        "{body}"
    );
    let db = app.db.clone();
    tokio::task::spawn_blocking(move || db.migrate().unwrap())
        .await
        .unwrap();
    assert_eq!(readyz(&app).await.0, 200);
    app.stop().await;
}

/// A write lock held on the outbox by someone else: the sender loop's claim cannot finish, and
/// once longer than the limit has passed (the clock moved, not slept) `/readyz` says so.
async fn readyz_says_when_the_sender_stalls(backend: Backend) {
    let app = spawn_app_with(backend, "").await;
    let limit = app.herald.sender.heartbeat().limit();
    assert_eq!(limit, Duration::from_secs(30), "the lease, above 3 polls");
    let sender = app.start_sender();
    // The loop's first beat (at its start) must come before the clock moves below.
    let heartbeat = app.herald.sender.heartbeat();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while heartbeat.last().is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the loop never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        readyz(&app).await.0,
        200,
        "a running loop that beats is ready"
    );
    // Hold the outbox: PostgreSQL's claim waits on the table lock, SQLite's fails on busy.
    let url = app.test_db.url.clone();
    let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = std::thread::spawn(move || {
        use diesel::Connection;
        use diesel::connection::SimpleConnection;
        match backend {
            Backend::Postgres => {
                let mut c = diesel::pg::PgConnection::establish(&url).unwrap();
                c.batch_execute("BEGIN; LOCK TABLE herald_outbox IN EXCLUSIVE MODE")
                    .unwrap();
                held_tx.send(()).unwrap();
                hold_rx.recv().unwrap();
                c.batch_execute("ROLLBACK").unwrap();
            }
            Backend::Sqlite => {
                let path = herald::storage::sqlite_path(&url).unwrap();
                let mut c = diesel::sqlite::SqliteConnection::establish(path).unwrap();
                c.batch_execute("PRAGMA busy_timeout = 5000; BEGIN IMMEDIATE")
                    .unwrap();
                held_tx.send(()).unwrap();
                hold_rx.recv().unwrap();
                c.batch_execute("ROLLBACK").unwrap();
            }
        }
    });
    held_rx.await.unwrap();
    // Every iteration from now on is stuck; the last beat is from before this move.
    app.advance(limit + Duration::from_secs(15));
    let (status, body) = readyz(&app).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(reasons(&body), ["sender_stalled"], "{body}");
    let (_, s) = scrape(&app.http, &app.base).await;
    assert!(value(&s, "herald_sender_heartbeat_age_seconds", &[]) > 45.0);
    // Released: the loop claims again and is ready (bounded wait on the loop's own progress).
    hold_tx.send(()).unwrap();
    tokio::task::spawn_blocking(move || holder.join().unwrap())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = readyz(&app).await;
        if status == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sender.stop().await;
    // A stopped loop is not watched: a process without a sender is never "stalled".
    app.advance(limit * 10);
    assert_eq!(readyz(&app).await.0, 200);
    app.stop().await;
}

both_backends!(
    metrics_count_a_scripted_run_with_bounded_labels,
    readyz_names_pending_migrations,
    readyz_says_when_the_sender_stalls,
);

/// On SQLite, `/metrics` shows what Herald's checkpointer last found: frames that an open read
/// transaction keeps it from copying are `herald_sqlite_wal_frames_held` until that transaction
/// ends (the WAL cannot start again meanwhile, and its file grows). On PostgreSQL no
/// `herald_sqlite_*` series is there.
#[actix_web::test]
async fn the_sqlite_wal_gauges_show_the_frames_an_open_reader_holds() {
    use diesel::connection::SimpleConnection;
    let app = spawn_app_with(Backend::Sqlite, "").await;
    let herald::storage::Db::Sqlite(sq) = app.db.clone() else {
        unreachable!()
    };
    let passes = |n: u64| {
        let sq = sq.clone();
        async move {
            let ran = tokio::task::spawn_blocking(move || {
                sq.wait_for_checkpoints(n, Duration::from_secs(10))
            })
            .await
            .unwrap();
            assert!(ran, "no checkpoint pass within 10 s");
        }
    };
    let mut reader = crate::support::db::reader_then_row(&sq, "wal-1");
    passes(2).await;
    let (text, s) = scrape(&app.http, &app.base).await;
    let held = value(&s, "herald_sqlite_wal_frames_held", &[]);
    assert!(held >= 1.0, "the write's frames held by the reader\n{text}");
    assert!(value(&s, "herald_sqlite_wal_frames", &[]) >= 1.0, "{text}");
    assert_eq!(value(&s, "herald_sqlite_checkpoint_failing", &[]), 0.0);
    reader.batch_execute("COMMIT").unwrap();
    passes(1).await;
    let (text, s) = scrape(&app.http, &app.base).await;
    assert_eq!(
        value(&s, "herald_sqlite_wal_frames_held", &[]),
        0.0,
        "copied once the reader ended\n{text}"
    );
    drop(reader);
    app.stop().await;

    let pg = spawn_app_with(Backend::Postgres, "").await;
    let (text, _) = scrape(&pg.http, &pg.base).await;
    assert!(!text.contains("herald_sqlite_"), "{text}");
    pg.stop().await;
}

/// The database down: `/readyz` names it, `/metrics` still answers with its counters and says
/// the database gauges could not be read.
#[actix_web::test]
async fn with_the_database_down_readyz_names_it_and_metrics_still_answer() {
    let app = spawn_app_with(Backend::Sqlite, "").await;
    let responses = call_with_storage_down(
        &app,
        vec![
            actix_web::test::TestRequest::get().uri("/readyz"),
            actix_web::test::TestRequest::get().uri("/metrics"),
        ],
    )
    .await;
    let mut it = responses.into_iter();
    let ready = it.next().unwrap();
    assert_eq!(ready.status(), 503);
    assert_eq!(
        ready.headers().get("content-type").unwrap(),
        "application/problem+json"
    );
    let body: Value = actix_web::test::read_body_json(ready).await;
    assert_eq!(reasons(&body), ["database"], "{body}");
    let metrics = it.next().unwrap();
    assert_eq!(metrics.status(), 200);
    let text = String::from_utf8(actix_web::test::read_body(metrics).await.to_vec()).unwrap();
    let s = crate::support::prom::parse(&text);
    assert_eq!(value(&s, "herald_database_up", &[]), 0.0);
    assert!(s.iter().all(|x| x.name != "herald_messages"), "{text}");
    assert_eq!(
        value(
            &s,
            "herald_attempts_total",
            &[("channel", "webhook"), ("class", "accepted")]
        ),
        0.0
    );
    app.stop().await;
}

/// PostgreSQL: an outbox locked by someone's long transaction (or a database that hangs):
/// `/metrics` answers within its bound, without the database gauges (`herald_database_up` 0),
/// rather than hang with the database; the gauges come back with the lock's end. It hung for
/// as long as the lock was held. Nor does a burst of scrapes behind the lock take the pool:
/// each scrape's query waited on, its connection held for as long as the lock, and with the
/// pool's connections all waiting `/readyz` said the database did not answer (an operator's
/// walk-through); now one scrape reads at a time, its query cancelled at the scrape's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_outbox_does_not_hang_the_scrape() {
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, RunQueryDsl};
    #[derive(diesel::QueryableByName)]
    struct Waiting {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let app = spawn_app_with(Backend::Postgres, "database_pool_size = 4").await;
    let mut locker = diesel::pg::PgConnection::establish(&app.test_db.url).unwrap();
    locker
        .batch_execute("BEGIN; LOCK TABLE herald_outbox IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let scrape_once = || async {
        let r = app
            .http
            .get(format!("{}/metrics", app.base))
            // Well past the bound: a scrape that waited for the lock fails here.
            .timeout(Duration::from_secs(15))
            .send()
            .await
            .expect("the scrape answers while the outbox is locked");
        assert_eq!(r.status(), 200);
        crate::support::prom::parse(&r.text().await.unwrap())
    };
    let s = scrape_once().await;
    assert_eq!(value(&s, "herald_database_up", &[]), 0.0);
    assert!(s.iter().all(|x| x.name != "herald_messages"));
    // Three times the pool, at once.
    let burst = futures_util::future::join_all((0..12).map(|_| scrape_once())).await;
    assert!(
        burst
            .iter()
            .all(|s| value(s, "herald_database_up", &[]) == 0.0)
    );
    let (status, body) = readyz(&app).await;
    assert_eq!(status, 200, "{body}");
    // The query a scrape gave up on ends too (cancelled), though the lock is still held.
    let mut watcher = diesel::pg::PgConnection::establish(&app.test_db.url).unwrap();
    let waiting = |c: &mut diesel::pg::PgConnection| {
        diesel::sql_query(
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .get_result::<Waiting>(c)
        .unwrap()
        .n
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while waiting(&mut watcher) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a scrape's query still waits for the lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    locker.batch_execute("COMMIT").unwrap();
    let s = scrape_once().await;
    assert_eq!(value(&s, "herald_database_up", &[]), 1.0);
    app.stop().await;
}
