//! A running Herald for one test: its own database, an HTTP server on 127.0.0.1:0, a sender the
//! test drives (`run_until_idle`) and a clock the test can move.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use herald::app::Herald;
use herald::clock::OffsetClock;
use herald::config::Settings;
use herald::storage::models::{AttemptRow, OutboxRow};
use herald::storage::{Backend, Db};

use super::db::TestDb;

/// The signing secret tests verify with.
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The admin token (`api_token`, named `default`) every test app accepts and `TestApp::http`
/// sends.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// A client that sends `token` as its bearer token on every request.
pub fn client_with_token(token: &str) -> reqwest::Client {
    // reqwest is built without a crypto provider of its own (as Herald is): a test that builds
    // its client before any Herald started in the process would otherwise panic.
    herald::channels::install_crypto_provider();
    let mut headers = reqwest::header::HeaderMap::new();
    let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
    headers.insert(reqwest::header::AUTHORIZATION, value);
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

pub struct TestApp {
    pub base: String,
    pub db: Db,
    pub herald: Herald,
    pub clock: Arc<OffsetClock>,
    pub http: reqwest::Client,
    pub test_db: TestDb,
    server: actix_web::dev::ServerHandle,
}

/// The SSRF guard's allow-list of every test Herald: the receivers and sinks listen on
/// 127.0.0.1. Tests of the guard itself replace it (`allow_networks = ""` allows nothing).
pub const TEST_ALLOW_NETWORKS: &str = "127.0.0.0/8";

/// Settings every test starts from; keys set in `extra` (TOML) replace these.
pub fn base_toml(db_url: &str, extra: &str) -> String {
    let base = format!(
        "database_url = \"{db_url}\"\nwebhook_secret = \"{SECRET}\"\napi_token = \"{ADMIN_TOKEN}\"\n\
         poll_interval_ms = 50\nallow_networks = \"{TEST_ALLOW_NETWORKS}\"\n\
         lease_seconds = 30\nwebhook_timeout_ms = 1000\nwebhook_connect_timeout_ms = 500\n\
         smtp_timeout_ms = 2000\nretry_base_seconds = 1\nretry_cap_seconds = 60\n\
         retry_max_attempts = 4\nretry_after_max_seconds = 120\nretry_jitter = 0.2\n"
    );
    let overridden = |line: &str| {
        let key = line.split('=').next().unwrap_or("").trim();
        extra
            .lines()
            .any(|l| l.split('=').next().unwrap_or("").trim() == key)
    };
    let kept: String = base
        .lines()
        .filter(|l| !overridden(l))
        .map(|l| format!("{l}\n"))
        .collect();
    format!("{kept}{extra}")
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    spawn_app_with(backend, "").await
}

pub async fn spawn_app_with(backend: Backend, extra_toml: &str) -> TestApp {
    let test_db = TestDb::new(backend);
    spawn_on(test_db, extra_toml).await
}

pub async fn spawn_on(test_db: TestDb, extra_toml: &str) -> TestApp {
    spawn_with_workers(test_db, extra_toml, 1).await
}

/// As [`spawn_on`] with `workers` HTTP worker threads (benchmarks).
pub async fn spawn_with_workers(test_db: TestDb, extra_toml: &str, workers: usize) -> TestApp {
    let settings =
        Settings::from_toml(&base_toml(&test_db.url, extra_toml)).expect("test settings");
    let clock = Arc::new(OffsetClock::new());
    let c2 = clock.clone();
    let herald = tokio::task::spawn_blocking(move || Herald::build(settings, c2, true))
        .await
        .unwrap()
        .expect("build herald");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = herald.http_server(listener, workers).expect("http server");
    let handle = server.handle();
    tokio::spawn(server);
    TestApp {
        base,
        db: herald.db.clone(),
        herald,
        clock,
        http: client_with_token(ADMIN_TOKEN),
        test_db,
        server: handle,
    }
}

impl TestApp {
    /// Drives the sender until nothing is due.
    pub async fn run_until_idle(&self) -> usize {
        self.herald.sender.run_until_idle().await.expect("sender")
    }

    pub fn clock_now(&self) -> chrono::DateTime<chrono::Utc> {
        herald::clock::Clock::now(&*self.clock)
    }

    /// Moves Herald's clock forward (retries become due).
    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    pub async fn post_message(&self, body: serde_json::Value) -> reqwest::Response {
        self.http
            .post(format!("{}/v1/messages", self.base))
            .json(&body)
            .send()
            .await
            .expect("POST /v1/messages")
    }

    /// `GET path` with the admin token; 200 expected, its JSON body.
    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("GET");
        assert_eq!(r.status(), 200, "GET {path}");
        r.json().await.unwrap()
    }

    /// `GET /v1/messages/{event_id}/explain`.
    pub async fn explain(&self, event_id: &str) -> serde_json::Value {
        self.get_json(&format!("/v1/messages/{event_id}/explain"))
            .await
    }

    pub async fn message(&self, event_id: &str) -> serde_json::Value {
        self.get_json(&format!("/v1/messages/{event_id}")).await
    }

    pub fn row(&self, event_id: &str) -> OutboxRow {
        self.db
            .find_by_event_id(event_id)
            .unwrap()
            .expect("row exists")
    }

    pub fn attempts(&self, event_id: &str) -> Vec<AttemptRow> {
        let row = self.row(event_id);
        self.db.attempts_of(row.id).unwrap()
    }

    pub async fn stop(self) {
        self.server.stop(false).await;
    }
}

