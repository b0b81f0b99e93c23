//! The foundation fixes: the watchdog moves each expired lease once and by the sender's own
//! decision, a refused outcome says `lease_lost`, a late 2xx settles an unconfirmed message,
//! leases run on the database's clock on PostgreSQL, the policy version is recorded, the wake-up
//! follows `listen_notify`, storage errors map by kind, and NUL never reaches the database.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::Connection;
use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use herald::app::Herald;
use herald::clock::Clock;
use herald::config::Settings;
use herald::storage::models::Applied;
use serde_json::json;

use crate::both_backends;
use crate::support::app::{base_toml, call_with_db, spawn_app_with, webhook};
use crate::support::{Backend, Receiver, TestApp, spawn_app};

async fn post_all(app: &TestApp, url: &str, ids: &[(String, serde_json::Value)]) {
    for (id, extra) in ids {
        let mut m = webhook(id, url, json!({"id": id}));
        m.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = app.post_message(m).await;
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    }
}

fn lease_expired_attempts(app: &TestApp, id: &str) -> usize {
    app.attempts(id)
        .iter()
        .filter(|a| a.error_kind.as_deref() == Some("lease_expired"))
        .count()
}

async fn concurrent_watchdogs_move_each_lease_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    let ids: Vec<_> = (0..40).map(|i| (format!("sweep-{i}"), json!({}))).collect();
    post_all(&app, &rx.url, &ids).await;
    assert_eq!(app.herald.sender.claim(64).await.unwrap().len(), 40);
    app.advance(Duration::from_secs(31));
    // Four watchdogs at once (four pooled connections on PostgreSQL).
    let sweeps = futures_util::future::join_all((0..4).map(|_| {
        let s = app.herald.sender.clone();
        async move { s.sweep_leases().await.unwrap() }
    }))
    .await;
    let moved: usize = sweeps.iter().map(|s| s.total()).sum();
    assert_eq!(moved, 40, "{sweeps:?}");
    for (id, _) in &ids {
        assert_eq!(lease_expired_attempts(&app, id), 1, "{id}");
        assert_eq!(app.row(id).state, "retryable");
    }
    app.stop().await;
}

