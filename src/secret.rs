//! Secrets that never show up in `Debug`, `Display` or logs.

use std::fmt;

use serde::Deserialize;

/// A secret string (token, password, signing key, URL with credentials).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself; call it only where the value is used, never to log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// Compares without an early exit, for secrets and signatures; a length mismatch is a mismatch.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::new("whsec_c3VwZXJzZWNyZXQ=");
        let shown = format!("{s:?} {:?}", Some(&s));
        assert!(!shown.contains("c3VwZXJz"), "{shown}");
        assert_eq!(s.expose(), "whsec_c3VwZXJzZWNyZXQ=");
    }
}
