//! Every row of the classification table against a real receiver, on both backends.

use std::time::Duration;

use chrono::Utc;
use serde_json::json;

use crate::both_backends;
use crate::support::app::{TestApp, webhook};
use crate::support::{Backend, Receiver, Reply, spawn_app};

async fn post(app: &TestApp, event_id: &str, url: &str, extra: serde_json::Value) {
    let mut body = webhook(event_id, url, json!({"case": event_id}));
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let r = app.post_message(body).await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
}

struct Case {
    id: &'static str,
    reply: Reply,
    extra: serde_json::Value,
    state: &'static str,
    error_class: Option<&'static str>,
    attempt_class: &'static str,
}

fn case(id: &'static str, reply: Reply, state: &'static str, class: &'static str) -> Case {
    let error_class = (class != "accepted").then_some(class);
    Case {
        id,
        reply,
        extra: json!({}),
        state,
        error_class,
        attempt_class: class,
    }
}

async fn classification_table(backend: Backend) {
    let app = spawn_app(backend).await;
    let retry_date = httpdate::fmt_http_date((Utc::now() + chrono::Duration::seconds(90)).into());
    let cases = vec![
        case("ok-200", Reply::Status(200), "delivered", "accepted"),
        case("ok-204", Reply::Status(204), "delivered", "accepted"),
        case(
            "conflict-409",
            Reply::Status(409),
            "unconfirmed",
            "conflict",
        ),
        case(
            "limited-429-seconds",
            Reply::Full(429, vec![("Retry-After".into(), "7".into())], String::new()),
            "retryable",
            "rate_limited",
        ),
        case(
            "limited-429-date",
            Reply::Full(
                429,
                vec![("Retry-After".into(), retry_date.clone())],
                String::new(),
            ),
            "retryable",
            "rate_limited",
        ),
        case(
            "limited-429-bare",
            Reply::Status(429),
            "retryable",
            "rate_limited",
        ),
        // A receiver's text where the seconds should be, with an address in it: backoff, and
        // the text itself is not kept (a walk-through saw 3,000 characters stored and shown).
        case(
            "limited-429-text",
            Reply::Full(
                429,
                vec![(
                    "Retry-After".into(),
                    format!("{} contact ada@example.com", "A".repeat(3000)),
                )],
                String::new(),
            ),
            "retryable",
            "rate_limited",
        ),
        case(
            "unavailable-503",
            Reply::Full(
                503,
                vec![("Retry-After".into(), "11".into())],
                String::new(),
            ),
            "retryable",
            "transient",
        ),
        case("error-500", Reply::Status(500), "retryable", "transient"),
        case("timeout-408", Reply::Status(408), "retryable", "transient"),
        case("early-425", Reply::Status(425), "retryable", "transient"),
        case("gateway-502", Reply::Status(502), "retryable", "transient"),
        case("gateway-504", Reply::Status(504), "retryable", "transient"),
        case("hang-alo", Reply::Hang, "retryable", "ambiguous"),
        Case {
            extra: json!({"semantics": "at_most_once"}),
            ..case("hang-amo", Reply::Hang, "unconfirmed", "ambiguous")
        },
        case("drop-alo", Reply::Drop, "retryable", "ambiguous"),
        case("bad-400", Reply::Status(400), "dead_letter", "permanent"),
        case("gone-410", Reply::Status(410), "dead_letter", "permanent"),
        case("moved-301", Reply::Status(301), "dead_letter", "permanent"),
        case(
            "unprocessable-422",
            Reply::Status(422),
            "dead_letter",
            "permanent",
        ),
    ];
    // One receiver per case: a 429 slows down its whole destination (host and port), and each
    // row of the table must be its own destination to be classified on its own.
    let mut receivers = std::collections::HashMap::new();
    for c in &cases {
        let rx = Receiver::start().await;
        let path = format!("/{}", c.id);
        rx.script_path(&path, [c.reply.clone()]);
        post(&app, c.id, &rx.url_for(&path), c.extra.clone()).await;
        receivers.insert(c.id, rx);
    }
    // A port nobody listens on: the request never leaves.
    let closed = crate::support::closed_addr();
    post(&app, "refused", &format!("http://{closed}/hook"), json!({})).await;

    let before = app.clock_now();
    assert_eq!(app.herald.sender.run_once().await.unwrap(), cases.len() + 1);

    for c in &cases {
        let view = app.message(c.id).await;
        assert_eq!(view["state"], c.state, "{}: {view}", c.id);
        assert_eq!(view["last_error_class"].as_str(), c.error_class, "{}", c.id);
        assert_eq!(view["attempts"], 1, "{}", c.id);
        let attempts = app.attempts(c.id);
        assert_eq!(attempts.len(), 1, "{}", c.id);
        assert_eq!(attempts[0].class, c.attempt_class, "{}", c.id);
        assert_eq!(attempts[0].next_state, c.state, "{}", c.id);
        assert!(
            attempts[0].policy_version.starts_with("default@"),
            "{}",
            c.id
        );
        assert_eq!(
            receivers[c.id].requests_to(&format!("/{}", c.id)).len(),
            1,
            "{}: one request",
            c.id
        );
    }
    let refused = app.message("refused").await;
    assert_eq!(
        (
            refused["state"].as_str(),
            refused["last_error_class"].as_str()
        ),
        (Some("retryable"), Some("not_sent"))
    );
    assert_eq!(
        app.attempts("refused")[0].error_kind.as_deref(),
        Some("connect")
    );
    assert_eq!(
        app.attempts("hang-alo")[0].error_kind.as_deref(),
        Some("timeout")
    );
    assert_eq!(
        app.attempts("drop-alo")[0].error_kind.as_deref(),
        Some("connection_lost")
    );

    // Retry-After: delta-seconds and HTTP-date are honoured (plus at most 20 % jitter); without
    // it, backoff from base 1 s (±20 %).
    // Delays count from each send's own end; allow for a slow, shared machine between `before`
    // and that end.
    const SLACK: f64 = 3.0;
    let delay = |id: &str| {
        let row = app.row(id);
        (row.next_attempt_at.unwrap() - before).num_milliseconds() as f64 / 1000.0
    };
    let d = delay("limited-429-seconds");
    assert!((7.0..=8.4 + SLACK).contains(&d), "429 delta-seconds: {d}");
    assert_eq!(
        app.attempts("limited-429-seconds")[0]
            .retry_after
            .as_deref(),
        Some("7")
    );
    assert!(
        app.attempts("limited-429-seconds")[0]
            .delay_reason
            .as_deref()
            .unwrap()
            .contains("Retry-After 7s")
    );
    let d = delay("limited-429-date");
    // The date was fixed before the 21 POSTs and has whole-second precision.
    assert!(
        (80.0..=90.0 * 1.2 + SLACK).contains(&d),
        "429 HTTP-date: {d}"
    );
    let d = delay("unavailable-503");
    assert!((11.0..=13.2 + SLACK).contains(&d), "503 Retry-After: {d}");
    assert_eq!(
        app.attempts("limited-429-text")[0].retry_after.as_deref(),
        Some("not seconds or an HTTP-date (3024 bytes)")
    );
    let words = app.explain("limited-429-text").await.to_string();
    assert!(
        !words.contains("ada@") && !words.contains("AAAA"),
        "{words}"
    );
    for id in [
        "limited-429-bare",
        "limited-429-text",
        "error-500",
        "refused",
    ] {
        let d = delay(id);
        assert!((0.8..=1.2 + SLACK).contains(&d), "{id} backoff: {d}");
        assert!(
            app.attempts(id)[0]
                .delay_reason
                .as_deref()
                .unwrap()
                .contains("backoff after attempt 1")
        );
    }
    app.stop().await;
}

