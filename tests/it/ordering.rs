//! Ordered delivery per key (README, "Ordered delivery"): one message of a key in flight, in the
//! key's order, on both backends and across Herald processes; a dead head blocks only its own
//! key until it is replayed, canceled or skipped; `skip` lets the rest through; concurrent
//! application transactions deliver in commit order; `[endpoints.NAME.retry]` decides its
//! endpoint's attempts.

use std::collections::BTreeMap;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::sqlite::SqliteConnection;
use diesel::{Connection, RunQueryDsl};
use rand::Rng;
use serde_json::{Value, json};

use crate::both_backends;
use crate::support::app::{spawn_app_with, spawn_on};
use crate::support::receiver::Recorded;
use crate::support::{Backend, Receiver, Reply, TestApp, TestDb};

/// A keyed webhook for `POST /v1/messages`.
fn keyed(event_id: &str, url: &str, key: &str, extra: Value) -> Value {
    let mut m = json!({
        "event_id": event_id,
        "channel": "webhook",
        "destination": url,
        "payload": {"body": {"id": event_id}},
        "ordering_key": key,
    });
    if let (Value::Object(m), Value::Object(extra)) = (&mut m, extra) {
        m.extend(extra);
    }
    m
}

async fn post(app: &TestApp, body: Value) {
    let r = app.post_message(body.clone()).await;
    assert_eq!(r.status(), 201, "{body}: {}", r.text().await.unwrap());
}

/// `POST /v1/messages/{id}/replay`, answered 200.
async fn replay(app: &TestApp, id: &str) {
    let r = replay_with(app, id, json!({"reason": "receiver fixed"})).await;
    assert_eq!(r.status(), 200, "{id}: {}", r.text().await.unwrap());
}

