//! SendGrid Event Webhook: ECDSA P-256 / SHA-256 over `timestamp header ‖ raw body`; the
//! signature is base64 DER, the verification key base64 DER SubjectPublicKeyInfo. The body is a
//! JSON array of events (ending in `\r\n`); each is deduplicated on `sg_event_id`. SendGrid's own
//! libraries check no timestamp age; Herald checks it only when `tolerance_seconds` is set.

use base64::Engine;
use chrono::{DateTime, Utc};
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePublicKey;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::ingest::{RawRequest, ReceiptEvent, Source, VerifyError, str_at, unix_time, within};

pub struct SendGrid {
    keys: Vec<VerifyingKey>,
    tolerance: Option<u64>,
}

impl SendGrid {
    /// `keys`: base64 DER public keys, as SendGrid shows them.
    pub fn new(keys: &[String], tolerance: Option<u64>) -> Result<Self, String> {
        let keys = keys
            .iter()
            .map(|k| {
                let der = base64::engine::general_purpose::STANDARD
                    .decode(k.trim())
                    .map_err(|_| {
                        "must be base64 (the verification key SendGrid shows)".to_owned()
                    })?;
                VerifyingKey::from_public_key_der(&der)
                    .map_err(|_| "is not a P-256 public key".to_owned())
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
        if let Some(tol) = self.tolerance {
            let t: i64 = ts.trim().parse().map_err(|_| VerifyError::Mismatch)?;
            if !within(t, now, tol, true) {
                return Err(VerifyError::Stale(tol));
            }
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
                // Without sg_event_id (very old accounts), the event's own bytes are its identity.
                let id = str_at(&e, "/sg_event_id")
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
