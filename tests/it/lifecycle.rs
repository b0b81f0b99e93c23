//! Signatures, endpoints, email, the lease watchdog and its fence, and the production loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;

use crate::both_backends;
use crate::support::app::{SECRET, spawn_app_with, spawn_on, webhook};
use crate::support::{Backend, Receiver, Reply, TestDb, spawn_app};

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

async fn requests_verify_with_the_standard_webhooks_library(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    let body = json!({"type": "order.placed", "data": {"id": 42, "note": "ünïcode"}});
    let mut msg = webhook("order-42:placed", &rx.url, body.clone());
    msg["payload"]["headers"] = json!({"X-Tenant": "acme"});
    assert_eq!(app.post_message(msg).await.status(), 201);
    assert_eq!(app.run_until_idle().await, 1);
    let req = &rx.requests()[0];
    assert_eq!(req.method, "POST");
    assert_eq!(
        req.body,
        serde_json::to_vec(&body).unwrap(),
        "the body is exactly the serialized body"
    );
    assert_eq!(req.header("webhook-id"), Some("order-42:placed"));
    assert_eq!(req.header("idempotency-key"), Some("order-42:placed"));
    assert_eq!(req.header("content-type"), Some("application/json"));
    assert_eq!(req.header("x-tenant"), Some("acme"));
    let wh = standardwebhooks::Webhook::new(SECRET).unwrap();
    wh.verify(&req.body, &header_map(req))
        .expect("the official library verifies Herald's signature");
    // A tampered body does not verify: the check above can fail.
    let mut tampered = req.body.clone();
    tampered[2] ^= 1;
    assert!(wh.verify(&tampered, &header_map(req)).is_err());
    // The fingerprint stored on the message and on the attempt is the canonical one.
    let view = app.message("order-42:placed").await;
    let attempt = &app.attempts("order-42:placed")[0];
    assert_eq!(
        view["fingerprint"].as_str(),
        attempt.request_fingerprint.as_deref()
    );
    // And it covers the very bytes the receiver got.
    let received = herald::domain::Fingerprint::compute(&herald::domain::FingerprintInput {
        channel: "webhook",
        destination: &rx.url,
        event_id: "order-42:placed",
        body: &req.body,
        headers: &[("X-Tenant".to_owned(), "acme".to_owned())],
    });
    assert_eq!(
        attempt.request_fingerprint.as_deref(),
        Some(received.as_str())
    );
    app.stop().await;
}

/// An endpoint whose own headers pass the budget (51 of them) starts, named at start, and is
/// sent as configured: a message adding none is taken; one adding a header is refused naming
/// the endpoint (a review: every message to it was refused).
async fn an_endpoint_over_the_header_budget_takes_messages_that_add_none(backend: Backend) {
    let rx = Receiver::start().await;
    let headers: Vec<String> = (0..51).map(|i| format!("\"X-E{i}\" = \"v\"")).collect();
    let toml = format!(
        "[endpoints.full]\nurl = \"{}\"\nheaders = {{ {} }}\n",
        rx.url_for("/full"),
        headers.join(", ")
    );
    let app = spawn_app_with(backend, &toml).await;
    assert_eq!(
        app.post_message(webhook("full-1", "endpoint:full", json!({})))
            .await
            .status(),
        201
    );
    let mut more = webhook("full-2", "endpoint:full", json!({}));
    more["payload"]["headers"] = json!({"X-M": "m"});
    let r = app.post_message(more).await;
    assert_eq!(r.status(), 422);
    let p: serde_json::Value = r.json().await.unwrap();
    assert_eq!(p["errors"].as_array().map(Vec::len), Some(1), "{p}");
    assert_eq!(
        p["errors"][0]["message"], "52 headers; at most 50, endpoint \"full\"'s included",
        "{p}"
    );
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(rx.requests_to("/full")[0].header("x-e50"), Some("v"));
    app.stop().await;
}

