//! Fan-out (`destination = "type:EVENT.TYPE"`): one row per subscribed endpoint on every way in
//! (HTTP, the Rust library, plain SQL and, on PostgreSQL, `herald_enqueue`), each with its own
//! event id, retries and dead letter; no subscriber is refused, never silently dropped.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::sqlite::SqliteConnection;
use diesel::{Connection, RunQueryDsl};
use herald::domain::event_type::{EventType, subscribers};
use herald::outbox::{EnqueueError, Enqueued, NewMessage, enqueue};
use serde_json::json;

use crate::both_backends;
use crate::support::app::{TestApp, spawn_app_with};
use crate::support::{Backend, Receiver, Reply};

/// Three receivers (one per endpoint, so their slow-downs are their own) and an endpoint that
/// subscribes to something else.
struct Three {
    a: Receiver,
    b: Receiver,
    c: Receiver,
}

async fn three_endpoints(backend: Backend) -> (TestApp, Three) {
    let (a, b, c) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let toml = format!(
        "[endpoints.a]\nurl = \"{}\"\nevent_types = [\"order.*\"]\nheaders = {{ X-Endpoint = \"a\" }}\n\
         [endpoints.b]\nurl = \"{}\"\nevent_types = [\"order.placed\", \"invoice.*\"]\n\
         [endpoints.c]\nurl = \"{}\"\nevent_types = [\"*\"]\n\
         [endpoints.d]\nurl = \"https://d.example/hook\"\nevent_types = [\"customer.*\"]\n\
         [endpoints.plain]\nurl = \"https://plain.example/hook\"\n",
        a.url, b.url, c.url
    );
    let app = spawn_app_with(backend, &toml).await;
    (app, Three { a, b, c })
}

/// Drives the sender through every retry: each round runs until idle, then moves time past the
/// longest backoff (the test policy caps it at 60 s).
async fn drive(app: &TestApp) {
    for _ in 0..8 {
        app.run_until_idle().await;
        app.advance(Duration::from_secs(120));
    }
    app.run_until_idle().await;
}

fn fanout(event_id: &str, event_type: &str) -> serde_json::Value {
    json!({
        "event_id": event_id,
        "channel": "webhook",
        "destination": format!("type:{event_type}"),
        "payload": {"body": {"type": event_type, "order": 42}},
    })
}

/// A change of `[endpoints]` rolling through processes that share a database (found by a
/// walk-through): the new process subscribes endpoint `new`; an old process, which has no such
/// endpoint, claims a fan-out child for it. Nothing left, so it is `not_sent` and retried (it
/// was dead-lettered at once), and the new process sends it on its retry.
async fn a_process_without_the_endpoint_leaves_its_message_to_one_with_it(backend: Backend) {
    let (a, fresh) = (Receiver::start().await, Receiver::start().await);
    let old_toml = format!(
        "[endpoints.a]\nurl = \"{}\"\nevent_types = [\"order.*\"]\n",
        a.url
    );
    let old = spawn_app_with(backend, &old_toml).await;
    let new = crate::support::app::spawn_on(
        crate::support::TestDb::attach(&old.test_db.url, backend),
        &format!(
            "{old_toml}[endpoints.new]\nurl = \"{}\"\nevent_types = [\"order.*\"]\n",
            fresh.url
        ),
    )
    .await;
    let r = new.post_message(fanout("roll-1", "order.placed")).await;
    assert_eq!(r.status(), 201);
    assert_eq!(old.run_until_idle().await, 2);
    assert_eq!(a.event_ids(), ["roll-1:a"]);
    let row = old.row("roll-1:new");
    assert_eq!(
        (row.state.as_str(), row.last_error_class.map(|c| c.as_str())),
        ("retryable", Some("not_sent"))
    );
    assert_eq!(
        old.attempts("roll-1:new")[0].error_kind.as_deref(),
        Some("unknown_endpoint")
    );
    new.advance(Duration::from_secs(120));
    assert_eq!(new.run_until_idle().await, 1);
    assert_eq!(fresh.event_ids(), ["roll-1:new"]);
    assert_eq!(new.row("roll-1:new").state.as_str(), "delivered");
    new.stop().await;
    old.stop().await;
}