/// A webhook message body for `POST /v1/messages`.
pub fn webhook(event_id: &str, url: &str, body: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "event_id": event_id,
        "channel": "webhook",
        "destination": url,
        "payload": {"body": body},
    })
}

/// Sends `requests` through the app's routes with a database nobody answers (storage down).
pub async fn call_with_storage_down(
    app: &TestApp,
    requests: Vec<actix_web::test::TestRequest>,
) -> Vec<actix_web::dev::ServiceResponse> {
    let closed = super::closed_addr();
    let db = Db::connect(
        &format!("postgres://herald@{closed}/none"),
        &herald::storage::PoolOptions {
            max_size: 2,
            connection_timeout: Duration::from_millis(300),
            ..herald::storage::PoolOptions::default()
        },
    )
    .unwrap();
    call_with_db(app, db, requests).await
}

/// Sends `requests` through the app's routes, with `db` in place of the app's database.
pub async fn call_with_db(
    app: &TestApp,
    db: Db,
    requests: Vec<actix_web::test::TestRequest>,
) -> Vec<actix_web::dev::ServiceResponse> {
    let mut state = app.herald.app_state();
    // Ingest and the API's enqueue write through group-commit writers: ones on the replacement
    // database too.
    state.receipt_writer = herald::storage::group_commit::ReceiptWriter::spawn(db.clone()).unwrap();
    state.message_writer = herald::storage::group_commit::MessageWriter::spawn(db.clone()).unwrap();
    state.db = db;
    let srv = actix_web::test::init_service(
        actix_web::App::new()
            .app_data(actix_web::web::Data::new(state))
            .configure(herald::http::configure),
    )
    .await;
    let mut out = Vec::new();
    for r in requests {
        use actix_web::HttpMessage;
        let mut req = r.to_request();
        let auth = actix_web::http::header::AUTHORIZATION;
        if !req.headers().contains_key(&auth) {
            let value = format!("Bearer {ADMIN_TOKEN}").parse().unwrap();
            req.headers_mut().insert(auth, value);
        }
        out.push(actix_web::test::call_service(&srv, req).await);
    }
    out
}

impl TestApp {
    /// Runs SQL on a plain connection of the app's database, as an application would.
    pub fn raw_sql(&self, sql: &str) {
        use diesel::Connection;
        use diesel::connection::SimpleConnection;
        match self.test_db.backend {
            Backend::Postgres => diesel::pg::PgConnection::establish(&self.test_db.url)
                .unwrap()
                .batch_execute(sql)
                .unwrap(),
            Backend::Sqlite => {
                let path = herald::storage::sqlite_path(&self.test_db.url).unwrap();
                let mut c = diesel::sqlite::SqliteConnection::establish(path).unwrap();
                c.batch_execute("PRAGMA busy_timeout = 5000").unwrap();
                c.batch_execute(sql).unwrap();
            }
        }
    }
}

/// The production sender loop (with LISTEN/NOTIFY on PostgreSQL, the insert watch on SQLite),
/// running until [`RunningSender::stop`].
pub struct RunningSender {
    stop: tokio::sync::watch::Sender<bool>,
    stop_listen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    listener: std::thread::JoinHandle<()>,
    running: tokio::task::JoinHandle<()>,
}

impl TestApp {
    pub fn start_sender(&self) -> RunningSender {
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let stop_listen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // As `herald serve` does: LISTEN on PostgreSQL, the insert watch on SQLite.
        let listener = herald::sender::listener::spawn(
            &self.db,
            self.test_db.url.clone(),
            self.herald.wake.clone(),
            stop_listen.clone(),
        );
        let running = tokio::spawn(self.herald.sender.clone().run(stop_rx));
        RunningSender {
            stop,
            stop_listen,
            listener,
            running,
        }
    }
}

impl RunningSender {
    /// Stops claiming, waits for in-flight sends and their outcomes (bounded), stops listening.
    pub async fn stop(self) {
        self.signal();
        self.join().await
    }

    /// The shutdown signal alone (as SIGTERM gives it); [`RunningSender::join`] waits for the end.
    pub fn signal(&self) {
        self.stop.send(true).unwrap();
    }

    /// Waits for the signalled sender to stop (bounded), then stops listening.
    pub async fn join(self) {
        tokio::time::timeout(Duration::from_secs(20), self.running)
            .await
            .expect("the sender stops")
            .unwrap();
        self.stop_listen
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let t = self.listener;
        tokio::task::spawn_blocking(move || t.join().unwrap())
            .await
            .unwrap();
    }
}
