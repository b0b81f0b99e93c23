//! Wiring: settings → database, channels, sender, HTTP server. `main.rs` and the tests both
//! build Herald through here.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use actix_web::{App, HttpServer, web};
use anyhow::Context;
use tokio::sync::{Notify, watch};
use tracing::info;

use crate::admin::AdminState;
use crate::channels::email::{EmailChannel, MessageOptions, SmtpLimits};
use crate::channels::webhook::{WebhookChannel, WebhookTimeouts};
use crate::clock::Clock;
use crate::config::Settings;
use crate::crypto::signing::SigningKey;
use crate::http::{self, AppState};
use crate::reconcile::{Reconciler, ReconcilerConfig};
use crate::sender::{Sender, SenderConfig};
use crate::storage::{Backend, Db, PoolOptions};

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
    pub duplicate_receipts: Arc<std::sync::atomic::AtomicU64>,
    /// Receipts refused as replays, since start (see [`AppState::replayed_receipts`]).
    pub replayed_receipts: Arc<std::sync::atomic::AtomicU64>,
    /// The admin page's session key and replay hook.
    pub admin: AdminState,
}

/// Opens the database (and migrates it unless told not to). Blocking.
pub fn open_db(settings: &Settings, migrate: bool) -> anyhow::Result<Db> {
    let db = Db::connect(
        settings.database_url.expose(),
        &PoolOptions {
            max_size: settings.database_pool_size,
            ..PoolOptions::default()
        },
    )
    .context("cannot open the database")?;
    if migrate {
        let applied = db.migrate().context("cannot migrate the database")?;
        for m in applied {
            info!(migration = %m, "migration applied");
        }
    }
    Ok(db)
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
            clock.clone(),
        )
        .context("cannot build the HTTP client")?;
        let email = EmailChannel::new(
            settings.smtp_url.as_ref().map(|s| s.expose()),
            SmtpLimits {
                timeout: settings.smtp_timeout,
                pool_size: settings.smtp_pool_size,
                idle_timeout: settings.smtp_idle_timeout,
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
        let admin = AdminState::load(&db).context("cannot set up the admin page")?;
        let wake = Arc::new(Notify::new());
        let sender = Sender::new(
            db.clone(),
            clock.clone(),
            SenderConfig {
                owner: SenderConfig::new_owner(),
                lease: settings.lease,
                batch_size: settings.sender_batch_size,
                concurrency: settings.sender_concurrency,
                poll_interval: settings.poll_interval,
                policy: settings.retry.clone(),
            },
            webhook,
            email,
            wake.clone(),
        );
        let reconciler = Reconciler::new(
            db.clone(),
            clock.clone(),
            ReconcilerConfig {
                batch_size: settings.reconcile_batch_size,
                interval: settings.reconcile_interval,
                unconfirmed_deadline: settings.unconfirmed_deadline,
                callbacks: settings.status_callbacks.clone(),
                retry_policy: settings.retry.name.clone(),
                retry_policy_version: settings.retry.version.clone(),
                message_id_domain: settings.message_id_domain.clone(),
            },
            Arc::new(Notify::new()),
        );
        Ok(Self {
            settings,
            db,
            clock,
            sender,
            wake,
            reconciler,
            duplicate_receipts: Arc::default(),
            replayed_receipts: Arc::default(),
            admin,
        })
    }

    pub fn app_state(&self) -> AppState {
        AppState {
            db: self.db.clone(),
            clock: self.clock.clone(),
            wake: self.wake.clone(),
            tokens: Arc::new(self.settings.tokens.clone()),
            max_payload_bytes: self.settings.max_payload_bytes,
            retry_policy: self.settings.retry.name.clone(),
            retry_policy_version: self.settings.retry.version.clone(),
            default_max_attempts: self.settings.retry.max_attempts,
            endpoints: Arc::new(self.settings.endpoints.clone()),
            sources: Arc::new(self.settings.sources.clone()),
            ingest_max_body_bytes: self.settings.ingest_max_body_bytes,
            duplicate_receipts: self.duplicate_receipts.clone(),
            replayed_receipts: self.replayed_receipts.clone(),
            reconcile_wake: self.reconciler.wake_handle(),
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

    /// Serves until SIGINT or SIGTERM: HTTP, the sender (unless disabled) and, on PostgreSQL, the
    /// LISTEN wake-up. Shutdown stops claiming, lets in-flight sends finish and flushes them.
    pub async fn serve(self) -> anyhow::Result<()> {
        let listener = TcpListener::bind(&self.settings.listen)
            .with_context(|| format!("cannot listen on {}", self.settings.listen))?;
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
        info!(listen = %self.settings.listen, backend = ?self.db.backend(), "herald serving");

        let (stop_tx, stop_rx) = watch::channel(false);
        let stop_listen = Arc::new(AtomicBool::new(false));
        let listen_thread = (self.db.backend() == Backend::Postgres && self.settings.listen_notify)
            .then(|| {
                crate::sender::listener::spawn(
                    self.settings.database_url.expose().to_owned(),
                    self.wake.clone(),
                    stop_listen.clone(),
                )
            });
        let sender_task = self
            .settings
            .sender_enabled
            .then(|| tokio::spawn(self.sender.clone().run(stop_rx.clone())));
        let reconciler_task = tokio::spawn(self.reconciler.clone().run(stop_rx));

        let server_task = tokio::spawn(server);
        shutdown_signal().await;
        info!("shutting down");
        let _ = stop_tx.send(true);
        handle.stop(true).await;
        if let Some(t) = sender_task {
            t.await.context("sender task failed")?;
        }
        reconciler_task.await.context("reconciler task failed")?;
        stop_listen.store(true, Ordering::Relaxed);
        if let Some(t) = listen_thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        server_task.await.context("server task failed")??;
        Ok(())
    }
}

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
