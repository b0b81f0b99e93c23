//! SMTP failures against real peers: a failure before the message content left Herald is
//! `not_sent` (so `at_most_once` mail is retried, never left `unconfirmed`); a stall or drop after
//! the content was sent is `ambiguous`. A reply code while connecting (greeting, EHLO, AUTH) is
//! `not_sent` too; only replies to MAIL FROM, RCPT TO and DATA are classified by their code.
//! The pool bounds open connections and replaces a parked one that no longer answers.

use serde_json::json;

use crate::both_backends;
use crate::support::app::spawn_app_with;
use crate::support::smtp_sink::{Script, SmtpSink, refused_url};
use crate::support::{Backend, TestApp};

async fn post_mail(app: &TestApp, id: &str, to: &str, from: Option<&str>, semantics: &str) {
    let mut payload = json!({"subject": "Hi", "text": "Hello"});
    if let Some(from) = from {
        payload["from"] = json!(from);
    }
    let r = app
        .post_message(json!({
            "event_id": id, "channel": "email", "destination": to,
            "semantics": semantics, "payload": payload,
        }))
        .await;
    assert_eq!(r.status(), 201, "{id}");
}

/// State, the message's last_error_class, and the first attempt's class and error kind.
async fn outcome(app: &TestApp, id: &str) -> (String, String, String, Option<String>) {
    let view = app.message(id).await;
    let a = &app.attempts(id)[0];
    (
        view["state"].as_str().unwrap_or_default().to_owned(),
        view["last_error_class"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        a.class.to_string(),
        a.error_kind.clone(),
    )
}

async fn smtp_connection_refused_is_not_sent(backend: Backend) {
    let app = spawn_app_with(backend, &format!("smtp_url = \"{}\"\n", refused_url())).await;
    post_mail(&app, "refused-amo", "ada@example.com", None, "at_most_once").await;
    post_mail(
        &app,
        "refused-alo",
        "bob@example.com",
        None,
        "at_least_once",
    )
    .await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 2);
    for id in ["refused-amo", "refused-alo"] {
        let (state, last, class, kind) = outcome(&app, id).await;
        assert_eq!(
            (state.as_str(), last.as_str(), class.as_str()),
            ("retryable", "not_sent", "not_sent"),
            "{id}"
        );
        assert_eq!(kind.as_deref(), Some("connect"), "{id}");
    }
    app.stop().await;
}

