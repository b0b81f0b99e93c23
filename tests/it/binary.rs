//! The real `herald` binary as a child process, configured as an operator would (`HERALD_*`
//! variables, a `herald.toml` where sources need one): start-up with SMTP, dependent defaults,
//! the one-line refusals of settings that cannot work, background reconciliation, and fan-out
//! with background retention.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::smtp_sink::SmtpSink;

/// Generous bounds for a loaded machine; every wait below ends as soon as its condition holds.
const START_WITHIN: Duration = Duration::from_secs(60);
const EXIT_WITHIN: Duration = Duration::from_secs(30);

/// The API token every child process is given (`HERALD_API_TOKEN`) unless a test says otherwise.
const BIN_TOKEN: &str = "tok-binary-test-7f3a";

/// A client that sends [`BIN_TOKEN`].
pub(crate) fn client() -> reqwest::Client {
    crate::support::app::client_with_token(BIN_TOKEN)
}

/// A free loopback address (bound, read, released).
pub(crate) fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// `herald ARGS` in its own temp directory (no `herald.toml`, `.eml` files stay inside), with no
/// inherited `HERALD_*` variable, a SQLite database in that directory,
/// `HERALD_ALLOW_NETWORKS=127.0.0.0/8` (the receivers listen there; `("HERALD_ALLOW_NETWORKS",
/// "")` in `env` unsets it) and `env` on top.
pub(crate) struct Herald {
    pub(crate) child: Child,
    dir: tempfile::TempDir,
}

impl Herald {
    fn spawn(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_with_config(args, env, None)
    }

    /// As [`Herald::spawn`], with `herald.toml` in its directory when given.
    pub(crate) fn spawn_with_config(
        args: &[&str],
        env: &[(&str, &str)],
        toml: Option<&str>,
    ) -> Self {
        let mut with_token = vec![("HERALD_API_TOKEN", BIN_TOKEN)];
        with_token.extend_from_slice(env);
        Self::spawn_in(tempfile::tempdir().unwrap(), args, &with_token, toml)
    }

    /// `herald ARGS` in `dir` with exactly `env` (no API token unless given).
    fn spawn_in(
        dir: tempfile::TempDir,
        args: &[&str],
        env: &[(&str, &str)],
        toml: Option<&str>,
    ) -> Self {
        if let Some(toml) = toml {
            std::fs::write(dir.path().join("herald.toml"), toml).unwrap();
        }
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
        for (k, _) in std::env::vars() {
            if k.starts_with("HERALD_") || k == "RUST_LOG" {
                cmd.env_remove(k);
            }
        }
        let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
        let stdout = std::fs::File::create(dir.path().join("stdout")).unwrap();
        cmd.args(args)
            .current_dir(dir.path())
            .env(
                "HERALD_DATABASE_URL",
                format!("sqlite://{}", dir.path().join("herald.db").display()),
            )
            .env(
                "HERALD_ALLOW_NETWORKS",
                crate::support::app::TEST_ALLOW_NETWORKS,
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        let child = cmd.spawn().expect("spawn herald");
        Herald { child, dir }
    }

    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stdout")).unwrap_or_default()
    }

