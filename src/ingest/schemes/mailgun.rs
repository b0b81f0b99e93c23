//! Mailgun: hex HMAC-SHA256 of `timestamp + token` (no separator) with the webhook signing key,
//! carried inside the JSON body (`signature{timestamp,token,signature}` beside `event-data`); the
//! body itself is not signed, so the token is the receipt's replay key: a token already used by a
//! different event is a replay, refused with 401 and never stored (see `storage::receipts`).
//! Dedup on `event-data.id`.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::hmac_sha256;
use crate::ingest::{
    RawRequest, ReceiptEvent, Source, VerifyError, constant_time_eq, herald_event_id_in, str_at,
    unix_time, within,
};

pub struct Mailgun {
    keys: Vec<String>,
    tolerance: u64,
}

impl Mailgun {
    pub fn new(keys: Vec<String>, tolerance: u64) -> Self {
        Self { keys, tolerance }
    }
}

fn vocabulary(event: &str, severity: Option<&str>) -> &'static str {
    match (event, severity) {
        ("accepted", _) => "sent",
        ("delivered", _) => "delivered",
        ("failed", Some("temporary")) => "deferred",
        ("failed", _) => "bounced",
        ("rejected", _) => "dropped",
        ("opened", _) => "opened",
        ("clicked", _) => "clicked",
        ("complained", _) => "complained",
        ("unsubscribed", _) => "unsubscribed",
        _ => "other",
    }
}

impl Source for Mailgun {
    fn scheme(&self) -> &'static str {
        "mailgun"
    }

    fn id_field(&self) -> &str {
        "event-data.id"
    }

    fn verify(
        &self,
        r: &RawRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        // The signature lives in the body: without a JSON body there is nothing to verify.
        let body: Value =
            serde_json::from_slice(r.body).map_err(|_| VerifyError::Missing("signature"))?;
        let sig = body
            .get("signature")
            .ok_or(VerifyError::Missing("signature"))?;
        let field =
            |k: &str| str_at(sig, &format!("/{k}")).ok_or(VerifyError::Missing("signature"));
        let (timestamp, token, signature) =
            (field("timestamp")?, field("token")?, field("signature")?);
        let t: i64 = timestamp
            .parse()
            .map_err(|_| VerifyError::NotAccepted("the signed timestamp is not whole seconds"))?;
        if !within(t, now, self.tolerance, true) {
            return Err(VerifyError::Stale(self.tolerance));
        }
        let given = signature.to_ascii_lowercase();
        let ok = self.keys.iter().any(|k| {
            let expected = hex::encode(hmac_sha256(
                k.as_bytes(),
                &[timestamp.as_bytes(), token.as_bytes()],
            ));
            constant_time_eq(expected.as_bytes(), given.as_bytes())
        });
        if !ok {
            return Err(VerifyError::Mismatch);
        }
        let data = body
            .get("event-data")
            .cloned()
            .ok_or_else(|| VerifyError::Unparsable("no event-data".into()))?;
        let id = crate::ingest::nonblank(str_at(&data, "/id"))
            .ok_or(VerifyError::Blank("event-data.id".into()))?;
        let event = str_at(&data, "/event").unwrap_or_else(|| "unknown".into());
        let severity = str_at(&data, "/severity");
        Ok(vec![ReceiptEvent {
            provider_event_id: id,
            event_type: vocabulary(&event, severity.as_deref()).into(),
            provider_type: event,
            event_time: data.get("timestamp").and_then(unix_time),
            herald_event_id: herald_event_id_in(data.get("user-variables")),
            provider_message_id: str_at(&data, "/message/headers/message-id")
                .map(|m| m.trim_start_matches('<').trim_end_matches('>').to_owned()),
            raw: data,
            replay_key: Some(token),
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    fn signed(key: &str, t: &str, token: &str, data: Value) -> Vec<u8> {
        let sig = hex::encode(hmac_sha256(
            key.as_bytes(),
            &[t.as_bytes(), token.as_bytes()],
        ));
        serde_json::to_vec(&json!({"signature": {"timestamp": t, "token": token, "signature": sig}, "event-data": data}))
            .unwrap()
    }

    #[test]
    fn verifies_and_normalizes() {
        let data = json!({"id": "ev-1", "event": "failed", "severity": "temporary", "timestamp": 1521243339.873676,
                          "message": {"headers": {"message-id": "<20130503182626.18666.16540@example.com>"}},
                          "user-variables": {"herald_event_id": "welcome-7"}});
        let body = signed("key-1", "1521243339", "tok", data);
        let v = Mailgun::new(vec!["key-0".into(), "key-1".into()], 300);
        let r = RawRequest {
            headers: &[],
            body: &body,
            query: None,
            method: "POST",
        };
        let e = v
            .verify(&r, Utc.timestamp_opt(1521243400, 0).unwrap())
            .unwrap();
        assert_eq!(
            (e[0].event_type.as_str(), e[0].provider_event_id.as_str()),
            ("deferred", "ev-1")
        );
        assert_eq!(e[0].herald_event_id.as_deref(), Some("welcome-7"));
        assert_eq!(
            e[0].provider_message_id.as_deref(),
            Some("20130503182626.18666.16540@example.com")
        );
        assert_eq!(e[0].event_time.unwrap().timestamp(), 1521243339);
        assert_eq!(
            v.verify(&r, Utc.timestamp_opt(1521243700, 0).unwrap()),
            Err(VerifyError::Stale(300))
        );
        let other = Mailgun::new(vec!["nope".into()], 300);
        assert_eq!(
            other.verify(&r, Utc.timestamp_opt(1521243400, 0).unwrap()),
            Err(VerifyError::Mismatch)
        );
        // Refusals that say what is wrong: an empty or missing id (the field named), a signed
        // timestamp that is no number.
        let at = Utc.timestamp_opt(1521243400, 0).unwrap();
        for data in [
            json!({"id": "", "event": "delivered"}),
            json!({"event": "delivered"}),
        ] {
            let body = signed("key-1", "1521243339", "tok2", data);
            let r = RawRequest {
                headers: &[],
                body: &body,
                query: None,
                method: "POST",
            };
            assert_eq!(
                v.verify(&r, at),
                Err(VerifyError::Blank("event-data.id".into()))
            );
        }
        let body = signed("key-1", "soon", "tok3", json!({"id": "ev-2"}));
        let r = RawRequest {
            headers: &[],
            body: &body,
            query: None,
            method: "POST",
        };
        assert_eq!(
            v.verify(&r, at),
            Err(VerifyError::NotAccepted(
                "the signed timestamp is not whole seconds"
            ))
        );
        let r = RawRequest {
            headers: &[],
            body: b"garbage",
            query: None,
            method: "POST",
        };
        assert!(matches!(
            v.verify(&r, Utc::now()),
            Err(VerifyError::Missing(_))
        ));
    }
}
