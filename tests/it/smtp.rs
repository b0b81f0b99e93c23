//! SMTP failures against real peers: a failure before the message content left Herald is
//! `not_sent` (so `at_most_once` mail is retried, never left `unconfirmed`); a stall or drop after
//! the content was sent is `ambiguous`. A reply code while connecting (greeting, EHLO, AUTH) is
//! `not_sent` too; only replies to MAIL FROM, RCPT TO and DATA are classified by their code.
//! The pool bounds open connections, replaces a parked one that no longer answers and retires
//! idle ones. Every reply row of the classification table has a case here; recipients refused at
//! RCPT TO are listed masked while the others get the message; the queue id of a 250 is the
//! provider message id; STARTTLS and implicit TLS verify the relay's certificate against the
//! webpki roots plus `smtp_ca_file`; AUTH PLAIN and LOGIN take the URL's credentials, which no
//! log line, attempt or `Debug` output shows.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use herald::sender::throttle::BURST_COUNT;
use serde_json::json;

use crate::both_backends;
use crate::support::app::{base_toml, spawn_app_with};
use crate::support::smtp_sink::{Auth, Script, SmtpSink, TestCa, TlsMode, refused_url};
use crate::support::{Backend, TestApp};

/// A sink offering PIPELINING or not.
async fn sink_offering_pipelining(offered: bool) -> SmtpSink {
    SmtpSink::start_scripted(Script {
        no_pipelining: !offered,
        ..Script::default()
    })
    .await
}

/// Herald on `backend` sending through `sink`, with `extra` configuration (TOML lines).
async fn smtp_app(backend: Backend, sink: &SmtpSink, extra: &str) -> TestApp {
    spawn_app_with(backend, &format!("smtp_url = \"{}\"\n{extra}", sink.url)).await
}

/// Every one of `envelopes` arrived pipelined (MAIL FROM with RCPT TO and DATA behind it) when
/// `pipelined`, else each MAIL FROM alone, its reply awaited.
fn assert_envelopes(sink: &SmtpSink, pipelined: bool, envelopes: usize) {
    let want = if pipelined {
        (envelopes, 0)
    } else {
        (0, envelopes)
    };
    assert_eq!(sink.envelopes(), want, "(pipelined, lockstep) envelopes");
    assert_eq!(
        sink.out_of_place(),
        Vec::<String>::new(),
        "commands RFC 2920 lets only end a group"
    );
}

async fn post_mail(app: &TestApp, id: &str, to: &str, from: Option<&str>, semantics: &str) {
    let mut payload = json!({"subject": "Hi", "text": "Hello"});
    if let Some(from) = from {
        payload["from"] = json!(from);
    }
    post_payload(app, id, to, payload, semantics).await;
}

async fn post_payload(
    app: &TestApp,
    id: &str,
    to: &str,
    payload: serde_json::Value,
    semantics: &str,
) {
    let r = app
        .post_message(json!({
            "event_id": id, "channel": "email", "destination": to,
            "semantics": semantics, "payload": payload,
        }))
        .await;
    assert_eq!(r.status(), 201, "{id}");
}

/// State, the message's last_error_class, and the first attempt's class and error kind.
async fn cancel(app: &TestApp, id: &str) {
    let r = app
        .http
        .post(format!("{}/v1/messages/{id}/cancel", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "cancel {id}");
}

/// The excerpt of `id`'s first attempt.
fn first_excerpt(app: &TestApp, id: &str) -> String {
    app.attempts(id)[0]
        .response_excerpt
        .clone()
        .unwrap_or_default()
}

/// A sink that takes at most `max` recipients in one transaction (`452` to the rest), as
/// `script` says otherwise.
async fn sink_taking(max: usize, script: Script) -> SmtpSink {
    SmtpSink::start_scripted(Script {
        max_recipients: Some(max),
        ..script
    })
    .await
}

/// Posts an email to `to` with `cc` as `id`, sends it in one pass, checks that it was taken
/// (`delivered`, `accepted`), and returns its attempt's excerpt.
async fn delivered_excerpt(
    app: &TestApp,
    id: &str,
    to: &str,
    cc: &[&str],
    semantics: &str,
) -> String {
    let payload = json!({"subject": "Hi", "text": "Hello", "cc": cc});
    post_payload(app, id, to, payload, semantics).await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1, "{id}");
    let (state, _, class, _) = outcome(app, id).await;
    assert_eq!(
        (state.as_str(), class.as_str()),
        ("delivered", "accepted"),
        "{id}"
    );
    first_excerpt(app, id)
}

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
    let app = smtp_app(backend, &sink, "smtp_timeout_ms = 800\n").await;
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
    let app = smtp_app(backend, &sink, "").await;
    post_mail(
        &app,
        "mailfrom-drop",
        "ada@example.com",
        Some("drop-at-mail@example.com"),
        "at_most_once",
    )
    .await;
    // A line that is no SMTP reply to MAIL FROM: as not sent, but said so.
    post_mail(
        &app,
        "mailfrom-garbled",
        "ada@example.com",
        Some("garbled-at-mail@example.com"),
        "at_most_once",
    )
    .await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 2);
    for (id, want_kind) in [
        ("mailfrom-drop", "connection_lost_before_data"),
        ("mailfrom-garbled", "unparsable_reply_before_data"),
    ] {
        let (state, last, class, kind) = outcome(&app, id).await;
        assert_eq!(
            (state.as_str(), last.as_str(), class.as_str()),
            ("retryable", "not_sent", "not_sent"),
            "{id}"
        );
        assert_eq!(kind.as_deref(), Some(want_kind), "{id}");
    }
    assert!(sink.accepted().is_empty());
    app.stop().await;
}

async fn smtp_stall_or_drop_after_data_is_ambiguous(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "smtp_timeout_ms = 800\n").await;
    post_mail(&app, "drop-amo", "drop@example.com", None, "at_most_once").await;
    post_mail(&app, "drop-alo", "drop@example.com", None, "at_least_once").await;
    post_mail(&app, "stall-amo", "stall@example.com", None, "at_most_once").await;
    post_mail(
        &app,
        "stall-alo",
        "stall@example.com",
        None,
        "at_least_once",
    )
    .await;
    // A relay answering the content with no SMTP reply: as ambiguous, but said so.
    post_mail(
        &app,
        "garbled-alo",
        "garbled@example.com",
        None,
        "at_least_once",
    )
    .await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 5);
    let expect = [
        ("garbled-alo", "retryable", "unparsable_reply"),
        ("drop-amo", "unconfirmed", "connection_lost"),
        ("drop-alo", "retryable", "connection_lost"),
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

/// A reply that is not UTF-8 (a relay writing Latin-1) cannot be read (lettre reads replies as
/// text): it is an unparsable reply, not a lost connection, and no other reply is waited for (a
/// walk-through saw the pipelined path wait out the timeout for one, and retry a message the
/// relay had taken: three copies). At RCPT TO it is not sent; after the content (or with the
/// content pipelined behind it) ambiguous, as a garbled reply is.
async fn smtp_a_reply_that_is_not_utf8_is_unparsable(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "smtp_timeout_ms = 800\n").await;
    for (id, to, semantics) in [
        ("latin1-amo", "latin1@example.com", "at_most_once"),
        ("latin1-alo", "latin1@example.com", "at_least_once"),
        ("rcptlatin1-amo", "rcptlatin1@example.com", "at_most_once"),
        ("rcptlatin1-alo", "rcptlatin1@example.com", "at_least_once"),
    ] {
        post_mail(&app, id, to, None, semantics).await;
    }
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 4);
    let expect = [
        // DATA, then the content: its reply unread.
        ("latin1-amo", "unconfirmed", "ambiguous", "unparsable_reply"),
        // BDAT: the envelope and the content in one write, every reply read in turn.
        ("latin1-alo", "retryable", "ambiguous", "unparsable_reply"),
        // DATA: the refusal of the only recipient unread, nothing sent.
        (
            "rcptlatin1-amo",
            "retryable",
            "not_sent",
            "unparsable_reply_before_data",
        ),
        // BDAT: the content went behind the unread refusal.
        (
            "rcptlatin1-alo",
            "retryable",
            "ambiguous",
            "unparsable_reply",
        ),
    ];
    for (id, want_state, want_class, want_kind) in expect {
        let (state, last, class, kind) = outcome(&app, id).await;
        assert_eq!(
            (state.as_str(), last.as_str(), class.as_str()),
            (want_state, want_class, want_class),
            "{id}"
        );
        assert_eq!(kind.as_deref(), Some(want_kind), "{id}");
    }
    assert_eq!(sink.accepted().len(), 2, "both latin1@ messages were taken");
    app.stop().await;
}

/// Pipelined: a reused connection is checked by an RSET at the head of the envelope's write, no
/// round trip of its own (RFC 2920 lets RSET stand anywhere in a group; NOOP only at its end:
/// Postfix logs "improper command pipelining after NOOP" otherwise). Without pipelining, by a
/// NOOP answered before MAIL FROM leaves.
async fn smtp_connections_are_reused_and_a_closed_one_is_replaced(backend: Backend) {
    connections_are_reused(backend, true, false).await;
}

/// Without PIPELINING.
async fn smtp_connections_are_reused_and_a_closed_one_is_replaced_without_pipelining(
    backend: Backend,
) {
    connections_are_reused(backend, false, false).await;
}

/// A connection that rested for `smtp_noop_after_idle_ms` or longer (here 0: every one) is
/// checked with a NOOP of its own, pipelining or not.
async fn smtp_a_connection_that_rested_is_checked_with_a_noop(backend: Backend) {
    connections_are_reused(backend, true, true).await;
}

