//! Per-destination slow-down on both backends: a 429 (or an SMTP 421) slows every message bound
//! to that destination, not only the one that got it; other destinations go on.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::both_backends;
use crate::support::app::{spawn_app_with, webhook};
use crate::support::smtp_sink::SmtpSink;
use crate::support::{Backend, Receiver, Reply};

/// One send at a time, so the second message is claimed after the first one's answer.
const ONE_AT_A_TIME: &str = "sender_concurrency = 1\n";
/// As [`ONE_AT_A_TIME`], with a 421's pause (no `Retry-After`: the retry base) long enough that
/// a slow round of the loop cannot outlast it.
const ONE_AT_A_TIME_LONG_PAUSE: &str = "sender_concurrency = 1\nretry_base_seconds = 30\n";
/// A retry base of ten minutes: longer than the longest pause without a `Retry-After`.
const TEN_MINUTE_BASE: &str = "retry_base_seconds = 600\nretry_cap_seconds = 3600\n";

/// Enqueues an email to `ada@example.com` as `id`.
async fn post_email(app: &crate::support::app::TestApp, id: &str) {
    let r = app
        .post_message(
            json!({"event_id": id, "channel": "email", "destination": "ada@example.com",
                             "payload": {"subject": "Hi", "text": "Hello"}}),
        )
        .await;
    assert_eq!(r.status(), 201, "{id}");
}

async fn a_429_slows_every_message_to_that_destination(backend: Backend) {
    let app = spawn_app_with(backend, ONE_AT_A_TIME).await;
    let slow = Receiver::start().await;
    let other = Receiver::start().await;
    slow.script([Reply::Full(
        429,
        vec![("Retry-After".into(), "30".into())],
        String::new(),
    )]);
    for (id, url) in [("s-1", &slow.url), ("s-2", &slow.url), ("o-1", &other.url)] {
        assert_eq!(
            app.post_message(webhook(id, url, json!({}))).await.status(),
            201
        );
    }
    // One that expires before the pause ends could never be sent: expired when held.
    let mut brief = webhook("s-brief", &slow.url, json!({}));
    brief["expires_at"] = json!((app.clock_now() + chrono::Duration::seconds(8)).to_rfc3339());
    assert_eq!(app.post_message(brief).await.status(), 201);
    let before = app.clock_now();
    assert_eq!(app.run_until_idle().await, 4);
    let brief = app.message("s-brief").await;
    assert_eq!(
        (
            &brief["state"],
            &brief["attempts"],
            &brief["last_error_class"]
        ),
        (&json!("expired"), &json!(0), &Value::Null),
        "{brief}"
    );
    let explained = app.explain("s-brief").await;
    let paragraph = explained["explanation"].as_str().unwrap();
    assert!(paragraph.contains("Herald held it back"), "{paragraph}");
    // The first got the 429; the second was never sent: put back for the same pause, its
    // attempt not spent.
    assert_eq!(slow.requests().len(), 1);
    let first = app.row("s-1");
    assert_eq!(
        (first.state, first.attempts),
        (herald::domain::State::Retryable, 1)
    );
    let second = app.row("s-2");
    assert_eq!(
        (second.state, second.attempts, second.last_error_class),
        (
            herald::domain::State::Retryable,
            0,
            Some(herald::domain::AttemptClass::RateLimited)
        )
    );
    assert!(app.attempts("s-2").is_empty(), "no request, no attempt row");
    let wait = (second.next_attempt_at.unwrap() - before).num_seconds();
    assert!(
        (29..=40).contains(&wait),
        "paused for the Retry-After: {wait}s"
    );
    // Another destination is not slowed.
    assert_eq!(app.message("o-1").await["state"], "delivered");
    assert_eq!(other.requests().len(), 1);
    // After the pause both go out.
    app.advance(std::time::Duration::from_secs(45));
    assert_eq!(app.run_until_idle().await, 2);
    assert_eq!(slow.requests().len(), 3);
    for id in ["s-1", "s-2"] {
        assert_eq!(app.message(id).await["state"], "delivered");
    }
    assert_eq!(app.row("s-2").attempts, 1);
    app.stop().await;
}