async fn one_failing_endpoint_never_holds_back_the_others(backend: Backend) {
    let (app, rx) = three_endpoints(backend).await;
    rx.c.script(std::iter::repeat_n(Reply::Status(500), 50));
    let r = app.post_message(fanout("ord-1", "order.placed")).await;
    assert_eq!(r.status(), 201);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["event_id"], "ord-1");
    assert_eq!(v["destination"], "type:order.placed");
    assert_eq!(v["endpoints"], json!(["a", "b", "c"]));
    let ids: Vec<&str> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["ord-1:a", "ord-1:b", "ord-1:c"]);
    assert_eq!(v["messages"][0]["destination"], "endpoint:a");
    assert_eq!(v["messages"][0]["state"], "scheduled");

    drive(&app).await;

    // The two healthy endpoints got it exactly once, with their own derived event id.
    assert_eq!(rx.a.event_ids(), ["ord-1:a"]);
    assert_eq!(rx.b.event_ids(), ["ord-1:b"]);
    let ra = &rx.a.requests()[0];
    assert_eq!(ra.header("idempotency-key"), Some("ord-1:a"));
    assert_eq!(
        ra.header("x-endpoint"),
        Some("a"),
        "the endpoint's own headers"
    );
    assert_eq!(ra.body, br#"{"order":42,"type":"order.placed"}"#);
    assert!(rx.b.requests()[0].header("x-endpoint").is_none());
    // The failing one spent its whole budget (4 attempts in the test policy), then dead-lettered.
    assert_eq!(rx.c.event_ids(), ["ord-1:c"; 4]);
    assert_eq!(app.row("ord-1:a").state, "delivered");
    assert_eq!(app.row("ord-1:b").state, "delivered");
    let c = app.row("ord-1:c");
    assert_eq!(c.state, "dead_letter");
    assert_eq!(c.attempts, 4);
    assert_eq!(
        c.last_error_class.map(|x| x.as_str().to_owned()).as_deref(),
        Some("exhausted")
    );

    // The original event id shows its children.
    let v = app.message("ord-1").await;
    let states: Vec<&str> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["delivered", "delivered", "dead_letter"]);
    assert_eq!(v["event_type"], "order.placed");

    // Support by the original event id: not "no such message", but the messages to name.
    for (method, path) in [
        ("GET", "/v1/messages/ord-1/explain"),
        ("POST", "/v1/messages/ord-1/replay"),
        ("POST", "/v1/messages/ord-1/cancel"),
        ("POST", "/v1/messages/ord-1/skip"),
    ] {
        let mut rq = app
            .http
            .request(method.parse().unwrap(), format!("{}{path}", app.base));
        if method == "POST" {
            rq = rq.json(&json!({"reason": "the receiver lost it"}));
        }
        let r = rq.send().await.unwrap();
        assert_eq!(r.status(), 409, "{path}");
        let p: serde_json::Value = r.json().await.unwrap();
        assert_eq!(p["type"], "https://herald.dev/problems/fan-out", "{p}");
        assert_eq!(p["field"], "event_id");
        let named: Vec<&str> = p["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["event_id"].as_str().unwrap())
            .collect();
        assert_eq!(named, ["ord-1:a", "ord-1:b", "ord-1:c"], "{path}");
    }
    assert_eq!(app.row("ord-1:c").state, "dead_letter", "nothing replayed");

    // The same event id again: 200 with the existing children, nothing new, nothing resent.
    let again = app.post_message(fanout("ord-1", "order.placed")).await;
    assert_eq!(again.status(), 200);
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(again["endpoints"], json!(["a", "b", "c"]));
    assert_eq!(again["messages"][0]["state"], "delivered");
    drive(&app).await;
    assert_eq!(rx.a.requests().len() + rx.b.requests().len(), 2);
    app.stop().await;
}

