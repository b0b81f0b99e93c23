//! The `herald` command: CLI parsing and wiring only; the logic lives in the library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

use herald::app::{Herald, api_token, open_db_for_a_command, sync_subscriptions, webhook_secret};
use herald::clock::SystemClock;
use herald::config::{ConfigError, Settings};

/// Herald: a webhook and email notification gateway built on the transactional outbox pattern.
///
/// Applications write messages into the `herald_outbox` table inside their own transaction (or
/// POST /v1/messages); Herald claims them with a lease, sends signed webhooks or email,
/// classifies every answer, retries with backoff and dead-letters what cannot be delivered.
///
/// Configuration: a TOML file (--config, default ./herald.toml when present) and HERALD_*
/// environment variables, which win. See README.md for every key.
#[derive(Debug, Parser)]
#[command(name = "herald", version, about, long_about)]
struct Cli {
    /// TOML configuration file (default: ./herald.toml if it exists).
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of its largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP API and the sender until SIGINT/SIGTERM.
    Serve {
        /// Do not apply pending migrations at start-up.
        #[arg(long)]
        no_migrate: bool,
    },
    /// Apply pending database migrations (and store the endpoint subscriptions) and exit.
    Migrate,
    /// Exit 0 when the `herald serve` this configuration describes answers `GET /healthz` with
    /// 200 (within 5 s), else 1 with one line on stderr. For container health checks: it needs
    /// no curl. A wildcard listen address (0.0.0.0, [::]) is probed on loopback.
    Healthcheck,
    /// Run one retention pass now (the server runs one every retention_interval_seconds) and
    /// print what it deleted, batch by batch, as JSON.
    Purge,
    /// Print the webhook signing secret used for raw-URL destinations (generated and stored in
    /// the database on first use unless HERALD_WEBHOOK_SECRET is set).
    WebhookSecret,
    /// Print the API token named `default` (scope admin) that Herald generated and stored in the
    /// database on first start because no token was configured (HERALD_API_TOKEN or
    /// [tokens.NAME]); with tokens configured it is not accepted and this says so.
    ApiToken,
    /// Named endpoints Herald disabled by itself (`disable_after_failures`): list them, or
    /// enable one again.
    Endpoint {
        #[command(subcommand)]
        action: EndpointAction,
    },
    /// Make a new named bearer token: prints the token (give it to the client) and the TOML
    /// lines for herald.toml, which hold only its SHA-256. Needs no configuration or database.
    Token {
        /// The token's name, recorded in logs and audits (A–Z, a–z, 0–9, '-', '_', '.').
        name: String,
        /// send (enqueue, read its own messages), support (explain, replay, dead letters) or
        /// admin (everything).
        #[arg(long)]
        scope: String,
    },
    /// Check a provider receipt offline, without a server or database: runs the scheme's
    /// verifier and normalizer and prints the verdict and the normalized events as JSON.
    /// Exit status 0 when valid, 1 when refused.
    VerifyReceipt {
        /// standard-webhooks, mailgun, sendgrid, twilio, postmark, ses, stripe, hmac, vonage,
        /// telnyx, plivo or messagebird.
        #[arg(long)]
        scheme: String,
        /// A secret of the source (repeat for several; postmark: username:password; sendgrid:
        /// the base64 verification key; ses: not needed, give --cert-file).
        #[arg(long = "secret")]
        secrets: Vec<String>,
        /// A request header, 'Name: value' (repeat for several).
        #[arg(long = "header", value_name = "'Name: value'")]
        headers: Vec<String>,
        /// The raw request body, byte for byte.
        #[arg(long, value_name = "FILE")]
        body_file: PathBuf,
        /// The URL as the provider called it, query included (URL-signing schemes such as
        /// twilio, plivo, messagebird; GET-signed receipts carry their parameters in it).
        #[arg(long)]
        url: Option<String>,
        /// The HTTP method the provider used (GET-signed schemes read their parameters from
        /// --url's query).
        #[arg(long, default_value = "POST", value_name = "M")]
        method: String,
        /// A scheme option of the source, as its `[sources.NAME]` key (repeat for several),
        /// e.g. `--param signature_method=sha256`.
        #[arg(long = "param", value_name = "KEY=VALUE")]
        params: Vec<String>,
        /// Verify as if now were this Unix time (published examples are old).
        #[arg(long, value_name = "UNIX_SECONDS")]
        at: Option<i64>,
        /// ses: the PEM certificate the message's SigningCertURL would give.
        #[arg(long, value_name = "PEM")]
        cert_file: Option<PathBuf>,
    },
    /// Explain a send: identity, state, every attempt (status, class, delay and why), every
    /// receipt, every replay, and a paragraph in plain words. Reads the database directly.
    /// Exit status: 0 shown, 1 not found, 2 bad input or configuration, 3 ambiguous prefix.
    #[command(override_usage = "herald explain <FINGERPRINT | --event-id EVENT_ID> [--json]")]
    Explain {
        /// The request fingerprint, or a unique prefix of it (at least 8 hex digits).
        #[arg(required_unless_present = "event_id", conflicts_with = "event_id")]
        fingerprint: Option<String>,
        /// Look the message up by its event id instead.
        #[arg(long)]
        event_id: Option<String>,
        /// Print JSON (the same document as GET /v1/sends/{fingerprint}).
        #[arg(long)]
        json: bool,
    },
    /// Release an ordering key held by its dead_letter or unconfirmed head (block policy): the
    /// head stays as it is (it can still be replayed) and the key's next message becomes due.
    /// Logged with who (cli:$USER) and why. Exit status: 0 skipped, 1 not found or holding no
    /// key, 2 bad input or configuration, 3 a fan-out's own event id (its messages are named).
    Skip {
        /// The head's event id.
        event_id: String,
        /// Why (required; logged).
        #[arg(long)]
        reason: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Replay (redrive) a dead_letter, unconfirmed or expired message with its original event
    /// id: a new attempt series under the current policy, the history kept, audited with who
    /// (cli:$USER), when and why. Exit status: 0 replayed, 1 not found or not replayable,
    /// 2 bad input or configuration, 3 ambiguous prefix.
    #[command(
        override_usage = "herald replay <FINGERPRINT | --event-id EVENT_ID> --reason <REASON> [OPTIONS]"
    )]
    Replay {
        /// The request fingerprint, or a unique prefix of it (at least 8 hex digits).
        #[arg(required_unless_present = "event_id", conflicts_with = "event_id")]
        fingerprint: Option<String>,
        /// Look the message up by its event id instead.
        #[arg(long)]
        event_id: Option<String>,
        /// Why (required; recorded in the audit).
        #[arg(long)]
        reason: String,
        /// Replay a delivered message too (the receiver gets the same event id again).
        #[arg(long)]
        force: bool,
        /// Set expires_at to this RFC 3339 time.
        #[arg(long, value_name = "TIME", conflicts_with = "clear_expires_at")]
        expires_at: Option<String>,
        /// Clear expires_at.
        #[arg(long)]
        clear_expires_at: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Dead letters: list them, or redrive them in bulk.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
}