async fn named_endpoints_rotate_secrets_and_capture_provider_ids(backend: Backend) {
    let rx = Receiver::start().await;
    let old = "whsec_b2xkc2VjcmV0b2xkc2VjcmV0b2xkc2VjcmV0";
    let new = "whsec_bmV3c2VjcmV0bmV3c2VjcmV0bmV3c2VjcmV0";
    let toml = format!(
        "[endpoints.billing]\nurl = \"{}\"\nsecrets = [\"{new}\", \"{old}\"]\n\
         headers = {{ \"X-Team\" = \"billing\" }}\nauth = {{ bearer = \"tok-123\" }}\n\
         provider_message_id_pointer = \"/data/id\"\n",
        rx.url_for("/billing")
    );
    let app = spawn_app_with(backend, &toml).await;
    rx.script_path(
        "/billing",
        [Reply::Full(
            202,
            vec![],
            r#"{"data":{"id":"rcv_77"}}"#.into(),
        )],
    );
    assert_eq!(
        app.post_message(webhook("inv-1", "endpoint:billing", json!({"total": 10})))
            .await
            .status(),
        201
    );
    // An unknown endpoint is refused at the door.
    let r = app
        .post_message(webhook("inv-2", "endpoint:nope", json!({})))
        .await;
    assert_eq!(r.status(), 422);
    // A header of the message's own that the endpoint sets (its headers, its auth): the
    // endpoint's would be sent instead, this one dropped unseen — refused, naming it.
    let mut clash = webhook("inv-3", "endpoint:billing", json!({}));
    clash["payload"]["headers"] =
        json!({"x-team": "ops", "Authorization": "Bearer mine", "X-Other": "ok"});
    let p: serde_json::Value = app.post_message(clash).await.json().await.unwrap();
    let fields: Vec<&str> = p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["field"].as_str())
        .collect();
    assert_eq!(
        fields,
        ["payload.headers.Authorization", "payload.headers.x-team"],
        "{p}"
    );
    assert!(app.db.find_by_event_id("inv-3").unwrap().is_none());
    // Written with an underscore: to a CGI, WSGI, PHP or Rack receiver the same header as the
    // endpoint's (both `HTTP_X_TEAM`, their values joined).
    let mut shadow = webhook("inv-4", "endpoint:billing", json!({}));
    shadow["payload"]["headers"] = json!({"X_Team": "ops"});
    let p: serde_json::Value = app.post_message(shadow).await.json().await.unwrap();
    assert_eq!(p["errors"][0]["field"], "payload.headers.X_Team", "{p}");
    assert!(app.db.find_by_event_id("inv-4").unwrap().is_none());
    // The message's headers and the endpoint's go in one request: 50 of the message's own
    // beside the endpoint's are more than receivers take (each was within its own limit, and a
    // receiver answered 431: dead-lettered; a walk-through).
    let mut many = webhook("inv-5", "endpoint:billing", json!({}));
    many["payload"]["headers"] = (0..50)
        .map(|i| (format!("X-H{i}"), json!("v")))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let p: serde_json::Value = app.post_message(many).await.json().await.unwrap();
    assert_eq!(p["errors"][0]["field"], "payload.headers", "{p}");
    assert!(
        p["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("endpoint \"billing\"'s included"),
        "{p}"
    );
    assert!(app.db.find_by_event_id("inv-5").unwrap().is_none());
    assert_eq!(app.run_until_idle().await, 1);
    let req = &rx.requests_to("/billing")[0];
    assert_eq!(req.header("x-team"), Some("billing"));
    assert_eq!(req.header("authorization"), Some("Bearer tok-123"));
    let sigs: Vec<_> = req
        .header("webhook-signature")
        .unwrap()
        .split(' ')
        .collect();
    assert_eq!(sigs.len(), 2, "one signature per active secret");
    for secret in [new, old] {
        standardwebhooks::Webhook::new(secret)
            .unwrap()
            .verify(&req.body, &header_map(req))
            .unwrap();
    }
    let view = app.message("inv-1").await;
    assert_eq!(view["state"], "delivered");
    assert_eq!(view["provider_message_id"], "rcv_77");
    assert_eq!(
        app.attempts("inv-1")[0].provider_message_id.as_deref(),
        Some("rcv_77")
    );
    app.stop().await;
}

/// A receiver that echoes the request it got into its error (as httpbin's `/anything` does, and
/// many a framework's debug page): the endpoint's credentials, header values and query values it
/// repeats are hidden in the attempt's stored excerpt — written as sent and with `/` escaped
/// (PHP's JSON). Before, the bearer token was stored in clear. (The explanation never shows a
/// receiver's words; it is checked too.)
async fn an_answer_echoing_the_endpoints_credentials_keeps_them_out_of_the_excerpt(
    backend: Backend,
) {
    let rx = Receiver::start().await;
    let toml = format!(
        "[endpoints.crm]\nurl = \"{}?key=qk_9f8e7d6c5b4a\"\n\
         headers = {{ \"X-Api-Key\" = \"hk/0123abcd+\" }}\n\
         auth = {{ basic = {{ username = \"herald\", password = \"pw_s3cr3t/x\" }} }}\n\
         [endpoints.billing]\nurl = \"{}\"\nauth = {{ bearer = \"tok_live_4242abcd\" }}\n",
        rx.url_for("/crm"),
        rx.url_for("/billing"),
    );
    let app = spawn_app_with(backend, &toml).await;
    let crm = "/crm?key=qk_9f8e7d6c5b4a";
    rx.script_path(crm, [Reply::Echo(400)]);
    rx.script_path("/billing", [Reply::Echo(422)]);
    for (id, to) in [
        ("echo-crm", "endpoint:crm"),
        ("echo-billing", "endpoint:billing"),
    ] {
        assert_eq!(
            app.post_message(webhook(id, to, json!({}))).await.status(),
            201
        );
    }
    assert_eq!(app.run_until_idle().await, 2);
    let basic = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode("herald:pw_s3cr3t/x")
    };
    for id in ["echo-crm", "echo-billing"] {
        let a = &app.attempts(id)[0];
        let excerpt = a.response_excerpt.clone().unwrap_or_default();
        assert!(excerpt.contains("[secret]"), "{id}: {excerpt}");
        let explained = app.explain(id).await.to_string();
        for secret in [
            "qk_9f8e7d6c5b4a",
            "hk/0123abcd+",
            "hk\\/0123abcd+",
            basic.as_str(),
            "tok_live_4242abcd",
        ] {
            assert!(!excerpt.contains(secret), "{id}: {secret} in {excerpt}");
            assert!(!explained.contains(secret), "{id}: {secret} in {explained}");
        }
    }
    // What the receiver got: the credentials themselves (the test would pass on a receiver that
    // echoed nothing, were they not).
    let crm = &rx.requests_to(crm)[0];
    assert_eq!(crm.header("x-api-key"), Some("hk/0123abcd+"));
    assert_eq!(
        crm.header("authorization"),
        Some(format!("Basic {basic}").as_str())
    );
    app.stop().await;
}

