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

/// A free loopback address (bound, read, released).
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// `herald ARGS` in its own temp directory (no `herald.toml`, `.eml` files stay inside), with no
/// inherited `HERALD_*` variable, a SQLite database in that directory,
/// `HERALD_ALLOW_NETWORKS=127.0.0.0/8` (the receivers listen there; `("HERALD_ALLOW_NETWORKS",
/// "")` in `env` unsets it) and `env` on top.
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
        let dir = tempfile::tempdir().unwrap();
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

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stdout")).unwrap_or_default()
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
    let token = "tok-binary-test-7f3a";
    let mut herald = Herald::spawn(
        &["serve"],
        &[
            ("HERALD_LISTEN", &listen),
            ("HERALD_SMTP_URL", &sink.url),
            ("HERALD_API_TOKEN", token),
            ("HERALD_POLL_INTERVAL_MS", "100"),
        ],
    );
    herald.wait_healthy(&base).await;

    let http = reqwest::Client::new();
    let r = http
        .post(format!("{base}/v1/messages"))
        .bearer_auth(token)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_listen_without_a_token_is_refused_in_one_line() {
    let (status, stderr) =
        refusal(&[("HERALD_LISTEN", "0.0.0.0:0"), ("RUST_BACKTRACE", "1")]).await;
    assert_one_line_refusal(status, &stderr, "HERALD_API_TOKEN");
    assert!(stderr.contains("HERALD_LISTEN"), "{stderr}");
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
    let http = reqwest::Client::new();
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
    let http = reqwest::Client::new();
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

/// The SSRF guard in the real binary: with `HERALD_ALLOW_NETWORKS` unset a loopback receiver is
/// refused — its literal address with a 422 at enqueue, the name `localhost` at send time
/// (`permanent`, no request) — and with `HERALD_ALLOW_NETWORKS=127.0.0.0/8` it is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ssrf_guard_refuses_loopback_unless_allow_listed() {
    let rx = crate::support::Receiver::start().await;
    let by_name = rx.url.replace("127.0.0.1", "localhost");
    let http = reqwest::Client::new();
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
    let status = herald.terminate().await;
    assert!(status.success(), "{status}; stderr:\n{}", herald.stderr());
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
    let status = herald.terminate().await;
    assert!(status.success(), "{status}; stderr:\n{}", herald.stderr());
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
    assert!(h.terminate().await.success(), "{}", h.stderr());
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
    let r = reqwest::Client::new()
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
    let status = herald.terminate().await;
    assert!(status.success(), "{status}; stderr:\n{}", herald.stderr());
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
    assert!(herald.terminate().await.success(), "{}", herald.stderr());
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