/// The sender's own loop claims ahead: the next message is cleared while the one before it is
/// still waiting for its answer. When that answer is a 429, the next one, already past its
/// clearance and waiting for the one send slot, is held by the pause too (checked again just
/// before the request), not sent the moment the slot frees.
async fn a_message_cleared_before_a_429_came_is_held_by_it(backend: Backend) {
    let app = spawn_app_with(backend, ONE_AT_A_TIME).await;
    let slow = Receiver::start().await;
    slow.script([Reply::Full(
        429,
        vec![("Retry-After".into(), "2".into())],
        String::new(),
    )]);
    for id in ["c-1", "c-2"] {
        let r = app.post_message(webhook(id, &slow.url, json!({}))).await;
        assert_eq!(r.status(), 201);
    }
    let sender = app.start_sender();
    let got = slow.wait_for(3, 20).await;
    sender.stop().await;
    let ids: Vec<_> = got
        .iter()
        .map(|r| r.header("webhook-id").unwrap_or(""))
        .collect();
    assert_eq!(ids[0], "c-1");
    let mut rest = ids[1..].to_vec();
    rest.sort_unstable();
    assert_eq!(rest, ["c-1", "c-2"], "each once after the pause");
    let second = got
        .iter()
        .find(|r| r.header("webhook-id") == Some("c-2"))
        .unwrap();
    let after = second.at.duration_since(got[0].at);
    assert!(
        after >= std::time::Duration::from_secs(2),
        "c-2 came {after:?} after the 429"
    );
    app.stop().await;
}

async fn an_smtp_421_slows_every_email_to_the_relay(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(
        backend,
        &format!("{ONE_AT_A_TIME_LONG_PAUSE}smtp_url = \"{}\"\n", sink.url),
    )
    .await;
    for (id, to) in [("m-421", "t421@example.com"), ("m-next", "ada@example.com")] {
        let r = app
            .post_message(
                json!({"event_id": id, "channel": "email", "destination": to,
                                 "payload": {"subject": "Hi", "text": "Hello"}}),
            )
            .await;
        assert_eq!(r.status(), 201);
    }
    assert_eq!(app.run_until_idle().await, 2);
    assert_eq!(app.message("m-421").await["last_error_class"], "transient");
    let next = app.row("m-next");
    assert_eq!(
        (next.state, next.attempts),
        (herald::domain::State::Retryable, 0),
        "held back by the relay's 421, never sent"
    );
    assert!(app.attempts("m-next").is_empty());
    assert!(sink.accepted().is_empty());
    app.stop().await;
}

/// "421 too many connections" at the greeting — the commonest relay slow-down — pauses the relay
/// too, though the message itself never left (`not_sent`).
async fn a_421_greeting_slows_the_relay(backend: Backend) {
    use crate::support::smtp_sink::Script;
    let sink = SmtpSink::start_scripted(Script {
        greeting: Some("421 4.3.2 too many connections, try later"),
        ..Script::default()
    })
    .await;
    let app = spawn_app_with(
        backend,
        &format!("{ONE_AT_A_TIME_LONG_PAUSE}smtp_url = \"{}\"\n", sink.url),
    )
    .await;
    for id in ["g-1", "g-2"] {
        post_email(&app, id).await;
    }
    assert_eq!(app.run_until_idle().await, 2);
    assert_eq!(app.message("g-1").await["last_error_class"], "not_sent");
    let second = app.row("g-2");
    assert_eq!(
        (second.state, second.attempts),
        (herald::domain::State::Retryable, 0),
        "held back by the greeting's 421"
    );
    assert_eq!(sink.connections(), 1, "one connection tried, not two");
    app.stop().await;
}

