//! The `herald` command: CLI parsing and wiring only; the logic lives in the library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

use herald::app::{Herald, api_token, open_db, sync_subscriptions, webhook_secret};
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
}

#[derive(Debug, Subcommand)]
enum EndpointAction {
    /// Every named endpoint and whether it is disabled (and why).
    List,
    /// Enable a disabled endpoint; its held messages go out as they come due (within 30 s).
    Enable { name: String },
}

/// Exit status of a refused configuration (a setting that cannot work as given).
const EXIT_CONFIG: u8 = 2;

/// How long `herald healthcheck` waits for the answer, connecting included.
const HEALTHCHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn main() -> ExitCode {
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
        // Offline: no configuration, no database, no logging set-up needed.
        let cert = match cert_file {
            Some(p) => {
                Some(std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?)
            }
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
        let valid = verify_receipt(request, headers, body_file, cert, *at)?;
        return Ok(if valid {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
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
            runtime.block_on(async move {
                let herald = tokio::task::spawn_blocking(move || {
                    Herald::build(settings, Arc::new(SystemClock), !no_migrate)
                })
                .await
                .context("start-up failed")??;
                herald.serve().await
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate => {
            let db = open_db(&settings, true)?;
            sync_subscriptions(&db, &settings)?;
            println!("migrations applied");
            Ok(ExitCode::SUCCESS)
        }
        Command::VerifyReceipt { .. } | Command::Token { .. } => {
            unreachable!("handled before configuration is loaded")
        }
        Command::Healthcheck => unreachable!("handled before logging is set up"),
        Command::Endpoint { action } => {
            let db = open_db(&settings, true)?;
            match action {
                EndpointAction::List => {
                    let disabled = db.disabled_endpoints()?;
                    for name in settings.endpoints.keys() {
                        match disabled.iter().find(|d| &d.name == name) {
                            Some(d) => println!(
                                "{name}\tdisabled since {}\t{}",
                                d.disabled_at
                                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                                d.reason.as_deref().unwrap_or("")
                            ),
                            None => println!("{name}\tenabled"),
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
                    println!(
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
            match api_token(&open_db(&settings, true)?, &settings)? {
                Some(t) => println!("{t}"),
                None => println!(
                    "tokens are configured (HERALD_API_TOKEN or [tokens.NAME]); the generated token is not accepted"
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Purge => {
            let db = open_db(&settings, false)?;
            let now = herald::clock::Clock::now(&SystemClock);
            let report = herald::retention::run_once(&db, &settings.retention, now)
                .map_err(|e| anyhow::anyhow!("retention failed: {}", e.log_safe()))?;
            let _ = writeln!(
                std::io::stdout(),
                "{}",
                serde_json::to_string_pretty(&report)?
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::WebhookSecret => {
            match webhook_secret(&open_db(&settings, true)?, &settings)? {
                Some(s) => println!("{s}"),
                None => println!(
                    "HERALD_WEBHOOK_SECRET (or webhook_secret in the config file) is set; that value is used"
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `herald token NAME --scope S`: a fresh token and its config lines.
fn new_token(name: &str, scope: &str) -> anyhow::Result<ExitCode> {
    if !herald::auth::valid_name(name) {
        anyhow::bail!(
            "invalid configuration: {name:?} is not a token name (1–64 of A–Z, a–z, 0–9, '-', '_', '.')"
        );
    }
    if herald::auth::Scope::parse(scope).is_none() {
        anyhow::bail!("--scope must be send, support or admin");
    }
    let token = herald::auth::generate();
    println!("token: {token}");
    println!();
    println!(
        "# herald.toml (the token itself is not stored; keep it where the client can read it)"
    );
    println!("[tokens.{name}]");
    println!("sha256 = \"{}\"", herald::auth::digest_hex(&token));
    println!("scope = \"{scope}\"");
    Ok(ExitCode::SUCCESS)
}

fn verify_receipt(
    request: herald::ingest::OfflineRequest<'_>,
    headers: &[String],
    body_file: &std::path::Path,
    cert: Option<Vec<u8>>,
    at: Option<i64>,
) -> anyhow::Result<bool> {
    let body =
        std::fs::read(body_file).with_context(|| format!("cannot read {}", body_file.display()))?;
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
        serde_json::to_string_pretty(&verdict)?
    );
    Ok(verdict.valid)
}
