//! Logging set-up and masking helpers. Log lines carry event ids, classes and hashes; never
//! bodies, addresses, tokens or full URLs.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber: `RUST_LOG` (default `info`), plain text to stderr.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// `user@example.com` → `u***@e***.com`.
pub fn mask_email(address: &str) -> String {
    let Some((local, domain)) = address.rsplit_once('@') else {
        return mask_opaque(address);
    };
    let (host, tld) = domain.rsplit_once('.').unwrap_or((domain, ""));
    let first = |s: &str| s.chars().next().map(String::from).unwrap_or_default();
    let tld = if tld.is_empty() {
        String::new()
    } else {
        format!(".{tld}")
    };
    format!("{}***@{}***{}", first(local), first(host), tld)
}

/// `text` with every `:`-separated part that holds an address masked (a provider's composite
/// event id such as Postmark's `Delivery:ID:ada@example.com:TIME`).
pub fn mask_emails_in(text: &str) -> String {
    text.split(':')
        .map(|part| {
            if part.contains('@') {
                mask_email(part)
            } else {
                part.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(":")
}

/// A URL reduced to scheme and host: path, query and credentials can carry secrets.
pub fn mask_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => format!("{}://{}/…", u.scheme(), u.host_str().unwrap_or("?")),
        Err(_) => mask_opaque(url),
    }
}

fn mask_opaque(value: &str) -> String {
    format!("[{} chars]", value.chars().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_keep_only_a_hint() {
        assert_eq!(mask_email("user@example.com"), "u***@e***.com");
        assert_eq!(mask_email("nodomain"), "[8 chars]");
        assert_eq!(
            mask_url("https://u:p@hooks.example.com/secret/path?token=x"),
            "https://hooks.example.com/…"
        );
    }
}