/// `POST /v1/messages/{id}/replay` with `body`, as answered.
async fn replay_with(app: &TestApp, id: &str, body: Value) -> reqwest::Response {
    app.http
        .post(format!("{}/v1/messages/{id}/replay", app.base))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// `{p}.1` (skip policy) dead-lettered by a 400 and `{p}.2` retrying after a 503, both of key
/// `k` to `url` (whose path the receiver answers so).
async fn dead_head_and_retrying_next(app: &TestApp, url: &str, p: &str) {
    let (head, next) = (format!("{p}.1"), format!("{p}.2"));
    post(
        app,
        keyed(&head, url, "k", json!({"ordering_policy": "skip"})),
    )
    .await;
    post(app, keyed(&next, url, "k", json!({}))).await;
    app.run_until_idle().await;
    assert_eq!(app.row(&head).state.as_str(), "dead_letter");
    assert_eq!(app.row(&next).state.as_str(), "retryable");
}

/// The event id of a request (`webhook-id`).
fn id_of(r: &Recorded) -> String {
    r.header("webhook-id").unwrap_or_default().to_owned()
}

/// Per key (the part of the event id before `.`), the requests in arrival order.
fn by_key(requests: &[Recorded]) -> BTreeMap<String, Vec<Recorded>> {
    let mut keys: BTreeMap<String, Vec<Recorded>> = BTreeMap::new();
    for r in requests {
        let id = id_of(r);
        if let Some((key, _)) = id.split_once('.') {
            keys.entry(key.to_owned()).or_default().push(r.clone());
        }
    }
    keys
}

/// The place of an event id `KEY.N`.
fn place(r: &Recorded) -> u32 {
    id_of(r)
        .split_once('.')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap()
}

/// Per key: the places are strictly increasing once a repeat of the same message right after
/// itself (an at-least-once resend after a lost lease) is folded, every place is there, and no
/// request of the key arrived before the previous one was answered.
fn assert_ordered(requests: &[Recorded], keys: usize, per_key: u32) {
    let keys_seen = by_key(requests);
    assert_eq!(keys_seen.len(), keys, "every key was sent");
    for (key, reqs) in &keys_seen {
        let mut places: Vec<u32> = reqs.iter().map(place).collect();
        places.dedup();
        assert_eq!(
            places,
            (1..=per_key).collect::<Vec<_>>(),
            "key {key}: places in order, each once"
        );
        for pair in reqs.windows(2) {
            let answered = pair[0]
                .answered_at
                .unwrap_or_else(|| panic!("key {key}: {} never answered", id_of(&pair[0])));
            assert!(
                pair[1].at >= answered,
                "key {key}: {} arrived while {} was in flight",
                id_of(&pair[1]),
                id_of(&pair[0])
            );
        }
    }
}

/// Random short answer delays (0–15 ms), `n` of them.
fn random_delays(rx: &Receiver, n: usize) {
    let mut rng = rand::rng();
    rx.script((0..n).map(|_| Reply::Delayed(rng.random_range(0..15), 200)));
}

async fn keyed_messages_go_one_at_a_time_in_order(backend: Backend) {
    let app = spawn_app_with(backend, "sender_concurrency = 16\nsender_batch_size = 16\n").await;
    // On PostgreSQL a second Herald on the same database claims at the same time.
    let second = match backend {
        Backend::Postgres => Some(
            spawn_on(
                TestDb::attach(&app.test_db.url, backend),
                "sender_concurrency = 16\nsender_batch_size = 16\n",
            )
            .await,
        ),
        Backend::Sqlite => None,
    };
    let rx = Receiver::start().await;
    const KEYS: usize = 6;
    const PER_KEY: u32 = 8;
    random_delays(&rx, KEYS * PER_KEY as usize + 8);
    // Round-robin over the keys, with unkeyed messages in between.
    for n in 1..=PER_KEY {
        for k in 0..KEYS {
            post(
                &app,
                keyed(
                    &format!("k{k}.{n}"),
                    &rx.url,
                    &format!("order-{k}"),
                    json!({}),
                ),
            )
            .await;
        }
        post(
            &app,
            crate::support::app::webhook(&format!("free-{n}"), &rx.url, json!({})),
        )
        .await;
    }
    let total = KEYS * PER_KEY as usize + PER_KEY as usize;
    let a = app.herald.sender.clone();
    let b = second.as_ref().map(|s| s.herald.sender.clone());
    let (na, nb) = tokio::join!(
        async move { a.run_until_idle().await.unwrap() },
        async move {
            match b {
                Some(b) => b.run_until_idle().await.unwrap(),
                None => 0,
            }
        },
    );
    // A sender that found nothing due while the other held a key's head stops early: drain.
    let rest = app.run_until_idle().await;
    assert_eq!(na + nb + rest, total, "every message sent once");
    let requests = rx.wait_for(total, 30).await;
    assert_ordered(&requests, KEYS, PER_KEY);
    if let Some(s) = second {
        s.stop().await;
    }
    app.stop().await;
}

async fn a_dead_head_blocks_only_its_key_until_replayed(backend: Backend) {
    let app = crate::support::spawn_app(backend).await;
    let rx = Receiver::start().await;
    let (a, b) = (rx.url_for("/a"), rx.url_for("/b"));
    rx.script_path("/a", [Reply::Status(400)]);
    for n in 1..=3 {
        post(&app, keyed(&format!("a.{n}"), &a, "order-1", json!({}))).await;
    }
    for n in 1..=2 {
        post(&app, keyed(&format!("b.{n}"), &b, "order-2", json!({}))).await;
    }
    app.run_until_idle().await;
    let ids = |path: &str| rx.requests_to(path).iter().map(id_of).collect::<Vec<_>>();
    assert_eq!(ids("/a"), ["a.1"], "the key stops at its dead head");
    assert_eq!(ids("/b"), ["b.1", "b.2"], "another key is not held");
    assert_eq!(app.row("a.1").state.as_str(), "dead_letter");
    let v = app.message("a.2").await;
    assert_eq!(v["state"], "scheduled", "{v}");
    assert_eq!(v["blocked_by"], "a.1", "{v}");
    assert_eq!(v["ordering_key"], "order-1", "{v}");
    assert_eq!(v["ordering_seq"], 2, "{v}");
    assert!(
        v["next_attempt_at"].is_null(),
        "a waiting message is not due: {v}"
    );
    let e: Value = app
        .http
        .get(format!("{}/v1/messages/a.3/explain", app.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(e["ordering"]["blocked_by"], "a.1", "{e}");
    let text = e["explanation"].as_str().unwrap();
    assert!(text.contains("blocked by a.1"), "{text}");
    // A replay of the blocked one is refused naming its head (not "it will be sent anyway").
    let r = replay_with(&app, "a.3", json!({"reason": "retry"})).await;
    assert_eq!(r.status(), 409);
    let p: Value = r.json().await.unwrap();
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains("waits behind a.1") && detail.contains("skip a.1"),
        "{p}"
    );
    let head: Value = app
        .http
        .get(format!("{}/v1/messages/a.1/explain", app.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        head["explanation"]
            .as_str()
            .unwrap()
            .contains("holds ordering key order-1"),
        "{head}"
    );
    assert_eq!(blocked_keys_gauge(&app).await, 1.0);
    // Time passing releases nothing: the key stays blocked (watchdog pass included).
    app.advance(Duration::from_secs(6 * 3600));
    app.herald.sender.release_waiting().await.unwrap();
    app.herald.sender.sweep_leases().await.unwrap();
    assert_eq!(app.run_until_idle().await, 0);
    // A replay releases it: the head goes again, then the rest, in order.
    replay(&app, "a.1").await;
    app.run_until_idle().await;
    assert_eq!(ids("/a"), ["a.1", "a.1", "a.2", "a.3"]);
    for id in ["a.1", "a.2", "a.3"] {
        assert_eq!(app.row(id).state.as_str(), "delivered", "{id}");
    }
    assert_eq!(blocked_keys_gauge(&app).await, 0.0);
    app.stop().await;
}

/// A delivered head replayed while the next message of its key waits for a retry, and dead
/// this time: the next one is due (its retry time passed) but held behind it. The sender is
/// not behind: `herald_oldest_due_message_age_seconds` counts only what the claim could take
/// (it climbed for as long as the key stayed blocked; the blocked key is counted apart).
async fn a_due_message_held_by_its_key_is_not_the_senders_backlog(backend: Backend) {
    let app = crate::support::spawn_app(backend).await;
    let rx = Receiver::start().await;
    let u = rx.url_for("/u");
    rx.script_path(
        "/u",
        [Reply::Status(200), Reply::Status(503), Reply::Status(400)],
    );
    post(&app, keyed("u.1", &u, "k", json!({}))).await;
    post(&app, keyed("u.2", &u, "k", json!({"max_attempts": 30}))).await;
    app.run_until_idle().await;
    assert_eq!(app.row("u.1").state.as_str(), "delivered");
    assert_eq!(app.row("u.2").state.as_str(), "retryable");
    let r = replay_with(&app, "u.1", json!({"reason": "resend", "force": true})).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // Due by its own time (it was retrying) but held behind the replayed head: its view says
    // so (it said nothing, its due time passed, as if overdue; a walk-through).
    app.advance(Duration::from_secs(60));
    let v = app.message("u.2").await;
    assert_eq!(
        (&v["state"], &v["blocked_by"]),
        (&json!("retryable"), &json!("u.1")),
        "{v}"
    );
    let e = app.explain("u.2").await;
    assert_eq!(e["ordering"]["blocked_by"], "u.1", "{e}");
    let text = e["explanation"].as_str().unwrap();
    assert!(
        text.contains("behind u.1, the key's head, replayed and now scheduled"),
        "{text}"
    );
    // Replaying it is refused as pending (it goes after u.1), not as blocked by a dead head
    // with advice to replay, cancel or skip u.1 (a review).
    let r = replay_with(&app, "u.2", json!({"reason": "again"})).await;
    assert_eq!(r.status(), 409);
    let p = r.text().await.unwrap();
    assert!(
        p.contains("it will be sent anyway") && !p.contains("dead or unconfirmed"),
        "{p}"
    );
    assert_eq!(
        app.run_until_idle().await,
        1,
        "the replayed head, in its place"
    );
    assert_eq!(app.row("u.1").state.as_str(), "dead_letter");
    app.advance(Duration::from_secs(3600));
    assert_eq!(
        app.run_until_idle().await,
        0,
        "u.2 waits behind its dead head"
    );
    assert_eq!(app.message("u.2").await["blocked_by"], "u.1");
    assert_eq!(blocked_keys_gauge(&app).await, 1.0);
    assert_eq!(
        gauge(&app, "herald_oldest_due_message_age_seconds").await,
        0.0
    );
    // A later place released with its own due time (scheduled for later) keeps it when its
    // head is replayed: it is named as waiting behind the head too (a review).
    let v = rx.url_for("/v");
    rx.script_path("/v", [Reply::Status(200), Reply::Status(200)]);
    let later = (app.clock_now() + chrono::Duration::hours(2)).to_rfc3339();
    post(&app, keyed("v.1", &v, "kv", json!({}))).await;
    post(&app, keyed("v.2", &v, "kv", json!({"scheduled_at": later}))).await;
    assert_eq!(app.run_until_idle().await, 1);
    let r = replay_with(&app, "v.1", json!({"reason": "resend", "force": true})).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let v2 = app.message("v.2").await;
    assert!(v2["next_attempt_at"].is_string(), "{v2}");
    assert_eq!(
        (&v2["state"], &v2["blocked_by"]),
        (&json!("scheduled"), &json!("v.1")),
        "{v2}"
    );
    app.stop().await;
}

async fn blocked_keys_gauge(app: &TestApp) -> f64 {
    gauge(app, "herald_ordering_blocked_keys").await
}

async fn gauge(app: &TestApp, name: &str) -> f64 {
    let text = app
        .http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let samples = crate::support::prom::parse(&text);
    crate::support::prom::value(&samples, name, &[])
}

async fn skip_lets_the_rest_of_the_key_through(backend: Backend) {
    let rx = Receiver::start().await;
    let lenient = rx.url_for("/lenient");
    let app = spawn_app_with(
        backend,
        &format!("[endpoints.lenient]\nurl = \"{lenient}\"\nordering_policy = \"skip\"\n"),
    )
    .await;
    let (m, strict) = (rx.url_for("/m"), rx.url_for("/strict"));
    rx.script_path("/m", [Reply::Status(400)]);
    rx.script_path(
        "/lenient",
        [Reply::Status(400), Reply::Status(400), Reply::Status(400)],
    );
    rx.script_path("/strict", [Reply::Status(400)]);
    // The message's own policy.
    post(
        &app,
        keyed("m.1", &m, "k", json!({"ordering_policy": "skip"})),
    )
    .await;
    post(&app, keyed("m.2", &m, "k", json!({}))).await;
    post(&app, keyed("m.3", &m, "k", json!({}))).await;
    // The endpoint's policy, and a message that overrides it with block.
    post(&app, keyed("e.1", "endpoint:lenient", "k", json!({}))).await;
    post(&app, keyed("e.2", "endpoint:lenient", "k", json!({}))).await;
    post(
        &app,
        keyed(
            "e.3",
            "endpoint:lenient",
            "k",
            json!({"ordering_policy": "block"}),
        ),
    )
    .await;
    post(&app, keyed("e.4", "endpoint:lenient", "k", json!({}))).await;
    // No policy anywhere: block.
    post(&app, keyed("s.1", &strict, "k", json!({}))).await;
    post(&app, keyed("s.2", &strict, "k", json!({}))).await;
    // Which applies, shown where a message sets none (it showed nothing; a walk-through).
    for (id, own, applied) in [
        ("m.1", json!("skip"), "skip"),
        ("m.2", Value::Null, "block"),
        ("e.1", Value::Null, "skip"),
        ("e.3", json!("block"), "block"),
        ("s.1", Value::Null, "block"),
    ] {
        let v = app.message(id).await;
        assert_eq!(
            (&v["ordering_policy"], &v["ordering_policy_applied"]),
            (&own, &json!(applied)),
            "{id}: {v}"
        );
        let e = app.explain(id).await;
        assert_eq!(e["ordering"]["policy_applied"], applied, "{id}: {e}");
    }
    app.run_until_idle().await;
    let ids = |path: &str| rx.requests_to(path).iter().map(id_of).collect::<Vec<_>>();
    assert_eq!(ids("/m"), ["m.1", "m.2", "m.3"]);
    assert_eq!(
        ids("/lenient"),
        ["e.1", "e.2", "e.3"],
        "e.3 blocks (its own policy)"
    );
    assert_eq!(ids("/strict"), ["s.1"]);
    assert!(app.row("m.1").ordering_released_at.is_some());
    assert_eq!(app.message("e.4").await["blocked_by"], "e.3");
    assert_eq!(app.message("s.2").await["blocked_by"], "s.1");
    assert!(app.message("m.3").await.get("blocked_by").is_none());
    app.stop().await;
}

async fn an_explicit_skip_or_a_cancel_releases_a_blocked_key(backend: Backend) {
    let app = crate::support::spawn_app(backend).await;
    let rx = Receiver::start().await;
    let x = rx.url_for("/x");
    rx.script_path("/x", [Reply::Status(400), Reply::Status(400)]);
    for n in 1..=4 {
        post(&app, keyed(&format!("x.{n}"), &x, "x", json!({}))).await;
    }
    post(
        &app,
        crate::support::app::webhook("plain", &rx.url_for("/plain"), json!({})),
    )
    .await;
    app.run_until_idle().await;
    assert_eq!(app.message("x.2").await["blocked_by"], "x.1");
    let skip = |id: &str| {
        let (http, base, id) = (app.http.clone(), app.base.clone(), id.to_owned());
        async move {
            http.post(format!("{base}/v1/messages/{id}/skip"))
                .json(&json!({"reason": "order superseded"}))
                .send()
                .await
                .unwrap()
        }
    };
    let r = skip("x.1").await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // Audited as a replay is: who and why, in the explanation (it was only logged).
    let e = app.explain("x.1").await;
    assert_eq!(e["ordering"]["skipped_by"], "default", "{e}");
    assert_eq!(e["ordering"]["skip_reason"], "order superseded", "{e}");
    let words = e["explanation"].as_str().unwrap();
    assert!(
        words.contains("(skipped by default: \u{201c}order superseded\u{201d})"),
        "{words}"
    );
    // Nothing to skip any more, and an unkeyed message never holds a key: 409.
    assert_eq!(skip("x.1").await.status(), 409);
    assert_eq!(skip("plain").await.status(), 409);
    let r = app
        .http
        .post(format!("{}/v1/messages/x.1/skip", app.base))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422, "a skip needs a reason");
    app.run_until_idle().await;
    // x.2 was the next head and died too; canceling it releases x.3.
    assert_eq!(app.row("x.2").state.as_str(), "dead_letter");
    // Its explanation names the place before it, what it waited behind, as it is now.
    let e = app.explain("x.2").await;
    let before = &e["ordering"]["before"];
    assert_eq!(
        (&before["event_id"], &before["state"], &before["skipped_by"]),
        (&json!("x.1"), &json!("dead_letter"), &json!("default")),
        "{e}"
    );
    assert!(before["released_at"].is_string(), "{e}");
    assert_eq!(before["ended_at"], before["released_at"], "{e}");
    let skipped_at = before["released_at"].clone();
    assert_eq!(
        app.explain("x.1").await["ordering"]["skipped_at"],
        skipped_at
    );
    assert_eq!(app.explain("x.1").await["ordering"]["before"], Value::Null);
    assert_eq!(app.message("x.3").await["blocked_by"], "x.2");
    // A canceled message waits for nothing: no longer blocked by anyone.
    let r = app
        .http
        .post(format!("{}/v1/messages/x.4/cancel", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v = app.message("x.4").await;
    assert_eq!(v["state"], "canceled");
    assert!(v["blocked_by"].is_null(), "{v}");
    let r = app
        .http
        .post(format!("{}/v1/messages/x.2/cancel", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(app.row("x.2").state.as_str(), "canceled");
    app.run_until_idle().await;
    let ids: Vec<_> = rx.requests().iter().map(id_of).collect();
    let sent_keyed: Vec<_> = ids.iter().filter(|i| i.starts_with("x.")).collect();
    assert_eq!(sent_keyed, ["x.1", "x.2", "x.3"]);
    assert_eq!(app.row("x.3").state.as_str(), "delivered");
    // A skipped head can still be replayed: it goes again (its key has nothing open).
    app.advance(std::time::Duration::from_secs(60));
    replay(&app, "x.1").await;
    app.run_until_idle().await;
    assert_eq!(app.row("x.1").state.as_str(), "delivered");
    // The replay put it back in its place, and the skip is still told (it vanished from the
    // explanation, found by a walk-through); the place after it still stopped waiting at the
    // skip, not at the replay's delivery a minute later.
    let e = app.explain("x.1").await;
    let o = &e["ordering"];
    assert_eq!(o["released_at"], Value::Null, "{e}");
    assert_eq!(
        (&o["skipped_by"], &o["skip_reason"], &o["skipped_at"]),
        (&json!("default"), &json!("order superseded"), &skipped_at),
        "{e}"
    );
    let words = e["explanation"].as_str().unwrap();
    assert!(
        words.contains(&format!(
            "It was released from ordering key x at {} (skipped by default: \u{201c}order \
             superseded\u{201d}), so the key's later messages went on, and replayed since.",
            skipped_at.as_str().unwrap()
        )),
        "{words}"
    );
    let before = &app.explain("x.2").await["ordering"]["before"];
    assert_eq!(
        (&before["state"], &before["skipped_by"]),
        (&json!("delivered"), &json!("default")),
        "{before}"
    );
    assert_eq!(before["released_at"], skipped_at, "{before}");
    assert_eq!(before["ended_at"], skipped_at, "{before}");

    // A message that came after such a replay waited behind the replayed one again, until it
    // was delivered: that is what it is told, not the skip from before it was due (found by a
    // review).
    let y = rx.url_for("/y");
    rx.script_path("/y", [Reply::Status(400)]);
    post(&app, keyed("y.1", &y, "y", json!({}))).await;
    app.run_until_idle().await;
    assert_eq!(skip("y.1").await.status(), 200);
    app.advance(std::time::Duration::from_secs(10));
    replay(&app, "y.1").await;
    post(&app, keyed("y.2", &y, "y", json!({}))).await;
    app.advance(std::time::Duration::from_secs(10));
    app.run_until_idle().await;
    assert_eq!(app.row("y.2").state.as_str(), "delivered");
    let e = app.explain("y.2").await;
    let before = &e["ordering"]["before"];
    assert_eq!(
        (
            &before["state"],
            &before["released_at"],
            &before["skipped_by"]
        ),
        (&json!("delivered"), &Value::Null, &Value::Null),
        "{e}"
    );
    let delivered = app.row("y.1").updated_at;
    assert_eq!(
        before["ended_at"],
        delivered.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "{e}"
    );
    let words = e["explanation"].as_str().unwrap();
    assert!(
        words.contains(
            "it waited its turn in ordering key y behind y.1, the place before it (now delivered)."
        ),
        "{words}"
    );

    // A place delivered before the next message was due, then replayed with force and
    // delivered again: it had ended for that message at its first delivery, which the replay
    // keeps (its updated_at is the second now).
    let z = rx.url_for("/z");
    post(&app, keyed("z.1", &z, "z", json!({}))).await;
    app.run_until_idle().await;
    let first_delivery = app.row("z.1").updated_at;
    app.advance(std::time::Duration::from_secs(5));
    post(&app, keyed("z.2", &z, "z", json!({}))).await;
    app.run_until_idle().await;
    app.advance(std::time::Duration::from_secs(5));
    let r = replay_with(
        &app,
        "z.1",
        json!({"reason": "sent again on request", "force": true}),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    app.run_until_idle().await;
    assert_ne!(app.row("z.1").updated_at, first_delivery);
    let before = &app.explain("z.2").await["ordering"]["before"];
    assert_eq!(
        before["ended_at"],
        first_delivery.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "{before}"
    );
    app.stop().await;
}

/// Runs `f` on a plain diesel connection of the app's database, as an application would.
fn sqlite_conn(app: &TestApp) -> SqliteConnection {
    let path = herald::storage::sqlite_path(&app.test_db.url).unwrap();
    let mut c = SqliteConnection::establish(path).unwrap();
    c.batch_execute("PRAGMA busy_timeout = 5000").unwrap();
    c
}

const INSERT_WITH_ID: &str = "INSERT INTO herald_outbox (id, event_id, channel, destination, \
     payload, ordering_key) VALUES ({id}, '{event_id}', 'webhook', '{url}', \
     '{{\"body\": {{}}}}', 'k')";

fn insert_with_id(id: i64, event_id: &str, url: &str) -> String {
    INSERT_WITH_ID
        .replace("{id}", &id.to_string())
        .replace("{event_id}", event_id)
        .replace("{url}", url)
        .replace("{{", "{")
        .replace("}}", "}")
}

/// A key's order is the order its inserting transactions commit, not the order of ids (which
/// are assigned before commit): a message with a lower id committed later goes later.
async fn a_key_goes_in_commit_order_not_id_order(backend: Backend) {
    let app = crate::support::spawn_app(backend).await;
    let rx = Receiver::start().await;
    let sql_second = insert_with_id(1000, "late-id.1", &rx.url);
    let sql_first = insert_with_id(999, "early-id.2", &rx.url);
    match backend {
        Backend::Postgres => {
            let mut c = PgConnection::establish(&app.test_db.url).unwrap();
            c.batch_execute(&format!(
                "BEGIN; {sql_second}; COMMIT; BEGIN; {sql_first}; COMMIT;"
            ))
            .unwrap();
        }
        Backend::Sqlite => {
            let mut c = sqlite_conn(&app);
            c.batch_execute(&format!(
                "BEGIN IMMEDIATE; {sql_second}; COMMIT; BEGIN IMMEDIATE; {sql_first}; COMMIT;"
            ))
            .unwrap();
        }
    }
    let (late, early) = (app.row("late-id.1"), app.row("early-id.2"));
    assert!(early.id < late.id);
    assert_eq!((late.ordering_seq, early.ordering_seq), (Some(1), Some(2)));
    assert!(
        early.next_attempt_at.is_none(),
        "the later commit waits its turn"
    );
    app.run_until_idle().await;
    let ids: Vec<_> = rx.requests().iter().map(id_of).collect();
    assert_eq!(ids, ["late-id.1", "early-id.2"]);
    app.stop().await;
}

/// PostgreSQL: a transaction inserting into a key waits for an earlier, still uncommitted
/// transaction on the same key (`herald_enqueue(…, p_ordering_key => …)`), so a later message
/// can never be sent while an earlier one may still commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_transactions_on_one_key_deliver_in_commit_order() {
    let app = crate::support::spawn_app(Backend::Postgres).await;
    let rx = Receiver::start().await;
    let enqueue = |id: &str| {
        format!(
            "SELECT herald_enqueue('{id}', 'webhook', '{}', '{{\"body\": {{}}}}'::jsonb, \
             p_ordering_key => 'order-7')",
            rx.url
        )
    };
    let mut first = PgConnection::establish(&app.test_db.url).unwrap();
    first
        .batch_execute(&format!("BEGIN; {};", enqueue("t1.1")))
        .unwrap();
    // The second transaction gets its id now, and waits for the key's lock.
    let url = app.test_db.url.clone();
    let sql = enqueue("t2.2");
    let second = std::thread::spawn(move || {
        let mut c = PgConnection::establish(&url).unwrap();
        c.batch_execute(&format!("BEGIN; {sql}; COMMIT;")).unwrap();
    });
    until_lock_waiters(&app, 1).await;
    assert_eq!(
        app.run_until_idle().await,
        0,
        "nothing of the key is committed yet"
    );
    first.batch_execute("COMMIT;").unwrap();
    tokio::task::spawn_blocking(move || second.join().unwrap())
        .await
        .unwrap();
    app.run_until_idle().await;
    let ids: Vec<_> = rx.requests().iter().map(id_of).collect();
    assert_eq!(ids, ["t1.1", "t2.2"]);
    let (t1, t2) = (app.row("t1.1"), app.row("t2.2"));
    assert_eq!((t1.ordering_seq, t2.ordering_seq), (Some(1), Some(2)));
    app.stop().await;
}

/// PostgreSQL, `REPEATABLE READ`: a second transaction inserting into a key while the first is
/// still open waits, and when the first commits it fails with a serialization failure (SQLSTATE
/// 40001, which a client retries), both for a key's first message and for a key that has some.
/// It never takes a place out of order. (It was a unique violation on `herald_outbox_ordering`
/// with the advisory lock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_repeatable_read_a_concurrent_insert_into_a_key_fails_with_40001() {
    let app = crate::support::spawn_app(Backend::Postgres).await;
    let insert = |id: &str| {
        format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload, ordering_key) \
             VALUES ('{id}', 'webhook', 'https://rr.example/h', '{{\"body\": {{}}}}', 'k');"
        )
    };
    for (first, second) in [("a.1", "b.1"), ("a.2", "b.2")] {
        let mut open = PgConnection::establish(&app.test_db.url).unwrap();
        open.batch_execute(&format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; {}",
            insert(first)
        ))
        .unwrap();
        let url = app.test_db.url.clone();
        let sql = insert(second);
        let waiting = std::thread::spawn(move || {
            let mut c = PgConnection::establish(&url).unwrap();
            let r = c.batch_execute(&format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1; {sql} COMMIT;"
            ));
            c.batch_execute("ROLLBACK;").unwrap();
            r
        });
        until_lock_waiters(&app, 1).await;
        open.batch_execute("COMMIT;").unwrap();
        let r = tokio::task::spawn_blocking(move || waiting.join().unwrap())
            .await
            .unwrap();
        match r {
            Err(diesel::result::Error::DatabaseError(kind, info)) => assert_eq!(
                (format!("{kind:?}"), info.message()),
                (
                    "SerializationFailure".to_owned(),
                    "could not serialize access due to concurrent update"
                ),
                "{second}"
            ),
            other => panic!("{second}: {other:?}"),
        }
    }
    assert_eq!(
        (app.row("a.1").ordering_seq, app.row("a.2").ordering_seq),
        (Some(1), Some(2))
    );
    assert!(app.db.find_by_event_id("b.1").unwrap().is_none());
    app.stop().await;
}

/// How many backends of this test's database wait for a lock.
fn lock_waiters(app: &TestApp) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct Waiting {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut watcher = PgConnection::establish(&app.test_db.url).unwrap();
    let w: Waiting = diesel::sql_query(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND datname = current_database()",
    )
    .get_result(&mut watcher)
    .unwrap();
    w.n
}

/// Until `n` backends of this test's database wait for a lock.
async fn until_lock_waiters(app: &TestApp, n: i64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while lock_waiters(app) != n {
        assert!(
            std::time::Instant::now() < deadline,
            "{n} backends never waited for a lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// PostgreSQL, key `k` to `url`: `head` enqueued and committed, then `next` enqueued in a
/// transaction left open on the connection returned (`COMMIT` it to end the insert).
fn head_then_open_insert(app: &TestApp, url: &str, head: &str, next: &str) -> PgConnection {
    let enqueue = |id: &str| {
        format!(
            "SELECT herald_enqueue('{id}', 'webhook', '{url}', '{{\"body\": {{}}}}'::jsonb, \
             p_ordering_key => 'k')"
        )
    };
    app.raw_sql(&enqueue(head));
    let mut open = PgConnection::establish(&app.test_db.url).unwrap();
    open.batch_execute(&format!("BEGIN; {};", enqueue(next)))
        .unwrap();
    open
}

/// PostgreSQL: the head's outcome is written while another transaction is inserting the key's
/// next message — uncommitted, so the outcome cannot see it, and the insert saw the head still
/// open, so it waits. It still goes as soon as that insert commits, not at the next poll (30 s
/// here): the outcome found the key's insert lock busy and the sender releases the key again
/// once it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_inserted_while_its_head_ends_goes_when_its_insert_commits() {
    let app = spawn_app_with(Backend::Postgres, "poll_interval_ms = 30000\n").await;
    let rx = Receiver::start().await;
    let mut open = head_then_open_insert(&app, &rx.url, "r.1", "r.2");
    let sender = app.start_sender();
    // The head is sent and its outcome committed while r.2's insert is still open.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while app.row("r.1").state != herald::domain::State::Delivered {
        assert!(
            std::time::Instant::now() < deadline,
            "the head was not delivered"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rx.requests().len(), 1);
    open.batch_execute("COMMIT;").unwrap();
    let got = rx.wait_for(2, 10).await;
    let ids: Vec<_> = got.iter().map(id_of).collect();
    assert_eq!(ids, ["r.1", "r.2"]);
    sender.stop().await;
    app.stop().await;
}

/// PostgreSQL: one transaction inserts messages of 50,000 distinct keys. Each key's insert lock
/// was an advisory lock held to the commit, a slot each of the shared lock table
/// (`max_locks_per_transaction` × connections, 19,200 on the test cluster): the insert failed
/// with "out of shared memory" (and every session's locks could fail with it while it ran). A
/// row lock takes no slot: the insert commits, every message first in its key.
///
/// Then 5,000 messages of one key in one statement get their places in order. Each insert looked
/// its place up as max(), and the plan cached while the table was small aggregated every place
/// of the key: 10,000 into one key took 7.8 s, 50,000 minutes (now 0.4 and 2.2–2.4 s, measured
/// by hand with `INSERT … SELECT` on a throwaway cluster; not asserted here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_transaction_inserts_into_any_number_of_keys() {
    let app = crate::support::spawn_app(Backend::Postgres).await;
    let url = app.test_db.url.clone();
    let inserted = tokio::task::spawn_blocking(move || {
        let mut c = PgConnection::establish(&url).unwrap();
        c.batch_execute(
            "BEGIN; \
             INSERT INTO herald_outbox (event_id, channel, destination, payload, ordering_key) \
             SELECT 'bulk-' || i, 'webhook', 'https://bulk.example/h', '{\"body\": {}}', 'user-' || i \
             FROM generate_series(1, 50000) AS i; \
             COMMIT; \
             INSERT INTO herald_outbox (event_id, channel, destination, payload, ordering_key) \
             SELECT 'hot-' || i, 'webhook', 'https://bulk.example/h', '{\"body\": {}}', 'hot' \
             FROM generate_series(1, 5000) AS i ORDER BY i;",
        )
    })
    .await
    .unwrap();
    assert!(inserted.is_ok(), "{inserted:?}");
    let counts = strings(
        &app,
        "SELECT (SELECT count(*) FROM herald_outbox \
                 WHERE ordering_seq = 1 AND ordering_key <> 'hot')::text \
             || ' ' || (SELECT count(*) FROM herald_ordering_locks)::text",
    );
    assert_eq!(counts, ["50000 50001"]);
    // And 5,000 messages of one key in one statement: places 1 to 5,000 in insert order, only
    // the first due.
    let hot = strings(
        &app,
        "SELECT count(*) FILTER (WHERE ordering_seq = substr(event_id, 5)::bigint)::text \
         || ' ' || count(next_attempt_at)::text \
         FROM herald_outbox WHERE ordering_key = 'hot'",
    );
    assert_eq!(hot, ["5000 1"]);
    app.stop().await;
}

/// PostgreSQL: an application role with only INSERT on the outbox inserts keyed messages (the
/// ordering trigger runs as its owner, as the fan-out trigger does). It needed SELECT on the
/// outbox for the trigger's lookups before, and would have needed the lock rows' privileges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_only_role_inserts_keyed_messages() {
    let app = crate::support::spawn_app(Backend::Postgres).await;
    let role = format!("app_{}", app.test_db.url.rsplit('/').next().unwrap());
    app.raw_sql(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role}; \
         GRANT INSERT ON herald_outbox TO {role}; \
         GRANT USAGE ON SEQUENCE herald_outbox_id_seq TO {role}"
    ));
    let insert = |id: &str| {
        format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload, ordering_key) \
             VALUES ('{id}', 'webhook', 'https://role.example/h', '{{\"body\": {{}}}}', 'k');"
        )
    };
    let mut c = PgConnection::establish(&app.test_db.url).unwrap();
    let done = c.batch_execute(&format!(
        "SET ROLE {role}; BEGIN; {} {} COMMIT; {} RESET ROLE;",
        insert("r.1"),
        insert("r.2"),
        insert("r.3")
    ));
    assert!(done.is_ok(), "{done:?}");
    let places: Vec<_> = ["r.1", "r.2", "r.3"]
        .iter()
        .map(|id| app.row(id).ordering_seq)
        .collect();
    assert_eq!(places, [Some(1), Some(2), Some(3)]);
    app.raw_sql(&format!(
        "REVOKE ALL ON herald_outbox FROM {role}; \
         REVOKE ALL ON SEQUENCE herald_outbox_id_seq FROM {role}; DROP ROLE {role}"
    ));
    app.stop().await;
}

