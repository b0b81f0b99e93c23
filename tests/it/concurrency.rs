//! Two senders on one PostgreSQL never send the same claimed row twice.

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
