//! The `herald` command: CLI parsing and wiring only; the logic lives in the library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

use herald::app::{Herald, open_db, webhook_secret};
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
    /// Apply pending database migrations and exit.
    Migrate,
    /// Print the webhook signing secret used for raw-URL destinations (generated and stored in
    /// the database on first use unless HERALD_WEBHOOK_SECRET is set).
    WebhookSecret,
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

/// Exit status of a refused configuration (a setting that cannot work as given).
const EXIT_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // One line, the whole cause chain, no backtrace: `herald: invalid configuration: …`.
            eprintln!("herald: {e:#}");
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
    herald::telemetry::init();
    let settings = Settings::load(cli.config.as_deref()).context("invalid configuration")?;
    match cli.command {
        Command::Serve { no_migrate } => {
            settings.check_serve().context("invalid configuration")?;
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
            open_db(&settings, true)?;
            println!("migrations applied");
            Ok(ExitCode::SUCCESS)
        }
        Command::VerifyReceipt { .. } => unreachable!("handled before configuration is loaded"),
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