/// The first column of each row of `sql` (PostgreSQL), as text.
fn strings(app: &TestApp, sql: &str) -> Vec<String> {
    #[derive(diesel::QueryableByName)]
    struct Text {
        #[diesel(sql_type = diesel::sql_types::Text)]
        t: String,
    }
    let mut c = PgConnection::establish(&app.test_db.url).unwrap();
    diesel::sql_query(format!("SELECT t FROM ({sql}) AS q(t)"))
        .load::<Text>(&mut c)
        .unwrap()
        .into_iter()
        .map(|r| r.t)
        .collect()
}

/// PostgreSQL: retention deletes the insert-lock row of a key once its last message is purged,
/// and only then: not while a message of the key is left (`a`), nor while an uncommitted insert
/// into the key holds the row (`c`: that insert commits afterwards, in its place). A key whose
/// row went (`b`) starts again at place 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_forgets_a_key_once_its_messages_are_gone() {
    let app = crate::support::spawn_app(Backend::Postgres).await;
    let rx = Receiver::start().await;
    for (id, key) in [("a.1", "a"), ("b.1", "b"), ("c.1", "c")] {
        post(&app, keyed(id, &rx.url, key, json!({}))).await;
    }
    assert_eq!(app.run_until_idle().await, 3);
    post(&app, keyed("a.2", &rx.url, "a", json!({}))).await;
    let mut open = PgConnection::establish(&app.test_db.url).unwrap();
    open.batch_execute(&format!(
        "BEGIN; SELECT herald_enqueue('c.2', 'webhook', '{}', '{{\"body\": {{}}}}'::jsonb, \
         p_ordering_key => 'c');",
        rx.url
    ))
    .unwrap();
    app.advance(Duration::from_secs(31 * 86_400));
    let (db, config, now) = (
        app.db.clone(),
        app.herald.settings.retention,
        app.clock_now(),
    );
    let r = tokio::task::spawn_blocking(move || herald::retention::run_once(&db, &config, now))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.messages(), 3, "{r:?}");
    let keys = "SELECT ordering_key FROM herald_ordering_locks ORDER BY 1";
    assert_eq!(strings(&app, keys), ["a", "c"]);
    open.batch_execute("COMMIT;").unwrap();
    assert_eq!(app.row("c.2").ordering_seq, Some(2));
    post(&app, keyed("b.2", &rx.url, "b", json!({}))).await;
    assert_eq!(app.row("b.2").ordering_seq, Some(1));
    assert_eq!(strings(&app, keys), ["a", "b", "c"]);
    app.stop().await;
}