async fn no_subscriber_or_a_bad_type_is_a_422_naming_destination(backend: Backend) {
    let app = spawn_app_with(
        backend,
        "[endpoints.a]\nurl = \"https://a.example/hook\"\nevent_types = [\"order.*\"]\n",
    )
    .await;
    for (body, why) in [
        (fanout("nobody-1", "invoice.paid"), "no endpoint subscribes"),
        (fanout("nobody-2", "order"), "no endpoint subscribes"),
        (fanout("bad-1", "order..placed"), "segments"),
        (fanout("bad-2", "order.*"), "*"),
    ] {
        let r = app.post_message(body.clone()).await;
        assert_eq!(r.status(), 422, "{body}");
        assert_eq!(
            r.headers()["content-type"],
            "application/problem+json",
            "{body}"
        );
        let p: serde_json::Value = r.json().await.unwrap();
        assert_eq!(p["field"], "destination", "{p}");
        assert!(p.to_string().contains(why), "{p}");
        let id = body["event_id"].as_str().unwrap();
        let got = app
            .http
            .get(format!("{}/v1/messages/{id}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(got.status(), 404, "nothing written for {id}");
    }
    // A fan-out id whose children's ids would be too long is refused naming event_id.
    let long = "x".repeat(254);
    let r = app.post_message(fanout(&long, "order.placed")).await;
    assert_eq!(r.status(), 422);
    let p: serde_json::Value = r.json().await.unwrap();
    assert_eq!(p["field"], "event_id", "{p}");
    app.stop().await;
}

/// Runs SQL on a plain connection of the app's database; the error's text on failure.
fn exec_sql(app: &TestApp, sql: &str) -> Result<(), String> {
    with_app_conn(
        app,
        |c| c.batch_execute(sql).map_err(|e| e.to_string()),
        |c| c.batch_execute(sql).map_err(|e| e.to_string()),
    )
}

/// Runs `f` on a plain diesel connection of the app's database, as an application would.
fn with_app_conn<T>(
    app: &TestApp,
    pg: impl FnOnce(&mut PgConnection) -> T,
    sqlite: impl FnOnce(&mut SqliteConnection) -> T,
) -> T {
    match app.test_db.backend {
        Backend::Postgres => pg(&mut PgConnection::establish(&app.test_db.url).unwrap()),
        Backend::Sqlite => {
            let path = herald::storage::sqlite_path(&app.test_db.url).unwrap();
            let mut c = SqliteConnection::establish(path).unwrap();
            c.batch_execute("PRAGMA busy_timeout = 5000").unwrap();
            sqlite(&mut c)
        }
    }
}

fn lib_fanout<C: Connection + herald::outbox::OutboxConnection>(
    c: &mut C,
    event_id: &str,
    event_type: &str,
    commit: bool,
) -> Result<Enqueued, EnqueueError> {
    let m = NewMessage::webhook(
        event_id,
        format!("type:{event_type}"),
        json!({"from": "lib"}),
    );
    let mut out = None;
    let r: Result<(), diesel::result::Error> = c.transaction(|c| {
        out = Some(enqueue(c, m));
        if commit {
            Ok(())
        } else {
            Err(diesel::result::Error::RollbackTransaction)
        }
    });
    assert_eq!(r.is_ok(), commit);
    out.unwrap()
}

async fn the_rust_library_fans_out_in_the_callers_transaction(backend: Backend) {
    let (app, rx) = three_endpoints(backend).await;
    let run = |id: &'static str, t: &'static str, commit: bool| {
        with_app_conn(
            &app,
            |c| lib_fanout(c, id, t, commit),
            |c| lib_fanout(c, id, t, commit),
        )
    };
    // Rolled back: nothing.
    run("lib-0", "order.placed", false).unwrap();
    assert!(app.db.fanout_of("lib-0").unwrap().is_empty());
    assert!(app.db.find_by_event_id("lib-0:a").unwrap().is_none());
    // Committed: one row per subscriber (b subscribes to invoice.*, a to order.*, c to *).
    let e = run("lib-1", "invoice.paid", true).unwrap();
    assert!(e.created());
    let ids: Vec<&str> = e.rows().iter().map(|r| r.event_id.as_str()).collect();
    assert_eq!(ids, ["lib-1:b", "lib-1:c"]);
    let e = run("lib-1", "invoice.paid", true).unwrap();
    assert!(!e.created(), "a repeated event id is a no-op");
    assert_eq!(e.rows().len(), 2);
    // No subscriber: refused naming destination, nothing written.
    with_app_conn(
        &app,
        |c| c.batch_execute("DELETE FROM herald_subscriptions WHERE endpoint = 'c'"),
        |c| c.batch_execute("DELETE FROM herald_subscriptions WHERE endpoint = 'c'"),
    )
    .unwrap();
    match run("lib-2", "payment.failed", true) {
        Err(EnqueueError::Invalid(e)) => assert_eq!(e[0].field, "destination", "{e:?}"),
        other => panic!("{other:?}"),
    }
    assert!(app.db.fanout_of("lib-2").unwrap().is_empty());
    // A plain message under the fan-out's event id: refused naming event_id, as over HTTP.
    let plain = |c: &mut dyn FnMut(NewMessage) -> Result<Enqueued, EnqueueError>| {
        c(NewMessage::webhook(
            "lib-1",
            "https://x.example/h",
            json!({}),
        ))
    };
    match with_app_conn(
        &app,
        |c| plain(&mut |m| enqueue(c, m)),
        |c| plain(&mut |m| enqueue(c, m)),
    ) {
        Err(EnqueueError::Invalid(e)) => assert_eq!(e[0].field, "event_id", "{e:?}"),
        other => panic!("{other:?}"),
    }
    assert!(app.db.find_by_event_id("lib-1").unwrap().is_none());
    drive(&app).await;
    assert_eq!(rx.b.event_ids(), ["lib-1:b"]);
    assert_eq!(rx.c.event_ids(), ["lib-1:c"]);
    assert!(rx.a.requests().is_empty());
    app.stop().await;
}

/// A plain SQL insert of one webhook row into `herald_outbox`, its payload `{"body": BODY}`.
fn outbox_insert(id: &str, destination: &str, body: &str) -> String {
    format!(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
         VALUES ('{id}', 'webhook', '{destination}', '{{\"body\": {body}}}')"
    )
}

async fn plain_sql_inserts_fan_out_in_the_callers_transaction(backend: Backend) {
    let (app, rx) = three_endpoints(backend).await;
    let insert = |id: &str, t: &str| outbox_insert(id, &format!("type:{t}"), r#"{"from": "sql"}"#);
    let exec = |sql: String| exec_sql(&app, &sql);
    // Rolled back: nothing, on either backend.
    exec(format!(
        "BEGIN; {}; ROLLBACK;",
        insert("sql-0", "order.placed")
    ))
    .unwrap();
    assert!(app.db.fanout_of("sql-0").unwrap().is_empty());
    exec(format!(
        "BEGIN; {}; COMMIT;",
        insert("sql-1", "order.placed")
    ))
    .unwrap();
    let kids: Vec<String> = app
        .db
        .fanout_of("sql-1")
        .unwrap()
        .into_iter()
        .map(|(f, m)| {
            let m = m.unwrap();
            assert_eq!(m.destination, format!("endpoint:{}", f.endpoint));
            assert_eq!(m.state, "scheduled");
            assert_eq!(m.next_attempt_at, Some(m.scheduled_at));
            m.event_id
        })
        .collect();
    assert_eq!(kids, ["sql-1:a", "sql-1:b", "sql-1:c"]);
    assert!(
        app.db.find_by_event_id("sql-1").unwrap().is_none(),
        "the type: row itself is not stored"
    );
    // The same event id again: a no-op, even without ON CONFLICT.
    exec(insert("sql-1", "order.placed")).unwrap();
    assert_eq!(app.db.fanout_of("sql-1").unwrap().len(), 3);
    // No subscriber (with c, which takes "*", unsubscribed), or a malformed type: the statement
    // fails and writes nothing.
    exec("DELETE FROM herald_subscriptions WHERE endpoint = 'c'".into()).unwrap();
    let e = exec(insert("sql-2", "payment.failed")).unwrap_err();
    assert!(e.contains("no endpoint subscribes"), "{e}");
    let e = exec(insert("sql-3", "order..placed")).unwrap_err();
    assert!(e.contains("not a valid event type"), "{e}");
    assert!(app.db.fanout_of("sql-2").unwrap().is_empty());
    assert!(app.db.find_by_event_id("sql-2").unwrap().is_none());
    drive(&app).await;
    assert_eq!(rx.a.event_ids(), ["sql-1:a"]);
    assert_eq!(rx.b.event_ids(), ["sql-1:b"]);
    assert_eq!(rx.c.event_ids(), ["sql-1:c"]);
    assert_eq!(app.row("sql-1:c").state, "delivered");
    app.stop().await;
}

async fn the_sql_trigger_matches_as_the_rust_rule_does(backend: Backend) {
    let toml = "[endpoints.all]\nurl = \"https://a.example/h\"\nevent_types = [\"*\"]\n\
                [endpoints.under]\nurl = \"https://a.example/h\"\nevent_types = [\"order.*\"]\n\
                [endpoints.exact]\nurl = \"https://a.example/h\"\nevent_types = [\"order.placed\"]\n\
                [endpoints.deep]\nurl = \"https://a.example/h\"\nevent_types = [\"order.line.*\"]\n\
                [endpoints.other]\nurl = \"https://a.example/h\"\nevent_types = [\"orders.*\", \"Order.placed\"]\n";
    let app = spawn_app_with(backend, toml).await;
    let subs = app.herald.settings.subscriptions();
    let types = [
        "order.placed",
        "order.line.added",
        "order.line",
        "order",
        "orders.x",
        "order-x.placed",
        "Order.placed",
        "x",
        "order.placed.v2",
    ];
    for (i, t) in types.iter().enumerate() {
        let sql = format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             VALUES ('m-{i}', 'webhook', 'type:{t}', '{{\"body\": 1}}')"
        );
        with_app_conn(&app, |c| c.batch_execute(&sql), |c| c.batch_execute(&sql)).unwrap();
        let by_sql: Vec<String> = app
            .db
            .fanout_of(&format!("m-{i}"))
            .unwrap()
            .into_iter()
            .map(|(f, _)| f.endpoint)
            .collect();
        let by_rust = subscribers(
            subs.iter().map(|(e, p)| (e.as_str(), p.as_str())),
            &EventType::parse(t).unwrap(),
        );
        assert_eq!(by_sql, by_rust, "{t}");
    }
    app.stop().await;
}

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    id: Option<i64>,
}

/// PostgreSQL only: `herald_enqueue` has no SQLite equivalent (SQLite has no stored functions;
/// its way in is the plain INSERT above, expanded by a trigger).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_enqueue_fans_out_on_postgres() {
    let (app, rx) = three_endpoints(Backend::Postgres).await;
    let call = |id: &str, t: &str| {
        format!(
            "SELECT herald_enqueue('{id}', 'webhook', 'type:{t}', '{{\"body\": {{\"f\": 1}}}}'::jsonb) AS id"
        )
    };
    let mut c = PgConnection::establish(&app.test_db.url).unwrap();
    let r: Vec<Id> = diesel::sql_query(call("fn-1", "order.placed"))
        .load(&mut c)
        .unwrap();
    assert_eq!(r[0].id, None, "a fan-out has no row of its own");
    assert_eq!(app.db.fanout_of("fn-1").unwrap().len(), 3);
    // Inside a transaction that rolls back: nothing.
    let rolled: Result<(), diesel::result::Error> = c.transaction(|c| {
        diesel::sql_query(call("fn-2", "order.placed")).execute(c)?;
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert!(rolled.is_err());
    assert!(app.db.fanout_of("fn-2").unwrap().is_empty());
    // An application role with nothing but INSERT on the outbox fans out too (the trigger runs
    // as its owner).
    let role = format!("fan_{}", app.test_db.url.rsplit('/').next().unwrap());
    app.raw_sql(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role}; \
         GRANT INSERT ON herald_outbox TO {role}; \
         GRANT USAGE ON SEQUENCE herald_outbox_id_seq TO {role}"
    ));
    let mut app_conn = PgConnection::establish(&app.test_db.url).unwrap();
    app_conn
        .batch_execute(&format!(
            "SET ROLE {role}; INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             VALUES ('fn-role', 'webhook', 'type:invoice.paid', '{{\"body\": 1}}')"
        ))
        .unwrap();
    let kids: Vec<String> = app
        .db
        .fanout_of("fn-role")
        .unwrap()
        .into_iter()
        .map(|(f, _)| f.message_event_id)
        .collect();
    assert_eq!(kids, ["fn-role:b", "fn-role:c"]);
    app.raw_sql("DELETE FROM herald_outbox WHERE event_id LIKE 'fn-role:%'");
    // A type nobody subscribes to raises: the caller's transaction fails.
    c.batch_execute("DELETE FROM herald_subscriptions WHERE endpoint = 'c'")
        .unwrap();
    let e = diesel::sql_query(call("fn-3", "payment.failed"))
        .execute(&mut c)
        .unwrap_err();
    assert!(e.to_string().contains("no endpoint subscribes"), "{e}");
    drive(&app).await;
    assert_eq!(rx.a.event_ids(), ["fn-1:a"]);
    assert_eq!(rx.b.event_ids(), ["fn-1:b"]);
    assert_eq!(rx.c.event_ids(), ["fn-1:c"]);
    app.stop().await;
}

