//! Per-destination limits on both backends: a named endpoint's rate (held messages come back at
//! their slots, in order, their attempts unspent), the cap on sends in flight to one host (a
//! hanging destination does not take every send slot), and the automatic disabling of an
//! endpoint that keeps failing, ended only by an explicit call.

use std::time::Duration;

use herald::domain::{AttemptClass, State};
use serde_json::json;

use crate::both_backends;
use crate::support::app::{client_with_token, spawn_app_with, webhook};
use crate::support::prom::{scrape, value};
use crate::support::{Backend, Receiver, Reply};

async fn an_endpoint_rate_holds_messages_for_their_slots_in_order(backend: Backend) {
    let rx = Receiver::start().await;
    let app = spawn_app_with(
        backend,
        &format!(
            "[endpoints.paced]\nurl = \"{}\"\nrate_limit_per_second = 2\nburst = 1\n",
            rx.url
        ),
    )
    .await;
    let ids = ["p-1", "p-2", "p-3", "p-4"];
    for id in ids {
        let r = app
            .post_message(webhook(id, "endpoint:paced", json!({})))
            .await;
        assert_eq!(r.status(), 201);
    }
    assert_eq!(app.run_until_idle().await, 4);
    assert_eq!(rx.event_ids(), ["p-1"], "one slot now");
    // The others wait for their slots, half a second apart, in their order, attempts unspent.
    let held: Vec<_> = ids[1..].iter().map(|id| app.row(id)).collect();
    for (row, id) in held.iter().zip(&ids[1..]) {
        assert_eq!(
            (row.state, row.attempts, row.last_error_class),
            (State::Retryable, 0, Some(AttemptClass::RateLimited)),
            "{id}"
        );
        assert!(
            app.attempts(id).is_empty(),
            "{id}: no request, no attempt row"
        );
    }
    let (_, m) = scrape(&app.http, &app.base).await;
    assert_eq!(
        value(&m, "herald_held_total", &[("reason", "rate_limit")]),
        3.0
    );
    // Support reads why a message without an attempt waits; the one sent says nothing of it.
    let held_words = "Herald put it back without making a request";
    let words = app.explain("p-2").await["explanation"].to_string();
    assert!(words.contains(held_words), "{words}");
    let words = app.explain("p-1").await["explanation"].to_string();
    assert!(!words.contains(held_words), "{words}");
    for pair in held.windows(2) {
        let gap = (pair[1].next_attempt_at.unwrap() - pair[0].next_attempt_at.unwrap())
            .num_milliseconds();
        assert!((450..=550).contains(&gap), "slots {gap} ms apart");
    }
    // Each comes back at its slot and goes; nothing goes before its slot.
    for n in 2..=4 {
        app.advance(Duration::from_millis(500));
        app.run_until_idle().await;
        assert_eq!(rx.event_ids(), ids[..n], "after {n} slots");
    }
    for id in ids {
        assert_eq!(app.row(id).attempts, 1, "{id}");
        assert_eq!(app.row(id).state, State::Delivered, "{id}");
    }
    app.stop().await;
}

async fn a_hanging_host_gets_at_most_its_cap_of_send_slots(backend: Backend) {
    let slow = Receiver::start().await;
    let fast = Receiver::start().await;
    slow.script([Reply::Hang, Reply::Hang]);
    // The slow host:port gets a cap of two; every other destination the default (half of 8).
    let slow_host = slow
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/hook");
    let app = spawn_app_with(
        backend,
        &format!("sender_concurrency = 8\n[destinations.\"{slow_host}\"]\nmax_in_flight = 2\n"),
    )
    .await;
    for i in 0..5 {
        let r = app
            .post_message(webhook(&format!("slow-{i}"), &slow.url, json!({})))
            .await;
        assert_eq!(r.status(), 201);
    }
    for i in 0..3 {
        let r = app
            .post_message(webhook(&format!("fast-{i}"), &fast.url, json!({})))
            .await;
        assert_eq!(r.status(), 201);
    }
    // One claim of all eight: two go to the hanging host, three are put back, the other host's
    // three go out at once.
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 8);
    assert_eq!(slow.requests().len(), 2);
    assert_eq!(fast.requests().len(), 3);
    for i in 0..3 {
        assert_eq!(app.row(&format!("fast-{i}")).state, State::Delivered);
    }
    let held: Vec<_> = (0..5)
        .map(|i| app.row(&format!("slow-{i}")))
        .filter(|r| r.attempts == 0)
        .collect();
    assert_eq!(held.len(), 3, "three held back, their attempts unspent");
    let (_, m) = scrape(&app.http, &app.base).await;
    assert_eq!(
        value(&m, "herald_held_total", &[("reason", "max_in_flight")]),
        3.0
    );
    for r in &held {
        assert_eq!(
            (r.state, r.last_error_class),
            (State::Retryable, Some(AttemptClass::RateLimited))
        );
    }
    app.stop().await;
}