/// `run_until_idle` (used by the tests) also releases a key whose head ended while an insert on it
/// was open, once that insert has committed: nothing waits for the periodic release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_until_idle_releases_a_key_once_its_open_insert_commits() {
    let app = spawn_app_with(Backend::Postgres, "poll_interval_ms = 30000\n").await;
    let rx = Receiver::start().await;
    let mut open = head_then_open_insert(&app, &rx.url, "u.1", "u.2");
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("u.1").state, herald::domain::State::Delivered);
    // Still open: its key stays busy, and run_until_idle returns rather than waiting for it.
    assert_eq!(app.run_until_idle().await, 0);
    open.batch_execute("COMMIT;").unwrap();
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("u.2").state, herald::domain::State::Delivered);
    let ids: Vec<_> = rx.requests().iter().map(id_of).collect();
    assert_eq!(ids, ["u.1", "u.2"]);
    app.stop().await;
}

/// `[endpoints.NAME.retry]` decides its endpoint's attempts and is recorded on each of them,
/// and on its messages — by the API at enqueue, by the first claim for a row written by SQL —
/// whose view and explanation show its budget, not the global one's.
async fn an_endpoint_retry_policy_decides_its_attempts(backend: Backend) {
    let rx = Receiver::start().await;
    let strict = rx.url_for("/strict");
    let app = spawn_app_with(
        backend,
        &format!(
            "[endpoints.strict]\nurl = \"{strict}\"\nevent_types = [\"strict.*\"]\n\
             [endpoints.strict.retry]\nmax_attempts = 2\nbase_seconds = 0.5\n"
        ),
    )
    .await;
    rx.script_path("/strict", [Reply::Status(503), Reply::Status(503)]);
    rx.script_path("/plain", [Reply::Status(503)]);
    post(
        &app,
        crate::support::app::webhook("to-strict", "endpoint:strict", json!({})),
    )
    .await;
    post(
        &app,
        crate::support::app::webhook("to-plain", &rx.url_for("/plain"), json!({})),
    )
    .await;
    let view = app.message("to-strict").await;
    assert_eq!(
        (&view["retry_policy"], &view["max_attempts"]),
        (&json!("endpoint-strict"), &json!(2)),
        "{view}"
    );
    let version = view["retry_policy_version"].as_str().unwrap();
    assert!(version.starts_with("endpoint-strict@"), "{view}");
    let plain = app.message("to-plain").await;
    assert_eq!(plain["retry_policy"], "default", "{plain}");
    let version = version.to_owned();
    app.run_until_idle().await;
    app.advance(Duration::from_secs(2));
    app.run_until_idle().await;
    let strict_row = app.row("to-strict");
    assert_eq!(
        strict_row.state.as_str(),
        "dead_letter",
        "budget of 2 spent"
    );
    let versions: Vec<String> = app
        .attempts("to-strict")
        .into_iter()
        .map(|a| a.policy_version)
        .collect();
    assert_eq!(versions.len(), 2);
    assert!(
        versions.iter().all(|v| v.starts_with("endpoint-strict@")),
        "{versions:?}"
    );
    let plain = app.attempts("to-plain");
    assert!(plain[0].policy_version.starts_with("default@"), "{plain:?}");
    assert_eq!(app.row("to-plain").state.as_str(), "delivered");
    let text = app
        .http
        .get(format!("{}/v1/messages/to-strict/explain", app.base))
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap()["explanation"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(text.contains("(2 of 2 in this series)"), "{text}");
    // A row written by SQL records the policy at its first claim: its endpoint's.
    app.raw_sql(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
         VALUES ('sql-strict', 'webhook', 'endpoint:strict', '{\"body\": {}}')",
    );
    assert_eq!(app.run_until_idle().await, 1);
    let sql_row = app.row("sql-strict");
    assert_eq!(
        (
            sql_row.retry_policy.as_str(),
            sql_row.retry_policy_version.as_deref()
        ),
        ("endpoint-strict", Some(version.as_str()))
    );
    // A fan-out's child to the endpoint: its budget at once, its policy at its first claim.
    post(
        &app,
        crate::support::app::webhook("fan", "type:strict.one", json!({})),
    )
    .await;
    assert_eq!(app.message("fan:strict").await["max_attempts"], 2);
    assert_eq!(app.run_until_idle().await, 1);
    let child = app.row("fan:strict");
    assert_eq!(
        (
            child.retry_policy.as_str(),
            child.retry_policy_version.as_deref()
        ),
        ("endpoint-strict", Some(version.as_str()))
    );
    // Its policy changed since (a Herald started with a larger budget on the same database):
    // the view keeps the version it was enqueued under and names the one that decides now,
    // whose budget it shows.
    let changed = crate::support::app::spawn_on(
        crate::support::TestDb::attach(&app.test_db.url, backend),
        &format!(
            "[endpoints.strict]\nurl = \"{strict}\"\nevent_types = [\"strict.*\"]\n\
             [endpoints.strict.retry]\nmax_attempts = 5\nbase_seconds = 0.5\n"
        ),
    )
    .await;
    let view = changed.message("to-strict").await;
    assert_eq!(view["retry_policy_version"], version.as_str(), "{view}");
    let now = view["retry_policy_version_now"].as_str().unwrap();
    assert!(
        now.starts_with("endpoint-strict@") && now != version,
        "{view}"
    );
    assert_eq!(view["max_attempts"], 5);
    changed.stop().await;
    app.stop().await;
}

/// A row written by SQL records the global policy's own name at its first claim when
/// `retry_policy_name` renames it (the column's default says `default`), with or without
/// endpoint policies in the claim.
async fn a_sql_row_records_the_renamed_global_policy(backend: Backend) {
    let rx = Receiver::start().await;
    for endpoints in [
        "",
        "[endpoints.strict]\nurl = \"https://strict.example/h\"\n[endpoints.strict.retry]\nmax_attempts = 2\n",
    ] {
        let app = spawn_app_with(
            backend,
            &format!("retry_policy_name = \"standard\"\n{endpoints}"),
        )
        .await;
        app.raw_sql(&format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             VALUES ('sql-plain', 'webhook', '{}', '{{\"body\": {{}}}}')",
            rx.url
        ));
        assert_eq!(app.run_until_idle().await, 1);
        let row = app.row("sql-plain");
        assert_eq!(row.retry_policy, "standard", "{endpoints:?}");
        let version = row.retry_policy_version.unwrap_or_default();
        assert!(version.starts_with("standard@"), "{version}");
        app.stop().await;
    }
}

