//! Standard Webhooks / Svix (Resend, Clerk, …): `v1,<base64 HMAC-SHA256>` over
//! `{id}.{timestamp}.{raw body}`, key = base64 of the `whsec_` secret; and, as the specification
//! defines them, asymmetric `v1a,<base64 Ed25519 signature>` over the same string, verified with
//! `whpk_<base64 public key>` keys (a `whsk_` secret key is refused: Herald only verifies).
//! Accepts the `svix-*` header family too (preferred when present); ±tolerance on the
//! timestamp, both ways.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::SchemeConfigError;
use crate::crypto::signing::SigningKey;
use crate::ingest::{
    RawRequest, ReceiptEvent, Source, VerifyError, constant_time_eq, herald_event_id_in, iso_time,
    str_at, within,
};

pub struct StandardWebhooks {
    keys: Vec<SigningKey>,
    /// `whpk_` keys, for `v1a` signatures.
    public_keys: Vec<ed25519_dalek::VerifyingKey>,
    tolerance: u64,
}

impl StandardWebhooks {
    /// `whsec_…` (or bare base64) symmetric secrets and `whpk_…` public keys, in any mix.
    pub fn new(secrets: &[String], tolerance: u64) -> Result<Self, SchemeConfigError> {
        let (mut keys, mut public_keys) = (Vec::new(), Vec::new());
        for s in secrets {
            let s = s.trim();
            if let Some(pk) = s.strip_prefix("whpk_") {
                public_keys.push(super::telnyx::parse_public_key(pk)?);
            } else if s.starts_with("whsk_") {
                return Err(SchemeConfigError::SecretKeyGiven);
            } else {
                keys.push(SigningKey::parse(s)?);
            }
        }
        Ok(Self {
            keys,
            public_keys,
            tolerance,
        })
    }
}

/// `(id, timestamp, signature)` from the svix-* family if present, else webhook-*.
fn headers<'a>(r: &'a RawRequest<'a>) -> Option<(&'a str, &'a str, &'a str)> {
    let family = |p: &str| {
        Some((
            r.header(&format!("{p}-id"))?,
            r.header(&format!("{p}-timestamp"))?,
            r.header(&format!("{p}-signature"))?,
        ))
    };
    family("svix").or_else(|| family("webhook"))
}

impl Source for StandardWebhooks {
    fn scheme(&self) -> &'static str {
        "standard-webhooks"
    }

    fn id_field(&self) -> &str {
        "webhook-id"
    }

    fn verify(
        &self,
        r: &RawRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        let (id, ts, sigs) = headers(r).ok_or(VerifyError::Missing(
            "webhook-id, webhook-timestamp, webhook-signature",
        ))?;
        let t: i64 = ts.trim().parse().map_err(|_| VerifyError::Mismatch)?;
        if !within(t, now, self.tolerance, true) {
            return Err(VerifyError::Stale(self.tolerance));
        }
        let expected: Vec<String> = self.keys.iter().map(|k| k.sign(id, t, r.body)).collect();
        // Several space-separated entries; unknown versions and malformed ones are skipped.
        let symmetric = sigs.split(' ').filter(|e| e.starts_with("v1,")).any(|e| {
            expected
                .iter()
                .any(|x| constant_time_eq(x.as_bytes(), e.as_bytes()))
        });
        let ok = symmetric || {
            let entries: Vec<&str> = sigs
                .split(' ')
                .filter_map(|e| e.strip_prefix("v1a,"))
                .collect();
            !entries.is_empty() && !self.public_keys.is_empty() && {
                let ts = t.to_string();
                let signed = [id.as_bytes(), b".", ts.as_bytes(), b".", r.body].concat();
                entries
                    .iter()
                    .any(|e| super::telnyx::ed25519_verifies(&self.public_keys, &signed, e))
            }
        };
        if !ok {
            return Err(VerifyError::Mismatch);
        }
        // An event is an object (`type`, `timestamp`, `data`): a bare number, string, null or
        // list is none, and would never match a message.
        let body = match serde_json::from_slice(r.body) {
            Ok(Value::Object(m)) => Value::Object(m),
            Ok(_) => return Err(VerifyError::Unparsable("not a JSON object".into())),
            Err(e) => return Err(VerifyError::Unparsable(e.to_string())),
        };
        Ok(vec![normalize(id, body)])
    }
}

/// Resend's vocabulary; other Standard Webhooks senders keep their type under `other`.
fn vocabulary(t: &str) -> &'static str {
    match t {
        "email.sent" => "sent",
        "email.delivered" => "delivered",
        "email.delivery_delayed" => "deferred",
        "email.bounced" => "bounced",
        "email.opened" => "opened",
        "email.clicked" => "clicked",
        "email.complained" => "complained",
        "email.failed" => "failed",
        _ => "other",
    }
}

