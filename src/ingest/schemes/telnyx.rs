//! Telnyx (API v2 webhooks): `telnyx-signature-ed25519` = base64 Ed25519 signature over
//! `{telnyx-timestamp}|{raw body}`, verified with the account's public key (base64, from the
//! Mission Control portal); the timestamp within the tolerance, both ways. Messaging events
//! (`message.sent`, `message.finalized`) carry a status per recipient (`data.payload.to[]`): one
//! receipt per recipient. Event id `data.id` (suffixed `:{phone_number}` when there are several
//! recipients), event time `data.occurred_at`, message id `data.payload.id`.

use base64::Engine;
use chrono::{DateTime, Utc};
use ed25519_dalek::{Signature, VerifyingKey};
use serde_json::{Value, json};

use super::SchemeConfigError;
use crate::ingest::{RawRequest, ReceiptEvent, Source, VerifyError, iso_time, str_at, within};

/// An Ed25519 public key given as base64 of its 32 bytes (Telnyx's portal, `whpk_` keys).
pub fn parse_public_key(b64: &str) -> Result<VerifyingKey, SchemeConfigError> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(SchemeConfigError::NotBase64Key)?;
    let bytes: [u8; 32] = raw
        .as_slice()
        .try_into()
        .map_err(|_| SchemeConfigError::NotEd25519)?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| SchemeConfigError::NotEd25519)
}

/// Whether `sig_b64` is a valid Ed25519 signature of `message` under any of `keys` (strict
/// verification: no malleable or small-order encodings).
pub fn ed25519_verifies(keys: &[VerifyingKey], message: &[u8], sig_b64: &str) -> bool {
    let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(sig_b64.trim()) else {
        return false;
    };
    let Ok(sig) = Signature::from_slice(&raw) else {
        return false;
    };
    keys.iter().any(|k| k.verify_strict(message, &sig).is_ok())
}

pub struct Telnyx {
    keys: Vec<VerifyingKey>,
    tolerance: u64,
}

impl Telnyx {
    pub fn new(public_keys: &[String], tolerance: u64) -> Result<Self, SchemeConfigError> {
        let keys = public_keys
            .iter()
            .map(|k| parse_public_key(k))
            .collect::<Result<_, _>>()?;
        Ok(Self { keys, tolerance })
    }
}

/// A recipient's status → Herald's vocabulary.
fn vocabulary(status: &str) -> &'static str {
    match status {
        "queued" => "queued",
        "sending" | "sent" | "delivery_unconfirmed" => "sent",
        "delivered" => "delivered",
        "sending_failed" | "delivery_failed" | "expired" => "failed",
        _ => "other",
    }
}

/// The receipts of one verified event.
fn normalize(body: Value) -> Result<Vec<ReceiptEvent>, VerifyError> {
    let id =
        str_at(&body, "/data/id").ok_or_else(|| VerifyError::Unparsable("no data.id".into()))?;
    let event_type = str_at(&body, "/data/event_type").unwrap_or_else(|| "unknown".into());
    let event_time = body.pointer("/data/occurred_at").and_then(iso_time);
    let message_id = str_at(&body, "/data/payload/id");
    let recipients: Vec<Value> = body
        .pointer("/data/payload/to")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    // An incoming message, or an event that is not about a message (a call's, a number's), at
    // this URL is no receipt: refused, not stored (an incoming one holds the sender's number
    // and the text). A message event of another type is kept, as `other`.
    if event_type == "message.received" || !event_type.starts_with("message.") {
        return Err(VerifyError::Unparsable(format!(
            "a {event_type} event, not a receipt of a message sent"
        )));
    }
    let is_status = matches!(event_type.as_str(), "message.sent" | "message.finalized");
    if !is_status || recipients.is_empty() {
        return Ok(vec![ReceiptEvent {
            provider_event_id: id,
            event_type: "other".into(),
            provider_type: event_type,
            event_time,
            herald_event_id: None,
            provider_message_id: message_id,
            raw: body,
            replay_key: None,
        }]);
    }
    let several = recipients.len() > 1;
    Ok(recipients
        .iter()
        .map(|to| {
            let status = str_at(to, "/status").unwrap_or_else(|| "unknown".into());
            let phone = str_at(to, "/phone_number").unwrap_or_default();
            ReceiptEvent {
                provider_event_id: if several {
                    format!("{id}:{}", super::recipient_tag(&phone))
                } else {
                    id.clone()
                },
                event_type: vocabulary(&status).into(),
                provider_type: format!("{event_type}:{status}"),
                event_time,
                herald_event_id: None,
                provider_message_id: message_id.clone(),
                raw: if several {
                    json!({"event": body, "recipient": to})
                } else {
                    body.clone()
                },
                replay_key: None,
            }
        })
        .collect())
}