/// An outcome being committed while the watchdog runs: the sweep leaves the row alone (it is
/// locked), and no false `lease_expired` attempt is written for a message that was delivered.
async fn an_outcome_committed_during_a_sweep_leaves_no_false_attempt() {
    let app = spawn_app(Backend::Postgres).await;
    let rx = Receiver::start().await;
    post_all(&app, &rx.url, &[("racing".into(), json!({}))]).await;
    let claimed = app.herald.sender.claim(1).await.unwrap();
    app.advance(Duration::from_secs(31));
    // The "outcome": a transaction that holds the row and will mark it delivered.
    let mut outcome = PgConnection::establish(&app.test_db.url).unwrap();
    outcome
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM herald_outbox WHERE id = {} FOR UPDATE",
            claimed[0].id
        ))
        .unwrap();
    let sender = app.herald.sender.clone();
    let sweep = tokio::spawn(async move { sender.sweep_leases().await.unwrap() });
    // Let the sweep either finish or block on the row lock, whichever it does (bounded).
    let mut probe = PgConnection::establish(&app.test_db.url).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !sweep.is_finished() && !lock_waiter(&mut probe) {
        assert!(
            std::time::Instant::now() < deadline,
            "the sweep neither ran nor waited"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    outcome
        .batch_execute(&format!(
            "UPDATE herald_outbox SET state = 'delivered', lease_owner = NULL, lease_until = NULL \
             WHERE id = {}; COMMIT",
            claimed[0].id
        ))
        .unwrap();
    let swept = tokio::time::timeout(Duration::from_secs(10), sweep)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(swept.total(), 0);
    assert_eq!(app.row("racing").state, "delivered");
    assert_eq!(
        lease_expired_attempts(&app, "racing"),
        0,
        "no false attempt"
    );
    app.stop().await;
}

fn lock_waiter(c: &mut PgConnection) -> bool {
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let n: N = diesel::RunQueryDsl::get_result(
        diesel::sql_query(
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        ),
        c,
    )
    .unwrap();
    n.n > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_committed_during_a_sweep_leaves_no_false_attempt_postgres() {
    an_outcome_committed_during_a_sweep_leaves_no_false_attempt().await
}

async fn a_refused_outcome_says_lease_lost_and_a_late_2xx_settles(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    post_all(
        &app,
        &rx.url,
        &[
            ("late-amo".into(), json!({"semantics": "at_most_once"})),
            ("late-alo".into(), json!({})),
            ("late-rcpt".into(), json!({"semantics": "at_most_once"})),
        ],
    )
    .await;
    let claimed = app.herald.sender.claim(10).await.unwrap();
    app.advance(Duration::from_secs(31));
    let sweep = app.herald.sender.sweep_leases().await.unwrap();
    assert_eq!((sweep.to_unconfirmed, sweep.to_retryable), (2, 1));
    // One of the unconfirmed is settled by a receipt meanwhile (as the reconciler does, which
    // leaves `updated_at` to this test): the late 2xx leaves the time it became delivered.
    app.raw_sql("UPDATE herald_outbox SET state = 'delivered' WHERE event_id = 'late-rcpt'");
    let settled_at = app.row("late-rcpt").updated_at;
    app.advance(Duration::from_secs(60));
    // The "crashed" sender was only slow: its sends come back with a 200.
    let mut outcomes = Vec::new();
    for row in claimed {
        outcomes.push(app.herald.sender.process(row).await);
    }
    outcomes.sort_by(|a, b| a.event_id.cmp(&b.event_id));
    assert_eq!(
        app.herald.sender.record(outcomes).await.unwrap(),
        [Applied::LeaseLost, Applied::Settled, Applied::Settled],
        "late-alo, late-amo, late-rcpt"
    );
    let rcpt = app.row("late-rcpt");
    assert_eq!(
        (rcpt.state.as_str(), rcpt.updated_at),
        ("delivered", settled_at)
    );
    assert_ne!(app.row("late-amo").updated_at, settled_at);
    let amo = app.message("late-amo").await;
    assert_eq!(
        (amo["state"].as_str(), amo["last_error_class"].as_str()),
        (Some("delivered"), None)
    );
    let states = |id| {
        app.attempts(id)
            .into_iter()
            .map(|a| (a.class.to_string(), a.next_state))
            .collect::<Vec<_>>()
    };
    let s = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        states("late-amo"),
        [s("ambiguous", "unconfirmed"), s("accepted", "delivered")]
    );
    // An at_least_once row back in the queue is not settled (it may be claimed again at any
    // moment); its attempt says what really happened.
    assert_eq!(app.message("late-alo").await["state"], "retryable");
    assert_eq!(
        states("late-alo"),
        [s("ambiguous", "retryable"), s("accepted", "lease_lost")]
    );
    app.stop().await;
}

/// A message whose sends keep killing their sender is re-queued with growing backoff.
async fn a_poison_message_backs_off(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    post_all(&app, &rx.url, &[("poison".into(), json!({}))]).await;
    let mut delays = Vec::new();
    for _ in 0..3 {
        assert_eq!(app.herald.sender.claim(1).await.unwrap().len(), 1);
        app.advance(Duration::from_secs(31));
        assert_eq!(
            app.herald.sender.sweep_leases().await.unwrap().to_retryable,
            1
        );
        let row = app.row("poison");
        assert!(
            app.herald.sender.claim(1).await.unwrap().is_empty(),
            "not due at once"
        );
        delays.push((row.next_attempt_at.unwrap() - row.updated_at).num_milliseconds());
        app.advance(Duration::from_secs(5));
    }
    // Base 1 s doubling, ±20 % jitter.
    for (d, nominal) in delays.iter().zip([1000, 2000, 4000]) {
        assert!(
            (nominal * 8 / 10..=nominal * 12 / 10).contains(d),
            "{delays:?}"
        );
    }
    let a = app.attempts("poison");
    assert_eq!(a.len(), 3);
    assert!(
        a.iter().all(|a| a
            .delay_reason
            .as_deref()
            .unwrap_or("")
            .contains("backoff after attempt")),
        "{a:?}"
    );
    app.stop().await;
}

/// A clock that reads wrong by `skew`, moved on purpose by `shift` (what tests do to let time
/// pass for everyone).
struct SkewedClock {
    skew: chrono::Duration,
    shift: chrono::Duration,
}

impl SkewedClock {
    /// Reads `skew` off real time; time not moved on purpose.
    fn off_by(skew: chrono::Duration) -> Self {
        SkewedClock {
            skew,
            shift: chrono::Duration::zero(),
        }
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> DateTime<Utc> {
        use chrono::SubsecRound;
        (Utc::now() + self.skew + self.shift).trunc_subsecs(6)
    }
    fn shift(&self) -> chrono::Duration {
        self.shift
    }
}

async fn herald_with_clock(app: &TestApp, clock: SkewedClock) -> Herald {
    let settings = Settings::from_toml(&base_toml(&app.test_db.url, "")).unwrap();
    tokio::task::spawn_blocking(move || Herald::build(settings, Arc::new(clock), false))
        .await
        .unwrap()
        .unwrap()
}

/// PostgreSQL, several processes: a process whose clock is an hour off can neither claim early,
/// steal a live lease, nor keep a dead one — lease and due times are the database's.
async fn a_skewed_clock_cannot_claim_early_or_steal_a_lease() {
    let app = spawn_app(Backend::Postgres).await;
    let rx = Receiver::start().await;
    let later = (Utc::now() + chrono::Duration::minutes(10)).to_rfc3339();
    post_all(
        &app,
        &rx.url,
        &[
            ("skew-later".into(), json!({"scheduled_at": later})),
            ("skew-now".into(), json!({})),
        ],
    )
    .await;
    let ahead = herald_with_clock(&app, SkewedClock::off_by(chrono::Duration::hours(1))).await;
    // The honest process claims what is due now (a 30 s lease).
    let claimed = app.herald.sender.claim(10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].event_id, "skew-now");
    // An hour ahead: nothing is due early, and the live lease is not "expired".
    assert!(ahead.sender.claim(10).await.unwrap().is_empty());
    assert_eq!(ahead.sender.sweep_leases().await.unwrap().total(), 0);
    assert_eq!(app.row("skew-now").state, "sending");
    // A message it enqueues without a time is due now by the database's clock, not in an hour.
    let srv = actix_web::test::init_service(
        actix_web::App::new()
            .app_data(actix_web::web::Data::new(ahead.app_state()))
            .configure(herald::http::configure),
    )
    .await;
    let posted = actix_web::test::call_service(
        &srv,
        actix_web::test::TestRequest::post()
            .uri("/v1/messages")
            .insert_header((
                "authorization",
                format!("Bearer {}", crate::support::app::ADMIN_TOKEN),
            ))
            .set_json(webhook("skew-posted", &rx.url, json!({})))
            .to_request(),
    )
    .await;
    assert_eq!(posted.status(), 201);
    let due = app.herald.sender.claim(10).await.unwrap();
    assert_eq!(
        due.iter().map(|r| r.event_id.as_str()).collect::<Vec<_>>(),
        ["skew-posted"]
    );
    // An hour behind, once the leases really ran out (31 s pass for everyone): both are returned.
    let behind = herald_with_clock(
        &app,
        SkewedClock {
            skew: chrono::Duration::hours(-1),
            shift: chrono::Duration::seconds(31),
        },
    )
    .await;
    assert_eq!(behind.sender.sweep_leases().await.unwrap().to_retryable, 2);
    let row = app.row("skew-now");
    assert_eq!(row.state, "retryable");
    // Its retry is due by the database's clock, not an hour early or late.
    let due_in = row.next_attempt_at.unwrap() - Utc::now();
    assert!(
        due_in > chrono::Duration::seconds(25) && due_in < chrono::Duration::seconds(40),
        "{due_in}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_clock_cannot_claim_early_or_steal_a_lease_postgres() {
    a_skewed_clock_cannot_claim_early_or_steal_a_lease().await
}

/// PostgreSQL: a process whose clock is an hour ahead sends a message that expires in ten
/// minutes by the database's clock. The claim found it unexpired by that clock; the check just
/// before the request (a message may wait for a send slot) reads the same clock — the claim's
/// time plus the time since — not this process's, which would have called it expired.
async fn a_skewed_clock_does_not_expire_what_the_database_claimed() {
    let app = spawn_app(Backend::Postgres).await;
    let rx = Receiver::start().await;
    let mut msg = webhook("skew-expiring", &rx.url, json!({}));
    msg["expires_at"] = json!((Utc::now() + chrono::Duration::minutes(10)).to_rfc3339());
    assert_eq!(app.post_message(msg).await.status(), 201);
    let ahead = herald_with_clock(&app, SkewedClock::off_by(chrono::Duration::hours(1))).await;
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(ahead.sender.clone().run(stop_rx));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let state = app.row("skew-expiring").state;
        if state != "scheduled" && state != "sending" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never ended: {state}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.send(true).unwrap();
    running.await.unwrap();
    assert_eq!(app.row("skew-expiring").state, "delivered");
    assert_eq!(rx.event_ids(), ["skew-expiring"]);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_clock_does_not_expire_what_the_database_claimed_postgres() {
    a_skewed_clock_does_not_expire_what_the_database_claimed().await
}

async fn the_policy_version_is_recorded_on_the_row(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    let version = app.herald.settings.retry.version.clone();
    assert!(version.starts_with("default@"), "{version}");
    post_all(&app, &rx.url, &[("versioned".into(), json!({}))]).await;
    assert_eq!(
        app.message("versioned").await["retry_policy_version"],
        version.as_str()
    );
    // A plain SQL insert gets the version in force at its first claim.
    let insert = format!(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
         VALUES ('plain-sql', 'webhook', '{}', '{{\"body\": 1}}')",
        rx.url
    );
    app.raw_sql(&insert);
    assert_eq!(app.row("plain-sql").retry_policy_version, None);
    assert_eq!(app.run_until_idle().await, 2);
    assert_eq!(
        app.row("plain-sql").retry_policy_version.as_deref(),
        Some(version.as_str())
    );
    assert_eq!(app.attempts("plain-sql")[0].policy_version, version);
    app.stop().await;
}

/// Which of `channels` notified, in order, up to and including the sentinel that the test sends
/// last (notifications arrive in commit order, so the sentinel closes the window: no waiting
/// for something not to happen).
pub(crate) fn notifications_until_sentinel(listener: &mut PgConnection) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        for n in listener.notifications_iter() {
            let n = n.unwrap();
            seen.push(n.channel.clone());
            if n.channel == "herald_test_sentinel" {
                return seen;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no sentinel: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Inserts (one rolled back, one committed) and then the sentinel; returns which channels
/// notified. `insert_as` runs the inserts as that role.
async fn notifications_of_inserts(app: &TestApp, insert_as: Option<&str>) -> Vec<String> {
    let n = NOTIFY_ROUND.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let batch = format!(
        "BEGIN; {}; ROLLBACK; BEGIN; {}; COMMIT;",
        outbox_insert(&format!("rolled-back-{n}"), "now()"),
        outbox_insert(&format!("committed-{n}"), "now()"),
    );
    notifications_of_sql(app, insert_as, &batch).await
}

/// A plain SQL insert of a webhook row scheduled at `at` (an SQL expression).
fn outbox_insert(event_id: &str, at: &str) -> String {
    format!(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload, scheduled_at) \
         VALUES ('{event_id}', 'webhook', 'https://x.example/h', '{{\"body\": 1}}', {at})"
    )
}

/// Runs `batch` on a connection of its own (as `run_as`, when given), then sends the sentinel;
/// returns which channels notified meanwhile.
async fn notifications_of_sql(app: &TestApp, run_as: Option<&str>, batch: &str) -> Vec<String> {
    let listener = listen_for_wake_ups(app);
    let mut c = PgConnection::establish(&app.test_db.url).unwrap();
    if let Some(role) = run_as {
        c.batch_execute(&format!("SET ROLE {role}")).unwrap();
    }
    c.batch_execute(batch).unwrap();
    notifications_until_sent_sentinel(app, listener).await
}

fn listen_for_wake_ups(app: &TestApp) -> PgConnection {
    let mut listener = PgConnection::establish(&app.test_db.url).unwrap();
    listener
        .batch_execute("LISTEN herald_outbox; LISTEN herald_test_sentinel")
        .unwrap();
    listener
}

/// Sends the sentinel (after whatever the test committed before) and collects up to it.
async fn notifications_until_sent_sentinel(
    app: &TestApp,
    mut listener: PgConnection,
) -> Vec<String> {
    app.raw_sql("NOTIFY herald_test_sentinel");
    tokio::task::spawn_blocking(move || notifications_until_sentinel(&mut listener))
        .await
        .unwrap()
}

static NOTIFY_ROUND: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The wake-up follows where Herald listens: no Herald listener registered, no NOTIFY (no
/// notify-queue lock on the application's commit); a listener registered, one NOTIFY per committed
/// insert and none for a rolled-back one; stopped, none again. An application role with only INSERT
/// on the outbox can insert either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_follows_whether_herald_listens_postgres() {
    let app = spawn_app_with(Backend::Postgres, "listen_notify = false\n").await;
    let role = format!("app_{}", app.test_db.url.rsplit('/').next().unwrap());
    app.raw_sql(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role}; \
         GRANT INSERT ON herald_outbox TO {role}; \
         GRANT USAGE ON SEQUENCE herald_outbox_id_seq TO {role}"
    ));
    assert_eq!(
        notifications_of_inserts(&app, None).await,
        ["herald_test_sentinel"],
        "nobody listens: no NOTIFY"
    );
    assert_eq!(
        notifications_of_inserts(&app, Some(&role)).await,
        ["herald_test_sentinel"],
        "an INSERT-only role, nobody listening"
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let wake = Arc::new(tokio::sync::Notify::new());
    let t = herald::sender::listener::spawn(
        &app.db,
        app.test_db.url.clone(),
        wake.clone(),
        stop.clone(),
    );
    // The listener wakes once when it has connected and listens.
    tokio::time::timeout(Duration::from_secs(10), wake.notified())
        .await
        .expect("listener connected");
    assert_eq!(
        notifications_of_inserts(&app, None).await,
        ["herald_outbox", "herald_test_sentinel"]
    );
    assert_eq!(
        notifications_of_inserts(&app, Some(&role)).await,
        ["herald_outbox", "herald_test_sentinel"],
        "an INSERT-only role"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::task::spawn_blocking(move || t.join().unwrap())
        .await
        .unwrap();
    assert_eq!(
        notifications_of_inserts(&app, None).await,
        ["herald_test_sentinel"],
        "a listener that stopped has unregistered"
    );
    app.raw_sql(&format!(
        "REVOKE ALL ON herald_outbox FROM {role}; \
         REVOKE ALL ON SEQUENCE herald_outbox_id_seq FROM {role}; DROP ROLE {role}"
    ));
    app.stop().await;
}

/// An awake sender's promise (migration 000021, `sender::awake`): while it stands, inserts of
/// due rows skip the wake-up — as an INSERT-only role too, which reads the promise; a lapsed
/// one does not count. Settling withdraws the promise at once (the next insert notifies again)
/// but says "not yet" while a transaction that skipped its wake-up is still open, and "settled"
/// once it has committed, so the claim after it sees that row. A promise replaced by a later
/// one is not withdrawn by its maker (the later one still stands). A REPEATABLE READ
/// transaction whose snapshot predates a withdrawal sees it. SQLite has nothing to promise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awake_sender_skips_wake_ups_and_settles_only_after_every_skipper_postgres() {
    let sqlite = spawn_app(Backend::Sqlite).await;
    assert_eq!(sqlite.db.promise_awake(1_000).unwrap(), None);
    assert!(sqlite.db.settle_awake(0).unwrap());
    sqlite.stop().await;

    let app = spawn_app_with(Backend::Postgres, "listen_notify = false\n").await;
    let role = format!("awake_{}", app.test_db.url.rsplit('/').next().unwrap());
    app.raw_sql(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role}; \
         GRANT INSERT ON herald_outbox TO {role}; \
         GRANT USAGE ON SEQUENCE herald_outbox_id_seq TO {role}; \
         INSERT INTO herald_listeners (owner, seen_at) VALUES ('test', now() + interval '1 hour')"
    ));
    let insert = |id: &str| format!("{};", outbox_insert(id, "now()"));
    let woke = ["herald_outbox", "herald_test_sentinel"];
    let quiet = ["herald_test_sentinel"];
    assert_eq!(
        notifications_of_sql(&app, None, &insert("before")).await,
        woke
    );
    let promise = app.db.promise_awake(600_000).unwrap().expect("a promise");
    assert_eq!(
        notifications_of_sql(&app, None, &insert("awake-1")).await,
        quiet
    );
    assert_eq!(
        notifications_of_sql(&app, Some(&role), &insert("awake-2")).await,
        quiet,
        "an INSERT-only role"
    );

    // A transaction that skipped its wake-up stays open across the settle.
    let listener = listen_for_wake_ups(&app);
    let mut open = PgConnection::establish(&app.test_db.url).unwrap();
    open.batch_execute(&format!("BEGIN; {}", insert("straddler")))
        .unwrap();
    assert!(!app.db.settle_awake(promise).unwrap(), "a skipper is open");
    // Withdrawn at once: this insert notifies.
    let mut other = PgConnection::establish(&app.test_db.url).unwrap();
    other.batch_execute(&insert("after-withdrawal")).unwrap();
    assert!(
        !app.db.settle_awake(promise).unwrap(),
        "the skipper is still open"
    );
    open.batch_execute("COMMIT").unwrap();
    assert!(
        app.db.settle_awake(promise).unwrap(),
        "every skipper has committed"
    );
    assert_eq!(
        notifications_until_sent_sentinel(&app, listener).await,
        woke,
        "only the insert after the withdrawal woke; the straddler skipped its wake-up"
    );

    // A promise replaced by a later one: settling the first leaves the second standing.
    let first = app.db.promise_awake(600_000).unwrap().unwrap();
    let second = app.db.promise_awake(1_200_000).unwrap().unwrap();
    assert!(second > first);
    assert!(app.db.settle_awake(first).unwrap());
    assert_eq!(
        notifications_of_sql(&app, None, &insert("second-stands")).await,
        quiet
    );
    assert!(app.db.settle_awake(second).unwrap());
    assert_eq!(
        notifications_of_sql(&app, None, &insert("withdrawn")).await,
        woke
    );
    // A promise that has lapsed does not count.
    app.db.promise_awake(-1).unwrap().unwrap();
    assert_eq!(
        notifications_of_sql(&app, None, &insert("lapsed")).await,
        woke
    );
    // A REPEATABLE READ transaction whose snapshot was taken while a promise stood sees it
    // withdrawn (the promise is read as it is now): it notifies.
    let promise = app.db.promise_awake(600_000).unwrap().unwrap();
    let listener = listen_for_wake_ups(&app);
    let mut rr = PgConnection::establish(&app.test_db.url).unwrap();
    rr.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM herald_outbox")
        .unwrap();
    assert!(app.db.settle_awake(promise).unwrap());
    rr.batch_execute(&format!("{} COMMIT;", insert("repeatable-read")))
        .unwrap();
    assert_eq!(
        notifications_until_sent_sentinel(&app, listener).await,
        woke,
        "a snapshot older than the withdrawal"
    );

    app.raw_sql(&format!(
        "REVOKE ALL ON herald_outbox FROM {role}; \
         REVOKE ALL ON SEQUENCE herald_outbox_id_seq FROM {role}; DROP ROLE {role}"
    ));
    app.stop().await;
}

/// SQLite's insert watch (its LISTEN/NOTIFY) wakes for what the PostgreSQL trigger notifies for,
/// as other connections commit it: a row due now or within the second, a keyed row waiting
/// behind its key's head; not for a row scheduled for later, an insert rolled back, an update of
/// a row already there (a claim, an outcome), or nothing at all. Each wake-up is reported once.
/// With file events (Linux), each commit is reported as a write of the WAL file first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_insert_watch_wakes_for_what_notify_would_sqlite() {
    for file_events in [true, false] {
        insert_watch_wakes_for_what_notify_would(file_events).await;
    }
}

