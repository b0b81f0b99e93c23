//! Shared by the JWT-signing schemes (vonage's Messages API, messagebird): an HMAC-signed JWT
//! checked by `jsonwebtoken` (header, signature in constant time, the algorithm allow-list:
//! `none` and every asymmetric algorithm refused), then its claims checked here against the
//! injected clock — `jsonwebtoken` reads the system clock, so its own time checks stay off.

use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::ingest::{VerifyError, constant_time_eq};

/// The claims of a token whose signature held under one of `secrets` with one of `algorithms`.
pub fn verify_hmac(
    token: &str,
    secrets: &[String],
    algorithms: &[Algorithm],
) -> Result<Map<String, Value>, VerifyError> {
    let mut validation = Validation::new(algorithms.first().copied().unwrap_or_default());
    validation.algorithms = algorithms.to_vec();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    for secret in secrets {
        let key = DecodingKey::from_secret(secret.as_bytes());
        if let Ok(data) = jsonwebtoken::decode::<Value>(token.trim(), &key, &validation) {
            return match data.claims {
                Value::Object(m) => Ok(m),
                _ => Err(VerifyError::Mismatch),
            };
        }
    }
    Err(VerifyError::Mismatch)
}

/// A string claim.
pub fn claim_str<'a>(claims: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    claims.get(name).and_then(Value::as_str)
}

/// An integer (Unix seconds) claim; a float is truncated, anything else is absent.
pub fn claim_secs(claims: &Map<String, Value>, name: &str) -> Option<i64> {
    let v = claims.get(name)?;
    v.as_i64()
        .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
}

/// Whether a hex SHA-256 claim equals the digest of `data` (case-insensitive, constant time).
pub fn sha256_claim_matches(claim: &str, data: &[u8]) -> bool {
    constant_time_eq(
        hex::encode(Sha256::digest(data)).as_bytes(),
        claim.to_ascii_lowercase().as_bytes(),
    )
}

/// `nbf`/`exp` with `leeway` seconds, as MessageBird's validators check them: refused when
/// `now < nbf − leeway` or `now > exp + leeway`. A token without `exp` never validates.
pub fn within_validity(
    claims: &Map<String, Value>,
    now: DateTime<Utc>,
    leeway: i64,
) -> Result<(), VerifyError> {
    let now = now.timestamp();
    let nbf = claim_secs(claims, "nbf").unwrap_or(0);
    let exp = claim_secs(claims, "exp").ok_or(VerifyError::Missing("the token's exp"))?;
    if now < nbf.saturating_sub(leeway) || now > exp.saturating_add(leeway) {
        return Err(VerifyError::Stale(leeway.unsigned_abs()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    fn token(alg: Algorithm, claims: Value, secret: &str) -> String {
        jsonwebtoken::encode(
            &Header::new(alg),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    #[test]
    fn hmac_tokens_verify_under_any_listed_secret_and_algorithm_only() {
        let hs = [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];
        let t = token(Algorithm::HS384, json!({"iss": "x"}), "k2");
        let secrets = ["k1".to_owned(), "k2".to_owned()];
        assert_eq!(
            claim_str(&verify_hmac(&t, &secrets, &hs).unwrap(), "iss"),
            Some("x")
        );
        assert_eq!(
            verify_hmac(&t, &secrets, &[Algorithm::HS256]),
            Err(VerifyError::Mismatch),
            "an algorithm outside the list"
        );
        assert_eq!(
            verify_hmac(&t, &["k3".into()], &hs),
            Err(VerifyError::Mismatch)
        );
        // alg none: header {"alg":"none","typ":"JWT"}, claims {"iss":"x"}, no signature.
        let none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJpc3MiOiJ4In0.";
        assert_eq!(verify_hmac(none, &secrets, &hs), Err(VerifyError::Mismatch));
        for junk in ["", ".", "..", "a.b.c", "eyJ9.eyJ9.x"] {
            assert_eq!(verify_hmac(junk, &secrets, &hs), Err(VerifyError::Mismatch));
        }
        // Claims that are not an object.
        let arr = token(Algorithm::HS256, json!([1]), "k1");
        assert_eq!(verify_hmac(&arr, &secrets, &hs), Err(VerifyError::Mismatch));
    }

    #[test]
    fn validity_window_with_leeway() {
        let c = |v: Value| v.as_object().unwrap().clone();
        let at = |s| Utc.timestamp_opt(s, 0).unwrap();
        let claims = c(json!({"nbf": 100, "exp": 160}));
        assert!(within_validity(&claims, at(99), 1).is_ok());
        assert!(within_validity(&claims, at(98), 1).is_err());
        assert!(within_validity(&claims, at(161), 1).is_ok());
        assert!(within_validity(&claims, at(162), 1).is_err());
        assert!(within_validity(&c(json!({"nbf": 100})), at(120), 1).is_err());
        assert!(within_validity(&c(json!({"exp": 160})), at(120), 1).is_ok());
        assert!(within_validity(&c(json!({"exp": "160"})), at(120), 1).is_err());
    }

    #[test]
    fn digest_claims() {
        let sha = "dffd6021bb2bd5b0af676290809ec3a53191dd81c7f70a4b28688a362182986f";
        assert!(sha256_claim_matches(sha, b"Hello, World!"));
        assert!(sha256_claim_matches(&sha.to_uppercase(), b"Hello, World!"));
        assert!(!sha256_claim_matches(sha, b"Hello, World"));
        assert!(!sha256_claim_matches("", b""));
    }
}