fn normalize(id: &str, body: Value) -> ReceiptEvent {
    let provider_type = str_at(&body, "/type").unwrap_or_else(|| "unknown".into());
    let event_time = ["/created_at", "/timestamp", "/data/created_at"]
        .iter()
        .find_map(|p| body.pointer(p).and_then(iso_time));
    let data = body.get("data");
    let herald_event_id = data
        .and_then(|d| herald_event_id_in(d.get("tags")))
        .or_else(|| data.and_then(|d| herald_event_id_in(d.get("metadata"))))
        .or_else(|| {
            data.and_then(|d| d.get("headers")).and_then(|h| match h {
                Value::Array(items) => items.iter().find_map(|x| {
                    (x.get("name")?
                        .as_str()?
                        .eq_ignore_ascii_case("x-herald-event-id"))
                    .then(|| x.get("value")?.as_str().map(str::to_owned))
                    .flatten()
                }),
                Value::Object(m) => m
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("x-herald-event-id"))
                    .and_then(|(_, v)| v.as_str().map(str::to_owned)),
                _ => None,
            })
        });
    ReceiptEvent {
        provider_event_id: id.to_owned(),
        event_type: vocabulary(&provider_type).to_owned(),
        provider_type,
        event_time,
        herald_event_id,
        provider_message_id: str_at(&body, "/data/email_id"),
        raw: body,
        replay_key: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn req(headers: &[(&str, &str)], body: &[u8]) -> (Vec<(String, String)>, Vec<u8>) {
        (
            headers
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            body.to_vec(),
        )
    }

    #[test]
    fn the_spec_example_verifies_and_tampering_does_not() {
        let v = StandardWebhooks::new(&[SECRET.into()], 300).unwrap();
        let now = Utc.timestamp_opt(1614265330, 0).unwrap();
        let (h, b) = req(
            &[
                ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
                ("webhook-timestamp", "1614265330"),
                (
                    "webhook-signature",
                    "v1a,xxx v1,bad v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
                ),
            ],
            br#"{"test": 2432232314}"#,
        );
        let r = RawRequest {
            headers: &h,
            body: &b,
            query: None,
            method: "POST",
        };
        let events = v.verify(&r, now).unwrap();
        assert_eq!(events[0].provider_event_id, "msg_p5jXN8AQM9LWM0D4loKWxJek");
        let late = now + chrono::Duration::seconds(301);
        assert_eq!(v.verify(&r, late), Err(VerifyError::Stale(300)));
        let early = now - chrono::Duration::seconds(301);
        assert_eq!(v.verify(&r, early), Err(VerifyError::Stale(300)));
        let mut b2 = b.clone();
        b2[3] ^= 1;
        let r2 = RawRequest {
            headers: &h,
            body: &b2,
            query: None,
            method: "POST",
        };
        assert_eq!(v.verify(&r2, now), Err(VerifyError::Mismatch));
        let r3 = RawRequest {
            headers: &h[..2],
            body: &b,
            query: None,
            method: "POST",
        };
        assert!(matches!(v.verify(&r3, now), Err(VerifyError::Missing(_))));
    }

    #[test]
    fn svix_headers_are_preferred_and_bodies_must_be_json_after_verification() {
        let v = StandardWebhooks::new(&[SECRET.into()], 300).unwrap();
        let key = SigningKey::parse(SECRET).unwrap();
        let now = Utc.timestamp_opt(1000, 0).unwrap();
        let body = br#"{"type":"email.sent"}"#;
        // Both families complete and valid, for different ids: the svix-* one wins.
        let (h, b) = req(
            &[
                ("webhook-id", "msg_webhook"),
                ("webhook-timestamp", "1000"),
                ("webhook-signature", &key.sign("msg_webhook", 1000, body)),
                ("svix-id", "msg_svix"),
                ("svix-timestamp", "1000"),
                ("svix-signature", &key.sign("msg_svix", 1000, body)),
            ],
            body,
        );
        let r = RawRequest {
            headers: &h,
            body: &b,
            query: None,
            method: "POST",
        };
        assert_eq!(v.verify(&r, now).unwrap()[0].provider_event_id, "msg_svix");
        // A valid signature over a body that is not JSON: 400, not 401.
        let junk = b"not json";
        let (h, b) = req(
            &[
                ("svix-id", "msg_1"),
                ("svix-timestamp", "1000"),
                ("svix-signature", &key.sign("msg_1", 1000, junk)),
            ],
            junk,
        );
        let r = RawRequest {
            headers: &h,
            body: &b,
            query: None,
            method: "POST",
        };
        assert!(matches!(v.verify(&r, now), Err(VerifyError::Unparsable(_))));
    }

    #[test]
    fn resend_events_normalize() {
        let body = serde_json::json!({
            "type": "email.bounced", "created_at": "2024-11-22T23:41:12.126Z",
            "data": {"email_id": "56761188-7520-42d8-8898-ff6fc54ce618", "tags": {"herald_event_id": "order-1:placed"}}
        });
        let e = normalize("msg_2", body);
        assert_eq!(
            (e.event_type.as_str(), e.provider_type.as_str()),
            ("bounced", "email.bounced")
        );
        assert_eq!(e.event_time.unwrap().timestamp(), 1732318872);
        assert_eq!(e.herald_event_id.as_deref(), Some("order-1:placed"));
        assert_eq!(
            e.provider_message_id.as_deref(),
            Some("56761188-7520-42d8-8898-ff6fc54ce618")
        );
    }
}