/// A relay that keeps one session and refuses new ones ("421 too many connections"): neither an
/// acceptance on that session during the pause, nor a probe's after it, opens the relay to the
/// held mail — they went over a connection opened before, which shows nothing of new ones. The
/// mail goes one message at a time on the kept session, and no held one spends an attempt on
/// the refusal (an SMTP walk-through: each such acceptance let the held mail open new
/// connections, each met the 421 and spent an attempt;
/// `throttle::tests::a_probe_over_a_pooled_connection_shows_nothing_of_new_sessions`).
async fn answers_on_a_pooled_session_do_not_open_a_relay_refusing_new_ones(backend: Backend) {
    use crate::support::smtp_sink::Script;
    use herald::domain::State;
    let sink = SmtpSink::start_scripted(Script {
        greeting: Some("421 4.3.2 too many connections, try later"),
        greet_first: Some(1),
        ..Script::default()
    })
    .await;
    let app = spawn_app_with(
        backend,
        &format!(
            "sender_concurrency = 2\nsmtp_pool_size = 2\ndestination_max_in_flight = 2\n\
             retry_base_seconds = 2\n\
             smtp_url = \"{}\"\n",
            sink.url
        ),
    )
    .await;
    post_email(&app, "kept").await;
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("kept").state, State::Delivered);
    // Two at once, each answered slowly: whichever takes the parked session holds it, the other
    // needs a new one, refused at its greeting: the relay paused. (With one answered at once,
    // it could be done before the other began, and both went on the kept session.)
    for id in ["on-kept", "refused"] {
        let r = app
            .post_message(json!({"event_id": id, "channel": "email",
                "destination": "slower@example.com",
                "payload": {"subject": "Hi", "text": "Hello"}}))
            .await;
        assert_eq!(r.status(), 201);
    }
    assert_eq!(app.run_until_idle().await, 2);
    assert_eq!(sink.connections(), 2);
    let ids = ["on-kept", "refused", "held-1", "held-2", "held-3"];
    let refused: Vec<&str> = ids[..2]
        .iter()
        .copied()
        .filter(|id| app.row(id).state != State::Delivered)
        .collect();
    assert_eq!(refused.len(), 1, "one met the 421");
    let spent = app.attempts(refused[0]);
    assert_eq!(
        spent[0].error_kind.as_deref(),
        Some("smtp_greeting_refused")
    );
    for id in &ids[2..] {
        post_email(&app, id).await;
    }
    for _ in 0..30 {
        app.advance(std::time::Duration::from_secs(3));
        app.run_until_idle().await;
        if ids.iter().all(|id| app.row(id).state == State::Delivered) {
            break;
        }
    }
    for id in ids {
        assert_eq!(app.row(id).state, State::Delivered, "{id}");
    }
    assert_eq!(
        sink.connections(),
        2,
        "no new connection after the refused one"
    );
    for id in &ids[2..] {
        assert_eq!(app.row(id).attempts, 1, "{id}: held, never refused");
    }
    app.stop().await;
}

/// What a destination that cannot be reached costs: the first [`BURST_COUNT`] of `ids` spend an
/// attempt each (connection refused), the rest are put back without one; after the pause one
/// message probes while the others wait; once the destination listens again (`up`, on the very
/// address), all are delivered, those held with their single attempt. `others`: messages to other
/// destinations claimed in the first round. Returns the peer `up` started.
async fn unreachable_then_up<P>(
    app: &crate::support::app::TestApp,
    ids: &[String],
    others: usize,
    socket: tokio::net::TcpSocket,
    up: impl FnOnce(tokio::net::TcpListener) -> P,
) -> P {
    use herald::domain::{AttemptClass, State};
    use herald::sender::throttle::BURST_COUNT;
    let spent = || {
        ids.iter()
            .map(|id| app.row(id).attempts)
            .collect::<Vec<_>>()
    };
    assert_eq!(app.run_until_idle().await, ids.len() + others);
    assert_eq!(
        spent(),
        [vec![1; BURST_COUNT], vec![0; ids.len() - BURST_COUNT]].concat(),
        "a burst spent, the rest held"
    );
    for id in &ids[..BURST_COUNT] {
        let a = app.attempts(id);
        assert_eq!(
            (a[0].class, a[0].error_kind.as_deref()),
            (AttemptClass::NotSent, Some("connect")),
            "{id}"
        );
    }
    for id in &ids[BURST_COUNT..] {
        let row = app.row(id);
        assert_eq!(
            (row.state, row.last_error_class),
            (State::Retryable, Some(AttemptClass::RateLimited)),
            "{id}"
        );
        assert!(app.attempts(id).is_empty(), "{id}: no attempt row");
    }
    // The pause over (the retry base, a second here), one message probes, still refused: the
    // others are held again without an attempt.
    app.advance(std::time::Duration::from_secs(3));
    assert_eq!(app.run_until_idle().await, ids.len());
    let second = spent();
    assert_eq!(
        second.iter().sum::<i32>(),
        BURST_COUNT as i32 + 1,
        "one probe: {second:?}"
    );
    // The probe's own next attempt is not before the new pause's end (2 s), whatever its
    // backoff (2 s ± 20 %; `decide::tests::a_retry_within_the_pause_its_answer_started_waits_for_its_end`).
    let prober = &ids[second.iter().position(|n| *n == 2).unwrap_or(0)];
    let reason = app.attempts(prober).pop().unwrap().delay_reason;
    let wait = app.row(prober).next_attempt_at.unwrap() - app.clock_now();
    assert!(
        wait > chrono::Duration::milliseconds(1900),
        "the second pause, 2 s: {wait}, {reason:?}"
    );
    let peer = up(socket.listen(64).expect("listen"));
    for _ in 0..3 {
        app.advance(std::time::Duration::from_secs(5));
        app.run_until_idle().await;
    }
    for id in ids {
        assert_eq!(app.row(id).state, State::Delivered, "{id}");
    }
    let last = spent();
    assert_eq!(
        last.iter().sum::<i32>(),
        BURST_COUNT as i32 + 1 + ids.len() as i32,
        "each delivered once after the refusals: {last:?}"
    );
    peer
}

