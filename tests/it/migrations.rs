//! Migrations run up, down and up again on both backends.

use herald::storage::{Db, PoolOptions};

use crate::both_backends;
use crate::support::Backend;

async fn migrations_run_up_down_up(backend: Backend) {
    let (url, _guard): (String, Box<dyn std::any::Any>) = match backend {
        Backend::Postgres => {
            let (url, g) = crate::support::db::empty_pg_database();
            (url, Box::new(g))
        }
        Backend::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            (
                format!("sqlite://{}", dir.path().join("m.db").display()),
                Box::new(dir),
            )
        }
    };
    tokio::task::spawn_blocking(move || {
        let db = Db::connect(&url, &PoolOptions::default()).unwrap();
        use diesel::migration::MigrationSource;
        let all = MigrationSource::<diesel::pg::Pg>::migrations(&herald::storage::PG_MIGRATIONS)
            .unwrap()
            .len();
        let sqlite = MigrationSource::<diesel::sqlite::Sqlite>::migrations(
            &herald::storage::SQLITE_MIGRATIONS,
        )
        .unwrap()
        .len();
        assert_eq!(all, sqlite, "the same migrations on both backends");
        assert!(all >= 2);
        assert_eq!(db.migrate().unwrap().len(), all);
        assert!(db.migrate().unwrap().is_empty(), "idempotent");
        db.revert_all().unwrap();
        assert_eq!(db.migrate().unwrap().len(), all);
        assert!(db.get_setting("nothing").unwrap().is_none());
    })
    .await
    .unwrap();
}

both_backends!(migrations_run_up_down_up);

/// Receipts waiting for the reconciler when `herald_receipt_queue` arrives are queued by the
/// upgrade: a new one due at its arrival, an unmatched one still tried with its tries and next
/// try (its own row no longer says so); one no longer tried, or reconciled, is not queued. The
/// way down puts the unmatched one's tries and next try back on its row.
/// Runs `pg` or `sqlite` (by `backend`) on a connection to a new, empty database, off the
/// executor.
async fn on_a_fresh_database(
    backend: Backend,
    pg: impl FnOnce(&mut diesel::pg::PgConnection) + Send + 'static,
    sqlite: impl FnOnce(&mut diesel::sqlite::SqliteConnection) + Send + 'static,
) {
    use diesel::Connection;
    tokio::task::spawn_blocking(move || match backend {
        Backend::Postgres => {
            let (url, _guard) = crate::support::db::empty_pg_database();
            pg(&mut diesel::pg::PgConnection::establish(&url).unwrap());
        }
        Backend::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("m.db");
            sqlite(
                &mut diesel::sqlite::SqliteConnection::establish(&path.display().to_string())
                    .unwrap(),
            );
        }
    })
    .await
    .unwrap();
}

