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

/// A fresh install: Herald polls an empty outbox that was never analyzed, so the claim's cached
/// plan is made for a tiny table; then a burst of rows arrives, before autovacuum analyzes it.
/// The plan must still walk the due index and the primary key: a sequential scan of the whole
/// outbox per claim (measured by hand on 200,000 rows: 84 ms per claim of 100) or a bitmap scan
/// of every due row plus a sort would last until the next analyze.
#[test]
fn the_claim_keeps_to_its_indexes_after_polling_an_empty_outbox() {
    use diesel::connection::SimpleConnection;
    use diesel::pg::PgConnection;
    use diesel::{Connection, QueryableByName, RunQueryDsl};

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
    let test_db = TestDb::new(Backend::Postgres);
    let mut c = PgConnection::establish(&test_db.url).unwrap();
    let now = || herald::clock::Now {
        local: chrono::Utc::now(),
        shift: chrono::Duration::zero(),
    };
    let lease = std::time::Duration::from_secs(30);
    let claim = |c: &mut PgConnection| -> usize {
        c.transaction(|c| {
            herald::storage::outbox::pg::claim(c, &now(), 100, "plan-test", lease, "v1")
        })
        .unwrap()
        .0
        .len()
    };
    for _ in 0..8 {
        assert_eq!(claim(&mut c), 0);
    }
    c.batch_execute(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
         SELECT 'burst-' || i, 'webhook', 'https://example.com/hook', '{\"body\": {}}' \
         FROM generate_series(1, 2000) AS i",
    )
    .unwrap();
    let plan: Vec<String> = c
        .transaction(|c| {
            let n = herald::storage::outbox::pg::claim(c, &now(), 100, "plan-test", lease, "v1")
                .map(|(rows, _)| rows.len())?;
            assert_eq!(n, 100);
            // The claim statement as this connection keeps it prepared, and the plan it uses
            // (in the claim's transaction: under the claim's own planner settings).
            let p: Prepared = diesel::sql_query(
                "SELECT name, generic_plans FROM pg_prepared_statements \
                 WHERE statement LIKE '%WITH due AS%'",
            )
            .get_result(c)?;
            assert!(
                p.generic_plans > 0,
                "the cached generic plan is what is tested"
            );
            let lines: Vec<PlanLine> = diesel::sql_query(format!(
                "EXPLAIN EXECUTE {}(0, 100, 'plan-test', 30000000, 'v1')",
                p.name
            ))
            .load(c)?;
            Ok::<_, diesel::result::Error>(lines.into_iter().map(|l| l.line).collect())
        })
        .unwrap();
    let text = plan.join("\n");
    assert!(
        text.contains("Index Scan using herald_outbox_due"),
        "{text}"
    );
    assert!(
        text.contains("Index Scan using herald_outbox_pkey"),
        "{text}"
    );
    assert!(
        !text.contains("Seq Scan") && !text.contains("Bitmap"),
        "{text}"
    );
}