async fn a_relay_that_cannot_be_reached_is_paused_and_probed(backend: Backend) {
    let (socket, addr) = crate::support::down_until_listening();
    let app = spawn_app_with(
        backend,
        &format!("{ONE_AT_A_TIME}smtp_url = \"smtp://{addr}\"\n"),
    )
    .await;
    let ids: Vec<String> = (0..9).map(|i| format!("down-{i}")).collect();
    for id in &ids {
        post_email(&app, id).await;
    }
    let sink = unreachable_then_up(&app, &ids, 0, socket, SmtpSink::start_on).await;
    assert_eq!(sink.accepted().len(), ids.len());
    app.stop().await;
}

async fn a_webhook_host_that_cannot_be_reached_is_paused_and_probed(backend: Backend) {
    let (socket, addr) = crate::support::down_until_listening();
    let app = spawn_app_with(backend, ONE_AT_A_TIME).await;
    let other = Receiver::start().await;
    let ids: Vec<String> = (0..8).map(|i| format!("host-down-{i}")).collect();
    for id in &ids {
        let url = format!("http://{addr}/hook");
        assert_eq!(
            app.post_message(webhook(id, &url, json!({})))
                .await
                .status(),
            201
        );
    }
    // Another destination, claimed with them, is not held.
    let r = app.post_message(webhook("elsewhere", &other.url, json!({})));
    assert_eq!(r.await.status(), 201);
    let receiver = unreachable_then_up(&app, &ids, 1, socket, Receiver::start_on).await;
    assert_eq!(receiver.requests().len(), ids.len());
    assert_eq!(other.requests().len(), 1);
    assert_eq!(app.row("elsewhere").attempts, 1);
    app.stop().await;
}

/// A destination down for longer than its first pause, with a retry base of ten minutes: the
/// pause that holds the messages not yet tried is at most `MAX_PAUSE` (five minutes), but the
/// burst that met the outage would each wait for its own backoff (8–12 minutes). Once the
/// destination accepts the probe, they go at once too. `enqueue` posts one message by id.
async fn an_outage_cost<P, F>(
    app: &crate::support::app::TestApp,
    enqueue: impl Fn(String) -> F,
    socket: tokio::net::TcpSocket,
    up: impl FnOnce(tokio::net::TcpListener) -> P,
) -> P
where
    F: std::future::Future<Output = ()>,
{
    use herald::domain::State;
    use herald::sender::throttle::{BURST_COUNT, MAX_PAUSE};
    let ids: Vec<String> = (0..=BURST_COUNT).map(|i| format!("outage-{i}")).collect();
    for id in &ids {
        enqueue(id.clone()).await;
    }
    let start = app.clock_now();
    assert_eq!(app.run_until_idle().await, ids.len());
    let burst = &ids[..BURST_COUNT];
    let held = &ids[BURST_COUNT];
    for id in burst {
        let wait = app.row(id).next_attempt_at.unwrap() - start;
        assert!(wait >= chrono::Duration::minutes(8), "{id}: backoff {wait}");
    }
    assert_eq!(app.row(held).attempts, 0);
    let peer = up(socket.listen(64).expect("listen"));
    // The pause over (not the burst's backoff): the held message probes, is accepted, and the
    // burst follows it in the same run.
    app.advance(MAX_PAUSE + std::time::Duration::from_secs(10));
    assert_eq!(app.run_until_idle().await, ids.len());
    for id in burst {
        let row = app.row(id);
        assert_eq!((row.state, row.attempts), (State::Delivered, 2), "{id}");
    }
    assert_eq!(app.row(held).state, State::Delivered);
    assert!(app.clock_now() - start < chrono::Duration::minutes(6));
    peer
}

