//! The real `herald` binary as a child process, configured as an operator would (`HERALD_*`
//! variables, a `herald.toml` where sources need one): start-up with SMTP, dependent defaults,
//! the one-line refusals of settings that cannot work, and background reconciliation.

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
fn client() -> reqwest::Client {
    crate::support::app::client_with_token(BIN_TOKEN)
}

/// A free loopback address (bound, read, released).
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// `herald ARGS` in its own temp directory (no `herald.toml`, `.eml` files stay inside), with no
/// inherited `HERALD_*` variable, a SQLite database in that directory and `env` on top.
struct Herald {
    child: Child,
    dir: tempfile::TempDir,
}

impl Herald {
    fn spawn(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_with_config(args, env, None)
    }

    /// As [`Herald::spawn`], with `herald.toml` in its directory when given.
    fn spawn_with_config(args: &[&str], env: &[(&str, &str)], toml: Option<&str>) -> Self {
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
        cmd.args(args)
            .current_dir(dir.path())
            .env(
                "HERALD_DATABASE_URL",
                format!("sqlite://{}", dir.path().join("herald.db").display()),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = cmd.spawn().expect("spawn herald");
        Herald { child, dir }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// Polls `GET /healthz` until it answers 200; fails at once if the process exits.
    async fn wait_healthy(&mut self, base: &str) {
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
    async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
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
    async fn terminate(&mut self) -> ExitStatus {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM failed");
        self.wait_exit(EXIT_WITHIN).await
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
            ("HERALD_POLL_INTERVAL_MS", "100"),
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

    let status = herald.terminate().await;
    let log = herald.stderr();
    assert!(status.success(), "{status}; stderr:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    // Logs carry identifiers, never the token or the recipient's address.
    assert!(
        !log.contains(token) && !log.contains("ada@example.com"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_timeout_alone_starts() {
    let listen = free_addr();
    let mut herald = Herald::spawn(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_WEBHOOK_TIMEOUT_MS", "1500"),
        ],
    );
    herald.wait_healthy(&format!("http://{listen}")).await;
    let status = herald.terminate().await;
    assert!(status.success(), "{status}; stderr:\n{}", herald.stderr());
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
    let status = herald.terminate().await;
    let log = herald.stderr();
    assert!(status.success(), "{status}; stderr:\n{log}");
    assert!(!log.contains(token), "the token is never logged:\n{log}");

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
    let status = herald.terminate().await;
    let log = herald.stderr();
    assert!(status.success(), "{status}; stderr:\n{log}");
    assert!(
        log.contains("shop:send") && log.contains("default:admin"),
        "token names are logged:\n{log}"
    );
    assert!(!log.contains(&shop) && !log.contains(BIN_TOKEN), "{log}");
}

/// Runs `herald ARGS` to completion with exactly `env`; its stdout (exit status 0 asserted).
fn run_herald(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    let out = cmd.args(args).envs(env.iter().copied()).output().unwrap();
    assert!(
        out.status.success(),
        "herald {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
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
    let body = serde_json::to_vec(&json!({
        "id": "esp-1", "type": "bounced", "at": 1_800_000_000, "herald_event_id": "bin-rc-1"
    }))
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
    let view = wait_for_view(&base, "bin-rc-1", |v| v["delivery_status"] == "bounced").await;
    assert_eq!(view["receipts"][0]["outcome"], "applied");
    assert_eq!(rx.requests().len(), 1, "a receipt never causes a send");
    let status = herald.terminate().await;
    assert!(status.success(), "{status}; stderr:\n{}", herald.stderr());
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
    assert!(herald.terminate().await.success());

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
    let status = again.terminate().await;
    let log = again.stderr();
    assert!(status.success(), "{status}; stderr:\n{log}");
    let value = cookie.split_once('=').unwrap().1;
    assert!(!log.contains(BIN_TOKEN) && !log.contains(value), "{log}");
}