/// One logical outcome per event id: a fan-out whose id (or a child's id) is a plain message's
/// is refused naming `event_id`, nothing written, and a plain message cannot take a fan-out's id.
async fn a_fan_out_never_takes_over_another_messages_event_id(backend: Backend) {
    use crate::support::app::{client_with_token, webhook};
    let digest = herald::auth::digest_hex("blog-token-0123456789");
    let app = spawn_app_with(
        backend,
        &format!(
            "[endpoints.a]\nurl = \"https://a.example/hook\"\nevent_types = [\"order.*\"]\n\
             [endpoints.b]\nurl = \"https://b.example/hook\"\nevent_types = [\"order.*\"]\n\
             [tokens.blog]\nsha256 = \"{digest}\"\nscope = \"send\"\n"
        ),
    )
    .await;
    // Another token's plain message holds the id a child would get.
    let blog = client_with_token("blog-token-0123456789");
    let url = format!("{}/v1/messages", app.base);
    let r = blog
        .post(&url)
        .json(&webhook("ord-1:a", "https://x.example/h", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = app.post_message(fanout("ord-1", "order.placed")).await;
    assert_eq!(r.status(), 422);
    let p: serde_json::Value = r.json().await.unwrap();
    assert_eq!(p["field"], "event_id", "{p}");
    assert!(
        !p.to_string().contains("x.example"),
        "nothing of the other message: {p}"
    );
    assert!(
        app.db.find_by_event_id("ord-1:b").unwrap().is_none(),
        "nothing written"
    );
    assert!(app.db.fanout_of("ord-1").unwrap().is_empty());
    // A plain message with the id of a fan-out, and a fan-out with a plain message's id.
    assert_eq!(
        app.post_message(fanout("ord-2", "order.placed"))
            .await
            .status(),
        201
    );
    let r = app
        .post_message(webhook("ord-2", "https://x.example/h", json!({})))
        .await;
    assert_eq!(r.status(), 422);
    assert!(app.db.find_by_event_id("ord-2").unwrap().is_none());
    let r = app.post_message(fanout("ord-1:a", "order.placed")).await;
    assert_eq!(r.status(), 422, "a plain message's id");
    app.stop().await;
}

/// The same rule for plain SQL fan-outs (the triggers): a fan-out under a plain message's event
/// id, or whose message would take one, is refused and writes nothing; a fan-out inserted again
/// is still a no-op.
async fn plain_sql_keeps_message_and_fan_out_event_ids_apart(backend: Backend) {
    let (app, _rx) = three_endpoints(backend).await;
    let row = |id: &str, destination: &str| outbox_insert(id, destination, "{}");
    let exec = |sql: String| exec_sql(&app, &sql);
    exec(row("plain-1", "https://x.example/h")).unwrap();
    let e = exec(row("plain-1", "type:order.placed")).unwrap_err();
    assert!(e.contains("a fan-out needs an event id of its own"), "{e}");
    assert!(app.db.fanout_of("plain-1").unwrap().is_empty());
    assert!(app.db.find_by_event_id("plain-1:a").unwrap().is_none());
    // A plain message holds the event id one of the fan-out's messages would get.
    exec(row("fan-2:b", "https://x.example/h")).unwrap();
    assert!(exec(row("fan-2", "type:order.placed")).is_err());
    assert!(app.db.fanout_of("fan-2").unwrap().is_empty());
    assert!(app.db.find_by_event_id("fan-2:a").unwrap().is_none());
    exec(row("fan-3", "type:order.placed")).unwrap();
    assert_eq!(app.db.fanout_of("fan-3").unwrap().len(), 3);
    // Inserted again: still a no-op.
    exec(row("fan-3", "type:order.placed")).unwrap();
    assert_eq!(app.db.fanout_of("fan-3").unwrap().len(), 3);
    app.stop().await;
}

both_backends!(
    a_process_without_the_endpoint_leaves_its_message_to_one_with_it,
    plain_sql_keeps_message_and_fan_out_event_ids_apart,
    a_fan_out_never_takes_over_another_messages_event_id,
    one_failing_endpoint_never_holds_back_the_others,
    no_subscriber_or_a_bad_type_is_a_422_naming_destination,
    the_rust_library_fans_out_in_the_callers_transaction,
    plain_sql_inserts_fan_out_in_the_callers_transaction,
    the_sql_trigger_matches_as_the_rust_rule_does,
);

/// Writers of `event_id` into `table` held inside their transaction: a test trigger makes them
/// take a shared advisory lock (4242) that this hold takes first, until [`Hold::release`].
struct Hold {
    unlock: std::sync::mpsc::Sender<()>,
    holder: std::thread::JoinHandle<()>,
}

impl Hold {
    fn writers(app: &TestApp, table: &str, event_id: &str) -> Hold {
        app.raw_sql(&format!(
            "CREATE FUNCTION test_hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               IF NEW.event_id = '{event_id}' THEN PERFORM pg_advisory_xact_lock_shared(4242); \
               END IF; RETURN NEW; END $$; \
             CREATE TRIGGER test_hold BEFORE INSERT ON {table} \
               FOR EACH ROW EXECUTE FUNCTION test_hold();"
        ));
        let url = app.test_db.url.clone();
        let (locked_tx, locked) = std::sync::mpsc::channel();
        let (unlock, unlock_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let mut c = PgConnection::establish(&url).unwrap();
            c.batch_execute("SELECT pg_advisory_lock(4242)").unwrap();
            locked_tx.send(()).unwrap();
            let _ = unlock_rx.recv();
            c.batch_execute("SELECT pg_advisory_unlock(4242)").unwrap();
        });
        locked.recv().unwrap();
        Hold { unlock, holder }
    }

    fn release(self) {
        self.unlock.send(()).unwrap();
        self.holder.join().unwrap();
    }
}

/// `POST /v1/messages` in a task of its own: its status and body.
fn post_in_task(
    app: &TestApp,
    body: &serde_json::Value,
) -> tokio::task::JoinHandle<(u16, serde_json::Value)> {
    let req = app
        .http
        .post(format!("{}/v1/messages", app.base))
        .json(body);
    tokio::spawn(async move {
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json::<serde_json::Value>().await.unwrap())
    })
}