async fn the_receipt_queue_upgrade_keeps_waiting_receipts(backend: Backend) {
    use diesel::connection::SimpleConnection;
    use diesel::{QueryableByName, RunQueryDsl};
    use diesel_migrations::MigrationHarness;

    #[derive(QueryableByName, Debug, PartialEq)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        provider_event_id: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        outcome: Option<String>,
        #[diesel(sql_type = diesel::sql_types::Integer)]
        match_attempts: i32,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
        tries: Option<i32>,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        due_as_before: bool,
    }
    const INSERT: &str = "INSERT INTO herald_receipts (source, provider_event_id, event_type, \
        provider_type, raw, received_at, outcome, match_attempts, next_match_at, reconciled_at) \
        VALUES \
        ('esp', 'new', 'delivered', 'd', '{}', '2026-12-01 10:00:00+00', NULL, 0, NULL, NULL), \
        ('esp', 'tried', 'delivered', 'd', '{}', '2026-12-01 10:00:00+00', 'unmatched', 2, \
            '2026-12-01 10:00:06+00', NULL), \
        ('esp', 'given-up', 'delivered', 'd', '{}', '2026-11-01 10:00:00+00', 'unmatched', 35, \
            NULL, NULL), \
        ('esp', 'applied', 'delivered', 'd', '{}', '2026-12-01 10:00:00+00', 'applied', 0, NULL, \
            '2026-12-01 10:00:01+00')";
    // Tries from the queue where there is a row; due as the row said (its next try, else its
    // arrival).
    const READ: &str = "SELECT r.provider_event_id, r.outcome, r.match_attempts, q.tries, \
        COALESCE(q.due_at = '2026-12-01 10:00:06+00' AND r.provider_event_id = 'tried' \
            OR q.due_at = r.received_at AND r.provider_event_id = 'new', false) AS due_as_before \
        FROM herald_receipts AS r LEFT JOIN herald_receipt_queue AS q ON q.receipt_id = r.id \
        ORDER BY r.provider_event_id";
    macro_rules! run_upgrade {
        ($c:expr, $migrations:expr) => {{
            let c = $c;
            c.run_pending_migrations($migrations).unwrap();
            // Back to the version before the queue (and any migration after it).
            while c.revert_last_migration($migrations).unwrap().to_string() != "20261202000015" {}
            c.batch_execute(INSERT).unwrap();
            c.run_pending_migrations($migrations).unwrap();
            let rows: Vec<Row> = diesel::sql_query(READ).load(c).unwrap();
            let row = |id: &str, outcome: Option<&str>, attempts, tries, due| Row {
                provider_event_id: id.into(),
                outcome: outcome.map(Into::into),
                match_attempts: attempts,
                tries,
                due_as_before: due,
            };
            assert_eq!(
                rows,
                [
                    row("applied", Some("applied"), 0, None, false),
                    row("given-up", Some("unmatched"), 35, None, false),
                    row("new", None, 0, Some(0), true),
                    row("tried", None, 0, Some(2), true),
                ]
            );
            // A receipt deleted takes its queue row along (by hand here; retention deletes only
            // receipts off the queue).
            c.batch_execute("DELETE FROM herald_receipts WHERE provider_event_id = 'new'")
                .unwrap();
            let rows: Vec<Row> = diesel::sql_query(READ).load(c).unwrap();
            assert_eq!(
                rows.iter()
                    .filter(|r| r.tries.is_some())
                    .map(|r| r.provider_event_id.as_str())
                    .collect::<Vec<_>>(),
                ["tried"]
            );
            let orphans: Vec<Row> = diesel::sql_query(
                "SELECT 'orphan' AS provider_event_id, NULL AS outcome, 0 AS match_attempts, \
                 q.tries, false AS due_as_before FROM herald_receipt_queue AS q \
                 WHERE q.receipt_id NOT IN (SELECT id FROM herald_receipts)",
            )
            .load(c)
            .unwrap();
            assert!(
                orphans.is_empty(),
                "the queue holds no receipt that is gone"
            );
            // The queue's migration reverted (and any after it).
            while c.revert_last_migration($migrations).unwrap().to_string() != "20261202000015" {}
            let back: Vec<Row> = diesel::sql_query(
                "SELECT provider_event_id, outcome, match_attempts, NULL AS tries, \
                 next_match_at = '2026-12-01 10:00:06+00' AS due_as_before \
                 FROM herald_receipts WHERE provider_event_id = 'tried'",
            )
            .load(c)
            .unwrap();
            assert_eq!(
                back.iter()
                    .map(|r| (r.outcome.as_deref(), r.match_attempts, r.due_as_before))
                    .collect::<Vec<_>>(),
                [(Some("unmatched"), 2, true)],
                "its tries and next try back on its row"
            );
        }};
    }
    on_a_fresh_database(
        backend,
        |c| run_upgrade!(c, herald::storage::PG_MIGRATIONS),
        |c| run_upgrade!(c, herald::storage::SQLITE_MIGRATIONS),
    )
    .await;
}

both_backends!(the_receipt_queue_upgrade_keeps_waiting_receipts);