async fn connections_are_reused(backend: Backend, offered: bool, rested: bool) {
    let sink = sink_offering_pipelining(offered).await;
    // The rest that makes a NOOP: none (every reuse) or a minute (none in this test).
    let noop_after = if rested { 0 } else { 60_000 };
    let extra = format!("smtp_noop_after_idle_ms = {noop_after}\n");
    let app = smtp_app(backend, &sink, &extra).await;
    // One at a time: the second send finds the first one's parked connection.
    for (id, to) in [("pool-1", "ada@example.com"), ("pool-2", "bye@example.com")] {
        post_mail(&app, id, to, None, "at_most_once").await;
        assert_eq!(app.herald.sender.run_once().await.unwrap(), 1, "{id}");
        assert_eq!(app.message(id).await["state"], "delivered", "{id}");
    }
    assert_eq!(sink.connections(), 1, "the parked connection was reused");
    // The server closed that connection after pool-2: the check finds out, and a new
    // connection carries the next message; nothing is misread as a failed send.
    post_mail(&app, "pool-3", "bob@example.com", None, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(app.message("pool-3").await["state"], "delivered");
    assert_eq!(app.attempts("pool-3").len(), 1);
    assert_eq!(sink.connections(), 2);
    assert_eq!(sink.accepted().len(), 3);
    // pool-2's reuse was checked: pipelined, by an RSET with its envelope behind it; else by a
    // NOOP alone (pool-3's check went to a closed connection, which read nothing).
    let (resets, noops) = if offered && !rested {
        ((1, 0), (0, 0))
    } else {
        ((0, 0), (0, 1))
    };
    assert_eq!(sink.resets(), resets, "(pipelined, alone) RSETs");
    assert_eq!(sink.noops(), noops, "(pipelined, alone) NOOPs");
    assert_envelopes(&sink, offered, 3);
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
    let app = smtp_app(backend, &sink, "").await;
    let ids = ["greet-amo", "greet-alo", "greet-alo-2"];
    // One at a time, each past the pause the previous refusal may have put on the relay (a 421
    // greeting slows the relay down: tests/it/slowdown.rs).
    for (id, to, semantics) in [
        (ids[0], "ada@example.com", "at_most_once"),
        (ids[1], "bob@example.com", "at_least_once"),
        (ids[2], "cy@example.com", "at_least_once"),
    ] {
        post_mail(&app, id, to, None, semantics).await;
        assert_eq!(app.herald.sender.run_once().await.unwrap(), 1, "{id}");
        app.advance(std::time::Duration::from_secs(600));
        // The refused ones are due again by now: out of the way of the next.
        cancel(&app, id).await;
    }
    for id in ids {
        let (state, last, class, kind) = outcome(&app, id).await;
        assert_eq!(
            (state.as_str(), last.as_str(), class.as_str()),
            ("canceled", "not_sent", "not_sent"),
            "{id}: retryable, then canceled by the test"
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

/// A relay that repeats the login it got in its refusal (base64 and decoded): the password, the
/// user name and the AUTH response carrying them are hidden in the attempt's stored excerpt.
/// Before, they were stored in clear; the README says credentials never appear in an attempt
/// row.
async fn smtp_a_relay_echoing_the_login_keeps_it_out_of_the_excerpt(backend: Backend) {
    use base64::Engine;
    let sink = SmtpSink::start_scripted(Script {
        echo_auth: true,
        ..Script::default()
    })
    .await;
    let url = sink
        .url
        .replace("smtp://", "smtp://herald-user:Hunter2-S3cret@");
    let app = spawn_app_with(backend, &format!("smtp_url = \"{url}\"\n")).await;
    post_mail(&app, "echo-login", "ada@example.com", None, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    let a = &app.attempts("echo-login")[0];
    assert_eq!(a.response_status, Some(535));
    let excerpt = a.response_excerpt.clone().unwrap_or_default();
    assert!(
        excerpt.contains("authentication failed: [secret] ( [secret] [secret])"),
        "{excerpt}"
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    let plain = b64.encode("\0herald-user\0Hunter2-S3cret");
    let user = b64.encode("herald-user");
    for secret in [
        "Hunter2-S3cret",
        "herald-user",
        plain.as_str(),
        user.as_str(),
    ] {
        assert!(!excerpt.contains(secret), "{secret} in {excerpt}");
    }
    app.stop().await;
}

/// lettre 0.11's connection authenticates over plain TCP when told to (only its transport
/// builder refuses credentials without TLS), so the sink can refuse AUTH PLAIN itself.
/// A refused login is `not_sent` (code kept), and it pauses the relay: the mail behind it waits
/// without a connection and without spending an attempt, logged once at WARN with the error
/// kind, until the pause ends and the next message tries again.
async fn smtp_auth_refused_is_not_sent(backend: Backend) {
    let sink = SmtpSink::start_scripted(Script {
        auth_reply: Some("535 5.7.8 authentication credentials invalid"),
        ..Script::default()
    })
    .await;
    let url = sink.url.replace("smtp://", "smtp://herald:hunter2@");
    let logs = captured_logs();
    let app = spawn_app_with(backend, &format!("smtp_url = \"{url}\"\n")).await;
    // The test app's retry base (1 s) is the first pause; each in a row doubles it.
    for (id, to, semantics, pause) in [
        ("auth-amo", "ada@example.com", "at_most_once", 1),
        ("auth-alo", "bob@example.com", "at_least_once", 2),
    ] {
        post_mail(&app, id, to, None, semantics).await;
        let logins = sink.auth_commands();
        assert_eq!(app.herald.sender.run_once().await.unwrap(), 1, "{id}");
        assert!(
            sink.auth_commands() > logins,
            "{id}: Herald never sent AUTH"
        );
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
        // The relay is paused: the next message waits, no login tried, no attempt spent.
        let waiting = format!("{id}-next");
        post_mail(&app, &waiting, "cy@example.com", None, semantics).await;
        let logins = sink.auth_commands();
        app.herald.sender.run_once().await.unwrap();
        assert_eq!(
            sink.auth_commands(),
            logins,
            "{waiting}: no login while paused"
        );
        assert!(app.attempts(&waiting).is_empty(), "{waiting}");
        let view = app.message(&waiting).await;
        assert_eq!(
            (&view["state"], &view["last_error_class"], &view["attempts"]),
            (&json!("retryable"), &json!("rate_limited"), &json!(0)),
            "{waiting}: {view}"
        );
        cancel(&app, &waiting).await;
        app.advance(std::time::Duration::from_secs(pause));
        cancel(&app, id).await;
    }
    // Once the pause ends (the third in a row: 4 s), one message probes the relay and the other
    // waits for its answer: one login, one attempt spent, not one each.
    app.advance(std::time::Duration::from_secs(4));
    for id in ["probe-a", "probe-b"] {
        post_mail(&app, id, "dee@example.com", None, "at_least_once").await;
    }
    let logins = sink.auth_commands();
    app.herald.sender.run_once().await.unwrap();
    assert_eq!(sink.auth_commands(), logins + 1, "one probe");
    let spent: Vec<usize> = ["probe-a", "probe-b"]
        .iter()
        .map(|id| app.attempts(id).len())
        .collect();
    assert_eq!(spent.iter().sum::<usize>(), 1, "{spent:?}");
    assert!(sink.accepted().is_empty());
    // The capture is the process's (other tests' lines too): the pause is said at WARN with its
    // error kind, and the password is in no line.
    let text = logs.text();
    assert!(
        text.lines().any(|l| l.contains("WARN")
            && l.contains("destination slowed down")
            && l.contains("error_kind=\"smtp_auth_refused\"")),
        "{text}"
    );
    assert!(!text.contains("hunter2"));
    app.stop().await;
}

/// A reply code in the envelope keeps its code-based class, and a 421 there closes the
/// connection even when the server itself leaves it open: the next message uses a new one.
async fn smtp_a_421_in_the_envelope_is_transient_and_closes_the_connection(backend: Backend) {
    a_421_drops_the_connection(backend, "t421@example.com", None).await;
}

/// The same when the server does close the channel after its 421, at RCPT TO or at MAIL FROM.
async fn smtp_a_421_that_closes_the_channel_is_transient_and_the_next_send_reconnects(
    backend: Backend,
) {
    a_421_drops_the_connection(backend, "rcpt421@example.com", None).await;
}

async fn smtp_a_421_to_mail_from_is_transient_and_the_next_send_reconnects(backend: Backend) {
    a_421_drops_the_connection(backend, "ada@example.com", Some("mail421@example.com")).await;
}

async fn a_421_drops_the_connection(backend: Backend, to: &str, from: Option<&str>) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "").await;
    // A first message parks a connection, so the 421 comes on a reused one.
    post_mail(&app, "before-421", "ada@example.com", None, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(sink.connections(), 1);
    post_mail(&app, "rcpt-421", to, from, "at_most_once").await;
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
    assert_eq!(sink.accepted().len(), 2);
    app.stop().await;
}

/// Ten sends at once through a pool of two: never more than two SMTP sessions, all delivered.
async fn smtp_open_connections_are_bounded_by_the_pool_size(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(
        backend,
        &sink,
        "smtp_pool_size = 2\nsmtp_timeout_ms = 10000\n",
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
    parked_connection_went_silent(backend, true).await;
}

async fn smtp_a_parked_connection_that_went_silent_is_replaced_without_pipelining(
    backend: Backend,
) {
    parked_connection_went_silent(backend, false).await;
}

async fn parked_connection_went_silent(backend: Backend, offered: bool) {
    let sink = sink_offering_pipelining(offered).await;
    // A connection that rested (`smtp_noop_after_idle_ms`; here every one): a NAT or a firewall
    // may have dropped it without a word, so its check is a NOOP with a bound of its own.
    let app = smtp_app(
        backend,
        &sink,
        "smtp_timeout_ms = 2000\nsmtp_noop_after_idle_ms = 0\n",
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
    // The silent connection read mute-2's NOOP without a word: only the two envelopes answered
    // count, and the check cost its bound (a quarter of the 2 s timeout), not the attempt, which
    // went on over a new connection and delivered.
    assert_envelopes(&sink, offered, 2);
    app.stop().await;
}

/// Posts and sends each message on its own: each `delivered`, `accepted`, in one attempt.
async fn deliver_one_at_a_time(app: &TestApp, ids: &[&str], to: &str) {
    deliver_one_at_a_time_as(app, ids, to, "at_most_once").await;
}

async fn deliver_one_at_a_time_as(app: &TestApp, ids: &[&str], to: &str, semantics: &str) {
    for id in ids {
        post_mail(app, id, to, None, semantics).await;
        assert_eq!(app.herald.sender.run_once().await.unwrap(), 1, "{id}");
        let (state, _, class, kind) = outcome(app, id).await;
        assert_eq!(
            (state.as_str(), class.as_str(), kind),
            ("delivered", "accepted", None),
            "{id}"
        );
        assert_eq!(app.attempts(id).len(), 1, "{id}");
    }
}

/// A reused connection whose server answers the check (its RSET) with 421 but goes on answering
/// what follows: Herald closes it without sending the content, the same attempt goes on over a
/// new connection, and the 421 is not taken for an answer to this message (the old session's
/// end): one attempt, accepted.
async fn smtp_a_reused_connection_refusing_its_check_is_replaced(backend: Backend) {
    let sink = SmtpSink::start_scripted(Script {
        refuse_reset: true,
        ..Script::default()
    })
    .await;
    let app = smtp_app(backend, &sink, "smtp_noop_after_idle_ms = 60000\n").await;
    deliver_one_at_a_time(&app, &["reset-1", "reset-2"], "ada@example.com").await;
    assert_eq!(sink.resets(), (1, 0), "(pipelined, alone) RSETs");
    assert_eq!(sink.connections(), 2);
    assert_eq!(sink.accepted().len(), 2);
    // The refused session was answered 354 to its DATA, yet no content left on it.
    assert_eq!(sink.received().len(), 2, "contents that reached the sink");
    assert_envelopes(&sink, true, 3);
    app.stop().await;
}

/// A relay that holds its replies to a pipelined group until it has read the whole group, as
/// Postfix and Exim do, and takes longer over RCPT TO than the NOOP check's bound (a DNS list, a
/// policy service): RSET's reply comes only with the others, and the reused connection is kept,
/// not taken for a silent one.
async fn smtp_a_relay_holding_its_pipelined_replies_keeps_its_connections(backend: Backend) {
    relay_holding_its_pipelined_replies(backend, "at_most_once").await;
}

/// The same with CHUNKING: every reply, BDAT's included, comes once the relay has read the
/// chunk, and the connection is kept.
async fn smtp_a_relay_holding_its_pipelined_replies_keeps_its_connections_with_chunking(
    backend: Backend,
) {
    relay_holding_its_pipelined_replies(backend, "at_least_once").await;
}

async fn relay_holding_its_pipelined_replies(backend: Backend, semantics: &str) {
    let sink = SmtpSink::start_scripted(Script {
        hold_replies: true,
        ..Script::default()
    })
    .await;
    // A 2 s timeout: the NOOP check's bound is 500 ms, the RCPT TO takes 800 ms.
    let app = smtp_app(
        backend,
        &sink,
        "smtp_timeout_ms = 2000\nsmtp_noop_after_idle_ms = 60000\n",
    )
    .await;
    let ids = ["held-1", "held-2", "held-3"];
    deliver_one_at_a_time_as(&app, &ids, "slowrcpt@example.com", semantics).await;
    assert_eq!(sink.connections(), 1, "the connection was kept");
    assert_eq!(sink.resets(), (2, 0), "(pipelined, alone) RSETs");
    assert_envelopes(&sink, true, 3);
    let chunked = if semantics == "at_least_once" { 3 } else { 0 };
    assert_eq!(sink.chunks(), chunked, "BDAT commands");
    app.stop().await;
}

/// A connection reused within its short rest, checked by the RSET at the head of its pipelined
/// envelope, that went silent (a hung relay): its reply is awaited for the whole attempt (a relay
/// may hold it while it runs its RCPT TO checks), so the attempt ends `not_sent` before DATA, and
/// the retry goes over a new connection.
async fn smtp_a_connection_silent_after_its_rset_costs_the_attempt(backend: Backend) {
    connection_silent_after_its_rset(backend, "at_most_once", "not_sent", "timeout_before_data")
        .await;
}

/// A message to `mute@` (250, then silence), then one over the same parked connection, sent
/// `semantics`: its attempt ends `class`/`kind` on that connection alone, and the retry after
/// the backoff goes over a new connection and delivers.
async fn connection_silent_after_its_rset(
    backend: Backend,
    semantics: &str,
    class: &str,
    kind: &str,
) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(
        backend,
        &sink,
        "smtp_timeout_ms = 1000\nsmtp_noop_after_idle_ms = 60000\n",
    )
    .await;
    deliver_one_at_a_time_as(&app, &["hush-1"], "mute@example.com", semantics).await;
    post_mail(&app, "hush-2", "ada@example.com", None, semantics).await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    let (state, last, got_class, got_kind) = outcome(&app, "hush-2").await;
    assert_eq!(
        (
            state.as_str(),
            last.as_str(),
            got_class.as_str(),
            got_kind.as_deref()
        ),
        ("retryable", class, class, Some(kind))
    );
    assert_eq!(
        sink.connections(),
        1,
        "no second connection within the attempt"
    );
    app.advance(std::time::Duration::from_secs(600));
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(app.message("hush-2").await["state"], "delivered");
    assert_eq!(app.attempts("hush-2").len(), 2);
    assert_eq!(sink.connections(), 2);
    assert_eq!(sink.accepted().len(), 2);
    app.stop().await;
}

/// Lines of the text that begin with a dot go out with a second one (RFC 5321 transparency: a
/// lone dot would end the content early), and the server takes out the dots it was given: the
/// message arrives whole (the bytes are compared with lettre's own in the unit test
/// `the_content_in_one_write_is_what_lettre_sends_in_two`).
async fn smtp_lines_that_begin_with_a_dot_arrive_whole(backend: Backend) {
    lines_that_begin_with_a_dot_arrive_whole(backend, false).await;
}

/// With CHUNKING, BDAT counts bytes: the content goes as it is, no dot added, and arrives whole.
async fn smtp_lines_that_begin_with_a_dot_arrive_whole_with_chunking(backend: Backend) {
    lines_that_begin_with_a_dot_arrive_whole(backend, true).await;
}

async fn lines_that_begin_with_a_dot_arrive_whole(backend: Backend, chunking: bool) {
    let sink = SmtpSink::start_scripted(Script {
        no_chunking: !chunking,
        ..Script::default()
    })
    .await;
    let app = smtp_app(backend, &sink, "").await;
    let text = "first\n.hidden\n.\n..two\nlast.\n";
    post_payload(
        &app,
        "dots-1",
        "ada@example.com",
        json!({"subject": "Dots", "text": text}),
        "at_least_once",
    )
    .await;
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.message("dots-1").await["state"], "delivered");
    let received = sink.received();
    assert_eq!(received.len(), 1);
    assert_eq!(sink.chunks(), usize::from(chunking), "BDAT commands");
    let raw = &received[0];
    let unstuffed: String = if chunking {
        for whole in ["\r\n.hidden\r\n", "\r\n.\r\n", "\r\n..two\r\n"] {
            assert!(raw.contains(whole), "{whole:?} in {raw:?}");
        }
        assert!(!raw.contains("\r\n...two\r\n"), "a dot added: {raw:?}");
        raw.clone()
    } else {
        for stuffed in ["\r\n..hidden\r\n", "\r\n..\r\n", "\r\n...two\r\n"] {
            assert!(raw.contains(stuffed), "{stuffed:?} in {raw:?}");
        }
        // What the server stores: each line with its first dot taken out (RFC 5321 §4.5.2).
        raw.split_inclusive("\r\n")
            .map(|l| l.strip_prefix('.').unwrap_or(l))
            .collect()
    };
    // The same content both ways: the CRLF before DATA's final dot is the last line's own end,
    // no blank line added (lettre's `message` added one: the text ended a line longer by DATA).
    let last = text.trim_end().replace('\n', "\r\n");
    let tail = unstuffed.rsplit_once(&last).map(|(_, t)| t);
    assert_eq!(tail, Some("\r\n\r\n"), "chunking {chunking}: {unstuffed:?}");
    let parsed = mail_parser::MessageParser::default()
        .parse(unstuffed.as_bytes())
        .expect("an RFC 5322 message");
    // The CRLF before the final dot ends the content's last line; it is not part of the text.
    let body = parsed.body_text(0).map(|t| t.replace("\r\n", "\n"));
    assert_eq!(body.as_deref().map(|b| b.trim_end()), Some(text.trim_end()));
    assert!(body.unwrap().starts_with(text));
    app.stop().await;
}

/// A non-ASCII address needs SMTPUTF8 (RFC 6531/6532), which the test server does not offer:
/// in the envelope (the recipient), and in a header only (`Reply-To`: lettre writes its UTF-8
/// as it is) — 8BITMIME alone does not allow UTF-8 in headers. Each is `permanent`,
/// `unsupported_by_server`, before any content leaves; the ASCII message beside them goes.
async fn smtp_a_non_ascii_address_needs_smtputf8(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "").await;
    post_mail(&app, "utf8-rcpt", "josé@example.com", None, "at_least_once").await;
    let payload = json!({"subject": "Hi", "text": "Hello", "reply_to": "josé@example.com"});
    post_payload(
        &app,
        "utf8-reply-to",
        "ada@example.com",
        payload,
        "at_least_once",
    )
    .await;
    post_mail(&app, "ascii", "ada@example.com", None, "at_least_once").await;
    app.run_until_idle().await;
    for id in ["utf8-rcpt", "utf8-reply-to"] {
        assert_eq!(app.message(id).await["state"], "dead_letter", "{id}");
        let a = &app.attempts(id)[0];
        assert_eq!(
            (a.class, a.error_kind.as_deref()),
            (
                herald::domain::AttemptClass::Permanent,
                Some("unsupported_by_server")
            ),
            "{id}"
        );
    }
    assert_eq!(app.message("ascii").await["state"], "delivered");
    assert_eq!(sink.received().len(), 1);
    app.stop().await;
}

/// An internationalized domain needs no SMTPUTF8: Herald writes it in its ASCII form (IDNA
/// A-labels) in the envelope and in every header, so the test server, which offers no SMTPUTF8,
/// takes the mail — recipient, cc, reply_to and the display name's domain alike — and nothing
/// non-ASCII is in its head. The stored destination stays as it was written.
async fn smtp_an_internationalized_domain_goes_in_its_ascii_form(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "").await;
    let payload = json!({"subject": "Hi", "text": "Hello",
        "cc": ["bob@straße.example"], "reply_to": "Desk <desk@BÜCHER.example>"});
    post_payload(
        &app,
        "idn",
        "Ada <ada@bücher.example>",
        payload,
        "at_least_once",
    )
    .await;
    app.run_until_idle().await;
    let view = app.message("idn").await;
    assert_eq!(view["state"], "delivered", "{view}");
    assert_eq!(view["destination"], "Ada <ada@bücher.example>");
    let mail = &sink.accepted()[0];
    let mut rcpts = mail.rcpts.clone();
    rcpts.sort();
    assert_eq!(
        rcpts,
        ["<ada@xn--bcher-kva.example>", "<bob@xn--strae-oqa.example>"]
    );
    let head = mail.data.split("\r\n\r\n").next().unwrap_or_default();
    assert!(head.is_ascii(), "{head}");
    for header in [
        "To: Ada <ada@xn--bcher-kva.example>",
        "Cc: bob@xn--strae-oqa.example",
        "Reply-To: Desk <desk@xn--bcher-kva.example>",
    ] {
        assert!(head.contains(header), "{header} in {head}");
    }
    app.stop().await;
}

/// A 3xx to the content (a server out of step: `354` once more) is no acceptance: lettre reads it
/// as positive, but only a 2xx says the message was taken. `ambiguous`, `unexpected_reply`: an
/// at_least_once message is retried, an at_most_once one is `unconfirmed`. It was `permanent`, a
/// dead letter, by its code.
async fn smtp_a_3xx_to_the_content_is_ambiguous(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "").await;
    for (id, semantics) in [("odd-least", "at_least_once"), ("odd-most", "at_most_once")] {
        post_mail(&app, id, "data354@example.com", None, semantics).await;
        assert_eq!(app.herald.sender.run_once().await.unwrap(), 1, "{id}");
    }
    // Never parked after such a reply: each message on a connection of its own (the next one's
    // commands would have been read as content by a server still reading it).
    assert_eq!(sink.connections(), 2);
    for (id, state) in [("odd-least", "retryable"), ("odd-most", "unconfirmed")] {
        assert_eq!(app.message(id).await["state"], state, "{id}");
        let a = &app.attempts(id)[0];
        assert_eq!(
            (a.class, a.response_status, a.error_kind.as_deref()),
            (
                herald::domain::AttemptClass::Ambiguous,
                Some(354),
                Some("unexpected_reply")
            ),
            "{id}"
        );
    }
    app.stop().await;
}

/// The queue id in the server's 250 to the content is the attempt's and the message's provider
/// message id; a 250 without one leaves both empty.
async fn smtp_the_queue_id_of_a_250_is_the_provider_message_id(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "").await;
    let table = [
        ("queue-postfix", "postfix@example.com", Some("ABC123")),
        ("queue-exim", "exim@example.com", Some("1abcde-000123-XY")),
        (
            "queue-ses",
            "ses@example.com",
            Some("0100018c9f0e5a3b-6c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f-000000"),
        ),
        ("queue-plain", "plain@example.com", None),
        ("queue-sink", "ada@example.com", Some("SINK-1")),
    ];
    for (id, to, _) in table {
        post_mail(&app, id, to, None, "at_least_once").await;
        // One at a time, so the sink's own queue ids come in a known order.
        assert_eq!(app.herald.sender.run_once().await.unwrap(), 1, "{id}");
    }
    for (id, _, want) in table {
        let view = app.message(id).await;
        assert_eq!(view["state"], "delivered", "{id}");
        assert_eq!(view["provider_message_id"].as_str(), want, "{id}");
        assert_eq!(app.row(id).provider_message_id.as_deref(), want, "{id}");
        let a = &app.attempts(id)[0];
        assert_eq!(a.provider_message_id.as_deref(), want, "{id}");
        assert_eq!(
            (a.response_status, a.error_kind.as_deref()),
            (Some(250), None)
        );
    }
    app.stop().await;
}

/// Three recipients (the destination, a cc and a bcc), one refused at RCPT TO: the message goes
/// to the two others and the attempt is `accepted`, listing the refused one masked with its code.
/// Pipelined (the sink offers PIPELINING, as Postfix does).
async fn smtp_a_recipient_refused_at_rcpt_is_listed_masked_and_the_others_get_the_message(
    backend: Backend,
) {
    recipient_refused_at_rcpt(backend, true, true).await;
}

/// The same, with a server that does not offer PIPELINING: one command, one reply.
async fn smtp_a_recipient_refused_without_pipelining_is_listed_the_same(backend: Backend) {
    recipient_refused_at_rcpt(backend, false, true).await;
}

/// The same, offered but switched off by `smtp_pipelining = false`.
async fn smtp_pipelining_switched_off_is_not_used_when_offered(backend: Backend) {
    recipient_refused_at_rcpt(backend, true, false).await;
}

async fn recipient_refused_at_rcpt(backend: Backend, offered: bool, enabled: bool) {
    let logs = captured_logs();
    let sink = sink_offering_pipelining(offered).await;
    let extra = format!("smtp_pipelining = {enabled}\n");
    let app = smtp_app(backend, &sink, &extra).await;
    let payload = json!({
        "subject": "Hi", "text": "Hello",
        "cc": ["bob@example.com"], "bcc": ["rcpt550@example.com"],
    });
    post_payload(
        &app,
        "some-refused",
        "ada@example.com",
        payload,
        "at_most_once",
    )
    .await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    let mails = sink.accepted();
    assert_eq!(mails.len(), 1);
    assert_eq!(mails[0].mail_from, "<herald@localhost>");
    let mut envelope = mails[0].rcpts.clone();
    envelope.sort();
    assert_eq!(envelope, ["<ada@example.com>", "<bob@example.com>"]);
    let (state, last, class, kind) = outcome(&app, "some-refused").await;
    assert_eq!(
        (state.as_str(), last.as_str(), class.as_str()),
        ("delivered", "", "accepted")
    );
    assert_eq!(kind.as_deref(), Some("recipients_refused"));
    let a = &app.attempts("some-refused")[0];
    assert_eq!(a.response_status, Some(250));
    let excerpt = a.response_excerpt.clone().unwrap_or_default();
    assert!(
        excerpt.ends_with("; refused at RCPT TO: r***@e***.com 550"),
        "{excerpt}"
    );
    // Support sees it: the explanation's attempt names the refused recipient, masked, and its
    // words say the message did not reach everyone.
    let explained = app.explain("some-refused").await;
    assert_eq!(
        explained["attempt_timeline"][0]["note"],
        "refused at RCPT TO: r***@e***.com 550"
    );
    let words = explained["explanation"].as_str().unwrap_or_default();
    assert!(
        words.contains("but not to every recipient: refused at RCPT TO: r***@e***.com 550"),
        "{words}"
    );
    // No clear address on the attempt, in the message view, the explanation or any log line.
    let view = app.message("some-refused").await.to_string();
    for shown in [format!("{a:?}"), view, explained.to_string(), logs.text()] {
        assert!(!shown.contains("rcpt550@"), "{shown}");
    }
    assert_envelopes(&sink, offered && enabled, 1);
    // One connection: lettre's EHLO, and Herald's second one only while pipelining is on.
    assert_eq!(sink.connections(), 1);
    assert_eq!(sink.ehlos(), if enabled { 2 } else { 1 }, "EHLOs");
    app.stop().await;
}

/// A relay that takes at most two recipients in one transaction answers the rest 452 (RFC 5321
/// §4.5.3.1.10): Herald sends them in next transactions on the same connection, within the same
/// attempt, until each is taken or refused otherwise. Six recipients, one of them refused 550:
/// five get the message (the same content, Message-ID included) in three transactions, and the
/// attempt lists only the 550. Before, the four past the limit were listed refused and never
/// sent. Pipelined with DATA (`at_most_once`), pipelined with BDAT (`at_least_once`), and one
/// command at a time. An older relay answering 552 instead is taken the same way (RFC 5321
/// §4.5.3.1.10; it dead-lettered the message: an SMTP walk-through).
async fn smtp_recipients_past_the_relays_limit_go_in_a_next_transaction(backend: Backend) {
    for (offered, semantics, reply) in [
        (true, "at_most_once", None),
        (true, "at_least_once", None),
        (false, "at_most_once", None),
        (true, "at_most_once", Some("552 5.5.3 Too many recipients")),
    ] {
        past_the_limit(backend, offered, semantics, reply).await;
    }
}

async fn past_the_limit(
    backend: Backend,
    offered: bool,
    semantics: &str,
    reply: Option<&'static str>,
) {
    let sink = sink_taking(
        2,
        Script {
            no_pipelining: !offered,
            too_many_reply: reply,
            ..Script::default()
        },
    )
    .await;
    let app = smtp_app(backend, &sink, "").await;
    let payload = json!({
        "subject": "Hi", "text": "Hello",
        "to": ["bob@example.com", "cy@example.com"], "cc": ["dee@example.com"],
        "bcc": ["rcpt550@example.com", "eve@example.com"],
    });
    post_payload(&app, "many", "ada@example.com", payload, semantics).await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    let mails = sink.accepted();
    let context = format!("{semantics}, pipelining offered: {offered}, {reply:?}");
    assert_eq!(mails.len(), 3, "{context}");
    assert!(mails.iter().all(|m| m.rcpts.len() <= 2), "{context}");
    let mut got: Vec<String> = mails.iter().flat_map(|m| m.rcpts.clone()).collect();
    got.sort();
    assert_eq!(
        got,
        ["ada", "bob", "cy", "dee", "eve"].map(|n| format!("<{n}@example.com>")),
        "{context}"
    );
    let message_id = |m: &crate::support::smtp_sink::Mail| {
        m.data
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("message-id:"))
            .map(str::to_owned)
    };
    assert!(message_id(&mails[0]).is_some());
    assert!(mails.iter().all(|m| message_id(m) == message_id(&mails[0])));
    assert!(mails.iter().all(|m| m.data == mails[0].data), "{context}");
    let (state, _, class, kind) = outcome(&app, "many").await;
    assert_eq!((state.as_str(), class.as_str()), ("delivered", "accepted"));
    assert_eq!(kind.as_deref(), Some("recipients_refused"), "{context}");
    let attempts = app.attempts("many");
    assert_eq!(attempts.len(), 1, "one attempt");
    let excerpt = attempts[0].response_excerpt.clone().unwrap_or_default();
    assert!(
        excerpt.ends_with("; refused at RCPT TO: r***@e***.com 550"),
        "{context}: {excerpt}"
    );
    assert_eq!(sink.connections(), 1, "{context}");
    app.stop().await;
}