/// Until `n` backends of this test's database wait on an advisory lock they have not been
/// granted — the hold's (4242) or an event id's — or `done()`. Other tests' databases, and
/// their ordering-key locks, are not counted.
async fn until_advisory_waiters(app: &TestApp, n: i64, done: impl Fn() -> bool) {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut c = PgConnection::establish(&app.test_db.url).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting = diesel::sql_query(
            "SELECT count(*) AS n FROM pg_locks WHERE NOT granted AND locktype = 'advisory' \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND ((objsubid = 1 AND objid = 4242) OR (objsubid = 2 AND classid = 1751477357))",
        )
        .get_result::<Count>(&mut c)
        .unwrap()
        .n;
        if waiting >= n || done() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{waiting} of {n} waiting"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A client retrying a fan-out while its first try is still being committed (a timeout on its
/// side) gets that fan-out back, 200, not an error: the retry waits for the first try's commit
/// (at the event id's lock), then finds the same fan-out. The test holds the first try inside its
/// transaction (at its first link) until the retry waits; nothing is written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_retried_while_its_first_try_commits_gets_it_back() {
    let (app, _rx) = three_endpoints(Backend::Postgres).await;
    let hold = Hold::writers(&app, "herald_fanouts", "ord-9");
    let body = fanout("ord-9", "order.placed");
    let first = post_in_task(&app, &body);
    until_advisory_waiters(&app, 1, || false).await;
    let retry = post_in_task(&app, &body);
    until_advisory_waiters(&app, 2, || false).await;
    hold.release();
    let (first, retry) = (first.await.unwrap(), retry.await.unwrap());
    assert_eq!(first.0, 201, "{}", first.1);
    assert_eq!(retry.0, 200, "{}", retry.1);
    // The same fan-out, the same three children.
    let ids = |v: &serde_json::Value| -> Vec<String> {
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["event_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(first.1["endpoints"], json!(["a", "b", "c"]));
    assert_eq!(retry.1["endpoints"], first.1["endpoints"]);
    assert_eq!(ids(&first.1).len(), 3);
    assert_eq!(ids(&retry.1), ids(&first.1));
    assert_eq!(app.db.fanout_of("ord-9").unwrap().len(), 3);
    app.stop().await;
}

/// PostgreSQL: a plain message and a fan-out under one event id, posted at the same moment, do
/// not both succeed. The first is held inside its transaction at its first write of `table`;
/// the second, posted meanwhile, waits for the first's commit on the event id's lock (without
/// it, it looked before that commit, saw nothing and wrote its own), then sees it and is
/// refused, 422 naming `event_id`. (The Rust library and plain SQL, in the application's
/// transaction, take no such lock: see `storage::sql::EVENT_ID_LOCK_CLASS`.)
async fn racing_kinds(first: serde_json::Value, table: &str, second: serde_json::Value) {
    let (app, _rx) = three_endpoints(Backend::Postgres).await;
    let id = first["event_id"].as_str().unwrap().to_owned();
    let hold = Hold::writers(&app, table, &id);
    let first = post_in_task(&app, &first);
    until_advisory_waiters(&app, 1, || false).await;
    let second = post_in_task(&app, &second);
    // Until the second waits for the first (or, without that wait, has answered already).
    until_advisory_waiters(&app, 2, || second.is_finished()).await;
    hold.release();
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(first.0, 201, "{}", first.1);
    assert_eq!(second.0, 422, "{}", second.1);
    assert!(second.1.to_string().contains("event_id"), "{}", second.1);
    // One thing under the event id: the first.
    let plain = app.db.find_by_event_id(&id).unwrap().is_some();
    let fanned = !app.db.fanout_of(&id).unwrap().is_empty();
    assert!(plain != fanned, "plain {plain}, fan-out {fanned}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_message_racing_a_fan_out_of_its_event_id_is_refused() {
    racing_kinds(
        fanout("race-1", "order.placed"),
        "herald_fanouts",
        crate::support::app::webhook("race-1", "https://plain.example/hook", json!({})),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_racing_a_plain_message_of_its_event_id_is_refused() {
    racing_kinds(
        crate::support::app::webhook("race-2", "https://plain.example/hook", json!({})),
        "herald_outbox",
        fanout("race-2", "order.placed"),
    )
    .await
}