/// Upgrading keeps every replay key the receipts held: each becomes a row of
/// `herald_replay_keys`, with its event and the receipt's arrival as when it was first seen.
async fn the_replay_keys_upgrade_keeps_the_keys_receipts_held(backend: Backend) {
    use diesel::connection::SimpleConnection;
    use diesel::{QueryableByName, RunQueryDsl};
    use diesel_migrations::MigrationHarness;

    #[derive(QueryableByName, Debug, PartialEq)]
    struct Key {
        #[diesel(sql_type = diesel::sql_types::Text)]
        replay_key: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        provider_event_id: String,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        seen_at_arrival: bool,
    }
    const INSERT: &str = "INSERT INTO herald_receipts (source, provider_event_id, event_type, \
        provider_type, raw, received_at, replay_key) VALUES \
        ('mg', 'ev-1', 'delivered', 'd', '{}', '2026-12-01 10:00:00+00', 'tok-1'), \
        ('mg', 'ev-2', 'delivered', 'd', '{}', '2026-12-01 10:00:00+00', NULL)";
    const READ: &str = "SELECT k.replay_key, k.provider_event_id, \
        k.seen_at = r.received_at AS seen_at_arrival \
        FROM herald_replay_keys AS k JOIN herald_receipts AS r \
          ON r.source = k.source AND r.provider_event_id = k.provider_event_id";
    macro_rules! run_upgrade {
        ($c:expr, $migrations:expr) => {{
            let c = $c;
            c.run_pending_migrations($migrations).unwrap();
            while c.revert_last_migration($migrations).unwrap().to_string() != "20261204000016" {}
            c.batch_execute(INSERT).unwrap();
            c.run_pending_migrations($migrations).unwrap();
            let keys: Vec<Key> = diesel::sql_query(READ).load(c).unwrap();
            assert_eq!(
                keys,
                [Key {
                    replay_key: "tok-1".into(),
                    provider_event_id: "ev-1".into(),
                    seen_at_arrival: true,
                }]
            );
        }};
    }
    on_a_fresh_database(
        backend,
        |c| run_upgrade!(c, herald::storage::PG_MIGRATIONS),
        |c| run_upgrade!(c, herald::storage::SQLITE_MIGRATIONS),
    )
    .await;
}

both_backends!(the_replay_keys_upgrade_keeps_the_keys_receipts_held);

/// Upgrading gives a receipt an earlier Herald judged of no send (`superseded`, its reason
/// beginning "of no send: ") the outcome `no_send`, the rest of its reason kept; other
/// `superseded` receipts stay as they were. Reverting writes them back as they were.
async fn the_no_send_upgrade_gives_such_receipts_their_own_outcome(backend: Backend) {
    use diesel::connection::SimpleConnection;
    use diesel::{QueryableByName, RunQueryDsl};
    use diesel_migrations::MigrationHarness;

    #[derive(QueryableByName, Debug, PartialEq)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        provider_event_id: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        outcome: Option<String>,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        outcome_reason: Option<String>,
    }
    const INSERT: &str = "INSERT INTO herald_receipts (source, provider_event_id, event_type, \
        provider_type, raw, received_at, outcome, outcome_reason, match_attempts) VALUES \
        ('esp', 'a-no-send', 'delivered', 'd', '{}', '2026-12-01 10:00:00+00', 'superseded', \
            'of no send: no request of it had begun when it arrived (event time -, arrived -): \
kept in the history', 0), \
        ('esp', 'b-older', 'sent', 'd', '{}', '2026-12-01 10:00:00+00', 'superseded', \
            'older than the current status delivered', 0), \
        ('esp', 'c-applied', 'delivered', 'd', '{}', '2026-12-01 10:00:00+00', 'applied', \
            'delivery status none → delivered', 0)";
    const READ: &str = "SELECT provider_event_id, outcome, outcome_reason FROM herald_receipts \
        ORDER BY provider_event_id";
    fn row(id: &str, outcome: &str, reason: &str) -> Row {
        Row {
            provider_event_id: id.into(),
            outcome: Some(outcome.into()),
            outcome_reason: Some(reason.into()),
        }
    }
    fn expected(upgraded: bool) -> [Row; 3] {
        let no_send = "no request of it had begun when it arrived (event time -, arrived -): \
kept in the history";
        [
            if upgraded {
                row("a-no-send", "no_send", no_send)
            } else {
                row("a-no-send", "superseded", &format!("of no send: {no_send}"))
            },
            row(
                "b-older",
                "superseded",
                "older than the current status delivered",
            ),
            row("c-applied", "applied", "delivery status none → delivered"),
        ]
    }
    macro_rules! run_upgrade {
        ($c:expr, $migrations:expr) => {{
            let c = $c;
            c.run_pending_migrations($migrations).unwrap();
            while c.revert_last_migration($migrations).unwrap().to_string() != "20261206000025" {}
            c.batch_execute(INSERT).unwrap();
            let rows: Vec<Row> = diesel::sql_query(READ).load(c).unwrap();
            assert_eq!(rows, expected(false));
            c.run_pending_migrations($migrations).unwrap();
            let rows: Vec<Row> = diesel::sql_query(READ).load(c).unwrap();
            assert_eq!(rows, expected(true));
            while c.revert_last_migration($migrations).unwrap().to_string() != "20261206000025" {}
            let rows: Vec<Row> = diesel::sql_query(READ).load(c).unwrap();
            assert_eq!(rows, expected(false), "reverted as they were");
        }};
    }
    on_a_fresh_database(
        backend,
        |c| run_upgrade!(c, herald::storage::PG_MIGRATIONS),
        |c| run_upgrade!(c, herald::storage::SQLITE_MIGRATIONS),
    )
    .await;
}

