//! MessageBird: `MessageBird-Signature-JWT`, a JWT signed with the signing key (HS256, HS384 or
//! HS512 only; `none` and every other algorithm refused), claims as messagebird/go-rest-api's
//! `signature_jwt` checks them: `iss = "MessageBird"`, `nbf`/`exp` with one second of leeway,
//! `jti` present, `url_hash` = SHA-256 of the full URL as received (the public URL and the query
//! verbatim — status reports arrive as GET with everything in the query), and `payload_hash`
//! present exactly when the body is non-empty, equal to its SHA-256. Status reports have no
//! event id: dedup on (`id`, `recipient`, `status`, `statusDatetime`); event time
//! `statusDatetime`; message id `id`.

use chrono::{DateTime, Utc};
use jsonwebtoken::Algorithm;

use super::params::{as_object, first_values, received_url, request_params};
use super::{SchemeConfigError, jwt};
use crate::ingest::{RawRequest, ReceiptEvent, Source, VerifyError, iso_time};

/// The leeway on `nbf` and `exp`, seconds (go-rest-api's `maxSkew`).
pub const LEEWAY: i64 = 1;

pub struct MessageBird {
    keys: Vec<String>,
    public_url: String,
    leeway: i64,
}

impl MessageBird {
    pub fn new(keys: Vec<String>, public_url: &str) -> Result<Self, SchemeConfigError> {
        url::Url::parse(public_url).map_err(SchemeConfigError::InvalidUrl)?;
        Ok(Self {
            keys,
            public_url: public_url.to_owned(),
            leeway: LEEWAY,
        })
    }

    /// Another leeway than [`LEEWAY`]: only `herald verify-receipt`'s second look at an expired
    /// token, to say whether its signature matches (a source cannot set it).
    pub fn with_leeway(mut self, seconds: Option<u64>) -> Self {
        if let Some(s) = seconds {
            self.leeway = i64::try_from(s).unwrap_or(i64::MAX);
        }
        self
    }
}

fn vocabulary(status: &str) -> &'static str {
    match status {
        "scheduled" => "queued",
        "sent" => "sent",
        "buffered" => "deferred",
        "delivered" => "delivered",
        "expired" | "delivery_failed" => "failed",
        _ => "other",
    }
}