/// The dead-letter filters (`herald dlq list|redrive`), as in `GET /v1/dead-letters`.
#[derive(Debug, clap::Args)]
struct DlqFilters {
    /// The class that dead-lettered it: permanent, exhausted, … or unconfirmed (dead-lettered at
    /// the unconfirmed deadline).
    #[arg(long)]
    class: Option<String>,
    /// A host (webhook URLs of that host, email addresses at that domain) or endpoint:NAME.
    #[arg(long)]
    destination: Option<String>,
    /// email or webhook.
    #[arg(long)]
    channel: Option<String>,
    /// Dead-lettered at or after this RFC 3339 time.
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Dead-lettered before this RFC 3339 time.
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
}

impl DlqFilters {
    fn pairs(&self) -> Vec<(String, String)> {
        [
            ("class", &self.class),
            ("destination", &self.destination),
            ("channel", &self.channel),
            ("since", &self.since),
            ("until", &self.until),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k.to_owned(), v.clone())))
        .collect()
    }
}

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// List dead letters, oldest first (identifiers, class, attempts, last status; never bodies).
    /// Exit status: 0 listed, 2 bad filter or configuration.
    List {
        #[command(flatten)]
        filters: DlqFilters,
        /// The cursor a previous page printed (`more: --after …`).
        #[arg(long)]
        after: Option<String>,
        /// Page size (default 50, at most 1000).
        #[arg(long)]
        limit: Option<u32>,
        /// Print JSON (the same document as GET /v1/dead-letters).
        #[arg(long)]
        json: bool,
    },
    /// Replay the dead letters the filters select, oldest first, at most --limit (default 100,
    /// at most 1000), each audited. Exit status: 0 done, 2 bad input or configuration.
    Redrive {
        /// Why (required; recorded in the audit of each).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        filters: DlqFilters,
        /// At most this many (default 100, at most 1000).
        #[arg(long)]
        limit: Option<u32>,
        /// Set expires_at of each to this RFC 3339 time.
        #[arg(long, value_name = "TIME", conflicts_with = "clear_expires_at")]
        expires_at: Option<String>,
        /// Clear expires_at of each.
        #[arg(long)]
        clear_expires_at: bool,
        /// Only dead letters after this position: the `--after` a previous redrive printed
        /// (past the ones it skipped).
        #[arg(long)]
        after: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum EndpointAction {
    /// Every named endpoint and whether it is disabled (and why).
    List,
    /// Enable a disabled endpoint; its held messages become due 2 s later and go out.
    Enable { name: String },
}

/// Exit status of a refused configuration (a setting that cannot work as given).
const EXIT_CONFIG: u8 = 2;

/// How long `herald serve`, once stopped, waits for the last handle on a SQLite database to be
/// dropped (a moment, normally) so that it closes the database before exiting. The hard stop
/// (`app::hard_stop_after`, counted from the signal) still runs meanwhile: a shutdown that used
/// up nearly all of it may end there, with status 1, while it waits.
const DB_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long `herald healthcheck` waits for the answer, connecting included.
const HEALTHCHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `println!` that does not panic when standard output is closed (`herald token … | head -1`,
/// a reader gone): what could not be written is dropped, as `head` wanted.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*)
            && e.kind() != std::io::ErrorKind::BrokenPipe
        {
            // Any other failure (a full disk under `> file`) is not a success.
            eprintln!("herald: cannot write to standard output: {e}");
            std::process::exit(1);
        }
    }};
}

