//! Test support: a throwaway PostgreSQL, SQLite files, a scripted HTTP receiver and a running
//! Herald per test.

pub mod admin;
pub mod app;
pub mod browser;
pub mod db;
pub mod prom;
pub mod receiver;
pub mod smtp_sink;

pub use app::{TestApp, spawn_app};
pub use db::TestDb;
pub use herald::storage::Backend;
pub use receiver::{Receiver, Reply};

/// A path inside this checkout. `cargo test` names the package's directory at run time; the
/// compile-time `env!("CARGO_MANIFEST_DIR")` is only the fallback, because a test binary that
/// cargo reuses from a shared target directory still carries the checkout it was built in,
/// which may be another clone, or gone.
pub fn repo_path(rel: &str) -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
        .join(rel)
}

/// Generates one test per backend from `async fn NAME(backend: Backend)`.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    super::$name($crate::support::Backend::Postgres).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name($crate::support::Backend::Sqlite).await
                }
            }
        )+
    };
}