both_backends!(the_no_send_upgrade_gives_such_receipts_their_own_outcome);

/// Upgrading clears an error class Herald does not know, which an application's insert could
/// store before (and which failed every claim), and keeps the ones it knows.
async fn the_known_error_classes_upgrade_clears_unknown_ones(backend: Backend) {
    use diesel::connection::SimpleConnection;
    use diesel::{QueryableByName, RunQueryDsl};
    use diesel_migrations::MigrationHarness;

    #[derive(QueryableByName, Debug, PartialEq)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        event_id: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        last_error_class: Option<String>,
    }
    const INSERT: &str = "INSERT INTO herald_outbox (event_id, channel, destination, payload, \
        last_error_class) VALUES \
        ('a', 'webhook', 'https://a.example/h', '{\"body\": {}}', 'bogus'), \
        ('b', 'webhook', 'https://a.example/h', '{\"body\": {}}', 'transient'), \
        ('c', 'webhook', 'https://a.example/h', '{\"body\": {}}', NULL)";
    const READ: &str = "SELECT event_id, last_error_class FROM herald_outbox ORDER BY event_id";
    macro_rules! run_upgrade {
        ($c:expr, $migrations:expr) => {{
            let c = $c;
            c.run_pending_migrations($migrations).unwrap();
            while c.revert_last_migration($migrations).unwrap().to_string() != "20261206000026" {}
            c.batch_execute(INSERT).unwrap();
            c.run_pending_migrations($migrations).unwrap();
            let rows: Vec<Row> = diesel::sql_query(READ).load(c).unwrap();
            let row = |id: &str, class: Option<&str>| Row {
                event_id: id.into(),
                last_error_class: class.map(Into::into),
            };
            assert_eq!(
                rows,
                [row("a", None), row("b", Some("transient")), row("c", None)]
            );
        }};
    }
    on_a_fresh_database(
        backend,
        |c| {
            run_upgrade!(&mut *c, herald::storage::PG_MIGRATIONS);
            // Added NOT VALID (no scan under the insert-blocking lock), validated by the next.
            #[derive(QueryableByName)]
            struct Validated {
                #[diesel(sql_type = diesel::sql_types::Bool)]
                convalidated: bool,
            }
            let v: Validated = diesel::sql_query(
                "SELECT convalidated FROM pg_constraint \
                 WHERE conname = 'herald_outbox_last_error_class_check'",
            )
            .get_result(c)
            .unwrap();
            assert!(v.convalidated);
        },
        |c| run_upgrade!(c, herald::storage::SQLITE_MIGRATIONS),
    )
    .await;
}

both_backends!(the_known_error_classes_upgrade_clears_unknown_ones);