async fn email_goes_to_the_mail_directory(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_app_with(
        backend,
        &format!("mail_dir = \"{}\"\n", dir.path().display()),
    )
    .await;
    let r = app
        .post_message(json!({
            "event_id": "welcome-7",
            "channel": "email",
            "destination": "Ada <ada@example.com>",
            "payload": {"subject": "Welcome", "text": "Hello Ada", "html": "<p>Hello Ada</p>",
                        "headers": {"X-Campaign": "onboarding"}},
        }))
        .await;
    assert_eq!(r.status(), 201);
    assert_eq!(app.run_until_idle().await, 1);
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let eml = std::fs::read_to_string(&files[0]).unwrap();
    let message_id = herald::channels::email::message_id("welcome-7", "herald.localhost");
    assert!(eml.contains(&format!("Message-ID: {message_id}")), "{eml}");
    assert!(eml.contains("X-Herald-Event-Id: welcome-7"));
    assert!(eml.contains("X-Campaign: onboarding"));
    assert!(eml.contains("To: Ada <ada@example.com>"));
    assert!(eml.contains("Subject: Welcome"));
    assert_eq!(app.message("welcome-7").await["state"], "delivered");
    // No server was asked: no reply code, and the explanation does not say a receiver took it.
    let a = &app.attempts("welcome-7")[0];
    assert_eq!(
        (
            a.response_status,
            a.error_kind.as_deref(),
            a.delay_reason.as_deref()
        ),
        (
            None,
            Some("written_to_file"),
            Some("written to the mail directory (no SMTP relay)")
        )
    );
    let explained = app.explain("welcome-7").await;
    let words = explained["explanation"].as_str().unwrap_or_default();
    assert!(
        words.contains("was written as an .eml file to the mail directory")
            && words.contains("to the directory, not to any mail server")
            && !words.contains("receiver accepted"),
        "{words}"
    );
    app.stop().await;
}

async fn cancel_only_before_sending(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    let cancel = |id: &str| {
        app.http
            .post(format!("{}/v1/messages/{id}/cancel", app.base))
            .send()
    };
    let mut later = webhook("later", &rx.url, json!({}));
    later["scheduled_at"] = json!((chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339());
    assert_eq!(app.post_message(later).await.status(), 201);
    assert_eq!(
        app.post_message(webhook("now", &rx.url, json!({})))
            .await
            .status(),
        201
    );
    let r = cancel("later").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["state"],
        "canceled"
    );
    assert_eq!(
        cancel("later").await.unwrap().status(),
        200,
        "canceling twice is harmless"
    );
    assert_eq!(app.run_until_idle().await, 1);
    let r = cancel("now").await.unwrap();
    assert_eq!(r.status(), 409, "a delivered message cannot be canceled");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(cancel("missing").await.unwrap().status(), 404);
    app.advance(Duration::from_secs(7200));
    assert_eq!(
        app.run_until_idle().await,
        0,
        "a canceled message is never sent"
    );
    assert_eq!(rx.requests().len(), 1);
    app.stop().await;
}

