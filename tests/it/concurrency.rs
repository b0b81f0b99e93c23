//! Claims on PostgreSQL: two senders on one database never send the same claimed row twice, and
//! the claim's plan keeps to its indexes whatever the table's statistics say. On SQLite, the hot
//! statements are compiled once per connection.

use std::collections::HashMap;

use serde_json::json;

use crate::support::app::spawn_on;
use crate::support::{Backend, Receiver, TestDb, spawn_app};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_senders_on_one_postgres_send_each_row_once() {
    let a = spawn_app(Backend::Postgres).await;
    // A second Herald process on the same database: its own pool, owner and client.
    let same_db = clone_of(&a.test_db);
    let b = spawn_on(same_db, "").await;
    assert_ne!(a.herald.sender.owner(), b.herald.sender.owner());
    let rx = Receiver::start().await;
    const N: usize = 300;
    let db = a.db.clone();
    let url = rx.url.clone();
    tokio::task::spawn_blocking(move || {
        for i in 0..N {
            let m =
                herald::outbox::NewMessage::webhook(format!("c-{i}"), url.clone(), json!({"i": i}));
            let row = m.prepare(&Default::default(), chrono::Utc::now()).unwrap();
            db.enqueue(&row).unwrap().unwrap();
        }
    })
    .await
    .unwrap();
    let (sa, sb) = (a.herald.sender.clone(), b.herald.sender.clone());
    let (na, nb) = tokio::join!(
        tokio::spawn(async move { sa.run_until_idle().await.unwrap() }),
        tokio::spawn(async move { sb.run_until_idle().await.unwrap() }),
    );
    let (na, nb) = (na.unwrap(), nb.unwrap());
    assert_eq!(na + nb, N, "every row claimed exactly once in total");
    assert!(
        na > 0 && nb > 0,
        "both senders worked ({na} / {nb}): the test exercises contention"
    );
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in rx.requests() {
        *seen
            .entry(r.header("webhook-id").unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(seen.len(), N);
    assert!(seen.values().all(|&n| n == 1), "a row was sent twice");
    a.stop().await;
    b.stop().await;
}

/// The same database under a second handle (dropping it does not drop the database).
fn clone_of(db: &TestDb) -> TestDb {
    TestDb::attach(&db.url, db.backend)
}

/// A fresh install: Herald runs its hot statements on empty tables that were never analyzed,
/// so the plans its connections cache are made for tiny tables; then a burst of rows arrives,
/// before autovacuum analyzes them. The claim, the outcome update and the reconciler's read must
/// still walk their indexes: a sequential scan of the whole table per statement (measured by
/// hand at 200,000 rows: 84 ms per claim of 100, 24 ms per outcome batch) would last until the
/// next analyze. Each plan is read in the transaction of the call that used it, under the
/// settings that call made.
#[test]
fn hot_statements_keep_to_their_indexes_after_an_empty_outbox() {
    use diesel::connection::SimpleConnection;
    use diesel::pg::PgConnection;
    use diesel::{Connection, QueryableByName, RunQueryDsl};
    use herald::domain::State;
    use herald::storage::models::OutcomeRecord;
    use herald::storage::{outbox, receipts};

    #[derive(QueryableByName)]
    struct Prepared {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        generic_plans: i64,
    }
    #[derive(QueryableByName)]
    struct PlanLine {
        #[diesel(sql_type = diesel::sql_types::Text)]
        #[diesel(column_name = "QUERY PLAN")]
        line: String,
    }
    /// The plan of this connection's prepared statement whose text matches `like`, run with
    /// `args`; with how many generic plans it was run.
    fn plan(c: &mut PgConnection, like: &str, args: &str) -> diesel::QueryResult<String> {
        let p: Prepared = diesel::sql_query(format!(
            "SELECT name, generic_plans FROM pg_prepared_statements WHERE statement LIKE '{like}'"
        ))
        .get_result(c)?;
        let args = if args.is_empty() {
            String::new()
        } else {
            format!("({args})")
        };
        let lines: Vec<PlanLine> =
            diesel::sql_query(format!("EXPLAIN EXECUTE {}{args}", p.name)).load(c)?;
        let lines: Vec<String> = lines.into_iter().map(|l| l.line).collect();
        Ok(format!(
            "generic plans: {}\n{}",
            p.generic_plans,
            lines.join("\n")
        ))
    }
    /// How many of this connection's prepared statements match `like`.
    fn prepared(c: &mut PgConnection, like: &str) -> diesel::QueryResult<i64> {
        #[derive(QueryableByName)]
        struct N {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        diesel::sql_query(format!(
            "SELECT count(*) AS n FROM pg_prepared_statements WHERE statement LIKE '{like}'"
        ))
        .get_result::<N>(c)
        .map(|r| r.n)
    }
    let test_db = TestDb::new(Backend::Postgres);
    let mut c = PgConnection::establish(&test_db.url).unwrap();
    let now = || herald::clock::Now {
        local: chrono::Utc::now(),
        shift: chrono::Duration::zero(),
    };
    let lease = std::time::Duration::from_secs(30);
    let outcome = |id: i64, state: State| OutcomeRecord {
        message_id: id,
        event_id: format!("e-{id}"),
        claimed_attempt: 1,
        attempts_after: 1,
        state,
        next_attempt_at: None,
        retry_delay_ms: Some(0),
        error_class: None,
        request_fingerprint: None,
        fingerprint_in_row: false,
        provider_message_id: None,
        attempt: None,
        ordering: None,
        due_now: Vec::new(),
    };
    let no_match = |_: &_, _: &_| -> herald::storage::models::ReceiptDecision {
        unreachable!("no receipt matches a message here")
    };
    let no_lease_expires = |_: &_, _| -> Option<herald::storage::models::LeaseDecision> {
        unreachable!("no lease expires here")
    };
    // Each in a transaction of its own, as Herald runs them.
    for _ in 0..8 {
        let claimed = c
            .transaction(|c| {
                outbox::pg::claim(
                    c,
                    &now(),
                    100,
                    "plan-test",
                    lease,
                    &crate::support::global_policy("v1"),
                )
            })
            .unwrap();
        assert!(claimed.0.is_empty());
        c.transaction(|c| {
            outbox::pg::record_outcomes(c, "plan-test", &now(), &[outcome(-1, State::Retryable)])
        })
        .unwrap();
        // One receipt a round: the reconciler marks it unmatched, on a tiny table.
        c.batch_execute(
            "INSERT INTO herald_receipts (source, provider_event_id, event_type, provider_type, \
             raw) SELECT 'plan', 'warm-' || (count(*) + 1), 'delivered', 'message.delivered', \
             '{}' FROM herald_receipts",
        )
        .unwrap();
        c.transaction(|c| {
            receipts::pg::reconcile(
                c,
                &now(),
                100,
                "example.com",
                herald::storage::models::MatchRules::OPEN,
                &no_match,
            )
        })
        .unwrap();
        c.transaction(|c| outbox::pg::sweep_expired_leases(c, &now(), &no_lease_expires))
            .unwrap();
        c.transaction(herald::storage::ordering::pg::release_waiting)
            .unwrap();
    }
    c.batch_execute(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
         SELECT 'burst-' || i, 'webhook', 'https://example.com/hook', '{\"body\": {}}' \
         FROM generate_series(1, 2000) AS i; \
         INSERT INTO herald_receipts (source, provider_event_id, event_type, provider_type, raw) \
         SELECT 'plan', 'r-' || i, 'delivered', 'message.delivered', '{}' \
         FROM generate_series(1, 2000) AS i",
    )
    .unwrap();
    let claimed: Vec<i64> = c
        .transaction(|c| {
            let rows = outbox::pg::claim(
                c,
                &now(),
                100,
                "plan-test",
                lease,
                &crate::support::global_policy("v1"),
            )?
            .0;
            let p = plan(
                c,
                "%WITH due AS%",
                "0, 100, 'plan-test', 30000000, 'v1', NULL, 'default'",
            )?;
            assert!(p.contains("Index Scan using herald_outbox_due"), "{p}");
            assert!(p.contains("Index Scan using herald_outbox_pkey"), "{p}");
            assert!(!p.contains("Seq Scan") && !p.contains("Bitmap"), "{p}");
            Ok::<_, diesel::result::Error>(rows.into_iter().map(|r| r.id).collect())
        })
        .unwrap();
    assert_eq!(claimed.len(), 100);
    c.transaction(|c| {
        let done: Vec<OutcomeRecord> = claimed
            .iter()
            .map(|id| outcome(*id, State::Delivered))
            .collect();
        outbox::pg::record_outcomes(c, "plan-test", &now(), &done)?;
        let p = plan(
            c,
            "%UPDATE herald_outbox AS o%unnest%",
            &format!(
                "0, 'plan-test', '{{{}}}', '{{1}}', '{{1}}', '{{delivered}}', '{{0}}', \
                 '{{NULL}}', '{{NULL}}', '{{NULL}}'",
                claimed[0]
            ),
        )?;
        assert!(p.contains("Index Scan using herald_outbox_pkey"), "{p}");
        assert!(!p.contains("Seq Scan"), "{p}");
        Ok::<_, diesel::result::Error>(())
    })
    .unwrap();
    c.transaction(|c| {
        let pass = receipts::pg::reconcile(
            c,
            &now(),
            100,
            "example.com",
            herald::storage::models::MatchRules::OPEN,
            &no_match,
        )?;
        assert_eq!(pass.unmatched, 100);
        // The reconciler's queue, oldest due first, each receipt by its primary key.
        let p = plan(
            c,
            "%FROM herald_receipt_queue AS q JOIN herald_receipts%",
            "'infinity', 100",
        )?;
        assert!(
            p.contains("Index Scan using herald_receipt_queue_due"),
            "{p}"
        );
        assert!(p.contains("Index Scan using herald_receipts_pkey"), "{p}");
        assert!(!p.contains("Seq Scan") && !p.contains("Bitmap"), "{p}");
        // A try that found nothing rewrites the queue row; a receipt whose day is over leaves
        // the queue and its row says `unmatched`: each found by its primary key.
        let p = plan(
            c,
            "%UPDATE herald_receipt_queue AS q SET tries%",
            "'{1,2}', '{1,35}', '{infinity,NULL}', '{why,why}'",
        )?;
        assert!(p.contains("herald_receipt_queue_pkey"), "{p}");
        assert!(p.contains("Index Scan using herald_receipts_pkey"), "{p}");
        assert!(!p.contains("Seq Scan"), "{p}");
        Ok::<_, diesel::result::Error>(())
    })
    .unwrap();
    // The lease watchdog (a pass every few seconds; these 30 s leases have not expired): its
    // read names the state in literal SQL too (for `herald_outbox_leased`), so it is planned
    // afresh on every pass. With `state = $1`, its plan cached on the empty outbox was a
    // sequential scan and a sort of the whole table.
    c.transaction(|c| {
        let sweep = outbox::pg::sweep_expired_leases(c, &now(), &no_lease_expires)?;
        assert_eq!(sweep, herald::storage::models::LeaseSweep::default());
        assert_eq!(
            prepared(c, "SELECT%FROM \"herald_outbox\"%\"lease_until\" < $%")?,
            0
        );
        Ok::<_, diesel::result::Error>(())
    })
    .unwrap();
    // The watchdog's pass over every waiting key (once per poll interval), a statement without
    // parameters: PostgreSQL plans it once and keeps that plan until the table is analyzed. (Its
    // plan kept to the indexes even before it had the settings; the settings are checked below.)
    c.transaction(|c| {
        assert_eq!(herald::storage::ordering::pg::release_waiting(c)?, 0);
        let p = plan(c, "%SELECT DISTINCT ordering_key, destination FROM herald_outbox%WHERE ordering_key IS NOT NULL AND state = ''scheduled''%", "")?;
        assert!(p.contains("Index Scan using herald_outbox_due"), "{p}");
        assert!(p.contains("Index Scan using herald_outbox_ordering_open"), "{p}");
        assert!(!p.contains("Seq Scan") && !p.contains("Bitmap"), "{p}");
        Ok::<_, diesel::result::Error>(())
    })
    .unwrap();
    // Every periodic pass whose statements diesel keeps prepared runs under the settings: the
    // key release, the unconfirmed-deadline pass (its `release_heads`) and retention (its
    // `DELETE … = ANY($1)`s). Read inside each one's transaction, after it ran.
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        enable_seqscan: String,
    }
    let seqscan = |c: &mut PgConnection| -> diesel::QueryResult<String> {
        diesel::sql_query("SHOW enable_seqscan")
            .get_result::<Setting>(c)
            .map(|s| s.enable_seqscan)
    };
    let long_ago = chrono::Utc::now() - chrono::Duration::days(365);
    type Pass = Box<dyn Fn(&mut PgConnection) -> diesel::QueryResult<()>>;
    let passes: [(&str, Pass); 4] = [
        (
            "release_waiting",
            Box::new(|c| herald::storage::ordering::pg::release_waiting(c).map(drop)),
        ),
        (
            "settle_or_expire_unconfirmed",
            Box::new(move |c| {
                let deadline = std::time::Duration::from_secs(3600);
                receipts::pg::settle_or_expire_unconfirmed(c, &now(), deadline, &["delivered"])
                    .map(drop)
            }),
        ),
        (
            "purge_messages",
            Box::new(move |c| {
                use herald::storage::retention::{Finished, pg};
                pg::purge_messages(c, Finished::Done, long_ago, 100).map(drop)
            }),
        ),
        (
            "purge_unmatched_receipts",
            Box::new(move |c| {
                herald::storage::retention::pg::purge_unmatched_receipts(c, long_ago, 100).map(drop)
            }),
        ),
    ];
    for (name, pass) in &passes {
        let setting = c.transaction(|c| {
            pass(c)?;
            seqscan(c)
        });
        assert_eq!(setting.unwrap(), "off", "{name}");
    }
    // Outside those transactions the settings are back to the server's.
    assert_eq!(seqscan(&mut c).unwrap(), "on");
    let delivered: i64 = c
        .transaction(|c| {
            #[derive(QueryableByName)]
            struct N {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                n: i64,
            }
            diesel::sql_query("SELECT count(*) AS n FROM herald_outbox WHERE state = 'delivered'")
                .get_result::<N>(c)
                .map(|r| r.n)
        })
        .unwrap();
    assert_eq!(delivered, 100);
}

/// SQLite: every statement of the sender's hot path — the claim, the Message-ID key of an email
/// inserted by plain SQL, the outcome update (with the first request fingerprint of a row that
/// has none), the attempt rows — and the reconciler's receipt marks and status writes are
/// compiled once per connection and then run from diesel's cache, and write what the
/// query-builder statements they replaced wrote. diesel never caches a query-builder `UPDATE` or
/// multi-row `INSERT`; compiling one per message was a third of Herald's CPU in `herald-bench
/// email_smtp`. And the claim does not name the Message-ID key, and the outcome update names the
/// fingerprint only for a row claimed without one: SQLite rewrites the index entry of every
/// column an `UPDATE` sets, changed or not, and both indexes have random keys.
#[test]
fn sqlite_hot_statements_are_compiled_once_per_connection() {
    use std::sync::{Arc, Mutex};

    use diesel::connection::{InstrumentationEvent, SimpleConnection};
    use diesel::sqlite::SqliteConnection;
    use diesel::{Connection, QueryableByName, RunQueryDsl};
    use herald::domain::{AttemptClass, State};
    use herald::storage::models::{
        Applied, NewAttempt, NewReceipt, OutcomeRecord, ReceiptDecision,
    };
    use herald::storage::{outbox, receipts};

    let test_db = TestDb::new(Backend::Sqlite);
    let mut c = SqliteConnection::establish(test_db.url.trim_start_matches("sqlite://")).unwrap();
    // Every statement run, and every statement diesel put into its cache, by SQL text, compared
    // without diesel's identifier quotes and with whitespace collapsed, so that the query
    // builder's statements match the hand-written ones.
    let ran = Arc::new(Mutex::new(Vec::<String>::new()));
    let cached = Arc::new(Mutex::new(Vec::<String>::new()));
    let (r, k) = (ran.clone(), cached.clone());
    let plain = |sql: &str| {
        sql.replace('`', "")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    c.set_instrumentation(move |e: InstrumentationEvent<'_>| match e {
        InstrumentationEvent::StartQuery { query, .. } => {
            let text = query.to_string();
            let sql = text.split(" -- binds:").next().unwrap_or_default();
            r.lock().unwrap().push(plain(sql));
        }
        InstrumentationEvent::CacheQuery { sql, .. } => k.lock().unwrap().push(plain(sql)),
        _ => {}
    });
    // One instant for the whole test, an hour ahead of the rows' own times (so every row is
    // due): an unmatched receipt's next try (2 s later) never comes due during the test.
    let fixed = chrono::Utc::now() + chrono::Duration::hours(1);
    let now = || herald::clock::Now {
        local: fixed,
        shift: chrono::Duration::zero(),
    };
    let lease = std::time::Duration::from_secs(30);
    let attempt = || NewAttempt {
        started_at: fixed,
        finished_at: fixed,
        duration_ms: 1,
        response_status: Some(250),
        error_kind: None,
        class: AttemptClass::Accepted,
        retry_after: None,
        delay_ms: None,
        delay_reason: None,
        policy_version: "v1".into(),
        response_excerpt: None,
    };
    #[derive(QueryableByName, Debug, PartialEq)]
    struct Written {
        #[diesel(sql_type = diesel::sql_types::Text)]
        event_id: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        message_key: Option<String>,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        provider_message_id: Option<String>,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        request_fingerprint: Option<String>,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        delivery_status: Option<String>,
    }
    #[derive(QueryableByName, Debug, PartialEq)]
    struct Marked {
        #[diesel(sql_type = diesel::sql_types::Text)]
        provider_event_id: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        outcome: Option<String>,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        matched: Option<String>,
        #[diesel(sql_type = diesel::sql_types::Integer)]
        match_attempts: i32,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        reconciled: bool,
    }
    #[derive(QueryableByName)]
    struct Queued {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        tries: i32,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        later: bool,
    }
    for round in 0..3 {
        // By plain SQL: an email with no Message-ID key yet; one that has its key, a provider
        // message id and a fingerprint already; a webhook. A receipt for the first email (by
        // Herald's event id) and one that matches nothing.
        c.batch_execute(&format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             VALUES ('mail-{round}', 'email', 'a@example.com', '{{\"subject\": \"s\", \"text\": \"t\"}}'), \
                    ('hook-{round}', 'webhook', 'https://example.com/h', '{{\"body\": {{}}}}'); \
             INSERT INTO herald_outbox (event_id, channel, destination, payload, message_key, \
                    provider_message_id, request_fingerprint) \
             VALUES ('kept-{round}', 'email', 'b@example.com', '{{\"subject\": \"s\", \"text\": \"t\"}}', \
                    'key-{round}', 'old-{round}', 'fp-old-{round}')"
        ))
        .unwrap();
        // Stored as ingest stores them: the group writer's insert and a lone request's.
        let receipt = |id: &str, herald_event_id: Option<String>| NewReceipt {
            provider_event_id: format!("{id}-{round}"),
            event_type: "delivered".into(),
            provider_type: "email.delivered".into(),
            event_time: Some(fixed),
            herald_event_id,
            provider_message_id: None,
            raw: serde_json::json!({ "id": id }),
            replay_key: None,
        };
        let (hit, miss) = (
            receipt("hit", Some(format!("mail-{round}"))),
            // It names a message that is not there: tried again later (one that names none is
            // not tried again, and would not exercise the queue's write).
            receipt("miss", Some(format!("never-sent-{round}"))),
        );
        let new =
            receipts::sqlite::insert_receipts_returning(&mut c, &[("cache", &hit, fixed)]).unwrap();
        assert_eq!(new, [("cache".to_owned(), format!("hit-{round}"))]);
        let again =
            receipts::sqlite::insert_receipts_returning(&mut c, &[("cache", &hit, fixed)]).unwrap();
        assert_eq!(again, [], "a stored key is skipped");
        let lone = [miss.clone(), miss];
        assert_eq!(
            receipts::sqlite::insert_receipts(&mut c, "cache", &lone, fixed).unwrap(),
            1
        );
        let (rows, _) = c
            .transaction(|c| {
                outbox::sqlite::claim(
                    c,
                    &now(),
                    100,
                    "cache-test",
                    lease,
                    &crate::support::global_policy("v1"),
                )
            })
            .unwrap();
        assert_eq!(rows.len(), 3);
        // The claimed rows as they now are: the plain-SQL email with its computed key.
        let returned = |e: &str| {
            rows.iter()
                .find(|r| r.event_id == e)
                .unwrap()
                .message_key
                .clone()
        };
        assert_eq!(
            (
                returned(&format!("mail-{round}")),
                returned(&format!("kept-{round}")),
                returned(&format!("hook-{round}"))
            ),
            (
                Some(herald::domain::email_message_key(&format!("mail-{round}"))),
                Some(format!("key-{round}")),
                None
            )
        );
        let outcomes: Vec<OutcomeRecord> = rows
            .iter()
            .map(|r| OutcomeRecord {
                message_id: r.id,
                event_id: r.event_id.clone(),
                claimed_attempt: r.attempts,
                attempts_after: r.attempts,
                state: State::Delivered,
                next_attempt_at: None,
                retry_delay_ms: None,
                error_class: None,
                request_fingerprint: Some(format!("fp-new-{}", r.event_id)),
                fingerprint_in_row: r.request_fingerprint.is_some(),
                provider_message_id: Some(format!("q-{}", r.event_id)),
                attempt: Some(attempt()),
                ordering: None,
                due_now: Vec::new(),
            })
            .collect();
        let (applied, _) = c
            .transaction(|c| outbox::sqlite::record_outcomes(c, "cache-test", &now(), &outcomes))
            .unwrap();
        assert_eq!(applied, [Applied::Yes; 3]);
        let status = |_: &_, _: &_| ReceiptDecision {
            outcome: "applied",
            reason: "delivered by test".into(),
            new_status: Some(("delivered".into(), Some(fixed))),
            settle: false,
            enqueue: Vec::new(),
        };
        let pass = c
            .transaction(|c| {
                receipts::sqlite::reconcile(
                    c,
                    &now(),
                    100,
                    "example.com",
                    herald::storage::models::MatchRules::OPEN,
                    &status,
                )
            })
            .unwrap();
        // This round's two receipts; the earlier rounds' unmatched one is not due again yet.
        assert_eq!(
            (pass.matched, pass.unmatched, pass.status_changes),
            (1, 1, 1),
            "{pass:?}"
        );
        let written: Vec<Written> = diesel::sql_query(format!(
            "SELECT event_id, message_key, provider_message_id, request_fingerprint, \
             delivery_status FROM herald_outbox WHERE event_id LIKE '%-{round}' ORDER BY event_id"
        ))
        .load(&mut c)
        .unwrap();
        let key = herald::domain::email_message_key(&format!("mail-{round}"));
        let w = |event_id: String, key: Option<String>, fp: &str, status: Option<&str>| Written {
            provider_message_id: Some(format!("q-{event_id}")),
            request_fingerprint: Some(fp.to_owned()),
            event_id,
            message_key: key,
            delivery_status: status.map(str::to_owned),
        };
        assert_eq!(
            written,
            [
                // The webhook gets no key.
                w(
                    format!("hook-{round}"),
                    None,
                    &format!("fp-new-hook-{round}"),
                    None
                ),
                // A key already there is kept, and so is the first fingerprint; the provider's
                // newer message id replaces the old one.
                w(
                    format!("kept-{round}"),
                    Some(format!("key-{round}")),
                    &format!("fp-old-{round}"),
                    None
                ),
                w(
                    format!("mail-{round}"),
                    Some(key),
                    &format!("fp-new-mail-{round}"),
                    Some("delivered")
                ),
            ]
        );
        let marked: Vec<Marked> = diesel::sql_query(format!(
            "SELECT r.provider_event_id, r.outcome, o.event_id AS matched, r.match_attempts, \
             r.reconciled_at IS NOT NULL AS reconciled FROM herald_receipts AS r \
             LEFT JOIN herald_outbox AS o ON o.id = r.message_id \
             WHERE r.provider_event_id LIKE '%-{round}' ORDER BY r.provider_event_id"
        ))
        .load(&mut c)
        .unwrap();
        assert_eq!(
            marked,
            [
                Marked {
                    provider_event_id: format!("hit-{round}"),
                    outcome: Some("applied".into()),
                    matched: Some(format!("mail-{round}")),
                    match_attempts: 0,
                    reconciled: true,
                },
                // Tried once: only its queue row says so (and when it is tried next).
                Marked {
                    provider_event_id: format!("miss-{round}"),
                    outcome: None,
                    matched: None,
                    match_attempts: 0,
                    reconciled: false,
                },
            ]
        );
        let queued: Vec<(i32, bool)> = diesel::sql_query(format!(
            "SELECT q.tries, q.due_at > r.received_at AS later FROM herald_receipt_queue AS q \
             JOIN herald_receipts AS r ON r.id = q.receipt_id \
             WHERE r.provider_event_id LIKE '%-{round}'"
        ))
        .load::<Queued>(&mut c)
        .unwrap()
        .into_iter()
        .map(|q| (q.tries, q.later))
        .collect();
        assert_eq!(queued, [(1, true)], "only the miss waits, for its next try");
    }
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let attempts = diesel::sql_query(
        "SELECT count(*) AS n FROM herald_attempts WHERE next_state = 'delivered' AND class = 'accepted'",
    )
    .get_result::<N>(&mut c)
    .unwrap()
    .n;
    assert_eq!(attempts, 9);
    let ran = ran.lock().unwrap().clone();
    let cached = cached.lock().unwrap().clone();
    let hot = [
        "UPDATE herald_outbox SET state = CASE",
        // The outcome update's two statements: without the fingerprint, and with it.
        "updated_at = ?6 WHERE id = ?7",
        "INSERT INTO herald_attempts",
        "FROM herald_receipt_queue AS q JOIN herald_receipts",
        "UPDATE herald_receipt_queue SET tries",
        "DELETE FROM herald_receipt_queue",
        "UPDATE herald_receipts SET reconciled_at",
        "UPDATE herald_outbox SET delivery_status",
        "UPDATE herald_outbox SET message_key",
        "request_fingerprint = COALESCE(request_fingerprint, ?10)",
        "INSERT INTO herald_receipts (source, provider_event_id, event_type, provider_type, event_time",
    ];
    // Only where it is missing: the plain-SQL email of each round, not the one with its key.
    let key_runs = ran
        .iter()
        .filter(|s| s.contains("UPDATE herald_outbox SET message_key"))
        .count();
    assert_eq!(key_runs, 3, "{ran:#?}");
    for s in ran
        .iter()
        .filter(|s| s.contains("UPDATE herald_outbox SET state = CASE"))
    {
        assert!(!s.contains("message_key ="), "the claim sets no key: {s}");
    }
    // The outcome update names the fingerprint only for the rows claimed without one: the
    // plain-SQL email and webhook of each round, not the one that has it.
    let outcome_updates = |with_fingerprint: bool| {
        ran.iter()
            .filter(|s| s.contains("UPDATE herald_outbox SET state = ?"))
            .filter(|s| s.contains("request_fingerprint =") == with_fingerprint)
            .count()
    };
    assert_eq!(
        (outcome_updates(true), outcome_updates(false)),
        (6, 3),
        "{ran:#?}"
    );
    assert!(
        !ran.iter()
            .any(|s| s.starts_with("UPDATE herald_outbox SET request_fingerprint")),
        "no second update of a row for its fingerprint: {ran:#?}"
    );
    for h in hot {
        let runs = ran.iter().filter(|s| s.contains(h)).count();
        let compiles = cached.iter().filter(|s| s.contains(h)).count();
        assert!(runs >= 3, "{h:?} ran {runs} times:\n{ran:#?}");
        assert_eq!(
            compiles, 1,
            "{h:?} compiled {compiles} times for {runs} runs"
        );
    }
    // Nothing else the sender or the reconciler wrote was compiled per call either (the
    // test's own inserts aside).
    let uncached: Vec<&String> = ran
        .iter()
        .filter(|s| s.starts_with("UPDATE") || s.starts_with("INSERT") || s.starts_with("/*"))
        .filter(|s| !s.starts_with("INSERT INTO herald_outbox (event_id"))
        .filter(|s| !cached.contains(s))
        .collect();
    assert!(
        uncached.is_empty(),
        "written without the cache: {uncached:#?}"
    );
}

/// SQLite: the claim reads a row's timestamps whatever text an application wrote them in: a
/// fraction of any width in the columns whose spelling the schema checks (they compare as text),
/// and in the others ISO 8601 with `T` and `Z`, no zone, no seconds, an offset; and the
/// migrations' own defaults. (A reader of Herald's own text alone, `storage::sqlite_time::parse`,
/// must never be the only one the claim has.)
#[test]
fn sqlite_claim_reads_timestamps_in_any_format_an_application_writes() {
    use chrono::{DateTime, TimeZone, Utc};
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    use diesel::sqlite::SqliteConnection;
    use herald::storage::outbox;

    let test_db = TestDb::new(Backend::Sqlite);
    let mut c = SqliteConnection::establish(test_db.url.trim_start_matches("sqlite://")).unwrap();
    let utc = |y, mo, d, h, mi, s, nanos| {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap() + chrono::Duration::nanoseconds(nanos)
    };
    let at = |nanos| utc(2026, 3, 4, 5, 6, 7, nanos);
    // (event id, scheduled_at, created_at, the moment of both)
    let cases: [(&str, &str, &str, DateTime<Utc>); 7] = [
        (
            "whole",
            "2026-03-04 05:06:07+00:00",
            "2026-03-04T05:06:07Z",
            at(0),
        ),
        (
            "tenths",
            "2026-03-04 05:06:07.5+00:00",
            "2026-03-04T05:06:07.5Z",
            at(500_000_000),
        ),
        (
            "millis",
            "2026-03-04 05:06:07.000+00:00",
            "2026-03-04 05:06:07",
            at(0),
        ),
        (
            "micros",
            "2026-03-04 05:06:07.000008+00:00",
            "2026-03-04 07:06:07.000008+02:00",
            at(8_000),
        ),
        (
            "nanos",
            "2026-03-04 05:06:07.123456789+00:00",
            "2026-03-04 05:06:07.123456789",
            at(123_456_789),
        ),
        (
            "four",
            "2026-03-04 05:06:07.1234+00:00",
            "2026-03-04 05:06:07.1234+00:00",
            at(123_400_000),
        ),
        (
            "minutes",
            "2026-03-04 05:06:00+00:00",
            "2026-03-04 05:06",
            utc(2026, 3, 4, 5, 6, 0, 0),
        ),
    ];
    for (id, scheduled, created, _) in &cases {
        c.batch_execute(&format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload, scheduled_at, \
             created_at, expires_at) \
             VALUES ('{id}', 'webhook', 'https://example.com/h', '{{\"body\": {{}}}}', \
             '{scheduled}', '{created}', '2099-01-02 03:04:05.5+00:00')"
        ))
        .unwrap();
    }
    // With the migrations' defaults (`strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')`).
    c.batch_execute(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
         VALUES ('defaults', 'webhook', 'https://example.com/h', '{\"body\": {}}')",
    )
    .unwrap();
    let now = herald::clock::Now {
        local: Utc::now() + chrono::Duration::seconds(1),
        shift: chrono::Duration::zero(),
    };
    let lease = std::time::Duration::from_secs(30);
    let (rows, _) = c
        .transaction(|c| {
            outbox::sqlite::claim(
                c,
                &now,
                100,
                "formats",
                lease,
                &crate::support::global_policy("v1"),
            )
        })
        .unwrap();
    assert_eq!(rows.len(), cases.len() + 1);
    let row = |id: &str| rows.iter().find(|r| r.event_id == id).unwrap();
    for (id, scheduled, created, at) in &cases {
        let row = row(id);
        assert_eq!(
            (row.scheduled_at, row.next_attempt_at, row.created_at),
            (*at, Some(*at), *at),
            "{id}: {scheduled}, {created}"
        );
        assert_eq!(
            row.expires_at,
            Some(utc(2099, 1, 2, 3, 4, 5, 500_000_000)),
            "{id}"
        );
        // Herald's own texts: the claim's time and lease.
        assert_eq!(
            (row.updated_at, row.lease_until),
            (now.local, Some(now.local + chrono::Duration::seconds(30))),
            "{id}"
        );
    }
    let defaults = row("defaults");
    assert_eq!(defaults.scheduled_at, defaults.created_at);
    assert!(
        (now.local - defaults.created_at).num_milliseconds().abs() < 60_000,
        "{:?}",
        defaults.created_at
    );
}