    /// Polls `GET /healthz` until it answers 200; fails at once if the process exits.
    pub(crate) async fn wait_healthy(&mut self, base: &str) {
        herald::channels::install_crypto_provider();
        let http = reqwest::Client::new();
        let deadline = Instant::now() + START_WITHIN;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "herald exited during start-up ({status}); stderr:\n{}",
                    self.stderr()
                );
            }
            if let Ok(r) = http.get(format!("{base}/healthz")).send().await
                && r.status() == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "herald not healthy within {START_WITHIN:?}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (bounded) for the process to exit by itself; kills it and fails if it does not.
    pub(crate) async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "herald did not exit within {within:?}; stderr:\n{}",
                    self.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM, then the exit status (bounded).
    pub(crate) async fn terminate(&mut self) -> ExitStatus {
        self.sigterm();
        self.wait_exit(EXIT_WITHIN).await
    }

    /// SIGTERM, then requires a clean exit (status 0, bounded); returns the log.
    pub(crate) async fn stop_cleanly(&mut self) -> String {
        let status = self.terminate().await;
        let log = self.stderr();
        assert!(status.success(), "{status}; stderr:\n{log}");
        log
    }

    /// SIGTERM, without waiting for the exit.
    pub(crate) fn sigterm(&self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM failed");
    }

    /// Waits (bounded) until the log has a line containing `text`.
    pub(crate) async fn wait_for_log(&self, text: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.stderr().contains(text) {
            assert!(
                Instant::now() < deadline,
                "no {text:?} in the log within {within:?}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Herald {
    fn drop(&mut self) {
        // A failed assertion must not leave the child running.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `herald serve` with `env`, expecting a refusal: returns the exit status and stderr.
async fn refusal(env: &[(&str, &str)]) -> (ExitStatus, String) {
    let mut h = Herald::spawn(&["serve"], env);
    let status = h.wait_exit(EXIT_WITHIN).await;
    (status, h.stderr())
}

/// One line `herald: …` naming `setting`, exit status 2, no backtrace even when asked for one.
fn assert_one_line_refusal(status: ExitStatus, stderr: &str, setting: &str) {
    assert_eq!(status.code(), Some(2), "{status}; stderr:\n{stderr}");
    let text = stderr.trim_end();
    assert!(!text.contains('\n'), "more than one line:\n{stderr}");
    assert!(text.starts_with("herald: "), "{stderr}");
    assert!(text.contains(setting), "does not name {setting}: {stderr}");
    assert!(!text.contains("stack backtrace"), "{stderr}");
    assert!(!text.contains("panicked"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_smtp_delivers_and_stops_on_sigterm() {
    let sink = SmtpSink::start().await;
    let listen = free_addr();
    let base = format!("http://{listen}");
    let token = BIN_TOKEN;
    let mut herald = Herald::spawn(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_SMTP_URL", &sink.url),
            // An hour: what is sent below is woken for, never polled for.
            ("HERALD_POLL_INTERVAL_MS", "3600000"),
        ],
    );
    herald.wait_healthy(&base).await;

    let http = client();
    let r = http
        .post(format!("{base}/v1/messages"))
        .json(&json!({
            "event_id": "bin-mail-1", "channel": "email", "destination": "ada@example.com",
            "payload": {"subject": "From the binary", "text": "Hello from a child process"},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    drop(http);

    let mails = sink.wait_for_mail(1, Duration::from_secs(30)).await;
    assert_eq!(mails[0].rcpt, "<ada@example.com>");
    assert!(mails[0].data.contains("X-Herald-Event-Id: bin-mail-1"));
    // The sink offers PIPELINING: the envelope left in one write. And CHUNKING, as Postfix does:
    // this at_least_once message (the default) went by `BDAT n LAST` in that same write.
    assert_eq!(sink.envelopes(), (1, 0), "(pipelined, lockstep) envelopes");
    assert_eq!(sink.chunks(), 1, "BDAT commands");
    // While it runs, Herald's checkpointer copies its commits into the database file: the
    // message's `delivered` is in the file itself, read without the WAL.
    let db = herald.dir.path().join("herald.db");
    let deadline = Instant::now() + Duration::from_secs(10);
    while crate::support::db::state_in_database_file(&db, "bin-mail-1").as_deref()
        != Some("delivered")
    {
        assert!(
            Instant::now() < deadline,
            "not delivered in the database file within 10 s: {:?}",
            crate::support::db::state_in_database_file(&db, "bin-mail-1")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // An application's own transaction, on its own connection to the database file: the insert
    // watch wakes the sender for it (the poll is an hour away).
    {
        use diesel::Connection;
        use diesel::connection::SimpleConnection;
        let mut app = diesel::sqlite::SqliteConnection::establish(db.to_str().unwrap()).unwrap();
        app.batch_execute(
            "PRAGMA busy_timeout = 5000; BEGIN IMMEDIATE; \
             INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             VALUES ('signup:grace@example.com', 'email', 'grace@example.com', \
                     '{\"subject\": \"By SQL\", \"text\": \"Inserted by the application\"}'); \
             COMMIT;",
        )
        .unwrap();
    }
    let mails = sink.wait_for_mail(2, Duration::from_secs(10)).await;
    assert_eq!(mails[1].rcpt, "<grace@example.com>");
    assert!(
        mails[1]
            .data
            .contains("X-Herald-Event-Id: signup:grace@example.com")
    );

    let log = herald.stop_cleanly().await;
    assert!(!log.contains("panicked"), "{log}");
    // Mail with the default Message-ID domain, the same for every Herald: said at start.
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("default message_id_domain")),
        "{log}"
    );
    // With the kernel's reports of the WAL's writes (Linux), not by looking every 10 ms —
    // unless this user's inotify instances ran out (many tests in parallel on a big machine).
    assert!(
        log.contains("watching the SQLite database for inserts"),
        "{log}"
    );
    if !log.contains("Too many open files") {
        assert_eq!(
            log.contains("by looking"),
            !cfg!(target_os = "linux"),
            "{log}"
        );
    }
    // Logs carry identifiers, never the token or the recipients' addresses — also where an
    // application keyed a message by one (its event id is logged masked).
    assert!(log.contains("signup:g***@e***.com"), "{log}");
    assert!(
        !log.contains(token)
            && !log.contains("ada@example.com")
            && !log.contains("grace@example.com"),
        "{log}"
    );
}

/// A relay that takes two recipients per transaction, in the real binary: a mail to five goes
/// in three transactions of one attempt, and every recipient gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_sends_recipients_past_the_relays_limit_in_next_transactions() {
    use crate::support::smtp_sink::Script;
    let sink = SmtpSink::start_scripted(Script {
        max_recipients: Some(2),
        ..Script::default()
    })
    .await;
    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut herald = Herald::spawn(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_SMTP_URL", &sink.url),
            ("HERALD_MESSAGE_ID_DOMAIN", "mail.example.com"),
        ],
    );
    herald.wait_healthy(&base).await;
    let r = client()
        .post(format!("{base}/v1/messages"))
        .json(&json!({
            "event_id": "bin-many", "channel": "email", "destination": "ada@example.com",
            "payload": {"subject": "To five", "text": "Hello",
                        "to": ["bob@example.com"], "cc": ["cy@example.com", "dee@example.com"],
                        "bcc": ["eve@example.com"]},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let v = wait_for_view(&base, "bin-many", |v| v["state"] == "delivered").await;
    assert_eq!(v["attempts"], 1, "{v}");
    let mails = sink.accepted();
    let mut got: Vec<String> = mails.iter().flat_map(|m| m.rcpts.clone()).collect();
    got.sort();
    assert_eq!(
        got,
        ["ada", "bob", "cy", "dee", "eve"].map(|n| format!("<{n}@example.com>"))
    );
    assert_eq!(mails.len(), 3);
    assert!(
        mails[0].data.contains("@mail.example.com>"),
        "{}",
        mails[0].data
    );
    let log = herald.stop_cleanly().await;
    assert!(!log.contains("@example.com"), "{log}");
    assert!(!log.contains("default message_id_domain"), "{log}");
}

/// Without a sender in the process nothing needs waking: no insert watch runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_sender_no_insert_watch_runs() {
    let log = serve_until_healthy_then_stop(&[("HERALD_SENDER_ENABLED", "false")]).await;
    assert!(log.contains("herald serving"), "{log}");
    assert!(!log.contains("watching the SQLite database"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_timeout_alone_starts() {
    serve_until_healthy_then_stop(&[("HERALD_WEBHOOK_TIMEOUT_MS", "1500")]).await;
}

/// Runs `herald serve` with `env` until it answers `/healthz`, stops it with SIGTERM, requires a
/// clean exit, and returns its log.
async fn serve_until_healthy_then_stop(env: &[(&str, &str)]) -> String {
    let listen = free_addr();
    let mut all = vec![("HERALD_LISTEN", listen.as_str())];
    all.extend_from_slice(env);
    let mut herald = Herald::spawn(&["serve"], &all);
    herald.wait_healthy(&format!("http://{listen}")).await;
    herald.stop_cleanly().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_connect_timeout_above_the_total_is_refused_in_one_line() {
    let listen = free_addr();
    let (status, stderr) = refusal(&[
        ("HERALD_LISTEN", &listen),
        ("HERALD_WEBHOOK_TIMEOUT_MS", "1000"),
        ("HERALD_WEBHOOK_CONNECT_TIMEOUT_MS", "2000"),
        ("RUST_BACKTRACE", "1"),
    ])
    .await;
    assert_one_line_refusal(status, &stderr, "HERALD_WEBHOOK_CONNECT_TIMEOUT_MS");
}

/// Without a configured token `/v1` is not open: Herald generates one on first start, stores
/// it, and `herald api-token` shows it; named tokens from `herald token` carry their scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_generated_when_none_is_configured_and_scopes_hold() {
    let listen = free_addr();
    let base = format!("http://{listen}");
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("herald.db").display());
    let env = [
        ("HERALD_LISTEN", listen.as_str()),
        ("HERALD_DATABASE_URL", db.as_str()),
    ];
    let mut herald = Herald::spawn_in(dir, &["serve"], &env, None);
    herald.wait_healthy(&base).await;
    let body = crate::support::app::webhook("bin-tok-1", "https://x.example/h", json!({}));
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/messages"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");

    let shown = run_herald(&["api-token"], &env);
    let token = shown.trim();
    assert!(token.starts_with("hrld_"), "{shown}");
    let r = crate::support::app::client_with_token(token)
        .post(format!("{base}/v1/messages"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let log = herald.stop_cleanly().await;
    assert!(!log.contains(token), "the token is never logged:\n{log}");
    // Once a token is configured the generated one is not accepted, and `herald api-token`
    // prints nothing a script would take for a token (`TOKEN=$(herald api-token)`): it says why
    // on standard error and exits 1.
    let configured = [
        env[1],
        ("HERALD_API_TOKEN", "a-configured-token-0123456789"),
    ];
    let out = herald_output(&["api-token"], &configured);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "{:?}", out.stdout);
    assert!(
        stderr.starts_with("herald: tokens are configured") && stderr.contains("HERALD_API_TOKEN"),
        "{stderr}"
    );

    // A name or scope it cannot make a token of: one line naming the argument, exit 2, as
    // any bad command line.
    for (args, named) in [
        (
            ["token", "bad name", "--scope", "send"],
            "NAME: \"bad name\" is not a token name",
        ),
        (
            ["token", "shop", "--scope", "root"],
            "--scope: must be send, support or admin",
        ),
    ] {
        let out = herald_output(&args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let line = stderr.trim_end();
        assert!(line.starts_with(&format!("herald: {named}")), "{line}");
        assert!(!line.contains('\n'), "{line}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // `herald token NAME --scope send` prints a token and the lines for herald.toml.
    let made = run_herald(&["token", "shop", "--scope", "send"], &[]);
    let shop = made
        .lines()
        .next()
        .unwrap()
        .strip_prefix("token: ")
        .unwrap()
        .to_owned();
    let toml: String = made
        .lines()
        .skip_while(|l| !l.starts_with("[tokens."))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        !toml.contains(&shop),
        "only the digest goes into the file: {toml}"
    );
    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut herald =
        Herald::spawn_with_config(&["serve"], &[("HERALD_LISTEN", &listen)], Some(&toml));
    herald.wait_healthy(&base).await;
    let shop_http = crate::support::app::client_with_token(&shop);
    let r = shop_http
        .post(format!("{base}/v1/messages"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = shop_http
        .get(format!("{base}/v1/receipts/unmatched"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a send token does no support work");
    let r = client()
        .get(format!("{base}/v1/receipts/unmatched"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        200,
        "HERALD_API_TOKEN is the admin token named default"
    );
    let log = herald.stop_cleanly().await;
    assert!(
        log.contains("shop:send") && log.contains("default:admin"),
        "token names are logged:\n{log}"
    );
    assert!(!log.contains(&shop) && !log.contains(BIN_TOKEN), "{log}");
}

/// Runs `herald ARGS` to completion with exactly `env`; its stdout (exit status 0 asserted).
fn run_herald(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = herald_output(args, env);
    assert!(
        out.status.success(),
        "herald {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `herald ARGS` with `env` (and none of the caller's `HERALD_*` variables), run to its end.
fn herald_output(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.args(args).envs(env.iter().copied()).output().unwrap()
}

/// The CLI's own output, as a script takes it (found by a walk-through): `herald token` prints
/// lines a config file takes, a name with a `.` too; a closed standard output ends a verb
/// quietly, not with a panic; `webhook-secret` prints nothing on standard output when the secret
/// is configured (a script's `$(…)` would take the sentence for it); a `herald.toml` that is a
/// dangling link is an error naming it, not a start on defaults.
#[test]
fn the_cli_prints_what_scripts_take() {
    let out = run_herald(&["token", "shop.eu", "--scope", "send"], &[]);
    let toml: String = out
        .lines()
        .skip_while(|l| !l.starts_with('['))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(toml.starts_with("[tokens.\"shop.eu\"]"), "{out}");
    let settings = herald::config::Settings::from_toml(&toml).unwrap();
    assert!(
        settings.tokens.names().any(|(n, _)| n == "shop.eu"),
        "{toml}"
    );
    let token = out.lines().next().unwrap().trim_start_matches("token: ");
    assert!(settings.tokens.authenticate(token).is_some(), "{out}");
    // Standard output closed before anything is written.
    for args in [
        &["token", "shop", "--scope", "send"][..],
        &["webhook-secret"][..],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let db = format!("sqlite://{}", dir.path().join("h.db").display());
        let out = Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(args)
            .env("HERALD_DATABASE_URL", &db)
            .env_remove("HERALD_WEBHOOK_SECRET")
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {stderr}", out.status);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("h.db").display());
    let out = herald_output(
        &["webhook-secret"],
        &[
            ("HERALD_DATABASE_URL", db.as_str()),
            (
                "HERALD_WEBHOOK_SECRET",
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            ),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("HERALD_WEBHOOK_SECRET"));
    // A dangling ./herald.toml.
    std::os::unix::fs::symlink("/nonexistent/herald.toml", dir.path().join("herald.toml")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .arg("migrate")
        .current_dir(dir.path())
        .env("HERALD_DATABASE_URL", &db)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("herald.toml"), "{stderr}");
}

/// Several `herald migrate`s (or `serve`s, `api-token`s) at once on a fresh SQLite file all
/// succeed, one migrating and the others finding nothing pending (found by a walk-through: in 5
/// of 10 runs of two, one exited 1 with "table herald_outbox already exists"; 13 of 30
/// processes in 10 runs of three).
#[test]
fn migrations_run_at_once_on_a_fresh_sqlite_file_all_succeed() {
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let db = format!("sqlite://{}", dir.path().join("h.db").display());
        let children: Vec<_> = (0..3)
            .map(|_| {
                let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
                for (k, _) in std::env::vars() {
                    if k.starts_with("HERALD_") {
                        cmd.env_remove(k);
                    }
                }
                cmd.arg("migrate")
                    .current_dir(dir.path())
                    .env("HERALD_DATABASE_URL", &db)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "round {round}: {:?} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        use diesel::{Connection, RunQueryDsl};
        #[derive(diesel::QueryableByName)]
        struct Applied {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let mut conn =
            diesel::sqlite::SqliteConnection::establish(dir.path().join("h.db").to_str().unwrap())
                .unwrap();
        let applied = diesel::sql_query("SELECT count(*) AS n FROM __diesel_schema_migrations")
            .get_result::<Applied>(&mut conn)
            .unwrap()
            .n;
        let known = std::fs::read_dir(crate::support::repo_path("migrations/sqlite"))
            .unwrap()
            .count();
        assert_eq!(applied, i64::try_from(known).unwrap(), "round {round}");
    }
}

/// At start, Herald names what it will not use: a `HERALD_*` variable no setting reads (a
/// typo; by name, never its value), and migrations a newer Herald applied to the database (a
/// downgrade). Both found by a walk-through to pass silently.
#[test]
fn start_up_names_unread_variables_and_newer_migrations() {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.db");
    let db = format!("sqlite://{}", path.display());
    let out = herald_output(
        &["migrate"],
        &[
            ("HERALD_DATABASE_URL", db.as_str()),
            ("HERALD_LEASE_SECOND", "s3cret-value"),
        ],
    );
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("WARN") && l.contains("HERALD_LEASE_SECOND")),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cret-value"), "{stderr}");
    assert!(
        !stderr.contains("migrations this Herald does not know"),
        "{stderr}"
    );
    diesel::sqlite::SqliteConnection::establish(path.to_str().unwrap())
        .unwrap()
        .batch_execute("INSERT INTO __diesel_schema_migrations (version) VALUES ('29991231000001')")
        .unwrap();
    let out = herald_output(&["migrate"], &[("HERALD_DATABASE_URL", db.as_str())]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.lines().any(|l| l.contains("WARN")
            && l.contains("migrations this Herald does not know")
            && l.contains("29991231000001")),
        "{stderr}"
    );
}

/// A variable set to the empty string is taken as not set and named at start (it was silently
/// ignored); an empty `HERALD_DATABASE_URL` — a secret that failed to arrive — is refused (it
/// started Herald on a new `herald.db` in the working directory; an operator's walk-through).
#[test]
fn empty_variables_are_named_and_an_empty_database_url_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
        for (k, _) in std::env::vars() {
            if k.starts_with("HERALD_") || k == "RUST_LOG" {
                cmd.env_remove(k);
            }
        }
        cmd.current_dir(dir.path())
            .args(["migrate"])
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    let out = run(&[("HERALD_DATABASE_URL", " ")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("HERALD_DATABASE_URL: is set but empty"),
        "{stderr}"
    );
    assert!(!dir.path().join("herald.db").exists());
    let db = format!("sqlite://{}", dir.path().join("h.db").display());
    // An endpoint's header a message could not write is said at start, by key (no value), and
    // Herald starts: it sent them before that rule.
    std::fs::write(
        dir.path().join("herald.toml"),
        "[endpoints.e]\nurl = \"https://e.example/h\"\n\
         [endpoints.e.headers]\n\"X-Team\" = \"hdr-secret-1\"\n\"X_Team\" = \"hdr-secret-2\"\n",
    )
    .unwrap();
    let out = run(&[
        ("HERALD_DATABASE_URL", &db),
        ("HERALD_API_TOKEN", ""),
        ("HERALD_LISTEN", ""),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.contains("WARN")
            && l.contains("set but empty")
            && l.contains("HERALD_API_TOKEN,HERALD_LISTEN")),
        "{stderr}"
    );
    assert!(
        stderr.lines().any(|l| l.contains("WARN")
            && l.contains("configuration: endpoints.e.headers.X_Team: is the same header as")),
        "{stderr}"
    );
    assert!(!stderr.contains("hdr-secret"), "{stderr}");
}

/// `herald migrate` with a configuration that drops endpoints other processes subscribed says
/// so at WARN, naming them: it replaces `herald_subscriptions` for every process.
#[test]
fn a_migrate_that_removes_subscriptions_warns_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("h.db").display());
    let config = |endpoints: &[&str]| {
        let path = dir.path().join(format!("{}.toml", endpoints.join("-")));
        let toml: String = endpoints
            .iter()
            .map(|e| {
                format!(
                    "[endpoints.{e}]\nurl = \"https://{e}.example/h\"\nevent_types = [\"order.*\"]\n"
                )
            })
            .collect();
        std::fs::write(&path, toml).unwrap();
        path.display().to_string()
    };
    let (both, one) = (config(&["keep", "gone"]), config(&["keep"]));
    let env = [("HERALD_DATABASE_URL", db.as_str())];
    let first = herald_output(&["--config", &both, "migrate"], &env);
    assert!(first.status.success());
    assert!(!String::from_utf8_lossy(&first.stderr).contains("WARN"));
    let second = herald_output(&["--config", &one, "migrate"], &env);
    assert!(second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("WARN") && l.contains("subscriptions"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("gone") && !line.contains("keep"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_smtp_url_or_mail_from_is_refused_in_one_line_before_the_database() {
    for (var, value, secret) in [
        (
            "HERALD_SMTP_URL",
            "smtp://herald:hunter2@mail.example:99999",
            "hunter2",
        ),
        (
            "HERALD_SMTP_URL",
            "ftp://herald:hunter2@mail.example",
            "hunter2",
        ),
        // A mistyped TLS option would have meant mail in clear: refused, not ignored.
        (
            "HERALD_SMTP_URL",
            "smtp://mail.example?TLS=required&k=hunter2",
            "hunter2",
        ),
        ("HERALD_SMTP_URL", "smtp://hunter2@127.0.0.1", "hunter2"),
        ("HERALD_MAIL_FROM", "ada at example.com", "example.com"),
    ] {
        let mut h = Herald::spawn(&["serve"], &[(var, value), ("RUST_BACKTRACE", "1")]);
        let status = h.wait_exit(EXIT_WITHIN).await;
        let stderr = h.stderr();
        assert_one_line_refusal(status, &stderr, var);
        // Neither the password nor the address is repeated back.
        assert!(!stderr.contains(secret), "{var}: {stderr}");
        assert!(
            !h.dir.path().join("herald.db").exists(),
            "{var}: the database was opened before the refusal"
        );
    }
}

/// A database URL Herald cannot use is refused without being repeated: neither a libpq
/// key-value string nor a URL whose scheme was forgotten shows its password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_database_url_is_refused_without_its_password() {
    for url in [
        "host=db user=herald password=s3cret dbname=herald",
        "herald:s3cret@db:5432/herald",
        "mysql://herald:s3cret@db/herald",
    ] {
        let mut h = Herald::spawn(&["serve"], &[("HERALD_DATABASE_URL", url)]);
        let status = h.wait_exit(EXIT_WITHIN).await;
        let stderr = h.stderr();
        assert!(!status.success(), "{url}: {status}");
        assert!(stderr.contains("database"), "{url}: {stderr}");
        assert!(!stderr.contains("s3cret"), "{url}: {stderr}");
    }
}

/// A PostgreSQL URL whose password libpq cannot read (a raw `%`, an unencoded `@` and `/`):
/// libpq's error quotes the password, or a piece of it as a host name, and r2d2 carries that
/// text into the error `herald migrate` prints when it stops. It is shown without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_url_libpq_cannot_read_is_refused_without_its_password() {
    for (url, secrets) in [
        (
            "postgres://herald:ab%zz9@127.0.0.1:1/herald",
            &["ab%zz9", "zz9"][..],
        ),
        (
            "postgres://herald:p@ss/w0rd@127.0.0.1:1/herald",
            &["\"ss\"", "w0rd"][..],
        ),
        // libpq quotes the piece with the host after it ("CRET@127.0.0.1"); a password given
        // as a parameter (found by a walk-through).
        (
            "postgres://herald:PGSE@CRET@127.0.0.1:1/herald",
            &["CRET", "PGSE"][..],
        ),
        (
            "postgres://host=127.0.0.1 password=PGSECRET",
            &["PGSECRET"][..],
        ),
        (
            "postgres://127.0.0.1:1/herald?password=PGSECRET",
            &["PGSECRET"][..],
        ),
    ] {
        let mut h = Herald::spawn(&["migrate"], &[("HERALD_DATABASE_URL", url)]);
        let status = h.wait_exit(EXIT_WITHIN).await;
        let stderr = h.stderr();
        assert!(!status.success(), "{url}: {status}");
        assert!(stderr.contains("database"), "{url}: {stderr}");
        for secret in secrets {
            assert!(!stderr.contains(secret), "{url}: {secret} in {stderr}");
        }
    }
}

/// A command that runs and exits on PostgreSQL over TCP with a password ends with its own exit
/// status, never a crash (found by a walk-through: `herald migrate`, `explain`, `purge` and
/// `dlq list` died of SIGSEGV or a Kerberos assertion after their work, one run in three, when
/// the pool's thread was still opening a connection as the process exited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_on_postgres_with_a_password_exit_cleanly() {
    let cluster = crate::support::db::Cluster::start_new();
    cluster.create_database("cmds");
    let url = cluster.require_password("herald_pw", "pw-Sekr1t", "cmds");
    let env = [("HERALD_DATABASE_URL", url.as_str())];
    for round in 0..12 {
        for args in [&["migrate"][..], &["dlq", "list"][..], &["purge"][..]] {
            let mut h = Herald::spawn(args, &env);
            let status = h.wait_exit(EXIT_WITHIN).await;
            assert!(
                status.success(),
                "round {round}, herald {}: {status}\n{}",
                args.join(" "),
                h.stderr()
            );
        }
    }
    // A refusal no wait changes — a wrong password, a database that does not exist — is said
    // at once, on one line (it was said after the pool's 5 s wait, with libpq's line breaks),
    // without the password; by `serve` as by a command.
    for (url, says) in [
        (
            url.replace("pw-Sekr1t", "wrong-Pw9"),
            "password authentication failed",
        ),
        (url.replace("/cmds", "/no_such_db"), "does not exist"),
    ] {
        for args in [&["serve"][..], &["dlq", "list"][..]] {
            let mut h = Herald::spawn(args, &[("HERALD_DATABASE_URL", url.as_str())]);
            let status = h.wait_exit(EXIT_WITHIN).await;
            let stderr = h.stderr();
            assert_eq!(status.code(), Some(1), "{args:?} {says}: {stderr}");
            let last = stderr.lines().last().unwrap_or_default();
            assert!(
                last.contains("the database refused the connection") && last.contains(says),
                "{args:?}: {stderr}"
            );
            assert!(!stderr.contains("wrong-Pw9"), "{stderr}");
            assert!(!stderr.contains("pw-Sekr1t"), "{stderr}");
            assert!(!stderr.contains("timed out"), "{stderr}");
        }
    }
}

/// Polls `GET /v1/messages/{id}` until `done` holds for the view (bounded).
async fn wait_for_view(
    base: &str,
    id: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let http = client();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view: serde_json::Value = http
            .get(format!("{base}/v1/messages/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if done(&view) {
            return view;
        }
        assert!(Instant::now() < deadline, "not reached: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What Herald creates holds secrets and messages, so only its owner may read it (found by a
/// walk-through: herald.db, which holds the generated admin token and the webhook secret, and
/// each `.eml` were 0644 under the usual umask): the SQLite file and its WAL 0600, the mail
/// directory 0700, each `.eml` 0600.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_serve_creates_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let listen = free_addr();
    let base = format!("http://{listen}");
    // The usual umask, which lets others read what is created, so that the modes below are
    // Herald's doing (under 077 this test could not fail); the child inherits it at spawn.
    // SAFETY: umask only sets this process's file-creation mask.
    let before = unsafe { libc::umask(0o022) };
    let mut herald = Herald::spawn(&["serve"], &[("HERALD_LISTEN", listen.as_str())]);
    // SAFETY: as above, the mask as it was.
    unsafe { libc::umask(before) };
    herald.wait_healthy(&base).await;
    let r = client()
        .post(format!("{base}/v1/messages"))
        .json(
            &json!({"event_id": "mode-1", "channel": "email", "destination": "ada@example.com",
            "payload": {"subject": "Hi", "text": "Hello"}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    wait_for_view(&base, "mode-1", |v| v["state"] == "delivered").await;
    let dir = herald.dir.path().to_owned();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.join("herald.db")), 0o600);
    assert_eq!(mode(&dir.join("herald.db-wal")), 0o600);
    assert_eq!(mode(&dir.join("mail")), 0o700);
    let eml: Vec<_> = std::fs::read_dir(dir.join("mail"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "eml"))
        .collect();
    assert_eq!(eml.len(), 1);
    assert_eq!(mode(&eml[0]), 0o600);
    herald.stop_cleanly().await;
}

/// `herald serve` on SQLite closes the database before it exits on SIGTERM: the WAL is copied
/// into the database file and removed with `-shm`, so the file alone (an operator's copy of it)
/// holds everything, delivered states included. Threads holding the database (the HTTP workers'
/// state, the group writers) drop it a moment after the server stops; exiting before then left
/// the WAL behind in about half of the runs with traffic. Five runs, each with sends and
/// concurrent requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_sqlite_closes_the_database_before_it_exits() {
    let rx = crate::support::Receiver::start().await;
    for run in 0..5 {
        let listen = free_addr();
        let base = format!("http://{listen}");
        let mut herald = Herald::spawn(&["serve"], &[("HERALD_LISTEN", &listen)]);
        herald.wait_healthy(&base).await;
        let http = client();
        let ids: Vec<String> = (0..32).map(|i| format!("bin-close-{run}-{i}")).collect();
        let posts = ids.iter().map(|id| {
            http.post(format!("{base}/v1/messages"))
                .json(&crate::support::app::webhook(
                    id,
                    &rx.url,
                    json!({"run": run}),
                ))
                .send()
        });
        for r in futures_util::future::join_all(posts).await {
            assert_eq!(r.unwrap().status(), 201);
        }
        let reads = (0..16).map(|_| http.get(format!("{base}/readyz")).send());
        for r in futures_util::future::join_all(reads).await {
            assert_eq!(r.unwrap().status(), 200);
        }
        for id in &ids {
            wait_for_view(&base, id, |v| v["state"] == "delivered").await;
        }
        drop(http);

        let log = herald.stop_cleanly().await;
        assert!(!log.contains("still in use"), "run {run}: {log}");
        // Its connections without SQLite's per-call mutexes (each is used by one thread at a
        // time), under these sends and concurrent reads.
        assert!(
            log.contains("sqlite_threading=\"multi-thread\""),
            "run {run}: {log}"
        );
        let dir = herald.dir.path();
        for leftover in ["herald.db-wal", "herald.db-shm"] {
            assert!(
                !dir.join(leftover).exists(),
                "run {run}: {leftover} left behind after a clean exit; stderr:\n{log}"
            );
        }
        // The database file alone, copied elsewhere, has every delivered state.
        let copy = tempfile::tempdir().unwrap();
        std::fs::copy(dir.join("herald.db"), copy.path().join("herald.db")).unwrap();
        for id in &ids {
            assert_eq!(
                crate::support::db::state_in_database_file(&copy.path().join("herald.db"), id)
                    .as_deref(),
                Some("delivered"),
                "run {run}: {id}"
            );
        }
    }
    assert_eq!(rx.wait_for(160, 10).await.len(), 160);
}

/// The real binary reconciles on its own: a signed receipt posted to ingest becomes the
/// message's delivery status, and no send follows from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reconciles_receipts_in_the_background() {
    use hmac::{Hmac, Mac};
    let rx = crate::support::Receiver::start().await;
    let listen = free_addr();
    let base = format!("http://{listen}");
    let toml =
        "[sources.esp]\nscheme = \"hmac\"\nsecrets = [\"bin-esp\"]\nevent_time_pointer = \"/at\"\n";
    let mut herald = Herald::spawn_with_config(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_POLL_INTERVAL_MS", "100"),
        ],
        Some(toml),
    );
    herald.wait_healthy(&base).await;
    let http = client();
    let r = http
        .post(format!("{base}/v1/messages"))
        .json(&crate::support::app::webhook(
            "bin-rc-1",
            &rx.url,
            json!({"n": 1}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    wait_for_view(&base, "bin-rc-1", |v| v["state"] == "delivered").await;
    // A receipt signed as the `esp` source's; its answer's status.
    let post_receipt = |event: serde_json::Value| {
        let body = serde_json::to_vec(&event).unwrap();
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"bin-esp").unwrap();
        mac.update(&body);
        let r = http
            .post(format!("{base}/v1/ingest/esp"))
            .header("x-signature", hex::encode(mac.finalize().into_bytes()))
            .body(body);
        async move { r.send().await.unwrap().status() }
    };
    let status = post_receipt(json!({
        "id": "esp-1", "type": "bounced", "at": 1_800_000_000, "herald_event_id": "bin-rc-1"
    }))
    .await;
    assert_eq!(status, 200);
    let view = wait_for_view(&base, "bin-rc-1", |v| v["delivery_status"] == "bounced").await;
    assert_eq!(view["receipts"][0]["outcome"], "applied");
    assert_eq!(rx.requests().len(), 1, "a receipt never causes a send");
    // An event time the scheme cannot read (no zone): stored without one, and said in the log
    // with the source's name and the pointer (it was dropped without a word).
    let status = post_receipt(json!({
        "id": "esp-2", "type": "opened", "at": "2027-01-15T08:00:00", "herald_event_id": "bin-rc-1"
    }))
    .await;
    assert_eq!(status, 200);
    herald.stop_cleanly().await;
    let log = herald.stderr() + &herald.stdout();
    let warned = log
        .lines()
        .find(|l| l.contains("a receipt's event time is not one Herald reads"))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    assert!(
        warned.contains("WARN") && warned.contains("source=esp") && warned.contains("/at"),
        "{warned}"
    );
    assert!(!warned.contains("2027-01-15"), "not the value: {warned}");
}

/// `herald serve` on PostgreSQL stores a receipt at once after every connection it held was
/// ended while it was idle (the database itself up, as after a restart): ingest's group, one
/// statement committed by itself, runs again on a new connection when it failed at once on a
/// dead one — 200, not 503 — and is stored once. Nothing else in the process connects meanwhile
/// (no sender, no LISTEN, a reconciler woken only by ingest, a pool of two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stores_a_receipt_at_once_after_its_connections_were_ended() {
    use hmac::{Hmac, Mac};
    let db = crate::support::TestDb::new(crate::support::Backend::Postgres);
    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut herald = Herald::spawn_with_config(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_DATABASE_URL", &db.url),
            ("HERALD_DATABASE_POOL_SIZE", "2"),
            ("HERALD_SENDER_ENABLED", "false"),
            ("HERALD_LISTEN_NOTIFY", "false"),
            ("HERALD_RECONCILE_INTERVAL_MS", "3600000"),
        ],
        Some("[sources.esp]\nscheme = \"hmac\"\nsecrets = [\"bin-esp\"]\n"),
    );
    herald.wait_healthy(&base).await;
    let http = client();
    let post = |id: &str| {
        let body = serde_json::to_vec(&json!({"id": id, "type": "delivered"})).unwrap();
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"bin-esp").unwrap();
        mac.update(&body);
        http.post(format!("{base}/v1/ingest/esp"))
            .header("x-signature", hex::encode(mac.finalize().into_bytes()))
            .body(body)
            .send()
    };
    let first = post("esp-before").await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(db.end_connections().await > 0);
    let after = post("esp-after").await.unwrap();
    assert_eq!(after.status(), 200, "stderr:\n{}", herald.stderr());
    assert_eq!(
        after.json::<serde_json::Value>().await.unwrap(),
        json!({"stored": 1, "duplicates": 0})
    );
    let stderr = herald.stop_cleanly().await;
    assert!(!stderr.contains("group commit failed"), "{stderr}");
}

/// The SSRF guard in the real binary: with `HERALD_ALLOW_NETWORKS` unset a loopback receiver is
/// refused — its literal address with a 422 at enqueue, the name `localhost` at send time
/// (`permanent`, no request) — and with `HERALD_ALLOW_NETWORKS=127.0.0.0/8` it is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ssrf_guard_refuses_loopback_unless_allow_listed() {
    let rx = crate::support::Receiver::start().await;
    let by_name = rx.url.replace("127.0.0.1", "localhost");
    let http = client();
    let post = |base: String, id: &'static str, url: String| {
        let http = http.clone();
        async move {
            http.post(format!("{base}/v1/messages"))
                .json(&crate::support::app::webhook(id, &url, json!({"n": 1})))
                .send()
                .await
                .unwrap()
        }
    };

    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut herald = Herald::spawn(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_POLL_INTERVAL_MS", "100"),
            ("HERALD_ALLOW_NETWORKS", ""),
        ],
    );
    herald.wait_healthy(&base).await;
    let r = post(base.clone(), "bin-ssrf-1", rx.url.clone()).await;
    assert_eq!(r.status(), 422);
    let problem: serde_json::Value = r.json().await.unwrap();
    assert_eq!(problem["field"], "destination", "{problem}");
    assert!(problem.to_string().contains("(loopback)"), "{problem}");
    let r = post(base.clone(), "bin-ssrf-2", by_name.clone()).await;
    assert_eq!(r.status(), 201);
    let view = wait_for_view(&base, "bin-ssrf-2", |v| v["state"] == "dead_letter").await;
    assert_eq!(view["last_error_class"], "permanent", "{view}");
    herald.stop_cleanly().await;
    assert!(
        rx.requests().is_empty(),
        "no request may reach the receiver"
    );

    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut herald = Herald::spawn(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_POLL_INTERVAL_MS", "100"),
            ("HERALD_ALLOW_NETWORKS", "127.0.0.0/8"),
        ],
    );
    herald.wait_healthy(&base).await;
    for (id, url) in [("bin-ssrf-3", rx.url.clone()), ("bin-ssrf-4", by_name)] {
        let r = post(base.clone(), id, url).await;
        assert_eq!(r.status(), 201);
        wait_for_view(&base, id, |v| v["state"] == "delivered").await;
    }
    assert_eq!(rx.event_ids(), ["bin-ssrf-3", "bin-ssrf-4"]);
    herald.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_at_a_refused_address_is_refused_at_start_naming_its_key() {
    let toml = "[endpoints.app]\nurl = \"http://10.0.0.5/hooks\"\n";
    let mut h = Herald::spawn_with_config(
        &["serve"],
        &[("HERALD_ALLOW_NETWORKS", ""), ("RUST_BACKTRACE", "1")],
        Some(toml),
    );
    let status = h.wait_exit(EXIT_WITHIN).await;
    let stderr = h.stderr();
    assert_one_line_refusal(status, &stderr, "endpoints.app.url");
    assert!(
        stderr.contains("10.0.0.0/8 (private)") && stderr.contains("HERALD_ALLOW_NETWORKS"),
        "{stderr}"
    );
    // Allow-listed, it starts.
    let listen = free_addr();
    let mut h = Herald::spawn_with_config(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_ALLOW_NETWORKS", "10.0.0.0/24"),
        ],
        Some(toml),
    );
    h.wait_healthy(&format!("http://{listen}")).await;
    h.stop_cleanly().await;
}

/// Runs `herald serve` with `env`, sends one webhook to a path and body that must stay out of
/// the logs, and returns (stdout, stderr) after SIGTERM.
async fn logs_of_one_webhook(env: &[(&str, &str)]) -> (String, String) {
    let rx = crate::support::Receiver::start().await;
    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut all = vec![
        ("HERALD_LISTEN", listen.as_str()),
        ("HERALD_POLL_INTERVAL_MS", "100"),
    ];
    all.extend_from_slice(env);
    let mut herald = Herald::spawn(&["serve"], &all);
    herald.wait_healthy(&base).await;
    let url = rx.url_for("/secret-path-q7?token=tok-q7");
    let r = client()
        .post(format!("{base}/v1/messages"))
        .json(&crate::support::app::webhook(
            "bin-log-1",
            &url,
            json!({"marker": "body-marker-q7"}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    wait_for_view(&base, "bin-log-1", |v| v["state"] == "delivered").await;
    assert_eq!(rx.requests()[0].path, "/secret-path-q7?token=tok-q7");
    herald.stop_cleanly().await;
    (herald.stdout(), herald.stderr())
}

fn assert_no_path_body_or_colour(out: &str) {
    for secret in ["secret-path-q7", "tok-q7", "body-marker-q7"] {
        assert!(!out.contains(secret), "{secret} in the logs:\n{out}");
    }
    assert!(
        !out.contains('\u{1b}'),
        "an ANSI escape in the logs:\n{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_with_ids_and_hosts_only() {
    let (stdout, stderr) = logs_of_one_webhook(&[("HERALD_LOG_FORMAT", "json")]).await;
    assert_no_path_body_or_colour(&stdout);
    assert_no_path_body_or_colour(&stderr);
    let lines: Vec<&str> = stdout.lines().chain(stderr.lines()).collect();
    assert!(lines.len() >= 3, "{stderr}");
    let mut classified = None;
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
        if v["message"] == "attempt classified" {
            classified = Some(v);
        }
    }
    let v = classified.unwrap_or_else(|| panic!("no attempt log line:\n{stderr}"));
    assert_eq!(v["class"], "accepted", "{v}");
    assert_eq!(v["span"]["event_id"], "bin-log-1", "{v}");
    assert_eq!(v["span"]["host"], "127.0.0.1", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_to_a_pipe_have_no_colour_and_no_path_or_body() {
    let (stdout, stderr) = logs_of_one_webhook(&[]).await;
    assert_no_path_body_or_colour(&stdout);
    assert_no_path_body_or_colour(&stderr);
    assert!(stderr.contains("attempt classified"), "{stderr}");
    assert!(
        serde_json::from_str::<serde_json::Value>(stderr.lines().next().unwrap_or("")).is_err(),
        "text, not JSON: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_log_format_is_refused_in_one_line() {
    let (status, stderr) = refusal(&[("HERALD_LOG_FORMAT", "xml"), ("RUST_BACKTRACE", "1")]).await;
    assert_one_line_refusal(status, &stderr, "HERALD_LOG_FORMAT");
}

/// `herald healthcheck` (the Dockerfile's HEALTHCHECK): 0 while `herald serve` with the same
/// configuration answers `/healthz`, 1 with one line once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_exits_0_while_serving_and_1_after() {
    let listen = free_addr();
    let env = [("HERALD_LISTEN", listen.as_str())];
    let mut herald = Herald::spawn(&["serve"], &env);
    herald.wait_healthy(&format!("http://{listen}")).await;
    let mut probe = Herald::spawn(&["healthcheck"], &env);
    let status = probe.wait_exit(EXIT_WITHIN).await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", probe.stderr());
    assert_eq!(probe.stderr(), "", "a healthy probe prints nothing");
    herald.stop_cleanly().await;
    let mut probe = Herald::spawn(&["healthcheck"], &env);
    let status = probe.wait_exit(EXIT_WITHIN).await;
    let stderr = probe.stderr();
    assert_eq!(status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.starts_with("herald: unhealthy: ") && stderr.trim_end().lines().count() == 1,
        "{stderr}"
    );
    assert!(stderr.contains(&listen), "{stderr}");
    // A configuration it cannot load is unhealthy too: 1, never 2 (Docker reserves 2).
    let mut probe = Herald::spawn(&["healthcheck"], &[("HERALD_LOG_FORMAT", "xml")]);
    let status = probe.wait_exit(EXIT_WITHIN).await;
    let stderr = probe.stderr();
    assert_eq!(status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.starts_with("herald: unhealthy: invalid configuration: log_format"),
        "{stderr}"
    );
}

/// HEAD is taken wherever GET is (an uptime monitor probing `/healthz` with HEAD got 405, the
/// admin page 404): the GET's status and headers, no body; a method a path does not take names
/// HEAD beside GET in `Allow`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_is_answered_wherever_get_is_without_a_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listen = free_addr();
    let mut herald = Herald::spawn(&["serve"], &[("HERALD_LISTEN", listen.as_str())]);
    herald.wait_healthy(&format!("http://{listen}")).await;
    let raw = |request: String| {
        let listen = listen.clone();
        async move {
            let mut s = tokio::net::TcpStream::connect(&listen).await.unwrap();
            s.write_all(request.as_bytes()).await.unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).await.unwrap();
            String::from_utf8(out).unwrap()
        }
    };
    for (path, status, length) in [
        ("/healthz", "200", Some("3")),
        ("/admin/static/admin.css", "200", None),
        ("/admin/sign-in", "200", None),
        ("/openapi.json", "200", None),
        ("/v1/messages/x", "401", None),
        ("/no-such-path", "404", None),
    ] {
        let answer = raw(format!(
            "HEAD {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
        ))
        .await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{path}: {answer}"
        );
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert_eq!(body, "", "{path}: a body after HEAD");
        if let Some(n) = length {
            assert!(head.contains(&format!("content-length: {n}\r\n")), "{head}");
        }
    }
    let r = client()
        .put(format!("http://{listen}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET, HEAD");
    // But ingest, whose GET stores a receipt: HEAD has no effects, so it is a 405 there,
    // however its path is spelled.
    for path in ["/v1/ingest/anything", "/v1/%69ngest/anything"] {
        let r = client()
            .head(format!("http://{listen}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405, "{path}");
    }
    herald.stop_cleanly().await;
}

/// A 429 with `Retry-After: 2` pauses the whole destination in the real binary: its other
/// messages reach the receiver no sooner than 2 s after the 429, each on its first attempt, in
/// their order; another destination is not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_holds_the_destinations_other_messages_for_its_retry_after() {
    use crate::support::{Receiver, Reply};
    let slow = Receiver::start().await;
    let other = Receiver::start().await;
    slow.script([Reply::Full(
        429,
        vec![("Retry-After".into(), "2".into())],
        String::new(),
    )]);
    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut herald = Herald::spawn(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_POLL_INTERVAL_MS", "50"),
            ("HERALD_SENDER_CONCURRENCY", "1"),
        ],
    );
    herald.wait_healthy(&base).await;
    let http = client();
    let post = |id: &'static str, url: String| {
        let http = http.clone();
        let base = base.clone();
        async move {
            let r = http
                .post(format!("{base}/v1/messages"))
                .json(&crate::support::app::webhook(id, &url, json!({"id": id})))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201, "{id}");
        }
    };
    post("rl-1", slow.url.clone()).await;
    let first = slow.wait_for(1, 30).await;
    for id in ["rl-2", "rl-3", "rl-4"] {
        post(id, slow.url.clone()).await;
    }
    post("rl-o", other.url.clone()).await;
    other.wait_for(1, 30).await;
    let got = slow.wait_for(5, 30).await;
    let t429 = first[0].at;
    let held: Vec<_> = got
        .iter()
        .filter(|r| r.header("webhook-id") != Some("rl-1"))
        .collect();
    for r in &held {
        let after = r.at.duration_since(t429);
        assert!(
            after >= Duration::from_secs(2),
            "{:?} came {after:?} after the 429",
            r.header("webhook-id")
        );
    }
    let order: Vec<_> = held
        .iter()
        .map(|r| r.header("webhook-id").unwrap())
        .collect();
    assert_eq!(
        order,
        ["rl-2", "rl-3", "rl-4"],
        "held messages go in their order"
    );
    assert!(
        other.requests()[0].at.duration_since(t429) < Duration::from_secs(2),
        "another destination is not held"
    );
    // Attempt budgets untouched: one attempt each for the held ones, two for the 429'd one.
    for (id, attempts) in [("rl-1", 2), ("rl-2", 1), ("rl-3", 1), ("rl-4", 1)] {
        let v = wait_for_view(&base, id, |v| v["state"] == "delivered").await;
        assert_eq!(v["attempts"], attempts, "{id}: {v}");
    }
    herald.stop_cleanly().await;
}

/// A relay that is down, in the real binary: the first mails spend an attempt each (connection
/// refused) and the relay is paused (WARN, its `error_kind`, no address), the others wait without
/// spending one; once it listens again every mail is delivered, the held ones at their first
/// attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_is_down_is_paused_and_its_mail_goes_when_it_is_up() {
    use herald::sender::throttle::BURST_COUNT;
    let (socket, relay) = crate::support::down_until_listening();
    let listen = free_addr();
    let base = format!("http://{listen}");
    let smtp_url = format!("smtp://{relay}");
    let mut herald = Herald::spawn(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_SMTP_URL", &smtp_url),
            ("HERALD_POLL_INTERVAL_MS", "50"),
            ("HERALD_SENDER_CONCURRENCY", "1"),
            // The first pause 5 s, the next 10 s: what is counted below is read well within them.
            ("HERALD_RETRY_BASE_SECONDS", "5"),
        ],
    );
    herald.wait_healthy(&base).await;
    let http = client();
    let ids: Vec<String> = (0..10).map(|i| format!("relay-down-{i}")).collect();
    for id in &ids {
        let r = http
            .post(format!("{base}/v1/messages"))
            .json(
                &json!({"event_id": id, "channel": "email", "destination": "ada@example.com",
                          "payload": {"subject": "Hi", "text": "Hello"}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{id}");
    }
    // Each tried or held once.
    let mut spent = 0;
    for id in &ids {
        let v = wait_for_view(&base, id, |v| !v["last_error_class"].is_null()).await;
        spent += v["attempts"].as_i64().unwrap();
    }
    // A probe may have gone already, should this have taken longer than the 5 s pause.
    assert!(
        (BURST_COUNT as i64..=BURST_COUNT as i64 + 1).contains(&spent),
        "{spent} attempts for {} mails",
        ids.len()
    );
    let relay_paused = |metrics: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("herald_paused_destinations{channel=\"email\"} "))
            .map(str::to_owned)
    };
    let metrics = || async {
        let r = http.get(format!("{base}/metrics")).send().await.unwrap();
        r.text().await.unwrap()
    };
    assert_eq!(relay_paused(&metrics().await).as_deref(), Some("1"));
    let sink = SmtpSink::start_on(socket.listen(64).unwrap());
    let mut first_time = 0;
    for id in &ids {
        let v = wait_for_view(&base, id, |v| v["state"] == "delivered").await;
        first_time += i32::from(v["attempts"] == 1);
    }
    assert!(
        first_time >= (ids.len() - BURST_COUNT - 1) as i32,
        "{first_time} delivered at their first attempt"
    );
    assert_eq!(sink.accepted().len(), ids.len());
    assert_eq!(relay_paused(&metrics().await).as_deref(), Some("0"));
    herald.stop_cleanly().await;
    let log = herald.stderr();
    assert!(
        log.lines()
            .any(|l| l.contains("destination slowed down") && l.contains("error_kind=\"connect\"")),
        "{log}"
    );
    assert!(!log.contains("ada@"), "no address in the log");
}

/// Auto-disable in the real binary: the operational event is logged (by endpoint name, never its
/// URL), `herald endpoint list` shows it and `herald endpoint enable` ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_endpoint_is_disabled_and_the_cli_enables_it() {
    use crate::support::{Receiver, Reply};
    let rx = Receiver::start().await;
    rx.script([Reply::Status(503), Reply::Status(503)]);
    let listen = free_addr();
    let base = format!("http://{listen}");
    let toml = format!(
        "[endpoints.flaky]\nurl = \"{}\"\ndisable_after_failures = 2\n",
        rx.url_for("/secret-path")
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("herald.toml"), &toml).unwrap();
    let db = format!("sqlite://{}", dir.path().join("herald.db").display());
    let config = dir.path().join("herald.toml").display().to_string();
    let env = [
        ("HERALD_LISTEN", listen.as_str()),
        ("HERALD_DATABASE_URL", db.as_str()),
        ("HERALD_API_TOKEN", BIN_TOKEN),
        ("HERALD_POLL_INTERVAL_MS", "50"),
        ("HERALD_RETRY_BASE_SECONDS", "0.1"),
    ];
    let mut herald = Herald::spawn_in(dir, &["serve"], &env, None);
    herald.wait_healthy(&base).await;
    let r = client()
        .post(format!("{base}/v1/messages"))
        .json(
            &json!({"event_id": "ad-1", "channel": "webhook", "destination": "endpoint:flaky",
                      "payload": {"body": {}}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    rx.wait_for(2, 30).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let v: serde_json::Value = client()
            .get(format!("{base}/v1/endpoints"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if v["endpoints"][0]["disabled"] == true {
            break v;
        }
        assert!(Instant::now() < deadline, "not disabled: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!listed.to_string().contains("secret-path"), "{listed}");
    let log = herald.stop_cleanly().await;
    assert!(
        log.contains("endpoint disabled") && log.contains("flaky"),
        "{log}"
    );
    assert!(
        !log.contains("secret-path"),
        "no URL path in the logs:\n{log}"
    );

    let cli = [
        ("HERALD_DATABASE_URL", db.as_str()),
        (
            "HERALD_ALLOW_NETWORKS",
            crate::support::app::TEST_ALLOW_NETWORKS,
        ),
    ];
    let list = run_herald(&["--config", &config, "endpoint", "list"], &cli);
    assert!(list.starts_with("flaky\tdisabled since "), "{list}");
    let enabled = run_herald(&["--config", &config, "endpoint", "enable", "flaky"], &cli);
    assert_eq!(enabled.trim(), "flaky: enabled");
    let list = run_herald(&["--config", &config, "endpoint", "list"], &cli);
    assert_eq!(list.trim(), "flaky\tenabled");
    assert_eq!(rx.requests().len(), 2, "nothing was sent while disabled");
}

/// Refused receipts show in `herald serve`'s log at the default level, as a wrong provider
/// secret must, without flooding it: the first refusal of a source at warn (its source, scheme
/// and reason, never the secret or the signature), the next ones within the minute left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_logs_the_first_refused_receipt_of_a_source_at_warn() {
    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut herald = Herald::spawn_with_config(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_SENDER_ENABLED", "false"),
        ],
        Some("[sources.esp]\nscheme = \"hmac\"\nsecrets = [\"bin-esp-secret\"]\n"),
    );
    herald.wait_healthy(&base).await;
    let http = client();
    for signature in ["5ec7e7519a7", "0badc0de00", "0badc0de01"] {
        let r = http
            .post(format!("{base}/v1/ingest/esp"))
            .header("x-signature", signature)
            .body(r#"{"id": "r-1", "type": "delivered"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
    }
    let log = herald.stop_cleanly().await;
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("receipt refused"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    let line = lines[0];
    assert!(
        line.contains("WARN")
            && line.contains("source=esp")
            && line.contains("scheme=hmac")
            && line.contains("reason=")
            && line.contains("refused_since_last_line=0"),
        "{line}"
    );
    assert!(
        !log.contains("bin-esp-secret") && !log.contains("5ec7e7519a7"),
        "{log}"
    );
}

/// Requests the HTTP server cannot read (a control character in a header) are answered 400
/// without a log line each: one ERROR line per request let anyone fill the log at the default
/// level (a hostile-input walk-through). `RUST_LOG` naming `actix_http` shows them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_requests_do_not_fill_the_log() {
    use std::io::{Read, Write};
    for (rust_log, logged) in [(None, false), (Some("info,actix_http=debug"), true)] {
        let listen = free_addr();
        let base = format!("http://{listen}");
        let mut env = vec![
            ("HERALD_LISTEN", listen.as_str()),
            ("HERALD_SENDER_ENABLED", "false"),
        ];
        env.extend(rust_log.map(|v| ("RUST_LOG", v)));
        let mut herald = Herald::spawn_with_config(&["serve"], &env, None);
        herald.wait_healthy(&base).await;
        for _ in 0..20 {
            let mut s = std::net::TcpStream::connect(&listen).unwrap();
            s.write_all(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Bad: \x01\r\n\r\n")
                .unwrap();
            let mut answer = Vec::new();
            s.read_to_end(&mut answer).unwrap();
            let answer = String::from_utf8_lossy(&answer);
            assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        }
        let log = herald.stop_cleanly().await;
        let lines = log
            .lines()
            .filter(|l| l.contains("actix_http") && l.contains("parse error"))
            .count();
        if logged {
            assert!(lines >= 20, "{log}");
        } else {
            assert_eq!(lines, 0, "{log}");
        }
    }
}

/// With two receipt sources, one without `matches` could settle the other provider's messages:
/// `herald serve` names it at warn when it starts, and names none once each has `matches`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_warns_of_receipt_sources_that_speak_for_every_message() {
    for (matches, warned) in [("", Some("sources=esp")), ("matches = [\"email\"]\n", None)] {
        let listen = free_addr();
        let base = format!("http://{listen}");
        let toml = format!(
            "[sources.esp]\nscheme = \"hmac\"\nsecrets = [\"bin-esp-secret\"]\n{matches}\
             [sources.mail]\nscheme = \"hmac\"\nsecrets = [\"bin-mail\"]\nmatches = [\"email\"]\n"
        );
        let mut herald = Herald::spawn_with_config(
            &["serve"],
            &[
                ("HERALD_LISTEN", &listen),
                ("HERALD_SENDER_ENABLED", "false"),
            ],
            Some(&toml),
        );
        herald.wait_healthy(&base).await;
        let log = herald.stop_cleanly().await;
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("receipt sources without matches"))
            .collect();
        match warned {
            Some(names) => {
                assert_eq!(lines.len(), 1, "{log}");
                assert!(
                    lines[0].contains("WARN") && lines[0].contains(names),
                    "{}",
                    lines[0]
                );
                assert!(!lines[0].contains("mail"), "{}", lines[0]);
            }
            None => assert!(lines.is_empty(), "{log}"),
        }
        assert!(!log.contains("bin-esp-secret"), "{log}");
    }
}

/// A running `herald serve`: `/metrics` parses as Prometheus text, counts what the process did,
/// and carries no label from the traffic (event ids, URLs, hosts, paths); `/readyz` is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_exposes_bounded_metrics_that_count_its_work() {
    use crate::support::Reply;
    use crate::support::prom::{assert_bounded_labels, scrape, value};
    use hmac::{Hmac, Mac};
    let rx = crate::support::Receiver::start().await;
    let listen = free_addr();
    let base = format!("http://{listen}");
    let toml = "[sources.esp]\nscheme = \"hmac\"\nsecrets = [\"bin-esp\"]\n";
    let mut herald = Herald::spawn_with_config(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_POLL_INTERVAL_MS", "100"),
        ],
        Some(toml),
    );
    herald.wait_healthy(&base).await;
    let http = client();
    let mark = "bin-metrics-5d2e";
    let ids: Vec<String> = (0..3).map(|i| format!("{mark}:{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let path = format!("/{mark}/{i}");
        rx.script_path(&path, [Reply::Status(if i == 2 { 400 } else { 200 })]);
        let r = http
            .post(format!("{base}/v1/messages"))
            .json(&crate::support::app::webhook(
                id,
                &rx.url_for(&path),
                json!({"i": i}),
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    wait_for_view(&base, &ids[0], |v| v["state"] == "delivered").await;
    wait_for_view(&base, &ids[1], |v| v["state"] == "delivered").await;
    wait_for_view(&base, &ids[2], |v| v["state"] == "dead_letter").await;
    let body = serde_json::to_vec(&json!({"id": format!("{mark}-r"), "type": "delivered",
                                          "herald_event_id": ids[0]}))
    .unwrap();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"bin-esp").unwrap();
    mac.update(&body);
    let r = http
        .post(format!("{base}/v1/ingest/esp"))
        .header("x-signature", hex::encode(mac.finalize().into_bytes()))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // An outcome is counted just after its commit: the dead letter's state can be seen a moment
    // before its count (a bounded wait on that counter alone).
    let deadline = Instant::now() + Duration::from_secs(30);
    let (text, s) = loop {
        let (text, s) = scrape(&http, &base).await;
        if value(&s, "herald_dead_letters_total", &[("reason", "permanent")]) >= 1.0 {
            break (text, s);
        }
        assert!(
            Instant::now() < deadline,
            "the dead letter is never counted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_bounded_labels(&s, &["esp"]);
    for needle in [mark, "@", "http://", listen.as_str(), rx.url.as_str()] {
        assert!(!text.contains(needle), "{needle:?} in /metrics:\n{text}");
    }
    let host = rx
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/hook");
    assert!(!text.contains(host), "{host} in /metrics:\n{text}");
    let attempts = |class| {
        value(
            &s,
            "herald_attempts_total",
            &[("channel", "webhook"), ("class", class)],
        )
    };
    assert_eq!((attempts("accepted"), attempts("permanent")), (2.0, 1.0));
    assert_eq!(
        value(&s, "herald_dead_letters_total", &[("reason", "permanent")]),
        1.0
    );
    assert_eq!(
        value(
            &s,
            "herald_receipts_total",
            &[("source", "esp"), ("verdict", "stored")]
        ),
        1.0
    );
    assert_eq!(value(&s, "herald_messages", &[("state", "delivered")]), 2.0);
    // The sender loop runs here: its heartbeat is fresh (well within the 60 s lease).
    let beat = value(&s, "herald_sender_heartbeat_age_seconds", &[]);
    assert!((0.0..30.0).contains(&beat), "{beat}");
    // On SQLite, the checkpointer's gauges: one series each (`value` requires exactly one),
    // its passes not failing.
    assert_eq!(value(&s, "herald_sqlite_checkpoint_failing", &[]), 0.0);
    value(&s, "herald_sqlite_wal_frames", &[]);
    value(&s, "herald_sqlite_wal_frames_held", &[]);
    let r = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap(),
        json!({"status": "ready"})
    );
    herald.stop_cleanly().await;
}

/// The real binary fans out and purges on its own: `type:` to two subscribed endpoints, each
/// child delivered once with its own event id; once the children are older than the retention
/// age, the server's background pass deletes them (and the fan-out's link), and shutdown stops
/// that task cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_fans_out_and_purges_in_the_background() {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    let (a, b) = (
        crate::support::Receiver::start().await,
        crate::support::Receiver::start().await,
    );
    let listen = free_addr();
    let base = format!("http://{listen}");
    let toml = format!(
        "[endpoints.a]\nurl = \"{}\"\nevent_types = [\"order.*\"]\n\
         [endpoints.b]\nurl = \"{}\"\nevent_types = [\"*\"]\n",
        a.url, b.url
    );
    let mut herald = Herald::spawn_with_config(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_POLL_INTERVAL_MS", "100"),
            ("HERALD_RETENTION_INTERVAL_SECONDS", "1"),
        ],
        Some(&toml),
    );
    herald.wait_healthy(&base).await;
    let r = client()
        .post(format!("{base}/v1/messages"))
        .json(&json!({"event_id": "bin-fan", "channel": "webhook",
                      "destination": "type:order.placed", "payload": {"body": {"n": 1}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let view = wait_for_view(&base, "bin-fan", |v| {
        v["messages"]
            .as_array()
            .is_some_and(|m| m.len() == 2 && m.iter().all(|m| m["state"] == "delivered"))
    })
    .await;
    assert_eq!(view["endpoints"], json!(["a", "b"]));
    assert_eq!(a.event_ids(), ["bin-fan:a"]);
    assert_eq!(b.event_ids(), ["bin-fan:b"]);
    // Age the children past the default 30 days, as time would.
    let path = herald.dir.path().join("herald.db");
    let mut c = diesel::sqlite::SqliteConnection::establish(path.to_str().unwrap()).unwrap();
    c.batch_execute(
        "PRAGMA busy_timeout = 5000; \
         UPDATE herald_outbox SET updated_at = '2020-01-01 00:00:00.000+00:00'",
    )
    .unwrap();
    wait_for_view(&base, "bin-fan:a", |v| v["status"] == 404).await;
    wait_for_view(&base, "bin-fan", |v| v["status"] == 404).await;
    herald.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_offers_the_admin_page_and_its_sessions_survive_a_restart() {
    use crate::support::admin::{client as no_redirects, form, session_cookie};
    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut herald = Herald::spawn(&["serve"], &[("HERALD_LISTEN", &listen)]);
    herald.wait_healthy(&base).await;
    let http = no_redirects();
    let r = http.get(format!("{base}/admin")).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/admin/sign-in");
    let r = http
        .get(format!("{base}/admin/sign-in"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-security-policy"], herald::admin::CSP);
    // HERALD_API_TOKEN is an admin token: it signs in.
    let r = http
        .post(format!("{base}/admin/sign-in"))
        .header("origin", &base)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", BIN_TOKEN)]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let (cookie, _) = session_cookie(&r);
    let page = |cookie: String| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            http.get(format!("{base}/admin"))
                .header("cookie", cookie)
                .send()
                .await
                .unwrap()
        }
    };
    let r = page(cookie.clone()).await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("default (admin)"));
    herald.stop_cleanly().await;

    // The session key is in the database: after a restart the session still holds.
    let dir = std::mem::replace(&mut herald.dir, tempfile::tempdir().unwrap());
    let mut again = Herald::spawn_in(
        dir,
        &["serve"],
        &[("HERALD_API_TOKEN", BIN_TOKEN), ("HERALD_LISTEN", &listen)],
        None,
    );
    again.wait_healthy(&base).await;
    assert_eq!(page(cookie.clone()).await.status(), 200);
    let log = again.stop_cleanly().await;
    let value = cookie.split_once('=').unwrap().1;
    assert!(!log.contains(BIN_TOKEN) && !log.contains(value), "{log}");
}

/// A running `herald serve` answers `GET /openapi.json` without a token: the document the
/// library generates, OpenAPI 3, listing the contract's routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_its_openapi_document_without_a_token() {
    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut herald = Herald::spawn(&["serve"], &[("HERALD_LISTEN", &listen)]);
    herald.wait_healthy(&base).await;
    let r = reqwest::get(format!("{base}/openapi.json")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let served: serde_json::Value = r.json().await.unwrap();
    assert!(served["openapi"].as_str().unwrap().starts_with("3."));
    assert!(served["paths"]["/v1/messages"]["post"].is_object());
    assert!(served["paths"]["/openapi.json"]["get"].is_object());
    let generated = serde_json::to_value(herald::http::openapi::document()).unwrap();
    assert_eq!(served, generated);
    herald.stop_cleanly().await;
}

/// Every PostgreSQL connection of `herald serve` (the pool's, the LISTEN thread's) has TCP
/// keepalive probing after 10 s idle, as the operating system shows its sockets (`ss -o`):
/// Herald adds libpq's keepalive settings to a URL that does not name them. With the system's
/// defaults the first probe goes after two hours, and a connection whose peer vanished (a
/// failover, a partition) waits for an answer that long. So does the server's end of each
/// (`ServerKeepalive`): a session whose client gave up on it across a partition would otherwise
/// live on for two hours, holding whatever its transaction held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_probe_a_silent_peer_on_both_ends() {
    let db = crate::support::TestDb::new(crate::support::Backend::Postgres);
    // postgres://[user@]host[:port]/db; the port is 5432 unless named.
    let authority = db
        .url
        .split_once("://")
        .and_then(|(_, r)| r.split('/').next())
        .map(|a| a.rsplit_once('@').map_or(a, |(_, host)| host))
        .unwrap_or_default();
    let port = authority
        .rsplit_once(':')
        .map_or("5432", |(_, p)| p)
        .to_owned();
    let listen = free_addr();
    let mut herald = Herald::spawn(
        &["serve"],
        &[
            ("HERALD_DATABASE_URL", db.url.as_str()),
            ("HERALD_LISTEN", listen.as_str()),
        ],
    );
    herald.wait_healthy(&format!("http://{listen}")).await;
    let pid = format!("pid={},", herald.child.id());
    // `ss -H` with a state: Recv-Q, Send-Q, local address, peer address, process, timer.
    let ends = |line: &str| -> (String, String) {
        let mut cols = line.split_whitespace().skip(2);
        (
            cols.next().unwrap_or_default().to_owned(),
            cols.next().unwrap_or_default().to_owned(),
        )
    };
    // The server's end is on this machine, where `ss` sees it, and at its default settings, only
    // on the harness's own cluster (not a server of `HERALD_TEST_DATABASE_URL`).
    let own_server = std::env::var_os("HERALD_TEST_DATABASE_URL").is_none();
    // Seconds until a socket's next keepalive probe (`9.5sec`, `950ms`; empty when it is due;
    // `119min` with the system's defaults); `None` without a keepalive timer, or with another
    // one running (`timer:(on,…)`: waiting for an acknowledgement).
    let probe_in = |line: &str| -> Option<f64> {
        let timer = line.split("timer:(keepalive,").nth(1)?.split(',').next()?;
        if timer.is_empty() {
            return Some(0.0);
        }
        match (timer.strip_suffix("ms"), timer.strip_suffix("sec")) {
            (Some(ms), _) => ms.parse::<f64>().ok().map(|v| v / 1000.0),
            (_, Some(sec)) => sec.parse::<f64>().ok(),
            _ => Some(f64::INFINITY),
        }
    };
    // Herald's sockets to the database and the server's end of each (its local address is
    // Herald's peer, its peer Herald's local), looked at again until both the pool's idle
    // connection and the LISTEN thread's are open and every end probes within 10 s — a socket
    // seen between its connect and Herald's settings still has the system's timer.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ss = Command::new("ss")
            .args(["-tnopH", "state", "established"])
            .output()
            .expect("run ss");
        let out = String::from_utf8_lossy(&ss.stdout).into_owned();
        let mine: Vec<&str> = out
            .lines()
            .filter(|l| l.contains(&pid) && l.contains(&format!(":{port} ")))
            .collect();
        let servers: Vec<Option<&str>> = mine
            .iter()
            .map(|line| {
                let (local, peer) = ends(line);
                out.lines()
                    .find(|l| ends(l) == (peer.clone(), local.clone()))
            })
            .collect();
        let mut checked: Vec<Option<&str>> = mine.iter().copied().map(Some).collect();
        if own_server {
            checked.extend(&servers);
        }
        let late: Vec<String> = checked
            .iter()
            .filter(|l| l.and_then(probe_in).is_none_or(|s| s > 10.0))
            .map(|l| l.unwrap_or("(no server end found)").to_owned())
            .collect();
        if mine.len() >= 2 && late.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ends of herald's connections that do not probe within 10 s:\n{}\nall:\n{out}",
            late.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    herald.stop_cleanly().await;
}

/// `herald serve` on PostgreSQL, end to end, under concurrent enqueues (plain ones go to its
/// group writer; whether they shared commits is checked in-process, `group_commit::*`): 24
/// plain messages, the same event id three times and 3 keyed messages, all at once. Each answer is
/// what a request alone gets (201 for each new id, one 201 and two 200s for the repeated id),
/// every message is delivered once, and the repeated id's message was written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_concurrent_enqueues_as_each_alone() {
    let db = crate::support::TestDb::new(crate::support::Backend::Postgres);
    let rx = crate::support::Receiver::start().await;
    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut herald = Herald::spawn(
        &["serve"],
        &[
            ("HERALD_DATABASE_URL", db.url.as_str()),
            ("HERALD_LISTEN", listen.as_str()),
            ("HERALD_POLL_INTERVAL_MS", "100"),
        ],
    );
    herald.wait_healthy(&base).await;
    let http = client();
    let mut bodies: Vec<serde_json::Value> = (0..24)
        .map(|i| crate::support::app::webhook(&format!("bin-g-{i}"), &rx.url, json!({"n": i})))
        .collect();
    for _ in 0..3 {
        bodies.push(crate::support::app::webhook(
            "bin-g-same",
            &rx.url,
            json!({"n": "same"}),
        ));
    }
    for k in 0..3 {
        let mut keyed = crate::support::app::webhook(&format!("bin-g-k{k}"), &rx.url, json!({}));
        keyed["ordering_key"] = json!(format!("key-{k}"));
        bodies.push(keyed);
    }
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let (http, url) = (http.clone(), format!("{base}/v1/messages"));
            tokio::spawn(async move {
                let r = http.post(url).json(&body).send().await.unwrap();
                let status = r.status().as_u16();
                let view: serde_json::Value = r.json().await.unwrap();
                (
                    status,
                    view["event_id"].as_str().unwrap_or_default().to_owned(),
                )
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let of = |id: &str| -> Vec<u16> {
        let mut s: Vec<u16> = answers.iter().filter(|a| a.1 == id).map(|a| a.0).collect();
        s.sort();
        s
    };
    for i in 0..24 {
        assert_eq!(of(&format!("bin-g-{i}")), [201], "{answers:?}");
    }
    assert_eq!(of("bin-g-same"), [200, 200, 201], "{answers:?}");
    for k in 0..3 {
        assert_eq!(of(&format!("bin-g-k{k}")), [201], "{answers:?}");
    }
    rx.wait_for(28, 30).await;
    let view = wait_for_view(&base, "bin-g-same", |v| v["state"] == "delivered").await;
    assert_eq!(view["attempts"], 1);
    herald.stop_cleanly().await;
    // Stopped: every request it made is in; one each.
    let mut ids: Vec<String> = rx.event_ids();
    let sent = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!((sent, ids.len()), (28, 28), "{ids:?}");
}

/// `herald serve` on PostgreSQL, listening, with a poll of ten minutes, so that within the test
/// only wake-ups and its promise to stay awake (`sender::awake`) find a row. Eight application
/// connections insert 1,920 due rows in 40 rounds: in each, five quick transactions 2 ms apart,
/// then one held open 15–40 ms after its insert; then, once every row of the round is delivered
/// (within 5 s, or the test fails), a pause of 15–25 ms for all. So the sender becomes awake on
/// the quick ones, stops finding rows while the held ones are open, and settles with them open
/// across it — rows whose wake-up was skipped, committed after the sender's claims stopped
/// finding anything. Every row is delivered once, each round's before the next round could wake
/// the sender, and fewer wake-ups were sent than transactions committed (the promise skipped the
/// others).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_skips_wake_ups_while_awake_and_leaves_no_row_to_the_poll_postgres() {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    use rand::Rng;
    const THREADS: usize = 8;
    const ROUNDS: usize = 40;
    const QUICK: usize = 5;
    let db = crate::support::TestDb::new(crate::support::Backend::Postgres);
    let rx = crate::support::Receiver::start().await;
    let mut admin = diesel::pg::PgConnection::establish(&db.url).unwrap();
    // Registered: from now on an insert of a due row wakes it, unless it is awake.
    let (mut herald, base) = listening_without_poll(&db.url, &mut admin, 1).await;
    let mut wake_ups = diesel::pg::PgConnection::establish(&db.url).unwrap();
    wake_ups
        .batch_execute("LISTEN herald_outbox; LISTEN herald_test_sentinel")
        .unwrap();
    let rounds = std::sync::Arc::new(std::sync::Barrier::new(THREADS));
    // A round whose rows were not all delivered within its time: every thread stops.
    let left = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..THREADS)
        .map(|t| {
            let (url, dest) = (db.url.clone(), rx.url.clone());
            let (rounds, left) = (rounds.clone(), left.clone());
            std::thread::spawn(move || {
                let mut c = diesel::pg::PgConnection::establish(&url).unwrap();
                let mut rng = rand::rng();
                let mut n = 0;
                for _ in 0..ROUNDS {
                    for held in (0..=QUICK).map(|k| k == QUICK) {
                        c.batch_execute(&format!(
                            "BEGIN; INSERT INTO herald_outbox (event_id, channel, destination, \
                             payload) VALUES ('awake-{t}-{n}', 'webhook', '{dest}', \
                             '{{\"body\": {n}}}')"
                        ))
                        .unwrap();
                        n += 1;
                        // The held one: open across the sender's change from awake to
                        // settling.
                        let ms = if held { rng.random_range(15..40) } else { 0 };
                        std::thread::sleep(Duration::from_millis(ms));
                        c.batch_execute("COMMIT").unwrap();
                        if !held {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                    }
                    // Every row of the round delivered before the next round's inserts could
                    // wake the sender for it.
                    if rounds.wait().is_leader() {
                        let deadline = Instant::now() + Duration::from_secs(5);
                        while pg_count(&mut c, UNDELIVERED) > 0 && Instant::now() < deadline {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        if pg_count(&mut c, UNDELIVERED) > 0 {
                            left.store(true, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                    rounds.wait();
                    if left.load(std::sync::atomic::Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(rng.random_range(15..25)));
                }
            })
        })
        .collect();
    tokio::task::spawn_blocking(move || load.into_iter().for_each(|h| h.join().unwrap()))
        .await
        .unwrap();
    assert!(
        !left.load(std::sync::atomic::Ordering::SeqCst),
        "a row was left to the poll:\n{}",
        herald.stderr()
    );
    let all = THREADS * ROUNDS * (QUICK + 1);
    let got = rx.wait_for(all, 60).await;
    let mut ids: Vec<String> = rx.event_ids();
    ids.sort();
    ids.dedup();
    assert_eq!((got.len(), ids.len()), (all, all), "each row once");
    admin.batch_execute("NOTIFY herald_test_sentinel").unwrap();
    let woke = tokio::task::spawn_blocking(move || {
        crate::foundation::notifications_until_sentinel(&mut wake_ups)
            .iter()
            .filter(|c| *c == "herald_outbox")
            .count()
    })
    .await
    .unwrap();
    eprintln!("{all} transactions committed, {woke} wake-ups sent");
    assert!(woke < all, "no wake-up was skipped: {woke}");
    // Nothing more to find: the sender withdrew its promise (or it lapsed).
    let deadline = Instant::now() + Duration::from_secs(10);
    while pg_count(&mut admin, PROMISED) == 1 {
        assert!(
            Instant::now() < deadline,
            "the promise stands with nothing to find"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // What an operator sees: it became awake, and is no longer.
    let (_, samples) = crate::support::prom::scrape(&client(), &base).await;
    let value = |name: &str| crate::support::prom::value(&samples, name, &[]);
    assert!(value("herald_sender_awake_periods_total") >= 1.0);
    assert_eq!(value("herald_sender_awake"), 0.0);
    let stderr = herald.stop_cleanly().await;
    assert_eq!(
        rx.requests().len(),
        all,
        "no request after the last: {stderr}"
    );
}

/// Rows not (yet) delivered.
const UNDELIVERED: &str = "SELECT count(*) FROM herald_outbox WHERE state <> 'delivered'";
/// 1 while a sender's promise to stay awake stands, else 0.
const PROMISED: &str = "SELECT CASE WHEN last_value > \
    (extract(epoch FROM clock_timestamp()) * 1000)::bigint THEN 1::int8 ELSE 0::int8 END \
    FROM herald_awake";

/// A count (`SELECT count(*) …` or another `int8`) on PostgreSQL.
fn pg_count(c: &mut diesel::pg::PgConnection, sql: &str) -> i64 {
    use diesel::RunQueryDsl;
    diesel::dsl::sql::<diesel::sql_types::BigInt>(sql)
        .get_result(c)
        .unwrap()
}

/// `herald serve` on the PostgreSQL database at `url`, listening, with a poll of ten minutes
/// (so that within a test only wake-ups and promises to stay awake find rows); returned once
/// it is healthy and `listeners` Herald processes are registered as listening; with its base
/// URL.
async fn listening_without_poll(
    url: &str,
    admin: &mut diesel::pg::PgConnection,
    listeners: i64,
) -> (Herald, String) {
    let listen = free_addr();
    let mut herald = Herald::spawn_with_config(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_DATABASE_URL", url),
            ("HERALD_POLL_INTERVAL_MS", "600000"),
        ],
        None,
    );
    let base = format!("http://{listen}");
    herald.wait_healthy(&base).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while pg_count(admin, "SELECT count(*) FROM herald_listeners") < listeners {
        assert!(
            Instant::now() < deadline,
            "never listened:\n{}",
            herald.stderr()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (herald, base)
}
/// A Herald that stops while awake hands over the rows whose wake-up its promise skipped
/// (`sender::awake`). Herald A, listening, is kept finding rows until it promises to stay awake;
/// then an application transaction inserts a due row while the promise stands and stays open.
/// Herald B starts once every other row is delivered (so it has nothing to find and sleeps),
/// both with a poll of ten minutes. A is stopped; once its claims have ended (its log says it
/// is handing over), the transaction commits. Only A's NOTIFY after that commit can wake B for
/// the row: B delivers it. Fails with the hand-over's NOTIFY left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_herald_stopping_while_awake_wakes_another_for_the_rows_it_promised_postgres() {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    use diesel::pg::PgConnection;
    let db = crate::support::TestDb::new(crate::support::Backend::Postgres);
    let rx = crate::support::Receiver::start().await;
    let insert = |id: &str| {
        format!(
            "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
             VALUES ('{id}', 'webhook', '{}', '{{\"body\": 1}}');",
            rx.url
        )
    };
    let mut admin = PgConnection::establish(&db.url).unwrap();
    let (mut a, _) = listening_without_poll(&db.url, &mut admin, 1).await;
    // Rows for A, until an insert finds A's promise standing (checked in its own transaction,
    // right after the insert whose trigger looked at it); then that transaction stays open.
    let mut app = PgConnection::establish(&db.url).unwrap();
    let mut skipper = PgConnection::establish(&db.url).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    loop {
        assert!(Instant::now() < deadline, "A never promised to stay awake");
        app.batch_execute(&insert(&format!("burst-{n}"))).unwrap();
        n += 1;
        if pg_count(&mut admin, PROMISED) == 1 {
            skipper
                .batch_execute(&format!("BEGIN; {}", insert("handed-over")))
                .unwrap();
            if pg_count(&mut skipper, PROMISED) == 1 {
                break;
            }
            skipper.batch_execute("ROLLBACK").unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Every other row delivered: B will find nothing.
    rx.wait_for(n, 30).await;
    let (mut b, _) = listening_without_poll(&db.url, &mut admin, 2).await;
    a.sigterm();
    a.wait_for_log("stopping while awake", Duration::from_secs(10))
        .await;
    skipper.batch_execute("COMMIT").unwrap();
    let got = rx.wait_for(n + 1, 20).await;
    assert!(
        got.iter()
            .any(|r| r.header("webhook-id") == Some("handed-over")),
        "B delivered the row"
    );
    assert!(a.terminate().await.success(), "{}", a.stderr());
    b.stop_cleanly().await;
}

/// A client that stops sending in the middle of a request body — on ingest, which takes no
/// credential — is answered 408 once `HERALD_BODY_READ_TIMEOUT_MS` has passed and its
/// connection closed: it no longer holds the connection and its buffer for good. A body that
/// arrives in time is served as ever; a length declared over the limit is a 413 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_stalls_is_answered_408_and_its_connection_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut herald = Herald::spawn_with_config(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_BODY_READ_TIMEOUT_MS", "500"),
        ],
        Some("[sources.esp]\nscheme = \"hmac\"\nsecrets = [\"bin-esp\"]\n"),
    );
    herald.wait_healthy(&base).await;
    for (path, auth) in [
        ("/v1/ingest/esp", String::new()),
        (
            "/v1/messages",
            format!("authorization: Bearer {BIN_TOKEN}\r\n"),
        ),
        // The admin sign-in form, which takes no credential either (its same-site check passes).
        (
            "/admin/sign-in",
            format!("sec-fetch-site: same-origin\r\norigin: http://{listen}\r\n"),
        ),
    ] {
        // The headers and the body's first byte, of a body of `length` bytes.
        let begin = |length: u64| {
            let (listen, path, auth) = (listen.clone(), path, auth.clone());
            async move {
                let mut stream = tokio::net::TcpStream::connect(&listen).await.unwrap();
                stream
                    .write_all(
                        format!(
                            "POST {path} HTTP/1.1\r\nhost: {listen}\r\n{auth}content-type: \
                             application/json\r\ncontent-length: {length}\r\n\r\n{{"
                        )
                        .as_bytes(),
                    )
                    .await
                    .unwrap();
                stream
            }
        };
        let mut stream = begin(10000).await;
        // Nothing more is sent: Herald answers and closes (the read ends), well within the
        // bound (which only keeps a broken build from hanging the suite).
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("{path}: still open, no answer"))
            .unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        let said = if path.starts_with("/admin") {
            answer.contains("The form did not arrive in time.")
        } else {
            answer.contains("application/problem+json") && answer.contains("body_read_timeout_ms")
        };
        assert!(said, "{path}: {answer}");
        // A length declared over the limit is refused at once, not after the deadline (found
        // by an input audit: 999999999 and no body waited 30 s for a 408).
        let mut stream = begin(999_999_999).await;
        let mut answer = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer"))
            .unwrap();
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
    }
    let r = client()
        .post(format!("{base}/v1/messages"))
        .bearer_auth(BIN_TOKEN)
        .json(&json!({"event_id": "in-time", "channel": "webhook",
            "destination": "http://127.0.0.1:9/h", "payload": {"body": {}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    herald.stop_cleanly().await;
}

/// Without `HERALD_SMTP_URL`, `herald serve` says at start that mail is written to files (WARN,
/// naming the directory), and warns at once when that directory cannot be written (here a path
/// under a regular file) rather than at every email later — still serving: a webhook-only
/// deployment may run on a read-only file system. With a relay, no such line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_smtp_says_where_mail_goes_and_checks_the_directory() {
    let blocker = tempfile::NamedTempFile::new().unwrap();
    let unusable = blocker.path().join("mail");
    let listen = free_addr();
    let mut h = Herald::spawn(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_MAIL_DIR", unusable.to_str().unwrap()),
        ],
    );
    h.wait_healthy(&format!("http://{listen}")).await;
    let stderr = h.stop_cleanly().await;
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("WARN") && l.contains("mail_dir cannot be written")),
        "{stderr}"
    );
    for smtp in [None, Some(SmtpSink::start().await)] {
        let listen = free_addr();
        let mut env = vec![("HERALD_LISTEN", listen.as_str())];
        if let Some(sink) = &smtp {
            env.push(("HERALD_SMTP_URL", sink.url.as_str()));
        }
        let mut herald = Herald::spawn(&["serve"], &env);
        herald.wait_healthy(&format!("http://{listen}")).await;
        let log = herald.stop_cleanly().await;
        let said = log
            .lines()
            .any(|l| l.contains("WARN") && l.contains("no smtp_url: email is written"));
        assert_eq!(said, smtp.is_none(), "{log}");
        if smtp.is_none() {
            assert!(herald.dir.path().join("mail").is_dir(), "created at start");
        }
    }
}

/// Messages held back by a destination's rate go when their slot comes, not at the next poll:
/// with a poll interval of a minute, four messages to a destination limited to 2 a second are
/// all delivered well before it (each put back for its slot wakes the idle loop at that slot),
/// on SQLite and on PostgreSQL (which dates the row by its own clock, later than the decision).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_held_for_a_rate_go_at_their_slot_not_at_the_next_poll() {
    held_for_a_rate(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_held_for_a_rate_go_at_their_slot_not_at_the_next_poll_on_postgres() {
    let db = crate::support::TestDb::new(crate::support::Backend::Postgres);
    held_for_a_rate(Some(&db.url)).await;
}

async fn held_for_a_rate(database_url: Option<&str>) {
    let rx = crate::support::Receiver::start().await;
    let host = rx.url.split('/').nth(2).unwrap().to_owned();
    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut herald = Herald::spawn_with_config(
        &["serve"],
        &[
            ("HERALD_LISTEN", listen.as_str()),
            ("HERALD_POLL_INTERVAL_MS", "60000"),
        ]
        .into_iter()
        .chain(database_url.map(|u| ("HERALD_DATABASE_URL", u)))
        .collect::<Vec<_>>(),
        Some(&format!(
            "[destinations.\"{host}\"]\nrate_limit_per_second = 2\nburst = 1\n"
        )),
    );
    herald.wait_healthy(&base).await;
    let http = client();
    let ids: Vec<String> = (0..4).map(|i| format!("held-{i}")).collect();
    for id in &ids {
        let r = http
            .post(format!("{base}/v1/messages"))
            .json(&crate::support::app::webhook(id, &rx.url, json!({})))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    // wait_for_view gives up after 30 s, half the poll interval.
    for id in &ids {
        wait_for_view(&base, id, |v| v["state"] == "delivered").await;
    }
    assert_eq!(rx.requests().len(), 4);
    herald.stop_cleanly().await;
}

/// `herald explain` states the budget the message's attempts were decided by, kept in
/// `herald_retry_policies` by the server, even when run with another configuration (here none:
/// the default budget of 15) than the server's (2 attempts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_the_budget_of_the_policy_the_attempts_recorded() {
    let rx = crate::support::Receiver::start().await;
    rx.script([
        crate::support::Reply::Status(503),
        crate::support::Reply::Status(503),
    ]);
    let listen = free_addr();
    let base = format!("http://{listen}");
    let mut herald = Herald::spawn(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_RETRY_MAX_ATTEMPTS", "2"),
            ("HERALD_RETRY_BASE_SECONDS", "0.1"),
            ("HERALD_RETRY_JITTER", "0"),
        ],
    );
    herald.wait_healthy(&base).await;
    let r = client()
        .post(format!("{base}/v1/messages"))
        .json(&crate::support::app::webhook(
            "two-tries",
            &rx.url,
            json!({}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    wait_for_view(&base, "two-tries", |v| v["state"] == "dead_letter").await;
    herald.stop_cleanly().await;
    let db = format!("sqlite://{}", herald.dir.path().join("herald.db").display());
    let out = herald_output(
        &["explain", "--event-id", "two-tries", "--json"],
        &[("HERALD_DATABASE_URL", &db)],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["max_attempts"], 2, "{e}");
    let words = e["explanation"].as_str().unwrap_or_default();
    assert!(words.contains("(2 of 2 in this series)"), "{words}");
    assert!(!words.contains("of 15"), "{words}");
}