async fn insert_watch_wakes_for_what_notify_would(file_events: bool) {
    use herald::storage::watch::InsertWatch;
    let app = spawn_app(Backend::Sqlite).await;
    app.raw_sql(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
         VALUES ('there-before', 'webhook', 'https://x.example/h', '{\"body\": 1}')",
    );
    let path = herald::storage::sqlite_path(&app.test_db.url).unwrap();
    let mut watch = InsertWatch::open(path, file_events).unwrap();
    // File events where asked for on Linux — unless this user's inotify instances ran out (many
    // tests in parallel on a big machine): then it looks every 10 ms, and every assertion below
    // holds the same.
    let out_of_inotify = |w: &InsertWatch| {
        w.no_file_events_because()
            .is_some_and(|why| why.contains("Too many open files"))
    };
    assert_eq!(
        watch.has_file_events(),
        file_events && cfg!(target_os = "linux") && !out_of_inotify(&watch)
    );
    // Through a symbolic link from another directory: the WAL is beside the file it leads to,
    // and so is the watch's.
    let elsewhere = tempfile::tempdir().unwrap();
    let link = elsewhere.path().join("linked.db");
    std::os::unix::fs::symlink(path, &link).unwrap();
    let mut linked = InsertWatch::open(link.to_str().unwrap(), file_events).unwrap();
    assert_eq!(
        linked.has_file_events(),
        file_events && cfg!(target_os = "linux") && !out_of_inotify(&linked)
    );
    // After a commit: the watch is told the WAL file was written (at once where the system
    // reports writes), then looks.
    let look = |watch: &mut InsertWatch, what: &str| {
        assert!(
            watch.wait(Duration::from_secs(10)).unwrap(),
            "{what}: the WAL's write reported"
        );
        watch.look(Utc::now()).unwrap()
    };
    // An update that changes a value (one that changes nothing writes nothing at all).
    let touch = "UPDATE herald_outbox SET attempts = attempts + 1 WHERE event_id = 'there-before'";
    app.raw_sql(touch);
    assert!(
        linked.wait(Duration::from_secs(10)).unwrap(),
        "the WAL's write reported through the link"
    );
    assert!(!look(
        &mut watch,
        "a row there before the watch began, and an update of it"
    ));
    let insert = |id: &str, extra_cols: &str, extra_vals: &str| {
        format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload{extra_cols}) \
             VALUES ('{id}', 'webhook', 'https://x.example/h', '{{\"body\": 1}}'{extra_vals})"
        )
    };
    let at = |offset: &str| format!(", strftime('%Y-%m-%d %H:%M:%f+00:00', 'now', '{offset}')");
    app.raw_sql(&insert("later", ", scheduled_at", &at("+1 hour")));
    assert!(!look(&mut watch, "scheduled an hour ahead"));
    // A rolled-back insert may write nothing at all, so it is looked at with the next commit.
    app.raw_sql(&format!(
        "BEGIN IMMEDIATE; {}; ROLLBACK;",
        insert("undone", "", "")
    ));
    app.raw_sql(touch);
    assert!(!look(
        &mut watch,
        "rolled back, then an update of a row there before"
    ));
    app.raw_sql(&insert("due", "", ""));
    assert!(look(&mut watch, "due at once"));
    assert!(!watch.look(Utc::now()).unwrap(), "reported once");
    app.raw_sql(&insert("soon", ", scheduled_at", &at("+0.5 seconds")));
    assert!(look(&mut watch, "due within the second"));
    app.raw_sql(&insert("head", ", ordering_key", ", 'k'"));
    assert!(look(&mut watch, "a keyed row at its key's head is due"));
    app.raw_sql(&insert("behind", ", ordering_key", ", 'k'"));
    assert!(
        app.row("behind").next_attempt_at.is_none(),
        "waits behind its key's head"
    );
    assert!(look(
        &mut watch,
        "a keyed row waiting behind its key's head"
    ));
    // One wake-up for a commit that added several rows, one of them due.
    app.raw_sql(&format!(
        "BEGIN IMMEDIATE; {}; {}; COMMIT;",
        insert("later-2", ", scheduled_at", &at("+1 hour")),
        insert("due-2", "", "")
    ));
    assert!(look(&mut watch, "a commit with a due row among others"));
    assert!(!watch.look(Utc::now()).unwrap(), "nothing since");
    if watch.has_file_events() {
        assert!(
            !watch.wait(Duration::from_millis(50)).unwrap(),
            "no write, no event"
        );
    }
    // A `file:` URI: no file events (its WAL's name is not worked out), looking instead.
    let uri = InsertWatch::open(&format!("file:{path}"), true).unwrap();
    assert!(!uri.has_file_events());
    assert!(
        uri.no_file_events_because().unwrap().contains("URI"),
        "{:?}",
        uri.no_file_events_because()
    );
    drop((watch, linked, uri));
    app.stop().await;
}

