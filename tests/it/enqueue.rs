//! The four ways in produce the same row; a rolled-back transaction sends nothing; a duplicate
//! event id sends once.

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::sqlite::SqliteConnection;
use diesel::{Connection, RunQueryDsl};
use herald::outbox::{NewMessage, OutboxConnection, enqueue};
use serde_json::json;

use crate::both_backends;
use crate::support::app::webhook;
use crate::support::{Backend, Receiver, TestApp, spawn_app};

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

/// The error of `sql`, which the database refuses, run on the application's own connection.
fn refused(app: &TestApp, sql: &str) -> String {
    with_app_conn(
        app,
        |c| c.batch_execute(sql).unwrap_err(),
        |c| c.batch_execute(sql).unwrap_err(),
    )
    .to_string()
}

fn enqueue_in_tx<C: Connection + OutboxConnection>(
    conn: &mut C,
    message: NewMessage,
    commit: bool,
) {
    let r: Result<(), diesel::result::Error> = conn.transaction(|c| {
        // The business change would go here, in the same transaction.
        enqueue(c, message).map_err(|e| match e {
            herald::outbox::EnqueueError::Database(d) => d,
            other => panic!("{other}"),
        })?;
        if commit {
            Ok(())
        } else {
            Err(diesel::result::Error::RollbackTransaction)
        }
    });
    assert_eq!(r.is_ok(), commit);
}

async fn rolled_back_rows_are_never_sent(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    let msg = |id: &str| NewMessage::webhook(id, rx.url.clone(), json!({"order": id}));
    let (a, b) = (msg("order-1:placed"), msg("order-2:placed"));
    with_app_conn(
        &app,
        |c| {
            enqueue_in_tx(c, a.clone(), false);
            enqueue_in_tx(c, b.clone(), true)
        },
        |c| {
            enqueue_in_tx(c, a.clone(), false);
            enqueue_in_tx(c, b.clone(), true)
        },
    );
    assert_eq!(app.run_until_idle().await, 1);
    let ids = rx.event_ids();
    assert_eq!(
        ids,
        ["order-2:placed"],
        "only the committed message is sent"
    );
    assert!(app.db.find_by_event_id("order-1:placed").unwrap().is_none());
    app.stop().await;
}

async fn plain_sql_insert_with_only_the_essentials(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    let sql = format!(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
         VALUES ('sql-1', 'webhook', '{}', '{{\"body\": {{\"from\": \"sql\"}}}}')",
        rx.url
    );
    with_app_conn(
        &app,
        |c| c.batch_execute(&sql).unwrap(),
        |c| c.batch_execute(&sql).unwrap(),
    );
    let row = app.row("sql-1");
    assert_eq!(row.state, "scheduled");
    assert_eq!(row.semantics, "at_least_once");
    assert_eq!(row.attempts, 0);
    assert_eq!(
        row.next_attempt_at,
        Some(row.scheduled_at),
        "next_attempt_at defaults to scheduled_at"
    );
    assert_eq!(
        row.request_fingerprint, None,
        "filled in at the first attempt"
    );
    assert_eq!(app.run_until_idle().await, 1);
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].body, br#"{"from":"sql"}"#);
    let row = app.row("sql-1");
    assert_eq!(row.state, "delivered");
    // Its first outcome stored the fingerprint of the request made (on SQLite, the outcome update
    // picks the statement that sets it from the claimed row: `OutcomeRecord::fingerprint_in_row`;
    // seen failing with that flag set regardless of the row).
    assert_eq!(row.request_fingerprint.as_deref().map(str::len), Some(64));
    assert_eq!(
        row.request_fingerprint,
        app.attempts("sql-1")[0].request_fingerprint
    );
    // A duplicate plain INSERT is refused by the unique event id: nothing is sent twice.
    let dup = with_app_conn(
        &app,
        |c| c.batch_execute(&sql).is_err(),
        |c| c.batch_execute(&sql).is_err(),
    );
    assert!(dup);
    // Bad rows are refused by the table's constraints, not stored.
    let bad = "INSERT INTO herald_outbox (event_id, channel, destination, payload) VALUES ('x', 'sms', 'd', '{}')";
    assert!(with_app_conn(
        &app,
        |c| c.batch_execute(bad).is_err(),
        |c| c.batch_execute(bad).is_err()
    ));
    app.stop().await;
}