/// The table contract: a plain INSERT with `ordering_key` and nothing else of ordering; a key
/// that is not visible ASCII is refused by the database and over HTTP (naming the field).
async fn the_table_contract_and_http_take_an_ordering_key(backend: Backend) {
    let app = crate::support::spawn_app(backend).await;
    let rx = Receiver::start().await;
    let ok = |id: &str, key: &str| {
        format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload, ordering_key) \
             VALUES ('{id}', 'webhook', '{}', '{{\"body\": {{}}}}', '{key}')",
            rx.url
        )
    };
    let bad = ok("bad", "has space");
    let (r1, r2) = match backend {
        Backend::Postgres => {
            let mut c = PgConnection::establish(&app.test_db.url).unwrap();
            c.batch_execute(&format!("{}; {};", ok("p.1", "k"), ok("p.2", "k")))
                .unwrap();
            (c.batch_execute(&bad).is_err(), true)
        }
        Backend::Sqlite => {
            let mut c = sqlite_conn(&app);
            c.batch_execute(&format!("{}; {};", ok("p.1", "k"), ok("p.2", "k")))
                .unwrap();
            (c.batch_execute(&bad).is_err(), true)
        }
    };
    assert!(r1 && r2, "a key with a space is refused by the table");
    let r = app
        .post_message(keyed("h.1", &rx.url, &"x".repeat(256), json!({})))
        .await;
    assert_eq!(r.status(), 422);
    let problem: Value = r.json().await.unwrap();
    assert!(problem.to_string().contains("ordering_key"), "{problem}");
    let r = app
        .post_message(keyed(
            "h.1",
            &rx.url,
            "k",
            json!({"ordering_policy": "later"}),
        ))
        .await;
    assert_eq!(r.status(), 422);
    assert!(r.text().await.unwrap().contains("ordering_policy"));
    // A policy without a key would be kept and never read: refused, naming it.
    let mut unkeyed = keyed("h.1", &rx.url, "k", json!({"ordering_policy": "skip"}));
    unkeyed.as_object_mut().unwrap().remove("ordering_key");
    let r = app.post_message(unkeyed).await;
    assert_eq!(r.status(), 422);
    let problem: Value = r.json().await.unwrap();
    assert_eq!(problem["field"], "ordering_policy", "{problem}");
    assert!(
        app.db.find_by_event_id("h.1").unwrap().is_none(),
        "nothing half-written"
    );
    app.run_until_idle().await;
    let ids: Vec<_> = rx.requests().iter().map(id_of).collect();
    assert_eq!(ids, ["p.1", "p.2"]);
    app.stop().await;
}

