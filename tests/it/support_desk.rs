//! Support over HTTP on both backends, against a real scripted receiver and the injected clock:
//! explain every state (delivered, retried then delivered, dead-lettered permanent and
//! exhausted, unconfirmed, expired), replay each with its original event id and an audit row,
//! list dead letters by keyset and redrive them within their bound — and never show a body, an
//! address in clear, a URL path or a secret.

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::both_backends;
use crate::support::app::{ADMIN_TOKEN, SECRET, client_with_token, spawn_app_with, webhook};
use crate::support::{Backend, Receiver, Reply, TestApp};

/// A generic HMAC receipt source whose events carry `id`, `type`, `at`, `herald_event_id`.
const SOURCE: &str = "[sources.esp]\nscheme = \"hmac\"\nsecrets = [\"esp-secret\"]\n\
                      event_time_pointer = \"/at\"\n";
const T0: i64 = 1_700_000_000;

/// Text that must never appear in a support view: the body, an address, a URL path and query, a
/// receiver's response text, secrets.
const NEVER: &[&str] = &[
    "private-body-text-42",
    "ada@example.com",
    "/hook",
    "/retried",
    "sekrit",
    "receiver-said-this",
    SECRET,
    ADMIN_TOKEN,
    "esp-secret",
];

fn assert_reveals_nothing(what: &str, text: &str) {
    for never in NEVER {
        assert!(!text.contains(never), "{what} reveals {never:?}:\n{text}");
    }
}

/// A webhook message whose body holds private text and an address.
fn private_message(id: &str, url: &str) -> Value {
    webhook(
        id,
        url,
        json!({"note": "private-body-text-42", "customer": "ada@example.com"}),
    )
}