/// A next transaction begins only with half the attempt's time left, as a first one: a relay
/// whose first transaction took longer (a recipient checked for 800 ms of a 1.5 s timeout) leaves
/// the recipients past its limit listed refused, rather than send their content and run out of
/// time before the reply.
async fn smtp_no_next_transaction_begins_with_too_little_time_left(backend: Backend) {
    let sink = sink_taking(1, Script::default()).await;
    let app = smtp_app(backend, &sink, "smtp_timeout_ms = 1500\n").await;
    let excerpt = delivered_excerpt(
        &app,
        "late",
        "slowrcpt@example.com",
        &["bob@example.com"],
        "at_most_once",
    )
    .await;
    let mails = sink.accepted();
    assert_eq!(mails.len(), 1);
    assert_eq!(mails[0].rcpts, ["<slowrcpt@example.com>"]);
    assert!(
        excerpt.ends_with("; refused at RCPT TO: b***@e***.com 452"),
        "{excerpt}"
    );
    app.stop().await;
}

/// A next transaction that fails once its content left (the relay closing before its reply):
/// its recipient may have the message, and the attempt says so rather than "did not get it".
async fn smtp_a_next_transaction_lost_after_its_content_says_its_recipients_may_have_it(
    backend: Backend,
) {
    let sink = sink_taking(1, Script::default()).await;
    let app = smtp_app(backend, &sink, "").await;
    let excerpt = delivered_excerpt(
        &app,
        "lost-2nd",
        "ada@example.com",
        &["drop@example.com"],
        "at_most_once",
    )
    .await;
    assert_eq!(sink.accepted().len(), 1, "the first transaction");
    assert!(
        excerpt.ends_with(
            "; refused at RCPT TO: d***@e***.com 452 (sent again in a next transaction whose \
             end is unknown: d***@e***.com)"
        ),
        "{excerpt}"
    );
    let explained = app.explain("lost-2nd").await;
    let words = explained["explanation"].as_str().unwrap_or_default();
    assert!(
        words.contains("but for those sent again, who may have; none is retried"),
        "{words}"
    );
    assert!(!words.contains("(those did not get it, and"), "{words}");
    // A relay that takes one message a session refuses the next transaction's MAIL FROM with a
    // 421 and closes: nothing of it was taken, with BDAT too (`at_least_once`, the content in
    // the same write) — not "sent again".
    let one_per_session = sink_taking(
        1,
        Script {
            mails_per_session: Some(1),
            ..Script::default()
        },
    )
    .await;
    let other = smtp_app(backend, &one_per_session, "").await;
    let excerpt = delivered_excerpt(
        &other,
        "one-per-session",
        "ada@example.com",
        &["bob@example.com"],
        "at_least_once",
    )
    .await;
    assert_eq!(one_per_session.chunks(), 1, "BDAT");
    assert!(
        excerpt.ends_with("; refused at RCPT TO: b***@e***.com 452"),
        "{excerpt}"
    );
    other.stop().await;
    // A recipient the lost next transaction refused at RCPT TO did not get it from it; and a
    // next transaction whose content was refused (451) reached none: neither is "sent again".
    // With BDAT (`at_least_once`) the content leaves with the envelope, but 421s to every RCPT
    // TO of the next transaction prove it was not taken: not "sent again" either.
    for (id, second, third, semantics, want) in [
        (
            "lost-2nd-one-refused",
            "drop@example.com",
            "rcpt452@example.com",
            "at_most_once",
            "; refused at RCPT TO: d***@e***.com 452, r***@e***.com 452 (sent again in a next \
             transaction whose end is unknown: d***@e***.com)",
        ),
        (
            "refused-2nd-content",
            "data451@example.com",
            "bob@example.com",
            "at_most_once",
            "; refused at RCPT TO: d***@e***.com 452, b***@e***.com 452",
        ),
        (
            "chunked-2nd-421",
            "t421@example.com",
            "xt421@example.com",
            "at_least_once",
            "; refused at RCPT TO: t***@e***.com 452, x***@e***.com 452",
        ),
    ] {
        let excerpt =
            delivered_excerpt(&app, id, "ada@example.com", &[second, third], semantics).await;
        assert!(excerpt.ends_with(want), "{id}: {excerpt}");
    }
    app.stop().await;
}