/// A send task holds the SMTP dialogue's state only while an email is sent (boxed there), and
/// the cleared row in its box: held inline, the dialogue made every send task, a webhook's
/// included, larger than the dialogue itself, and the row passed by value through the nested
/// futures tripled its share; each spawn allocates and copies a task whole (10,408 bytes a task
/// in a release build, 1,216 with both boxes; see `Sender::send_cleared`). Checked to fail with
/// either box taken out (5,960 and 3,016 bytes against the dialogue's 5,536).
#[tokio::test]
async fn a_send_task_does_not_hold_the_smtp_dialogue_inline() {
    use herald::channels::Outgoing;
    use herald::channels::email::{EmailChannel, SmtpLimits};
    use herald::sender::Clearance;

    let app = spawn_app(Backend::Sqlite).await;
    let created = app
        .post_message(crate::support::app::webhook(
            "size-1",
            "http://127.0.0.1:9/hook",
            json!({"n": 1}),
        ))
        .await;
    assert_eq!(created.status(), 201);
    let Clearance::Go(cleared) = app.herald.sender.clear(app.row("size-1")) else {
        panic!("a due webhook with no limits is cleared to go");
    };
    let task = app.herald.sender.send_cleared(cleared);

    let dir = tempfile::tempdir().unwrap();
    let email = EmailChannel::new(
        Some("smtp://127.0.0.1:9"),
        SmtpLimits::new(std::time::Duration::from_secs(1), 1),
        dir.path().to_path_buf(),
        "herald@example.com",
        "example.com",
        std::sync::Arc::new(herald::clock::SystemClock),
    )
    .unwrap();
    let payload = json!({"subject": "s", "text": "t"});
    let outgoing = Outgoing {
        event_id: "size-2",
        destination: "ada@example.com",
        payload: &payload,
        semantics: herald::domain::Semantics::AtLeastOnce,
        body: None,
    };
    let dialogue = email.send(&outgoing);
    let (task, dialogue) = (
        std::mem::size_of_val(&task),
        std::mem::size_of_val(&dialogue),
    );
    assert!(
        task < dialogue,
        "a send task ({task} bytes) holds the SMTP dialogue ({dialogue} bytes) inline"
    );
    // Nor the cleared row by value (it was passed through three nested futures).
    assert!(
        task * 3 < dialogue,
        "a send task ({task} bytes) is more than a third of the SMTP dialogue ({dialogue} bytes)"
    );
    eprintln!("send task {task} bytes, SMTP dialogue {dialogue} bytes");
}

