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

/// Compares in constant time (`subtle`), for secrets and signatures: the time taken depends on
/// the lengths only, never on where the bytes differ; a length mismatch is a mismatch.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"whsec_abc", b"whsec_abc"));
        assert!(!constant_time_eq(b"whsec_abc", b"whsec_abd"));
        assert!(!constant_time_eq(b"xhsec_abc", b"whsec_abc"));
        assert!(!constant_time_eq(b"whsec_ab", b"whsec_abc"), "a prefix");
        assert!(!constant_time_eq(b"whsec_abc", b"whsec_ab"));
        assert!(!constant_time_eq(b"", b"a"));
        // Every single-bit difference is seen.
        let a = [0u8; 32];
        for i in 0..32 {
            for bit in 0..8 {
                let mut b = a;
                b[i] ^= 1 << bit;
                assert!(!constant_time_eq(&a, &b), "byte {i} bit {bit}");
            }
        }
    }

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::new("whsec_c3VwZXJzZWNyZXQ=");
        let shown = format!("{s:?} {:?}", Some(&s));
        assert!(!shown.contains("c3VwZXJz"), "{shown}");
        assert_eq!(s.expose(), "whsec_c3VwZXJzZWNyZXQ=");
    }
}