/// Herald's own refusals of what was stored — a payload it cannot read, inserted by SQL — make
/// no request and say nothing of the receiver: they do not disable its endpoint (found by a
/// review: three such rows disabled a healthy endpoint).
async fn refusals_before_any_request_do_not_disable_an_endpoint(backend: Backend) {
    let rx = Receiver::start().await;
    let app = spawn_app_with(
        backend,
        &format!(
            "sender_concurrency = 1\n[endpoints.healthy]\nurl = \"{}\"\ndisable_after_failures = 2\n",
            rx.url
        ),
    )
    .await;
    for i in 1..=3 {
        app.raw_sql(&format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             VALUES ('bad-{i}', 'webhook', 'endpoint:healthy', '{{\"body\": {{\"m\": 1e400}}}}')"
        ));
    }
    app.run_until_idle().await;
    for i in 1..=3 {
        assert_eq!(app.row(&format!("bad-{i}")).state, State::DeadLetter);
    }
    let r = app
        .post_message(webhook("good", "endpoint:healthy", json!({})))
        .await;
    assert_eq!(r.status(), 201);
    app.run_until_idle().await;
    assert_eq!(
        app.row("good").state,
        State::Delivered,
        "the endpoint was not disabled"
    );
    assert_eq!(rx.requests().len(), 1);
    app.stop().await;
}

