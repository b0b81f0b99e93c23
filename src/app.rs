//! Wiring: settings → database, channels, sender, HTTP server. `main.rs` and the tests both
//! build Herald through here.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use actix_web::{App, HttpServer, web};
use anyhow::Context;
use tokio::sync::{Notify, watch};
use tracing::{info, warn};

use crate::admin::AdminState;
use crate::channels::email::{EmailChannel, MessageOptions, SmtpLimits};
use crate::channels::webhook::{WebhookChannel, WebhookTimeouts};
use crate::clock::Clock;
use crate::config::Settings;
use crate::crypto::signing::SigningKey;
use crate::http::{self, AppState};
use crate::metrics::Metrics;
use crate::reconcile::{Reconciler, ReconcilerConfig};
use crate::retention::Retention;
use crate::sender::{Sender, SenderConfig};
use crate::storage::group_commit::{MessageWriter, ReceiptWriter};
use crate::storage::{Db, PoolOptions};

/// The key under which a generated webhook secret is stored in `herald_settings`.
pub const WEBHOOK_SECRET_KEY: &str = "webhook_secret";
/// The key under which a generated API token is stored in `herald_settings`.
pub const API_TOKEN_KEY: &str = "api_token";

/// A built Herald: everything but the running loops.
pub struct Herald {
    pub settings: Settings,
    pub db: Db,
    pub clock: Arc<dyn Clock>,
    pub sender: Sender,
    pub wake: Arc<Notify>,
    pub reconciler: Reconciler,
    /// This Herald's metrics (its own registry: several Heralds in one process never mix counts).
    pub metrics: Metrics,
    pub retention: Retention,
    /// The admin page's session key and replay hook.
    pub admin: AdminState,
    /// Ingest's group-commit writer: concurrent requests' receipts share one transaction.
    pub receipt_writer: ReceiptWriter,
    /// `POST /v1/messages`' group-commit writer: concurrent messages share one transaction (not
    /// fan-outs; on PostgreSQL not keyed ones).
    pub message_writer: MessageWriter,
}

/// Opens the database for `herald serve` (and migrates it unless told not to). Blocking.
pub fn open_db(settings: &Settings, migrate: bool) -> anyhow::Result<Db> {
    open_db_keeping(settings, migrate, PoolOptions::default().min_idle)
}

/// [`open_db`] for a command that runs and exits (`migrate`, `explain`, `purge`, …): its pool
/// opens no connection ahead of need, so none is being opened when the process exits after its
/// work (see `PoolOptions::min_idle`).
pub fn open_db_for_a_command(settings: &Settings, migrate: bool) -> anyhow::Result<Db> {
    open_db_keeping(settings, migrate, 0)
}

fn open_db_keeping(settings: &Settings, migrate: bool, min_idle: u32) -> anyhow::Result<Db> {
    if let Some(path) = crate::storage::sqlite_path(settings.database_url.expose()) {
        let file = std::path::Path::new(path);
        // SQLite creates the file, not its directory: say so now, not after the pool's wait
        // (and before "run `herald migrate`", which would refuse for the same reason).
        if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.is_dir()
        {
            anyhow::bail!(
                "no directory {} for the SQLite database {path}: create it, or check HERALD_DATABASE_URL",
                dir.display()
            );
        }
        // Not migrating: a SQLite file that is not there is a wrong path or a database never
        // set up, not one to create empty here.
        if !migrate && !file.exists() {
            anyhow::bail!(
                "no database at {path}: check HERALD_DATABASE_URL, or run `herald migrate` to create it"
            );
        }
    }
    let db = Db::connect(
        settings.database_url.expose(),
        &PoolOptions {
            max_size: settings.database_pool_size,
            idle_in_transaction: settings.database_idle_in_transaction,
            min_idle,
            ..PoolOptions::default()
        },
    )
    .context("cannot open the database")?;
    db.first_connection()
        .context("cannot connect to the database")?;
    if migrate {
        let applied = db.migrate().context("cannot migrate the database")?;
        for m in applied {
            info!(migration = %m, "migration applied");
        }
    } else if db
        .never_migrated()
        .context("cannot read the database's migrations")?
    {
        // Every query would fail on a missing table, in words that do not say why.
        anyhow::bail!(
            "the database has no Herald tables (no migration applied): run `herald migrate` first"
        );
    }
    // Said, not refused: a rolling upgrade runs old processes beside new ones for a while.
    match db.unknown_migrations() {
        Ok(unknown) if !unknown.is_empty() => warn!(
            migrations = unknown.join(","),
            "the database has migrations this Herald does not know: a newer Herald migrated it; \
             run that version (this one may misread what they changed)"
        ),
        Ok(_) => {}
        Err(e) => warn!(error = %e.log_safe(), "cannot read the database's migrations"),
    }
    Ok(db)
}