/// A 452 that is not a limit (a full mailbox) is tried once more in a next transaction and then
/// stays refused; the message was taken for the others, and the next message goes on a new
/// connection (the one whose transaction was refused is closed, its DATA perhaps pending).
async fn smtp_a_recipient_refused_452_twice_stays_refused(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "").await;
    let excerpt = delivered_excerpt(
        &app,
        "full",
        "ada@example.com",
        &["rcpt452@example.com"],
        "at_most_once",
    )
    .await;
    assert_eq!(sink.accepted().len(), 1);
    let (_, _, _, kind) = outcome(&app, "full").await;
    assert_eq!(kind.as_deref(), Some("recipients_refused"));
    assert!(
        excerpt.ends_with("; refused at RCPT TO: r***@e***.com 452"),
        "{excerpt}"
    );
    post_payload(
        &app,
        "after",
        "bob@example.com",
        json!({"subject": "Hi", "text": "Hello"}),
        "at_most_once",
    )
    .await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(app.message("after").await["state"], "delivered");
    assert_eq!(sink.accepted().len(), 2);
    assert_eq!(sink.connections(), 2);
    app.stop().await;
}

/// Every recipient refused: nothing is sent; any 4xx among the refusals makes it transient (that
/// recipient may take it later), all 5xx permanent. Pipelined: DATA left with the envelope and
/// the server refused it (554, no valid recipients).
async fn smtp_all_recipients_refused_is_decided_by_their_codes(backend: Backend) {
    all_recipients_refused(backend, true).await;
}

