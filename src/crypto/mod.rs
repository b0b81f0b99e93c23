//! Cryptography more than one module needs: the Standard Webhooks signing key (outbound
//! webhooks are signed with it, inbound `standard-webhooks` receipts verified with it) and the
//! process's rustls provider. Imports nothing from the crate, so `channels` and `ingest` can
//! both use it without reaching into each other.

pub mod signing;

/// Installs ring as the process's rustls provider (once; later calls are no-ops).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