/// Whether `batch` woke a listening Herald (the outbox's NOTIFY came before the sentinel).
async fn wakes(app: &TestApp, batch: &str) -> bool {
    woke(notifications_of_sql(app, None, batch).await)
}

fn woke(seen: Vec<String>) -> bool {
    match seen.as_slice() {
        [s] if s == "herald_test_sentinel" => false,
        [o, s] if o == "herald_outbox" && s == "herald_test_sentinel" => true,
        other => panic!("unexpected notifications {other:?}"),
    }
}

/// A Herald listens to learn that something is due. A row scheduled for later wakes nobody (a
/// claim would find nothing, and the application's commit would take PostgreSQL's notify-queue
/// lock for it); a row due now or within the second does, and so does a transaction holding
/// both. A due row in a savepoint rolled back takes its wake-up with it, and a due row `ON
/// CONFLICT DO NOTHING` skipped wakes nobody (what counts is the rows as stored). A keyed row
/// waiting behind its key's head wakes as before (a sender may wait for its commit to release
/// the key). A fan-out's children decide for it. Herald's own ways in (the `herald_enqueue`
/// function, the API's group enqueue) follow the same rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_row_that_is_due_wakes_herald_postgres() {
    let app = spawn_app_with(
        Backend::Postgres,
        "listen_notify = false\n[endpoints.e]\nurl = \"https://e.example/hook\"\n\
         event_types = [\"order.*\"]\n",
    )
    .await;
    // A Herald listening elsewhere, as its registration shows it.
    app.raw_sql(
        "INSERT INTO herald_listeners (owner, seen_at) VALUES ('elsewhere', now() + interval '1 hour')",
    );
    let later = "now() + interval '1 hour'";
    let soon = "now() + interval '5 seconds'";
    let within = "now() + interval '500 milliseconds'";
    let past = "now() - interval '1 hour'";
    assert!(!wakes(&app, &outbox_insert("later", later)).await);
    assert!(!wakes(&app, &outbox_insert("soon", soon)).await);
    assert!(wakes(&app, &outbox_insert("now", "now()")).await);
    assert!(wakes(&app, &outbox_insert("within", within)).await);
    assert!(wakes(&app, &outbox_insert("past", past)).await);
    let both = |first: String, second: String| format!("BEGIN; {first}; {second}; COMMIT;");
    assert!(
        wakes(
            &app,
            &both(outbox_insert("l1", later), outbox_insert("d1", "now()"))
        )
        .await,
        "a later row, then a due one"
    );
    assert!(
        wakes(
            &app,
            &both(outbox_insert("d2", "now()"), outbox_insert("l2", later))
        )
        .await,
        "a due row, then a later one"
    );
    assert!(
        !wakes(
            &app,
            &format!(
                "BEGIN; SAVEPOINT s; {}; ROLLBACK TO SAVEPOINT s; {}; COMMIT;",
                outbox_insert("undone", "now()"),
                outbox_insert("l3", later)
            )
        )
        .await,
        "the due row was rolled back to its savepoint"
    );
    assert!(app.db.find_by_event_id("undone").unwrap().is_none());
    let keyed = |id: &str, at: &str| {
        format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload, scheduled_at, \
             ordering_key) VALUES ('{id}', 'webhook', 'https://x.example/h', '{{\"body\": 1}}', {at}, 'k')"
        )
    };
    assert!(
        !wakes(&app, &keyed("k-head", later)).await,
        "the key's head, later"
    );
    assert!(
        wakes(&app, &keyed("k-behind", "now()")).await,
        "behind its key's head: a sender whose outcome found the key locked by this insert \
         releases the key when the insert's commit wakes it"
    );
    assert!(
        app.row("k-behind").next_attempt_at.is_none(),
        "waits for its head"
    );
    assert!(
        !wakes(
            &app,
            &format!("{} ON CONFLICT DO NOTHING", outbox_insert("later", "now()"))
        )
        .await,
        "a due row skipped: its event id was there"
    );
    // A fan-out's row is not stored: its children are, by a statement of their own.
    let fan_out = |id: &str, at: &str| {
        outbox_insert(id, at).replace("https://x.example/h", "type:order.placed")
    };
    assert!(!wakes(&app, &fan_out("fan-later", later)).await);
    assert!(wakes(&app, &fan_out("fan-now", "now()")).await);
    assert!(app.db.find_by_event_id("fan-now:e").unwrap().is_some());
    let enqueue = |id: &str, at: &str| {
        format!(
            "SELECT herald_enqueue('{id}', 'webhook', 'https://x.example/h', '{{\"body\": 1}}', {at})"
        )
    };
    assert!(!wakes(&app, &enqueue("fn-later", later)).await);
    assert!(wakes(&app, &enqueue("fn-now", "now()")).await);
    // The API's plain enqueue goes through the group writer's insert.
    for (id, hours_ahead, expected) in [("api-later", Some(1), false), ("api-now", None, true)] {
        let mut body = webhook(id, "https://x.example/h", json!({}));
        if let Some(hours) = hours_ahead {
            body["scheduled_at"] =
                json!((Utc::now() + chrono::Duration::hours(hours)).to_rfc3339());
        }
        let listener = listen_for_wake_ups(&app);
        assert_eq!(app.post_message(body).await.status(), 201, "{id}");
        assert_eq!(
            woke(notifications_until_sent_sentinel(&app, listener).await),
            expected,
            "{id}"
        );
    }
    app.stop().await;
}