/// Herald's hot transactions turn sequential and bitmap scans off
/// (`hot_statements_keep_to_their_indexes_after_an_empty_outbox`). A statement that has no
/// index to walk — the outbox insert trigger's look at `herald_listeners`, which runs in the
/// reconciler's pass (status webhooks) and the group enqueue — is then costed at the disable
/// cost, far above `jit_above_cost`, and PostgreSQL JIT-compiled it (20–60 ms a statement).
/// They turn JIT off too; with scans off alone the same statement is compiled.
#[test]
fn hot_transactions_never_jit_compile() {
    use diesel::connection::SimpleConnection;
    use diesel::pg::PgConnection;
    use diesel::{Connection, QueryableByName, RunQueryDsl};

    #[derive(QueryableByName)]
    struct PlanLine {
        #[diesel(sql_type = diesel::sql_types::Text)]
        #[diesel(column_name = "QUERY PLAN")]
        line: String,
    }
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        jit: String,
    }
    fn listeners_plan(c: &mut PgConnection) -> diesel::QueryResult<String> {
        let lines: Vec<PlanLine> = diesel::sql_query(
            "EXPLAIN (ANALYZE) SELECT EXISTS (SELECT 1 FROM herald_listeners \
             WHERE seen_at > now() - interval '30 seconds')",
        )
        .load(c)?;
        Ok(lines
            .into_iter()
            .map(|l| l.line)
            .collect::<Vec<_>>()
            .join("\n"))
    }
    let test_db = TestDb::new(Backend::Postgres);
    let mut c = PgConnection::establish(&test_db.url).unwrap();
    let now = herald::clock::Now {
        local: chrono::Utc::now(),
        shift: chrono::Duration::zero(),
    };
    c.transaction(|c| {
        let claimed = herald::storage::outbox::pg::claim(
            c,
            &now,
            100,
            "jit-test",
            std::time::Duration::from_secs(30),
            &crate::support::global_policy("v1"),
        )?;
        assert!(claimed.0.is_empty());
        let s: Setting = diesel::sql_query("SHOW jit").get_result(c)?;
        assert_eq!(s.jit, "off");
        let p = listeners_plan(c)?;
        assert!(p.contains("Seq Scan") && !p.contains("JIT"), "{p}");
        Ok::<_, diesel::result::Error>(())
    })
    .unwrap();
    // The same statement with scans off alone (JIT on, as by default) is compiled — where this
    // server can JIT at all and still costs a disabled scan at 10¹⁰ (PostgreSQL 18 counts
    // disabled nodes instead).
    #[derive(QueryableByName)]
    struct Server {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        jit: bool,
        #[diesel(sql_type = diesel::sql_types::Integer)]
        version: i32,
    }
    let server: Server = diesel::sql_query(
        "SELECT pg_jit_available() AS jit, current_setting('server_version_num')::int AS version",
    )
    .get_result(&mut c)
    .unwrap();
    if !server.jit || server.version >= 180000 {
        return;
    }
    c.transaction(|c| {
        c.batch_execute("SET LOCAL enable_seqscan = off; SET LOCAL jit = on")?;
        let p = listeners_plan(c)?;
        assert!(p.contains("JIT"), "{p}");
        Ok::<_, diesel::result::Error>(())
    })
    .unwrap();
}
