//! The `herald` command: CLI parsing and wiring only; the logic lives in the library.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

use herald::app::{Herald, open_db, webhook_secret};
use herald::clock::SystemClock;
use herald::config::Settings;

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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    herald::telemetry::init();
    let settings = Settings::load(cli.config.as_deref()).context("invalid configuration")?;
    match cli.command {
        Command::Serve { no_migrate } => {
            let herald = Herald::build(settings, Arc::new(SystemClock), !no_migrate)?;
            actix_web::rt::System::new().block_on(async move {
                // Diesel is synchronous: database calls run on the blocking pool.
                herald.serve().await
            })
        }
        Command::Migrate => {
            open_db(&settings, true)?;
            println!("migrations applied");
            Ok(())
        }
        Command::WebhookSecret => {
            match webhook_secret(&open_db(&settings, true)?, &settings)? {
                Some(s) => println!("{s}"),
                None => println!(
                    "HERALD_WEBHOOK_SECRET (or webhook_secret in the config file) is set; that value is used"
                ),
            }
            Ok(())
        }
    }
}