/// A standby after failover answers every write with SQLSTATE 25006: 503 with Retry-After, and
/// nothing half-written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_answers_503_postgres() {
    let app = spawn_app(Backend::Postgres).await;
    let mut admin = PgConnection::establish(&app.test_db.url).unwrap();
    admin
        .batch_execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = on', \
             current_database()); END $$",
        )
        .unwrap();
    // New connections are read-only now.
    let read_only =
        herald::storage::Db::connect(&app.test_db.url, &herald::storage::PoolOptions::default())
            .unwrap();
    let post = |id: &str| {
        actix_web::test::TestRequest::post()
            .uri("/v1/messages")
            .set_json(webhook(id, "https://x.example/h", json!({})))
    };
    let answers = call_with_db(&app, read_only, vec![post("ro-1")]).await;
    assert_eq!(answers[0].status(), 503);
    assert!(answers[0].headers().contains_key("retry-after"));
    admin
        .batch_execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET default_transaction_read_only', \
             current_database()); END $$",
        )
        .unwrap();
    assert!(app.db.find_by_event_id("ro-1").unwrap().is_none());
    app.stop().await;
}

/// The server's end of a pooled connection takes the URL's TCP settings (`ServerKeepalive`)
/// where nothing else set them, and keeps what the database's own settings say: here
/// `ALTER DATABASE … SET tcp_keepalives_idle = 77` wins over the URL's 10, while the user
/// timeout, which nothing else set, is the URL's. Over TCP, as the harness's cluster is reached.
#[test]
fn the_servers_end_takes_the_urls_tcp_settings_unless_the_database_sets_them_postgres() {
    use diesel::{QueryableByName, RunQueryDsl};
    #[derive(QueryableByName)]
    struct Shown {
        #[diesel(sql_type = diesel::sql_types::Text)]
        idle: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        user_timeout: String,
    }
    let shown = |url: &str| -> (String, String) {
        let db =
            herald::storage::Db::connect(url, &herald::storage::PoolOptions::default()).unwrap();
        let herald::storage::Db::Pg(pool) = &db else {
            unreachable!()
        };
        let s: Shown = diesel::sql_query(
            "SELECT current_setting('tcp_keepalives_idle') AS idle, \
             current_setting('tcp_user_timeout') AS user_timeout",
        )
        .get_result(&mut pool.get().unwrap())
        .unwrap();
        (s.idle, s.user_timeout)
    };
    let plain = crate::support::TestDb::new(Backend::Postgres);
    assert_eq!(
        shown(&plain.url),
        ("10".to_owned(), "15000".to_owned()),
        "Herald's defaults on the server's end"
    );
    let set = crate::support::TestDb::new(Backend::Postgres);
    PgConnection::establish(&set.url)
        .unwrap()
        .batch_execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET tcp_keepalives_idle = 77', \
             current_database()); END $$",
        )
        .unwrap();
    assert_eq!(
        shown(&format!("{}?tcp_user_timeout=4000", set.url)),
        ("77".to_owned(), "4000".to_owned()),
        "the database's own setting kept; the URL's user timeout"
    );
}

