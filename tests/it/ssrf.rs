//! The SSRF guard end to end: a name resolving to a refused address, a refused literal at
//! enqueue and in a row written by SQL, and a redirect towards an internal address.

use serde_json::json;

use crate::both_backends;
use crate::support::app::{spawn_app_with, webhook};
use crate::support::{Backend, Receiver, Reply};

/// An allow-list that does not contain loopback (the harness's default allows 127.0.0.0/8).
const NOT_LOOPBACK: &str = "allow_networks = \"10.99.0.0/16\"\n";

/// `localhost` resolves to 127.0.0.1 (and ::1): refused without loopback in the allow-list,
/// `permanent` at once, and no request reaches the receiver listening there. With the harness's
/// allow-list the same URL is delivered — over IPv4, the one vetted address family.
async fn a_name_resolving_to_a_refused_address_is_dead_lettered_without_a_request(
    backend: Backend,
) {
    let rx = Receiver::start().await;
    let by_name = rx.url.replace("127.0.0.1", "localhost");
    let app = spawn_app_with(backend, NOT_LOOPBACK).await;
    let r = app
        .post_message(webhook("ssrf-name-1", &by_name, json!({"n": 1})))
        .await;
    assert_eq!(r.status(), 201, "a name is checked when it resolves");
    app.run_until_idle().await;
    let view = app.message("ssrf-name-1").await;
    assert_eq!(view["state"], "dead_letter", "{view}");
    assert_eq!(view["last_error_class"], "permanent", "{view}");
    assert_eq!(view["attempts"], 1, "{view}");
    let attempts = app.attempts("ssrf-name-1");
    assert_eq!(attempts.len(), 1);
    let a = &attempts[0];
    assert_eq!(a.error_kind.as_deref(), Some("refused_destination"));
    assert_eq!(a.response_status, None);
    let excerpt = a.response_excerpt.as_deref().unwrap_or_default();
    assert!(
        excerpt.contains("SSRF guard") && excerpt.contains("(loopback)"),
        "{excerpt}"
    );
    assert!(rx.requests().is_empty(), "no request may reach it");
    app.stop().await;

    let app = spawn_app_with(backend, "").await;
    let r = app
        .post_message(webhook("ssrf-name-2", &by_name, json!({"n": 2})))
        .await;
    assert_eq!(r.status(), 201);
    app.run_until_idle().await;
    assert_eq!(app.message("ssrf-name-2").await["state"], "delivered");
    assert_eq!(rx.event_ids(), ["ssrf-name-2"]);
    app.stop().await;
}

/// A literal refused address is a 422 at `POST /v1/messages`, naming the range, nothing stored;
/// the same destination written by plain SQL (no API in between) is refused by the sender:
/// `permanent`, no request.
async fn a_refused_literal_is_422_at_enqueue_and_refused_at_send(backend: Backend) {
    let rx = Receiver::start().await;
    let app = spawn_app_with(backend, "allow_networks = \"\"\n").await;
    for (id, url) in [
        ("lit-1", rx.url.clone()),
        (
            "lit-2",
            "http://169.254.169.254/latest/meta-data".to_owned(),
        ),
        ("lit-3", "http://[::ffff:10.0.0.1]/h".to_owned()),
        ("lit-4", "http://2130706433/h".to_owned()),
    ] {
        let r = app.post_message(webhook(id, &url, json!({}))).await;
        assert_eq!(r.status(), 422, "{url}");
        let problem: serde_json::Value = r.json().await.unwrap();
        assert_eq!(problem["field"], "destination", "{problem}");
        let detail = problem.to_string();
        assert!(detail.contains("SSRF guard"), "{detail}");
        let missing = app
            .http
            .get(format!("{}/v1/messages/{id}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(missing.status(), 404, "{url}: nothing stored");
    }
    app.raw_sql(&format!(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
         VALUES ('lit-sql', 'webhook', '{}', '{{\"body\": {{}}}}')",
        rx.url
    ));
    app.run_until_idle().await;
    let view = app.message("lit-sql").await;
    assert_eq!(view["state"], "dead_letter", "{view}");
    assert_eq!(view["last_error_class"], "permanent", "{view}");
    let a = &app.attempts("lit-sql")[0];
    assert_eq!(a.error_kind.as_deref(), Some("refused_destination"));
    let excerpt = a.response_excerpt.as_deref().unwrap_or_default();
    assert!(
        excerpt.contains("127.0.0.1 is in 127.0.0.0/8 (loopback)"),
        "{excerpt}"
    );
    assert!(rx.requests().is_empty());
    app.stop().await;
}

/// A receiver answering 302 towards an internal address: Herald does not follow it — not even
/// to an allow-listed one — and the 3xx is `permanent` (a moved endpoint is configuration to
/// fix, not to retry), recorded with its status.
async fn a_redirect_to_an_internal_address_is_not_followed(backend: Backend) {
    let outside = Receiver::start().await;
    let internal = Receiver::start().await;
    for (path, location) in [
        ("/to-internal", internal.url.clone()),
        (
            "/to-metadata",
            "http://169.254.169.254/latest/meta-data/".to_owned(),
        ),
    ] {
        outside.script_path(
            path,
            [Reply::Full(
                302,
                vec![("Location".into(), location)],
                String::new(),
            )],
        );
    }
    let app = spawn_app_with(backend, "").await;
    for (id, path) in [("redir-1", "/to-internal"), ("redir-2", "/to-metadata")] {
        let r = app
            .post_message(webhook(id, &outside.url_for(path), json!({})))
            .await;
        assert_eq!(r.status(), 201);
    }
    app.run_until_idle().await;
    for id in ["redir-1", "redir-2"] {
        let view = app.message(id).await;
        assert_eq!(view["state"], "dead_letter", "{view}");
        assert_eq!(view["last_error_class"], "permanent", "{view}");
        let attempts = app.attempts(id);
        assert_eq!(attempts.len(), 1, "no retry of a redirect");
        assert_eq!(attempts[0].response_status, Some(302));
    }
    assert_eq!(outside.requests().len(), 2);
    assert!(internal.requests().is_empty(), "the redirect was followed");
    app.stop().await;
}

both_backends!(
    a_name_resolving_to_a_refused_address_is_dead_lettered_without_a_request,
    a_refused_literal_is_422_at_enqueue_and_refused_at_send,
    a_redirect_to_an_internal_address_is_not_followed,
);
