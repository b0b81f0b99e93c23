//! `herald serve` as a child process (the real binary, built next to this one), with a generated
//! configuration; its resident memory read from `/proc`.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The API token every benchmark Herald accepts.
pub const TOKEN: &str = "bench-admin-token-0123456789abcdef";
/// The Standard Webhooks secret of the `bench` receipt source (and the raw-URL signing secret).
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The `herald` binary next to this one (built first, same profile, when it is missing), or
/// `HERALD_BENCH_HERALD`.
pub fn herald_binary() -> Result<PathBuf> {
    // Another build of herald (an earlier commit, for a before/after comparison).
    if let Some(p) = std::env::var_os("HERALD_BENCH_HERALD") {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe()?;
    let dir = me.parent().context("no directory")?.to_owned();
    let herald = dir.join("herald");
    if herald.exists() {
        return Ok(herald);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let release = dir.file_name().is_some_and(|n| n == "release");
    eprintln!(
        "building the herald binary ({})",
        if release { "release" } else { "debug" }
    );
    let mut c = Command::new(cargo);
    c.args(["build", "--bin", "herald"]);
    if release {
        c.arg("--release");
    }
    if !c.status()?.success() || !herald.exists() {
        bail!("cannot build the herald binary (cargo build --bin herald)");
    }
    Ok(herald)
}

pub struct HeraldProc {
    pub base: String,
    child: Child,
    config: PathBuf,
    /// `HERALD_MAIL_DIR`: created by Herald; removed with the config when dropped.
    mail_dir: PathBuf,
}

/// Configuration shared by every benchmark Herald; `extra` (TOML) is appended.
pub fn config(database_url: &str, listen: &str, extra: &str) -> String {
    format!(
        "database_url = \"{database_url}\"\nlisten = \"{listen}\"\napi_token = \"{TOKEN}\"\n\
         webhook_secret = \"{SECRET}\"\nallow_networks = \"127.0.0.0/8\"\nlog_format = \"text\"\n\
         [sources.bench]\nscheme = \"standard-webhooks\"\nsecrets = [\"{SECRET}\"]\n"
    )
    .replacen("[sources.bench]", &format!("{extra}\n[sources.bench]"), 1)
}

impl HeraldProc {
    /// Starts `herald serve` and waits until `/healthz` answers.
    pub async fn start(database_url: &str, extra: &str) -> Result<HeraldProc> {
        let bin = herald_binary()?;
        let port = crate::pg::free_port()?;
        let listen = format!("127.0.0.1:{port}");
        let config =
            std::env::temp_dir().join(format!("herald-bench-{}-{port}.toml", std::process::id()));
        std::fs::write(&config, self::config(database_url, &listen, extra))?;
        let mail_dir = std::env::temp_dir().join(format!("herald-bench-mail-{port}"));
        let child = Command::new(bin)
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .env("RUST_LOG", "warn")
            .env("HERALD_MAIL_DIR", &mail_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("start herald serve")?;
        let mut p = HeraldProc {
            base: format!("http://{listen}"),
            child,
            config,
            mail_dir,
        };
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = client.get(format!("{}/healthz", p.base)).send().await
                && r.status().is_success()
            {
                break;
            }
            if let Some(status) = p.child.try_wait()? {
                bail!("herald serve exited: {status}");
            }
            if Instant::now() > deadline {
                bail!("herald serve did not answer /healthz");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(p)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// (current, peak) resident set size in MiB, from /proc/PID/status.
    pub fn rss_mib(&self) -> Result<(f64, f64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        let kib = |key: &str| -> f64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Ok((kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0))
    }

    /// SIGTERM, then wait (bounded) for the graceful stop.
    pub async fn stop(mut self) -> Result<()> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        if exited_by(&mut self.child, Duration::from_secs(30))
            .await?
            .is_none()
        {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        Ok(())
    }
}

/// Waits for `child` to exit, at most `limit`, polling without blocking the runtime: its exit
/// status, or `None` if it is still running at the limit.
pub async fn exited_by(child: &mut Child, limit: Duration) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Drop for HeraldProc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.config);
        let _ = std::fs::remove_dir_all(&self.mail_dir);
    }
}
