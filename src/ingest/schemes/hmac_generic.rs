//! A generic HMAC-SHA256 scheme for providers not listed: a configurable header, hex or base64,
//! over the body or over `{timestamp}.{body}` (with a timestamp header and a tolerance), and JSON
//! pointers for the event id, type and time. Without an id pointer match, the event id is the
//! SHA-256 of the body (a retry of the same body is then a duplicate).

use base64::Engine;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{SchemeConfigError, SourceConfig, hmac_sha256};
use crate::ingest::{
    RawRequest, ReceiptEvent, Source, VerifyError, constant_time_eq, iso_time, str_at, unix_time,
    within,
};

pub struct GenericHmac {
    secrets: Vec<String>,
    header: String,
    base64: bool,
    timestamp_header: Option<String>,
    prefix: String,
    tolerance: u64,
    id_pointer: String,
    type_pointer: String,
    time_pointer: Option<String>,
}

impl GenericHmac {
    pub fn new(secrets: Vec<String>, c: &SourceConfig) -> Result<Self, SchemeConfigError> {
        let base64 = match c.encoding.as_deref().unwrap_or("hex") {
            "hex" => false,
            "base64" => true,
            other => return Err(SchemeConfigError::Encoding(other.to_owned())),
        };
        let timestamp_header = match c.signed.as_deref().unwrap_or("body") {
            "body" => None,
            "timestamp.body" => Some(
                c.timestamp_header
                    .clone()
                    .unwrap_or_else(|| "x-timestamp".into()),
            ),
            other => return Err(SchemeConfigError::Signed(other.to_owned())),
        };
        Ok(Self {
            secrets,
            header: c.header.clone().unwrap_or_else(|| "x-signature".into()),
            base64,
            timestamp_header,
            prefix: c.prefix.clone().unwrap_or_default(),
            tolerance: c.tolerance_seconds.unwrap_or(super::DEFAULT_TOLERANCE),
            id_pointer: c.event_id_pointer.clone().unwrap_or_else(|| "/id".into()),
            type_pointer: c
                .event_type_pointer
                .clone()
                .unwrap_or_else(|| "/type".into()),
            time_pointer: c.event_time_pointer.clone(),
        })
    }
}

