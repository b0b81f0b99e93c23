//! Standard Webhooks signing: `webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{ts}.{body}")>`,
//! key = base64-decoded secret after the `whsec_` prefix. Several keys (rotation) give several
//! space-separated signatures.

use base64::Engine;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::{DecodePaddingMode, general_purpose};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

/// A webhook signing key. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey(Vec<u8>);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey([redacted])")
    }
}

const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why a signing secret was refused. The text never quotes the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// base64's own error is not kept: it names the offending byte and offset of the secret.
    #[error("must be whsec_ followed by base64")]
    NotBase64,
    #[error("must decode to at least 16 bytes")]
    TooShort,
    #[error("must not be empty")]
    Empty,
}

impl SigningKey {
    /// `whsec_<base64>` (the prefix is optional; padding is lenient).
    pub fn parse(secret: &str) -> Result<Self, KeyError> {
        let raw = secret.trim();
        let b64 = raw.strip_prefix("whsec_").unwrap_or(raw);
        let key = LENIENT.decode(b64).map_err(|_| KeyError::NotBase64)?;
        if key.len() < 16 {
            return Err(KeyError::TooShort);
        }
        Ok(Self(key))
    }

    /// Several secrets separated by commas or spaces (rotation).
    pub fn parse_list(secrets: &str) -> Result<Vec<Self>, KeyError> {
        let keys: Vec<Self> = secrets
            .split([',', ' '])
            .filter(|s| !s.is_empty())
            .map(Self::parse)
            .collect::<Result<_, _>>()?;
        if keys.is_empty() {
            return Err(KeyError::Empty);
        }
        Ok(keys)
    }

    /// A new random 32-byte key, as `whsec_…`.
    pub fn generate() -> String {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        format!("whsec_{}", general_purpose::STANDARD.encode(key))
    }

    /// `v1,<base64 signature>` over `{msg_id}.{timestamp}.{body}`.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        // HMAC takes keys of any length.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// The `webhook-signature` header value for every key.
pub fn signature_header(keys: &[SigningKey], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    keys.iter()
        .map(|k| k.sign(msg_id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_standard_webhooks_spec_example() {
        // The example from the Standard Webhooks specification and its reference libraries.
        let key = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let sig = key.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn several_keys_give_several_signatures() {
        let a = SigningKey::parse(&SigningKey::generate()).unwrap();
        let b = SigningKey::parse(&SigningKey::generate()).unwrap();
        let h = signature_header(&[a.clone(), b.clone()], "m", 1, b"{}");
        let parts: Vec<_> = h.split(' ').collect();
        assert_eq!(parts, [a.sign("m", 1, b"{}"), b.sign("m", 1, b"{}")]);
        assert_ne!(parts[0], parts[1]);
    }

    #[test]
    fn parsing_is_lenient_on_padding_and_strict_on_garbage() {
        assert!(SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_ok());
        assert!(SigningKey::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_ok());
        assert!(SigningKey::parse("whsec_!!!").is_err());
        assert!(SigningKey::parse("whsec_c2hvcnQ=").is_err());
        assert_eq!(
            SigningKey::parse_list(
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
            )
            .unwrap()
            .len(),
            2
        );
        assert!(SigningKey::parse_list(" , ").is_err());
        assert!(
            !format!("{:?}", SigningKey::parse(&SigningKey::generate()).unwrap()).contains('=')
        );
    }

    #[test]
    fn refusals_read_as_they_always_have() {
        let parse = |s| SigningKey::parse(s).unwrap_err().to_string();
        assert_eq!(parse("whsec_!!!"), "must be whsec_ followed by base64");
        assert_eq!(parse("whsec_c2hvcnQ="), "must decode to at least 16 bytes");
        assert_eq!(
            SigningKey::parse_list(" , ").unwrap_err().to_string(),
            "must not be empty"
        );
    }
}