/// A 429 with `Retry-After` on a keyed head delays its key only: the key's next message waits for
/// the head's retry to succeed (no attempt of its own spent), while another key at another
/// destination goes on at once.
async fn a_429_on_a_keyed_head_delays_only_its_key(backend: Backend) {
    let app = crate::support::spawn_app(backend).await;
    let (slow, other) = (Receiver::start().await, Receiver::start().await);
    slow.script([Reply::Full(
        429,
        vec![("Retry-After".into(), "30".into())],
        String::new(),
    )]);
    for n in 1..=2 {
        post(&app, keyed(&format!("r.{n}"), &slow.url, "k-r", json!({}))).await;
        post(&app, keyed(&format!("o.{n}"), &other.url, "k-o", json!({}))).await;
    }
    app.run_until_idle().await;
    let ids = |rx: &Receiver| rx.requests().iter().map(id_of).collect::<Vec<_>>();
    assert_eq!(ids(&slow), ["r.1"]);
    assert_eq!(ids(&other), ["o.1", "o.2"], "another key goes on");
    let head = app.row("r.1");
    assert_eq!((head.state.as_str(), head.attempts), ("retryable", 1));
    let next = app.row("r.2");
    assert_eq!((next.state.as_str(), next.attempts), ("scheduled", 0));
    assert!(next.next_attempt_at.is_none(), "waits behind its head");
    // Before the Retry-After has passed nothing of the key goes; after it, the head, then the next.
    app.advance(Duration::from_secs(20));
    app.run_until_idle().await;
    assert_eq!(ids(&slow), ["r.1"]);
    app.advance(Duration::from_secs(60));
    app.run_until_idle().await;
    assert_eq!(ids(&slow), ["r.1", "r.1", "r.2"]);
    assert_eq!(app.row("r.2").attempts, 1);
    assert_eq!(app.row("r.2").state.as_str(), "delivered");
    app.stop().await;
}

/// A replayed head whose later message waits for a retry goes at once, in its place before it:
/// the replay does not leave both waiting (the key held until the periodic release).
async fn a_replayed_head_goes_before_a_later_message_waiting_for_its_retry(backend: Backend) {
    let app = crate::support::spawn_app(backend).await;
    let rx = Receiver::start().await;
    let a = rx.url_for("/a");
    rx.script_path("/a", [Reply::Status(400), Reply::Status(503)]);
    dead_head_and_retrying_next(&app, &a, "r").await;
    replay(&app, "r.1").await;
    // Due now, without a periodic release: sent at once.
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("r.1").state.as_str(), "delivered");
    // Then the later one, at its retry.
    app.advance(Duration::from_secs(3600));
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("r.2").state.as_str(), "delivered");
    let ids: Vec<String> = rx.requests_to("/a").iter().map(id_of).collect();
    assert_eq!(ids, ["r.1", "r.2", "r.1", "r.2"]);
    app.stop().await;
}

/// A replayed head that waits behind a later message of its key in flight stays waiting until
/// that message's outcome: the periodic release (and every other release) leaves a key alone
/// while one of its messages is in flight, so two messages of one key are never in flight at
/// once. It made the replayed head due, and the next claim took it beside the later one.
async fn a_replayed_head_waits_for_a_later_message_in_flight(backend: Backend) {
    let app = crate::support::spawn_app(backend).await;
    let rx = Receiver::start().await;
    let a = rx.url_for("/a");
    rx.script_path("/a", [Reply::Status(400)]);
    post(
        &app,
        keyed("f.1", &a, "k", json!({"ordering_policy": "skip"})),
    )
    .await;
    post(&app, keyed("f.2", &a, "k", json!({}))).await;
    // f.1 dead (and skipped); f.2 claimed, its request not yet made.
    let first = app.herald.sender.claim(10).await.unwrap();
    assert_eq!(first.len(), 1);
    let outcome = app
        .herald
        .sender
        .process(first.into_iter().next().unwrap())
        .await;
    app.herald.sender.record(vec![outcome]).await.unwrap();
    assert_eq!(app.row("f.1").state.as_str(), "dead_letter");
    let in_flight = app.herald.sender.claim(10).await.unwrap();
    assert_eq!(in_flight.len(), 1);
    assert_eq!(in_flight[0].event_id, "f.2");
    replay(&app, "f.1").await;
    // The periodic release, then a claim: f.1 still waits, f.2 alone is in flight.
    app.herald.sender.release_waiting().await.unwrap();
    let claimed = app.herald.sender.claim(10).await.unwrap();
    assert!(
        claimed.is_empty(),
        "{:?} claimed while f.2 is in flight",
        claimed.iter().map(|r| &r.event_id).collect::<Vec<_>>()
    );
    assert_eq!(app.row("f.1").next_attempt_at, None);
    // f.2's outcome lets it go.
    let outcome = app
        .herald
        .sender
        .process(in_flight.into_iter().next().unwrap())
        .await;
    app.herald.sender.record(vec![outcome]).await.unwrap();
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("f.1").state.as_str(), "delivered");
    let ids: Vec<String> = rx.requests_to("/a").iter().map(id_of).collect();
    assert_eq!(ids, ["f.1", "f.2", "f.1"]);
    app.stop().await;
}

/// PostgreSQL: a replay that comes while a claim of a later message of the key is not yet
/// committed (its row locked, still `retryable` to everyone else) waits, rather than being made
/// due beside a message about to be in flight. The test holds the later message's row as that
/// claim would; once it is free, the periodic release lets the replayed one go first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_waits_for_a_claim_of_its_key_in_progress() {
    let app = crate::support::spawn_app(Backend::Postgres).await;
    let rx = Receiver::start().await;
    let a = rx.url_for("/a");
    rx.script_path("/a", [Reply::Status(400), Reply::Status(503)]);
    dead_head_and_retrying_next(&app, &a, "c").await;
    let id = app.row("c.2").id;
    let mut claim = PgConnection::establish(&app.test_db.url).unwrap();
    claim
        .batch_execute(&format!(
            "BEGIN; SELECT id FROM herald_outbox WHERE id = {id} FOR UPDATE"
        ))
        .unwrap();
    replay(&app, "c.1").await;
    assert_eq!(app.row("c.1").next_attempt_at, None, "c.1 waits");
    claim.batch_execute("ROLLBACK").unwrap();
    app.herald.sender.release_waiting().await.unwrap();
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("c.1").state.as_str(), "delivered");
    app.stop().await;
}

/// A claim whose statement took its snapshot before a replay committed, and reached the key's
/// next message only after that commit, saw the replayed head still dead and skipped, took the
/// next message as the key's head, and committed: the next claim took the replayed head too, and
/// both were in flight. The replay could not see that claim (it held no row yet); the claim is
/// what checks, in a statement of its own after the claim, that each keyed row it took is still
/// its key's head, and claims again if not.
///
/// The claim is held at that point by a row-level security policy of a role of the test's own,
/// whose check on the next message waits for an advisory lock the test holds (Herald's own role
/// is a superuser here, which row-level security leaves alone). That role's transactions default
/// to REPEATABLE READ, as a database's settings may make them: Herald's own are READ COMMITTED
/// all the same, or the re-check would read the claim's own snapshot and pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_older_than_a_replay_does_not_put_two_of_a_key_in_flight() {
    let app = crate::support::spawn_app(Backend::Postgres).await;
    let rx = Receiver::start().await;
    let a = rx.url_for("/a");
    rx.script_path("/a", [Reply::Status(400), Reply::Status(503)]);
    dead_head_and_retrying_next(&app, &a, "s").await;
    // s.2's retry is due.
    app.advance(Duration::from_secs(3600));
    let next = app.row("s.2").id;
    let db_name = app.test_db.url.rsplit('/').next().unwrap().to_owned();
    let role = format!("claim_{db_name}");
    app.raw_sql(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN; \
         GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}; \
         GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}; \
         CREATE FUNCTION held_at_next(id bigint) RETURNS boolean LANGUAGE plpgsql AS $$ \
         BEGIN \
           IF id = {next} THEN \
             PERFORM pg_advisory_lock_shared(4242); PERFORM pg_advisory_unlock_shared(4242); \
           END IF; \
           RETURN true; \
         END $$; \
         ALTER ROLE {role} SET default_transaction_isolation = 'repeatable read'; \
         ALTER TABLE herald_outbox ENABLE ROW LEVEL SECURITY; \
         CREATE POLICY held ON herald_outbox TO {role} USING (held_at_next(id)) WITH CHECK (true)"
    ));
    let mut gate = PgConnection::establish(&app.test_db.url).unwrap();
    gate.batch_execute("SELECT pg_advisory_lock(4242)").unwrap();
    let url = app
        .test_db
        .url
        .replacen("://herald@", &format!("://{role}@"), 1);
    assert_ne!(url, app.test_db.url, "the role's own URL");
    let other = herald::storage::Db::connect(&url, &Default::default()).unwrap();
    let now = herald::clock::Clock::storage_now(&*app.clock);
    let app_policies = crate::support::global_policy("v1");
    let claim = std::thread::spawn(move || {
        other
            .claim(now, 10, "other", Duration::from_secs(30), &app_policies)
            .unwrap()
    });
    // The claim's statement has its snapshot and waits at s.2.
    until_lock_waiters(&app, 1).await;
    replay(&app, "s.1").await;
    gate.batch_execute("SELECT pg_advisory_unlock(4242)")
        .unwrap();
    let (taken, _) = claim.join().unwrap();
    let mine = app.herald.sender.claim(10).await.unwrap();
    let in_flight = strings(
        &app,
        "SELECT event_id FROM herald_outbox WHERE ordering_key = 'k' AND state = 'sending' \
         ORDER BY event_id",
    );
    assert_eq!(in_flight, ["s.1"], "taken by the old claim: {taken:?}");
    assert_eq!(taken.len() + mine.len(), 1);
    app.raw_sql(&format!(
        "DROP POLICY held ON herald_outbox; ALTER TABLE herald_outbox DISABLE ROW LEVEL SECURITY; \
         DROP FUNCTION held_at_next(bigint); \
         REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}; \
         REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {role}; DROP ROLE {role}"
    ));
    app.stop().await;
}

