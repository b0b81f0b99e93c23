//! SendGrid Event Webhook: ECDSA P-256 / SHA-256 over `timestamp header ‖ raw body`; the
//! signature is base64 DER, the verification key base64 DER SubjectPublicKeyInfo. The body is a
//! JSON array of events (ending in `\r\n`); each is deduplicated on `sg_event_id`. The signed
//! timestamp header must be within ±`tolerance_seconds` (default 300) of now, as in every scheme
//! with a timestamp (SendGrid's own libraries check no age; a signature without a window could be
//! replayed forever).

use base64::Engine;
use chrono::{DateTime, Utc};
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePublicKey;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::SchemeConfigError;
use crate::ingest::{RawRequest, ReceiptEvent, Source, VerifyError, str_at, unix_time, within};

pub struct SendGrid {
    keys: Vec<VerifyingKey>,
    tolerance: u64,
}

impl SendGrid {
    /// `keys`: base64 DER public keys, as SendGrid shows them.
    pub fn new(keys: &[String], tolerance: u64) -> Result<Self, SchemeConfigError> {
        let keys = keys
            .iter()
            .map(|k| {
                let der = base64::engine::general_purpose::STANDARD
                    .decode(k.trim())
                    .map_err(SchemeConfigError::NotBase64)?;
                VerifyingKey::from_public_key_der(&der).map_err(SchemeConfigError::NotP256)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { keys, tolerance })
    }
}

fn vocabulary(event: &str) -> &'static str {
    match event {
        "processed" => "sent",
        "delivered" => "delivered",
        "deferred" => "deferred",
        "bounce" | "blocked" => "bounced",
        "dropped" => "dropped",
        "open" => "opened",
        "click" => "clicked",
        "spamreport" => "complained",
        "unsubscribe" | "group_unsubscribe" => "unsubscribed",
        _ => "other",
    }
}

