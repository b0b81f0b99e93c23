//! The HTTP contract of /v1/messages: shapes, problem+json errors naming the field, nothing
//! stored on bad input, the bearer token, health.

use serde_json::{Value, json};

use crate::both_backends;
use crate::support::app::{spawn_app_with, webhook};
use crate::support::{Backend, spawn_app};

async fn problem(r: reqwest::Response, status: u16) -> Value {
    assert_eq!(r.status(), status);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    r.json().await.unwrap()
}

/// `n` letters and digits no compressor shrinks much (xorshift), as a random token is.
fn incompressible(n: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(ALPHABET[(x % ALPHABET.len() as u64) as usize])
        })
        .collect()
}

/// The `field` of each of a problem's `errors`, in order.
fn error_fields(p: &Value) -> Vec<String> {
    p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn bad_input_is_refused_with_the_field_and_nothing_is_stored(backend: Backend) {
    let app = spawn_app_with(backend, "max_payload_bytes = 2048\n").await;
    let post_raw = |body: &'static str| {
        app.http
            .post(format!("{}/v1/messages", app.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let p = problem(post_raw("{not json").await.unwrap(), 400).await;
    assert_eq!(p["field"], "body");
    // A body with a content coding is refused as such, 415 (it was "not valid JSON", 400); the
    // same body as `identity` is read.
    let coded = |coding: &'static str| {
        app.http
            .post(format!("{}/v1/messages", app.base))
            .header("content-type", "application/json")
            .header("content-encoding", coding)
            .json(&webhook("b30", "https://x.example/h", json!({})))
            .send()
    };
    for coding in ["gzip", "br", "identity, gzip"] {
        let p = problem(coded(coding).await.unwrap(), 415).await;
        assert_eq!(
            p["type"]
                .as_str()
                .map(|t| t.ends_with("unsupported-content-encoding")),
            Some(true),
            "{p}"
        );
    }
    assert!(app.db.find_by_event_id("b30").unwrap().is_none());
    assert_eq!(coded("identity").await.unwrap().status(), 201);
    // JSON, but a number no double holds (named by its field, not as the body), or an integer
    // no 64 bits hold (it would reach the receiver as another number): refused, named.
    for (body, field) in [
        (
            r#"{"event_id": "b17", "channel": "webhook", "destination": "https://x.example/h", "payload": {"body": 1}, "max_attempts": 1e400}"#,
            "max_attempts",
        ),
        (
            r#"{"event_id": "b18", "channel": "webhook", "destination": "https://x.example/h", "payload": {"body": {"id": 18446744073709551617}}}"#,
            "payload.body.id",
        ),
    ] {
        let p = problem(post_raw(body).await.unwrap(), 422).await;
        assert_eq!(p["field"], field, "{p}");
    }
    let cases = [
        (
            json!({"event_id": "b1", "channel": "sms", "destination": "x", "payload": {}}),
            "channel",
        ),
        (webhook("b2", "notaurl", json!({})), "destination"),
        (webhook("b3", "ftp://x.example/h", json!({})), "destination"),
        (
            json!({"event_id": "b4", "channel": "webhook", "destination": "https://x.example/h"}),
            "payload",
        ),
        (
            json!({"event_id": "b5", "channel": "webhook", "destination": "https://x.example/h", "payload": {"headers": {}}}),
            "payload.body",
        ),
        (
            json!({"event_id": "b6", "channel": "email", "destination": "not-an-address", "payload": {"subject": "s", "text": "t"}}),
            "destination",
        ),
        (
            json!({"event_id": "b7", "channel": "email", "destination": "a@b.example", "payload": {"text": "t"}}),
            "payload.subject",
        ),
        (
            json!({"channel": "webhook", "destination": "https://x.example/h", "payload": {"body": 1}}),
            "event_id",
        ),
        (
            json!({"event_id": "b9", "channel": "webhook", "destination": "https://x.example/h", "payload": {"body": 1}, "semantics": "exactly_once"}),
            "semantics",
        ),
        (
            json!({"event_id": "b10", "channel": "webhook", "destination": "https://x.example/h", "payload": {"body": 1}, "sheduled_at": "x"}),
            "sheduled_at",
        ),
        (
            json!({"event_id": "b11", "channel": "webhook", "destination": "https://x.example/h", "payload": {"body": "x".repeat(3000)}}),
            "payload",
        ),
        (
            json!({"event_id": "b12", "channel": "webhook", "destination": "https://x.example/h", "payload": {"body": 1}, "max_attempts": 0}),
            "max_attempts",
        ),
        (
            json!({"event_id": "b 13", "channel": "webhook", "destination": "https://x.example/h", "payload": {"body": 1}}),
            "event_id",
        ),
        (
            json!({"event_id": "b16", "channel": "webhook", "destination": "https://x.example/h",
                   "payload": {"body": 1, "headers": {"X-Tenant": "a", "x-tenant": "b"}}}),
            "payload.headers.x-tenant",
        ),
        // Names a receiver reads as another (CGI, WSGI, PHP and Rack read _ as -), a connection's
        // header, a value a receiver reads as Latin-1, more than receivers take.
        (
            json!({"event_id": "b16a", "channel": "webhook", "destination": "https://x.example/h",
                   "payload": {"body": 1, "headers": {"X-Tenant": "a", "X_Tenant": "b"}}}),
            "payload.headers.X_Tenant",
        ),
        (
            json!({"event_id": "b16b", "channel": "webhook", "destination": "https://x.example/h",
                   "payload": {"body": 1, "headers": {"webhook_id": "spoof"}}}),
            "payload.headers.webhook_id",
        ),
        (
            json!({"event_id": "b16c", "channel": "webhook", "destination": "https://x.example/h",
                   "payload": {"body": 1, "headers": {"Upgrade": "h2c"}}}),
            "payload.headers.Upgrade",
        ),
        (
            json!({"event_id": "b16d", "channel": "webhook", "destination": "https://x.example/h",
                   "payload": {"body": 1, "headers": {"X-T": "\u{e9}"}}}),
            "payload.headers.X-T",
        ),
        (
            json!({"event_id": "b16e", "channel": "webhook", "destination": "https://x.example/h",
                   "payload": {"body": 1, "headers": {"X-Big": "a".repeat(9000)}}}),
            "payload.headers",
        ),
        // Year 10000 in UTC, which neither backend stores (SQLite's check refused it: a 500).
        (
            json!({"event_id": "b19", "channel": "webhook", "destination": "https://x.example/h", "payload": {"body": 1}, "scheduled_at": "9999-12-31T23:59:59-01:00"}),
            "scheduled_at",
        ),
        // An unknown key inside the payload is named where it is (it was named `payload`).
        (
            json!({"event_id": "b27", "channel": "webhook", "destination": "https://x.example/h", "payload": {"body": 1, "extra": 2}}),
            "payload.extra",
        ),
        (
            json!({"event_id": "b28", "channel": "email", "destination": "a@b.example", "payload": {"subject": "s", "text": "t", "extra": 2}}),
            "payload.extra",
        ),
        (
            json!({"event_id": "b29", "channel": "email", "destination": "a@b.example", "payload": {"subject": "s", "text": "t",
                   "attachments": [{"filename": "a.txt", "content_type": "text/plain", "content_base64": "YQ==", "size": 1}]}}),
            "payload.attachments[0].size",
        ),
        // What the URL parser forgives: stored with its space and sent without; sent to host
        // `x`; never connectable, for the whole retry budget (a walk-through: all were 201).
        (
            json!({"event_id": "b24", "channel": "webhook", "destination": " https://x.example/h", "payload": {"body": 1}}),
            "destination",
        ),
        (
            json!({"event_id": "b25", "channel": "webhook", "destination": "http:///x", "payload": {"body": 1}}),
            "destination",
        ),
        (
            json!({"event_id": "b26", "channel": "webhook", "destination": "http://127.0.0.1:0/x", "payload": {"body": 1}}),
            "destination",
        ),
        // Longer than a PostgreSQL index entry holds with its ordering key (it was a 500 there).
        (
            json!({"event_id": "b20", "channel": "webhook", "ordering_key": "k", "payload": {"body": 1},
                   "destination": format!("https://x.example/h?q={}", incompressible(8000))}),
            "destination",
        ),
    ];
    for (body, field) in cases {
        let p = problem(app.post_message(body.clone()).await, 422).await;
        assert_eq!(p["field"], field, "{body}: {p}");
        assert_eq!(p["errors"][0]["field"], field);
        assert!(p["detail"].as_str().unwrap().contains(field));
    }
    // An email's payload: every bad field in one answer, not one per try.
    let p = problem(
        app.post_message(json!({"event_id": "b15", "channel": "email",
            "destination": "a@b.example", "payload": {"subject": "", "text": "",
            "cc": ["nope"], "headers": {"X-Herald-Event-Id": "spoof"}}}))
            .await,
        422,
    )
    .await;
    let fields = error_fields(&p);
    assert_eq!(
        fields,
        [
            "payload.headers",
            "payload.subject",
            "payload.text",
            "payload.cc"
        ],
        "{p}"
    );
    // A key given twice (the parser kept the last without a word; a proxy may read the first):
    // named, in a message and in a support body, and nothing is stored or replayed.
    for (path, raw, field) in [
        (
            "/v1/messages",
            r#"{"event_id":"b21","event_id":"b22","channel":"webhook","destination":"https://x.example/h","payload":{"body":1}}"#,
            "event_id",
        ),
        (
            "/v1/messages",
            r#"{"event_id":"b23","channel":"webhook","destination":"https://x.example/h","payload":{"body":{"a":[{"b":1,"b":2}]}}}"#,
            "payload.body.a[0].b",
        ),
        (
            "/v1/messages/b1/replay",
            r#"{"reason":"receiver fixed","reason":"x"}"#,
            "reason",
        ),
    ] {
        let r = app
            .http
            .post(format!("{}{path}", app.base))
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        let p = problem(r, 422).await;
        assert_eq!(p["field"], field, "{raw}: {p}");
        assert!(
            p["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains("more than once"),
            "{p}"
        );
    }
    // Given with other bad fields: every one named in the same answer.
    let r = app
        .http
        .post(format!("{}/v1/messages", app.base))
        .header("content-type", "application/json")
        .body(r#"{"event_id":"b24","channel":"webhook","destination":"https://x.example/h","destination":"https://x.example/h","payload":{"body":1},"max_attempts":0}"#)
        .send()
        .await
        .unwrap();
    let p = problem(r, 422).await;
    let fields = error_fields(&p);
    assert!(
        fields.contains(&"destination".to_owned()) && fields.contains(&"max_attempts".to_owned()),
        "{p}"
    );
    // An envelope far over the limit is refused before it is read whole.
    let huge = webhook("b14", "https://x.example/h", json!("y".repeat(64 * 1024)));
    let p = problem(app.post_message(huge).await, 413).await;
    assert_eq!(p["status"], 413);
    for id in [
        "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b9", "b10", "b11", "b12", "b14", "b15", "b16",
        "b16a", "b16b", "b16c", "b16d", "b16e", "b17", "b18", "b19", "b20", "b21", "b22", "b23",
        "b24",
    ] {
        assert!(
            app.db.find_by_event_id(id).unwrap().is_none(),
            "{id} must not be stored"
        );
    }
    app.stop().await;
}

/// A message without an event id is told of its other bad fields in the same answer (the
/// message's own checks run under a stand-in id), not the event id first and the rest on the
/// next try; nothing is stored.
async fn a_message_without_an_event_id_is_told_of_every_bad_field_at_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let p = problem(
        app.post_message(
            json!({"channel": "webhook", "destination": "ftp://x.example/h",
            "payload": {"body": 1}, "max_attempts": 0}),
        )
        .await,
        422,
    )
    .await;
    assert_eq!(p["field"], "event_id", "{p}");
    let fields: Vec<&str> = p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["event_id", "destination", "max_attempts"], "{p}");
    // The stand-in id is never shown, and a body with only the event id wrong is one error.
    assert!(!p.to_string().contains("unnamed"), "{p}");
    let p = problem(
        app.post_message(
            json!({"channel": "webhook", "destination": "https://x.example/h",
            "payload": {"body": 1}}),
        )
        .await,
        422,
    )
    .await;
    assert_eq!(p["errors"].as_array().unwrap().len(), 1, "{p}");
    assert!(
        app.db.find_by_event_id("unnamed").unwrap().is_none(),
        "nothing stored under the stand-in id"
    );
    // A field of the wrong value or type does not hide the others (found by a walk-through: a
    // bad semantics was the only error named), and nothing is stored.
    let fields_of = |p: &serde_json::Value| -> Vec<String> {
        p["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["field"].as_str().unwrap().to_owned())
            .collect()
    };
    for (bad, field) in [
        (json!({"semantics": "x"}), "semantics"),
        (json!({"max_attempts": "3"}), "max_attempts"),
        (json!({"scheduled_at": "tomorrow"}), "scheduled_at"),
        (json!({"ordering_policy": "sometimes"}), "ordering_policy"),
    ] {
        let mut body = json!({"event_id": "z1", "channel": "webhook", "destination": "",
            "payload": {}, "max_attempts": 0});
        for (k, v) in bad.as_object().unwrap() {
            body[k] = v.clone();
        }
        let p = problem(app.post_message(body).await, 422).await;
        let fields = fields_of(&p);
        for want in [field, "destination", "payload.body"] {
            assert!(fields.iter().any(|f| f == want), "{want} in {p}");
        }
        assert_eq!(
            fields.iter().filter(|f| *f == field).count(),
            1,
            "named once: {p}"
        );
        if field != "max_attempts" {
            assert!(fields.iter().any(|f| f == "max_attempts"), "{p}");
        }
    }
    // A key of the wrong type is named, not the policy beside it; a budget beyond 64 bits
    // is named once.
    let p = problem(
        app.post_message(json!({"event_id": "z1", "channel": "webhook",
            "destination": "https://x.example/h", "payload": {"body": 1},
            "ordering_key": 7, "ordering_policy": "skip"}))
            .await,
        422,
    )
    .await;
    assert_eq!(fields_of(&p), ["ordering_key"], "{p}");
    let p = problem(
        app.http
            .post(format!("{}/v1/messages", app.base))
            .header("content-type", "application/json")
            .body(
                r#"{"event_id": "z1", "channel": "webhook", "destination": "https://x.example/h",
                    "payload": {"body": 1}, "max_attempts": 18446744073709551617}"#,
            )
            .send()
            .await
            .unwrap(),
        422,
    )
    .await;
    assert_eq!(fields_of(&p), ["max_attempts"], "{p}");
    assert_eq!(
        p["errors"][0]["message"], "must be a positive integer",
        "not 'send it as a string', which a budget cannot be: {p}"
    );
    assert!(app.db.find_by_event_id("z1").unwrap().is_none());
    app.stop().await;
}

async fn the_message_view_has_the_contract_fields(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .post_message(webhook("view-1", "https://x.example/h", json!({"a": 1})))
        .await;
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    let view = app.message("view-1").await;
    assert_eq!(created, view);
    for key in [
        "event_id",
        "channel",
        "state",
        "attempts",
        "fingerprint",
        "delivery_status",
        "delivery_status_at",
        "next_attempt_at",
        "last_error_class",
    ] {
        assert!(view.get(key).is_some(), "missing {key}: {view}");
    }
    assert_eq!(view["state"], "scheduled");
    assert_eq!(view["attempts"], 0);
    assert_eq!(view["max_attempts"], 4);
    assert_eq!(view["fingerprint"].as_str().unwrap().len(), 64);
    let r = app
        .http
        .get(format!("{}/v1/messages/nope", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r, 404).await["status"], 404);
    app.stop().await;
}

async fn tokens_and_scopes_guard_v1(backend: Backend) {
    use crate::support::app::client_with_token;
    let digest = herald::auth::digest_hex;
    let extra = format!(
        "[tokens.shop]\nsha256 = \"{}\"\nscope = \"send\"\n\
         [tokens.blog]\nsha256 = \"{}\"\nscope = \"send\"\n\
         [tokens.desk]\nsha256 = \"{}\"\nscope = \"support\"\n",
        digest("shop-token-0123456789"),
        digest("blog-token-0123456789"),
        digest("desk-token-0123456789"),
    );
    let app = spawn_app_with(backend, &extra).await;
    let (shop, blog, desk) = (
        client_with_token("shop-token-0123456789"),
        client_with_token("blog-token-0123456789"),
        client_with_token("desk-token-0123456789"),
    );
    let anonymous = reqwest::Client::new();
    let url = format!("{}/v1/messages", app.base);
    let one = |id: &str| format!("{}/v1/messages/{id}", app.base);
    let body = webhook("tok-1", "https://x.example/h", json!({}));

    // No token, a wrong one, the digest instead of the token: 401, nothing stored.
    for client in [
        &anonymous,
        &client_with_token("wrong-token-0123456789"),
        &client_with_token(&digest("shop-token-0123456789")),
    ] {
        let r = client.post(&url).json(&body).send().await.unwrap();
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
        problem(r, 401).await;
        let r = client.get(one("tok-1")).send().await.unwrap();
        problem(r, 401).await;
    }
    // Two different Authorization headers, a valid one first (it was taken, the second
    // unseen): 401. The same one twice is one.
    let twice = |second: &str| {
        reqwest::Client::new()
            .post(&url)
            .header("authorization", "Bearer shop-token-0123456789")
            .header("authorization", format!("Bearer {second}"))
            .json(&body)
            .send()
    };
    let p = problem(twice("blog-token-0123456789").await.unwrap(), 401).await;
    assert!(
        p["detail"].as_str().unwrap().contains("more than once"),
        "{p}"
    );
    assert!(app.db.find_by_event_id("tok-1").unwrap().is_none());

    // A support token cannot enqueue; a send token can, and the row records its name.
    let r = desk.post(&url).json(&body).send().await.unwrap();
    let p = problem(r, 403).await;
    assert!(p["detail"].as_str().unwrap().contains("send"), "{p}");
    assert!(app.db.find_by_event_id("tok-1").unwrap().is_none());
    let r = twice("shop-token-0123456789").await.unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(app.row("tok-1").enqueued_by.as_deref(), Some("shop"));

    // Its own message: readable by it, by support and by admin; another send token gets the
    // 404 of a message that does not exist, and cannot take over the event id.
    for (client, status) in [(&shop, 200), (&desk, 200), (&app.http, 200), (&blog, 404)] {
        let r = client.get(one("tok-1")).send().await.unwrap();
        assert_eq!(r.status(), status);
    }
    // Support sees another client's destination masked, as every support tool shows it (it
    // read the path whole here); the owner and admin see it as written.
    for (client, shown) in [
        (&shop, "https://x.example/h"),
        (&app.http, "https://x.example/h"),
        (&desk, "https://x.example/…"),
    ] {
        let v: Value = client
            .get(one("tok-1"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["destination"], shown, "{v}");
    }
    let r = blog.post(&url).json(&body).send().await.unwrap();
    let p = problem(r, 409).await;
    assert_eq!(p["field"], "event_id");
    assert!(
        !p.to_string().contains("scheduled"),
        "nothing of the other message: {p}"
    );
    let r = shop.post(&url).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200, "the owner's retry is the idempotent 200");
    let r = blog
        .post(format!("{}/cancel", one("tok-1")))
        .send()
        .await
        .unwrap();
    problem(r, 404).await;
    assert_eq!(app.row("tok-1").state, "scheduled");

    // Support work: support and admin yes, send no.
    let unmatched = format!("{}/v1/receipts/unmatched", app.base);
    for (client, status) in [(&shop, 403), (&desk, 200), (&app.http, 200)] {
        let r = client.get(&unmatched).send().await.unwrap();
        assert_eq!(r.status(), status);
    }
    // Support may cancel any message; the owner may cancel its own.
    let r = desk
        .post(format!("{}/cancel", one("tok-1")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(app.row("tok-1").state, "canceled");

    // Health needs no token.
    for path in ["/healthz", "/readyz"] {
        let r = anonymous
            .get(format!("{}{path}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    app.stop().await;
}

async fn storage_down_is_503_never_2xx() {
    // A PostgreSQL URL nobody answers: the pool cannot connect.
    let app = crate::support::app::spawn_app(Backend::Sqlite).await;
    let responses = crate::support::app::call_with_storage_down(
        &app,
        vec![
            actix_web::test::TestRequest::post()
                .uri("/v1/messages")
                .set_json(webhook("down-1", "https://x.example/h", json!({}))),
            actix_web::test::TestRequest::get().uri("/readyz"),
        ],
    )
    .await;
    assert_eq!(responses[0].status(), 503);
    assert!(responses[0].headers().contains_key("retry-after"));
    assert_eq!(responses[1].status(), 503);
    app.stop().await;
}

#[actix_web::test]
async fn storage_down() {
    storage_down_is_503_never_2xx().await
}

/// A leap second (`23:59:60`: RFC 3339 has them, and a time library may write one) is the next
/// minute's first second, as PostgreSQL reads it, on both backends and wherever a time is
/// given: it was a 500 on SQLite ("storage error"), and a receipt's was stored as `:60`.
async fn a_leap_second_is_the_first_second_of_the_next_minute(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .post_message(json!({"event_id": "leap", "channel": "webhook",
            "destination": "https://x.example/h", "payload": {"body": 1},
            "scheduled_at": "2030-06-30T23:59:60Z", "expires_at": "2030-07-01T23:59:60.25+00:00"}))
        .await;
    assert_eq!(r.status(), 201);
    let m = app.message("leap").await;
    assert_eq!(
        (&m["scheduled_at"], &m["expires_at"]),
        (
            &json!("2030-07-01T00:00:00.000000Z"),
            &json!("2030-07-02T00:00:00.250000Z")
        ),
        "{m}"
    );
    // The last second of year 9999 with a leap second is year 10000: refused, naming it.
    let p = problem(
        app.post_message(json!({"event_id": "leap-2", "channel": "webhook",
            "destination": "https://x.example/h", "payload": {"body": 1},
            "expires_at": "9999-12-31T23:59:60Z"}))
            .await,
        422,
    )
    .await;
    assert_eq!(p["field"], "expires_at", "{p}");
    // A support body's and a filter's times are read the same way.
    for (path, body) in [
        (
            "/v1/dead-letters/redrive",
            Some(json!({"reason": "r", "expires_at": "2030-06-30T23:59:60Z"})),
        ),
        ("/v1/dead-letters?since=2016-12-31T23:59:60Z", None),
    ] {
        let url = format!("{}{path}", app.base);
        let r = match body {
            Some(b) => app.http.post(url).json(&b).send().await.unwrap(),
            None => app.http.get(url).send().await.unwrap(),
        };
        assert_eq!(r.status(), 200, "{path}: {}", r.text().await.unwrap());
    }
    app.stop().await;
}

both_backends!(
    a_leap_second_is_the_first_second_of_the_next_minute,
    bad_input_is_refused_with_the_field_and_nothing_is_stored,
    a_message_without_an_event_id_is_told_of_every_bad_field_at_once,
    the_message_view_has_the_contract_fields,
    tokens_and_scopes_guard_v1,
);
