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
    ];
    for (body, field) in cases {
        let p = problem(app.post_message(body.clone()).await, 422).await;
        assert_eq!(p["field"], field, "{body}: {p}");
        assert_eq!(p["errors"][0]["field"], field);
        assert!(p["detail"].as_str().unwrap().contains(field));
    }
    // An envelope far over the limit is refused before it is read whole.
    let huge = webhook("b14", "https://x.example/h", json!("y".repeat(64 * 1024)));
    let p = problem(app.post_message(huge).await, 413).await;
    assert_eq!(p["status"], 413);
    for id in [
        "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b9", "b10", "b11", "b12", "b14",
    ] {
        assert!(
            app.db.find_by_event_id(id).unwrap().is_none(),
            "{id} must not be stored"
        );
    }
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

async fn the_api_token_guards_v1(backend: Backend) {
    let app = spawn_app_with(backend, "api_token = \"s3cret-token\"\n").await;
    let url = format!("{}/v1/messages", app.base);
    let body = webhook("tok-1", "https://x.example/h", json!({}));
    let r = app.http.post(&url).json(&body).send().await.unwrap();
    problem(r, 401).await;
    let r = app
        .http
        .post(&url)
        .bearer_auth("wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    problem(r, 401).await;
    assert!(app.db.find_by_event_id("tok-1").unwrap().is_none());
    let r = app
        .http
        .post(&url)
        .bearer_auth("s3cret-token")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // Health needs no token.
    let r = app
        .http
        .get(format!("{}/healthz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = app
        .http
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
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

both_backends!(
    bad_input_is_refused_with_the_field_and_nothing_is_stored,
    the_message_view_has_the_contract_fields,
    the_api_token_guards_v1,
);