async fn expired_leases_return_and_the_fence_holds(backend: Backend) {
    use herald::storage::models::Applied;
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    // Its lease runs out 31 s on, its retry would come a second or so after: past its expiry.
    let expires = (app.clock_now() + chrono::Duration::milliseconds(31_500)).to_rfc3339();
    for (id, extra) in [
        ("lease-alo", json!({})),
        ("lease-amo", json!({"semantics": "at_most_once"})),
        ("lease-last", json!({"max_attempts": 1})),
        ("lease-expiring", json!({"expires_at": expires})),
    ] {
        let mut m = webhook(id, &rx.url, json!({}));
        m.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        assert_eq!(app.post_message(m).await.status(), 201);
    }
    // One written by SQL, which has no fingerprint until an outcome records it.
    app.raw_sql(&format!(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload, semantics) VALUES \
         ('lease-sql', 'webhook', '{}', '{{\"body\": {{\"n\": 1}}}}', 'at_most_once')",
        rx.url
    ));
    assert_eq!(app.row("lease-sql").request_fingerprint, None);
    // A sender claims and then "crashes": nothing is sent, nothing is written back.
    let claimed = app.herald.sender.claim(10).await.unwrap();
    assert_eq!(claimed.len(), 5);
    assert!(
        claimed
            .iter()
            .all(|r| r.state == "sending" && r.attempts == 1)
    );
    let sweep = app.herald.sender.sweep_leases().await.unwrap();
    assert_eq!(sweep.total(), 0, "leases still valid");
    app.advance(Duration::from_secs(31));
    let sweep = app.herald.sender.sweep_leases().await.unwrap();
    assert_eq!(
        (
            sweep.to_retryable,
            sweep.to_unconfirmed,
            sweep.to_dead_letter,
            sweep.to_expired
        ),
        (1, 2, 1, 1)
    );
    // The watchdog records the SQL one's fingerprint, as its sender's outcome would have: the
    // one its payload defines (a walk-through found such a message without one).
    let expected = herald::outbox::fingerprint_of(
        herald::domain::Channel::Webhook,
        &rx.url,
        "lease-sql",
        &json!({"body": {"n": 1}}),
    )
    .map(|f| f.as_str().to_owned());
    assert!(expected.is_some());
    assert_eq!(app.row("lease-sql").request_fingerprint, expected);
    assert_eq!(app.attempts("lease-sql")[0].request_fingerprint, expected);
    assert_eq!(app.message("lease-expiring").await["state"], "expired");
    let alo = app.message("lease-alo").await;
    assert_eq!(
        (alo["state"].as_str(), alo["last_error_class"].as_str()),
        (Some("retryable"), Some("ambiguous"))
    );
    assert_eq!(app.message("lease-amo").await["state"], "unconfirmed");
    // Each expired lease has its attempt in the timeline.
    let a = app.attempts("lease-amo");
    assert_eq!(a.len(), 1);
    assert_eq!(
        (
            a[0].class.as_str(),
            a[0].error_kind.as_deref(),
            a[0].next_state.as_str()
        ),
        ("ambiguous", Some("lease_expired"), "unconfirmed")
    );
    assert_eq!(app.attempts("lease-last")[0].next_state, "dead_letter");
    let last = app.message("lease-last").await;
    assert_eq!(
        (last["state"].as_str(), last["last_error_class"].as_str()),
        (Some("dead_letter"), Some("exhausted"))
    );
    // The crashed sender comes back with its stale outcome: refused, the row is no longer sending.
    let stale_row = claimed
        .into_iter()
        .find(|r| r.event_id == "lease-alo")
        .unwrap();
    let stale = app.herald.sender.process(stale_row).await;
    assert_eq!(
        app.herald.sender.record(vec![stale.clone()]).await.unwrap(),
        [Applied::LeaseLost]
    );
    assert_eq!(app.message("lease-alo").await["state"], "retryable");
    // An expired lease backs off like any ambiguous attempt (a poison message cannot
    // crash-loop the fleet): not due at once.
    assert!(app.herald.sender.claim(10).await.unwrap().is_empty());
    let row = app.row("lease-alo");
    let backoff = row.next_attempt_at.unwrap() - row.updated_at;
    assert!(
        (800..=1200).contains(&backoff.num_milliseconds()),
        "base 1 s ± 20 %: {backoff}"
    );
    app.advance(Duration::from_secs(2));
    // The same owner claims the row again (attempt 2): the attempt-1 outcome is still refused.
    let again = app.herald.sender.claim(10).await.unwrap();
    assert_eq!((again.len(), again[0].attempts), (1, 2));
    assert_eq!(
        app.herald.sender.record(vec![stale]).await.unwrap(),
        [Applied::LeaseLost]
    );
    assert_eq!(app.message("lease-alo").await["state"], "sending");
    let fresh = app
        .herald
        .sender
        .process(again.into_iter().next().unwrap())
        .await;
    assert_eq!(
        app.herald.sender.record(vec![fresh]).await.unwrap(),
        [Applied::Yes]
    );
    let alo = app.message("lease-alo").await;
    assert_eq!(
        (alo["state"].as_str(), alo["attempts"].as_i64()),
        (Some("delivered"), Some(2))
    );
    let ids = rx.event_ids();
    assert_eq!(
        ids,
        ["lease-alo", "lease-alo"],
        "the stale send and the retry; never the others"
    );
    app.stop().await;
}

async fn the_production_loop_delivers_and_shuts_down_cleanly(backend: Backend) {
    let test_db = TestDb::new(backend);
    let app = spawn_on(test_db, "").await;
    let rx = Receiver::start().await;
    let sender = app.start_sender();
    for i in 0..20 {
        assert_eq!(
            app.post_message(webhook(&format!("loop-{i}"), &rx.url, json!({"i": i})))
                .await
                .status(),
            201
        );
    }
    rx.wait_for(20, 30).await;
    // In flight at shutdown: a slow answer still gets recorded.
    rx.script([Reply::Hang]);
    assert_eq!(
        app.post_message(webhook("loop-slow", &rx.url, json!({})))
            .await
            .status(),
        201
    );
    rx.wait_for(21, 30).await;
    sender.stop().await;
    for i in 0..20 {
        assert_eq!(
            app.message(&format!("loop-{i}")).await["state"],
            "delivered"
        );
    }
    let slow = app.message("loop-slow").await;
    assert_eq!(
        (slow["state"].as_str(), slow["last_error_class"].as_str()),
        (Some("retryable"), Some("ambiguous"))
    );
    assert!(
        app.row("loop-slow").lease_owner.is_none(),
        "no lease left behind"
    );
    app.stop().await;
}

