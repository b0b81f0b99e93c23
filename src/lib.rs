//! Herald: a self-hosted webhook-ingest and notification gateway built on the transactional
//! outbox pattern.
//!
//! Layout: [`http`] calls into [`outbox`] and [`support`]; [`sender`] claims, sends through [`channels`] and
//! records; [`storage`] is the only place that speaks SQL; [`domain`] holds the contract's
//! vocabulary; the pure decisions live in [`sender::decide`] and [`sender::policy`]. Each built
//! Herald counts its work in its own [`metrics::Metrics`]; [`health`] decides readiness.

pub mod admin;
pub mod app;
pub mod auth;
pub mod channels;
pub mod clock;
pub mod config;
pub mod crypto;
pub mod domain;
pub mod health;
pub mod http;
pub mod ingest;
pub mod metrics;
pub mod outbox;
pub mod reconcile;
pub mod retention;
pub mod secret;
pub mod sender;
pub mod storage;
pub mod support;
pub mod telemetry;

/// A path inside this checkout, for tests: `cargo test` names the package's directory at run
/// time; the compile-time `env!("CARGO_MANIFEST_DIR")` is only the fallback, because a test
/// binary that cargo reuses from a shared target directory still carries the checkout it was
/// built in, which may be another clone, or gone.
#[cfg(test)]
pub(crate) fn repo_path(rel: &str) -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
        .join(rel)
}