/// A time Herald could not read back, written by plain SQL, is refused at the INSERT: before,
/// the row was stored and every claim it came first in failed reading it (`'-infinity'` comes
/// first in every one), so nothing was sent any more. Good times in every spelling the table
/// takes still go in, and are sent.
async fn a_time_herald_cannot_read_back_is_refused_at_the_insert(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    let insert = |id: &str, column: &str, time: &str| {
        format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload, {column}) \
             VALUES ('{id}', 'webhook', '{}', '{{\"body\": 1}}', '{time}')",
            rx.url
        )
    };
    // (column, time) pairs refused, then taken.
    type Times<'a> = &'a [(&'a str, &'a str)];
    let (bad, good): (Times, Times) = match backend {
        Backend::Postgres => (
            &[
                ("scheduled_at", "-infinity"),
                ("scheduled_at", "270000-01-01 00:00:00+00"),
                ("expires_at", "infinity"),
                ("created_at", "-infinity"),
                ("ordering_released_at", "0001-01-01 00:00:00+00 BC"),
            ],
            &[
                ("scheduled_at", "2026-01-01 10:00:00.123456+00"),
                ("expires_at", "9999-12-31 23:59:59+00"),
            ],
        ),
        Backend::Sqlite => (
            &[
                ("scheduled_at", "2026-02-30 00:00:00+00:00"),
                ("scheduled_at", "2026-01-01 10:00:00abc+00:00"),
                ("scheduled_at", "0000-06-01 00:00:00+00:00"),
                ("expires_at", "2026-01-01 24:00:00+00:00"),
                ("created_at", "yesterday"),
                ("updated_at", "2026-02-29 10:00:00Z"),
                ("created_at", "2026-03-04 05:06:07 "),
                ("lease_until", "2026-03-04 05:06:07 Z"),
                ("expires_at", "2099-01-01 10:00:00.1234567890+00:00"),
            ],
            &[
                ("scheduled_at", "2026-01-01 10:00:59.999900+00:00"),
                ("scheduled_at", "2024-02-29 10:00:00.5+00:00"),
                ("expires_at", "9999-12-31 23:59:59.999999999+00:00"),
                ("created_at", "2026-03-04T05:06:07.5-02:00"),
            ],
        ),
    };
    for (i, (column, time)) in bad.iter().enumerate() {
        let sql = insert(&format!("bad-{i}"), column, time);
        let e = refused(&app, &sql);
        assert!(
            // PostgreSQL names the first constraint failed (`scheduled_at` is copied into
            // `next_attempt_at` first); SQLite's trigger says what is wanted.
            (e.contains("violates check constraint \"herald_outbox_") && e.contains("_range"))
                || e.contains("not a real time Herald can read"),
            "{column} = {time}: {e}"
        );
        assert!(
            app.db
                .find_by_event_id(&format!("bad-{i}"))
                .unwrap()
                .is_none()
        );
    }
    for (i, (column, time)) in good.iter().enumerate() {
        let sql = insert(&format!("good-{i}"), column, time);
        with_app_conn(
            &app,
            |c| c.batch_execute(&sql).unwrap(),
            |c| c.batch_execute(&sql).unwrap(),
        );
    }
    // An application's UPDATE of a time it could insert is checked the same way.
    let update = match backend {
        Backend::Postgres => {
            "UPDATE herald_outbox SET scheduled_at = '-infinity' WHERE event_id = 'good-0'"
        }
        Backend::Sqlite => {
            "UPDATE herald_outbox SET scheduled_at = '2026-02-30 10:00:00+00:00' \
                            WHERE event_id = 'good-0'"
        }
    };
    assert!(with_app_conn(
        &app,
        |c| c.batch_execute(update).is_err(),
        |c| c.batch_execute(update).is_err(),
    ));
    assert_eq!(app.run_until_idle().await, good.len());
    assert_eq!(rx.requests().len(), good.len());
    app.stop().await;
}