/// A Herald session that stops inside a transaction (a process stopped by `SIGSTOP` or `docker
/// pause` mid-claim, holding a key's head; found by a walk-through) is ended by the server after
/// `IDLE_IN_TRANSACTION`: the application's transaction that needs the same row (here its
/// `herald_cancel`, which locks the message) goes on then, instead of waiting as long as the
/// process stays stopped; the stopped session's next statement fails, and the pool drops it.
#[test]
fn a_herald_session_stopped_inside_a_transaction_is_ended_by_the_server_postgres() {
    use diesel::{Connection, QueryableByName, RunQueryDsl};
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        v: String,
    }
    let t = crate::support::TestDb::new(Backend::Postgres);
    let db =
        herald::storage::Db::connect(&t.url, &herald::storage::PoolOptions::default()).unwrap();
    let herald::storage::Db::Pg(pool) = &db else {
        unreachable!()
    };
    let mut app = PgConnection::establish(&t.url).unwrap();
    app.batch_execute(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload, ordering_key) \
         VALUES ('frozen-1', 'webhook', 'https://x.example/h', '{\"body\": {}}', 'k')",
    )
    .unwrap();
    let mut stopped = pool.get().unwrap();
    let shown: Setting =
        diesel::sql_query("SELECT current_setting('idle_in_transaction_session_timeout') AS v")
            .get_result(&mut *stopped)
            .unwrap();
    assert_eq!(shown.v, "10s");
    // 0 (behind a pooler in transaction mode) leaves the server's setting.
    let off = herald::storage::Db::connect(
        &t.url,
        &herald::storage::PoolOptions {
            idle_in_transaction: std::time::Duration::ZERO,
            ..herald::storage::PoolOptions::default()
        },
    )
    .unwrap();
    let herald::storage::Db::Pg(off_pool) = &off else {
        unreachable!()
    };
    let shown_off: Setting =
        diesel::sql_query("SELECT current_setting('idle_in_transaction_session_timeout') AS v")
            .get_result(&mut *off_pool.get().unwrap())
            .unwrap();
    assert_eq!(shown_off.v, "0");
    // The stopped process: a transaction that locked the row, and then nothing.
    stopped
        .batch_execute("BEGIN; SELECT id FROM herald_outbox WHERE event_id = 'frozen-1' FOR UPDATE")
        .unwrap();
    // Waits for the lock, past the 10 s; without the server's timeout the lock stays held (a
    // stopped Herald holds it for good) and this fails at its own lock_timeout.
    let state: Setting = app
        .transaction(|c| {
            c.batch_execute("SET LOCAL lock_timeout = '40s'")?;
            diesel::sql_query("SELECT herald_cancel('frozen-1') AS v").get_result(c)
        })
        .unwrap();
    assert_eq!(state.v, "canceled");
    assert!(
        stopped.batch_execute("SELECT 1").is_err(),
        "its session was ended"
    );
}