async fn an_endpoint_that_keeps_failing_is_disabled_until_enabled(backend: Backend) {
    let rx = Receiver::start().await;
    rx.script([Reply::Status(500), Reply::Status(500), Reply::Status(500)]);
    let digest = herald::auth::digest_hex("desk-token-0123456789");
    let app = spawn_app_with(
        backend,
        &format!(
            "sender_concurrency = 1\n[endpoints.flaky]\nurl = \"{}\"\ndisable_after_failures = 3\n\
             [tokens.desk]\nsha256 = \"{digest}\"\nscope = \"support\"\n",
            rx.url
        ),
    )
    .await;
    for i in 1..=5 {
        let r = app
            .post_message(webhook(&format!("f-{i}"), "endpoint:flaky", json!({})))
            .await;
        assert_eq!(r.status(), 201);
    }
    app.run_until_idle().await;
    assert_eq!(rx.requests().len(), 3, "three failures, then disabled");
    for i in 4..=5 {
        let row = app.row(&format!("f-{i}"));
        assert_eq!(
            (row.state, row.attempts),
            (State::Retryable, 0),
            "f-{i} waits unspent"
        );
    }
    let listed: serde_json::Value = app
        .http
        .get(format!("{}/v1/endpoints", app.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let flaky = &listed["endpoints"][0];
    assert_eq!(
        (flaky["name"].as_str(), flaky["disabled"].as_bool()),
        (Some("flaky"), Some(true))
    );
    assert!(
        flaky["disabled_reason"]
            .as_str()
            .unwrap()
            .starts_with("3 failed attempts in a row"),
        "{flaky}"
    );
    assert!(
        !listed.to_string().contains("/hook"),
        "no URL path: {listed}"
    );

    let (_, m) = scrape(&app.http, &app.base).await;
    assert_eq!(
        value(
            &m,
            "herald_endpoints_disabled_total",
            &[("endpoint", "flaky")]
        ),
        1.0
    );
    assert_eq!(
        value(&m, "herald_held_total", &[("reason", "endpoint_disabled")]),
        2.0
    );

    // It stays disabled: time passing does not enable it.
    app.advance(Duration::from_secs(120));
    app.run_until_idle().await;
    assert_eq!(rx.requests().len(), 3);
    // Its waiting messages say why they wait.
    let explained = app.explain("f-5").await;
    assert_eq!(explained["endpoint_disabled"]["endpoint"], "flaky");
    let words = explained["explanation"].as_str().unwrap_or_default();
    assert!(
        words.contains("It waits for its endpoint flaky, which Herald disabled at")
            && words.contains("herald endpoint enable flaky"),
        "{words}"
    );

    // Only an admin enables it; then everything goes out.
    let enable = format!("{}/v1/endpoints/flaky/enable", app.base);
    let desk = client_with_token("desk-token-0123456789");
    assert_eq!(desk.post(&enable).send().await.unwrap().status(), 403);
    let r = app.http.post(&enable).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["changed"],
        true
    );
    let r = app
        .http
        .post(format!("{}/v1/endpoints/nope/enable", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Enabling makes its waiting messages due within 2 s, not at the end of their wait.
    app.advance(Duration::from_secs(3));
    app.run_until_idle().await;
    for i in 1..=5 {
        assert_eq!(app.row(&format!("f-{i}")).state, State::Delivered, "f-{i}");
    }
    assert_eq!(
        app.row("f-5").attempts,
        1,
        "the held ones spent one attempt"
    );
    assert_eq!(rx.requests().len(), 8);
    app.stop().await;
}

/// A disabled endpoint stays disabled when its `disable_after_*` rule is taken out of the
/// configuration (a restart with the endpoint still named): nothing is sent to it until an admin
/// enables it, as `GET /v1/endpoints` keeps saying.
async fn a_disabled_endpoint_stays_disabled_without_its_rule(backend: Backend) {
    let rx = Receiver::start().await;
    rx.script([Reply::Status(500), Reply::Status(500)]);
    let endpoint = format!(
        "sender_concurrency = 1\n[endpoints.flaky]\nurl = \"{}\"\n",
        rx.url
    );
    let first = spawn_app_with(backend, &format!("{endpoint}disable_after_failures = 2\n")).await;
    for i in 1..=3 {
        let r = first
            .post_message(webhook(&format!("g-{i}"), "endpoint:flaky", json!({})))
            .await;
        assert_eq!(r.status(), 201);
    }
    first.run_until_idle().await;
    assert_eq!(rx.requests().len(), 2, "two failures, then disabled");
    // The same database, the rule gone.
    let app = crate::support::app::spawn_on(
        crate::support::TestDb::attach(&first.test_db.url, backend),
        &endpoint,
    )
    .await;
    app.advance(Duration::from_secs(120));
    app.run_until_idle().await;
    assert_eq!(rx.requests().len(), 2, "still disabled");
    // The process that did not disable it shows it disabled (the counter is the other's).
    let disabled_now = |app: &crate::support::app::TestApp| {
        let (http, base) = (app.http.clone(), app.base.clone());
        async move {
            let (_, m) = scrape(&http, &base).await;
            value(&m, "herald_endpoint_disabled", &[("endpoint", "flaky")])
        }
    };
    assert_eq!(disabled_now(&app).await, 1.0);
    let r = app
        .http
        .post(format!("{}/v1/endpoints/flaky/enable", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    app.advance(Duration::from_secs(31));
    app.run_until_idle().await;
    for i in 1..=3 {
        assert_eq!(app.row(&format!("g-{i}")).state, State::Delivered, "g-{i}");
    }
    assert_eq!(disabled_now(&app).await, 0.0);
    app.stop().await;
    first.stop().await;
}

both_backends!(
    a_disabled_endpoint_stays_disabled_without_its_rule,
    an_endpoint_rate_holds_messages_for_their_slots_in_order,
    a_hanging_host_gets_at_most_its_cap_of_send_slots,
    an_endpoint_that_keeps_failing_is_disabled_until_enabled,
    refusals_before_any_request_do_not_disable_an_endpoint,
);
