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