impl Source for SendGrid {
    fn scheme(&self) -> &'static str {
        "sendgrid"
    }

    fn id_field(&self) -> &str {
        "sg_event_id"
    }

    fn verify(
        &self,
        r: &RawRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        let sig =
            r.header("x-twilio-email-event-webhook-signature")
                .ok_or(VerifyError::Missing(
                    "X-Twilio-Email-Event-Webhook-Signature",
                ))?;
        let ts = r
            .header("x-twilio-email-event-webhook-timestamp")
            .ok_or(VerifyError::Missing(
                "X-Twilio-Email-Event-Webhook-Timestamp",
            ))?;
        // The window first: cheaper than the ECDSA check it spares a stale request.
        let t: i64 = ts
            .trim()
            .parse()
            .map_err(|_| VerifyError::NotAccepted("the signed timestamp is not whole seconds"))?;
        if !within(t, now, self.tolerance, true) {
            return Err(VerifyError::Stale(self.tolerance));
        }
        let der = base64::engine::general_purpose::STANDARD
            .decode(sig.trim())
            .map_err(|_| VerifyError::Mismatch)?;
        let signature = Signature::from_der(&der).map_err(|_| VerifyError::Mismatch)?;
        let mut signed = Vec::with_capacity(ts.len() + r.body.len());
        signed.extend_from_slice(ts.as_bytes());
        signed.extend_from_slice(r.body);
        if !self
            .keys
            .iter()
            .any(|k| k.verify(&signed, &signature).is_ok())
        {
            return Err(VerifyError::Mismatch);
        }
        let events = match serde_json::from_slice::<Value>(r.body) {
            Ok(Value::Array(events)) => events,
            Ok(one @ Value::Object(_)) => vec![one],
            Ok(_) => return Err(VerifyError::Unparsable("not a JSON array of events".into())),
            Err(e) => return Err(VerifyError::Unparsable(e.to_string())),
        };
        events
            .into_iter()
            .map(|e| {
                if !e.is_object() {
                    return Err(VerifyError::Unparsable("an event is not an object".into()));
                }
                let event = str_at(&e, "/event").unwrap_or_else(|| "unknown".into());
                // Without sg_event_id (very old accounts), or with a blank one, the event's own
                // bytes are its identity (as the `hmac` scheme's without an id).
                let id = crate::ingest::nonblank(str_at(&e, "/sg_event_id"))
                    .unwrap_or_else(|| hex::encode(Sha256::digest(e.to_string().as_bytes())));
                Ok(ReceiptEvent {
                    provider_event_id: id,
                    event_type: vocabulary(&event).into(),
                    provider_type: event,
                    event_time: e.get("timestamp").and_then(unix_time),
                    herald_event_id: str_at(&e, "/herald_event_id"),
                    provider_message_id: str_at(&e, "/sg_message_id")
                        .map(|m| m.split('.').next().unwrap_or_default().to_owned()),
                    raw: e,
                    replay_key: None,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::schemes::{SourceConfig, build};
    use crate::secret::Secret;
    use chrono::TimeZone;

    /// sendgrid-python `test_verify_valid_signature` (fixtures/providers/sendgrid/sdk-valid-1).
    const CASE: &str = include_str!("../../../fixtures/providers/sendgrid/sdk-valid-1/case.json");
    const BODY: &[u8] = include_bytes!("../../../fixtures/providers/sendgrid/sdk-valid-1/body");

    fn source(tolerance: Option<u64>) -> std::sync::Arc<dyn Source> {
        let case: Value = serde_json::from_str(CASE).unwrap();
        build(
            "sources.sg",
            &SourceConfig {
                scheme: "sendgrid".into(),
                secrets: vec![Secret::new(case["secret"].as_str().unwrap())],
                tolerance_seconds: tolerance,
                ..Default::default()
            },
        )
        .unwrap()
    }

    fn verify_at(s: &dyn Source, at: i64) -> Result<Vec<ReceiptEvent>, VerifyError> {
        let case: Value = serde_json::from_str(CASE).unwrap();
        let headers: Vec<(String, String)> = case["headers"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.as_str().unwrap().to_owned()))
            .collect();
        let r = RawRequest {
            headers: &headers,
            body: BODY,
            query: None,
            method: "POST",
        };
        s.verify(&r, Utc.timestamp_opt(at, 0).unwrap())
    }

    #[test]
    fn the_signed_timestamp_is_checked_by_default() {
        const TS: i64 = 1600112502; // the example's X-Twilio-Email-Event-Webhook-Timestamp
        let default = source(None);
        for at in [TS - 300, TS, TS + 300] {
            assert_eq!(verify_at(&*default, at).map(|e| e.len()), Ok(1), "at {at}");
        }
        for at in [TS - 301, TS + 301, TS + 86_400] {
            assert_eq!(
                verify_at(&*default, at),
                Err(VerifyError::Stale(300)),
                "at {at}"
            );
        }
        // A configured window replaces the default.
        let wide = source(Some(3600));
        assert!(verify_at(&*wide, TS + 3600).is_ok());
        assert_eq!(verify_at(&*wide, TS + 3601), Err(VerifyError::Stale(3600)));
    }

    /// A key of the test's own: the source holding its public half, and the two signed
    /// headers for `body` at `t`.
    fn own_key_source(t: &str, body: &[u8]) -> (std::sync::Arc<dyn Source>, Vec<(String, String)>) {
        use base64::Engine;
        use p256::ecdsa::signature::Signer;
        let b64 = base64::engine::general_purpose::STANDARD;
        let key = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
        // SubjectPublicKeyInfo of a P-256 key: the fixed DER header, then the point.
        let mut public =
            hex::decode("3059301306072a8648ce3d020106082a8648ce3d030107034200").unwrap();
        public.extend_from_slice(key.verifying_key().to_encoded_point(false).as_bytes());
        let sig: Signature = key.sign(&[t.as_bytes(), body].concat());
        let source = build(
            "sources.sg",
            &SourceConfig {
                scheme: "sendgrid".into(),
                secrets: vec![Secret::new(b64.encode(&public))],
                ..Default::default()
            },
        )
        .unwrap();
        let headers = vec![
            (
                "x-twilio-email-event-webhook-signature".to_owned(),
                b64.encode(sig.to_der().as_bytes()),
            ),
            (
                "x-twilio-email-event-webhook-timestamp".to_owned(),
                t.to_owned(),
            ),
        ];
        (source, headers)
    }

    #[test]
    fn a_blank_sg_event_id_is_no_id_and_a_timestamp_that_is_no_number_is_named() {
        let body = br#"[{"sg_event_id": "", "event": "delivered", "timestamp": 1},
                        {"sg_event_id": "   ", "event": "open", "timestamp": 1},
                        {"event": "bounce", "timestamp": 1},
                        {"sg_event_id": "sg-1", "event": "processed", "timestamp": 1}]"#;
        let (source, headers) = own_key_source("1600112502", body);
        let r = RawRequest {
            headers: &headers,
            body,
            query: None,
            method: "POST",
        };
        let events = source
            .verify(&r, Utc.timestamp_opt(1600112502, 0).unwrap())
            .unwrap();
        let ids: Vec<&str> = events
            .iter()
            .map(|e| e.provider_event_id.as_str())
            .collect();
        // As an event without one: its own bytes are its identity (a 64-digit hash), each its
        // own; the request is taken whole, not refused for a blank id.
        for id in &ids[..3] {
            assert!(
                id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()),
                "{ids:?}"
            );
        }
        assert!(ids[0] != ids[1] && ids[1] != ids[2], "{ids:?}");
        assert_eq!(ids[3], "sg-1");
        assert_eq!(
            crate::ingest::check_storable(&events, "sg_event_id"),
            Ok(())
        );
        // One too long to store, in a batch: named as the request holds it, with its place.
        let long = format!(
            r#"[{{"sg_event_id": "sg-0", "event": "open", "timestamp": 1}},
                {{"sg_event_id": "{}", "event": "open", "timestamp": 1}}]"#,
            "x".repeat(crate::ingest::ID_MAX_BYTES + 1)
        );
        let (source, headers) = own_key_source("1600112502", long.as_bytes());
        let r = RawRequest {
            headers: &headers,
            body: long.as_bytes(),
            query: None,
            method: "POST",
        };
        assert_eq!(
            source.verify_storable(&r, Utc.timestamp_opt(1600112502, 0).unwrap()),
            Err(VerifyError::TooLong("[1].sg_event_id".into()))
        );
        let (source, headers) = own_key_source("soon", body);
        let r = RawRequest {
            headers: &headers,
            body,
            query: None,
            method: "POST",
        };
        assert_eq!(
            source.verify(&r, Utc::now()),
            Err(VerifyError::NotAccepted(
                "the signed timestamp is not whole seconds"
            ))
        );
    }
}