impl Source for MessageBird {
    fn scheme(&self) -> &'static str {
        "messagebird"
    }

    fn verify(
        &self,
        r: &RawRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        let token = r
            .header("messagebird-signature-jwt")
            .filter(|t| !t.trim().is_empty())
            .ok_or(VerifyError::Missing("MessageBird-Signature-JWT"))?;
        let claims = jwt::verify_hmac(
            token,
            &self.keys,
            &[Algorithm::HS256, Algorithm::HS384, Algorithm::HS512],
        )?;
        if jwt::claim_str(&claims, "iss") != Some("MessageBird") {
            return Err(VerifyError::NotAccepted(
                "the token's iss is not MessageBird",
            ));
        }
        jwt::within_validity(&claims, now, self.leeway)?;
        if jwt::claim_str(&claims, "jti").is_none_or(str::is_empty) {
            return Err(VerifyError::Missing("the token's jti"));
        }
        let url = received_url(&self.public_url, r.query);
        let url_ok = jwt::claim_str(&claims, "url_hash")
            .is_some_and(|h| jwt::sha256_claim_matches(h, url.as_bytes()));
        if !url_ok {
            return Err(VerifyError::Mismatch);
        }
        let payload_ok = match (
            jwt::claim_str(&claims, "payload_hash").filter(|h| !h.is_empty()),
            r.body.is_empty(),
        ) {
            (None, true) => true,
            (Some(h), false) => jwt::sha256_claim_matches(h, r.body),
            // Set without a body, or a body without it: removed or added in transit.
            _ => false,
        };
        if !payload_ok {
            return Err(VerifyError::Mismatch);
        }
        let pairs = request_params(r)
            .ok_or_else(|| VerifyError::Unparsable("JSON body is not an object".into()))?;
        let mut params = first_values(&pairs);
        if !r.method.eq_ignore_ascii_case("GET") {
            // A POSTed report may still carry its fields in the query.
            for (k, v) in first_values(&super::params::form_pairs(r.query.unwrap_or("").as_bytes()))
            {
                params.entry(k).or_insert(v);
            }
        }
        let (Some(id), Some(status)) = (
            crate::ingest::nonblank(params.get("id")),
            params.get("status"),
        ) else {
            return Err(VerifyError::Unparsable(
                "not a status report (no id and status)".into(),
            ));
        };
        let recipient = params.get("recipient").cloned().unwrap_or_default();
        let at = params.get("statusDatetime").cloned().unwrap_or_default();
        Ok(vec![ReceiptEvent {
            provider_event_id: format!("{id}:{}:{status}:{at}", super::recipient_tag(&recipient)),
            event_type: vocabulary(status).into(),
            provider_type: status.clone(),
            event_time: iso_time(&serde_json::Value::String(at)),
            // The send's `reference`, echoed: Herald's event id when the application put it there.
            herald_event_id: crate::ingest::nonblank(params.get("reference")).cloned(),
            provider_message_id: Some(id.clone()),
            raw: as_object(&params),
            replay_key: None,
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::Value;

    /// messagebird/go-rest-api `signature_jwt/testdata/reference.json`, verbatim in fixtures.
    fn reference() -> Vec<Value> {
        let path = crate::ingest::schemes::fixture_path("messagebird/reference.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn every_reference_case_gets_its_published_verdict() {
        let cases = reference();
        assert_eq!(cases.len(), 43);
        let mut failed = Vec::new();
        for c in &cases {
            let url = c["url"].as_str().unwrap();
            let (public, query) = match url.split_once('?') {
                Some((p, q)) => (p, Some(q)),
                None => (url, None),
            };
            // The one case without a secret (alg none) is checked under any key.
            let secret = c["secret"].as_str().unwrap_or("any").to_owned();
            let v = MessageBird::new(vec![secret], public).unwrap();
            let h = vec![(
                "messagebird-signature-jwt".to_owned(),
                c["token"].as_str().unwrap().to_owned(),
            )];
            let body = c["payload"].as_str().unwrap_or("").as_bytes();
            let now = DateTime::parse_from_rfc3339(c["timestamp"].as_str().unwrap())
                .unwrap()
                .with_timezone(&Utc);
            let r = RawRequest {
                headers: &h,
                body,
                query,
                method: c["method"].as_str().unwrap(),
            };
            let verified = match v.verify(&r, now) {
                Ok(_) | Err(VerifyError::Unparsable(_)) => true,
                Err(_) => false,
            };
            if verified != c["valid"].as_bool().unwrap() {
                failed.push(c["name"].as_str().unwrap().to_owned());
            }
        }
        assert!(failed.is_empty(), "{failed:#?}");
    }

    #[test]
    fn status_reports_normalize() {
        use jsonwebtoken::{EncodingKey, Header};
        use sha2::{Digest, Sha256};
        let query = "id=mb-1&reference=r&recipient=31612345678&status=delivered&statusDatetime=2024-03-04T05%3A06%3A07%2B00%3A00";
        let url = format!("https://h.example/mb?{query}");
        let claims = serde_json::json!({
            "iss": "MessageBird", "nbf": 1709528767, "exp": 1709528827, "jti": "j-1",
            "url_hash": hex::encode(Sha256::digest(url.as_bytes())),
        });
        let token = jsonwebtoken::encode(
            &Header::new(Algorithm::HS512),
            &claims,
            &EncodingKey::from_secret(b"key"),
        )
        .unwrap();
        let h = vec![("MessageBird-Signature-JWT".to_owned(), token)];
        let v = MessageBird::new(vec!["key".into()], "https://h.example/mb").unwrap();
        let r = RawRequest {
            headers: &h,
            body: b"",
            query: Some(query),
            method: "GET",
        };
        let e = &v
            .verify(&r, Utc.timestamp_opt(1709528767, 0).unwrap())
            .unwrap()[0];
        assert_eq!(
            (
                e.provider_event_id.as_str(),
                e.event_type.as_str(),
                e.event_time.unwrap().timestamp(),
                e.provider_message_id.as_deref()
            ),
            (
                "mb-1:e03d152bbe638d9f:delivered:2024-03-04T05:06:07+00:00",
                "delivered",
                1709528767,
                Some("mb-1")
            )
        );
        // The same token on another URL (the query re-ordered) is refused.
        let other = "status=delivered&id=mb-1&reference=r&recipient=31612345678&statusDatetime=2024-03-04T05%3A06%3A07%2B00%3A00";
        assert_eq!(
            v.verify(
                &RawRequest {
                    query: Some(other),
                    ..r
                },
                Utc.timestamp_opt(1709528767, 0).unwrap()
            ),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn every_status_maps_into_the_vocabulary() {
        let got: Vec<_> = [
            "scheduled",
            "sent",
            "buffered",
            "delivered",
            "expired",
            "delivery_failed",
            "x",
        ]
        .iter()
        .map(|s| vocabulary(s))
        .collect();
        assert_eq!(
            got,
            [
                "queued",
                "sent",
                "deferred",
                "delivered",
                "failed",
                "failed",
                "other"
            ]
        );
    }
}
