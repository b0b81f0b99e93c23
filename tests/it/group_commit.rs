//! Group commit for ingest and for `POST /v1/messages`, on both backends: concurrent requests'
//! writes share one transaction, none is answered before the commit that holds its writes, a
//! replay (or a value the database refuses, or an event id a fan-out holds) fails only its own
//! request, and a group that fails to commit answers 503 to every request in it.
//!
//! The writer's before-commit hook holds the first group's commit open (a gate the test opens)
//! while the next requests queue up behind it: no sleeps decide anything here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use herald::crypto::signing::SigningKey;
use herald::storage::StorageError;
use herald::storage::group_commit::GroupWriter;
use serde_json::{Value, json};

use crate::both_backends;
use crate::support::Backend;
use crate::support::app::{TestApp, spawn_app_with};

const RESEND: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn sources() -> String {
    format!(
        "[sources.resend]\nscheme = \"standard-webhooks\"\nsecrets = [\"{RESEND}\"]\n\
         [sources.mg]\nscheme = \"mailgun\"\nsecrets = [\"key-1\"]\n"
    )
}

/// A signed Standard Webhooks request for event `id`.
fn resend(id: &str) -> (String, Vec<(&'static str, String)>, Vec<u8>) {
    let body = serde_json::to_vec(&json!({
        "type": "email.delivered", "created_at": "2026-11-30T10:00:00.000Z",
        "data": {"email_id": format!("em_{id}")}
    }))
    .unwrap();
    let t = Utc::now().timestamp();
    let sig = SigningKey::parse(RESEND).unwrap().sign(id, t, &body);
    (
        "resend".into(),
        vec![
            ("svix-id", id.to_owned()),
            ("svix-timestamp", t.to_string()),
            ("svix-signature", sig),
        ],
        body,
    )
}

/// A Mailgun request for event `id` under the one signature (token `tok-1`): a second event
/// under it is a replay.
fn mailgun(id: &str) -> (String, Vec<(&'static str, String)>, Vec<u8>) {
    use hmac::{Hmac, Mac};
    let t = Utc::now().timestamp().to_string();
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(b"key-1").unwrap();
    mac.update(format!("{t}tok-1").as_bytes());
    let signature = hex::encode(mac.finalize().into_bytes());
    let body = serde_json::to_vec(&json!({
        "signature": {"timestamp": t, "token": "tok-1", "signature": signature},
        "event-data": {"id": id, "event": "delivered", "timestamp": 1_700_000_000.5}
    }))
    .unwrap();
    ("mg".into(), Vec::new(), body)
}

/// What the hook saw at each group's commit: (requests in the group, requests answered so far).
type Seen = Arc<Mutex<Vec<(usize, usize)>>>;

struct Gate {
    open: std::sync::mpsc::Sender<()>,
    entered: Arc<Mutex<std::sync::mpsc::Receiver<()>>>,
    seen: Seen,
    answered: Arc<AtomicUsize>,
}

/// Installs on `writer` a hook that holds the first group's commit until [`Gate::open`], records
/// every group, and fails the groups numbered in `fail` (0 = the first).
fn gate_on<P: Send + 'static, A: Send + 'static>(
    writer: &GroupWriter<P, A>,
    fail: &'static [usize],
) -> Gate {
    let (open, gate_rx) = std::sync::mpsc::channel::<()>();
    let (entered_tx, entered) = std::sync::mpsc::channel::<()>();
    let gate_rx = Mutex::new(gate_rx);
    let seen: Seen = Arc::default();
    let answered = Arc::new(AtomicUsize::new(0));
    let (s, a) = (seen.clone(), answered.clone());
    writer.set_before_commit(Some(Box::new(move |n| {
        let k = {
            let mut seen = s.lock().unwrap();
            seen.push((n, a.load(Ordering::SeqCst)));
            seen.len() - 1
        };
        if k == 0 {
            entered_tx.send(()).unwrap();
            gate_rx.lock().unwrap().recv().unwrap();
        }
        if fail.contains(&k) {
            return Err(StorageError::Unavailable(Box::new(std::io::Error::other(
                "injected commit failure",
            ))));
        }
        Ok(())
    })));
    Gate {
        open,
        entered: Arc::new(Mutex::new(entered)),
        seen,
        answered,
    }
}

/// [`gate_on`] ingest's writer.
fn gate(app: &TestApp, fail: &'static [usize]) -> Gate {
    gate_on(&app.herald.receipt_writer, fail)
}

impl Gate {
    async fn wait_entered(&self) {
        let e = self.entered.clone();
        tokio::task::spawn_blocking(move || {
            e.lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(10))
                .expect("the first group reaches its commit")
        })
        .await
        .unwrap();
    }
}

/// Sends a request in its own task; the gate counts it answered when its response arrives.
fn send(
    app: &TestApp,
    gate: &Gate,
    (source, headers, body): (String, Vec<(&'static str, String)>, Vec<u8>),
) -> tokio::task::JoinHandle<(u16, Value)> {
    let mut r = app
        .http
        .post(format!("{}/v1/ingest/{source}", app.base))
        .body(body);
    for (n, v) in headers {
        r = r.header(n, v);
    }
    let answered = gate.answered.clone();
    tokio::spawn(async move {
        let resp = r.send().await.expect("POST /v1/ingest");
        answered.fetch_add(1, Ordering::SeqCst);
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    })
}

/// Waits until `n` requests are queued behind ingest's held commit.
async fn queued(app: &TestApp, n: usize) {
    queued_on(&app.herald.receipt_writer, n).await
}

/// Waits until `n` requests are queued behind `writer`'s held commit.
async fn queued_on<P: Send + 'static, A: Send + 'static>(writer: &GroupWriter<P, A>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while writer.queued() < n {
        assert!(Instant::now() < deadline, "requests did not queue up");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn concurrent_requests_share_one_commit_and_are_answered_after_it(backend: Backend) {
    let app = spawn_app_with(backend, &sources()).await;
    let gate = gate(&app, &[]);
    let first = send(&app, &gate, resend("msg_0"));
    gate.wait_entered().await;
    let rest: Vec<_> = (1..=5)
        .map(|i| send(&app, &gate, resend(&format!("msg_{i}"))))
        .collect();
    queued(&app, 5).await;
    // The first group is inside its transaction, the others wait for theirs: nobody is answered.
    assert!(!first.is_finished() && rest.iter().all(|t| !t.is_finished()));
    assert_eq!(gate.answered.load(Ordering::SeqCst), 0);
    assert_eq!(app.db.receipts_of_source("resend").unwrap().len(), 0);
    gate.open.send(()).unwrap();
    assert_eq!(
        first.await.unwrap(),
        (200, json!({"stored": 1, "duplicates": 0}))
    );
    for t in rest {
        assert_eq!(
            t.await.unwrap(),
            (200, json!({"stored": 1, "duplicates": 0}))
        );
    }
    let seen = gate.seen.lock().unwrap().clone();
    // Two commits: the held one, then the five queued requests together — and at that second
    // commit none of those five had been answered (at most the first).
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0], (1, 0));
    assert_eq!(seen[1].0, 5);
    assert!(seen[1].1 <= 1, "{seen:?}");
    assert_eq!(app.herald.receipt_writer.commits(), 2);
    assert_eq!(app.db.receipts_of_source("resend").unwrap().len(), 6);
    app.stop().await;
}

both_backends!(concurrent_requests_share_one_commit_and_are_answered_after_it);

async fn a_failed_group_commit_answers_503_to_every_request_in_it(backend: Backend) {
    let app = spawn_app_with(backend, &sources()).await;
    let gate = gate(&app, &[1]);
    let first = send(&app, &gate, resend("msg_0"));
    gate.wait_entered().await;
    let rest: Vec<_> = (1..=4)
        .map(|i| send(&app, &gate, resend(&format!("msg_{i}"))))
        .collect();
    queued(&app, 4).await;
    gate.open.send(()).unwrap();
    assert_eq!(first.await.unwrap().0, 200);
    for t in rest {
        let (status, problem) = t.await.unwrap();
        assert_eq!(status, 503, "{problem}");
    }
    assert_eq!(gate.seen.lock().unwrap()[1].0, 4);
    // Nothing of the failed group was stored; the providers' retries store it.
    let stored = |app: &TestApp| app.db.receipts_of_source("resend").unwrap().len();
    assert_eq!(stored(&app), 1);
    let retry = send(&app, &gate, resend("msg_1")).await.unwrap();
    assert_eq!(retry, (200, json!({"stored": 1, "duplicates": 0})));
    assert_eq!(stored(&app), 2);
    app.stop().await;
}

both_backends!(a_failed_group_commit_answers_503_to_every_request_in_it);

async fn a_replay_in_a_group_undoes_only_its_own_request(backend: Backend) {
    let app = spawn_app_with(backend, &sources()).await;
    let gate = gate(&app, &[]);
    let first = send(&app, &gate, resend("msg_0"));
    gate.wait_entered().await;
    // One after another, so that the group holds them in this order.
    let genuine = send(&app, &gate, mailgun("ev-1"));
    queued(&app, 1).await;
    let forged = send(&app, &gate, mailgun("ev-forged"));
    queued(&app, 2).await;
    let other = send(&app, &gate, resend("msg_9"));
    queued(&app, 3).await;
    gate.open.send(()).unwrap();
    assert_eq!(first.await.unwrap().0, 200);
    assert_eq!(
        genuine.await.unwrap(),
        (200, json!({"stored": 1, "duplicates": 0}))
    );
    let (status, problem) = forged.await.unwrap();
    assert_eq!(status, 401, "{problem}");
    assert_eq!(
        other.await.unwrap(),
        (200, json!({"stored": 1, "duplicates": 0}))
    );
    let seen = gate.seen.lock().unwrap().clone();
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 3]);
    let mg = app.db.receipts_of_source("mg").unwrap();
    assert_eq!(
        mg.iter()
            .map(|r| r.provider_event_id.as_str())
            .collect::<Vec<_>>(),
        ["ev-1"]
    );
    assert_eq!(app.db.receipts_of_source("resend").unwrap().len(), 2);
    app.stop().await;
}

both_backends!(a_replay_in_a_group_undoes_only_its_own_request);

/// Makes the database refuse an insert into `table` whose `column` is `value` (a trigger that
/// raises).
fn refuse(app: &TestApp, backend: Backend, table: &str, column: &str, value: &str) {
    app.raw_sql(&match backend {
        Backend::Postgres => format!(
            "CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               IF NEW.{column} = '{value}' THEN RAISE EXCEPTION 'refused by the test'; \
               END IF; RETURN NEW; END $$; \
             CREATE TRIGGER test_refuse BEFORE INSERT ON {table} \
               FOR EACH ROW EXECUTE FUNCTION test_refuse();"
        ),
        Backend::Sqlite => format!(
            "CREATE TRIGGER test_refuse BEFORE INSERT ON {table} \
               WHEN NEW.{column} = '{value}' \
               BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
        ),
    });
}

/// A value the database refuses in one request of a group (a trigger of the test's here; an id
/// too long to index was one, before ingest refused those itself) fails that request alone: the
/// group is stored again request by request, each in its savepoint, and its neighbours are
/// stored and answered 200, never 503.
async fn a_value_the_database_refuses_fails_only_its_own_request(backend: Backend) {
    let app = spawn_app_with(backend, &sources()).await;
    refuse(
        &app,
        backend,
        "herald_receipts",
        "provider_event_id",
        "msg_refused",
    );
    let gate = gate(&app, &[]);
    let first = send(&app, &gate, resend("msg_0"));
    gate.wait_entered().await;
    let rest: Vec<_> = ["msg_1", "msg_refused", "msg_2"]
        .into_iter()
        .map(|id| send(&app, &gate, resend(id)))
        .collect();
    queued(&app, 3).await;
    gate.open.send(()).unwrap();
    assert_eq!(first.await.unwrap().0, 200);
    let mut answers = Vec::new();
    for t in rest {
        answers.push(t.await.unwrap().0);
    }
    assert_eq!(answers[0], 200);
    // Not acknowledged: a 500, as any storage error that is not an outage.
    assert_eq!(answers[1], 500);
    assert_eq!(answers[2], 200);
    // The queued three came as one group (then stored request by request).
    assert_eq!(gate.seen.lock().unwrap()[1].0, 3);
    let mut ids: Vec<String> = app
        .db
        .receipts_of_source("resend")
        .unwrap()
        .into_iter()
        .map(|r| r.provider_event_id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["msg_0", "msg_1", "msg_2"]);
    // Alone in its group: the same 500, not the 503 of a failed group.
    let (status, problem) = send(&app, &gate, resend("msg_refused")).await.unwrap();
    assert_eq!(status, 500, "{problem}");
    // Both groups were merged, refused, and stored again request by request.
    assert_eq!(app.herald.receipt_writer.split_groups(), 2);
    app.stop().await;
}

both_backends!(a_value_the_database_refuses_fails_only_its_own_request);

// ---- POST /v1/messages ----

const SHOP: &str = "shop-token-0123456789";

/// A `send` token named `shop`, and endpoints subscribed to `order.*` (for a fan-out).
fn enqueue_config() -> String {
    format!(
        "[tokens.shop]\nsha256 = \"{}\"\nscope = \"send\"\n\
         [endpoints.a]\nurl = \"https://a.example/hook\"\nevent_types = [\"order.*\"]\n",
        herald::auth::digest_hex(SHOP)
    )
}

/// Enqueues `body` with `client` in its own task; the gate counts it answered when its
/// response arrives.
fn post(
    app: &TestApp,
    gate: &Gate,
    client: &reqwest::Client,
    body: Value,
) -> tokio::task::JoinHandle<(u16, Value)> {
    let r = client.post(format!("{}/v1/messages", app.base)).json(&body);
    let answered = gate.answered.clone();
    tokio::spawn(async move {
        let resp = r.send().await.expect("POST /v1/messages");
        answered.fetch_add(1, Ordering::SeqCst);
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    })
}

fn plain(id: &str) -> Value {
    crate::support::app::webhook(id, "https://x.example/h", json!({"n": id}))
}

async fn stored(app: &TestApp, id: &str) -> bool {
    app.http
        .get(format!("{}/v1/messages/{id}", app.base))
        .send()
        .await
        .unwrap()
        .status()
        == 200
}

async fn concurrent_enqueues_share_one_commit_and_are_answered_after_it(backend: Backend) {
    let app = spawn_app_with(backend, &enqueue_config()).await;
    let writer = &app.herald.message_writer;
    let gate = gate_on(writer, &[]);
    let first = post(&app, &gate, &app.http, plain("m-0"));
    gate.wait_entered().await;
    let rest: Vec<_> = (1..=5)
        .map(|i| post(&app, &gate, &app.http, plain(&format!("m-{i}"))))
        .collect();
    queued_on(writer, 5).await;
    // The first group is inside its transaction, the others wait for theirs: nobody is
    // answered, and no other client sees any of them.
    assert!(!first.is_finished() && rest.iter().all(|t| !t.is_finished()));
    assert_eq!(gate.answered.load(Ordering::SeqCst), 0);
    for i in 0..=5 {
        assert!(
            !stored(&app, &format!("m-{i}")).await,
            "m-{i} seen before its commit"
        );
    }
    gate.open.send(()).unwrap();
    let (status, view) = first.await.unwrap();
    assert_eq!((status, view["event_id"].as_str()), (201, Some("m-0")));
    let mut views = Vec::new();
    for (i, t) in rest.into_iter().enumerate() {
        let (status, view) = t.await.unwrap();
        assert_eq!(status, 201, "{view}");
        assert_eq!(view["event_id"], format!("m-{}", i + 1));
        assert_eq!(view["state"], "scheduled");
        views.push(view);
    }
    // The 201's view (the row the group insert returned) is the stored row's.
    for view in &views {
        let id = view["event_id"].as_str().unwrap();
        let again = app.message(id).await;
        for field in [
            "state",
            "fingerprint",
            "next_attempt_at",
            "attempts",
            "channel",
        ] {
            assert_eq!(view[field], again[field], "{id} {field}");
        }
        assert!(view["next_attempt_at"].is_string(), "{view}");
    }
    let seen = gate.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0], (1, 0));
    assert_eq!(seen[1].0, 5);
    assert!(seen[1].1 <= 1, "{seen:?}");
    assert_eq!(writer.commits(), 2);
    assert_eq!(writer.split_groups(), 0);
    for i in 0..=5 {
        assert!(stored(&app, &format!("m-{i}")).await);
    }
    app.stop().await;
}