/// The same without PIPELINING: DATA is never sent.
async fn smtp_all_recipients_refused_without_pipelining_is_decided_the_same(backend: Backend) {
    all_recipients_refused(backend, false).await;
}

async fn all_recipients_refused(backend: Backend, offered: bool) {
    let sink = sink_offering_pipelining(offered).await;
    let app = smtp_app(backend, &sink, "").await;
    let table = [
        (
            "all-refused-5xx",
            "rcpt550@example.com",
            "rcpt553@example.com",
            "dead_letter",
            "permanent",
            550,
            "r***@e***.com 550, r***@e***.com 553",
        ),
        (
            "all-refused-4xx",
            "rcpt550@example.com",
            "rcpt452@example.com",
            "retryable",
            "transient",
            452,
            "r***@e***.com 550, r***@e***.com 452",
        ),
    ];
    for (id, to, cc, ..) in table {
        let payload = json!({"subject": "Hi", "text": "Hello", "cc": [cc]});
        post_payload(&app, id, to, payload, "at_most_once").await;
    }
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 2);
    for (id, _, _, want_state, want_class, code, listed) in table {
        let (state, last, class, kind) = outcome(&app, id).await;
        assert_eq!(
            (state.as_str(), last.as_str(), class.as_str()),
            (want_state, want_class, want_class),
            "{id}"
        );
        assert_eq!(kind.as_deref(), Some("recipients_refused"), "{id}");
        let a = &app.attempts(id)[0];
        assert_eq!(a.response_status, Some(code), "{id}");
        assert_eq!(
            a.response_excerpt.as_deref(),
            Some(format!("every recipient refused at RCPT TO: {listed}").as_str()),
            "{id}"
        );
    }
    assert!(sink.accepted().is_empty());
    assert!(sink.received().is_empty(), "no content was sent");
    assert_envelopes(&sink, offered, table.len());
    app.stop().await;
}