async fn budget_exhaustion_dead_letters_with_the_last_class(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    rx.script([
        Reply::Status(500),
        Reply::Status(503),
        Reply::Drop,
        Reply::Status(502),
    ]);
    let r = app
        .post_message(webhook("exhaust-1", &rx.url, json!({"n": 1})))
        .await;
    assert_eq!(r.status(), 201);
    for n in 1..=4 {
        assert_eq!(app.run_until_idle().await, 1, "attempt {n}");
        // Longer than any delay the policy can choose (cap 60 s).
        app.advance(Duration::from_secs(61));
    }
    assert_eq!(
        app.run_until_idle().await,
        0,
        "nothing left after the budget"
    );
    let view = app.message("exhaust-1").await;
    assert_eq!(view["state"], "dead_letter");
    assert_eq!(view["last_error_class"], "exhausted");
    assert_eq!(view["attempts"], 4);
    let classes: Vec<_> = app
        .attempts("exhaust-1")
        .into_iter()
        .map(|a| a.class)
        .collect();
    assert_eq!(
        classes,
        ["transient", "transient", "ambiguous", "transient"]
    );
    let last = app.attempts("exhaust-1").pop().unwrap();
    assert!(last.delay_reason.unwrap().contains("budget spent (4 of 4)"));
    assert_eq!(rx.requests().len(), 4);
    // Every retry carried the same event id.
    assert!(
        rx.requests()
            .iter()
            .all(|r| r.header("webhook-id") == Some("exhaust-1"))
    );
    app.stop().await;
}