/// Upgrading gives each replay made before it the provider id the message had before it: that
/// of the last attempt before its series that recorded one (none where no attempt did), so a
/// late receipt naming an earlier send's id finds its message.
async fn the_replay_provider_ids_upgrade_keeps_the_ids_replays_replaced(backend: Backend) {
    use diesel::connection::SimpleConnection;
    use diesel::{QueryableByName, RunQueryDsl};
    use diesel_migrations::MigrationHarness;

    #[derive(QueryableByName, Debug, PartialEq)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        series_start: i32,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        provider_message_id_before: Option<String>,
    }
    const T: &str = "'2026-12-01 10:00:00+00:00'";
    let insert = format!(
        "INSERT INTO herald_outbox (id, event_id, channel, destination, payload) VALUES \
         (1, 'm', 'webhook', 'https://a.example/h', '{{\"body\": {{}}}}'), \
         (2, 'n', 'webhook', 'https://a.example/h', '{{\"body\": {{}}}}'); \
         INSERT INTO herald_attempts (message_id, event_id, attempt_number, started_at, \
         finished_at, duration_ms, class, policy_version, provider_message_id, next_state) VALUES \
         (1, 'm', 1, {T}, {T}, 1, 'accepted', 'default@0', 'pm-1', 'delivered'), \
         (1, 'm', 2, {T}, {T}, 1, 'accepted', 'default@0', 'pm-2', 'delivered'), \
         (1, 'm', 3, {T}, {T}, 1, 'transient', 'default@0', NULL, 'retryable'), \
         (1, 'm', 4, {T}, {T}, 1, 'accepted', 'default@0', 'pm-4', 'delivered'), \
         (2, 'n', 1, {T}, {T}, 1, 'permanent', 'default@0', NULL, 'dead_letter'); \
         INSERT INTO herald_replays (message_id, event_id, who, reason, from_state, forced, \
         series_start, replayed_at) VALUES \
         (1, 'm', 'desk', 'r', 'delivered', true, 2, {T}), \
         (1, 'm', 'desk', 'r', 'delivered', true, 4, {T}), \
         (2, 'n', 'desk', 'r', 'dead_letter', false, 2, {T})"
    );
    const READ: &str = "SELECT series_start, provider_message_id_before FROM herald_replays \
        ORDER BY message_id, series_start";
    macro_rules! run_upgrade {
        ($c:expr, $migrations:expr, $insert:expr) => {{
            let c = $c;
            c.run_pending_migrations($migrations).unwrap();
            while c.revert_last_migration($migrations).unwrap().to_string() != "20261206000029" {}
            c.batch_execute($insert).unwrap();
            c.run_pending_migrations($migrations).unwrap();
            let rows: Vec<Row> = diesel::sql_query(READ).load(c).unwrap();
            let row = |series_start, before: Option<&str>| Row {
                series_start,
                provider_message_id_before: before.map(Into::into),
            };
            // Before series 2: attempt 1's; before series 4: attempt 2's (attempt 3 had none);
            // a message whose attempts recorded none: none.
            assert_eq!(
                rows,
                [row(2, Some("pm-1")), row(4, Some("pm-2")), row(2, None)]
            );
            while c.revert_last_migration($migrations).unwrap().to_string() != "20261206000029" {}
            c.run_pending_migrations($migrations).unwrap();
        }};
    }
    let pg_insert = insert.clone();
    on_a_fresh_database(
        backend,
        move |c| run_upgrade!(c, herald::storage::PG_MIGRATIONS, &pg_insert),
        move |c| run_upgrade!(c, herald::storage::SQLITE_MIGRATIONS, &insert),
    )
    .await;
}

both_backends!(the_replay_provider_ids_upgrade_keeps_the_ids_replays_replaced);