/// PostgreSQL: a replay that comes while an insert into its key is still open (it holds the key's
/// insert lock) makes its message wait. That insert's message is due (the replayed one still
/// looks dead and skipped to it) and the replay cannot see it: made due, the replayed message
/// could be claimed beside it, both in flight. Never waiting for the lock (a redrive takes many
/// keys in one transaction; an application inserts into many in its own order), the replay does
/// not deadlock with such an insert; the periodic release lets the replayed message go first,
/// as its place says, and the new one follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_during_an_open_insert_into_its_key_waits() {
    let app = crate::support::spawn_app(Backend::Postgres).await;
    let rx = Receiver::start().await;
    let a = rx.url_for("/a");
    rx.script_path("/a", [Reply::Status(400)]);
    post(
        &app,
        keyed("i.1", &a, "k", json!({"ordering_policy": "skip"})),
    )
    .await;
    app.run_until_idle().await;
    assert_eq!(app.row("i.1").state.as_str(), "dead_letter");
    let mut open = PgConnection::establish(&app.test_db.url).unwrap();
    open.batch_execute(&format!(
        "BEGIN; SELECT herald_enqueue('i.2', 'webhook', '{a}', '{{\"body\": {{}}}}'::jsonb, \
         p_ordering_key => 'k')"
    ))
    .unwrap();
    replay(&app, "i.1").await;
    assert_eq!(app.row("i.1").next_attempt_at, None, "i.1 waits");
    open.batch_execute("COMMIT").unwrap();
    assert_eq!(app.row("i.2").state.as_str(), "scheduled");
    assert!(app.row("i.2").next_attempt_at.is_some(), "i.2 is due");
    assert_eq!(app.run_until_idle().await, 0, "i.2 waits behind i.1");
    app.herald.sender.release_waiting().await.unwrap();
    assert_eq!(app.run_until_idle().await, 2);
    let ids: Vec<String> = rx.requests_to("/a").iter().map(id_of).collect();
    assert_eq!(ids, ["i.1", "i.1", "i.2"]);
    app.stop().await;
}

/// PostgreSQL: a redrive replays the dead heads of many keys in one transaction while an
/// application's transaction inserts into several of those keys, in another order. Had the
/// redrive waited for each key's insert lock, it would hold `k2`'s and wait for `k1`'s while the
/// application held `k1`'s and waited for `k2`'s: a deadlock, and PostgreSQL aborts one of them.
/// It never waits: both finish, and every message goes in its key's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_does_not_deadlock_with_an_insert_into_its_keys() {
    let app = crate::support::spawn_app(Backend::Postgres).await;
    let rx = Receiver::start().await;
    let a = rx.url_for("/a");
    rx.script_path("/a", [Reply::Status(400), Reply::Status(400)]);
    // k2's head dies first: the redrive (oldest first) takes k2, then k1.
    for (id, key) in [("k2.1", "k2"), ("k1.1", "k1")] {
        post(&app, keyed(id, &a, key, json!({"ordering_policy": "skip"}))).await;
        app.run_until_idle().await;
        assert_eq!(app.row(id).state.as_str(), "dead_letter");
    }
    let enqueue = |id: &str, key: &str| {
        format!(
            "SELECT herald_enqueue('{id}', 'webhook', '{a}', '{{\"body\": {{}}}}'::jsonb, \
             p_ordering_key => '{key}');"
        )
    };
    let mut application = PgConnection::establish(&app.test_db.url).unwrap();
    application
        .batch_execute(&format!("BEGIN; {}", enqueue("k1.2", "k1")))
        .unwrap();
    let redrive = {
        let (http, base) = (app.http.clone(), app.base.clone());
        tokio::spawn(async move {
            let r = http
                .post(format!("{base}/v1/dead-letters/redrive"))
                .json(&json!({"reason": "receiver fixed"}))
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap())
        })
    };
    // The redrive either ends, or waits for a lock (k1's, which the application holds).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !redrive.is_finished() && lock_waiters(&app) == 0 {
        assert!(std::time::Instant::now() < deadline, "the redrive hung");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = format!("{} COMMIT;", enqueue("k2.2", "k2"));
    let inserted = tokio::task::spawn_blocking(move || application.batch_execute(&second))
        .await
        .unwrap();
    assert!(inserted.is_ok(), "{inserted:?}");
    let (status, body) = redrive.await.unwrap();
    assert_eq!(status, 200, "{body}");
    app.herald.sender.release_waiting().await.unwrap();
    app.run_until_idle().await;
    let requests = rx.requests_to("/a");
    for key in ["k1", "k2"] {
        let ids: Vec<String> = requests
            .iter()
            .map(id_of)
            .filter(|id| id.starts_with(&format!("{key}.")))
            .collect();
        assert_eq!(
            ids,
            [format!("{key}.1"), format!("{key}.1"), format!("{key}.2")]
        );
    }
    app.stop().await;
}

/// Ordering keys are per destination, shared by every client that sends there: a `send` token
/// whose message waits behind another client's dead head learns that it is blocked, not that
/// head's event id (another client's messages are 404s to it); its own head it sees by id.
async fn a_send_token_is_not_shown_another_clients_blocking_head(backend: Backend) {
    use crate::support::app::client_with_token;
    let digest = |t| herald::auth::digest_hex(t);
    let app = spawn_app_with(
        backend,
        &format!(
            "[tokens.shop]\nsha256 = \"{}\"\nscope = \"send\"\n\
             [tokens.blog]\nsha256 = \"{}\"\nscope = \"send\"\n",
            digest("shop-token-0123456789"),
            digest("blog-token-0123456789")
        ),
    )
    .await;
    let rx = Receiver::start().await;
    let a = rx.url_for("/a");
    rx.script_path("/a", [Reply::Status(400)]);
    let (shop, blog) = (
        client_with_token("shop-token-0123456789"),
        client_with_token("blog-token-0123456789"),
    );
    let url = format!("{}/v1/messages", app.base);
    for (client, id) in [(&shop, "k.1"), (&blog, "k.2"), (&shop, "k.3")] {
        let r = client
            .post(&url)
            .json(&keyed(id, &a, "shared", json!({})))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{id}");
    }
    app.run_until_idle().await;
    assert_eq!(app.row("k.1").state.as_str(), "dead_letter");
    let blocked_by = |client: &reqwest::Client, id: &str| {
        let req = client.get(format!("{url}/{id}"));
        async move {
            let v: Value = req.send().await.unwrap().json().await.unwrap();
            v["blocked_by"].as_str().map(str::to_owned)
        }
    };
    assert_eq!(
        blocked_by(&blog, "k.2").await.as_deref(),
        Some("(another client's message)")
    );
    assert_eq!(blocked_by(&shop, "k.3").await.as_deref(), Some("k.1"));
    assert_eq!(
        blocked_by(&app.http, "k.2").await.as_deref(),
        Some("k.1"),
        "admin"
    );
    app.stop().await;
}