async fn smtp_unresolvable_host_is_not_sent(backend: Backend) {
    // `.invalid` never resolves (RFC 2606): a DNS failure, bounded by the SMTP timeout.
    let app = spawn_app_with(
        backend,
        "smtp_url = \"smtp://herald-test.invalid:2525\"\nsmtp_timeout_ms = 1500\n",
    )
    .await;
    post_mail(&app, "dns-amo", "ada@example.com", None, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    let (state, last, class, kind) = outcome(&app, "dns-amo").await;
    assert_eq!(
        (state.as_str(), last.as_str(), class.as_str()),
        ("retryable", "not_sent", "not_sent")
    );
    // `connect` when the resolver answers, `connect_timeout` when it does not in time.
    assert!(
        matches!(kind.as_deref(), Some("connect" | "connect_timeout")),
        "{kind:?}"
    );
    app.stop().await;
}

async fn smtp_server_that_never_greets_is_not_sent(backend: Backend) {
    let sink = SmtpSink::start_silent().await;
    let app = spawn_app_with(
        backend,
        &format!("smtp_url = \"{}\"\nsmtp_timeout_ms = 800\n", sink.url),
    )
    .await;
    post_mail(&app, "silent-amo", "ada@example.com", None, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    let (state, last, class, kind) = outcome(&app, "silent-amo").await;
    assert_eq!(
        (state.as_str(), last.as_str(), class.as_str()),
        ("retryable", "not_sent", "not_sent")
    );
    assert_eq!(kind.as_deref(), Some("connect_timeout"));
    app.stop().await;
}

async fn smtp_drop_before_the_envelope_is_not_sent(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(backend, &format!("smtp_url = \"{}\"\n", sink.url)).await;
    post_mail(
        &app,
        "mailfrom-drop",
        "ada@example.com",
        Some("drop-at-mail@example.com"),
        "at_most_once",
    )
    .await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    let (state, last, class, _) = outcome(&app, "mailfrom-drop").await;
    assert_eq!(
        (state.as_str(), last.as_str(), class.as_str()),
        ("retryable", "not_sent", "not_sent")
    );
    assert!(sink.accepted().is_empty());
    app.stop().await;
}

async fn smtp_stall_or_drop_after_data_is_ambiguous(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(
        backend,
        &format!("smtp_url = \"{}\"\nsmtp_timeout_ms = 800\n", sink.url),
    )
    .await;
    post_mail(&app, "drop-amo", "drop@example.com", None, "at_most_once").await;
    post_mail(&app, "stall-amo", "stall@example.com", None, "at_most_once").await;
    post_mail(
        &app,
        "stall-alo",
        "stall@example.com",
        None,
        "at_least_once",
    )
    .await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 3);
    let expect = [
        ("drop-amo", "unconfirmed", "connection_lost"),
        ("stall-amo", "unconfirmed", "timeout"),
        ("stall-alo", "retryable", "timeout"),
    ];
    for (id, want_state, want_kind) in expect {
        let (state, last, class, kind) = outcome(&app, id).await;
        assert_eq!(
            (state.as_str(), last.as_str(), class.as_str()),
            (want_state, "ambiguous", "ambiguous"),
            "{id}"
        );
        assert_eq!(kind.as_deref(), Some(want_kind), "{id}");
    }
    app.stop().await;
}

async fn smtp_connections_are_reused_and_a_closed_one_is_replaced(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(backend, &format!("smtp_url = \"{}\"\n", sink.url)).await;
    // One at a time: the second send finds the first one's parked connection.
    for (id, to) in [("pool-1", "ada@example.com"), ("pool-2", "bye@example.com")] {
        post_mail(&app, id, to, None, "at_most_once").await;
        assert_eq!(app.herald.sender.run_once().await.unwrap(), 1, "{id}");
        assert_eq!(app.message(id).await["state"], "delivered", "{id}");
    }
    assert_eq!(sink.connections(), 1, "the parked connection was reused");
    // The server closed that connection after pool-2: the NOOP check finds out, and a new
    // connection carries the next message; nothing is misread as a failed send.
    post_mail(&app, "pool-3", "bob@example.com", None, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(app.message("pool-3").await["state"], "delivered");
    assert_eq!(app.attempts("pool-3").len(), 1);
    assert_eq!(sink.connections(), 2);
    assert_eq!(sink.accepted().len(), 3);
    app.stop().await;
}

/// A server refusing the session in its greeting: every queued message stays retryable as
/// `not_sent`, none is dead-lettered or left `unconfirmed`, and the reply code is kept.
async fn a_refused_greeting_is_not_sent(backend: Backend, greeting: &'static str, code: i32) {
    let sink = SmtpSink::start_scripted(Script {
        greeting: Some(greeting),
        ..Script::default()
    })
    .await;
    let app = spawn_app_with(backend, &format!("smtp_url = \"{}\"\n", sink.url)).await;
    let ids = ["greet-amo", "greet-alo", "greet-alo-2"];
    post_mail(&app, ids[0], "ada@example.com", None, "at_most_once").await;
    post_mail(&app, ids[1], "bob@example.com", None, "at_least_once").await;
    post_mail(&app, ids[2], "cy@example.com", None, "at_least_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 3);
    for id in ids {
        let (state, last, class, kind) = outcome(&app, id).await;
        assert_eq!(
            (state.as_str(), last.as_str(), class.as_str()),
            ("retryable", "not_sent", "not_sent"),
            "{id}"
        );
        assert_eq!(kind.as_deref(), Some("smtp_greeting_refused"), "{id}");
        assert_eq!(app.attempts(id)[0].response_status, Some(code), "{id}");
    }
    assert!(sink.accepted().is_empty());
    app.stop().await;
}

async fn smtp_greeting_421_is_not_sent(backend: Backend) {
    a_refused_greeting_is_not_sent(backend, "421 4.3.2 too busy, try later", 421).await;
}

async fn smtp_greeting_554_is_not_sent(backend: Backend) {
    a_refused_greeting_is_not_sent(backend, "554 5.3.2 no SMTP service here", 554).await;
}

/// lettre 0.11's connection authenticates over plain TCP when told to (only its transport
/// builder refuses credentials without TLS), so the sink can refuse AUTH PLAIN itself.
async fn smtp_auth_refused_is_not_sent(backend: Backend) {
    let sink = SmtpSink::start_scripted(Script {
        auth_reply: Some("535 5.7.8 authentication credentials invalid"),
        ..Script::default()
    })
    .await;
    let url = sink.url.replace("smtp://", "smtp://herald:hunter2@");
    let app = spawn_app_with(backend, &format!("smtp_url = \"{url}\"\n")).await;
    post_mail(&app, "auth-amo", "ada@example.com", None, "at_most_once").await;
    post_mail(&app, "auth-alo", "bob@example.com", None, "at_least_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 2);
    assert!(sink.auth_commands() >= 1, "Herald never sent AUTH");
    for id in ["auth-amo", "auth-alo"] {
        let (state, last, class, kind) = outcome(&app, id).await;
        assert_eq!(
            (state.as_str(), last.as_str(), class.as_str()),
            ("retryable", "not_sent", "not_sent"),
            "{id}"
        );
        assert_eq!(kind.as_deref(), Some("smtp_auth_refused"), "{id}");
        let a = &app.attempts(id)[0];
        assert_eq!(a.response_status, Some(535), "{id}");
        let excerpt = a.response_excerpt.clone().unwrap_or_default();
        assert!(!excerpt.contains("hunter2"), "{excerpt}");
    }
    assert!(sink.accepted().is_empty());
    app.stop().await;
}

/// A reply code in the envelope keeps its code-based class, and a 421 there closes the
/// connection even when the server itself leaves it open: the next message uses a new one.
async fn smtp_a_421_in_the_envelope_is_transient_and_closes_the_connection(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(backend, &format!("smtp_url = \"{}\"\n", sink.url)).await;
    post_mail(&app, "rcpt-421", "t421@example.com", None, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    let (state, last, class, kind) = outcome(&app, "rcpt-421").await;
    assert_eq!(
        (state.as_str(), last.as_str(), class.as_str()),
        ("retryable", "transient", "transient")
    );
    assert_eq!(kind.as_deref(), Some("smtp_reply"));
    assert_eq!(app.attempts("rcpt-421")[0].response_status, Some(421));
    // The 421 also slowed the relay down for its retry delay (see tests/it/slowdown.rs): out of
    // the way, and past that pause.
    let cancel = app
        .http
        .post(format!("{}/v1/messages/rcpt-421/cancel", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 200);
    app.advance(std::time::Duration::from_secs(120));
    post_mail(&app, "after-421", "ada@example.com", None, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(app.message("after-421").await["state"], "delivered");
    assert_eq!(
        sink.connections(),
        2,
        "the connection that got 421 was reused"
    );
    app.stop().await;
}

/// Ten sends at once through a pool of two: never more than two SMTP sessions, all delivered.
async fn smtp_open_connections_are_bounded_by_the_pool_size(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(
        backend,
        &format!(
            "smtp_url = \"{}\"\nsmtp_pool_size = 2\nsmtp_timeout_ms = 10000\n",
            sink.url
        ),
    )
    .await;
    for i in 0..10 {
        // `slow@`: each answer takes a while, so the sends overlap.
        post_mail(
            &app,
            &format!("bounded-{i}"),
            "slow@example.com",
            None,
            "at_least_once",
        )
        .await;
    }
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 10);
    for i in 0..10 {
        let id = format!("bounded-{i}");
        assert_eq!(app.message(&id).await["state"], "delivered", "{id}");
    }
    assert_eq!(sink.accepted().len(), 10);
    assert!(
        sink.max_sessions() <= 2,
        "{} SMTP sessions were open at once",
        sink.max_sessions()
    );
    assert!(
        sink.connections() <= 2,
        "{} connections",
        sink.connections()
    );
    app.stop().await;
}

/// A parked connection that stops answering (NOOP gets nothing) costs only the bounded reuse
/// check: the same attempt opens a new connection and delivers.
async fn smtp_a_parked_connection_that_went_silent_is_replaced(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(
        backend,
        &format!("smtp_url = \"{}\"\nsmtp_timeout_ms = 2000\n", sink.url),
    )
    .await;
    post_mail(&app, "mute-1", "mute@example.com", None, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(app.message("mute-1").await["state"], "delivered");
    post_mail(&app, "mute-2", "ada@example.com", None, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    let (state, _, class, kind) = outcome(&app, "mute-2").await;
    assert_eq!(
        (state.as_str(), class.as_str(), kind),
        ("delivered", "accepted", None)
    );
    assert_eq!(app.attempts("mute-2").len(), 1);
    assert_eq!(sink.connections(), 2);
    assert_eq!(sink.accepted().len(), 2);
    app.stop().await;
}

both_backends!(
    smtp_greeting_421_is_not_sent,
    smtp_greeting_554_is_not_sent,
    smtp_auth_refused_is_not_sent,
    smtp_a_421_in_the_envelope_is_transient_and_closes_the_connection,
    smtp_open_connections_are_bounded_by_the_pool_size,
    smtp_a_parked_connection_that_went_silent_is_replaced,
    smtp_connection_refused_is_not_sent,
    smtp_unresolvable_host_is_not_sent,
    smtp_server_that_never_greets_is_not_sent,
    smtp_drop_before_the_envelope_is_not_sent,
    smtp_stall_or_drop_after_data_is_ambiguous,
    smtp_connections_are_reused_and_a_closed_one_is_replaced,
);