/// An error class Herald does not know, written by an application's SQL, is refused at the
/// insert on both backends: Herald reads `last_error_class` back as one of its classes, and the
/// claim reads whole rows, so one such row would fail every claim. Every class Herald knows is
/// taken (a class added without its migration fails here), and such rows are sent.
async fn an_error_class_herald_does_not_know_is_refused_at_the_insert(backend: Backend) {
    use herald::domain::AttemptClass;
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    let insert = |id: &str, class: &str| {
        format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload, last_error_class) \
             VALUES ('{id}', 'webhook', '{}', '{{\"body\": 1}}', '{class}')",
            rx.url
        )
    };
    for (i, bad) in ["bogus", "", "Transient", "transient "].iter().enumerate() {
        let sql = insert(&format!("bad-{i}"), bad);
        let e = refused(&app, &sql);
        assert!(
            e.contains("herald_outbox_last_error_class_check"),
            "{bad:?}: {e}"
        );
        assert!(
            app.db
                .find_by_event_id(&format!("bad-{i}"))
                .unwrap()
                .is_none()
        );
    }
    for class in AttemptClass::ALL {
        let sql = insert(&format!("good-{}", class.as_str()), class.as_str());
        with_app_conn(
            &app,
            |c| c.batch_execute(&sql).unwrap(),
            |c| c.batch_execute(&sql).unwrap(),
        );
    }
    assert_eq!(app.run_until_idle().await, AttemptClass::ALL.len());
    assert_eq!(rx.requests().len(), AttemptClass::ALL.len());
    app.stop().await;
}

/// An application's INSERT may not put control or bidirectional-formatting characters in an
/// event id or a destination (found by a walk-through: an event id with ESC and a newline forged
/// a log line and drove the terminal of whoever listed the dead letters; a right-to-left
/// override turned the admin page's words backwards). Other Unicode is taken, as before.
async fn control_characters_in_an_event_id_or_destination_are_refused(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    let insert = |id: &str, destination: &str| {
        format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             VALUES ('{id}', 'webhook', '{destination}', '{{\"body\": 1}}')"
        )
    };
    for (id, destination) in [
        ("evil\u{1b}[31mRED", rx.url.clone()),
        ("two\nlines", rx.url.clone()),
        ("rtl-\u{202e}gnp.exe", rx.url.clone()),
        ("c1-\u{85}", rx.url.clone()),
        ("fine-id", "endpoint:x\u{1b}]0;TITLE\u{7}".to_owned()),
        ("fine-id-2", format!("{}\u{2066}", rx.url)),
    ] {
        let e = refused(&app, &insert(id, &destination));
        assert!(
            e.contains("herald_outbox_printable"),
            "{id:?} {destination:?}: {e}"
        );
    }
    for id in ["café-1", "注文-2", "with space"] {
        with_app_conn(
            &app,
            |c| c.batch_execute(&insert(id, &rx.url)).unwrap(),
            |c| c.batch_execute(&insert(id, &rx.url)).unwrap(),
        );
    }
    // The check is at the insert only (rows stored before it are left as they are): an
    // UPDATE can still put a control character in an event id, which no header can carry.
    // A tab, which a header could carry but a receiver trims (failing the signature); and in
    // an email, where lettre would write it into X-Herald-Event-Id as it is.
    let (control, control_mail) = ("ctl-\t", "ctl-mail-\u{1}");
    app.raw_sql(&insert("ctl", &rx.url));
    app.raw_sql(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) VALUES \
         ('ctl-mail', 'email', 'ada@example.com', '{\"subject\": \"s\", \"text\": \"t\"}')",
    );
    for (from, to) in [("ctl", control), ("ctl-mail", control_mail)] {
        app.raw_sql(&format!(
            "UPDATE herald_outbox SET event_id = '{to}' WHERE event_id = '{from}'"
        ));
    }
    // A space at either end, which SQL takes at the insert: trimmed by the receiver's HTTP
    // parser, the signature over the id fails (found by a walk-through).
    let (lead, trail, trail_mail) = (" lead", "trail ", "mtrail ");
    app.raw_sql(&insert(lead, &rx.url));
    app.raw_sql(&insert(trail, &rx.url));
    app.raw_sql(&format!(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) VALUES \
         ('{trail_mail}', 'email', 'ada@example.com', '{{\"subject\": \"s\", \"text\": \"t\"}}')"
    ));
    assert_eq!(app.run_until_idle().await, 8);
    // Taken, but a webhook's `webhook-id` can carry only ASCII (the official verifiers read
    // header bytes as Latin-1 and refused the signature): dead-lettered without a request,
    // saying why (found by an SDK interop walk-through).
    assert_eq!(app.row("with space").state.as_str(), "delivered");
    assert_eq!(rx.requests().len(), 1);
    for id in [
        "café-1",
        "注文-2",
        control,
        control_mail,
        lead,
        trail,
        trail_mail,
    ] {
        assert_eq!(app.row(id).state.as_str(), "dead_letter", "{id}");
        let a = &app.attempts(id)[0];
        assert_eq!(a.error_kind.as_deref(), Some("invalid_event_id"), "{id}");
    }
    app.stop().await;
}