/// A message waiting behind its key's dead head does not expire while it waits; the claim
/// after the key moves on expires it instead of sending it, and its explanation said so while it
/// waited (it said nothing of the passed expiry; an operator's walk-through).
async fn a_message_blocked_past_its_expiry_expires_when_its_key_moves_on(backend: Backend) {
    let app = crate::support::spawn_app(backend).await;
    let rx = Receiver::start().await;
    let x = rx.url_for("/x");
    rx.script_path("/x", [Reply::Status(400)]);
    post(&app, keyed("x.1", &x, "x", json!({}))).await;
    let expires = (app.clock_now() + chrono::Duration::seconds(60)).to_rfc3339();
    post(&app, keyed("x.2", &x, "x", json!({"expires_at": expires}))).await;
    app.run_until_idle().await;
    assert_eq!(app.message("x.2").await["blocked_by"], "x.1");
    app.advance(Duration::from_secs(120));
    app.run_until_idle().await;
    assert_eq!(
        app.row("x.2").state.as_str(),
        "scheduled",
        "waiting spends nothing"
    );
    let e = app.explain("x.2").await;
    let words = e["explanation"].as_str().unwrap();
    assert!(
        words.contains(&format!(
            "Its expires_at is {}: if the key moves on only after that, it is expired then, not \
             sent.",
            e["expires_at"].as_str().unwrap()
        )),
        "{words}"
    );
    let r = app
        .http
        .post(format!("{}/v1/messages/x.1/skip", app.base))
        .json(&json!({"reason": "order superseded"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    app.run_until_idle().await;
    assert_eq!(app.row("x.2").state.as_str(), "expired");
    assert_eq!(
        rx.requests_to("/x").iter().map(id_of).collect::<Vec<_>>(),
        ["x.1"]
    );
    let words = app.explain("x.2").await["explanation"].to_string();
    assert!(words.contains("It expired"), "{words}");
    assert!(!words.contains("if the key moves on"), "{words}");
    app.stop().await;
}

both_backends!(
    a_message_blocked_past_its_expiry_expires_when_its_key_moves_on,
    a_due_message_held_by_its_key_is_not_the_senders_backlog,
    a_replayed_head_goes_before_a_later_message_waiting_for_its_retry,
    a_replayed_head_waits_for_a_later_message_in_flight,
    a_send_token_is_not_shown_another_clients_blocking_head,
    a_429_on_a_keyed_head_delays_only_its_key,
    keyed_messages_go_one_at_a_time_in_order,
    a_dead_head_blocks_only_its_key_until_replayed,
    skip_lets_the_rest_of_the_key_through,
    an_explicit_skip_or_a_cancel_releases_a_blocked_key,
    a_key_goes_in_commit_order_not_id_order,
    an_endpoint_retry_policy_decides_its_attempts,
    a_sql_row_records_the_renamed_global_policy,
    the_table_contract_and_http_take_an_ordering_key,
);

/// `herald serve` on `db_url` as a child process, with a short lease; killed when dropped.
struct Serving {
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Drop for Serving {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn serve(db_url: &str) -> (Serving, String) {
    let dir = tempfile::tempdir().unwrap();
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_herald"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
    cmd.arg("serve")
        .current_dir(dir.path())
        .envs([
            ("HERALD_DATABASE_URL", db_url),
            ("HERALD_LISTEN", listen.as_str()),
            ("HERALD_API_TOKEN", crate::support::app::ADMIN_TOKEN),
            ("HERALD_WEBHOOK_SECRET", crate::support::app::SECRET),
            (
                "HERALD_ALLOW_NETWORKS",
                crate::support::app::TEST_ALLOW_NETWORKS,
            ),
            ("HERALD_POLL_INTERVAL_MS", "50"),
            ("HERALD_WEBHOOK_TIMEOUT_MS", "1000"),
            ("HERALD_LEASE_SECONDS", "6"),
            ("HERALD_RETRY_BASE_SECONDS", "0.2"),
            ("HERALD_RETRY_CAP_SECONDS", "1"),
            ("HERALD_SENDER_CONCURRENCY", "8"),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr);
    let child = cmd.spawn().expect("spawn herald");
    (Serving { child, _dir: dir }, format!("http://{listen}"))
}

async fn wait_healthy(s: &mut Serving, base: &str) {
    herald::channels::install_crypto_provider();
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            s.child.try_wait().unwrap().is_none(),
            "herald exited at start-up"
        );
        if let Ok(r) = http.get(format!("{base}/healthz")).send().await
            && r.status() == 200
        {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "herald not healthy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two real Herald processes on one PostgreSQL, one killed (SIGKILL) mid-run: per key, the
/// receiver still sees the places in order (a resend of the same message after the lost lease
/// is the only repeat) and never two requests of one key at once; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_keep_each_keys_order_when_one_is_killed() {
    let db = TestDb::new(Backend::Postgres);
    let rx = Receiver::start().await;
    const KEYS: usize = 10;
    const PER_KEY: u32 = 12;
    let total = KEYS * PER_KEY as usize;
    let mut rng = rand::rng();
    // Quick answers for the first quarter, then slow ones (200–400 ms): a lease seen held just
    // before the kill is then still held at the kill. (With 5–40 ms answers throughout, the one
    // lease seen could end between the look and the kill — a CI run saw that once — and then
    // nothing was left to take over.)
    let fast = total / 4;
    let mut replies: Vec<Reply> = (0..fast)
        .map(|_| Reply::Delayed(rng.random_range(5..40), 200))
        .collect();
    replies.extend((fast..total + 40).map(|_| Reply::Delayed(rng.random_range(200..400), 200)));
    rx.script(replies);
    {
        let mut c = PgConnection::establish(&db.url).unwrap();
        let mut sql = String::from("BEGIN;");
        for n in 1..=PER_KEY {
            for k in 0..KEYS {
                sql.push_str(&format!(
                    "SELECT herald_enqueue('k{k}.{n}', 'webhook', '{}', '{{\"body\": {{}}}}'::jsonb, \
                     p_ordering_key => 'key-{k}');",
                    rx.url
                ));
            }
        }
        sql.push_str("COMMIT;");
        c.batch_execute(&sql).unwrap();
    }
    let (mut a, base_a) = serve(&db.url);
    let (mut b, base_b) = serve(&db.url);
    wait_healthy(&mut a, &base_a).await;
    wait_healthy(&mut b, &base_b).await;
    // Past the quick quarter (and one request a key more): the requests in flight are slow ones.
    rx.wait_for(fast + KEYS, 60).await;
    // Kill one while it holds a lease: a request of its own is in flight, or a claimed row
    // waits for its send slot. Either may hold them all: a process that claims a key's head
    // usually claims its next message too, the moment its outcome releases it.
    let mut c = PgConnection::establish(&db.url).unwrap();
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let held = |c: &mut PgConnection, s: &Serving| {
        let q = format!(
            "SELECT count(*) AS n FROM herald_outbox WHERE state = 'sending' \
             AND lease_owner LIKE 'herald-{}-%'",
            s.child.id()
        );
        diesel::sql_query(q).get_result::<Count>(c).unwrap().n
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let (mut killed, mut survivor) = loop {
        if held(&mut c, &a) > 0 {
            break (a, b);
        }
        if held(&mut c, &b) > 0 {
            break (b, a);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "neither process ever held a lease"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    killed.child.kill().unwrap();
    killed.child.wait().unwrap();
    // The survivor finishes, the killed one's leases included once they expire.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let done: Count =
            diesel::sql_query("SELECT count(*) AS n FROM herald_outbox WHERE state = 'delivered'")
                .get_result(&mut c)
                .unwrap();
        if done.n as usize == total {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {} of {total} delivered",
            done.n
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        survivor.child.try_wait().unwrap().is_none(),
        "the survivor kept running"
    );
    let expired: Count = diesel::sql_query(
        "SELECT count(*) AS n FROM herald_attempts WHERE error_kind = 'lease_expired'",
    )
    .get_result(&mut c)
    .unwrap();
    assert!(
        expired.n > 0,
        "the survivor took over the killed one's leases"
    );
    let requests = rx.requests();
    assert!(requests.len() >= total);
    assert_ordered(&requests, KEYS, PER_KEY);
}

/// `herald skip EVENT_ID --reason R` (the real binary) releases a blocked key of the database an
/// application and a running Herald share; exit 1 when the message holds no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_skips_a_dead_head() {
    let app = crate::support::spawn_app(Backend::Sqlite).await;
    let rx = Receiver::start().await;
    rx.script([Reply::Status(400), Reply::Status(400)]);
    for n in 1..=2 {
        post(&app, keyed(&format!("c.{n}"), &rx.url, "cli", json!({}))).await;
        post(&app, keyed(&format!("d.{n}"), &rx.url, "cli-2", json!({}))).await;
    }
    app.run_until_idle().await;
    assert_eq!(app.message("c.2").await["blocked_by"], "c.1");
    assert_eq!(app.message("d.2").await["blocked_by"], "d.1");
    let url = app.test_db.url.clone();
    let skip = move |args: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_herald"));
        for (k, _) in std::env::vars() {
            if k.starts_with("HERALD_") || k == "RUST_LOG" {
                cmd.env_remove(k);
            }
        }
        cmd.env("HERALD_DATABASE_URL", &url)
            .env("USER", "tester")
            .arg("skip")
            .args(args)
            .output()
            .expect("run herald")
    };
    let s = skip.clone();
    let out = tokio::task::spawn_blocking(move || s(&["c.1", "--reason", "superseded", "--json"]))
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "dead_letter", "{v}");
    assert!(v["ordering_released_at"].is_string(), "{v}");
    // Without --json: one line, ended (a shell's `read` loses a line without its newline).
    let s = skip.clone();
    let out = tokio::task::spawn_blocking(move || s(&["d.1", "--reason", "superseded"]))
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "skipped: d.1 no longer holds ordering key cli-2; the key's next message is due\n"
    );
    for args in [
        &["c.1", "--reason", "again"][..],
        &["nope", "--reason", "x"][..],
    ] {
        let s = skip.clone();
        let owned: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let out = tokio::task::spawn_blocking(move || {
            s(&owned.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .await
        .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
    }
    app.run_until_idle().await;
    assert_eq!(app.row("c.2").state.as_str(), "delivered");
    assert_eq!(app.row("d.2").state.as_str(), "delivered");
    app.stop().await;
}

/// A fan-out's children each take their place in their own endpoint's key: a dead child at one
/// endpoint holds only that endpoint's sequence.
async fn a_fan_out_orders_each_endpoint_on_its_own(backend: Backend) {
    let rx = Receiver::start().await;
    let (a, b) = (rx.url_for("/a"), rx.url_for("/b"));
    let app = spawn_app_with(
        backend,
        &format!(
            "[endpoints.a]\nurl = \"{a}\"\nevent_types = [\"order.*\"]\n\
             [endpoints.b]\nurl = \"{b}\"\nevent_types = [\"order.*\"]\n"
        ),
    )
    .await;
    rx.script_path("/a", [Reply::Status(400)]);
    for n in 1..=3 {
        post(
            &app,
            keyed(&format!("f.{n}"), "type:order.placed", "order-9", json!({})),
        )
        .await;
    }
    app.run_until_idle().await;
    let ids = |path: &str| rx.requests_to(path).iter().map(id_of).collect::<Vec<_>>();
    assert_eq!(ids("/a"), ["f.1:a"]);
    assert_eq!(ids("/b"), ["f.1:b", "f.2:b", "f.3:b"]);
    let child = app.row("f.3:a");
    assert_eq!(
        (child.ordering_key.as_deref(), child.ordering_seq),
        (Some("order-9"), Some(3))
    );
    assert_eq!(app.message("f.2:a").await["blocked_by"], "f.1:a");
    app.stop().await;
}

both_backends!(a_fan_out_orders_each_endpoint_on_its_own);

/// The production loop claims a key's next message as soon as the head's outcome is written,
/// not at the next poll (a release is an update, which no insert notification announces).
async fn the_next_message_of_a_key_goes_without_waiting_for_a_poll(backend: Backend) {
    let app = spawn_app_with(backend, "poll_interval_ms = 30000\n").await;
    let rx = Receiver::start().await;
    let sender = app.start_sender();
    for n in 1..=5 {
        post(&app, keyed(&format!("w.{n}"), &rx.url, "w", json!({}))).await;
    }
    // Five polls would take minutes; the wake-ups take milliseconds.
    let got = rx.wait_for(5, 20).await;
    let ids: Vec<_> = got.iter().map(id_of).collect();
    assert_eq!(ids, ["w.1", "w.2", "w.3", "w.4", "w.5"]);
    sender.stop().await;
    app.stop().await;
}

both_backends!(the_next_message_of_a_key_goes_without_waiting_for_a_poll);
