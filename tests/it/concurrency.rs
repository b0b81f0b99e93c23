//! Claims on PostgreSQL: two senders on one database never send the same claimed row twice, and
//! the claim's plan keeps to its indexes whatever the table's statistics say.

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
            db.enqueue(&row).unwrap();
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
        let lines: Vec<PlanLine> =
            diesel::sql_query(format!("EXPLAIN EXECUTE {}({args})", p.name)).load(c)?;
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
        provider_message_id: None,
        attempt: None,
        ordering: None,
    };
    let no_match = |_: &_, _: &_| -> herald::storage::models::ReceiptDecision {
        unreachable!("no receipt matches a message here")
    };
    let no_lease_expires = |_: &_, _| -> herald::storage::models::LeaseDecision {
        unreachable!("no lease expires here")
    };
    // Each in a transaction of its own, as Herald runs them.
    for _ in 0..8 {
        let claimed = c
            .transaction(|c| outbox::pg::claim(c, &now(), 100, "plan-test", lease, "v1"))
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
        c.transaction(|c| receipts::pg::reconcile(c, &now(), 100, "example.com", &no_match))
            .unwrap();
        c.transaction(|c| outbox::pg::sweep_expired_leases(c, &now(), &no_lease_expires))
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
            let rows = outbox::pg::claim(c, &now(), 100, "plan-test", lease, "v1")?.0;
            let p = plan(c, "%WITH due AS%", "0, 100, 'plan-test', 30000000, 'v1'")?;
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
        let pass = receipts::pg::reconcile(c, &now(), 100, "example.com", &no_match)?;
        assert_eq!(pass.unmatched, 100);
        let p = plan(c, "%\"outcome\" IS NULL%LIMIT $1%", "100")?;
        assert!(
            p.contains("Index Scan using herald_receipts_pending"),
            "{p}"
        );
        assert!(!p.contains("Seq Scan") && !p.contains("Bitmap"), "{p}");
        // The read of unmatched receipts due again names its state in literal SQL, so that
        // `herald_receipts_unmatched` can serve it: diesel never caches such a statement, it
        // is planned afresh on every pass, and no plan of it can go stale.
        assert_eq!(
            prepared(c, "SELECT%FROM \"herald_receipts\"%\"next_match_at\" <= $%")?,
            0
        );
        let p = plan(
            c,
            "%UPDATE herald_receipts AS r SET outcome = ''unmatched''%",
            "'{1}', '{1}', '{NULL}', '{why}'",
        )?;
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