/// On SQLite, Herald's checkpointer copies what the WAL holds into the database file while
/// Herald runs, so that no commit of Herald's has to (SQLite's default has the commit that
/// brings the WAL to 1,000 pages copy them, holding the writer lock). Here one small write,
/// far below the writers' own backstop: a reader open since before it keeps it in the WAL
/// only (the file read alone, `immutable=1`, does not have it); once that reader ends, a
/// pass of the checkpointer puts it in the file. Seen failing with the checkpointer's thread
/// not started (the last look found 0 rows).
#[test]
fn the_checkpointer_copies_committed_writes_into_the_database_file_sqlite() {
    use diesel::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let t = crate::support::TestDb::new(Backend::Sqlite);
    let path = herald::storage::sqlite_path(&t.url).unwrap().to_owned();
    // The database file alone, as if the WAL were not there.
    let in_file = || -> i64 {
        let mut c =
            diesel::sqlite::SqliteConnection::establish(&format!("file:{path}?immutable=1"))
                .unwrap();
        diesel::sql_query("SELECT count(*) AS n FROM herald_outbox WHERE event_id = 'ckpt-1'")
            .get_result::<Count>(&mut c)
            .unwrap()
            .n
    };
    let db =
        herald::storage::Db::connect(&t.url, &herald::storage::PoolOptions::default()).unwrap();
    let herald::storage::Db::Sqlite(sq) = &db else {
        unreachable!()
    };
    let mut reader = crate::support::db::reader_then_row(sq, "ckpt-1");
    assert!(
        sq.wait_for_checkpoints(2, Duration::from_secs(10)),
        "no pass within 10 s"
    );
    assert_eq!(in_file(), 0, "copied past an older reader's snapshot");
    reader.batch_execute("COMMIT").unwrap();
    assert!(
        sq.wait_for_checkpoints(1, Duration::from_secs(10)),
        "no pass within 10 s"
    );
    assert_eq!(in_file(), 1, "the committed row in the database file");
}

/// A watch that asked for file events and could not have them (here: opened while no connection
/// held the database, so its WAL file was not there yet; in production, more often, the user's
/// inotify instances used up) gets them by trying again, keeping its bearings: a row committed
/// before the retry is still seen at the next look, and a later commit is reported as a write.
/// A watch that did not ask never gets them. Seen failing with the retry left out ("file events
/// once the WAL is there").
#[test]
fn the_insert_watch_gets_file_events_by_trying_again_sqlite() {
    use herald::storage::watch::InsertWatch;
    use herald::storage::{Db, PoolOptions};
    let t = crate::support::TestDb::new(Backend::Sqlite);
    let path = herald::storage::sqlite_path(&t.url).unwrap().to_owned();
    let wal = std::path::PathBuf::from(format!("{path}-wal"));
    assert!(!wal.exists(), "no connection open: no WAL file");
    let mut watch = InsertWatch::open(&path, true).unwrap();
    if !cfg!(target_os = "linux") {
        assert!(!watch.has_file_events() && !watch.try_file_events_again());
        return;
    }
    assert!(!watch.has_file_events(), "no WAL file to watch yet");
    let why = watch
        .no_file_events_because()
        .unwrap_or_default()
        .to_owned();
    assert!(why.contains("No such file"), "{why}");
    // The watch's own connection opened the database: its WAL is there now.
    assert!(wal.exists());
    let db = Db::connect(&t.url, &PoolOptions::default()).unwrap();
    let Db::Sqlite(sq) = &db else { unreachable!() };
    let insert = |id: &str| {
        sq.write(|c| {
            Ok(c.batch_execute(&format!(
                "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
                 VALUES ('{id}', 'webhook', 'https://x.example/h', '{{\"body\": 1}}')"
            ))?)
        })
        .unwrap()
    };
    insert("before-the-retry");
    let got = watch.try_file_events_again();
    let why = watch
        .no_file_events_because()
        .unwrap_or_default()
        .to_owned();
    // Unless this user's inotify instances ran out (many tests in parallel on a big machine).
    if why.contains("Too many open files") {
        return;
    }
    assert!(
        got && watch.has_file_events(),
        "file events once the WAL is there: {why}"
    );
    assert!(
        watch.look(Utc::now()).unwrap(),
        "a due row committed before the retry, seen at the next look"
    );
    assert!(!watch.look(Utc::now()).unwrap(), "and only once");
    insert("after-the-retry");
    assert!(
        watch.wait(Duration::from_secs(10)).unwrap(),
        "the commit's WAL write reported"
    );
    assert!(
        watch.look(Utc::now()).unwrap(),
        "a due row committed after the retry"
    );
    let mut not_asked = InsertWatch::open(&path, false).unwrap();
    assert!(!not_asked.try_file_events_again());
    assert!(!not_asked.has_file_events());
}

/// `Db::closed` (what `herald serve` waits on before it exits) reports the database closed only
/// once the last handle is gone — here one held by another thread after the first was dropped —
/// and its connections with it: by then SQLite has copied the WAL into the database file and
/// removed `-wal` and `-shm`. Seen failing with the signal's field declared before the pool
/// ("-wal still there when closed was reported").
#[test]
fn closed_is_reported_once_the_last_handle_has_closed_the_database_sqlite() {
    use herald::storage::{Db, PoolOptions};
    let t = crate::support::TestDb::new(Backend::Sqlite);
    let path = herald::storage::sqlite_path(&t.url).unwrap().to_owned();
    let wal = std::path::PathBuf::from(format!("{path}-wal"));
    let shm = std::path::PathBuf::from(format!("{path}-shm"));
    let db = Db::connect(&t.url, &PoolOptions::default()).unwrap();
    let Db::Sqlite(sq) = &db else { unreachable!() };
    sq.write(|c| {
        Ok(c.batch_execute(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload, scheduled_at) \
             VALUES ('close-1', 'webhook', 'https://x.example/h', '{}', \
             '3026-01-01 00:00:00+00:00')",
        )?)
    })
    .unwrap();
    assert!(
        wal.exists() && shm.exists(),
        "WAL mode: both files while open"
    );
    let closed = db.closed().expect("SQLite");
    let held = db.clone();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        // A read on the pool while held: the connection goes back to the pool, not away.
        let Db::Sqlite(sq) = &held else {
            unreachable!()
        };
        sq.pool.get().unwrap().batch_execute("SELECT 1").unwrap();
        released.recv().unwrap();
        drop(held);
    });
    drop(db);
    assert!(
        !closed.wait(Duration::from_millis(200)),
        "closed reported while another thread held a handle"
    );
    assert!(wal.exists(), "the WAL went while a handle was held");
    release.send(()).unwrap();
    assert!(
        closed.wait(Duration::from_secs(10)),
        "not closed within 10 s"
    );
    assert!(!wal.exists(), "-wal still there when closed was reported");
    assert!(!shm.exists(), "-shm still there when closed was reported");
    holder.join().unwrap();
    assert!(
        crate::support::db::state_in_database_file(std::path::Path::new(&path), "close-1")
            .is_some(),
        "the row in the database file itself"
    );
}