/// A payload the database takes but serde_json cannot read (a number beyond a double, which
/// `jsonb` keeps; a lone surrogate, which SQLite's `json_valid` takes; nesting deeper than 128)
/// is dead-lettered on its own, naming why, and so is an integer beyond 64 bits, which would be
/// sent as another number (the API refuses it); the other messages go on (found by a walk-through:
/// one such row failed every claim, and nothing was sent until it was deleted). Support reads
/// it too.
async fn a_payload_serde_cannot_read_is_dead_lettered_and_blocks_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let bad = [
        ("bad-number", r#"{"body": {"m": 1e400}}"#.to_owned()),
        ("bad-surrogate", r#"{"body": {"s": "\ud800"}}"#.to_owned()),
        ("bad-depth", format!(r#"{{"body": {deep}}}"#)),
        (
            "bad-integer",
            r#"{"body": {"n": 123456789012345678901234567890}}"#.to_owned(),
        ),
    ];
    let mut stored = Vec::new();
    for (id, payload) in &bad {
        let sql = format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             VALUES ('{id}', 'webhook', '{}', '{payload}')",
            rx.url
        );
        // Refused by the database (PostgreSQL's jsonb refuses a lone surrogate) or stored.
        let taken = with_app_conn(
            &app,
            |c| c.batch_execute(&sql).is_ok(),
            |c| c.batch_execute(&sql).is_ok(),
        );
        if taken {
            stored.push(*id);
        }
    }
    assert!(
        stored.contains(&"bad-number") && stored.contains(&"bad-depth"),
        "{stored:?}"
    );
    let r = app
        .post_message(webhook(
            "good",
            &rx.url,
            // Doubles beyond 64-bit integers are fine: PostgreSQL's jsonb writes them out in
            // full (1e25 as 10000000000000000000000000), which reads back as the same double.
            json!({"n": 1, "big": 1e25, "huge": 1.5e300, "max": 18446744073709552000.0}),
        ))
        .await;
    assert_eq!(r.status(), 201);
    app.run_until_idle().await;
    assert_eq!(app.row("good").state.as_str(), "delivered");
    assert_eq!(
        rx.requests().len(),
        1,
        "no request of an unreadable payload"
    );
    let sent: serde_json::Value = serde_json::from_slice(&rx.requests()[0].body).unwrap();
    assert_eq!(sent["big"].as_f64(), Some(1e25));
    assert_eq!(sent["huge"].as_f64(), Some(1.5e300));
    for id in &stored {
        assert_eq!(app.row(id).state.as_str(), "dead_letter", "{id}");
        let a = &app.attempts(id)[0];
        assert_eq!(a.error_kind.as_deref(), Some("invalid_payload"), "{id}");
        let why = a.response_excerpt.as_deref().unwrap_or_default();
        assert!(
            why.starts_with("the stored payload cannot be read: "),
            "{id}: {why}"
        );
        let e = app.explain(id).await;
        assert_eq!(e["state"], "dead_letter", "{e}");
    }
    app.stop().await;
}

/// The application cancels in its own transaction (`herald::outbox::cancel_in` on its own
/// connection): a rolled-back cancel cancels nothing, a committed one sends nothing; in flight
/// or finished, no such message, and a fan-out's own event id, are refused as over HTTP.
async fn the_application_cancels_in_its_own_transaction(backend: Backend) {
    use herald::outbox::{CancelError, cancel_in};
    let rx = Receiver::start().await;
    let app = crate::support::app::spawn_app_with(
        backend,
        &format!(
            "[endpoints.orders]\nurl = \"{}\"\nevent_types = [\"order.*\"]\n",
            rx.url_for("/orders")
        ),
    )
    .await;
    for id in ["keep", "drop", "sent", "plain"] {
        let r = app.post_message(webhook(id, &rx.url, json!({}))).await;
        assert_eq!(r.status(), 201);
    }
    let fan = webhook("order-9", "type:order.placed", json!({}));
    assert_eq!(app.post_message(fan).await.status(), 201);
    // In plain SQL, as the README gives it: herald_cancel on PostgreSQL, the UPDATE on SQLite.
    with_app_conn(
        &app,
        |c| {
            c.batch_execute("BEGIN; SELECT herald_cancel('plain'); COMMIT")
                .unwrap()
        },
        |c| {
            c.batch_execute(
                "BEGIN IMMEDIATE; UPDATE herald_outbox SET state = 'canceled', \
                 next_attempt_at = NULL, updated_at = strftime('%Y-%m-%d %H:%M:%f+00:00', 'now') \
                 WHERE event_id = 'plain' AND state IN ('scheduled', 'retryable'); COMMIT",
            )
            .unwrap()
        },
    );
    assert_eq!(app.row("plain").state.as_str(), "canceled");
    fn cancel_then<C: Connection + OutboxConnection>(c: &mut C, id: &str, commit: bool) {
        let r: Result<(), diesel::result::Error> = c.transaction(|c| {
            // The business change would go here, in the same transaction.
            let (changed, row) = cancel_in(c, id).unwrap();
            assert!(changed && row.state.as_str() == "canceled", "{row:?}");
            if commit {
                Ok(())
            } else {
                Err(diesel::result::Error::RollbackTransaction)
            }
        });
        assert_eq!(r.is_ok(), commit);
    }
    with_app_conn(
        &app,
        |c| {
            cancel_then(c, "keep", false);
            cancel_then(c, "drop", true);
        },
        |c| {
            cancel_then(c, "keep", false);
            cancel_then(c, "drop", true);
        },
    );
    assert_eq!(app.row("keep").state.as_str(), "scheduled");
    assert_eq!(app.row("drop").state.as_str(), "canceled");
    assert_eq!(app.run_until_idle().await, 3);
    let mut sent = rx.event_ids();
    sent.sort();
    assert_eq!(
        sent,
        ["keep", "order-9:orders", "sent"],
        "the canceled one is never sent"
    );
    // Canceled already: the same answer, unchanged; delivered: refused; none: not found.
    let answers = with_app_conn(
        &app,
        |c| {
            ["drop", "sent", "nobody", "order-9"]
                .map(|id| cancel_in(c, id).map(|(changed, r)| (changed, r.state)))
        },
        |c| {
            ["drop", "sent", "nobody", "order-9"]
                .map(|id| cancel_in(c, id).map(|(changed, r)| (changed, r.state)))
        },
    );
    assert!(
        matches!(&answers[0], Ok((false, s)) if s.as_str() == "canceled"),
        "{:?}",
        answers[0]
    );
    assert!(
        matches!(&answers[1], Err(CancelError::NotCancelable(s)) if s.as_str() == "delivered"),
        "{:?}",
        answers[1]
    );
    assert!(
        matches!(&answers[2], Err(CancelError::NotFound)),
        "{:?}",
        answers[2]
    );
    assert!(
        matches!(&answers[3], Err(CancelError::FanOut)),
        "{:?}",
        answers[3]
    );
    app.stop().await;
}

/// PostgreSQL: `herald_cancel(event_id)` in the application's transaction, for a role granted
/// only EXECUTE on it (and INSERT to enqueue): refused before the grant; then it answers the
/// state after (`canceled`, or the state that kept it), NULL for no message; a rollback undoes
/// it; a keyed message canceled behind its key's head is never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_cancel_needs_only_execute_and_cancels_in_the_callers_transaction() {
    let app = spawn_app(Backend::Postgres).await;
    let rx = Receiver::start().await;
    for (id, key) in [
        ("c-keep", None),
        ("c-drop", None),
        ("k-1", Some("k")),
        ("k-2", Some("k")),
    ] {
        let mut m = webhook(id, &rx.url, json!({}));
        if let Some(k) = key {
            m["ordering_key"] = json!(k);
        }
        assert_eq!(app.post_message(m).await.status(), 201);
    }
    let role = format!("cancel_{}", app.test_db.url.rsplit('/').next().unwrap());
    app.raw_sql(&format!("DROP ROLE IF EXISTS {role}; CREATE ROLE {role}"));
    #[derive(diesel::QueryableByName)]
    struct State {
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        state: Option<String>,
    }
    let call = |c: &mut PgConnection, id: &str| {
        diesel::sql_query(format!("SELECT herald_cancel('{id}') AS state")).get_result::<State>(c)
    };
    let mut c = PgConnection::establish(&app.test_db.url).unwrap();
    c.batch_execute(&format!("SET ROLE {role}")).unwrap();
    let refused = format!("{:?}", call(&mut c, "c-drop").err());
    assert!(refused.contains("permission denied"), "{refused}");
    c.batch_execute("RESET ROLE").unwrap();
    app.raw_sql(&format!(
        "GRANT EXECUTE ON FUNCTION herald_cancel(TEXT) TO {role}"
    ));
    c.batch_execute(&format!("SET ROLE {role}")).unwrap();
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(
        call(&mut c, "c-keep").unwrap().state.as_deref(),
        Some("canceled")
    );
    c.batch_execute("ROLLBACK").unwrap();
    c.batch_execute("BEGIN").unwrap();
    assert_eq!(
        call(&mut c, "c-drop").unwrap().state.as_deref(),
        Some("canceled")
    );
    assert_eq!(call(&mut c, "nobody").unwrap().state, None);
    c.batch_execute("COMMIT").unwrap();
    assert_eq!(app.row("c-keep").state.as_str(), "scheduled", "rolled back");
    assert_eq!(app.row("c-drop").state.as_str(), "canceled");
    // k-2 waits behind k-1: canceled, it is never sent; k-1, delivered, is not cancelable.
    assert_eq!(
        call(&mut c, "k-2").unwrap().state.as_deref(),
        Some("canceled")
    );
    assert_eq!(app.run_until_idle().await, 2, "c-keep and k-1");
    assert_eq!(
        call(&mut c, "k-1").unwrap().state.as_deref(),
        Some("delivered")
    );
    let mut sent = rx.event_ids();
    sent.sort();
    assert_eq!(sent, ["c-keep", "k-1"]);
    app.stop().await;
}

async fn every_way_in_gives_the_same_row(backend: Backend) {
    let app = spawn_app(backend).await;
    let url = "https://receiver.example/hook";
    let body = json!({"b": [1, 2], "a": "x"});
    // HTTP API.
    let r = app
        .post_message(webhook("same-http", url, body.clone()))
        .await;
    assert_eq!(r.status(), 201);
    // Library, on the application's connection.
    with_app_conn(
        &app,
        |c| enqueue(c, NewMessage::webhook("same-lib", url, body.clone())).map(|_| ()),
        |c| enqueue(c, NewMessage::webhook("same-lib", url, body.clone())).map(|_| ()),
    )
    .unwrap();
    let (http, lib) = (app.row("same-http"), app.row("same-lib"));
    let same = |r: &herald::storage::models::OutboxRow| {
        (
            r.channel,
            r.destination.clone(),
            r.payload.clone(),
            r.state,
            r.semantics,
        )
    };
    assert_eq!(same(&http), same(&lib));
    assert_eq!(
        (&http.retry_policy, http.max_attempts),
        (&lib.retry_policy, lib.max_attempts)
    );
    // The fingerprint covers the event id, so the two differ; each is the canonical one.
    assert_ne!(http.request_fingerprint, lib.request_fingerprint);
    let expected = herald::outbox::fingerprint_of(
        herald::domain::Channel::Webhook,
        url,
        "same-lib",
        &lib.payload,
    )
    .unwrap();
    assert_eq!(lib.request_fingerprint.as_deref(), Some(expected.as_str()));
    // A duplicate through the library is a no-op returning the existing row.
    let again = with_app_conn(
        &app,
        |c| {
            enqueue(
                c,
                NewMessage::webhook("same-lib", url, json!({"other": true})),
            )
        },
        |c| {
            enqueue(
                c,
                NewMessage::webhook("same-lib", url, json!({"other": true})),
            )
        },
    )
    .unwrap();
    assert!(!again.created());
    assert_eq!(again.rows()[0].payload, lib.payload);
    app.stop().await;
}

async fn duplicate_event_id_sends_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let rx = Receiver::start().await;
    let r1 = app
        .post_message(webhook("dup-1", &rx.url, json!({"v": 1})))
        .await;
    assert_eq!(r1.status(), 201);
    let v1: serde_json::Value = r1.json().await.unwrap();
    let r2 = app
        .post_message(webhook("dup-1", &rx.url, json!({"v": 2})))
        .await;
    assert_eq!(
        r2.status(),
        200,
        "a duplicate answers 200 with the existing message"
    );
    // Another request under the same event id: the first stands, and the answer says this one
    // was not it (it said nothing: a client could not tell its change had been dropped).
    assert_eq!(r2.headers()["herald-existing"], "different-request");
    let v2: serde_json::Value = r2.json().await.unwrap();
    assert_eq!(v1["fingerprint"], v2["fingerprint"]);
    let r3 = app
        .post_message(webhook("dup-1", &rx.url, json!({"v": 1})))
        .await;
    assert_eq!(r3.status(), 200);
    assert_eq!(r3.headers()["herald-existing"], "same-request");
    // The same content asked with another time, budget or semantics is another request too.
    for (key, value) in [
        ("scheduled_at", json!("2031-01-01T00:00:00Z")),
        ("expires_at", json!("2031-01-01T00:00:00Z")),
        ("max_attempts", json!(3)),
        ("semantics", json!("at_most_once")),
    ] {
        let mut again = webhook("dup-1", &rx.url, json!({"v": 1}));
        again[key] = value;
        let r = app.post_message(again).await;
        assert_eq!(r.status(), 200, "{key}");
        assert_eq!(r.headers()["herald-existing"], "different-request", "{key}");
    }
    // A budget given as the one that applied (the policy's, 4 here) asks for the same.
    let mut budget = webhook("dup-1", &rx.url, json!({"v": 1}));
    budget["max_attempts"] = json!(4);
    let r = app.post_message(budget).await;
    assert_eq!(r.headers()["herald-existing"], "same-request");
    // A keyed message's policy given as the one that applies (`block`, no endpoint's) or left
    // to it asks for the same; `skip` is another request.
    let mut keyed = webhook("dup-keyed", &rx.url, json!({"v": 5}));
    keyed["scheduled_at"] = json!("2031-01-01T00:00:00Z");
    keyed["ordering_key"] = json!("k-1");
    keyed["ordering_policy"] = json!("block");
    assert_eq!(app.post_message(keyed.clone()).await.status(), 201);
    keyed.as_object_mut().unwrap().remove("ordering_policy");
    for (policy, existing) in [(None, "same-request"), (Some("skip"), "different-request")] {
        if let Some(p) = policy {
            keyed["ordering_policy"] = json!(p);
        }
        let r = app.post_message(keyed.clone()).await;
        assert_eq!(r.status(), 200, "{policy:?}");
        assert_eq!(r.headers()["herald-existing"], existing, "{policy:?}");
    }
    // A repeat of one that gave them all is its own, times read back to the microsecond.
    let mut full = webhook("dup-full", &rx.url, json!({"v": 9}));
    full["scheduled_at"] = json!("2031-01-01T00:00:00.1234567Z");
    full["expires_at"] = json!("2031-01-02T00:00:00+01:00");
    full["max_attempts"] = json!(3);
    full["semantics"] = json!("at_most_once");
    for (status, existing) in [(201, None), (200, Some("same-request"))] {
        let r = app.post_message(full.clone()).await;
        assert_eq!(r.status(), status);
        assert_eq!(
            r.headers()
                .get("herald-existing")
                .map(|v| v.to_str().unwrap()),
            existing
        );
    }
    // Idempotency-Key header as the event id.
    let no_id = json!({"channel": "webhook", "destination": rx.url, "payload": {"body": {"v": 3}}});
    for expected in [201, 200] {
        let r = app
            .http
            .post(format!("{}/v1/messages", app.base))
            .header("Idempotency-Key", "dup-2")
            .json(&no_id)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), expected);
    }
    // Given twice with different values (the first was taken): refused, naming the header; the
    // same value twice is one key. A key that is no event id is named as the header too.
    let with_keys = |keys: &[&str]| {
        let mut r = app.http.post(format!("{}/v1/messages", app.base));
        for k in keys {
            r = r.header("Idempotency-Key", *k);
        }
        r.json(&no_id).send()
    };
    let long = "k".repeat(256);
    for keys in [&["dup-3", "dup-4"][..], &[""], &["a\tb"], &[long.as_str()]] {
        let r = with_keys(keys).await.unwrap();
        assert_eq!(r.status(), 422, "{keys:?}");
        let p: serde_json::Value = r.json().await.unwrap();
        assert_eq!(p["field"], "Idempotency-Key", "{keys:?}: {p}");
    }
    for id in ["dup-3", "dup-4", "", "a\tb", long.as_str()] {
        assert!(app.db.find_by_event_id(id).unwrap().is_none(), "{id:?}");
    }
    assert_eq!(with_keys(&["dup-2", "dup-2"]).await.unwrap().status(), 200);
    assert_eq!(app.run_until_idle().await, 2);
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 2);
    let first = reqs
        .iter()
        .find(|r| r.header("webhook-id") == Some("dup-1"))
        .unwrap();
    assert_eq!(first.body, br#"{"v":1}"#, "the first request wins");
    app.stop().await;
}