impl Source for GenericHmac {
    fn scheme(&self) -> &'static str {
        "hmac"
    }

    fn id_field(&self) -> &str {
        &self.id_pointer
    }

    fn verify(
        &self,
        r: &RawRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        let given = r
            .header(&self.header)
            .ok_or(VerifyError::Missing("signature header"))?;
        let given = given
            .trim()
            .strip_prefix(self.prefix.as_str())
            .ok_or(VerifyError::Mismatch)?;
        let mut parts: Vec<&[u8]> = Vec::new();
        if let Some(h) = &self.timestamp_header {
            let ts = r
                .header(h)
                .ok_or(VerifyError::Missing("timestamp header"))?;
            let t: i64 = ts.trim().parse().map_err(|_| VerifyError::Mismatch)?;
            if !within(t, now, self.tolerance, true) {
                return Err(VerifyError::Stale(self.tolerance));
            }
            parts.push(ts.trim().as_bytes());
            parts.push(b".");
        }
        parts.push(r.body);
        let ok = self.secrets.iter().any(|s| {
            let mac = hmac_sha256(s.as_bytes(), &parts);
            let expected = if self.base64 {
                base64::engine::general_purpose::STANDARD.encode(mac)
            } else {
                hex::encode(mac)
            };
            let given = if self.base64 {
                given.to_owned()
            } else {
                given.to_ascii_lowercase()
            };
            constant_time_eq(expected.as_bytes(), given.as_bytes())
        });
        if !ok {
            return Err(VerifyError::Mismatch);
        }
        let body: Value =
            serde_json::from_slice(r.body).map_err(|e| VerifyError::Unparsable(e.to_string()))?;
        // No id, or a blank one: the body's digest (a blank id would be every receipt's key).
        let id = crate::ingest::nonblank(str_at(&body, &self.id_pointer))
            .unwrap_or_else(|| hex::encode(Sha256::digest(r.body)));
        let given = self.time_pointer.as_deref().and_then(|p| body.pointer(p));
        let event_time = given.and_then(|v| {
            unix_time(v)
                .or_else(|| iso_time(v))
                .or_else(|| crate::ingest::rfc2822_time(v))
        });
        // Stored all the same (a refusal would lose it), but said: without its time it is
        // ordered by its arrival, and an older receipt arriving later wins (a walk-through
        // found an ISO time without a zone dropped without a word).
        if event_time.is_none() && given.is_some_and(|v| !v.is_null()) {
            tracing::warn!(
                pointer = self.time_pointer.as_deref().unwrap_or_default(),
                "a receipt's event time is not one Herald reads (Unix seconds, RFC 3339 with its \
                 offset, RFC 2822): stored without one, ordered by its arrival"
            );
        }
        let provider_type = str_at(&body, &self.type_pointer).unwrap_or_else(|| "unknown".into());
        let event_type = if crate::ingest::VOCABULARY.contains(&provider_type.as_str()) {
            provider_type.clone()
        } else {
            "other".into()
        };
        Ok(vec![ReceiptEvent {
            provider_event_id: id,
            event_type,
            provider_type,
            event_time,
            herald_event_id: str_at(&body, "/herald_event_id"),
            provider_message_id: str_at(&body, "/message_id"),
            raw: body,
            replay_key: None,
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn body_and_timestamp_forms() {
        let body = br#"{"id":"e1","type":"delivered","at":1700000000}"#;
        let c = SourceConfig {
            header: Some("X-Sig".into()),
            prefix: Some("sha256=".into()),
            event_time_pointer: Some("/at".into()),
            ..Default::default()
        };
        let v = GenericHmac::new(vec!["k".into()], &c).unwrap();
        let sig = format!("sha256={}", hex::encode(hmac_sha256(b"k", &[body])));
        let h = vec![("x-sig".to_owned(), sig)];
        let e = v
            .verify(
                &RawRequest {
                    headers: &h,
                    body,
                    query: None,
                    method: "POST",
                },
                Utc::now(),
            )
            .unwrap();
        assert_eq!(
            (e[0].provider_event_id.as_str(), e[0].event_type.as_str()),
            ("e1", "delivered")
        );
        assert_eq!(e[0].event_time.unwrap().timestamp(), 1700000000);
        // The forms of a time it reads, and one it does not (no zone: which one?).
        for (at, read) in [
            ("\"2023-11-14T22:13:20Z\"", Some(1700000000)),
            ("\"2023-11-14T23:13:20+01:00\"", Some(1700000000)),
            ("\"Tue, 14 Nov 2023 22:13:20 +0000\"", Some(1700000000)),
            ("\"1700000000\"", Some(1700000000)),
            ("\"2023-11-14T22:13:20\"", None),
        ] {
            let body = format!(r#"{{"id":"e2","type":"delivered","at":{at}}}"#);
            let sig = format!(
                "sha256={}",
                hex::encode(hmac_sha256(b"k", &[body.as_bytes()]))
            );
            let h = vec![("x-sig".to_owned(), sig)];
            let r = RawRequest {
                headers: &h,
                body: body.as_bytes(),
                query: None,
                method: "POST",
            };
            let e = v.verify(&r, Utc::now()).unwrap();
            assert_eq!(e[0].event_time.map(|t| t.timestamp()), read, "{at}");
        }
        // A blank id, as a missing one: the body's digest.
        for blank in [
            &br#"{"id":"","type":"delivered"}"#[..],
            br#"{"id":" ","type":"delivered"}"#,
        ] {
            let sig = format!("sha256={}", hex::encode(hmac_sha256(b"k", &[blank])));
            let h = vec![("x-sig".to_owned(), sig)];
            let e = v
                .verify(
                    &RawRequest {
                        headers: &h,
                        body: blank,
                        query: None,
                        method: "POST",
                    },
                    Utc::now(),
                )
                .unwrap();
            assert_eq!(e[0].provider_event_id, hex::encode(Sha256::digest(blank)));
        }

        let c = SourceConfig {
            encoding: Some("base64".into()),
            signed: Some("timestamp.body".into()),
            ..Default::default()
        };
        let v = GenericHmac::new(vec!["k".into()], &c).unwrap();
        let sig = base64::engine::general_purpose::STANDARD
            .encode(hmac_sha256(b"k", &[b"1000", b".", body]));
        let h = vec![
            ("x-signature".to_owned(), sig),
            ("x-timestamp".to_owned(), "1000".to_owned()),
        ];
        let r = RawRequest {
            headers: &h,
            body,
            query: None,
            method: "POST",
        };
        assert!(v.verify(&r, Utc.timestamp_opt(1100, 0).unwrap()).is_ok());
        assert_eq!(
            v.verify(&r, Utc.timestamp_opt(1400, 0).unwrap()),
            Err(VerifyError::Stale(300))
        );
        assert!(
            GenericHmac::new(
                vec![],
                &SourceConfig {
                    encoding: Some("b32".into()),
                    ..Default::default()
                }
            )
            .is_err()
        );
    }
}
