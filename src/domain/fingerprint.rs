//! The request fingerprint: SHA-256 over the canonical outbound request.
//!
//! Covered, in this order and length-prefixed so no two inputs collide by concatenation: a
//! version tag, the channel, the destination as stored, the event id, the body bytes, and the
//! message's own headers (names lower-cased, sorted). Not covered: the per-attempt timestamp and
//! signature, and headers that come from configuration (endpoint headers, auth), so the same
//! message has the same fingerprint on any machine and across secret rotations.

use std::fmt;

use sha2::{Digest, Sha256};

/// Hex SHA-256 of the canonical request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

/// What the fingerprint is computed over.
pub struct FingerprintInput<'a> {
    pub channel: &'a str,
    pub destination: &'a str,
    pub event_id: &'a str,
    pub body: &'a [u8],
    /// The message's own headers; order does not matter.
    pub headers: &'a [(String, String)],
}

impl Fingerprint {
    const VERSION: &'static [u8] = b"herald-request-v1";

    pub fn compute(input: &FingerprintInput<'_>) -> Self {
        let mut hasher = Sha256::new();
        let mut field = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_be_bytes());
            hasher.update(bytes);
        };
        field(Self::VERSION);
        field(input.channel.as_bytes());
        field(input.destination.as_bytes());
        field(input.event_id.as_bytes());
        field(input.body);
        let mut headers: Vec<(String, &str)> = input
            .headers
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.as_str()))
            .collect();
        headers.sort();
        field(&(headers.len() as u64).to_be_bytes());
        for (name, value) in &headers {
            field(name.as_bytes());
            field(value.as_bytes());
        }
        Self(hex::encode(hasher.finalize()))
    }

    /// Accepts a stored or user-supplied fingerprint: 64 lower-case hex digits.
    pub fn parse(raw: &str) -> Option<Self> {
        (raw.len() == 64 && raw.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(body: &'a [u8], headers: &'a [(String, String)]) -> FingerprintInput<'a> {
        FingerprintInput {
            channel: "webhook",
            destination: "https://example.com/hook",
            event_id: "order-1:placed",
            body,
            headers,
        }
    }

    #[test]
    fn same_request_same_fingerprint_on_any_machine() {
        let fp = Fingerprint::compute(&input(br#"{"a":1}"#, &[]));
        // A fixed vector: if this changes, stored fingerprints stop matching.
        assert_eq!(
            fp.as_str(),
            "7263bee6da4a16aad03b057cb9880d9076549095f7a365590c36f9206268bf69"
        );
    }

    #[test]
    fn header_order_and_case_do_not_matter_but_values_do() {
        let a = vec![
            ("X-A".to_owned(), "1".to_owned()),
            ("x-b".into(), "2".into()),
        ];
        let b = vec![
            ("x-b".to_owned(), "2".to_owned()),
            ("x-a".into(), "1".into()),
        ];
        let c = vec![
            ("x-b".to_owned(), "3".to_owned()),
            ("x-a".into(), "1".into()),
        ];
        let fa = Fingerprint::compute(&input(b"{}", &a));
        assert_eq!(fa, Fingerprint::compute(&input(b"{}", &b)));
        assert_ne!(fa, Fingerprint::compute(&input(b"{}", &c)));
        assert_ne!(fa, Fingerprint::compute(&input(b"{ }", &a)));
    }

    #[test]
    fn fields_cannot_bleed_into_each_other() {
        let mut one = input(b"", &[]);
        one.destination = "ab";
        one.event_id = "c";
        let mut two = input(b"", &[]);
        two.destination = "a";
        two.event_id = "bc";
        assert_ne!(Fingerprint::compute(&one), Fingerprint::compute(&two));
    }

    #[test]
    fn parse_accepts_only_lower_hex_sha256() {
        let fp = Fingerprint::compute(&input(b"{}", &[]));
        assert_eq!(Fingerprint::parse(fp.as_str()), Some(fp.clone()));
        assert_eq!(Fingerprint::parse(&fp.as_str().to_uppercase()), None);
        assert_eq!(Fingerprint::parse("abc"), None);
    }
}