async fn post(app: &TestApp, path: &str, body: Value) -> reqwest::Response {
    app.http
        .post(format!("{}{path}", app.base))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn get(app: &TestApp, path: &str) -> reqwest::Response {
    app.http
        .get(format!("{}{path}", app.base))
        .send()
        .await
        .unwrap()
}

/// `GET /v1/sends/{prefix}` (200 asserted), checked for leaks.
async fn explain(app: &TestApp, fingerprint_prefix: &str) -> Value {
    let r = get(app, &format!("/v1/sends/{fingerprint_prefix}")).await;
    assert_eq!(r.status(), 200, "explain {fingerprint_prefix}");
    let text = r.text().await.unwrap();
    assert_reveals_nothing("explain", &text);
    serde_json::from_str(&text).unwrap()
}

async fn fingerprint(app: &TestApp, event_id: &str) -> String {
    app.message(event_id).await["fingerprint"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn replay(app: &TestApp, fp: &str, body: Value) -> reqwest::Response {
    post(app, &format!("/v1/sends/{fp}/replay"), body).await
}

/// A problem+json answer with `status`; its body.
async fn problem(r: reqwest::Response, status: u16) -> Value {
    assert_eq!(r.status(), status);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    r.json().await.unwrap()
}

async fn post_receipt(app: &TestApp, event: Value) {
    let body = serde_json::to_vec(&event).unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(b"esp-secret").unwrap();
    mac.update(&body);
    let r = app
        .http
        .post(format!("{}/v1/ingest/esp", app.base))
        .header("x-signature", hex::encode(mac.finalize().into_bytes()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x[key].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn delivered_and_retried_then_delivered_read_correctly(backend: Backend) {
    let app = spawn_app_with(backend, SOURCE).await;
    let rx = Receiver::start().await;
    let version = app.herald.settings.retry.version.clone();

    // Delivered at the first attempt.
    let once = rx.url_for("/once");
    assert_eq!(
        app.post_message(private_message("sd-once", &once))
            .await
            .status(),
        201
    );
    assert_eq!(app.run_until_idle().await, 1);
    let fp = fingerprint(&app, "sd-once").await;
    let e = explain(&app, &fp[..8]).await;
    assert_eq!(e["event_id"], "sd-once");
    assert_eq!(e["fingerprint"], fp);
    assert_eq!(e["channel"], "webhook");
    assert_eq!(e["destination"], rx.masked().as_str());
    assert_eq!(e["state"], "delivered");
    assert_eq!(e["enqueued_by"], "default");
    assert_eq!(e["attempt_timeline"].as_array().unwrap().len(), 1);
    let a = &e["attempt_timeline"][0];
    assert_eq!(
        (&a["attempt"], &a["status"], &a["class"], &a["next_state"]),
        (
            &json!(1),
            &json!(200),
            &json!("accepted"),
            &json!("delivered")
        )
    );
    assert_eq!(a["policy_version"], version.as_str());
    let text = e["explanation"].as_str().unwrap();
    assert!(
        text.contains("Attempt 1 at ")
            && text.contains("got 200")
            && text.contains("the receiver accepted it: delivered at ")
            && text.ends_with("It is delivered."),
        "{text}"
    );
    // The same by event id, and by the whole fingerprint in capitals.
    let by_id: Value = get(&app, "/v1/messages/sd-once/explain")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(by_id, e);
    assert_eq!(explain(&app, &fp.to_uppercase()).await, e);

    // 503, then 429 with Retry-After 2, then 200.
    let path = "/retried?token=sekrit";
    rx.script_path(
        path,
        [
            Reply::Full(503, vec![], "receiver-said-this".into()),
            Reply::Full(
                429,
                vec![("Retry-After".into(), "2".into())],
                "receiver-said-this".into(),
            ),
        ],
    );
    let url = format!("{}{path}", rx.url_for(""));
    assert_eq!(
        app.post_message(private_message("sd-retried", &url))
            .await
            .status(),
        201
    );
    assert_eq!(app.run_until_idle().await, 1);
    app.advance(Duration::from_secs(5));
    assert_eq!(app.run_until_idle().await, 1);
    app.advance(Duration::from_secs(5));
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(rx.requests_to(path).len(), 3);
    // Receipts: the bounce (event time +20 s) arrives first, the older delivery after it.
    post_receipt(
        &app,
        json!({"id": "r-bounce", "type": "bounced", "at": T0 + 20, "herald_event_id": "sd-retried"}),
    )
    .await;
    app.herald.reconciler.run_until_idle().await.unwrap();
    post_receipt(
        &app,
        json!({"id": "r-deliv", "type": "delivered", "at": T0 + 10, "herald_event_id": "sd-retried"}),
    )
    .await;
    app.herald.reconciler.run_until_idle().await.unwrap();

    let fp = fingerprint(&app, "sd-retried").await;
    let e = explain(&app, &fp[..12]).await;
    assert_eq!(e["state"], "delivered");
    assert_eq!(e["attempts"], 3);
    assert_eq!(e["delivery_status"], "bounced");
    let t = e["attempt_timeline"].as_array().unwrap();
    assert_eq!(t.len(), 3);
    assert_eq!(
        (&t[0]["status"], &t[0]["class"], &t[0]["next_state"]),
        (&json!(503), &json!("transient"), &json!("retryable"))
    );
    let d0 = t[0]["delay_ms"].as_i64().unwrap();
    assert!((800..=1200).contains(&d0), "backoff 1 s ± 20 %: {d0}");
    assert!(
        t[0]["delay_reason"]
            .as_str()
            .unwrap()
            .contains("backoff after attempt 1"),
        "{}",
        t[0]
    );
    assert_eq!(
        (&t[1]["status"], &t[1]["class"], &t[1]["retry_after"]),
        (&json!(429), &json!("rate_limited"), &json!("2"))
    );
    let d1 = t[1]["delay_ms"].as_i64().unwrap();
    assert!(
        (2000..=2400).contains(&d1),
        "Retry-After 2 s + up to 20 %: {d1}"
    );
    assert!(
        t[1]["delay_reason"]
            .as_str()
            .unwrap()
            .contains("Retry-After 2s"),
        "{}",
        t[1]
    );
    assert_eq!(
        (&t[2]["status"], &t[2]["next_state"]),
        (&json!(200), &json!("delivered"))
    );
    for a in t {
        assert_eq!(a["policy_version"], version.as_str());
        assert_eq!(a["series"], 1);
        assert!(a.get("response_excerpt").is_none());
    }
    let r = e["receipt_timeline"].as_array().unwrap();
    assert_eq!(
        strings(&e["receipt_timeline"], "event_type"),
        ["delivered", "bounced"]
    );
    assert_eq!(r[0]["outcome"], "superseded", "{}", r[0]);
    assert_eq!(r[1]["outcome"], "applied", "{}", r[1]);
    assert!(r[0]["event_time"].as_str().is_some() && r[0]["received_at"].as_str().is_some());
    let text = e["explanation"].as_str().unwrap();
    for want in [
        "got 503 after ",
        "classified transient; Herald set the next attempt ",
        "got 429 with Retry-After 2 s after ",
        "(Retry-After 2s, jitter +",
        "the receiver accepted it: delivered at ",
        "the recipient's server bounced it at ",
        "; superseded",
        "It is delivered. Its delivery status from receipts is bounced",
    ] {
        assert!(text.contains(want), "missing {want:?}:\n{text}");
    }
    app.stop().await;
}

async fn dead_letters_explain_and_replay_with_their_event_id(backend: Backend) {
    let app = spawn_app_with(backend, "").await;
    let rx = Receiver::start().await;

    // Permanent: a 404 dead-letters at once.
    rx.script_path("/perm", [Reply::Status(404)]);
    let perm = rx.url_for("/perm");
    app.post_message(private_message("sd-perm", &perm)).await;
    assert_eq!(app.run_until_idle().await, 1);
    let fp = fingerprint(&app, "sd-perm").await;
    let e = explain(&app, &fp[..8]).await;
    assert_eq!(
        (&e["state"], &e["last_error_class"]),
        (&json!("dead_letter"), &json!("permanent"))
    );
    let text = e["explanation"].as_str().unwrap();
    assert!(
        text.contains("got 404") && text.contains("Herald dead-lettered it (permanent refusal")
            && text.contains("It is dead-lettered because the receiver refused it permanently; it stays dead until someone replays it."),
        "{text}"
    );
    let r = replay(
        &app,
        &fp[..8],
        json!({"reason": "endpoint fixed by ada@example.com"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let done: Value = r.json().await.unwrap();
    assert_eq!(done["event_id"], "sd-perm");
    assert_eq!(done["fingerprint"], fp);
    assert_eq!(done["state"], "scheduled");
    assert_eq!(done["replay"]["from_state"], "dead_letter");
    assert_eq!(done["replay"]["who"], "default", "the token's name");
    assert_eq!(done["replay"]["series_start"], 2);
    assert_eq!(done["replay"]["forced"], false);
    assert_eq!(app.run_until_idle().await, 1);
    let sent = rx.requests_to("/perm");
    assert_eq!(sent.len(), 2);
    assert!(
        sent.iter()
            .all(|r| r.header("webhook-id") == Some("sd-perm")
                && r.header("idempotency-key") == Some("sd-perm")),
        "the original event id both times"
    );
    let e = explain(&app, &fp).await;
    assert_eq!(e["state"], "delivered");
    assert_eq!(e["attempts"], 2);
    assert_eq!(e["series_start"], 2);
    assert_eq!(e["last_error_class"], Value::Null);
    let t = &e["attempt_timeline"];
    assert_eq!((&t[0]["series"], &t[1]["series"]), (&json!(1), &json!(2)));
    assert_eq!(t[0]["next_state"], "dead_letter", "the old history is kept");
    let replays = e["replays"].as_array().unwrap();
    assert_eq!(replays.len(), 1);
    assert_eq!(replays[0]["who"], "default");
    assert_eq!(replays[0]["from_state"], "dead_letter");
    assert_eq!(
        replays[0]["reason"], "endpoint fixed by a***@e***.com",
        "an address in a reason is masked"
    );
    assert!(
        e["explanation"]
            .as_str()
            .unwrap()
            .contains("default replayed it from dead_letter"),
        "{}",
        e["explanation"]
    );

    // Exhausted: a budget of 2, two 503s.
    let mut m = private_message("sd-exh", &rx.url_for("/exh"));
    m["max_attempts"] = json!(2);
    rx.script_path("/exh", [Reply::Status(503), Reply::Status(503)]);
    app.post_message(m).await;
    assert_eq!(app.run_until_idle().await, 1);
    app.advance(Duration::from_secs(10));
    assert_eq!(app.run_until_idle().await, 1);
    let fp = fingerprint(&app, "sd-exh").await;
    let e = explain(&app, &fp[..10]).await;
    assert_eq!(
        (&e["state"], &e["last_error_class"]),
        (&json!("dead_letter"), &json!("exhausted"))
    );
    let text = e["explanation"].as_str().unwrap();
    assert!(
        text.contains("attempt budget spent (2 of 2); last attempt was transient")
            && text.contains("its attempt budget was spent (2 of 2 in this series)"),
        "{text}"
    );
    // A replay gets a whole new budget; failing again, it stays dead — no loop.
    rx.script_path("/exh", [Reply::Status(503), Reply::Status(503)]);
    assert_eq!(
        replay(&app, &fp, json!({"reason": "try once more"}))
            .await
            .status(),
        200
    );
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(
        app.row("sd-exh").state.as_str(),
        "retryable",
        "budget renewed"
    );
    app.advance(Duration::from_secs(10));
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("sd-exh").state.as_str(), "dead_letter");
    app.advance(Duration::from_secs(3600));
    assert_eq!(app.run_until_idle().await, 0, "a replay never loops");
    assert_eq!(rx.requests_to("/exh").len(), 4);
    let e = explain(&app, &fp).await;
    assert_eq!(
        (&e["attempts"], &e["series_start"], &e["series_attempts"]),
        (&json!(4), &json!(3), &json!(2))
    );
    assert_eq!(
        strings(&e["attempt_timeline"], "next_state"),
        ["retryable", "dead_letter", "retryable", "dead_letter"]
    );
    // And a second replay is audited as a second row.
    assert_eq!(
        replay(&app, &fp, json!({"reason": "receiver back"}))
            .await
            .status(),
        200
    );
    assert_eq!(app.run_until_idle().await, 1);
    let e = explain(&app, &fp).await;
    assert_eq!(e["state"], "delivered");
    assert_eq!(
        strings(&e["replays"], "reason"),
        ["try once more", "receiver back"]
    );
    assert!(
        rx.requests_to("/exh")
            .iter()
            .all(|r| r.header("webhook-id") == Some("sd-exh"))
    );
    app.stop().await;
}

async fn unconfirmed_and_expired_replay(backend: Backend) {
    let app = spawn_app_with(backend, "").await;
    let rx = Receiver::start().await;

    // A 409: unconfirmed, never retried blindly; a replay sends it again with the same id.
    rx.script_path("/conflict", [Reply::Status(409)]);
    app.post_message(private_message("sd-409", &rx.url_for("/conflict")))
        .await;
    assert_eq!(app.run_until_idle().await, 1);
    let fp = fingerprint(&app, "sd-409").await;
    let e = explain(&app, &fp[..8]).await;
    assert_eq!(
        (&e["state"], &e["last_error_class"]),
        (&json!("unconfirmed"), &json!("conflict"))
    );
    let text = e["explanation"].as_str().unwrap();
    assert!(
        text.contains("got 409")
            && text.contains("Herald left it unconfirmed")
            && text.contains(
                "It is unconfirmed: the receiver answered 409, so it may already have this event."
            ),
        "{text}"
    );
    let done: Value = replay(&app, &fp, json!({"reason": "receiver says it has nothing"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(done["replay"]["from_state"], "unconfirmed");
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("sd-409").state.as_str(), "delivered");
    let e = explain(&app, &fp).await;
    assert_eq!(strings(&e["replays"], "from_state"), ["unconfirmed"]);
    assert_eq!(strings(&e["replays"], "who"), ["default"]);
    assert_eq!(
        strings(&e["attempt_timeline"], "next_state"),
        ["unconfirmed", "delivered"]
    );
    assert_eq!(
        rx.requests_to("/conflict")
            .iter()
            .map(|r| r.header("webhook-id").unwrap().to_owned())
            .collect::<Vec<_>>(),
        ["sd-409", "sd-409"]
    );

    // Expired before any attempt: no request was made.
    let mut m = private_message("sd-exp", &rx.url_for("/exp"));
    let expires = app.clock_now() + chrono::Duration::seconds(1);
    m["expires_at"] = json!(expires.to_rfc3339());
    assert_eq!(app.post_message(m).await.status(), 201);
    app.advance(Duration::from_secs(2));
    assert_eq!(app.run_until_idle().await, 0);
    assert_eq!(app.row("sd-exp").state.as_str(), "expired");
    let fp = fingerprint(&app, "sd-exp").await;
    let e = explain(&app, &fp[..8]).await;
    assert_eq!(e["attempt_timeline"], json!([]));
    let text = e["explanation"].as_str().unwrap();
    assert!(
        text.contains("No attempt has been made.") && text.contains("It expired: its expires_at ("),
        "{text}"
    );
    // Its expires_at has passed: a replay must move or clear it, or it would expire again.
    let p = problem(
        replay(&app, &fp, json!({"reason": "late but wanted"})).await,
        422,
    )
    .await;
    assert_eq!(p["field"], "expires_at");
    assert_eq!(
        app.row("sd-exp").state.as_str(),
        "expired",
        "nothing half-written"
    );
    let later = app.clock_now() + chrono::Duration::hours(1);
    let done: Value = replay(
        &app,
        &fp,
        json!({"reason": "late but wanted", "expires_at": later.to_rfc3339()}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(done["replay"]["from_state"], "expired");
    assert_eq!(
        done["replay"]["series_start"], 1,
        "no attempt before: the series starts at 1"
    );
    assert_eq!(app.run_until_idle().await, 1);
    let e = explain(&app, &fp).await;
    assert_eq!(e["state"], "delivered");
    let after: chrono::DateTime<chrono::Utc> = e["replays"][0]["expires_at_after"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (after - later).num_milliseconds().abs() < 1,
        "{after} {later}"
    );
    assert!(e["replays"][0]["expires_at_before"].is_string());
    assert!(
        e["explanation"]
            .as_str()
            .unwrap()
            .contains("and expires_at set to ")
    );
    assert_eq!(
        rx.requests_to("/exp")[0].header("webhook-id"),
        Some("sd-exp")
    );
    app.stop().await;
}

fn header_map(r: &crate::support::receiver::Recorded) -> reqwest::header::HeaderMap {
    let mut h = reqwest::header::HeaderMap::new();
    for (n, v) in &r.headers {
        h.append(
            reqwest::header::HeaderName::from_bytes(n.as_bytes()).unwrap(),
            reqwest::header::HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

async fn forced_replays_and_refusals(backend: Backend) {
    let app = spawn_app_with(backend, "").await;
    let rx = Receiver::start().await;
    app.post_message(private_message("sd-done", &rx.url_for("/done")))
        .await;
    assert_eq!(app.run_until_idle().await, 1);
    let fp = fingerprint(&app, "sd-done").await;

    // Delivered: only with force.
    let p = problem(
        replay(&app, &fp, json!({"reason": "customer lost it"})).await,
        409,
    )
    .await;
    assert_eq!(p["field"], "force");
    assert!(p["type"].as_str().unwrap().ends_with("/force-required"));
    app.advance(Duration::from_secs(2));
    let done: Value = replay(
        &app,
        &fp,
        json!({"reason": "customer lost it", "force": true}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(done["replay"]["forced"], true);
    assert_eq!(done["replay"]["from_state"], "delivered");
    assert_eq!(app.run_until_idle().await, 1);
    let sent = rx.requests_to("/done");
    assert_eq!(sent.len(), 2);
    let wh = standardwebhooks::Webhook::new(SECRET).unwrap();
    for r in &sent {
        assert_eq!(
            r.header("webhook-id"),
            Some("sd-done"),
            "the receiver can deduplicate"
        );
        wh.verify(&r.body, &header_map(r))
            .expect("signed for its own timestamp");
    }
    assert_eq!(sent[0].body, sent[1].body);
    assert_ne!(
        sent[0].header("webhook-timestamp"),
        sent[1].header("webhook-timestamp"),
        "a fresh timestamp"
    );
    assert_ne!(
        sent[0].header("webhook-signature"),
        sent[1].header("webhook-signature")
    );
    let e = explain(&app, &fp).await;
    assert_eq!(e["replays"][0]["forced"], true);
    assert!(
        e["explanation"]
            .as_str()
            .unwrap()
            .contains("replayed it from delivered, forced")
    );

    // Scheduled (not yet sent), then canceled: neither replays.
    let mut later = private_message("sd-later", &rx.url_for("/later"));
    later["scheduled_at"] = json!((app.clock_now() + chrono::Duration::hours(1)).to_rfc3339());
    app.post_message(later).await;
    let fp_later = fingerprint(&app, "sd-later").await;
    let p = problem(replay(&app, &fp_later, json!({"reason": "x"})).await, 409).await;
    assert!(
        p["type"].as_str().unwrap().ends_with("/not-replayable"),
        "{p}"
    );
    assert!(p["detail"].as_str().unwrap().contains("scheduled"), "{p}");
    let r = post(&app, "/v1/messages/sd-later/cancel", json!({})).await;
    assert_eq!(r.status(), 200);
    let p = problem(
        replay(&app, &fp_later, json!({"reason": "x", "force": true})).await,
        409,
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("canceled"), "{p}");
    assert_eq!(app.row("sd-later").state.as_str(), "canceled");

    // Sending (claimed, in flight): 409.
    app.post_message(private_message("sd-flight", &rx.url_for("/flight")))
        .await;
    let claimed = app.herald.sender.claim(10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let fp_flight = fingerprint(&app, "sd-flight").await;
    let p = problem(replay(&app, &fp_flight, json!({"reason": "x"})).await, 409).await;
    assert!(p["type"].as_str().unwrap().ends_with("/in-flight"), "{p}");
    let outcome = app
        .herald
        .sender
        .process(claimed.into_iter().next().unwrap())
        .await;
    app.herald.sender.record(vec![outcome]).await.unwrap();

    // Bad input names the field; nothing is written.
    for (body, field) in [
        (json!({}), "reason"),
        (json!({"reason": "  "}), "reason"),
        (json!({"reason": "two\nlines"}), "reason"),
        (json!({"reason": "x".repeat(501)}), "reason"),
        (json!({"reason": "ok", "force": "yes"}), "force"),
        (
            json!({"reason": "ok", "expires_at": "tomorrow"}),
            "expires_at",
        ),
        (json!({"reason": "ok", "why": "x"}), "why"),
    ] {
        let p = problem(replay(&app, &fp, body.clone()).await, 422).await;
        assert_eq!(p["field"], field, "{body}");
    }
    let p = problem(get(&app, "/v1/sends/xyz").await, 422).await;
    assert_eq!(p["field"], "fingerprint");
    let p = problem(get(&app, "/v1/sends/1234567").await, 422).await;
    assert_eq!(p["field"], "fingerprint", "at least 8 digits");
    problem(
        get(&app, &format!("/v1/sends/{}", "0".repeat(64))).await,
        404,
    )
    .await;
    problem(get(&app, "/v1/messages/nope/explain").await, 404).await;
    assert_eq!(
        explain(&app, &fp).await["replays"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // An ambiguous prefix: 409 listing the candidates.
    for (id, fp, host) in [
        ("amb-1", "deadbeef0", "x.example"),
        ("amb-2", "deadbeef1", "X.Example"),
    ] {
        let fp = format!("{fp}{}", "a".repeat(55));
        app.raw_sql(&format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload, state, request_fingerprint) \
             VALUES ('{id}', 'webhook', 'https://{host}/h', '{{\"body\":{{}}}}', 'dead_letter', '{fp}')"
        ));
    }
    let p = problem(get(&app, "/v1/sends/DEADBEEF").await, 409).await;
    assert_eq!(p["field"], "fingerprint");
    // The newest first.
    assert_eq!(strings(&p["candidates"], "event_id"), ["amb-2", "amb-1"]);
    let p = problem(replay(&app, "deadbeef", json!({"reason": "x"})).await, 409).await;
    assert_eq!(p["candidates"].as_array().unwrap().len(), 2);
    assert_eq!(explain(&app, "deadbeef1").await["event_id"], "amb-2");
    let listed: Value = get(&app, "/v1/dead-letters?destination=X.example")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        strings(&listed["dead_letters"], "event_id"),
        ["amb-1", "amb-2"],
        "hosts compare without case"
    );
    app.stop().await;
}

async fn support_routes_need_the_support_scope(backend: Backend) {
    let digest = herald::auth::digest_hex;
    let extra = format!(
        "[tokens.shop]\nsha256 = \"{}\"\nscope = \"send\"\n\
         [tokens.desk]\nsha256 = \"{}\"\nscope = \"support\"\n",
        digest("shop-token-0123456789"),
        digest("desk-token-0123456789"),
    );
    let rx = Receiver::start().await;
    let extra = format!("{extra}[endpoints.billing]\nurl = \"{}\"\n", rx.url);
    let app = spawn_app_with(backend, &extra).await;
    let (shop, desk) = (
        client_with_token("shop-token-0123456789"),
        client_with_token("desk-token-0123456789"),
    );
    rx.script([Reply::Status(404)]);
    let r = shop
        .post(format!("{}/v1/messages", app.base))
        .json(&private_message("sd-scope", "endpoint:billing"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(app.run_until_idle().await, 1);
    let fp = fingerprint(&app, "sd-scope").await;
    let b = &app.base;
    let routes = [
        ("GET", format!("{b}/v1/sends/{fp}")),
        ("GET", format!("{b}/v1/messages/sd-scope/explain")),
        ("POST", format!("{b}/v1/sends/{fp}/replay")),
        ("POST", format!("{b}/v1/messages/sd-scope/replay")),
        ("GET", format!("{b}/v1/dead-letters")),
        ("POST", format!("{b}/v1/dead-letters/redrive")),
    ];
    for (method, url) in &routes {
        let call = |c: &reqwest::Client| match *method {
            "GET" => c.get(url),
            _ => c.post(url).json(&json!({"reason": "by the shop"})),
        };
        assert_eq!(
            call(&shop).send().await.unwrap().status(),
            403,
            "{method} {url}"
        );
        assert_eq!(
            call(&reqwest::Client::new()).send().await.unwrap().status(),
            401,
            "{method} {url}"
        );
    }
    assert_eq!(
        app.row("sd-scope").state.as_str(),
        "dead_letter",
        "nothing replayed"
    );
    // The support token may list (by endpoint name) and replay; the audit names it.
    let listed = |name: &str| {
        let r = desk.get(format!("{b}/v1/dead-letters?destination=endpoint:{name}"));
        async move {
            let r = r.send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()["dead_letters"].clone()
        }
    };
    let before = listed("billing").await;
    assert_eq!(strings(&before, "event_id"), ["sd-scope"]);
    assert_eq!(before[0]["destination"], "endpoint:billing");
    assert_eq!(listed("other").await, json!([]));
    let r = desk
        .post(format!("{b}/v1/sends/{fp}/replay"))
        .json(&json!({"reason": "ticket 7"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let done: Value = r.json().await.unwrap();
    assert_eq!(done["replay"]["who"], "desk");
    assert_eq!(
        listed("billing").await,
        json!([]),
        "replayed: no longer dead"
    );
    app.stop().await;
}

/// Every dead letter's event id, page by page (`limit` each), checked for leaks.
async fn walk(app: &TestApp, query: &str, limit: u32) -> (Vec<String>, Vec<Value>) {
    let mut ids = Vec::new();
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut path = format!("/v1/dead-letters?limit={limit}{query}");
        if let Some(a) = &after {
            path.push_str(&format!("&after={a}"));
        }
        let r = get(app, &path).await;
        assert_eq!(r.status(), 200, "{path}");
        let text = r.text().await.unwrap();
        assert_reveals_nothing("dead-letter listing", &text);
        let page: Value = serde_json::from_str(&text).unwrap();
        ids.extend(strings(&page["dead_letters"], "event_id"));
        after = page["next"].as_str().map(str::to_owned);
        pages.push(page);
        if after.is_none() {
            return (ids, pages);
        }
    }
}

async fn ids_of(app: &TestApp, query: &str) -> Vec<String> {
    walk(app, query, 1000).await.0
}

async fn dead_letters_list_by_keyset_and_redrive_within_bounds(backend: Backend) {
    let app = spawn_app_with(backend, "").await;
    let rx = Receiver::start().await;
    let port = rx
        .url
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    // Five permanent dead letters, one at a time (their dead-lettered times differ), and one
    // exhausted.
    let mut dead = Vec::new();
    for i in 1..=5 {
        let id = format!("sd-dl-{i}");
        rx.script_path(&format!("/d{i}"), [Reply::Status(404)]);
        app.post_message(private_message(&id, &rx.url_for(&format!("/d{i}"))))
            .await;
        assert_eq!(app.run_until_idle().await, 1);
        app.advance(Duration::from_millis(5));
        dead.push(id);
    }
    let mut m = private_message("sd-dl-exh", &rx.url_for("/dx"));
    m["max_attempts"] = json!(1);
    rx.script_path("/dx", [Reply::Status(503)]);
    app.post_message(m).await;
    assert_eq!(app.run_until_idle().await, 1);
    dead.push("sd-dl-exh".into());
    app.advance(Duration::from_secs(10));

    let (all, pages) = walk(&app, "", 1000).await;
    assert_eq!(all, dead, "oldest first");
    let first = &pages[0]["dead_letters"][0];
    assert_eq!(first["destination"], rx.masked().as_str());
    assert_eq!(first["class"], "permanent");
    assert_eq!(first["attempts"], 1);
    assert_eq!(
        first["last_attempt"],
        json!({"attempt": 1, "status": 404, "error_kind": null, "class": "permanent"})
    );
    assert!(first.get("payload").is_none() && first.get("body").is_none());
    assert_eq!(ids_of(&app, "&class=permanent").await, dead[..5]);
    assert_eq!(ids_of(&app, "&class=exhausted").await, ["sd-dl-exh"]);
    assert_eq!(
        ids_of(&app, "&class=unconfirmed").await,
        Vec::<String>::new()
    );
    assert_eq!(ids_of(&app, "&destination=127.0.0.1").await, dead);
    assert_eq!(
        ids_of(&app, &format!("&destination=127.0.0.1:{port}")).await,
        dead
    );
    assert_eq!(
        ids_of(&app, "&destination=127.0.0.10").await,
        Vec::<String>::new()
    );
    assert_eq!(
        ids_of(&app, "&destination=endpoint:billing").await,
        Vec::<String>::new()
    );
    assert_eq!(ids_of(&app, "&channel=webhook").await, dead);
    assert_eq!(ids_of(&app, "&channel=email").await, Vec::<String>::new());
    let future = (app.clock_now() + chrono::Duration::hours(1))
        .to_rfc3339()
        .replace('+', "%2B");
    assert_eq!(
        ids_of(&app, &format!("&since={future}")).await,
        Vec::<String>::new()
    );
    assert_eq!(ids_of(&app, &format!("&until={future}")).await, dead);

    // Keyset pages of 2, with a new dead letter committed between two pages: every row once, in
    // order, the new one last.
    let r = get(&app, "/v1/dead-letters?limit=2").await;
    let page1: Value = r.json().await.unwrap();
    assert_eq!(strings(&page1["dead_letters"], "event_id"), dead[..2]);
    let cursor = page1["next"].as_str().unwrap().to_owned();
    rx.script_path("/d7", [Reply::Status(404)]);
    app.post_message(private_message("sd-dl-7", &rx.url_for("/d7")))
        .await;
    assert_eq!(app.run_until_idle().await, 1);
    let mut rest = Vec::new();
    let mut after = Some(cursor);
    while let Some(a) = after {
        let page: Value = get(&app, &format!("/v1/dead-letters?limit=2&after={a}"))
            .await
            .json()
            .await
            .unwrap();
        rest.extend(strings(&page["dead_letters"], "event_id"));
        after = page["next"].as_str().map(str::to_owned);
    }
    let mut expect: Vec<String> = dead[2..].to_vec();
    expect.push("sd-dl-7".into());
    assert_eq!(rest, expect);
    dead.push("sd-dl-7".into());

    for (query, field) in [
        ("limit=1001", "limit"),
        ("limit=0", "limit"),
        ("after=garbage", "after"),
        // A cursor whose time is about 95,000 BC: no listing gave it, and PostgreSQL would
        // refuse the time (a 500 once).
        ("after=djE6LTMwMDAwMDAwMDAwMDAwMDAwMDA6MQ", "after"),
        ("class=late", "class"),
        ("destination=a/b", "destination"),
        ("since=yesterday", "since"),
        ("until=9999-12-31T23:59:59-01:00", "until"),
        ("page=2", "page"),
    ] {
        let p = problem(get(&app, &format!("/v1/dead-letters?{query}")).await, 422).await;
        assert_eq!(p["field"], field, "{query}");
    }

    // A bounded redrive: the two oldest permanent ones, audited, sent again with their ids.
    for (body, field) in [
        (json!({"class": "permanent"}), "reason"),
        (json!({"reason": "fixed", "limit": 1001}), "limit"),
        (json!({"reason": "fixed", "limit": 0}), "limit"),
        (json!({"reason": "fixed", "class": "nope"}), "class"),
        (json!({"reason": "fixed", "after": "x"}), "after"),
        // Every message would expire again at once: refused whole, as a replay's is.
        (
            json!({"reason": "fixed", "expires_at": "2020-01-01T00:00:00Z"}),
            "expires_at",
        ),
        // Year 10000 in UTC, which neither backend stores (SQLite's check refused it: a 500).
        (
            json!({"reason": "fixed", "expires_at": "9999-12-31T23:59:59-01:00"}),
            "expires_at",
        ),
    ] {
        let p = problem(
            post(&app, "/v1/dead-letters/redrive", body.clone()).await,
            422,
        )
        .await;
        assert_eq!(p["field"], field, "{body}");
    }
    // A body that is not JSON at all: 400 `malformed`, as at `POST /v1/messages`.
    let fp = fingerprint(&app, &dead[0]).await;
    for path in [
        "/v1/dead-letters/redrive".to_owned(),
        format!("/v1/sends/{fp}/replay"),
        format!("/v1/messages/{}/skip", dead[0]),
    ] {
        let r = app
            .http
            .post(format!("{}{path}", app.base))
            .header("content-type", "application/json")
            .body("{not json")
            .send()
            .await
            .unwrap();
        let p = problem(r, 400).await;
        assert_eq!(
            (p["type"].as_str(), p["field"].as_str()),
            (Some("https://herald.dev/problems/malformed"), Some("body")),
            "{path}"
        );
    }
    assert_eq!(ids_of(&app, "").await, dead, "nothing half-written");
    let report: Value = post(
        &app,
        "/v1/dead-letters/redrive",
        json!({"reason": "receiver fixed", "class": "permanent", "limit": 2}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(strings(&report["redriven"], "event_id"), dead[..2]);
    assert_eq!(report["more"], true);
    assert_eq!(report["limit"], 2);
    assert_eq!(report["redriven"][0]["series_start"], 2);
    assert_eq!(report["redriven"][0]["from_state"], "dead_letter");
    assert_reveals_nothing("redrive report", &report.to_string());
    assert_eq!(app.run_until_idle().await, 2);
    assert_eq!(app.row("sd-dl-1").state.as_str(), "delivered");
    assert_eq!(
        rx.requests_to("/d1")[1].header("webhook-id"),
        Some("sd-dl-1")
    );
    let fp = fingerprint(&app, "sd-dl-2").await;
    let e = explain(&app, &fp).await;
    assert_eq!(e["replays"][0]["who"], "default");
    assert_eq!(e["replays"][0]["reason"], "receiver fixed");

    // The default bound takes the rest; nothing more matches afterwards.
    let report: Value = post(
        &app,
        "/v1/dead-letters/redrive",
        json!({"reason": "all of them"}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(strings(&report["redriven"], "event_id"), dead[2..]);
    assert_eq!(report["more"], false);
    assert_eq!(report["limit"], 100);
    assert_eq!(ids_of(&app, "").await, Vec::<String>::new());
    app.stop().await;
}

/// Dead letters a redrive skips (their expires_at has passed) stay dead letters: each run's
/// `next`, passed back as `after`, starts past them. Without it a run of them at the oldest end
/// took up every redrive's limit again, and the ones after them were never reached. One the
/// sweep redrove that fails again is not met again by it (it would be redriven at every run),
/// and `after` goes only with the filters it came from.
async fn a_redrive_gets_past_the_dead_letters_it_skips(backend: Backend) {
    let app = spawn_app_with(backend, "").await;
    let rx = Receiver::start().await;
    let soon = app.clock_now() + chrono::Duration::seconds(60);
    for (id, expires, then) in [
        ("rd-exp-1", true, 200),
        ("rd-exp-2", true, 200),
        ("rd-fails", false, 404),
        ("rd-ok", false, 200),
    ] {
        let path = format!("/{id}");
        rx.script_path(&path, [Reply::Status(404), Reply::Status(then)]);
        let mut m = private_message(id, &rx.url_for(&path));
        if expires {
            m["expires_at"] = json!(soon.to_rfc3339());
        }
        assert_eq!(app.post_message(m).await.status(), 201);
        assert_eq!(app.run_until_idle().await, 1);
        app.advance(Duration::from_millis(5));
    }
    app.advance(Duration::from_secs(120));
    let redrive = |after: Option<Value>, channel: Option<&'static str>| {
        let mut body = json!({"reason": "receiver fixed", "limit": 1});
        if let Some(a) = after {
            body["after"] = a;
        }
        if let Some(c) = channel {
            body["channel"] = json!(c);
        }
        let app = &app;
        async move { post(app, "/v1/dead-letters/redrive", body).await }
    };
    let run = |after: Option<Value>| async {
        let r = redrive(after, None).await;
        assert_eq!(r.status(), 200);
        r.json::<Value>().await.unwrap()
    };
    let first = run(None).await;
    assert_eq!(
        strings(&first["skipped"], "event_id"),
        ["rd-exp-1"],
        "{first}"
    );
    assert_eq!(first["more"], true);
    // Run again as it was: the same skipped one again.
    let again = run(None).await;
    assert_eq!(strings(&again["skipped"], "event_id"), ["rd-exp-1"]);
    // Its next with other filters (or none of those it came with): refused, naming it.
    let r = redrive(Some(first["next"].clone()), Some("webhook")).await;
    assert_eq!(r.status(), 422);
    assert_eq!(r.json::<Value>().await.unwrap()["field"], "after");
    // From its next: past it.
    let second = run(Some(first["next"].clone())).await;
    assert_eq!(
        strings(&second["skipped"], "event_id"),
        ["rd-exp-2"],
        "{second}"
    );
    let third = run(Some(second["next"].clone())).await;
    assert_eq!(
        strings(&third["redriven"], "event_id"),
        ["rd-fails"],
        "{third}"
    );
    assert_eq!(third["more"], true);
    // It fails again: dead-lettered anew, after the sweep began.
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("rd-fails").state.as_str(), "dead_letter");
    let fourth = run(Some(third["next"].clone())).await;
    assert_eq!(
        strings(&fourth["redriven"], "event_id"),
        ["rd-ok"],
        "{fourth}"
    );
    assert_eq!(
        (&fourth["more"], &fourth["next"]),
        (&json!(false), &Value::Null),
        "the sweep is over; rd-fails is not met again"
    );
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("rd-ok").state.as_str(), "delivered");
    assert_eq!(ids_of(&app, "").await, ["rd-exp-1", "rd-exp-2", "rd-fails"]);
    assert_eq!(rx.requests_to("/rd-fails").len(), 2);
    app.stop().await;
}

/// An email dead letter is listed by its domain, with or without a display name around its
/// address, and shown masked without the name; an internationalized domain by either of its
/// forms, whichever the row was written with.
async fn dead_letters_by_an_email_domain_with_or_without_a_display_name(backend: Backend) {
    let app = spawn_app_with(backend, "").await;
    // Rows an application wrote by SQL without a subject: dead-lettered at their first claim,
    // no connection opened.
    for (id, to) in [
        ("mail-plain", "pat@corp.example"),
        ("mail-named", "Pat Doe <pat@CORP.example>"),
        ("mail-other", "Pat <pat@corp.example.org>"),
        ("mail-unicode", "ada@bücher.example"),
        ("mail-ascii", "Ada <ada@xn--bcher-kva.example>"),
    ] {
        app.raw_sql(&format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             VALUES ('{id}', 'email', '{to}', '{{\"text\": \"t\"}}')"
        ));
    }
    assert_eq!(app.run_until_idle().await, 5);
    let (ids, pages) = walk(&app, "&destination=corp.example", 1000).await;
    assert_eq!(ids, ["mail-plain", "mail-named"]);
    let shown = pages[0]["dead_letters"][1]["destination"].clone();
    assert_eq!(shown, "p***@C***.example", "{}", pages[0]);
    for domain in ["b%C3%BCcher.example", "XN--BCHER-KVA.example"] {
        let (ids, _) = walk(&app, &format!("&destination={domain}"), 1000).await;
        assert_eq!(ids, ["mail-unicode", "mail-ascii"], "{domain}");
    }
    // Webhook dead letters by host and port: a scheme's own port finds the URLs written
    // without it too, which are the same destination.
    app.raw_sql(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload, state, last_error_class) \
         VALUES ('web-80', 'webhook', 'http://svc.example/h', '{\"body\": 1}', 'dead_letter', 'permanent'), \
                ('web-8080', 'webhook', 'http://svc.example:8080/h', '{\"body\": 1}', 'dead_letter', 'permanent'), \
                ('web-443', 'webhook', 'https://svc.example?x=1', '{\"body\": 1}', 'dead_letter', 'permanent')",
    );
    for (filter, expected) in [
        ("svc.example:80", &["web-80"][..]),
        ("svc.example:443", &["web-443"][..]),
        ("svc.example:8080", &["web-8080"][..]),
        ("svc.example", &["web-80", "web-8080", "web-443"][..]),
    ] {
        let (ids, _) = walk(&app, &format!("&destination={filter}"), 1000).await;
        assert_eq!(ids, expected, "{filter}");
    }
    app.stop().await;
}

/// A webhook row an application wrote by SQL with credentials in its URL is dead-lettered at its
/// first claim, no request made, and support finds it by its host — as listed — and reads why
/// (a walk-through: `destination=HOST` did not find it, and the explanation said only "could not
/// send it as written"). An `@` in another host's path or query is not taken for it.
async fn a_url_with_credentials_is_found_by_its_host_and_says_why(backend: Backend) {
    let app = spawn_app_with(backend, "").await;
    app.raw_sql(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
         VALUES ('cred', 'webhook', 'http://admin:hunter2@cred.example:8080/h?pw=QS3', '{\"body\": 1}')",
    );
    app.raw_sql(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload, state, last_error_class) \
         VALUES ('in-path', 'webhook', 'http://other.example/p@cred.example/x', '{\"body\": 1}', 'dead_letter', 'permanent'), \
                ('in-query', 'webhook', 'https://other.example?x=@cred.example:8080/', '{\"body\": 1}', 'dead_letter', 'permanent'), \
                ('backslash', 'webhook', 'http://other.example\\@cred.example/', '{\"body\": 1}', 'dead_letter', 'permanent'), \
                ('plain', 'webhook', 'https://cred.example/h', '{\"body\": 1}', 'dead_letter', 'permanent')",
    );
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("cred").state.as_str(), "dead_letter");
    for (filter, expected) in [
        ("cred.example", &["plain", "cred"][..]),
        ("cred.example:8080", &["cred"][..]),
        ("other.example", &["in-path", "in-query", "backslash"][..]),
    ] {
        let (mut ids, pages) = walk(&app, &format!("&destination={filter}"), 1000).await;
        ids.sort();
        let mut expected = expected.to_vec();
        expected.sort();
        assert_eq!(ids, expected, "{filter}");
        assert!(!pages[0].to_string().contains("hunter2"), "{}", pages[0]);
    }
    let e = app.explain("cred").await;
    let words = e["explanation"].as_str().unwrap();
    assert!(
        words.contains("failed (invalid_destination) after")
            && words
                .contains("must not carry credentials; configure an endpoint with auth instead"),
        "{words}"
    );
    assert!(!e.to_string().contains("hunter2"), "{e}");
    app.stop().await;
}

/// A dead letter whose provider's receipt says it arrived is listed with that status, and is
/// replayed or redriven only with force, as a delivered message is (a redrive of every dead
/// letter sent it again; found by a support walk-through).
async fn a_dead_letter_its_receipts_say_arrived_needs_force(backend: Backend) {
    let app = spawn_app_with(backend, SOURCE).await;
    let rx = Receiver::start().await;
    rx.script_path("/arrived", [Reply::Status(404)]);
    rx.script_path("/lost", [Reply::Status(404)]);
    for id in ["arrived", "lost"] {
        let m = private_message(id, &rx.url_for(&format!("/{id}")));
        assert_eq!(app.post_message(m).await.status(), 201);
    }
    app.run_until_idle().await;
    let at = app.clock_now().timestamp() + 1;
    post_receipt(
        &app,
        json!({"id": "r-arrived", "type": "delivered", "at": at, "herald_event_id": "arrived"}),
    )
    .await;
    app.herald.reconciler.run_until_idle().await.unwrap();
    assert_eq!(app.row("arrived").state.as_str(), "dead_letter");
    let page: Value = get(&app, "/v1/dead-letters").await.json().await.unwrap();
    let statuses: Vec<_> = page["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["event_id"].clone(), d["delivery_status"].clone()))
        .collect();
    assert_eq!(
        statuses,
        [
            (json!("arrived"), json!("delivered")),
            (json!("lost"), Value::Null)
        ],
        "{page}"
    );
    let r = post(
        &app,
        "/v1/dead-letters/redrive",
        json!({"reason": "receiver fixed"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let report: Value = r.json().await.unwrap();
    assert_eq!(
        strings(&report["redriven"], "event_id"),
        ["lost"],
        "{report}"
    );
    assert_eq!(strings(&report["skipped"], "event_id"), ["arrived"]);
    let why = report["skipped"][0]["reason"].as_str().unwrap();
    assert!(why.contains("receipts say it arrived"), "{why}");
    let fp = fingerprint(&app, "arrived").await;
    let p = problem(replay(&app, &fp, json!({"reason": "resend"})).await, 409).await;
    assert_eq!(
        p["type"].as_str().unwrap().rsplit('/').next(),
        Some("force-required"),
        "{p}"
    );
    let r = replay(&app, &fp, json!({"reason": "resend", "force": true})).await;
    assert_eq!(r.status(), 200);
    app.run_until_idle().await;
    assert_eq!(
        rx.requests_to("/arrived").len(),
        2,
        "sent again, with force only"
    );
    app.stop().await;
}

both_backends!(
    a_url_with_credentials_is_found_by_its_host_and_says_why,
    a_dead_letter_its_receipts_say_arrived_needs_force,
    a_redrive_gets_past_the_dead_letters_it_skips,
    dead_letters_by_an_email_domain_with_or_without_a_display_name,
    delivered_and_retried_then_delivered_read_correctly,
    dead_letters_explain_and_replay_with_their_event_id,
    unconfirmed_and_expired_replay,
    forced_replays_and_refusals,
    support_routes_need_the_support_scope,
    dead_letters_list_by_keyset_and_redrive_within_bounds,
);