/// PostgreSQL: rows an earlier Herald or an application stored with times out of range (an
/// `expires_at` of year 10000 in UTC, which the API took; `'-infinity'`) are brought within it
/// by the migration that adds the range constraints — every later update of such a row is
/// checked, so left as they were, the claim of the first of them would fail every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readable_times_upgrade_brings_old_rows_within_range() {
    use diesel::connection::SimpleConnection;
    use diesel::{QueryableByName, RunQueryDsl};
    use diesel_migrations::MigrationHarness;

    #[derive(QueryableByName, Debug, PartialEq)]
    struct Times {
        #[diesel(sql_type = diesel::sql_types::Text)]
        event_id: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        scheduled_at: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        expires_at: Option<String>,
    }
    on_a_fresh_database(
        Backend::Postgres,
        |c| {
            use herald::storage::PG_MIGRATIONS as M;
            c.run_pending_migrations(M).unwrap();
            while c.revert_last_migration(M).unwrap().to_string() != "20261206000023" {}
            c.batch_execute(
                "SET TIME ZONE 'UTC'; \
                 INSERT INTO herald_outbox (event_id, channel, destination, payload, scheduled_at, \
                 expires_at) VALUES \
                 ('far', 'webhook', 'https://a.example/h', '{\"body\": {}}', now(), \
                  '9999-12-31 23:59:59-01'), \
                 ('minus', 'webhook', 'https://a.example/h', '{\"body\": {}}', '-infinity', NULL), \
                 ('plain', 'webhook', 'https://a.example/h', '{\"body\": {}}', \
                  '2026-12-01 10:00:00+00', '2026-12-02 10:00:00+00')",
            )
            .unwrap();
            c.run_pending_migrations(M).unwrap();
            let rows: Vec<Times> = diesel::sql_query(
                "SELECT event_id, to_char(scheduled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') \
                 AS scheduled_at, to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') \
                 AS expires_at FROM herald_outbox WHERE event_id <> 'far' ORDER BY event_id",
            )
            .load(c)
            .unwrap();
            assert_eq!(
                rows,
                [
                    Times {
                        event_id: "minus".into(),
                        scheduled_at: "0001-01-01 00:00:00".into(),
                        expires_at: None,
                    },
                    Times {
                        event_id: "plain".into(),
                        scheduled_at: "2026-12-01 10:00:00".into(),
                        expires_at: Some("2026-12-02 10:00:00".into()),
                    },
                ]
            );
            let far: Vec<Times> = diesel::sql_query(
                "SELECT event_id, '' AS scheduled_at, expires_at::text AS expires_at \
                 FROM herald_outbox WHERE event_id = 'far'",
            )
            .load(c)
            .unwrap();
            assert_eq!(far[0].expires_at, None, "year 10000 in UTC: never");
            // Each row can be updated as a claim updates it.
            c.batch_execute(
                "UPDATE herald_outbox SET state = 'sending', lease_until = now() + interval '1 minute', \
                 updated_at = now()",
            )
            .unwrap();
        },
        |_| {},
    )
    .await;
}

/// A stored receipt writes an entry only into the indexes some statement of Herald's reads:
/// the key (source, provider event id) that deduplicates it, the replay keys, the message it
/// was matched to, and the age of unmatched ones for retention. Not the receipt's own Herald
/// event id or provider message id: the reconciler looks those up among the messages, never
/// among the receipts (migration 000020 dropped the two indexes that held them).
async fn receipts_are_indexed_only_for_herald_s_own_reads(backend: Backend) {
    use diesel::{QueryableByName, RunQueryDsl};
    use diesel_migrations::MigrationHarness;

    #[derive(QueryableByName, Debug)]
    struct Index {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
    }
    macro_rules! indexes {
        ($c:expr, $migrations:expr, $sql:expr) => {{
            let c = $c;
            c.run_pending_migrations($migrations).unwrap();
            let names: Vec<String> = diesel::sql_query($sql)
                .load::<Index>(c)
                .unwrap()
                .into_iter()
                .map(|i| i.name)
                .collect();
            names
        }};
    }
    on_a_fresh_database(
        backend,
        |c| {
            let names = indexes!(
                c,
                herald::storage::PG_MIGRATIONS,
                "SELECT indexname::text AS name FROM pg_indexes \
                 WHERE tablename = 'herald_receipts' ORDER BY 1"
            );
            assert_eq!(
                names,
                [
                    "herald_receipts_message",
                    "herald_receipts_pkey",
                    "herald_receipts_replay",
                    "herald_receipts_source_event_key",
                    "herald_receipts_unmatched_age",
                ]
            );
        },
        |c| {
            // SQLite names a UNIQUE constraint's index itself; its primary key is the rowid.
            let names = indexes!(
                c,
                herald::storage::SQLITE_MIGRATIONS,
                "SELECT name FROM sqlite_master WHERE type = 'index' \
                 AND tbl_name = 'herald_receipts' ORDER BY 1"
            );
            assert_eq!(
                names,
                [
                    "herald_receipts_message",
                    "herald_receipts_replay",
                    "herald_receipts_unmatched_age",
                    "sqlite_autoindex_herald_receipts_1",
                ]
            );
        },
    )
    .await;
}

both_backends!(receipts_are_indexed_only_for_herald_s_own_reads);