async fn retry_then_deliver_with_the_same_key(backend: Backend) {
    // A 5 s base (4–6 s with jitter): "not due yet" holds however slow the machine is.
    let app = crate::support::app::spawn_app_with(backend, "retry_base_seconds = 5\n").await;
    let rx = Receiver::start().await;
    rx.script([Reply::Status(503), Reply::Hang, Reply::Status(200)]);
    let r = app
        .post_message(webhook("retry-ok", &rx.url, json!({"n": 1})))
        .await;
    assert_eq!(r.status(), 201);
    assert_eq!(app.run_until_idle().await, 1);
    // Not due yet: nothing is sent before the chosen delay.
    assert_eq!(app.run_until_idle().await, 0);
    assert_eq!(app.message("retry-ok").await["state"], "retryable");
    for _ in 0..2 {
        app.advance(Duration::from_secs(61));
        assert_eq!(app.run_until_idle().await, 1);
    }
    let view = app.message("retry-ok").await;
    assert_eq!(
        (view["state"].as_str(), view["attempts"].as_i64()),
        (Some("delivered"), Some(3))
    );
    assert_eq!(view["last_error_class"], serde_json::Value::Null);
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 3);
    let keys: Vec<_> = reqs
        .iter()
        .map(|r| r.header("idempotency-key").unwrap().to_owned())
        .collect();
    assert_eq!(keys, ["retry-ok", "retry-ok", "retry-ok"]);
    let bodies: Vec<_> = reqs.iter().map(|r| r.body.clone()).collect();
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "same body on every attempt"
    );
    app.stop().await;
}

async fn expired_messages_are_never_sent(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    rx.script([Reply::Status(500)]);
    let expires = (Utc::now() + chrono::Duration::seconds(30)).to_rfc3339();
    let mut body = webhook("expiring", &rx.url, json!({}));
    body["expires_at"] = json!(expires);
    assert_eq!(app.post_message(body).await.status(), 201);
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.message("expiring").await["state"], "retryable");
    app.advance(Duration::from_secs(61));
    assert_eq!(
        app.run_until_idle().await,
        0,
        "expired in the claim: nothing to send"
    );
    let view = app.message("expiring").await;
    assert_eq!(view["state"], "expired");
    assert_eq!(view["attempts"], 1, "the expired pass made no attempt");
    assert_eq!(
        view["last_error_class"], "transient",
        "the class that decided before stays"
    );
    assert!(app.row("expiring").lease_owner.is_none());
    assert_eq!(rx.requests().len(), 1, "no request after expiry");
    assert_eq!(app.attempts("expiring").len(), 1);

    // A retry the receiver asks for after the expiry could never be made: the message ends
    // expired at that answer, not `retryable` until the retry's time.
    rx.script([Reply::Full(
        429,
        vec![("retry-after".into(), "600".into())],
        String::new(),
    )]);
    let expires = app.clock_now() + chrono::Duration::seconds(30);
    let mut body = webhook("expiring-2", &rx.url, json!({}));
    body["expires_at"] = json!(expires.to_rfc3339());
    assert_eq!(app.post_message(body).await.status(), 201);
    assert_eq!(app.run_until_idle().await, 1);
    let view = app.message("expiring-2").await;
    assert_eq!(view["state"], "expired", "{view}");
    assert_eq!(view["last_error_class"], "rate_limited");
    assert!(view["next_attempt_at"].is_null(), "{view}");
    let reason = app.attempts("expiring-2")[0].delay_reason.clone();
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.contains("would come after its expires_at")),
        "{reason:?}"
    );
    let explained = app.explain("expiring-2").await;
    let paragraph = explained["explanation"].as_str().unwrap();
    assert!(
        paragraph.contains("It expired at that answer: the next attempt would have come after"),
        "{paragraph}"
    );
    app.advance(Duration::from_secs(31));
    assert_eq!(app.run_until_idle().await, 0);
    assert_eq!(rx.requests().len(), 2, "no request after expiry");
    app.stop().await;
}

both_backends!(
    classification_table,
    budget_exhaustion_dead_letters_with_the_last_class,
    retry_then_deliver_with_the_same_key,
    expired_messages_are_never_sent,
);