/// PostgreSQL has nothing to wait for at exit: `Db::closed` is `None`.
#[test]
fn closed_has_nothing_to_wait_for_pg() {
    let t = crate::support::TestDb::new(Backend::Postgres);
    let db =
        herald::storage::Db::connect(&t.url, &herald::storage::PoolOptions::default()).unwrap();
    assert!(db.closed().is_none());
}

/// A burst that leaves SQLite's WAL larger than 16 MiB (here one transaction of some 24 MiB)
/// does not keep that size: once the checkpointer has copied it, the next write starts the WAL
/// again and cuts the file back to 16 MiB (`journal_size_limit`). Seen failing without the
/// setting (the file stayed at its largest).
#[test]
fn a_wal_left_large_by_a_burst_is_cut_back_sqlite() {
    let t = crate::support::TestDb::new(Backend::Sqlite);
    let path = herald::storage::sqlite_path(&t.url).unwrap().to_owned();
    let wal_len = || std::fs::metadata(format!("{path}-wal")).unwrap().len();
    let db =
        herald::storage::Db::connect(&t.url, &herald::storage::PoolOptions::default()).unwrap();
    let herald::storage::Db::Sqlite(sq) = &db else {
        unreachable!()
    };
    // 6,000 rows of 4 KiB, due in a thousand years (nothing runs to send them anyway).
    sq.write(|c| {
        Ok(c.batch_execute(
            "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 6000) \
             INSERT INTO herald_outbox (event_id, channel, destination, payload, scheduled_at) \
             SELECT 'burst-' || i, 'webhook', 'https://x.example/h', \
             json_object('body', json_object('pad', printf('%.4000c', 'x'))), \
             '3026-01-01 00:00:00+00:00' FROM s",
        )?)
    })
    .unwrap();
    let burst = wal_len();
    assert!(burst > 20 << 20, "the burst's WAL: {burst} bytes");
    assert!(
        sq.wait_for_checkpoints(1, Duration::from_secs(30)),
        "no pass within 30 s"
    );
    sq.write(|c| {
        Ok(
            c.batch_execute(
                "UPDATE herald_outbox SET max_attempts = 3 WHERE event_id = 'burst-1'",
            )?,
        )
    })
    .unwrap();
    let after = wal_len();
    assert!(
        after <= 16 << 20,
        "the WAL after the next write: {after} bytes (was {burst})"
    );
}

async fn nul_is_refused_at_the_edge(backend: Backend) {
    let app = spawn_app(backend).await;
    let problem = |r: serde_json::Value| r["field"].as_str().map(str::to_owned);
    let cases = [
        (
            webhook("nul-body", "https://x.example/h", json!({"t": "a\u{0}b"})),
            "payload.body.t",
        ),
        (
            json!({"event_id": "nul-mail", "channel": "email", "destination": "a@example.com",
                   "payload": {"subject": "hi", "text": "t", "headers": {"X-Tag": "v\u{0}"}}}),
            "payload.headers.X-Tag",
        ),
        (
            json!({"event_id": "nul-subject", "channel": "email", "destination": "a@example.com",
                   "payload": {"subject": "h\u{0}i", "text": "t"}}),
            "payload.subject",
        ),
    ];
    for (body, field) in cases {
        let r = app.post_message(body).await;
        assert_eq!(r.status(), 422, "{field}");
        assert_eq!(problem(r.json().await.unwrap()).as_deref(), Some(field));
    }
    let get = app
        .http
        .get(format!("{}/v1/messages/%00", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 404);
    let cancel = app
        .http
        .post(format!("{}/v1/messages/a%00b/cancel", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 404);
    // The library refuses it too, before any SQL.
    let m = herald::outbox::NewMessage::webhook("lib-nul", "https://x.example/h", json!("\u{0}"));
    let limits = herald::outbox::Limits::default();
    let err = m.prepare(&limits, Utc::now()).unwrap_err();
    assert_eq!(err[0].field, "payload.body");
    app.stop().await;
}

/// ~500 malformed and hostile requests to the message API: never a 5xx.
async fn hostile_requests_never_get_a_5xx(backend: Backend) {
    use rand::{Rng, SeedableRng};
    let app = spawn_app(backend).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6e75_6c6c);
    let nasty = [
        "\u{0}",
        "\u{0}\u{0}",
        "%00",
        "\\u0000",
        "\u{feff}",
        "\u{fffd}",
        "\u{1F4A9}",
        "'",
        "\"",
        "--",
        "; DROP TABLE herald_outbox; --",
        "\r\n",
        "\n",
        " ",
        "",
        "%",
        "/",
        "..",
        "../..",
        "\u{7f}",
        "\u{202e}",
        "a\u{0}b",
        "endpoint:",
        "type:",
        "http://",
        "mailto:",
        "\t",
    ];
    let pick = |rng: &mut rand::rngs::StdRng| nasty[rng.random_range(0..nasty.len())].to_owned();
    let mut statuses = std::collections::BTreeMap::new();
    for i in 0..500 {
        let s = pick(&mut rng);
        let request = match i % 5 {
            0 => app
                .http
                .post(format!("{}/v1/messages", app.base))
                .header("content-type", "application/json")
                .body(format!("{{\"event_id\": \"h{i}\", \"channel\": \"webhook\", \"destination\": {}, \"payload\": {{\"body\": {}}}}}",
                    serde_json::to_string(&format!("https://x.example/{s}")).unwrap(),
                    serde_json::to_string(&s).unwrap())),
            1 => app
                .http
                .post(format!("{}/v1/messages", app.base))
                .json(&json!({"event_id": format!("h{i}{s}"), "channel": s, "destination": s,
                              "payload": {"subject": s, "text": s, "headers": {s.clone(): s}}})),
            2 => app
                .http
                .post(format!("{}/v1/messages", app.base))
                .header("content-type", "application/json")
                .header("Idempotency-Key", format!("k{i}").as_str())
                .body(
                    (0..rng.random_range(0..64))
                        .map(|_| rng.random::<u8>())
                        .collect::<Vec<u8>>(),
                ),
            3 => app.http.get(format!(
                "{}/v1/messages/{}",
                app.base,
                url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
            )),
            _ => app.http.post(format!(
                "{}/v1/messages/{}x/cancel",
                app.base,
                url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
            )),
        };
        let status = request.send().await.unwrap().status().as_u16();
        *statuses.entry(status).or_insert(0) += 1;
    }
    assert!(statuses.keys().all(|s| *s < 500), "{statuses:?}");
    assert!(
        statuses.contains_key(&422) && statuses.contains_key(&404),
        "{statuses:?}"
    );
    app.stop().await;
}

both_backends!(
    concurrent_watchdogs_move_each_lease_once,
    a_refused_outcome_says_lease_lost_and_a_late_2xx_settles,
    a_poison_message_backs_off,
    the_policy_version_is_recorded_on_the_row,
    nul_is_refused_at_the_edge,
    hostile_requests_never_get_a_5xx,
);