fn main() -> ExitCode {
    // SAFETY: one thread so far, and every connection Herald opens is used by one thread at a
    // time. Refused (false) only if SQLite was already initialized: it then stays serialized.
    let _ = unsafe { herald::storage::configure_sqlite_for_single_thread_connections() };
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // One line, the whole cause chain, no backtrace: `herald: invalid configuration: …`.
            // Once JSON logging is set up, that line is a JSON log line too.
            if herald::telemetry::active_format() == Some(herald::telemetry::LogFormat::Json) {
                tracing::error!(error = %format!("{e:#}"), "herald stopped");
            } else {
                eprintln!("herald: {e:#}");
            }
            if e.chain().any(|c| c.downcast_ref::<ConfigError>().is_some()) {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::VerifyReceipt {
        scheme,
        secrets,
        headers,
        body_file,
        url,
        method,
        params,
        at,
        cert_file,
    } = &cli.command
    {
        // Offline: no configuration, no database, no logging set-up needed. Exit 0 valid, 1
        // refused; a request it cannot check (a file it cannot read, an unknown scheme or
        // option) is 2, never taken for a refused signature.
        let verdict = (|| -> anyhow::Result<bool> {
            let cert = match cert_file {
                Some(p) => Some(
                    std::fs::read(p)
                        .with_context(|| format!("--cert-file: cannot read {}", p.display()))?,
                ),
                None => None,
            };
            let params = params
                .iter()
                .map(|p| {
                    p.split_once('=')
                        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
                        .with_context(|| format!("--param {p:?} is not KEY=VALUE"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let request = herald::ingest::OfflineRequest {
                scheme,
                secrets,
                headers: &[],
                url: url.as_deref(),
                method: Some(method.as_str()),
                params: &params,
            };
            verify_receipt(request, headers, body_file, cert, *at)
        })();
        return Ok(match verdict {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("herald: {e:#}");
                ExitCode::from(EXIT_CONFIG)
            }
        });
    }
    if let Command::Token { name, scope } = &cli.command {
        return new_token(name, scope);
    }
    if let Command::Healthcheck = cli.command {
        // No logging set-up: a probe prints one line at most. Every failure is exit 1, a refused
        // configuration too (Docker reserves 2 for HEALTHCHECK).
        let settings = match Settings::load(cli.config.as_deref()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("herald: unhealthy: invalid configuration: {e}");
                return Ok(ExitCode::FAILURE);
            }
        };
        return Ok(
            match herald::app::check_health(&settings.listen, HEALTHCHECK_TIMEOUT) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("herald: unhealthy: {e:#}");
                    ExitCode::FAILURE
                }
            },
        );
    }
    let settings = Settings::load(cli.config.as_deref()).context("invalid configuration")?;
    herald::telemetry::init(settings.log_format);
    if !settings.unread_env.is_empty() {
        // Names only: a value may be a secret.
        tracing::warn!(
            variables = settings.unread_env.join(","),
            "HERALD_ variables no setting reads (a typo?); ignored"
        );
    }
    for warning in &settings.warnings {
        tracing::warn!("configuration: {warning}");
    }
    if !settings.empty_env.is_empty() {
        tracing::warn!(
            variables = settings.empty_env.join(","),
            "HERALD_ variables set but empty: taken as not set"
        );
    }
    match cli.command {
        Command::Serve { no_migrate } => {
            // A multi-threaded runtime: the sender's sends use every core (the HTTP workers have
            // threads of their own). Herald is built inside it — its parts (the SMTP transport,
            // the HTTP client) may need a running reactor — and on the blocking pool, because
            // opening and migrating the database is synchronous, as every diesel call is.
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            let mut closed = None;
            let served = runtime.block_on(async {
                let herald = tokio::task::spawn_blocking(move || {
                    Herald::build(settings, Arc::new(SystemClock), !no_migrate)
                })
                .await
                .context("start-up failed")??;
                closed = herald.db.closed();
                herald.serve().await
            });
            // Tasks still holding the database end with the runtime; threads that hold it (the
            // HTTP workers' state, the group writers) end by themselves a moment after the
            // server stopped. Exiting before the last handle is dropped would leave SQLite's WAL
            // uncheckpointed beside the database file (see `Closed`).
            drop(runtime);
            if let Some(closed) = closed
                && !closed.wait(DB_CLOSE_WAIT)
            {
                tracing::warn!(
                    seconds = DB_CLOSE_WAIT.as_secs(),
                    "the database is still in use after shutdown: exiting without closing it; \
                     the next start reads its WAL"
                );
            }
            served?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate => {
            let db = open_db_for_a_command(&settings, true)?;
            sync_subscriptions(&db, &settings)?;
            herald::app::record_policies(&db, &settings)?;
            out!("migrations applied");
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain { .. }
        | Command::Replay { .. }
        | Command::Skip { .. }
        | Command::Dlq { .. } => support_command(cli.command, &settings),
        Command::VerifyReceipt { .. } | Command::Token { .. } => {
            unreachable!("handled before configuration is loaded")
        }
        Command::Healthcheck => unreachable!("handled before logging is set up"),
        Command::Endpoint { action } => {
            // Not migrated here (a mistyped database URL would be created and migrated, and
            // answer nothing): `herald migrate` or `herald serve` does that.
            let db = open_db_for_a_command(&settings, false)?;
            match action {
                EndpointAction::List => {
                    if settings.endpoints.is_empty() {
                        eprintln!("herald: no endpoints are configured ([endpoints.NAME])");
                    }
                    let disabled = db.disabled_endpoints()?;
                    for name in settings.endpoints.keys() {
                        match disabled.iter().find(|d| &d.name == name) {
                            Some(d) => out!(
                                "{name}\tdisabled since {}\t{}",
                                d.disabled_at
                                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                                herald::telemetry::printable(d.reason.as_deref().unwrap_or(""))
                            ),
                            None => out!("{name}\tenabled"),
                        }
                    }
                    Ok(ExitCode::SUCCESS)
                }
                EndpointAction::Enable { name } => {
                    if !settings.endpoints.contains_key(&name) {
                        eprintln!("herald: no endpoint named {name:?} is configured");
                        return Ok(ExitCode::FAILURE);
                    }
                    let changed = db.enable_endpoint(&name, chrono::Utc::now())?;
                    out!(
                        "{name}: {}",
                        if changed {
                            "enabled"
                        } else {
                            "was not disabled"
                        }
                    );
                    Ok(ExitCode::SUCCESS)
                }
            }
        }
        Command::ApiToken => {
            match api_token(&open_db_for_a_command(&settings, true)?, &settings)? {
                Some(t) => {
                    out!("{t}");
                    Ok(ExitCode::SUCCESS)
                }
                // Nothing on standard output: `TOKEN=$(herald api-token)` must not take this for
                // a token.
                None => {
                    eprintln!(
                        "herald: tokens are configured (HERALD_API_TOKEN or [tokens.NAME]), so the generated token is not accepted: use one of those"
                    );
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Purge => {
            let db = open_db_for_a_command(&settings, false)?;
            let now = herald::clock::Clock::now(&SystemClock);
            // What a pass deleted is printed even when an error ended it: its earlier batches
            // were committed, and a script that retries must know they are gone.
            let (report, failed) = match herald::retention::run_once(&db, &settings.retention, now)
            {
                Ok(report) => (report, None),
                Err(failed) => (failed.committed, Some(failed.error)),
            };
            let _ = writeln!(
                std::io::stdout(),
                "{}",
                herald::telemetry::json_printable(&report, true)?
            );
            match failed {
                None => Ok(ExitCode::SUCCESS),
                Some(e) => Err(anyhow::anyhow!(
                    "retention failed after {} committed batches (printed above): {}",
                    report.transactions(),
                    e.log_safe()
                )),
            }
        }
        Command::WebhookSecret => {
            match webhook_secret(&open_db_for_a_command(&settings, true)?, &settings)? {
                Some(s) => {
                    out!("{s}");
                    Ok(ExitCode::SUCCESS)
                }
                // Nothing on standard output, as `api-token`: `SECRET=$(herald webhook-secret)`
                // must not take this sentence for the secret.
                None => {
                    eprintln!(
                        "herald: HERALD_WEBHOOK_SECRET (or webhook_secret in the config file) is set; that value is used, and not shown here"
                    );
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}

/// `herald explain | replay | dlq …`: the library's support functions on the configured
/// database (not migrated here: `herald migrate` or `herald serve` does that), printed as tables
/// or `--json`; the exit status follows [`herald::support::exit_code`].
fn support_command(command: Command, settings: &Settings) -> anyhow::Result<ExitCode> {
    use herald::support::{self, Lookup, render};
    let json = match &command {
        Command::Explain { json, .. }
        | Command::Replay { json, .. }
        | Command::Skip { json, .. } => *json,
        Command::Dlq {
            command: DlqCommand::List { json, .. } | DlqCommand::Redrive { json, .. },
        } => *json,
        _ => false,
    };
    let db = match open_db_for_a_command(settings, false) {
        Ok(db) => db,
        Err(e) => {
            // `--json` prints its errors as documents, also one before any lookup (no database
            // there, none reachable): it printed nothing.
            if json {
                let doc = serde_json::json!({"error": "storage", "detail": format!("{e:#}")});
                out!("{}", herald::telemetry::json_printable(&doc, true)?);
            }
            return Err(e);
        }
    };
    let policies = settings.policies();
    let now = || herald::clock::Clock::storage_now(&SystemClock);
    let who = support::cli_who(
        // An empty or blank USER falls back to LOGNAME, as the README says.
        ["USER", "LOGNAME"]
            .iter()
            .filter_map(|v| std::env::var(v).ok())
            .find(|u| !u.trim().is_empty()),
    );
    let lookup = |fp: Option<String>, event_id: Option<String>| match event_id {
        Some(id) => Ok(Lookup::event_id(&id)),
        None => Lookup::fingerprint(fp.as_deref().unwrap_or_default()),
    };
    let expires = |set: Option<String>, clear: bool| -> Result<_, support::SupportError> {
        Ok(match (set, clear) {
            (_, true) => Some(None),
            (Some(t), false) => Some(Some(herald::domain::parse_time("expires_at", &t)?)),
            (None, false) => None,
        })
    };
    let (json, result): (
        bool,
        Result<(String, serde_json::Value), support::SupportError>,
    ) = match command {
        Command::Explain {
            fingerprint,
            event_id,
            json,
        } => (
            json,
            lookup(fingerprint, event_id)
                .map_err(Into::into)
                .and_then(|l| support::explain(&db, &l, &policies))
                .map(|e| (render::explanation(&e), serde_json::json!(e))),
        ),
        Command::Replay {
            fingerprint,
            event_id,
            reason,
            force,
            expires_at,
            clear_expires_at,
            json,
        } => (
            json,
            (|| {
                let request = support::ReplayRequest {
                    reason: support::Reason::parse(&reason)?,
                    force,
                    expires_at: expires(expires_at, clear_expires_at)?,
                };
                let l = lookup(fingerprint, event_id)?;
                support::replay(&db, now(), &l, &request, &who)
            })()
            .map(|r| (render::replayed(&r), serde_json::json!(r))),
        ),
        Command::Skip {
            event_id,
            reason,
            json,
        } => (
            json,
            (|| {
                let request = support::SkipRequest {
                    reason: support::Reason::parse(&reason)?,
                };
                support::skip(&db, now(), &event_id, &request, &who)
            })()
            .map(|row| {
                (
                    format!(
                        "skipped: {} no longer holds ordering key {}; the key's next message is due\n",
                        row.event_id,
                        row.ordering_key.as_deref().unwrap_or("")
                    ),
                    serde_json::json!({
                        "event_id": row.event_id,
                        "state": row.state,
                        "ordering_key": row.ordering_key,
                        "ordering_released_at": row.ordering_released_at,
                    }),
                )
            }),
        ),
        Command::Dlq {
            command:
                DlqCommand::List {
                    filters,
                    after,
                    limit,
                    json,
                },
        } => {
            let mut pairs = filters.pairs();
            pairs.extend(after.map(|a| ("after".to_owned(), a)));
            pairs.extend(limit.map(|n| ("limit".to_owned(), n.to_string())));
            (
                json,
                support::parse_list_query(&pairs)
                    .map_err(Into::into)
                    .and_then(|req| support::dead_letters(&db, &req))
                    .map(|p| (render::dead_letters(&p), serde_json::json!(p))),
            )
        }
        Command::Dlq {
            command:
                DlqCommand::Redrive {
                    reason,
                    filters,
                    limit,
                    expires_at,
                    clear_expires_at,
                    after,
                    json,
                },
        } => (
            json,
            (|| {
                let request = support::redrive_request(
                    &filters.pairs(),
                    &reason,
                    limit,
                    expires(expires_at, clear_expires_at)?,
                    after.as_deref(),
                )?;
                support::redrive(&db, now(), &request, &who)
            })()
            .map(|r| (render::redrive(&r), serde_json::json!(r))),
        ),
        _ => unreachable!("only support commands come here"),
    };
    let mut out = std::io::stdout();
    match result {
        Ok((text, value)) => {
            // A closed pipe (`| head`) is not an error worth a panic.
            let _ = if json {
                writeln!(out, "{}", herald::telemetry::json_printable(&value, true)?)
            } else {
                // Stored text (an event id, a reason) shown, never obeyed by the terminal.
                write!(out, "{}", herald::telemetry::printable(&text))
            };
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            if let support::SupportError::Storage(s) = &e {
                eprintln!("herald: {}", s.log_safe());
            } else {
                // It may quote stored text (a blocking head's event id).
                eprintln!("herald: {}", herald::telemetry::printable(&e.to_string()));
            }
            if let Some(hint) = support::cli_hint(&e) {
                eprintln!("  {hint}");
            }
            if let Some(candidates) = e.candidates() {
                for c in candidates {
                    eprintln!(
                        "  {}  {}  {}",
                        c.fingerprint.as_deref().unwrap_or("-"),
                        c.state,
                        herald::telemetry::printable(&c.event_id)
                    );
                }
            }
            if json {
                let _ = writeln!(
                    out,
                    "{}",
                    herald::telemetry::json_printable(&support::error_json(&e), true)?
                );
            }
            Ok(ExitCode::from(support::exit_code(&e)))
        }
    }
}

/// `herald token NAME --scope S`: a fresh token and its config lines.
fn new_token(name: &str, scope: &str) -> anyhow::Result<ExitCode> {
    // A bad command line: exit 2, as clap's own refusals and configuration refusals are.
    if !herald::auth::valid_name(name) {
        eprintln!(
            "herald: NAME: {name:?} is not a token name (1–64 of A–Z, a–z, 0–9, '-', '_', '.')"
        );
        return Ok(ExitCode::from(EXIT_CONFIG));
    }
    if herald::auth::Scope::parse(scope).is_none() {
        eprintln!("herald: --scope: must be send, support or admin");
        return Ok(ExitCode::from(EXIT_CONFIG));
    }
    let token = herald::auth::generate();
    out!("token: {token}");
    out!();
    out!("# herald.toml (the token itself is not stored; keep it where the client can read it)");
    // A name with a `.` is quoted: `[tokens.a.b]` would be a table `b` inside `a`.
    if name.contains('.') {
        out!("[tokens.\"{name}\"]");
    } else {
        out!("[tokens.{name}]");
    }
    out!("sha256 = \"{}\"", herald::auth::digest_hex(&token));
    out!("scope = \"{scope}\"");
    Ok(ExitCode::SUCCESS)
}

fn verify_receipt(
    request: herald::ingest::OfflineRequest<'_>,
    headers: &[String],
    body_file: &std::path::Path,
    cert: Option<Vec<u8>>,
    at: Option<i64>,
) -> anyhow::Result<bool> {
    let body = std::fs::read(body_file)
        .with_context(|| format!("--body-file: cannot read {}", body_file.display()))?;
    let headers = headers
        .iter()
        .map(|h| {
            h.split_once(':')
                .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
                .with_context(|| format!("--header {h:?} is not 'Name: value'"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let at = match at {
        Some(s) => {
            chrono::DateTime::from_timestamp(s, 0).context("--at is not a valid Unix time")?
        }
        None => chrono::Utc::now(),
    };
    let request = herald::ingest::OfflineRequest {
        headers: &headers,
        ..request
    };
    let verdict = herald::ingest::verify_request_offline(&request, &body, cert, at)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = writeln!(
        std::io::stdout(),
        "{}",
        herald::telemetry::json_printable(&verdict, true)?
    );
    Ok(verdict.valid)
}