impl Source for Telnyx {
    fn scheme(&self) -> &'static str {
        "telnyx"
    }

    fn id_field(&self) -> &str {
        "data.id"
    }

    fn verify(
        &self,
        r: &RawRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        let sig = r
            .header("telnyx-signature-ed25519")
            .ok_or(VerifyError::Missing("telnyx-signature-ed25519"))?;
        let ts = r
            .header("telnyx-timestamp")
            .ok_or(VerifyError::Missing("telnyx-timestamp"))?
            .trim();
        let t: i64 = ts
            .parse()
            .map_err(|_| VerifyError::NotAccepted("telnyx-timestamp is not whole seconds"))?;
        if !within(t, now, self.tolerance, true) {
            return Err(VerifyError::Stale(self.tolerance));
        }
        let mut signed = Vec::with_capacity(ts.len() + 1 + r.body.len());
        signed.extend_from_slice(ts.as_bytes());
        signed.push(b'|');
        signed.extend_from_slice(r.body);
        if !ed25519_verifies(&self.keys, &signed, sig) {
            return Err(VerifyError::Mismatch);
        }
        let body: Value =
            serde_json::from_slice(r.body).map_err(|e| VerifyError::Unparsable(e.to_string()))?;
        normalize(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use ed25519_dalek::{Signer, SigningKey};

    /// RFC 8032 §7.1 TEST 1 secret key (Telnyx publishes no vector).
    const RFC8032_SECRET: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    const RFC8032_PUBLIC: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

    fn key() -> SigningKey {
        SigningKey::from_bytes(&hex::decode(RFC8032_SECRET).unwrap().try_into().unwrap())
    }

    fn public_b64() -> String {
        base64::engine::general_purpose::STANDARD.encode(hex::decode(RFC8032_PUBLIC).unwrap())
    }

    fn signed(ts: &str, body: &[u8]) -> Vec<(String, String)> {
        let mut m = ts.as_bytes().to_vec();
        m.push(b'|');
        m.extend_from_slice(body);
        let sig = base64::engine::general_purpose::STANDARD.encode(key().sign(&m).to_bytes());
        vec![
            ("telnyx-signature-ed25519".into(), sig),
            ("telnyx-timestamp".into(), ts.into()),
        ]
    }

    #[test]
    fn rfc8032_key_matches_its_published_public_key() {
        assert_eq!(
            hex::encode(key().verifying_key().to_bytes()),
            RFC8032_PUBLIC
        );
        // RFC 8032 TEST 1: the empty message's published signature.
        let sig = "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b";
        let sig_b64 = base64::engine::general_purpose::STANDARD.encode(hex::decode(sig).unwrap());
        let pk = parse_public_key(&public_b64()).unwrap();
        assert!(ed25519_verifies(&[pk], b"", &sig_b64));
        assert!(!ed25519_verifies(&[pk], b"x", &sig_b64));
    }

    #[test]
    fn per_recipient_receipts() {
        let body = br#"{"data":{"event_type":"message.finalized","id":"ev-1","occurred_at":"2024-01-15T20:16:07.588+00:00","payload":{"id":"msg-1","to":[{"phone_number":"+15551230001","status":"delivered"},{"phone_number":"+15551230002","status":"delivery_failed"}]},"record_type":"event"}}"#;
        let h = signed("1705349767", body);
        let v = Telnyx::new(&["AAAA".repeat(11)[..44].to_owned(), public_b64()], 300);
        assert!(v.is_err(), "a key that is not 32 bytes is refused");
        let v = Telnyx::new(&[public_b64()], 300).unwrap();
        let r = RawRequest {
            headers: &h,
            body,
            query: None,
            method: "POST",
        };
        let now = Utc.timestamp_opt(1705349767, 0).unwrap();
        let e = v.verify(&r, now).unwrap();
        let got: Vec<_> = e
            .iter()
            .map(|e| (e.provider_event_id.as_str(), e.event_type.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("ev-1:b3595101de7d3cc8", "delivered"),
                ("ev-1:a3e06f517972a0e0", "failed")
            ]
        );
        assert_eq!(e[0].event_time.unwrap().timestamp_millis(), 1705349767588);
        assert_eq!(e[1].provider_message_id.as_deref(), Some("msg-1"));
        let late = now + chrono::Duration::seconds(301);
        assert_eq!(v.verify(&r, late), Err(VerifyError::Stale(300)));
        let mut tampered = body.to_vec();
        tampered[10] ^= 1;
        let r2 = RawRequest {
            body: &tampered,
            ..r
        };
        assert_eq!(v.verify(&r2, now), Err(VerifyError::Mismatch));
    }

    #[test]
    fn every_recipient_status_maps_into_the_vocabulary() {
        let got: Vec<_> = [
            "queued",
            "sending",
            "sent",
            "delivery_unconfirmed",
            "delivered",
            "sending_failed",
            "delivery_failed",
            "expired",
            "webhook_test",
        ]
        .iter()
        .map(|s| vocabulary(s))
        .collect();
        assert_eq!(
            got,
            [
                "queued",
                "sent",
                "sent",
                "sent",
                "delivered",
                "failed",
                "failed",
                "failed",
                "other"
            ]
        );
        // Message events that are not statuses keep their type under `other`.
        let e = normalize(serde_json::json!({"data": {"id": "e", "event_type": "message.updated",
            "payload": {"id": "m", "to": [{"phone_number": "+1", "status": "webhook_delivered"}]}}}))
        .unwrap();
        assert_eq!(
            (
                e.len(),
                e[0].event_type.as_str(),
                e[0].provider_type.as_str()
            ),
            (1, "other", "message.updated")
        );
        // An incoming message, a call's event, or none: no receipt.
        for event_type in ["message.received", "call.hangup", "unknown"] {
            let body = if event_type == "unknown" {
                serde_json::json!({"data": {"id": "e", "payload": {"id": "m"}}})
            } else {
                serde_json::json!({"data": {"id": "e", "event_type": event_type,
                    "payload": {"id": "m", "text": "hi", "from": {"phone_number": "+1"}}}})
            };
            assert!(
                matches!(normalize(body), Err(VerifyError::Unparsable(e)) if e.contains(event_type)),
                "{event_type}"
            );
        }
        assert!(matches!(
            normalize(serde_json::json!({"data": {}})),
            Err(VerifyError::Unparsable(_))
        ));
    }
}
