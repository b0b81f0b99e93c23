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
