//! A real headless browser for a test: Debian's `chromedriver` (package chromium-driver, which
//! `scripts/install-deps` installs) started as a child process on a free loopback port, driving
//! Debian's `chromium` through WebDriver with `fantoccini`. Killed, with the browser it started,
//! when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::wd::TimeoutConfiguration;
use fantoccini::{Client, ClientBuilder, Locator};

/// How long any one wait for the page may take: generous for a loaded 2-core machine, short
/// enough that a broken page fails the test quickly.
pub const WAIT: Duration = Duration::from_secs(10);

/// How long a page may take to load. Longer than [`WAIT`]: a fresh Chromium's first page, while
/// the rest of the suite keeps both cores busy, once took more than 10 s in CI (chromedriver:
/// "Timed out receiving message from renderer: 10.000"). A page that loads but is broken still
/// fails within [`WAIT`], on the elements it lacks.
pub const PAGE_LOAD: Duration = Duration::from_secs(60);

pub struct Browser {
    pub client: Client,
    driver: Child,
    ended: bool,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub async fn start() -> Self {
        let profile = tempfile::tempdir().unwrap();
        // Its errors to a file, so that a driver that ends before it listens says why (CI saw it
        // end once, its reason unseen).
        let errors = profile.path().join("chromedriver.err");
        // A process group of its own, so that the browser it starts is ended with it.
        let mut cmd = Command::new("chromedriver");
        cmd.arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&errors).expect("a file for chromedriver's errors"));
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut driver = cmd
            .spawn()
            .expect("chromedriver (run scripts/install-deps: Debian package chromium-driver)");
        // It says which port it took: "ChromeDriver was started successfully on port N."
        let stdout = driver.stdout.take().unwrap();
        let port = tokio::time::timeout(
            WAIT,
            tokio::task::spawn_blocking(move || {
                let mut lines = BufReader::new(stdout).lines();
                let port = loop {
                    let Some(line) = lines.next() else {
                        let said = std::fs::read_to_string(&errors).unwrap_or_default();
                        panic!("chromedriver exited before it listened; its stderr: {said:?}");
                    };
                    let line = line.unwrap();
                    if let Some(rest) = line.split("started successfully on port ").nth(1) {
                        break rest.trim_end_matches('.').trim().parse::<u16>().unwrap();
                    }
                };
                // Keep draining its output so that it never blocks on a full pipe.
                std::thread::spawn(move || for _ in lines {});
                port
            }),
        )
        .await
        .expect("chromedriver did not start in time")
        .unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--disable-extensions",
                    "--no-first-run",
                    "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let client = tokio::time::timeout(
            Duration::from_secs(30),
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps)
                .connect(&format!("http://127.0.0.1:{port}")),
        )
        .await
        .expect("chromium did not start in time")
        .expect("a WebDriver session");
        client
            .update_timeouts(TimeoutConfiguration::new(
                Some(WAIT),
                Some(PAGE_LOAD),
                Some(Duration::ZERO),
            ))
            .await
            .unwrap();
        Browser {
            client,
            driver,
            ended: false,
            _profile: profile,
        }
    }

    /// Waits (bounded) for an element to be on the page.
    pub async fn element(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
    }

    /// The path of the page shown now.
    pub async fn path(&self) -> String {
        self.client.current_url().await.unwrap().path().to_owned()
    }

    /// Ends the WebDriver session (the browser quits), then the driver.
    pub async fn close(mut self) {
        let client = self.client.clone();
        let _ = tokio::time::timeout(WAIT, client.close()).await;
        self.kill();
    }

    fn kill(&mut self) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        #[cfg(unix)]
        {
            // The group this test started (`process_group(0)`: chromedriver leads it, its pid
            // is the group's id), chromedriver and the browser under it. Never through the
            // `kill` command, whose parsing of `-PGID` is not to be trusted, and never an id
            // below 2 (`-1` would mean every process).
            let group = self.driver.id() as libc::pid_t;
            if group > 1 {
                // SAFETY: kill(2) with a negative id signals only that process group.
                unsafe {
                    libc::kill(-group, libc::SIGKILL);
                }
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.kill();
    }
}