both_backends!(concurrent_enqueues_share_one_commit_and_are_answered_after_it);

/// One logical outcome per event id inside a group too: the first request carrying an id
/// creates it (201), the same token again finds it (200), another token is told the id is
/// taken (409), a fan-out's id is refused naming `event_id` (422) — each answered as it would be
/// alone, its neighbours created.
async fn event_ids_in_one_group_are_answered_as_alone(backend: Backend) {
    use crate::support::app::client_with_token;
    let app = spawn_app_with(backend, &enqueue_config()).await;
    let fanout = app
        .post_message(json!({"event_id": "ord-1", "channel": "webhook",
            "destination": "type:order.placed", "payload": {"body": {"id": 1}}}))
        .await;
    assert_eq!(fanout.status(), 201);
    let writer = &app.herald.message_writer;
    let gate = gate_on(writer, &[]);
    let first = post(&app, &gate, &app.http, plain("held"));
    gate.wait_entered().await;
    let shop = client_with_token(SHOP);
    // One after another, so that the group holds them in this order.
    let mut tasks = Vec::new();
    for (client, body) in [
        (&app.http, plain("dup")),
        (&app.http, plain("dup")),
        (&shop, plain("dup")),
        (&app.http, plain("ord-1")),
        (&shop, plain("other")),
    ] {
        tasks.push(post(&app, &gate, client, body));
        queued_on(writer, tasks.len()).await;
    }
    gate.open.send(()).unwrap();
    assert_eq!(first.await.unwrap().0, 201);
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    assert_eq!(statuses, [201, 200, 409, 422, 201], "{answers:?}");
    assert_eq!(answers[1].1["event_id"], "dup");
    assert_eq!(
        answers[2].1["type"],
        "https://herald.dev/problems/event-id-taken"
    );
    assert_eq!(answers[3].1["field"], "event_id", "{}", answers[3].1);
    assert!(
        answers[3].1["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("fan-out"),
        "{}",
        answers[3].1
    );
    assert_eq!(gate.seen.lock().unwrap()[1].0, 5);
    // One `dup`, the first request's (the admin token's): `shop` cannot see it; `other` is
    // shop's.
    let get = |client: &reqwest::Client, id: &str| {
        client.get(format!("{}/v1/messages/{id}", app.base)).send()
    };
    assert_eq!(get(&app.http, "dup").await.unwrap().status(), 200);
    assert_eq!(get(&shop, "dup").await.unwrap().status(), 404);
    assert_eq!(get(&shop, "other").await.unwrap().status(), 200);
    // The fan-out is still a fan-out.
    assert_eq!(app.message("ord-1").await["endpoints"], json!(["a"]));
    app.stop().await;
}

both_backends!(event_ids_in_one_group_are_answered_as_alone);

async fn a_failed_group_of_enqueues_answers_503_and_stores_nothing(backend: Backend) {
    let app = spawn_app_with(backend, &enqueue_config()).await;
    let writer = &app.herald.message_writer;
    let gate = gate_on(writer, &[1]);
    let first = post(&app, &gate, &app.http, plain("m-0"));
    gate.wait_entered().await;
    let rest: Vec<_> = (1..=3)
        .map(|i| post(&app, &gate, &app.http, plain(&format!("m-{i}"))))
        .collect();
    queued_on(writer, 3).await;
    gate.open.send(()).unwrap();
    assert_eq!(first.await.unwrap().0, 201);
    for t in rest {
        let (status, problem) = t.await.unwrap();
        assert_eq!(status, 503, "{problem}");
    }
    assert_eq!(gate.seen.lock().unwrap()[1].0, 3);
    for i in 1..=3 {
        assert!(
            !stored(&app, &format!("m-{i}")).await,
            "m-{i} stored by a failed group"
        );
    }
    // The client's retry creates it.
    let retry = post(&app, &gate, &app.http, plain("m-1")).await.unwrap();
    assert_eq!(retry.0, 201, "{}", retry.1);
    app.stop().await;
}

both_backends!(a_failed_group_of_enqueues_answers_503_and_stores_nothing);

/// A write the database holds (here the writer held before its commit, as a server that stopped
/// answering on an open connection, or an application's lock on the event id, holds it) is
/// answered 503 with Retry-After at the deadline, not when the database lets go (a walk-through
/// saw a request hang past 30 s). The write goes on and commits: the client's retry finds it.
async fn a_write_the_database_holds_is_answered_503_at_the_deadline(backend: Backend) {
    let app = spawn_app_with(backend, &enqueue_config()).await;
    let writer = &app.herald.message_writer;
    writer.set_deadline(Duration::from_millis(300));
    let gate = gate_on(writer, &[]);
    let r = app
        .http
        .post(format!("{}/v1/messages", app.base))
        .json(&plain("held-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    // It says the write may still be stored (it said "nothing was done", and then stored it).
    let problem: Value = r.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("it may still be stored: send the same request again")),
        "{problem}"
    );
    gate.wait_entered().await;
    gate.open.send(()).unwrap();
    writer.set_deadline(herald::storage::group_commit::WRITE_DEADLINE);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !stored(&app, "held-1").await {
        assert!(Instant::now() < deadline, "the held write never committed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let retry = post(&app, &gate, &app.http, plain("held-1")).await.unwrap();
    assert_eq!(retry.0, 200, "the retry finds it: {}", retry.1);
    app.stop().await;
}

both_backends!(a_write_the_database_holds_is_answered_503_at_the_deadline);

/// PostgreSQL: an application's transaction that inserted an event id and stays open holds up a
/// `POST /v1/messages` of that id — and no other. The group writer waited for it, so every plain
/// enqueue from every client waited behind it and was answered 503 after 10 s for as long as the
/// transaction stayed open (a walk-through). The group now waits at most
/// `PG_GROUP_LOCK_TIMEOUT` for such a lock and goes on; the request that waits is written alone,
/// and answered once the application's transaction ends, as when it was alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_on_one_event_id_holds_up_only_that_enqueue() {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    let app = spawn_app_with(Backend::Postgres, &enqueue_config()).await;
    let writer = &app.herald.message_writer;
    // Long enough that nothing here is answered at the deadline.
    writer.set_deadline(Duration::from_secs(600));
    // Applications' transactions, each holding one event id, left open: more of them than a
    // quarter of Herald's pool (10 here), and than the pool itself.
    let held: Vec<String> = (0..12).map(|i| format!("held-{i}")).collect();
    let mut open: Vec<diesel::pg::PgConnection> = held
        .iter()
        .map(|id| {
            let mut c = diesel::pg::PgConnection::establish(&app.test_db.url).unwrap();
            c.batch_execute(&format!(
                "BEGIN; INSERT INTO herald_outbox (event_id, channel, destination, payload) \
                 VALUES ('{id}', 'webhook', 'https://x.example/h', '{{\"body\": {{\"n\": \"{id}\"}}}}');"
            ))
            .unwrap();
            c
        })
        .collect();
    let send = |id: &str| {
        let r = app
            .http
            .post(format!("{}/v1/messages", app.base))
            .json(&plain(id));
        tokio::spawn(async move { r.send().await.unwrap().status().as_u16() })
    };
    let first = send(&held[0]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while writer.written_alone() < 1 {
        assert!(
            Instant::now() < deadline,
            "the held request never left the group"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A retry of the same event id does not wait beside it (each would hold a pooled
    // connection): 503 at once, nothing stored.
    assert_eq!(send(&held[0]).await.unwrap(), 503);
    // The others: a quarter of the pool waits alone (two with the first), the rest is answered
    // 503 at once.
    let mut others: Vec<_> = held[1..].iter().map(|id| send(id)).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while others.iter().filter(|t| t.is_finished()).count() < others.len() - 1 {
        assert!(Instant::now() < deadline, "the refused were not answered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waiting = others.iter().position(|t| !t.is_finished()).unwrap();
    let waits = others.remove(waiting);
    for t in others {
        assert_eq!(t.await.unwrap(), 503);
    }
    assert_eq!(
        writer.written_alone(),
        2,
        "a quarter of the pool's 10 connections"
    );
    // Answered while the applications' transactions are still open (they waited for their
    // commits, and every plain enqueue with them).
    for id in ["free-1", "free-2", "free-3"] {
        let status = tokio::time::timeout(Duration::from_secs(60), send(id))
            .await
            .unwrap_or_else(|_| panic!("{id} waited for another transaction's lock"))
            .unwrap();
        assert_eq!(status, 201, "{id}");
        assert!(stored(&app, id).await);
    }
    let r = app
        .http
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the pool is not taken");
    assert!(!first.is_finished() && !waits.is_finished());
    for c in &mut open {
        c.batch_execute("COMMIT;").unwrap();
    }
    // The row the application wrote, the same request: it finds it (200); each held id's
    // retry does too; nothing was stored twice.
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(waits.await.unwrap(), 200);
    for id in &held {
        assert_eq!(send(id).await.unwrap(), 200, "{id}");
        assert_eq!(app.row(id).enqueued_by, None);
    }
    app.stop().await;
}

/// A value the database refuses in one enqueue of a group (a trigger of the test's) fails that
/// request alone: the group is written again request by request, each in its savepoint.
async fn a_value_the_database_refuses_fails_only_its_own_enqueue(backend: Backend) {
    let app = spawn_app_with(backend, &enqueue_config()).await;
    refuse(&app, backend, "herald_outbox", "event_id", "m-refused");
    let writer = &app.herald.message_writer;
    let gate = gate_on(writer, &[]);
    let first = post(&app, &gate, &app.http, plain("m-0"));
    gate.wait_entered().await;
    let rest: Vec<_> = ["m-1", "m-refused", "m-2"]
        .into_iter()
        .map(|id| post(&app, &gate, &app.http, plain(id)))
        .collect();
    queued_on(writer, 3).await;
    gate.open.send(()).unwrap();
    assert_eq!(first.await.unwrap().0, 201);
    let mut answers = Vec::new();
    for t in rest {
        answers.push(t.await.unwrap().0);
    }
    // Not acknowledged: a 500, as any storage error that is not an outage.
    assert_eq!(answers, [201, 500, 201]);
    // PostgreSQL merged the group and wrote it again request by request; SQLite writes every
    // group request by request.
    let merged = usize::from(backend == Backend::Postgres);
    assert_eq!(writer.split_groups(), merged);
    assert_eq!(gate.seen.lock().unwrap()[1].0, 3);
    assert!(stored(&app, "m-1").await && stored(&app, "m-2").await);
    assert!(!stored(&app, "m-refused").await);
    // Alone in its group: the same 500, not the 503 of a failed group (retried for ever).
    let (status, problem) = post(&app, &gate, &app.http, plain("m-refused"))
        .await
        .unwrap();
    assert_eq!(status, 500, "{problem}");
    assert!(!stored(&app, "m-refused").await);
    assert_eq!(writer.split_groups(), 2 * merged);
    app.stop().await;
}

both_backends!(a_value_the_database_refuses_fails_only_its_own_enqueue);

/// On PostgreSQL a message with an ordering key is written in a transaction of its own, not by
/// the group writer: it is answered while the writer's commit is held. (On SQLite it joins the
/// group: `keyed_enqueues_join_the_group_on_sqlite`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_enqueue_does_not_wait_for_the_group_writer() {
    let app = spawn_app_with(Backend::Postgres, &enqueue_config()).await;
    let writer = &app.herald.message_writer;
    let gate = gate_on(writer, &[]);
    let first = post(&app, &gate, &app.http, plain("m-0"));
    gate.wait_entered().await;
    let mut keyed = plain("k-1");
    keyed["ordering_key"] = json!("order-1");
    let (status, view) =
        tokio::time::timeout(Duration::from_secs(10), post(&app, &gate, &app.http, keyed))
            .await
            .expect("the keyed enqueue is answered while the group writer is held")
            .unwrap();
    assert_eq!(status, 201, "{view}");
    assert_eq!(view["ordering_key"], "order-1");
    assert!(!first.is_finished());
    assert_eq!(writer.queued(), 0);
    gate.open.send(()).unwrap();
    assert_eq!(first.await.unwrap().0, 201);
    app.stop().await;
}

/// On SQLite a keyed enqueue joins the group: one writer at a time orders every key's inserts by
/// itself. Three keyed requests sent while a group's commit is held queue for the writer, are
/// committed together in the next group, are answered 201 only after it, and each key's messages
/// take consecutive places in event-id order (not the order they queued in), the second of a
/// key waiting behind the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_enqueues_join_the_group_on_sqlite() {
    let app = spawn_app_with(Backend::Sqlite, &enqueue_config()).await;
    let writer = &app.herald.message_writer;
    let gate = gate_on(writer, &[]);
    let first = post(&app, &gate, &app.http, plain("m-0"));
    gate.wait_entered().await;
    let keyed = |id: &str, key: &str| {
        let mut body = plain(id);
        body["ordering_key"] = json!(key);
        post(&app, &gate, &app.http, body)
    };
    // The key's later event id queues first.
    let mut keyed_posts = vec![keyed("k-a2", "a")];
    queued_on(writer, 1).await;
    keyed_posts.push(keyed("k-a1", "a"));
    keyed_posts.push(keyed("k-b1", "b"));
    queued_on(writer, 3).await;
    assert!(!first.is_finished() && keyed_posts.iter().all(|t| !t.is_finished()));
    gate.open.send(()).unwrap();
    assert_eq!(first.await.unwrap().0, 201);
    for t in keyed_posts {
        let (status, view) = t.await.unwrap();
        assert_eq!(status, 201, "{view}");
    }
    let seen = gate.seen.lock().unwrap().clone();
    assert_eq!(
        seen.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        [1, 3],
        "the keyed requests' group"
    );
    assert!(seen[1].1 <= 1, "a keyed request answered before its commit");
    let place = |id: &str| app.row(id).ordering_seq;
    assert_eq!(
        (place("k-a1"), place("k-a2"), place("k-b1")),
        (Some(1), Some(2), Some(1))
    );
    assert!(app.row("k-a1").next_attempt_at.is_some());
    assert!(app.row("k-a2").next_attempt_at.is_none(), "waits for k-a1");
    app.stop().await;
}

/// The group insert stores a message exactly as the single insert does (`Db::enqueue`, the
/// path of keyed messages and the library's): for the same prepared message, every column is
/// the same but the id, and the event id and what follows it (the fingerprint, an email's
/// Message-ID key: each checked against the prepared row's) — with and without `scheduled_at`
/// (not given: the database's clock at the insert), with every optional column set, for a
/// webhook and an email, the three in one group, which the database took whole (no group was
/// split: on PostgreSQL the prepared insert wrote them, not the single insert).
async fn the_group_insert_stores_what_a_single_insert_stores(backend: Backend) {
    use herald::domain::Semantics;
    use herald::outbox::{Limits, NewMessage};
    use herald::storage::models::{NewOutboxRow, OutboxRow};
    let app = spawn_app_with(backend, &enqueue_config()).await;
    // On SQLite a message without `scheduled_at` is scheduled at its prepared `now`.
    let before = Utc::now();
    let now = Utc::now();
    let mut every = NewMessage::webhook("x", "https://x.example/h", json!({"a": [1, 2]}));
    every.scheduled_at = Some(now + chrono::Duration::hours(1));
    every.expires_at = Some(now + chrono::Duration::hours(2));
    every.max_attempts = Some(3);
    every.semantics = Semantics::AtMostOnce;
    let messages = [
        NewMessage::webhook("x", "https://x.example/h", json!({"n": 1})),
        every,
        NewMessage::email("x", "a@example.com", "Hello", "Text"),
    ];
    let policies =
        herald::domain::policies::Policies::global_only(herald::domain::policies::PolicyId {
            name: "policy-a".into(),
            version: "v-test".into(),
            max_attempts: 15,
        });
    let limits = Limits {
        policies: Some(&policies),
        ..Limits::default()
    };
    let prepare = |i: usize, side: &str| -> NewOutboxRow {
        let mut m = messages[i].clone();
        m.event_id = format!("{side}-{i}");
        let mut row = m.prepare(&limits, now).unwrap();
        row.enqueued_by = Some("token-b".into());
        row
    };
    let mut singles: Vec<(NewOutboxRow, OutboxRow)> = Vec::new();
    for i in 0..messages.len() {
        let row = prepare(i, "single");
        let (created, stored) = app.db.enqueue(&row).unwrap().unwrap();
        assert!(created);
        singles.push((row, stored));
    }
    // The group side: one held group, then the three queued behind it, committed together.
    let writer = app.herald.message_writer.clone();
    let gate = gate_on(&writer, &[]);
    let held = post(&app, &gate, &app.http, plain("held"));
    gate.wait_entered().await;
    let mut tasks = Vec::new();
    for i in 0..messages.len() {
        let (w, row) = (writer.clone(), prepare(i, "group"));
        tasks.push(tokio::spawn(async move { w.enqueue(w.begin(), row).await }));
        queued_on(&writer, i + 1).await;
    }
    gate.open.send(()).unwrap();
    assert_eq!(held.await.unwrap().0, 201);
    let mut groups: Vec<(NewOutboxRow, OutboxRow)> = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let (created, stored) = t.await.unwrap().unwrap().unwrap();
        assert!(created);
        groups.push((prepare(i, "group"), stored));
    }
    let after = Utc::now();
    assert_eq!(gate.seen.lock().unwrap()[1].0, 3);
    assert_eq!(writer.split_groups(), 0);
    for (i, ((sp, mut single), (gp, mut group))) in singles.into_iter().zip(groups).enumerate() {
        for (prepared, row) in [(&sp, &mut single), (&gp, &mut group)] {
            assert_eq!(row.event_id, prepared.event_id);
            assert_eq!(row.request_fingerprint, prepared.request_fingerprint);
            assert_eq!(row.message_key, prepared.message_key);
            assert_eq!(row.retry_policy, "policy-a");
            assert_eq!(row.enqueued_by.as_deref(), Some("token-b"));
            if messages[i].scheduled_at.is_none() {
                // The database's clock at the insert (this process's on SQLite), copied to
                // next_attempt_at.
                let slack = chrono::Duration::milliseconds(1);
                assert!(
                    row.scheduled_at >= before - slack && row.scheduled_at <= after + slack,
                    "{row:?}"
                );
                assert_eq!(row.next_attempt_at, Some(row.scheduled_at), "{row:?}");
                row.scheduled_at = now;
                row.next_attempt_at = None;
            }
            row.id = 0;
            row.event_id = String::new();
            row.request_fingerprint = None;
            row.message_key = None;
        }
        assert_eq!(single, group, "message {i}");
    }
    app.stop().await;
}

both_backends!(the_group_insert_stores_what_a_single_insert_stores);

/// A created message due at once wakes the sender; one scheduled later does not (the poll
/// takes it: a wake-up for it was a claim that found nothing, one per request in a burst), nor
/// does a keyed one waiting behind its key's head (its head's outcome releases it).
async fn an_enqueue_wakes_the_sender_only_for_a_message_due_now(backend: Backend) {
    let app = spawn_app_with(backend, &enqueue_config()).await;
    // The sender does not run here, nor a LISTEN thread (in production each group's NOTIFY
    // still wakes it): a wake-up stays stored in the Notify as a permit.
    let woken = || async {
        tokio::time::timeout(Duration::ZERO, app.herald.wake.notified())
            .await
            .is_ok()
    };
    assert!(!woken().await);
    let mut later = plain("later");
    later["scheduled_at"] = json!((Utc::now() + chrono::Duration::hours(1)).to_rfc3339());
    assert_eq!(app.post_message(later).await.status(), 201);
    assert!(!woken().await, "woken for a message due in an hour");
    assert_eq!(app.post_message(plain("now")).await.status(), 201);
    assert!(woken().await, "not woken for a message due now");
    // A keyed message due now, but waiting behind its key's head: its release wakes the sender.
    let keyed = |id: &str| {
        let mut body = plain(id);
        body["ordering_key"] = json!("order-1");
        body
    };
    assert_eq!(app.post_message(keyed("head")).await.status(), 201);
    assert!(woken().await, "not woken for a keyed head due now");
    assert_eq!(app.post_message(keyed("behind")).await.status(), 201);
    assert!(app.row("behind").next_attempt_at.is_none());
    assert!(
        !woken().await,
        "woken for a message waiting behind its key's head"
    );
    app.stop().await;
}

both_backends!(an_enqueue_wakes_the_sender_only_for_a_message_due_now);

/// Every pooled connection broke while idle (its backend terminated; the database itself up, as
/// after a restart): the next group is stored at once, on a new connection. On PostgreSQL a
/// group without replay keys is one insert committed by itself, with no `BEGIN` to fail first:
/// it is run again on the next connection when it failed at once on a broken one
/// (`storage::pg_autocommit`), as a transaction whose `BEGIN` failed is. Without that the store
/// fails (503 at the edge), although the database is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_after_its_pooled_connections_broke_is_stored_at_once() {
    use herald::storage::group_commit::ReceiptWriter;
    use herald::storage::models::NewReceipt;
    use herald::storage::receipts::Stored;
    let (test_db, db) = one_connection_pool();
    let writer = ReceiptWriter::spawn(db).unwrap();
    let receipt = |id: &str| NewReceipt {
        provider_event_id: id.into(),
        event_type: "delivered".into(),
        provider_type: "email.delivered".into(),
        event_time: None,
        herald_event_id: None,
        provider_message_id: None,
        raw: json!({ "id": id }),
        replay_key: None,
    };
    let stored = Stored::Receipts {
        new: 1,
        duplicates: 0,
    };
    let before = writer
        .store(writer.begin(), "src", vec![receipt("before")], Utc::now())
        .await;
    assert_eq!(before.unwrap(), stored);
    // Their backends gone before the next group asks anything of them.
    assert!(test_db.end_connections().await > 0);
    let after = writer
        .store(writer.begin(), "src", vec![receipt("after")], Utc::now())
        .await;
    assert_eq!(after.unwrap(), stored);
    assert_eq!(writer.commits(), 2);
}

/// The same for a transaction (`storage::pg_transaction`: `POST /v1/messages`' group, and every
/// other write on PostgreSQL): its `BEGIN` fails at once on the dead connection, before anything
/// of it was sent, and the transaction runs on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_after_its_pooled_connection_broke_commits_at_once() {
    use herald::outbox::{Limits, NewMessage};
    use herald::storage::group_commit::MessageWriter;
    let (test_db, db) = one_connection_pool();
    let writer = MessageWriter::spawn(db).unwrap();
    let row = |id: &str| {
        NewMessage::webhook(id, "https://x.example/h", json!({}))
            .prepare(&Limits::default(), Utc::now())
            .unwrap()
    };
    let before = writer.enqueue(writer.begin(), row("before")).await;
    assert!(matches!(before, Ok(Ok((true, _)))), "{:?}", before.err());
    assert!(test_db.end_connections().await > 0);
    let after = writer.enqueue(writer.begin(), row("after")).await;
    assert!(matches!(after, Ok(Ok((true, _)))), "{:?}", after.err());
}

/// A PostgreSQL test database and a pool of one connection on it: none is opened behind the
/// test's back.
fn one_connection_pool() -> (crate::support::db::TestDb, herald::storage::Db) {
    use herald::storage::{Db, PoolOptions};
    let test_db = crate::support::db::TestDb::new(Backend::Postgres);
    let one = PoolOptions {
        max_size: 1,
        ..PoolOptions::default()
    };
    let db = Db::connect(&test_db.url, &one).unwrap();
    (test_db, db)
}

/// A read on a pooled connection that broke while idle fails (503 at the edge), and that
/// connection leaves the pool with it, so the next read works. diesel marks a connection broken
/// when a statement fails on it, but not when only the statement's preparation failed (its
/// first use on that connection); the failed read then asks the connection a simple query,
/// which does. Before, the dead connection went back to the pool and every read that took it
/// failed, until some transaction's `BEGIN` happened to find it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_on_a_broken_pooled_connection_fails_once_and_takes_it_along() {
    let (test_db, db) = one_connection_pool();
    // A pooled connection, on which the read below was never prepared.
    assert_eq!(db.receipts_of_message(1).unwrap().len(), 0);
    let dead = test_db.end_connections().await;
    // Each dead connection fails one read at most, then reads work.
    let reads: Vec<_> = (0..=dead).map(|_| db.receipts_of_source("src")).collect();
    let failed = reads.iter().filter(|r| r.is_err()).count();
    assert!(failed >= 1 && failed <= dead, "{dead} dead: {reads:?}");
    assert!(
        reads.iter().all(|r| match r {
            Ok(rows) => rows.is_empty(),
            Err(e) => matches!(e, StorageError::Unavailable(_)),
        }),
        "{reads:?}"
    );
    assert!(reads[dead].is_ok(), "{reads:?}");
}