/// Creates `dir` when missing and proves it writable with a file made and removed at once (a
/// name of its own: containers sharing a volume are all process 1).
fn check_mail_dir(dir: &std::path::Path) -> std::io::Result<()> {
    crate::channels::email::create_mail_dir(dir)?;
    let probe = dir.join(format!(".herald-check-{:016x}", rand::random::<u64>()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}

/// Keeps the retry policy versions this configuration runs with (`herald_retry_policies`), so
/// that explanations read the budget of the version each attempt recorded.
pub fn record_policies(db: &Db, settings: &Settings) -> anyhow::Result<()> {
    db.record_policies(&crate::sender::policy::records(
        &settings.retry,
        &settings.endpoint_retry,
    ))
    .context("cannot keep the retry policies (herald_retry_policies)")
}

/// Stores the configured endpoint subscriptions (`[endpoints.NAME] event_types`) in
/// `herald_subscriptions`, replacing what was there, so the SQL ways in fan out as Herald does.
/// Every Herald process sharing a database should run with the same endpoints.
pub fn sync_subscriptions(db: &Db, settings: &Settings) -> anyhow::Result<()> {
    let new = settings.subscriptions();
    let old = db
        .subscriptions()
        .context("cannot read the endpoint subscriptions (herald_subscriptions)")?;
    db.sync_subscriptions(&new)
        .context("cannot store the endpoint subscriptions (herald_subscriptions)")?;
    // Replacing them is silent otherwise: a process started with another `[endpoints]` than the
    // others sharing the database (a rolling change, an old configuration's `herald migrate`)
    // changes what every fan-out expands to.
    let endpoints = |subs: &[(String, String)], of: &[(String, String)]| -> Vec<String> {
        let mut names: Vec<String> = subs
            .iter()
            .filter(|s| !of.contains(s))
            .map(|(endpoint, _)| endpoint.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    };
    let (added, removed) = (endpoints(&new, &old), endpoints(&old, &new));
    if !removed.is_empty() {
        tracing::warn!(
            endpoints = removed.join(","),
            "fan-out subscriptions of these endpoints were removed from herald_subscriptions by \
             this configuration: every Herald process sharing the database should have the same \
             [endpoints]"
        );
    }
    if !added.is_empty() && !old.is_empty() {
        tracing::info!(
            endpoints = added.join(","),
            "fan-out subscriptions of these endpoints were added to herald_subscriptions"
        );
    }
    Ok(())
}

/// The signing secret for raw-URL webhooks: configured, or generated once and stored in the
/// database (so every Herald process sharing it signs alike). Returns it as `whsec_…` text.
pub fn webhook_secret(db: &Db, settings: &Settings) -> anyhow::Result<Option<String>> {
    if settings.webhook_secret.is_some() {
        return Ok(None);
    }
    let stored = db
        .setting_or_insert(WEBHOOK_SECRET_KEY, &SigningKey::generate())
        .context("cannot read or store the webhook secret")?;
    Ok(Some(stored))
}

/// The API token used when none is configured: generated once, stored in the database (so every
/// Herald process sharing it accepts it), named `default` with scope `admin`. `None` when tokens
/// are configured (the generated one is then not accepted).
pub fn api_token(db: &Db, settings: &Settings) -> anyhow::Result<Option<String>> {
    if !settings.tokens.is_empty() {
        return Ok(None);
    }
    let stored = db
        .setting_or_insert(API_TOKEN_KEY, &crate::auth::generate())
        .context("cannot read or store the API token")?;
    Ok(Some(stored))
}

/// `GET /healthz` of the server listening on `listen` (a wildcard address probed on loopback):
/// `Ok` on a 200 within `timeout`. Blocking; plain HTTP/1.1 over std, no runtime.
pub fn check_health(listen: &str, timeout: std::time::Duration) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    let deadline = std::time::Instant::now() + timeout;
    let addrs: Vec<std::net::SocketAddr> = listen
        .to_socket_addrs()
        .with_context(|| format!("listen address {listen} does not resolve"))?
        .map(probe_addr)
        .collect();
    let mut last = None;
    for addr in addrs {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        let mut stream = match std::net::TcpStream::connect_timeout(&addr, left) {
            Ok(s) => s,
            Err(e) => {
                last = Some(anyhow::Error::new(e).context(format!("cannot connect to {addr}")));
                continue;
            }
        };
        let left = deadline
            .saturating_duration_since(std::time::Instant::now())
            .max(std::time::Duration::from_millis(1));
        stream.set_read_timeout(Some(left))?;
        stream.set_write_timeout(Some(left))?;
        write!(
            stream,
            "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .with_context(|| format!("cannot send to {addr}"))?;
        let mut head = [0u8; 32];
        let mut n = 0;
        while n < 12 {
            match stream.read(&mut head[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) => {
                    return Err(anyhow::Error::new(e).context(format!("no answer from {addr}")));
                }
            }
        }
        let status_line = String::from_utf8_lossy(&head[..n]);
        return match status_line.split_whitespace().nth(1) {
            Some("200") => Ok(()),
            Some(code) => anyhow::bail!("GET http://{addr}/healthz answered {code}"),
            None => anyhow::bail!("GET http://{addr}/healthz: not an HTTP answer"),
        };
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no address to probe for {listen}")))
}

/// Where to probe a server listening on `addr`: a wildcard address on its family's loopback.
pub fn probe_addr(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    match addr.ip() {
        IpAddr::V4(a) if a.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(a) if a.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

impl Herald {
    /// Builds every part from settings. Blocking (database set-up); call before serving.
    pub fn build(
        mut settings: Settings,
        clock: Arc<dyn Clock>,
        migrate: bool,
    ) -> anyhow::Result<Self> {
        let db = open_db(&settings, migrate)?;
        if let Some(generated) = api_token(&db, &settings)? {
            settings
                .tokens
                .add_plain("default", &generated, crate::auth::Scope::Admin)
                .map_err(|e| anyhow::anyhow!("the stored API token is not valid: {e}"))?;
        }
        sync_subscriptions(&db, &settings)?;
        // Kept for explanations only: a database not migrated to the table (serve --no-migrate)
        // or a role that may not write it still serves.
        if let Err(e) = record_policies(&db, &settings) {
            warn!(
                error = format!("{e:#}"),
                "retry policies not kept; explanations use the configured budget"
            );
        }
        let keys = match &settings.webhook_secret {
            Some(keys) => keys.clone(),
            None => {
                let stored = webhook_secret(&db, &settings)?.unwrap_or_default();
                SigningKey::parse_list(&stored)
                    .map_err(|m| anyhow::anyhow!("the stored webhook secret is not valid: {m}"))?
            }
        };
        let webhook = WebhookChannel::new(
            WebhookTimeouts {
                connect: settings.webhook_connect_timeout,
                total: settings.webhook_timeout,
            },
            settings.endpoints.clone(),
            keys,
            settings.allow_networks.clone(),
            clock.clone(),
        )
        .context("cannot build the HTTP client")?;
        let email = EmailChannel::new(
            settings.smtp_url.as_ref().map(|s| s.expose()),
            SmtpLimits {
                timeout: settings.smtp_timeout,
                pool_size: settings.smtp_pool_size,
                idle_timeout: settings.smtp_idle_timeout,
                pipelining: settings.smtp_pipelining,
                chunking: settings.smtp_chunking,
                noop_after_idle: settings.smtp_noop_after_idle,
                ca: settings.smtp_ca.clone(),
                credentials: settings.smtp_credentials.clone(),
            },
            settings.mail_dir.clone(),
            &settings.mail_from,
            &settings.message_id_domain,
            clock.clone(),
        )
        .map_err(|m| anyhow::anyhow!("{m}"))?
        .with_message_options(MessageOptions {
            relay: settings.smtp_provider,
            dkim: settings.dkim.clone(),
        });
        let metrics = Metrics::new(settings.sources.keys().map(String::as_str))
            .context("cannot register the metrics")?;
        let admin = AdminState::load(&db, clock.clone()).context("cannot set up the admin page")?;
        let wake = Arc::new(Notify::new());
        let sender = Sender::new(
            db.clone(),
            clock.clone(),
            SenderConfig {
                owner: SenderConfig::new_owner(),
                lease: settings.lease,
                longest_send: settings.longest_send,
                batch_size: settings.sender_batch_size,
                concurrency: settings.sender_concurrency,
                poll_interval: settings.poll_interval,
                policy: settings.retry.clone(),
                endpoint_policies: settings.endpoint_retry.clone(),
                limits: settings.limits.clone(),
                shutdown_timeout: settings.shutdown_timeout,
                // Only a listening sender is woken, so only a listening one promises to stay awake
                // (sender::awake).
                keep_awake: settings.listen_notify
                    && db.backend() == crate::storage::Backend::Postgres,
            },
            webhook,
            email,
            wake.clone(),
            metrics.clone(),
        );
        let reconciler = Reconciler::new(
            db.clone(),
            clock.clone(),
            ReconcilerConfig {
                batch_size: settings.reconcile_batch_size,
                interval: settings.reconcile_interval,
                unconfirmed_deadline: settings.unconfirmed_deadline,
                callbacks: settings.status_callbacks.clone(),
                policies: Arc::new(settings.policies()),
                message_id_domain: settings.message_id_domain.clone(),
                matches: settings
                    .sources
                    .iter()
                    .filter(|(_, s)| !s.matches.is_empty())
                    .map(|(n, s)| (n.clone(), s.matches.clone()))
                    .collect(),
                provider_id_first: settings
                    .sources
                    .iter()
                    .filter(|(_, s)| crate::ingest::schemes::echoes_reference(s.source.scheme()))
                    .map(|(n, _)| n.clone())
                    .collect(),
            },
            Arc::new(Notify::new()),
            metrics.clone(),
        );
        let retention = Retention::new(db.clone(), clock.clone(), settings.retention);
        let receipt_writer =
            ReceiptWriter::spawn(db.clone()).context("cannot start the receipt writer")?;
        let message_writer =
            MessageWriter::spawn(db.clone()).context("cannot start the message writer")?;
        Ok(Self {
            settings,
            db,
            clock,
            sender,
            wake,
            reconciler,
            metrics,
            retention,
            admin,
            receipt_writer,
            message_writer,
        })
    }

    pub fn app_state(&self) -> AppState {
        AppState {
            db: self.db.clone(),
            clock: self.clock.clone(),
            wake: self.wake.clone(),
            tokens: Arc::new(self.settings.tokens.clone()),
            max_payload_bytes: self.settings.max_payload_bytes,
            policies: Arc::new(self.settings.policies()),
            endpoints: Arc::new(self.settings.endpoints.clone()),
            allow_networks: Arc::new(self.settings.allow_networks.clone()),
            sources: Arc::new(self.settings.sources.clone()),
            ingest_max_body_bytes: self.settings.ingest_max_body_bytes,
            body_read_timeout: self.settings.body_read_timeout,
            reconcile_wake: self.reconciler.wake_handle(),
            metrics: self.metrics.clone(),
            sender_heartbeat: self.sender.heartbeat(),
            pauses: self.sender.throttle(),
            receipt_writer: self.receipt_writer.clone(),
            message_writer: self.message_writer.clone(),
            refusals: Arc::default(),
        }
    }

    /// The HTTP server on `listener`; signals are left to the caller.
    pub fn http_server(
        &self,
        listener: TcpListener,
        workers: usize,
    ) -> std::io::Result<actix_web::dev::Server> {
        let state = web::Data::new(self.app_state());
        let admin = web::Data::new(self.admin.clone());
        Ok(HttpServer::new(move || {
            App::new()
                .wrap_fn(|req, srv| {
                    use actix_web::dev::Service;
                    srv.call(http::head_as_get(req))
                })
                .app_data(state.clone())
                .app_data(admin.clone())
                .configure(crate::admin::configure)
                .configure(http::configure)
        })
        .workers(workers)
        .disable_signals()
        .shutdown_timeout(10)
        .listen(listener)?
        .run())
    }

    /// Serves until SIGINT or SIGTERM: HTTP, the sender (unless disabled) and with it the wake-up
    /// for rows others commit (LISTEN on PostgreSQL, the insert watch on SQLite). Shutdown stops
    /// claiming, lets in-flight sends finish and flushes them.
    pub async fn serve(self) -> anyhow::Result<()> {
        let listener = TcpListener::bind(&self.settings.listen)
            .with_context(|| format!("cannot listen on {}", self.settings.listen))?;
        let server_addr = listener.local_addr().ok();
        let workers = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        let server = self.http_server(listener, workers)?;
        let handle = server.handle();
        let names: Vec<_> = self
            .settings
            .tokens
            .names()
            .map(|(n, s)| format!("{n}:{s}"))
            .collect();
        info!(tokens = %names.join(","), "API tokens accepted (names and scopes)");
        let unbounded = self.settings.sources_speaking_for_every_message();
        if !unbounded.is_empty() {
            warn!(
                sources = %unbounded.join(","),
                "receipt sources without matches: each may set the status of any message, another \
                 provider's too; give every source matches (see Delivery receipts)"
            );
        }
        // SQLite's threading mode (see `storage::sqlite_threading`); not said on PostgreSQL.
        let sqlite_threading = (self.db.backend() == crate::storage::Backend::Sqlite)
            .then(crate::storage::sqlite_threading);
        if self.settings.smtp_url.is_none() && self.settings.sender_enabled {
            // Without a relay, mail goes to files: said at once, and the directory checked now
            // rather than at the first email. A warning, not a refusal: a webhook-only
            // deployment on a read-only file system sends no email at all.
            let dir = &self.settings.mail_dir;
            warn!(
                mail_dir = %dir.display(),
                "no smtp_url: email is written as .eml files to mail_dir, not sent"
            );
            if let Err(e) = check_mail_dir(dir) {
                warn!(
                    mail_dir = %dir.display(),
                    error = %e,
                    "mail_dir cannot be written: every email will fail (transient, retried) until \
                     it can; set HERALD_MAIL_DIR to a directory Herald may write, or HERALD_SMTP_URL"
                );
            }
        }
        if self.settings.smtp_url.is_some()
            && self.settings.sender_enabled
            && self.settings.message_id_domain == crate::config::DEFAULT_MESSAGE_ID_DOMAIN
        {
            // A Message-ID's key is the event id's hash: unique only within its domain.
            warn!(
                message_id_domain = crate::config::DEFAULT_MESSAGE_ID_DOMAIN,
                "mail goes out with the default message_id_domain, the same for every Herald: \
                 two deployments sending one event id (welcome-7) to a mailbox give two mails \
                 one Message-ID, which some mailboxes drop as a duplicate; set \
                 HERALD_MESSAGE_ID_DOMAIN to your sending domain"
            );
        }
        info!(
            // The address bound (a port 0 in the setting is the one the system chose).
            listen = %server_addr.map_or_else(|| self.settings.listen.clone(), |a| a.to_string()),
            backend = ?self.db.backend(),
            sqlite_threading,
            "herald serving"
        );

        let (stop_tx, stop_rx) = watch::channel(false);
        let stop_listen = Arc::new(AtomicBool::new(false));
        // LISTEN on PostgreSQL, the watch on SQLite: rows committed by others wake the sender.
        // Without a sender nothing needs waking (and on PostgreSQL a registered listener would
        // make application commits notify for nobody).
        let listen_thread =
            (self.settings.listen_notify && self.settings.sender_enabled).then(|| {
                crate::sender::listener::spawn(
                    &self.db,
                    self.settings.database_url.expose().to_owned(),
                    self.wake.clone(),
                    stop_listen.clone(),
                )
            });
        let sender_task = self
            .settings
            .sender_enabled
            .then(|| tokio::spawn(self.sender.clone().run(stop_rx.clone())));
        let retention_task = tokio::spawn(self.retention.clone().run(stop_rx.clone()));
        let reconciler_task = tokio::spawn(self.reconciler.clone().run(stop_rx));

        let server_task = tokio::spawn(server);
        shutdown_signal().await;
        info!("shutting down");
        let bound = hard_stop_after(&self.settings);
        // The last resort: a database connection that hangs (a frozen server, which keepalive
        // cannot tell from a busy one) would keep the steps below waiting for ever.
        let hard_stop = std::thread::Builder::new()
            .name("herald-hard-stop".into())
            .spawn(move || {
                std::thread::sleep(bound);
                tracing::error!(
                    seconds = bound.as_secs(),
                    "shutdown has not finished in time (a database call hangs?): exiting now; \
                     outcomes not yet written count again when their leases expire, as after \
                     a crash"
                );
                std::process::exit(1);
            });
        if let Err(e) = hard_stop {
            tracing::warn!(error = %e, "cannot start the shutdown's hard stop; shutting down without it");
        }
        let _ = stop_tx.send(true);
        // Nothing needs wake-ups any more: the LISTEN thread ends now, not after the tasks.
        stop_listen.store(true, Ordering::Relaxed);
        handle.stop(true).await;
        // Every part is waited for before any failure is returned: a part left running would
        // keep the database open past the exit (see `storage::Closed`).
        let sender = match sender_task {
            Some(t) => t.await.context("sender task failed"),
            None => Ok(()),
        };
        let reconciler = reconciler_task.await.context("reconciler task failed");
        let retention = retention_task.await.context("retention task failed");
        if let Some(t) = listen_thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        let server = server_task.await.context("server task failed");
        sender?;
        reconciler?;
        retention?;
        server??;
        Ok(())
    }
}

/// How long after SIGTERM or SIGINT Herald exits, status 1, whatever is still waiting: the
/// later of `shutdown_timeout` and the longest send (`longest_send`: the webhook timeout, or the
/// SMTP one where SMTP is configured and it is longer), plus
/// [`HARD_STOP_GRACE`] for the outcomes' last tries (each within the pool's 5 s connection
/// timeout when the database is down), the HTTP server's 10 s and the background tasks.
pub fn hard_stop_after(settings: &Settings) -> std::time::Duration {
    settings
        .shutdown_timeout
        .max(settings.longest_send)
        .saturating_add(HARD_STOP_GRACE)
}

/// See [`hard_stop_after`].
pub const HARD_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_listen_addresses_are_probed_on_loopback() {
        let p = |s: &str| probe_addr(s.parse().unwrap()).to_string();
        assert_eq!(p("0.0.0.0:8080"), "127.0.0.1:8080");
        assert_eq!(p("[::]:8080"), "[::1]:8080");
        assert_eq!(p("10.1.2.3:80"), "10.1.2.3:80");
        assert_eq!(p("[fd00::1]:80"), "[fd00::1]:80");
    }
}