async fn herald_enqueue_function_on_postgres() {
    let app = spawn_app(Backend::Postgres).await;
    let rx = Receiver::start().await;
    let mut c = PgConnection::establish(&app.test_db.url).unwrap();
    #[derive(diesel::QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
    }
    let call = format!(
        "SELECT herald_enqueue('fn-1', 'webhook', '{}', '{{\"body\": {{\"via\": \"fn\"}}}}'::jsonb) AS id",
        rx.url
    );
    let first: Id = diesel::sql_query(&call).get_result(&mut c).unwrap();
    let second: Id = diesel::sql_query(&call).get_result(&mut c).unwrap();
    assert_eq!(first.id, second.id, "a duplicate returns the existing id");
    let later = format!(
        "SELECT herald_enqueue('fn-2', 'webhook', '{}', '{{\"body\": 1}}'::jsonb, now() + interval '1 hour', \
         NULL, 'at_most_once', 3) AS id",
        rx.url
    );
    diesel::sql_query(&later).get_result::<Id>(&mut c).unwrap();
    let row = app.row("fn-2");
    assert_eq!(
        (row.semantics.as_str(), row.max_attempts),
        ("at_most_once", Some(3))
    );
    assert!(row.next_attempt_at.unwrap() > app.clock_now());
    assert_eq!(app.run_until_idle().await, 1, "only fn-1 is due");
    assert_eq!(rx.requests()[0].body, br#"{"via":"fn"}"#);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_enqueue_on_postgres() {
    herald_enqueue_function_on_postgres().await
}