async fn messages_an_unreachable_host_cost_an_attempt_go_once_it_is_back(backend: Backend) {
    let (socket, addr) = crate::support::down_until_listening();
    let app = spawn_app_with(backend, &format!("{ONE_AT_A_TIME}{TEN_MINUTE_BASE}")).await;
    let url = format!("http://{addr}/hook");
    let enqueue = |id: String| {
        let r = app.post_message(webhook(&id, &url, json!({})));
        async move { assert_eq!(r.await.status(), 201, "{id}") }
    };
    let receiver = an_outage_cost(&app, enqueue, socket, Receiver::start_on).await;
    assert_eq!(
        receiver.requests().len(),
        herald::sender::throttle::BURST_COUNT + 1
    );
    app.stop().await;
}

async fn mail_an_unreachable_relay_cost_an_attempt_goes_once_it_is_back(backend: Backend) {
    let (socket, addr) = crate::support::down_until_listening();
    let app = spawn_app_with(
        backend,
        &format!("{ONE_AT_A_TIME}{TEN_MINUTE_BASE}smtp_url = \"smtp://{addr}\"\n"),
    )
    .await;
    let enqueue = |id: String| {
        let app = &app;
        async move { post_email(app, &id).await }
    };
    let sink = an_outage_cost(&app, enqueue, socket, SmtpSink::start_on).await;
    assert_eq!(
        sink.accepted().len(),
        herald::sender::throttle::BURST_COUNT + 1
    );
    app.stop().await;
}

/// A mail whose relay is paused after its clearance, while it waits for an SMTP connection
/// (another message's 421 answered meanwhile: here the pause is made in the send hook, after
/// the check before the send, so that it comes at that very point): once it has a connection
/// slot it asks again and is put back unsent — no connection made, its attempt not spent, no
/// attempt row — until the pause ends, then delivered.
async fn a_mail_paused_while_it_waits_for_a_connection_is_put_back_unsent(backend: Backend) {
    use herald::domain::{AttemptClass, State};
    use herald::sender::throttle::{Answer, SMTP_RELAY};
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(
        backend,
        &format!("{ONE_AT_A_TIME_LONG_PAUSE}smtp_url = \"{}\"\n", sink.url),
    )
    .await;
    let throttle = app.herald.sender.throttle();
    let clock = app.clock.clone();
    let paused = Arc::new(std::sync::Mutex::new(None));
    let until = paused.clone();
    assert!(app.herald.sender.set_before_send(Box::new(move |event_id| {
        let mut until = until.lock().unwrap();
        if event_id == "waits" && until.is_none() {
            let closing = Answer {
                class: AttemptClass::Transient,
                status: Some(421),
                asked: None,
                is_smtp: true,
                error_kind: Some("smtp_reply"),
                message: -1,
                reused: false,
            };
            let now = herald::clock::Clock::now(&*clock);
            *until = throttle.observe(SMTP_RELAY, &closing, now).paused_until;
        }
    })));
    post_email(&app, "waits").await;
    assert_eq!(app.run_until_idle().await, 1);
    let until = paused.lock().unwrap().expect("paused in the hook");
    let row = app.row("waits");
    assert_eq!(
        (row.state, row.attempts, row.last_error_class),
        (State::Retryable, 0, Some(AttemptClass::RateLimited)),
    );
    // Until the pause ends: PostgreSQL adds the wait to its own clock, a little later.
    let next = row.next_attempt_at.unwrap();
    assert!(
        next >= until && next - until < chrono::Duration::seconds(1),
        "until the pause ends ({until}): {next}"
    );
    assert!(app.attempts("waits").is_empty(), "no attempt row");
    assert_eq!(sink.connections(), 0, "no connection made");
    app.advance(std::time::Duration::from_secs(31));
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("waits").state, State::Delivered);
    assert_eq!(sink.accepted().len(), 1);
    app.stop().await;
}

both_backends!(
    a_mail_paused_while_it_waits_for_a_connection_is_put_back_unsent,
    messages_an_unreachable_host_cost_an_attempt_go_once_it_is_back,
    mail_an_unreachable_relay_cost_an_attempt_goes_once_it_is_back,
    a_relay_that_cannot_be_reached_is_paused_and_probed,
    a_webhook_host_that_cannot_be_reached_is_paused_and_probed,
    a_message_cleared_before_a_429_came_is_held_by_it,
    a_421_greeting_slows_the_relay,
    answers_on_a_pooled_session_do_not_open_a_relay_refusing_new_ones,
    a_429_slows_every_message_to_that_destination,
    an_smtp_421_slows_every_email_to_the_relay,
);