/// Waits until `event_id`'s row is claimed (`sending`) and the sender holds the claim: the claim
/// loop took it while every send slot was taken, so it waits for one.
async fn wait_until_claimed(app: &crate::support::app::TestApp, event_id: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let held = |row: &herald::storage::models::OutboxRow| {
        row.state == herald::domain::State::Sending
            && app.herald.sender.holds_claim(row.id, row.attempts)
    };
    while !held(&app.row(event_id)) {
        assert!(
            std::time::Instant::now() < deadline,
            "{event_id} was never claimed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `slots` send slots, each held by a send whose answer the receiver holds (`held-N`, released
/// one by one through the returned handles); `slots` more messages (`waiting-N`) are claimed
/// meanwhile and wait for a slot — the first in the send loop's hand, the others in the claim
/// loop's batch. A 10 s webhook timeout (lease 30 s): the held sends outlast any test step.
async fn slots_held(
    backend: Backend,
    slots: usize,
) -> (
    crate::support::app::TestApp,
    Receiver,
    Vec<Arc<tokio::sync::Notify>>,
    crate::support::app::RunningSender,
) {
    slots_held_expiring(backend, slots, None).await
}

/// [`slots_held`], the waiting messages expiring `expires_in` after they are posted.
async fn slots_held_expiring(
    backend: Backend,
    slots: usize,
    expires_in: Option<Duration>,
) -> (
    crate::support::app::TestApp,
    Receiver,
    Vec<Arc<tokio::sync::Notify>>,
    crate::support::app::RunningSender,
) {
    let app = spawn_app_with(
        backend,
        &format!(
            "sender_concurrency = {slots}\nsender_batch_size = {slots}\n\
             destination_max_in_flight = {slots}\nwebhook_timeout_ms = 10000\n"
        ),
    )
    .await;
    let rx = Receiver::start().await;
    let releases: Vec<_> = (0..slots)
        .map(|_| Arc::new(tokio::sync::Notify::new()))
        .collect();
    rx.script(releases.iter().map(|r| Reply::Held(r.clone(), 200)));
    let sender = app.start_sender();
    for i in 0..slots {
        let id = format!("held-{i}");
        let r = app
            .post_message(webhook(&id, &rx.url, json!({"n": i})))
            .await;
        assert_eq!(r.status(), 201);
    }
    rx.wait_for(slots, 10).await;
    for i in 0..slots {
        let id = format!("waiting-{i}");
        let mut msg = webhook(&id, &rx.url, json!({"n": i}));
        if let Some(d) = expires_in {
            msg["expires_at"] = json!((app.clock_now() + d).to_rfc3339());
        }
        let r = app.post_message(msg).await;
        assert_eq!(r.status(), 201);
        wait_until_claimed(&app, &id).await;
    }
    (app, rx, releases, sender)
}

async fn held_reason(app: &crate::support::app::TestApp, reason: &str) -> f64 {
    let (_, m) = crate::support::prom::scrape(&app.http, &app.base).await;
    crate::support::prom::value(&m, "herald_held_total", &[("reason", reason)])
}

/// At shutdown, claimed messages that never got a send slot go back unsent — the one in the
/// send loop's hand and the one still in the claim loop's batch: due again, their attempt not
/// spent, no request and no attempt row. The ones in flight finish and are recorded.
async fn claimed_rows_without_a_slot_go_back_at_shutdown(backend: Backend) {
    let (app, rx, releases, sender) = slots_held(backend, 2).await;
    sender.signal();
    for r in &releases {
        r.notify_one();
    }
    sender.join().await;
    let mut sent = rx.event_ids();
    sent.sort();
    assert_eq!(sent, ["held-0", "held-1"], "the waiting ones are not sent");
    for id in ["held-0", "held-1"] {
        assert_eq!(app.message(id).await["state"], "delivered", "{id}");
    }
    for id in ["waiting-0", "waiting-1"] {
        let row = app.row(id);
        assert_eq!(
            (
                row.state,
                row.attempts,
                row.last_error_class,
                row.lease_owner.as_deref()
            ),
            (
                herald::domain::State::Retryable,
                0,
                Some(herald::domain::AttemptClass::NotSent),
                None
            ),
            "{id}"
        );
        assert!(
            row.next_attempt_at.unwrap() <= app.clock_now(),
            "{id}: due at once"
        );
        assert!(
            app.attempts(id).is_empty(),
            "{id}: no request, no attempt row"
        );
    }
    assert_eq!(held_reason(&app, "shutdown").await, 2.0);
    app.stop().await;
}

/// A claimed message waits for a send slot only while its lease still outlasts a whole send
/// (lease 30 s, longest send 10 s here): past that it goes back unsent, due at once, and is
/// claimed again and sent — once — with a fresh lease.
async fn a_claimed_row_that_waited_too_long_for_a_slot_goes_back(backend: Backend) {
    let (app, rx, releases, sender) = slots_held(backend, 2).await;
    app.advance(Duration::from_secs(25));
    for r in &releases {
        r.notify_one();
    }
    rx.wait_for(4, 10).await;
    sender.stop().await;
    let mut sent = rx.event_ids();
    sent.sort();
    assert_eq!(sent, ["held-0", "held-1", "waiting-0", "waiting-1"]);
    for id in ["waiting-0", "waiting-1"] {
        let m = app.message(id).await;
        assert_eq!(
            (m["state"].as_str(), m["attempts"].as_i64()),
            (Some("delivered"), Some(1)),
            "{id}: sent once, after being put back without spending an attempt"
        );
        assert_eq!(app.attempts(id).len(), 1, "{id}");
    }
    assert_eq!(held_reason(&app, "lease").await, 2.0);
    assert_eq!(held_reason(&app, "shutdown").await, 0.0);
    app.stop().await;
}

/// A message claimed before its `expires_at` that is still waiting for a send slot when that
/// time passes is not sent: it ends `expired`, its attempt not spent, with no request and no
/// attempt row.
async fn a_message_that_expires_while_waiting_for_a_slot_is_not_sent(backend: Backend) {
    let (app, rx, releases, sender) =
        slots_held_expiring(backend, 1, Some(Duration::from_secs(5))).await;
    // Past its expiry, well inside its lease (30 s; a send may take 10).
    app.advance(Duration::from_secs(10));
    releases[0].notify_one();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while app.row("waiting-0").state == herald::domain::State::Sending {
        assert!(
            std::time::Instant::now() < deadline,
            "waiting-0 never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sender.stop().await;
    assert_eq!(rx.event_ids(), ["held-0"], "the expired one is not sent");
    let row = app.row("waiting-0");
    assert_eq!(
        (row.state, row.attempts, row.lease_owner.as_deref()),
        (herald::domain::State::Expired, 0, None)
    );
    assert!(app.attempts("waiting-0").is_empty(), "no attempt row");
    assert_eq!(held_reason(&app, "lease").await, 0.0);
    app.stop().await;
}

/// A send that panics leaves no row `sending` for good: the production loop lets go of its
/// claim, and once the lease has run out this process's own watchdog returns the row (an
/// ambiguous attempt, as after a crash); it is then sent, once.
async fn a_send_that_panics_is_left_to_the_lease_watchdog(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    let panicked = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let once = panicked.clone();
    assert!(app.herald.sender.set_before_send(Box::new(move |event_id| {
        if event_id == "boom" && !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
            panic!("a send panics (test)");
        }
    })));
    let sender = app.start_sender();
    let r = app.post_message(webhook("boom", &rx.url, json!({}))).await;
    assert_eq!(r.status(), 201);
    let id = app.row("boom").id;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !panicked.load(std::sync::atomic::Ordering::SeqCst)
        || app.herald.sender.holds_claim(id, 1)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the claim is still held after the panic"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(app.row("boom").state, herald::domain::State::Sending);
    // Past its lease and any backoff: the watchdog returns it, and it is sent.
    app.advance(Duration::from_secs(3600));
    app.herald.sender.sweep_leases().await.unwrap();
    app.herald.wake.notify_one();
    rx.wait_for(1, 10).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while app.row("boom").state != herald::domain::State::Delivered {
        assert!(std::time::Instant::now() < deadline, "boom not delivered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sender.stop().await;
    assert_eq!(rx.event_ids(), ["boom"], "one request");
    let attempts = app.attempts("boom");
    assert_eq!(
        attempts.iter().map(|a| a.class).collect::<Vec<_>>(),
        [
            herald::domain::AttemptClass::Ambiguous,
            herald::domain::AttemptClass::Accepted
        ]
    );
    app.stop().await;
}

/// A receiver's message id with a NUL in it (PostgreSQL text refuses NUL) is stored with the NUL
/// replaced, as in receipts; the outcomes written with it — its own and its batch's — land.
async fn a_receivers_id_with_a_nul_in_it_is_stored_without_it(backend: Backend) {
    let rx = Receiver::start().await;
    let toml = format!(
        "[endpoints.esp]\nurl = \"{}\"\nprovider_message_id_pointer = \"/id\"\n",
        rx.url_for("/esp")
    );
    let app = spawn_app_with(backend, &toml).await;
    rx.script_path(
        "/esp",
        [Reply::Full(200, vec![], r#"{"id":"a\u0000b"}"#.into())],
    );
    for (id, to) in [("nul-id", "endpoint:esp"), ("plain", rx.url.as_str())] {
        let r = app.post_message(webhook(id, to, json!({"n": 1}))).await;
        assert_eq!(r.status(), 201);
    }
    assert_eq!(app.run_until_idle().await, 2);
    for id in ["nul-id", "plain"] {
        assert_eq!(app.message(id).await["state"], "delivered", "{id}");
        assert_eq!(app.attempts(id).len(), 1, "{id}");
    }
    assert_eq!(
        app.row("nul-id").provider_message_id.as_deref(),
        Some("a\u{FFFD}b")
    );
    assert_eq!(
        app.attempts("nul-id")[0].provider_message_id.as_deref(),
        Some("a\u{FFFD}b")
    );
    app.stop().await;
}

/// This process's watchdog never returns a row this process claimed and still holds, even once
/// its lease has run out: here one waits for a slot (its lease over, no request made) and one is
/// in flight. Returning the waiting one would count an attempt that was never made.
async fn the_watchdog_leaves_rows_this_process_holds(backend: Backend) {
    let (app, rx, releases, sender) = slots_held(backend, 1).await;
    app.advance(Duration::from_secs(31));
    let sweep = app.herald.sender.sweep_leases().await.unwrap();
    assert_eq!(sweep, herald::storage::models::LeaseSweep::default());
    let waiting = app.row("waiting-0");
    assert_eq!(
        (waiting.state, waiting.attempts),
        (herald::domain::State::Sending, 1),
        "left alone"
    );
    releases[0].notify_one();
    rx.wait_for(2, 10).await;
    sender.stop().await;
    for id in ["held-0", "waiting-0"] {
        let m = app.message(id).await;
        assert_eq!(
            (m["state"].as_str(), m["attempts"].as_i64()),
            (Some("delivered"), Some(1)),
            "{id}"
        );
    }
    assert!(
        app.attempts("waiting-0")
            .iter()
            .all(|a| a.class != herald::domain::AttemptClass::Ambiguous),
        "no lease_expired attempt"
    );
    assert_eq!(held_reason(&app, "lease").await, 1.0);
    app.stop().await;
}

async fn notify_wakes_the_sender_on_commit() {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    let app = spawn_app(Backend::Postgres).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let wake = Arc::new(tokio::sync::Notify::new());
    let t = herald::sender::listener::spawn(
        &app.db,
        app.test_db.url.clone(),
        wake.clone(),
        stop.clone(),
    );
    // The listener wakes once when it (re)connects; take that one first.
    tokio::time::timeout(Duration::from_secs(10), wake.notified())
        .await
        .expect("listener connected");
    let mut c = diesel::pg::PgConnection::establish(&app.test_db.url).unwrap();
    let insert = "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
                  VALUES ('{id}', 'webhook', 'https://x.example/h', '{\"body\": 1}')";
    // PostgreSQL delivers notifications at commit only (a rolled-back insert wakes nobody; not
    // asserted here: a negative would need a wait).
    c.batch_execute(&format!(
        "BEGIN; {}; ROLLBACK;",
        insert.replace("{id}", "rolled-back")
    ))
    .unwrap();
    c.batch_execute(&format!(
        "BEGIN; {}; COMMIT;",
        insert.replace("{id}", "committed")
    ))
    .unwrap();
    tokio::time::timeout(Duration::from_secs(10), wake.notified())
        .await
        .expect("woken by NOTIFY after commit");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::task::spawn_blocking(move || t.join().unwrap())
        .await
        .unwrap();
    app.stop().await;
}

/// One outcome the database refuses costs the rest of its batch nothing: the production loop's
/// flusher writes that batch again one outcome at a time, so the others land at once (delivered,
/// one request each) and only the refused one waits. Here a trigger refuses `poison`'s outcome
/// until it is dropped, and the test's lock on `blocker`'s row holds the flusher inside the write
/// before, so that `poison` and the others queue up and come in one batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_outcome_costs_its_batch_nothing() {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    let app = spawn_app_with(
        Backend::Postgres,
        "sender_concurrency = 8\nsender_batch_size = 8\ndestination_max_in_flight = 8\n",
    )
    .await;
    app.raw_sql(
        "CREATE FUNCTION test_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF NEW.event_id = 'poison' AND NEW.state <> 'sending' THEN \
             RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$; \
         CREATE TRIGGER test_poison BEFORE UPDATE ON herald_outbox \
           FOR EACH ROW EXECUTE FUNCTION test_poison();",
    );
    let rx = Receiver::start().await;
    let release = Arc::new(tokio::sync::Notify::new());
    rx.script_path("/blocker", [Reply::Held(release.clone(), 200)]);
    let sender = app.start_sender();
    let r = app
        .post_message(webhook("blocker", &rx.url_for("/blocker"), json!({})))
        .await;
    assert_eq!(r.status(), 201);
    rx.wait_for(1, 10).await;
    // The blocker's row locked by another transaction: its outcome's write waits for it.
    let (locked_tx, locked) = std::sync::mpsc::channel();
    let (unlock, unlock_rx) = std::sync::mpsc::channel::<()>();
    let url = app.test_db.url.clone();
    let holder = std::thread::spawn(move || {
        let mut c = diesel::pg::PgConnection::establish(&url).unwrap();
        c.batch_execute("BEGIN; SELECT 1 FROM herald_outbox WHERE event_id = 'blocker' FOR UPDATE")
            .unwrap();
        locked_tx.send(()).unwrap();
        let _ = unlock_rx.recv();
        c.batch_execute("COMMIT").unwrap();
    });
    locked.recv().unwrap();
    // Until `n` attempts are classified: their outcomes are then on their way to the flusher.
    let (http, base) = (&app.http, &app.base);
    let classified = |n: f64| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (_, m) = crate::support::prom::scrape(http, base).await;
            let accepted = crate::support::prom::value(
                &m,
                "herald_attempts_total",
                &[("channel", "webhook"), ("class", "accepted")],
            );
            if accepted >= n {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "attempts: {accepted}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    release.notify_one();
    classified(1.0).await;
    for id in ["poison", "ok-1", "ok-2", "ok-3"] {
        let r = app.post_message(webhook(id, &rx.url, json!({}))).await;
        assert_eq!(r.status(), 201);
    }
    // Queued behind the blocked write.
    classified(5.0).await;
    unlock.send(()).unwrap();
    holder.join().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for id in ["blocker", "ok-1", "ok-2", "ok-3"] {
        while app.row(id).state != herald::domain::State::Delivered {
            assert!(std::time::Instant::now() < deadline, "{id} not delivered");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_eq!(app.row("poison").state, herald::domain::State::Sending);
    // Once the database takes it, the refused outcome lands too.
    app.raw_sql("DROP TRIGGER test_poison ON herald_outbox");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while app.row("poison").state != herald::domain::State::Delivered {
        assert!(std::time::Instant::now() < deadline, "poison not delivered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sender.stop().await;
    for id in ["blocker", "poison", "ok-1", "ok-2", "ok-3"] {
        assert_eq!(
            rx.event_ids().iter().filter(|e| *e == id).count(),
            1,
            "{id}: one request"
        );
        assert_eq!(app.attempts(id).len(), 1, "{id}");
    }
    app.stop().await;
}

/// SQLite has no NOTIFY: the production loop is woken by the insert watch for rows an
/// application commits by plain SQL on a connection of its own, each sent at once although the
/// poll comes only once an hour here (the first row may meet the start-up claim; the second,
/// inserted once the first has arrived, only the watch can bring); and one inserted while
/// Herald itself keeps writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_by_sql_wakes_the_sender_on_sqlite() {
    let app = spawn_app_with(Backend::Sqlite, "poll_interval_ms = 3600000\n").await;
    let rx = Receiver::start().await;
    let sender = app.start_sender();
    for i in 1..=2 {
        app.raw_sql(&format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             VALUES ('by-sql-{i}', 'webhook', '{}', '{{\"body\": {i}}}')",
            rx.url
        ));
        rx.wait_for(i, 10).await;
    }
    // Among Herald's own writes (enqueues for an hour ahead, each a WAL write that makes the
    // watch look and find nothing worth waking for): the application's row is still found.
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let (enqueued, done) = (AtomicUsize::new(0), AtomicBool::new(false));
    // Four clients at once, so that Herald's writer writes without a break: the watch then looks
    // only every 10 ms.
    let client = || async {
        while !done.load(Ordering::SeqCst) {
            let n = enqueued.fetch_add(1, Ordering::SeqCst);
            let mut m = webhook(&format!("later-{n}"), &rx.url, json!({}));
            m["scheduled_at"] = json!(later);
            assert_eq!(app.post_message(m).await.status(), 201);
        }
    };
    let own_writes = futures_util::future::join_all((0..4).map(|_| client()));
    let among_them = async {
        while enqueued.load(Ordering::SeqCst) < 200 {
            tokio::task::yield_now().await;
        }
        app.raw_sql(&format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             VALUES ('by-sql-3', 'webhook', '{}', '{{\"body\": 3}}')",
            rx.url
        ));
        rx.wait_for(3, 10).await;
        done.store(true, Ordering::SeqCst);
    };
    tokio::join!(own_writes, among_them);
    sender.stop().await;
    assert_eq!(rx.event_ids(), ["by-sql-1", "by-sql-2", "by-sql-3"]);
    assert_eq!(app.message("by-sql-2").await["state"], "delivered");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_on_postgres() {
    notify_wakes_the_sender_on_commit().await
}

/// A destination Herald's API now refuses as not written as meant (`http:/host`, a leading
/// space) but that an application's SQL insert wrote, or that was stored before: sent as the URL
/// parser takes it, as it always was — not dead-lettered at its next claim.
async fn a_stored_url_the_api_would_refuse_is_still_sent(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    let port = url::Url::parse(&rx.url).unwrap().port().unwrap();
    app.raw_sql(&format!(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) VALUES \
         ('one-slash', 'webhook', 'http:/127.0.0.1:{port}/a', '{{\"body\": {{}}}}'), \
         ('spaced', 'webhook', ' http://127.0.0.1:{port}/b', '{{\"body\": {{}}}}')"
    ));
    assert_eq!(app.run_until_idle().await, 2);
    for id in ["one-slash", "spaced"] {
        assert_eq!(app.message(id).await["state"], "delivered", "{id}");
    }
    let mut paths: Vec<String> = rx.requests().iter().map(|r| r.path.clone()).collect();
    paths.sort();
    assert_eq!(paths, ["/a", "/b"]);
    app.stop().await;
}

both_backends!(
    a_stored_url_the_api_would_refuse_is_still_sent,
    an_answer_echoing_the_endpoints_credentials_keeps_them_out_of_the_excerpt,
    requests_verify_with_the_standard_webhooks_library,
    named_endpoints_rotate_secrets_and_capture_provider_ids,
    an_endpoint_over_the_header_budget_takes_messages_that_add_none,
    email_goes_to_the_mail_directory,
    cancel_only_before_sending,
    expired_leases_return_and_the_fence_holds,
    the_production_loop_delivers_and_shuts_down_cleanly,
    claimed_rows_without_a_slot_go_back_at_shutdown,
    a_claimed_row_that_waited_too_long_for_a_slot_goes_back,
    the_watchdog_leaves_rows_this_process_holds,
    a_message_that_expires_while_waiting_for_a_slot_is_not_sent,
    a_receivers_id_with_a_nul_in_it_is_stored_without_it,
    a_send_that_panics_is_left_to_the_lease_watchdog,
);

async fn smtp_answers_are_classified(backend: Backend) {
    let sink = crate::support::smtp_sink::SmtpSink::start().await;
    let app = spawn_app_with(backend, &format!("smtp_url = \"{}\"\n", sink.url)).await;
    for (id, to) in [
        ("mail-250", "ada@example.com"),
        ("mail-451", "t451@example.com"),
        ("mail-550", "t550@example.com"),
        ("mail-stall", "stall@example.com"),
    ] {
        let r = app
            .post_message(json!({
                "event_id": id, "channel": "email", "destination": to,
                "payload": {"subject": "Hi", "text": "Hello"},
            }))
            .await;
        assert_eq!(r.status(), 201);
    }
    // One pass: the stalled send takes the whole SMTP timeout, long enough for the 451's retry to
    // fall due, which run_until_idle would then send.
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 4);
    let expect = [
        ("mail-250", "delivered", "accepted", Some(250)),
        ("mail-451", "retryable", "transient", Some(451)),
        ("mail-550", "dead_letter", "permanent", Some(550)),
        ("mail-stall", "retryable", "ambiguous", None),
    ];
    for (id, state, class, code) in expect {
        assert_eq!(app.message(id).await["state"], state, "{id}");
        let a = &app.attempts(id)[0];
        assert_eq!((a.class.as_str(), a.response_status), (class, code), "{id}");
    }
    let mails = sink.accepted();
    assert_eq!(mails.len(), 1);
    assert_eq!(mails[0].rcpt, "<ada@example.com>");
    let id = herald::channels::email::message_id("mail-250", "herald.localhost");
    assert!(mails[0].data.contains(&format!("Message-ID: {id}")));
    assert!(mails[0].data.contains("X-Herald-Event-Id: mail-250"));
    app.stop().await;
}

both_backends!(smtp_answers_are_classified);