/// PostgreSQL: what an application role needs to call `herald_enqueue`, as the README says —
/// INSERT on the outbox and USAGE on its id sequence (all a plain INSERT needs), and SELECT on
/// `id` and `event_id`, since the function returns the new or the existing row's id. Without
/// that SELECT the call is refused; with it, a new, a duplicate and a keyed message are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_enqueue_needs_select_on_id_and_event_id_besides_insert() {
    let app = spawn_app(Backend::Postgres).await;
    let role = format!("fn_{}", app.test_db.url.rsplit('/').next().unwrap());
    app.raw_sql(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role}; \
         GRANT INSERT ON herald_outbox TO {role}; \
         GRANT USAGE ON SEQUENCE herald_outbox_id_seq TO {role}"
    ));
    #[derive(diesel::QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
    }
    let call = |id: &str, key: &str| {
        format!(
            "SELECT herald_enqueue('{id}', 'webhook', 'https://role.example/h', \
             '{{\"body\": {{}}}}'::jsonb, p_ordering_key => {key}) AS id"
        )
    };
    let mut c = PgConnection::establish(&app.test_db.url).unwrap();
    c.batch_execute(&format!("SET ROLE {role}")).unwrap();
    let refused = diesel::sql_query(call("role-0", "NULL")).get_result::<Id>(&mut c);
    let refusal = format!("{:?}", refused.err());
    assert!(refusal.contains("permission denied"), "{refusal}");
    c.batch_execute("RESET ROLE").unwrap();
    assert!(app.db.find_by_event_id("role-0").unwrap().is_none());

    app.raw_sql(&format!(
        "GRANT SELECT (id, event_id) ON herald_outbox TO {role}"
    ));
    c.batch_execute(&format!("SET ROLE {role}")).unwrap();
    let first: Id = diesel::sql_query(call("role-1", "NULL"))
        .get_result(&mut c)
        .unwrap();
    let again: Id = diesel::sql_query(call("role-1", "NULL"))
        .get_result(&mut c)
        .unwrap();
    let keyed: Id = diesel::sql_query(call("role-2", "'k'"))
        .get_result(&mut c)
        .unwrap();
    c.batch_execute("RESET ROLE").unwrap();
    assert_eq!(first.id, again.id, "a duplicate returns the existing id");
    assert_eq!(app.row("role-1").id, first.id);
    assert_eq!(
        (app.row("role-2").id, app.row("role-2").ordering_seq),
        (keyed.id, Some(1))
    );
    app.raw_sql(&format!(
        "REVOKE ALL ON herald_outbox FROM {role}; \
         REVOKE ALL ON SEQUENCE herald_outbox_id_seq FROM {role}; DROP ROLE {role}"
    ));
    app.stop().await;
}

both_backends!(
    rolled_back_rows_are_never_sent,
    plain_sql_insert_with_only_the_essentials,
    a_time_herald_cannot_read_back_is_refused_at_the_insert,
    an_error_class_herald_does_not_know_is_refused_at_the_insert,
    control_characters_in_an_event_id_or_destination_are_refused,
    a_payload_serde_cannot_read_is_dead_lettered_and_blocks_nothing,
    the_application_cancels_in_its_own_transaction,
    every_way_in_gives_the_same_row,
    duplicate_event_id_sends_once,
);
