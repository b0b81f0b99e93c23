//! Test support: a throwaway PostgreSQL, SQLite files, a scripted HTTP receiver and a running
//! Herald per test.

pub mod admin;
pub mod app;
pub mod browser;
pub mod db;
pub mod link;
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

/// A loopback address where nothing listens for the whole test run: a socket bound to it but
/// never listening (a connection to it is refused at once), kept open for the life of the test
/// process. A listener bound and dropped would free its port, and a listener of another test
/// running at the same time could be given it (seen once: a send to the "closed" port was
/// delivered).
pub fn closed_addr() -> std::net::SocketAddr {
    static CLOSED: std::sync::OnceLock<(std::net::SocketAddr, tokio::net::TcpSocket)> =
        std::sync::OnceLock::new();
    CLOSED
        .get_or_init(|| {
            let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
            socket
                .bind("127.0.0.1:0".parse().unwrap())
                .expect("bind a loopback port");
            (socket.local_addr().expect("its address"), socket)
        })
        .0
}

/// A loopback address where nothing listens yet (a connection to it is refused at once), and
/// the socket that holds it: the test makes the destination come up by listening on it
/// (`socket.listen(…)`), on the very address its messages were refused at.
pub fn down_until_listening() -> (tokio::net::TcpSocket, std::net::SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
    socket
        .bind("127.0.0.1:0".parse().unwrap())
        .expect("bind a loopback port");
    let addr = socket.local_addr().expect("its address");
    (socket, addr)
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

/// A global retry policy alone, of `version`, for the claims tests make themselves.
pub fn global_policy(version: &str) -> herald::domain::policies::Policies {
    herald::domain::policies::Policies::global_only(herald::domain::policies::PolicyId {
        name: "default".into(),
        version: version.into(),
        max_attempts: 15,
    })
}
