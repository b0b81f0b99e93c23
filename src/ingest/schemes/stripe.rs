//! Stripe-style: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=…]`, lower-case hex HMAC-SHA256 over
//! `{t}.{raw body}` with the secret string as is. `v0` is never accepted; the tolerance applies to
//! the age only.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::hmac_sha256;
use crate::ingest::{
    RawRequest, ReceiptEvent, Source, VerifyError, constant_time_eq, str_at, unix_time, within,
};

pub struct Stripe {
    secrets: Vec<String>,
    tolerance: u64,
}

impl Stripe {
    pub fn new(secrets: Vec<String>, tolerance: u64) -> Self {
        Self { secrets, tolerance }
    }
}

/// `(t, [v1 signatures])`; malformed items are skipped, the first `t` wins.
pub fn parse_header(h: &str) -> (Option<i64>, Vec<&str>) {
    let mut t = None;
    let mut v1 = Vec::new();
    for item in h.split(',') {
        let Some((k, v)) = item.split_once('=') else {
            continue;
        };
        match k.trim() {
            "t" if t.is_none() => t = v.trim().parse().ok(),
            "v1" => v1.push(v.trim()),
            _ => {}
        }
    }
    (t, v1)
}

impl Source for Stripe {
    fn scheme(&self) -> &'static str {
        "stripe"
    }

    fn id_field(&self) -> &str {
        "id"
    }

    fn verify(
        &self,
        r: &RawRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        let header = r
            .header("stripe-signature")
            .ok_or(VerifyError::Missing("Stripe-Signature"))?;
        let (t, sigs) = parse_header(header);
        let t = t.ok_or(VerifyError::Missing("Stripe-Signature t="))?;
        if sigs.is_empty() {
            return Err(VerifyError::Missing("Stripe-Signature v1="));
        }
        if !within(t, now, self.tolerance, false) {
            return Err(VerifyError::Stale(self.tolerance));
        }
        let ts = t.to_string();
        let ok = self.secrets.iter().any(|s| {
            let expected = hex::encode(hmac_sha256(s.as_bytes(), &[ts.as_bytes(), b".", r.body]));
            sigs.iter()
                .any(|sig| constant_time_eq(expected.as_bytes(), sig.as_bytes()))
        });
        if !ok {
            return Err(VerifyError::Mismatch);
        }
        let body: Value =
            serde_json::from_slice(r.body).map_err(|e| VerifyError::Unparsable(e.to_string()))?;
        let id = str_at(&body, "/id").ok_or_else(|| VerifyError::Unparsable("no id".into()))?;
        Ok(vec![ReceiptEvent {
            provider_event_id: id,
            event_type: "other".into(),
            provider_type: str_at(&body, "/type").unwrap_or_else(|| "unknown".into()),
            event_time: body.get("created").and_then(unix_time),
            herald_event_id: str_at(&body, "/data/object/metadata/herald_event_id"),
            provider_message_id: str_at(&body, "/data/object/id"),
            raw: body,
            replay_key: None,
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn header_for(secret: &str, t: i64, body: &[u8]) -> String {
        format!(
            "t={t},v1={}",
            hex::encode(hmac_sha256(
                secret.as_bytes(),
                &[t.to_string().as_bytes(), b".", body]
            ))
        )
    }

    #[test]
    fn header_parsing_skips_garbage() {
        let (t, v1) = parse_header("t=12, junk ,v0=aa,v1=bb,v1=cc,t=99,=,v1");
        assert_eq!(t, Some(12));
        assert_eq!(v1, ["bb", "cc"]);
        assert_eq!(parse_header(""), (None, vec![]));
    }

    #[test]
    fn verifies_with_any_secret_and_checks_age_only() {
        let body = br#"{"id":"evt_1","type":"charge.succeeded","created":1600000000}"#;
        let v = Stripe::new(vec!["whsec_old".into(), "whsec_new".into()], 300);
        let h = vec![(
            "stripe-signature".to_owned(),
            header_for("whsec_new", 1000, body),
        )];
        let r = RawRequest {
            headers: &h,
            body,
            query: None,
            method: "POST",
        };
        let at = |s| Utc.timestamp_opt(s, 0).unwrap();
        let e = v.verify(&r, at(1200)).unwrap();
        assert_eq!(
            (e[0].provider_event_id.as_str(), e[0].provider_type.as_str()),
            ("evt_1", "charge.succeeded")
        );
        assert_eq!(e[0].event_time.unwrap().timestamp(), 1600000000);
        assert!(
            v.verify(&r, at(500)).is_ok(),
            "a timestamp in the future is not refused"
        );
        assert_eq!(v.verify(&r, at(1301)), Err(VerifyError::Stale(300)));
        let v0 = vec![(
            "stripe-signature".to_owned(),
            header_for("whsec_new", 1000, body).replace("v1=", "v0="),
        )];
        let r0 = RawRequest {
            headers: &v0,
            body,
            query: None,
            method: "POST",
        };
        assert!(matches!(
            v.verify(&r0, at(1000)),
            Err(VerifyError::Missing(_))
        ));
        let other = Stripe::new(vec!["whsec_x".into()], 300);
        assert_eq!(other.verify(&r, at(1000)), Err(VerifyError::Mismatch));
    }
}