/// A pipelining server that answers 354 to the DATA of an envelope whose every recipient it
/// refused (RFC 2920 tells the client not to assume a refusal): Herald sends no content, the
/// attempt is the refusal, and the connection is closed rather than parked in the middle of
/// DATA.
async fn smtp_a_354_after_every_recipient_refused_gets_no_content(backend: Backend) {
    let (sink, app) = refused_by_a_lax_relay(backend, "lax-1", "at_most_once").await;
    assert_envelopes(&sink, true, 1);
    // The next message gets a new connection: the first was closed in the middle of DATA,
    // which ended it without a message.
    post_mail(&app, "lax-2", "ada@example.com", None, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(app.message("lax-2").await["state"], "delivered");
    assert_eq!(sink.connections(), 2);
    let received = sink.received();
    assert_eq!(received.len(), 1, "{received:?}");
    assert!(
        received[0].contains("X-Herald-Event-Id: lax-2"),
        "{received:?}"
    );
    app.stop().await;
}

/// The same relay with CHUNKING (an `at_least_once` message): it answers the BDAT of an
/// envelope whose every recipient it refused with 250. Nothing was taken — there was no one to
/// take it for — so the attempt is the refusal, not `delivered` (it was, and a 451 to every
/// recipient was a mail lost as delivered; an email walk-through).
async fn smtp_a_250_to_bdat_after_every_recipient_refused_is_the_refusal(backend: Backend) {
    let (sink, app) = refused_by_a_lax_relay(backend, "lax-b", "at_least_once").await;
    assert_eq!(sink.chunks(), 1, "the content went by BDAT");
    app.stop().await;
}

/// A relay that answers DATA (354) and BDAT (250) even with every recipient refused: a mail
/// `id` to a recipient it refuses 550, sent once under `semantics`, is dead-lettered as
/// `recipients_refused` (`permanent`).
async fn refused_by_a_lax_relay(
    backend: Backend,
    id: &str,
    semantics: &str,
) -> (SmtpSink, TestApp) {
    let sink = SmtpSink::start_scripted(Script {
        lax_data: true,
        ..Script::default()
    })
    .await;
    let app = smtp_app(backend, &sink, "").await;
    post_mail(&app, id, "rcpt550@example.com", None, semantics).await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    let (state, last, class, kind) = outcome(&app, id).await;
    assert_eq!(
        (state.as_str(), last.as_str(), class.as_str()),
        ("dead_letter", "permanent", "permanent")
    );
    assert_eq!(kind.as_deref(), Some("recipients_refused"));
    (sink, app)
}

/// An envelope too long for one pipelined group (RFC 2920 §3.1: the whole group must fit what
/// the connection buffers) goes one command at a time; a short one on the same relay is
/// pipelined. Both are delivered to every recipient.
async fn smtp_an_envelope_too_long_to_pipeline_goes_one_command_at_a_time(backend: Backend) {
    let sink = SmtpSink::start().await;
    // Every reuse within the rest that allows an RSET in the group: the long envelope's reuse
    // still takes a NOOP of its own.
    let app = smtp_app(backend, &sink, "smtp_noop_after_idle_ms = 60000\n").await;
    // 100 recipients of 44 characters: RCPT TO lines alone past 4 KiB.
    let cc: Vec<String> = (0..99)
        .map(|i| format!("recipient-{i:03}-of-a-long-envelope@example.com"))
        .collect();
    let long = json!({"subject": "Hi", "text": "Hello", "cc": cc});
    post_payload(&app, "long-env", "ada@example.com", long, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_envelopes(&sink, false, 1);
    let short = json!({"subject": "Hi", "text": "Hello", "cc": ["bob@example.com"]});
    post_payload(&app, "short-env", "ada@example.com", short, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(sink.envelopes(), (1, 1), "(pipelined, lockstep) envelopes");
    // The long one again, on the reused connection: checked by a NOOP alone, then lockstep.
    let long = json!({"subject": "Hi", "text": "Hello", "cc": cc});
    post_payload(&app, "long-env-2", "ada@example.com", long, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(sink.envelopes(), (1, 2), "(pipelined, lockstep) envelopes");
    assert_eq!(
        sink.resets(),
        (1, 0),
        "short-env's reuse: (pipelined, alone) RSETs"
    );
    assert_eq!(
        sink.noops(),
        (0, 1),
        "long-env-2's reuse: (pipelined, alone) NOOPs"
    );
    assert_eq!(sink.connections(), 1);
    let mails = sink.accepted();
    assert_eq!(mails.len(), 3);
    assert_eq!(mails[0].rcpts.len(), 100);
    assert_eq!(mails[1].rcpts.len(), 2);
    assert_eq!(mails[2].rcpts.len(), 100);
    for id in ["long-env", "short-env", "long-env-2"] {
        assert_eq!(app.message(id).await["state"], "delivered", "{id}");
    }
    app.stop().await;
}

/// A server that refuses a repeated EHLO (Python's `smtpd`, the README's example, answers it
/// `503 Duplicate HELO/EHLO`) is used without pipelining, the connection kept and reused.
async fn smtp_a_refused_second_ehlo_means_no_pipelining(backend: Backend) {
    let sink = SmtpSink::start_scripted(Script {
        refuse_second_ehlo: true,
        ..Script::default()
    })
    .await;
    let app = smtp_app(backend, &sink, "").await;
    for id in ["dup-ehlo-1", "dup-ehlo-2"] {
        post_mail(&app, id, "ada@example.com", None, "at_most_once").await;
        assert_eq!(app.herald.sender.run_once().await.unwrap(), 1, "{id}");
        assert_eq!(app.message(id).await["state"], "delivered", "{id}");
    }
    assert_eq!(sink.connections(), 1);
    assert_eq!(sink.ehlos(), 2, "lettre's and the refused one");
    assert_envelopes(&sink, false, 2);
    app.stop().await;
}

/// The classification table's SMTP rows, one message each, under `at_most_once` (so a transient
/// reply is shown to be retried, not left unconfirmed): replies to MAIL FROM, to RCPT TO and to
/// the content.
async fn smtp_every_reply_code_is_classified(backend: Backend) {
    every_reply_code_is_classified(backend, true).await;
}

/// The same table against a server that does not offer PIPELINING.
async fn smtp_every_reply_code_is_classified_without_pipelining(backend: Backend) {
    every_reply_code_is_classified(backend, false).await;
}

/// The same table for `at_least_once` messages, which go with CHUNKING (the sink offers it, as
/// Postfix does): the envelope, `BDAT n LAST` and the content in one write, and each reply
/// classified as it is with DATA — a refused MAIL FROM or every recipient refused proves that
/// nothing was taken although the content left, and BDAT's own reply is the content's.
async fn smtp_every_reply_code_is_classified_with_chunking(backend: Backend) {
    every_reply_code_is_classified_as(backend, true, "at_least_once").await;
}

async fn every_reply_code_is_classified(backend: Backend, offered: bool) {
    every_reply_code_is_classified_as(backend, offered, "at_most_once").await;
}

async fn every_reply_code_is_classified_as(backend: Backend, offered: bool, semantics: &str) {
    let sink = sink_offering_pipelining(offered).await;
    // A retry base long enough that no transient row is due again before the last round.
    let app = smtp_app(
        backend,
        &sink,
        "smtp_pool_size = 20\nretry_base_seconds = 30\n",
    )
    .await;
    let mut table = vec![Row {
        id: "code-250".into(),
        to: "ada@example.com".into(),
        from: None,
        state: "delivered",
        class: "accepted",
        code: 250,
        kind: None,
    }];
    let (transient, permanent) = (("retryable", "transient"), ("dead_letter", "permanent"));
    let codes = [450, 451, 452]
        .map(|c| (c, transient))
        .into_iter()
        .chain([550, 551, 552, 553, 554].map(|c| (c, permanent)));
    for (code, (state, class)) in codes {
        table.push(Row {
            id: format!("mail-{code}"),
            to: "ada@example.com".into(),
            from: Some(format!("mail{code}@example.com")),
            state,
            class,
            code,
            kind: Some("smtp_reply"),
        });
        // 552 to RCPT TO is taken as 452 (RFC 5321 §4.5.3.1.10: older servers' "too many
        // recipients"), its code kept.
        let (state, class) = if code == 552 {
            transient
        } else {
            (state, class)
        };
        table.push(Row {
            id: format!("rcpt-{code}"),
            to: format!("rcpt{code}@example.com"),
            from: None,
            state,
            class,
            code,
            kind: Some("recipients_refused"),
        });
    }
    for (code, (state, class)) in [
        (451, transient),
        (452, transient),
        (552, permanent),
        (554, permanent),
    ] {
        table.push(Row {
            id: format!("data-{code}"),
            to: format!("data{code}@example.com"),
            from: None,
            state,
            class,
            code,
            kind: Some("smtp_reply"),
        });
    }
    // The relay is paused by its BURST_COUNT-th transient reply within the burst window
    // (tests/it/slowdown.rs), and a message that waits for a connection meanwhile is then held
    // without a request: so the table goes in rounds of fewer transient rows than that, each
    // followed by a message the relay takes, which ends the row of transient replies.
    let mut rounds: Vec<Vec<&Row>> = vec![Vec::new()];
    let mut transient = 0;
    for r in &table {
        if r.class == "transient" {
            if transient + 1 == BURST_COUNT {
                rounds.push(Vec::new());
                transient = 0;
            }
            transient += 1;
        }
        rounds.last_mut().expect("a round").push(r);
    }
    for (i, round) in rounds.iter().enumerate() {
        for r in round {
            post_mail(&app, &r.id, &r.to, r.from.as_deref(), semantics).await;
        }
        assert_eq!(app.herald.sender.run_once().await.unwrap(), round.len());
        let ok = format!("ok-{i}");
        post_mail(&app, &ok, "ada@example.com", None, semantics).await;
        assert_eq!(app.herald.sender.run_once().await.unwrap(), 1, "{ok}");
        assert_eq!(app.message(&ok).await["state"], "delivered", "{ok}");
    }
    for r in &table {
        let (state, last, class, kind) = outcome(&app, &r.id).await;
        let want_last = if r.class == "accepted" { "" } else { r.class };
        assert_eq!(
            (state.as_str(), last.as_str(), class.as_str()),
            (r.state, want_last, r.class),
            "{}",
            r.id
        );
        assert_eq!(kind.as_deref(), r.kind, "{}", r.id);
        let a = &app.attempts(&r.id)[0];
        assert_eq!(a.response_status, Some(r.code), "{}", r.id);
        if r.state == "retryable" {
            // Backoff: retried later, with the delay on the attempt.
            assert!(a.delay_ms.is_some_and(|d| d > 0), "{}: {a:?}", r.id);
            let view = app.message(&r.id).await;
            assert!(view["next_attempt_at"].is_string(), "{}", r.id);
        }
    }
    let sent = table.len() + rounds.len();
    assert_eq!(
        sink.accepted().len(),
        1 + rounds.len(),
        "only code-250 and each round's ok-N were taken"
    );
    assert_envelopes(&sink, offered, sent);
    // Only `at_least_once` mail goes by BDAT; the rest by DATA, though the sink offers both.
    let chunked = offered && semantics == "at_least_once";
    assert_eq!(sink.chunks(), if chunked { sent } else { 0 });
    app.stop().await;
}

/// One row of [`smtp_every_reply_code_is_classified`]: a message and the outcome it must get.
struct Row {
    id: String,
    to: String,
    from: Option<String>,
    state: &'static str,
    class: &'static str,
    code: i32,
    kind: Option<&'static str>,
}

/// The parked connection is closed (QUIT) once it has been idle for `smtp_idle_timeout_seconds`,
/// without waiting for another send; the next send opens a new one.
async fn smtp_an_idle_connection_is_closed_after_the_idle_timeout(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "smtp_idle_timeout_seconds = 1\n").await;
    post_mail(&app, "idle-1", "ada@example.com", None, "at_most_once").await;
    let sent = Instant::now();
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(app.message("idle-1").await["state"], "delivered");
    assert_eq!(sink.open_sessions(), 1, "parked, still open");
    poll_until(Duration::from_secs(20), || sink.open_sessions() == 0).await;
    assert!(
        sent.elapsed() >= Duration::from_secs(1),
        "closed before its idle timeout"
    );
    post_mail(&app, "idle-2", "bob@example.com", None, "at_most_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(app.message("idle-2").await["state"], "delivered");
    assert_eq!(sink.connections(), 2);
    app.stop().await;
}

/// `smtp://…?tls=required` against a relay whose certificate a private CA signed, trusted through
/// `smtp_ca_file`: STARTTLS, then AUTH PLAIN inside TLS, then the message.
async fn smtp_starttls_with_a_private_ca_delivers_over_tls(backend: Backend) {
    let ca = TestCa::new();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write_ca(dir.path());
    let sink = SmtpSink::start_scripted(Script {
        tls: Some(TlsMode::StartTls(ca.server_config())),
        auth: Some(Auth {
            mechanisms: "PLAIN",
            username: "herald",
            password: "tls-secret-42",
        }),
        ..Script::default()
    })
    .await;
    let url = format!("smtp://herald:tls-secret-42@{}?tls=required", sink.addr);
    let app = spawn_app_with(
        backend,
        &format!(
            "smtp_url = \"{url}\"\nsmtp_ca_file = {:?}\n",
            ca_file.to_str().unwrap()
        ),
    )
    .await;
    post_mail(&app, "starttls-1", "ada@example.com", None, "at_least_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    let (state, _, class, kind) = outcome(&app, "starttls-1").await;
    assert_eq!(
        (state.as_str(), class.as_str(), kind),
        ("delivered", "accepted", None)
    );
    // A second message reuses the parked TLS connection: the look at its socket does not take
    // the TLS records that came after the handshake (session tickets) for a server's word.
    post_mail(&app, "starttls-2", "ada@example.com", None, "at_least_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(app.message("starttls-2").await["state"], "delivered");
    let mails = sink.accepted();
    assert_eq!(mails.len(), 2);
    assert!(mails.iter().all(|m| m.tls), "a message came in clear");
    assert_eq!(sink.connections(), 1, "the TLS connection was reused");
    assert_eq!(sink.tls_sessions(), 1);
    assert_eq!(sink.chunks(), 2, "BDAT over TLS");
    assert_eq!(sink.authenticated(), ["PLAIN"]);
    app.stop().await;
}

/// `smtps://` (TLS from the first byte) with the same private CA.
async fn smtps_implicit_tls_with_a_private_ca_delivers(backend: Backend) {
    let ca = TestCa::new();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write_ca(dir.path());
    let sink = SmtpSink::start_scripted(Script {
        tls: Some(TlsMode::Implicit(ca.server_config())),
        ..Script::default()
    })
    .await;
    let app = spawn_app_with(
        backend,
        &format!(
            "smtp_url = \"smtps://{}\"\nsmtp_ca_file = {:?}\n",
            sink.addr,
            ca_file.to_str().unwrap()
        ),
    )
    .await;
    post_mail(&app, "smtps-1", "ada@example.com", None, "at_least_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(app.message("smtps-1").await["state"], "delivered");
    let mails = sink.accepted();
    assert_eq!(mails.len(), 1);
    assert!(mails[0].tls);
    assert_eq!(sink.tls_sessions(), 1);
    app.stop().await;
}

/// Verification is never off: a certificate from a CA Herald was not told to trust fails the
/// handshake, and a relay that does not offer STARTTLS under `tls=required` is not used. Both
/// are `not_sent` (`tls`), and nothing reaches the relay.
async fn smtp_an_untrusted_certificate_or_missing_starttls_is_not_sent(backend: Backend) {
    let ca = TestCa::new();
    let starttls = SmtpSink::start_scripted(Script {
        tls: Some(TlsMode::StartTls(ca.server_config())),
        ..Script::default()
    })
    .await;
    let implicit = SmtpSink::start_scripted(Script {
        tls: Some(TlsMode::Implicit(ca.server_config())),
        ..Script::default()
    })
    .await;
    let plain = SmtpSink::start().await;
    let cases = [
        (format!("smtp://{}?tls=required", starttls.addr), &starttls),
        (format!("smtps://{}", implicit.addr), &implicit),
        (format!("smtp://{}?tls=required", plain.addr), &plain),
    ];
    for (i, (url, sink)) in cases.iter().enumerate() {
        let app = spawn_app_with(backend, &format!("smtp_url = \"{url}\"\n")).await;
        let id = format!("untrusted-{i}");
        post_mail(&app, &id, "ada@example.com", None, "at_most_once").await;
        assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
        let (state, last, class, kind) = outcome(&app, &id).await;
        assert_eq!(
            (state.as_str(), last.as_str(), class.as_str()),
            ("retryable", "not_sent", "not_sent"),
            "{url}"
        );
        assert_eq!(kind.as_deref(), Some("tls"), "{url}");
        // The explanation says why (it said only "failed (tls)": an SMTP walk-through).
        let e = app.explain(&id).await;
        let note = e["attempt_timeline"][0]["note"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let says = if i < 2 { "certificate" } else { "STARTTLS" };
        assert!(
            note.starts_with("TLS: ") && note.contains(says),
            "{url}: {note}"
        );
        assert!(e["explanation"].as_str().unwrap().contains(&note), "{e}");
        assert!(sink.accepted().is_empty(), "{url}");
        assert_eq!(sink.tls_sessions(), 0, "{url}");
        app.stop().await;
    }
}

/// AUTH PLAIN and AUTH LOGIN, each against a relay offering only that mechanism, with the URL's
/// percent-encoded credentials. The password — and its base64 forms on the wire — appears in no
/// log line (captured at TRACE), no attempt row and no `Debug` of the settings; a wrong
/// password is `not_sent` without showing either.
async fn smtp_auth_plain_and_login_use_the_url_credentials_and_never_show_them(backend: Backend) {
    const USER: &str = "relay-user";
    const PASSWORD: &str = "s3cret:Pa55/w0rd";
    const ENCODED: &str = "s3cret%3APa55%2Fw0rd";
    let logs = captured_logs();
    let b64 = base64::engine::general_purpose::STANDARD;
    let secrets = [
        PASSWORD.to_owned(),
        ENCODED.to_owned(),
        b64.encode(PASSWORD),
        b64.encode(format!("\0{USER}\0{PASSWORD}")),
    ];
    for mechanism in ["PLAIN", "LOGIN"] {
        let sink = SmtpSink::start_scripted(Script {
            auth: Some(Auth {
                mechanisms: mechanism,
                username: USER,
                password: PASSWORD,
            }),
            ..Script::default()
        })
        .await;
        let good = format!("smtp_url = \"smtp://{USER}:{ENCODED}@{}\"\n", sink.addr);
        let bad = format!(
            "smtp_url = \"smtp://{USER}:wrong-{ENCODED}@{}\"\n",
            sink.addr
        );
        // The same credentials from the configuration instead of the URL (they win over it).
        let from_config = format!(
            "smtp_url = \"smtp://nobody:wrong@{}\"\nsmtp_username = \"{USER}\"\nsmtp_password = \"{PASSWORD}\"\n",
            sink.addr
        );
        for (toml, id, want) in [
            (good, "auth-good", "delivered"),
            (bad, "auth-bad", "retryable"),
            (from_config, "auth-config", "delivered"),
        ] {
            let settings = herald::config::Settings::from_toml(&base_toml("sqlite://x.db", &toml));
            let shown = format!("{:?}", settings.unwrap());
            let app = spawn_app_with(backend, &toml).await;
            let id = format!("{id}-{mechanism}");
            post_mail(&app, &id, "ada@example.com", None, "at_least_once").await;
            assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
            let view = app.message(&id).await;
            assert_eq!(view["state"], want, "{id}");
            let attempts = format!("{:?}", app.attempts(&id));
            if want == "retryable" {
                let a = &app.attempts(&id)[0];
                assert_eq!(a.error_kind.as_deref(), Some("smtp_auth_refused"), "{id}");
                assert_eq!(a.response_status, Some(535), "{id}");
            }
            for text in [&shown, &attempts, &view.to_string()] {
                for secret in &secrets {
                    assert!(!text.contains(secret.as_str()), "{id}: {secret} in {text}");
                }
            }
            app.stop().await;
        }
        assert_eq!(sink.authenticated(), [mechanism, mechanism]);
        assert_eq!(sink.accepted().len(), 2);
    }
    let logged = logs.text();
    assert!(
        logged.contains("auth-good-LOGIN") && logged.contains("attempt classified"),
        "the sends were not logged at all"
    );
    for secret in &secrets {
        assert!(!logged.contains(secret.as_str()), "{secret} logged");
    }
}

/// Every log line of this test process from the first call on, at TRACE, to check what Herald
/// writes. The subscriber is process-wide (sends run on the runtime's worker threads); a marker
/// event proves it is the one installed.
fn captured_logs() -> &'static Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    let logs = LOGS.get_or_init(|| {
        let logs = Logs(Arc::new(Mutex::new(Vec::new())));
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        tracing::info!("smtp log capture installed");
        logs
    });
    assert!(
        logs.text().contains("smtp log capture installed"),
        "another global subscriber was installed first: logs cannot be checked"
    );
    logs
}

#[derive(Clone)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut all = self.0.lock().unwrap();
        // Bounded: a runaway test cannot exhaust memory through the capture.
        if all.len() < 64 << 20 {
            all.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Polls `done` (every 20 ms) until it holds; panics after `within`.
async fn poll_until(within: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "condition not met within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// "530 authentication required" at MAIL FROM is our configuration's fault (credentials or
/// STARTTLS missing): every message would hit it, so none is dead-lettered for it.
async fn a_530_at_mail_from_is_not_sent(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "").await;
    post_mail(
        &app,
        "needs-auth",
        "ada@example.com",
        Some("mail530@example.com"),
        "at_most_once",
    )
    .await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    let (state, last, class, kind) = outcome(&app, "needs-auth").await;
    assert_eq!(
        (
            state.as_str(),
            last.as_str(),
            class.as_str(),
            kind.as_deref()
        ),
        (
            "retryable",
            "not_sent",
            "not_sent",
            Some("smtp_auth_required")
        )
    );
    assert_eq!(app.attempts("needs-auth")[0].response_status, Some(530));
    app.stop().await;
}

/// A retry carries the same Message-ID (and X-Herald-Event-Id), and a delivered message is
/// sent once: receivers and relays can drop a repeat by it.
async fn a_retry_carries_the_same_message_id_and_delivers_once(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "").await;
    post_mail(
        &app,
        "retry-mail",
        "once451@example.com",
        None,
        "at_least_once",
    )
    .await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    assert_eq!(app.message("retry-mail").await["state"], "retryable");
    app.advance(std::time::Duration::from_secs(120));
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.message("retry-mail").await["state"], "delivered");
    app.advance(std::time::Duration::from_secs(3600));
    assert_eq!(app.run_until_idle().await, 0, "nothing more to send");
    let received = sink.received();
    assert_eq!(received.len(), 2, "the refused try and the accepted one");
    let header = |raw: &str, name: &str| {
        let parsed = mail_parser::MessageParser::default()
            .parse(raw.as_bytes())
            .expect("an RFC 5322 message");
        parsed
            .header_raw(name)
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let expected = herald::channels::email::message_id("retry-mail", "herald.localhost");
    for raw in &received {
        assert_eq!(header(raw, "Message-ID"), expected);
        assert_eq!(header(raw, "X-Herald-Event-Id"), "retry-mail");
    }
    assert_eq!(sink.accepted().len(), 1, "one send per event id");
    app.stop().await;
}

both_backends!(
    a_530_at_mail_from_is_not_sent,
    smtp_lines_that_begin_with_a_dot_arrive_whole,
    a_retry_carries_the_same_message_id_and_delivers_once,
    smtp_greeting_421_is_not_sent,
    smtp_greeting_554_is_not_sent,
    smtp_auth_refused_is_not_sent,
    smtp_a_relay_echoing_the_login_keeps_it_out_of_the_excerpt,
    smtp_a_421_in_the_envelope_is_transient_and_closes_the_connection,
    smtp_open_connections_are_bounded_by_the_pool_size,
    smtp_a_parked_connection_that_went_silent_is_replaced,
    smtp_connection_refused_is_not_sent,
    smtp_unresolvable_host_is_not_sent,
    smtp_server_that_never_greets_is_not_sent,
    smtp_drop_before_the_envelope_is_not_sent,
    smtp_stall_or_drop_after_data_is_ambiguous,
    smtp_a_reply_that_is_not_utf8_is_unparsable,
    smtp_connections_are_reused_and_a_closed_one_is_replaced,
    smtp_a_421_that_closes_the_channel_is_transient_and_the_next_send_reconnects,
    smtp_a_421_to_mail_from_is_transient_and_the_next_send_reconnects,
    smtp_the_queue_id_of_a_250_is_the_provider_message_id,
    smtp_a_3xx_to_the_content_is_ambiguous,
    smtp_a_non_ascii_address_needs_smtputf8,
    smtp_an_internationalized_domain_goes_in_its_ascii_form,
    smtp_a_recipient_refused_at_rcpt_is_listed_masked_and_the_others_get_the_message,
    smtp_all_recipients_refused_is_decided_by_their_codes,
    smtp_recipients_past_the_relays_limit_go_in_a_next_transaction,
    smtp_a_recipient_refused_452_twice_stays_refused,
    smtp_a_next_transaction_lost_after_its_content_says_its_recipients_may_have_it,
    smtp_no_next_transaction_begins_with_too_little_time_left,
    smtp_every_reply_code_is_classified,
    smtp_every_reply_code_is_classified_without_pipelining,
    smtp_connections_are_reused_and_a_closed_one_is_replaced_without_pipelining,
    smtp_a_parked_connection_that_went_silent_is_replaced_without_pipelining,
    smtp_a_reused_connection_refusing_its_check_is_replaced,
    smtp_a_relay_holding_its_pipelined_replies_keeps_its_connections,
    smtp_a_connection_that_rested_is_checked_with_a_noop,
    smtp_a_connection_silent_after_its_rset_costs_the_attempt,
    smtp_a_354_after_every_recipient_refused_gets_no_content,
    smtp_a_250_to_bdat_after_every_recipient_refused_is_the_refusal,
    smtp_a_refused_second_ehlo_means_no_pipelining,
    smtp_an_envelope_too_long_to_pipeline_goes_one_command_at_a_time,
    smtp_a_recipient_refused_without_pipelining_is_listed_the_same,
    smtp_pipelining_switched_off_is_not_used_when_offered,
    smtp_all_recipients_refused_without_pipelining_is_decided_the_same,
    smtp_an_idle_connection_is_closed_after_the_idle_timeout,
    smtp_starttls_with_a_private_ca_delivers_over_tls,
    smtps_implicit_tls_with_a_private_ca_delivers,
    smtp_an_untrusted_certificate_or_missing_starttls_is_not_sent,
    smtp_auth_plain_and_login_use_the_url_credentials_and_never_show_them,
);

/// CHUNKING (RFC 3030), offered by the sink as by Postfix: an `at_least_once` message leaves as
/// one write — on a reused connection the RSET that checks it, MAIL FROM, RCPT TO, `BDAT n LAST`
/// and the content — and is taken on that one round trip; the queue id is kept. An
/// `at_most_once` message goes by DATA (its content only after the envelope was answered), as
/// does every message with `smtp_chunking = false` or against a relay not offering CHUNKING.
async fn smtp_chunking_sends_an_at_least_once_message_in_one_write(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "smtp_noop_after_idle_ms = 60000\n").await;
    deliver_one_at_a_time_as(
        &app,
        &["chunk-1", "chunk-2"],
        "postfix@example.com",
        "at_least_once",
    )
    .await;
    assert_eq!(sink.chunks(), 2, "BDAT commands");
    assert_eq!(sink.connections(), 1);
    assert_eq!(sink.resets(), (1, 0), "(pipelined, alone) RSETs");
    assert_envelopes(&sink, true, 2);
    let a = &app.attempts("chunk-2")[0];
    assert_eq!(a.response_status, Some(250));
    assert_eq!(
        app.message("chunk-2").await["provider_message_id"],
        "ABC123"
    );
    let mails = sink.accepted();
    assert!(
        mails[1].data.contains("X-Herald-Event-Id: chunk-2"),
        "{}",
        mails[1].data
    );
    // at_most_once on the same connection: DATA.
    deliver_one_at_a_time(&app, &["chunk-amo"], "ada@example.com").await;
    assert_eq!(sink.chunks(), 2, "no BDAT for at_most_once");
    assert_eq!(sink.accepted().len(), 3);
    app.stop().await;

    // Switched off: DATA, although offered.
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "smtp_chunking = false\n").await;
    deliver_one_at_a_time_as(&app, &["off-1"], "ada@example.com", "at_least_once").await;
    assert_eq!(sink.chunks(), 0, "smtp_chunking = false");
    assert_eq!(sink.accepted().len(), 1);
    app.stop().await;

    // Not offered: DATA.
    let sink = SmtpSink::start_scripted(Script {
        no_chunking: true,
        ..Script::default()
    })
    .await;
    let app = smtp_app(backend, &sink, "").await;
    deliver_one_at_a_time_as(&app, &["plain-1"], "ada@example.com", "at_least_once").await;
    assert_eq!(sink.chunks(), 0, "not offered");
    assert_eq!(sink.accepted().len(), 1);
    app.stop().await;
}

/// A parked connection the server closed (`bye@`: 250, then the end of the session) is seen to
/// be closed by a look at its socket before anything is written to it: the next
/// `at_least_once` message, whose content would leave with its envelope, goes over a new
/// connection in the same attempt — one attempt, accepted. (Written to, the closed connection
/// would have failed before any reply, and the attempt would have been `ambiguous`.)
async fn smtp_a_parked_connection_the_server_closed_is_dropped_unwritten(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = smtp_app(backend, &sink, "smtp_noop_after_idle_ms = 60000\n").await;
    deliver_one_at_a_time_as(&app, &["closed-1"], "bye@example.com", "at_least_once").await;
    // The sink ends the session after its 250: wait until it has.
    sink.wait_until_no_session(Duration::from_secs(10)).await;
    deliver_one_at_a_time_as(&app, &["closed-2"], "ada@example.com", "at_least_once").await;
    // (The closed session cannot count what reached it: the attempt's outcome above, one
    // attempt and accepted, is what shows nothing went there.)
    assert_eq!(sink.connections(), 2);
    assert_eq!(sink.chunks(), 2);
    assert_eq!(sink.accepted().len(), 2);
    app.stop().await;
}

/// A reused connection whose server answers its RSET with 421 but goes on answering what follows
/// (a server that should close the channel but does not): with CHUNKING the content left with
/// the RSET, so the 421 alone proves nothing and BDAT's reply decides — here 250, the message
/// taken on that session, once: one attempt, no second copy over a new connection.
async fn smtp_a_421_to_the_rset_that_goes_on_is_decided_by_bdat(backend: Backend) {
    let sink = SmtpSink::start_scripted(Script {
        refuse_reset: true,
        ..Script::default()
    })
    .await;
    let app = smtp_app(backend, &sink, "smtp_noop_after_idle_ms = 60000\n").await;
    deliver_one_at_a_time_as(
        &app,
        &["go-on-1", "go-on-2"],
        "ada@example.com",
        "at_least_once",
    )
    .await;
    assert_eq!(sink.resets(), (1, 0), "(pipelined, alone) RSETs");
    assert_eq!(sink.chunks(), 2);
    assert_eq!(sink.connections(), 1);
    assert_eq!(sink.accepted().len(), 2);
    assert_eq!(sink.received().len(), 2, "no content sent twice");
    app.stop().await;
}

/// A reused connection that went silent while parked (`mute@`: 250, then the session stays open
/// and never answers; a hung relay, not a closed one, so the look at the socket sees nothing).
/// With CHUNKING the content left with the RSET that checks it, so its silence is an ambiguous
/// `timeout`, not `timeout_before_data`: the `at_least_once` message is retried after its backoff
/// over a new connection and delivered. (A connection that rested `smtp_noop_after_idle_ms` is
/// checked by a NOOP of its own first, which a silent one fails within its bound, costing
/// nothing.)
async fn smtp_a_connection_silent_after_its_rset_is_ambiguous_with_chunking(backend: Backend) {
    connection_silent_after_its_rset(backend, "at_least_once", "ambiguous", "timeout").await;
}

both_backends!(
    smtp_every_reply_code_is_classified_with_chunking,
    smtp_lines_that_begin_with_a_dot_arrive_whole_with_chunking,
    smtp_a_relay_holding_its_pipelined_replies_keeps_its_connections_with_chunking,
    smtp_chunking_sends_an_at_least_once_message_in_one_write,
    smtp_a_parked_connection_the_server_closed_is_dropped_unwritten,
    smtp_a_421_to_the_rset_that_goes_on_is_decided_by_bdat,
    smtp_a_connection_silent_after_its_rset_is_ambiguous_with_chunking,
);

/// A relay that refuses MAIL FROM with 421 and closes at once, with a large content on its way:
/// it stops reading, so the write of the chunk may fail before any reply is read, the 421 waiting
/// unread. That reply still decides — `transient` (`smtp_reply`, 421), not `ambiguous`. And with
/// one recipient of three refused, the refused one is listed and the others get the message;
/// with every recipient refused, their codes decide (`recipients_refused`): as with DATA.
async fn smtp_with_chunking_refusals_decide_as_with_data(backend: Backend) {
    let sink = SmtpSink::start().await;
    // A retry base long enough that the transient one is not due again by the second batch.
    let app = smtp_app(
        backend,
        &sink,
        "max_payload_bytes = 8388608\nretry_base_seconds = 30\n",
    )
    .await;
    let payload = json!({"subject": "Hi", "text": "Hello",
        "cc": ["bob@example.com"], "bcc": ["rcpt550@example.com"]});
    post_payload(
        &app,
        "some-refused",
        "ada@example.com",
        payload,
        "at_least_once",
    )
    .await;
    let payload = json!({"subject": "Hi", "text": "Hello", "cc": ["rcpt451@example.com"]});
    post_payload(
        &app,
        "all-refused",
        "rcpt550@example.com",
        payload,
        "at_least_once",
    )
    .await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 2);
    // The 421 pauses the relay (tests/it/slowdown.rs): sent last and alone, so that it holds
    // neither of the others back.
    let big = "a line of text that fills the chunk\n".repeat(150_000);
    let payload = json!({"from": "mail421@example.com", "subject": "Big", "text": big});
    post_payload(&app, "big-421", "ada@example.com", payload, "at_least_once").await;
    assert_eq!(app.herald.sender.run_once().await.unwrap(), 1);
    let (state, last, class, kind) = outcome(&app, "big-421").await;
    assert_eq!(
        (
            state.as_str(),
            last.as_str(),
            class.as_str(),
            kind.as_deref()
        ),
        ("retryable", "transient", "transient", Some("smtp_reply"))
    );
    assert_eq!(app.attempts("big-421")[0].response_status, Some(421));
    let (state, _, class, kind) = outcome(&app, "some-refused").await;
    assert_eq!(
        (state.as_str(), class.as_str(), kind.as_deref()),
        ("delivered", "accepted", Some("recipients_refused"))
    );
    let excerpt = app.attempts("some-refused")[0]
        .response_excerpt
        .clone()
        .unwrap_or_default();
    assert!(
        excerpt.ends_with("; refused at RCPT TO: r***@e***.com 550"),
        "{excerpt}"
    );
    let mut envelope = sink.accepted()[0].rcpts.clone();
    envelope.sort();
    assert_eq!(envelope, ["<ada@example.com>", "<bob@example.com>"]);
    let (state, _, class, kind) = outcome(&app, "all-refused").await;
    assert_eq!(
        (state.as_str(), class.as_str(), kind.as_deref()),
        ("retryable", "transient", Some("recipients_refused"))
    );
    assert_eq!(app.attempts("all-refused")[0].response_status, Some(451));
    assert_eq!(sink.accepted().len(), 1);
    assert_eq!(sink.chunks(), 2, "the 421 session ended before its BDAT");
    app.stop().await;
}

both_backends!(smtp_with_chunking_refusals_decide_as_with_data);
