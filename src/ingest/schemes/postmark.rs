//! Postmark: no signature exists. The webhook URL carries basic-auth credentials; several pairs
//! can be active at once (rotation), and the request's is compared with every one of them in
//! constant time. Dedup on the bounce `ID`, else the composite (RecordType, MessageID,
//! recipient, time).

use base64::Engine;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;

use crate::ingest::{
    RawRequest, ReceiptEvent, Source, VerifyError, constant_time_eq, herald_event_id_in, iso_time,
    str_at,
};
use crate::secret::Secret;

/// One basic-auth pair of `credentials = [{ username = "…", password = "…" }, …]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    pub username: String,
    pub password: Secret,
}

pub struct Postmark {
    /// `username:password` of each accepted pair, as the `Authorization: Basic` header carries it.
    expected: Vec<Vec<u8>>,
}

impl Postmark {
    /// One accepted pair.
    pub fn new(username: &str, password: &str) -> Self {
        Self::with_credentials(&[(username, password)])
    }

    /// Several accepted pairs (rotation): any one of them authenticates a request.
    pub fn with_credentials(pairs: &[(&str, &str)]) -> Self {
        Self {
            expected: pairs
                .iter()
                .map(|(u, p)| format!("{u}:{p}").into_bytes())
                .collect(),
        }
    }
}

/// Postmark signs nothing: its receipts carry the Basic credentials of the webhook URL, and a
/// refusal says those are wrong, not a signature.
const WRONG_CREDENTIALS: VerifyError =
    VerifyError::NotAccepted("the Basic credentials do not match a configured pair");

fn vocabulary(record: &str, bounce_type: Option<&str>, suppress: Option<bool>) -> &'static str {
    match (record, bounce_type) {
        ("Delivery", _) => "delivered",
        ("Bounce", Some("SoftBounce" | "Transient" | "DnsError")) => "deferred",
        ("Bounce", Some("Unsubscribe")) => "unsubscribed",
        ("Bounce", Some("SpamNotification" | "SpamComplaint")) => "complained",
        // Auto-replies, challenge-responses and the like say nothing about delivery.
        (
            "Bounce",
            Some("AutoResponder" | "ChallengeVerification" | "Subscribe" | "OpenRelayTest"),
        ) => "other",
        ("Bounce", _) => "bounced",
        ("SpamComplaint", _) => "complained",
        ("Open", _) => "opened",
        ("Click", _) => "clicked",
        // SuppressSending false is a re-subscription, not an unsubscribe.
        ("SubscriptionChange", _) if suppress == Some(true) => "unsubscribed",
        _ => "other",
    }
}

impl Source for Postmark {
    fn scheme(&self) -> &'static str {
        "postmark"
    }

    fn id_field(&self) -> &str {
        "ID"
    }

    fn verify(
        &self,
        r: &RawRequest<'_>,
        _now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        let auth = r
            .header("authorization")
            .ok_or(VerifyError::Missing("Authorization: Basic"))?;
        let encoded = auth
            .strip_prefix("Basic ")
            .or_else(|| auth.strip_prefix("basic "))
            .ok_or(VerifyError::Missing("Authorization: Basic"))?;
        let given = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|_| WRONG_CREDENTIALS)?;
        // Every pair is compared (no early exit), each in constant time.
        let ok = self
            .expected
            .iter()
            .fold(false, |ok, e| ok | constant_time_eq(&given, e));
        if !ok {
            return Err(WRONG_CREDENTIALS);
        }
        let body: Value =
            serde_json::from_slice(r.body).map_err(|e| VerifyError::Unparsable(e.to_string()))?;
        // Older payloads (and Postmark's own bounce example) have no RecordType: a BouncedAt
        // marks a bounce.
        let record = str_at(&body, "/RecordType")
            .or_else(|| body.get("BouncedAt").map(|_| "Bounce".to_owned()))
            .ok_or_else(|| VerifyError::Unparsable("no RecordType".into()))?;
        let time = ["/DeliveredAt", "/BouncedAt", "/ReceivedAt", "/ChangedAt"]
            .iter()
            .find_map(|p| body.pointer(p).and_then(iso_time));
        let message_id = str_at(&body, "/MessageID");
        let id = match (record.as_str(), str_at(&body, "/ID")) {
            ("Bounce" | "SpamComplaint", Some(id)) => id,
            _ => {
                let recipient = str_at(&body, "/Recipient")
                    .or_else(|| str_at(&body, "/Email"))
                    .unwrap_or_default();
                let when = time.map(|t| t.to_rfc3339()).unwrap_or_default();
                format!(
                    "{record}:{}:{recipient}:{when}",
                    message_id.as_deref().unwrap_or("")
                )
            }
        };
        let bounce_type = str_at(&body, "/Type");
        Ok(vec![ReceiptEvent {
            provider_event_id: id,
            event_type: vocabulary(
                &record,
                bounce_type.as_deref(),
                body.get("SuppressSending").and_then(Value::as_bool),
            )
            .into(),
            provider_type: record,
            event_time: time,
            herald_event_id: herald_event_id_in(body.get("Metadata")),
            provider_message_id: message_id,
            raw: body,
            replay_key: None,
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn basic(user_pass: &str) -> Vec<(String, String)> {
        vec![(
            "authorization".to_owned(),
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(user_pass)
            ),
        )]
    }

    fn answer(v: &dyn Source, headers: &[(String, String)]) -> Result<(), VerifyError> {
        let body = br#"{"RecordType":"Delivery","MessageID":"m1","Recipient":"a@b.example","DeliveredAt":"2026-11-30T10:00:00Z"}"#;
        v.verify(
            &RawRequest {
                headers,
                body,
                query: None,
                method: "POST",
            },
            Utc::now(),
        )
        .map(|_| ())
    }

    fn configured(toml_text: &str) -> Result<std::sync::Arc<dyn Source>, String> {
        let c: crate::ingest::schemes::SourceConfig =
            toml::from_str(toml_text).map_err(|e| e.to_string())?;
        crate::ingest::schemes::build("sources.pm", &c).map_err(|e| e.to_string())
    }

    #[test]
    fn several_credential_pairs_rotate() {
        // The list form alone, and beside the single pair: any configured pair is accepted.
        let listed = configured(
            r#"scheme = "postmark"
               credentials = [{ username = "hook", password = "new-pass" }, { username = "hook-old", password = "old-pass" }]"#,
        )
        .unwrap();
        let both = configured(
            r#"scheme = "postmark"
               username = "hook"
               password = "s3cret"
               credentials = [{ username = "hook2", password = "n3w" }]"#,
        )
        .unwrap();
        for (v, good, bad) in [
            (
                &listed,
                &["hook:new-pass", "hook-old:old-pass"][..],
                &[
                    "hook:old-pass",
                    "hook-old:new-pass",
                    "hook:new-pas",
                    "hook:new-passs",
                    ":",
                    "hook",
                ][..],
            ),
            (
                &both,
                &["hook:s3cret", "hook2:n3w"][..],
                &["hook:n3w", "hook2:s3cret", "hook2:"][..],
            ),
        ] {
            for g in good {
                assert_eq!(answer(&**v, &basic(g)), Ok(()), "{g}");
            }
            for b in bad {
                assert_eq!(answer(&**v, &basic(b)), Err(WRONG_CREDENTIALS), "{b}");
            }
        }
        let multi = Postmark::with_credentials(&[("a", "1"), ("b", "2")]);
        assert_eq!(answer(&multi, &basic("b:2")), Ok(()));
        assert_eq!(answer(&multi, &basic("a:2")), Err(WRONG_CREDENTIALS));
    }

    #[test]
    fn credential_configuration_is_checked() {
        for (toml_text, field) in [
            (r#"scheme = "postmark""#, "sources.pm.username"),
            (
                r#"scheme = "postmark"
                username = "hook""#,
                "sources.pm.password",
            ),
            (
                r#"scheme = "postmark"
                password = "p""#,
                "sources.pm.username",
            ),
            (
                r#"scheme = "postmark"
                credentials = []"#,
                "sources.pm.username",
            ),
            (
                r#"scheme = "postmark"
                credentials = [{ username = "hook", password = "" }]"#,
                "sources.pm.password",
            ),
        ] {
            let err = configured(toml_text).err().unwrap_or_default();
            assert!(err.starts_with(field), "{toml_text}: {err}");
        }
        let err = configured(
            r#"scheme = "postmark"
            credentials = [{ username = "hook", password = "p", realm = "x" }]"#,
        )
        .err()
        .unwrap_or_default();
        assert!(err.contains("realm"), "{err}");
        // Passwords never show in Debug.
        let c: crate::ingest::schemes::SourceConfig = toml::from_str(
            r#"scheme = "postmark"
               credentials = [{ username = "hook", password = "hunter2" }]"#,
        )
        .unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn basic_auth_and_normalization() {
        let v = Postmark::new("hook", "s3cret");
        let body = serde_json::to_vec(&json!({"RecordType": "Bounce", "ID": 4323372036854775807u64, "Type": "HardBounce",
            "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483", "BouncedAt": "2019-11-05T16:33:54.9070259Z",
            "Metadata": {"herald_event_id": "e-9"}})).unwrap();
        let good = vec![(
            "authorization".to_owned(),
            "Basic aG9vazpzM2NyZXQ=".to_owned(),
        )];
        let r = RawRequest {
            headers: &good,
            body: &body,
            query: None,
            method: "POST",
        };
        let e = v.verify(&r, Utc::now()).unwrap();
        assert_eq!(
            (e[0].provider_event_id.as_str(), e[0].event_type.as_str()),
            ("4323372036854775807", "bounced")
        );
        assert_eq!(e[0].herald_event_id.as_deref(), Some("e-9"));
        assert_eq!(e[0].event_time.unwrap().timestamp(), 1572971634);
        let bad = vec![(
            "authorization".to_owned(),
            "Basic aG9vazpzM2NyZXU=".to_owned(),
        )];
        assert_eq!(
            v.verify(
                &RawRequest {
                    headers: &bad,
                    body: &body,
                    query: None,
                    method: "POST",
                },
                Utc::now()
            ),
            Err(WRONG_CREDENTIALS)
        );
        assert!(matches!(
            v.verify(
                &RawRequest {
                    headers: &[],
                    body: &body,
                    query: None,
                    method: "POST",
                },
                Utc::now()
            ),
            Err(VerifyError::Missing(_))
        ));
        let delivery = serde_json::to_vec(
            &json!({"RecordType": "Delivery", "MessageID": "m1", "Recipient": "a@b.example",
            "DeliveredAt": "2019-11-05T16:33:54Z"}),
        )
        .unwrap();
        let e = v
            .verify(
                &RawRequest {
                    headers: &good,
                    body: &delivery,
                    query: None,
                    method: "POST",
                },
                Utc::now(),
            )
            .unwrap();
        assert_eq!(
            e[0].provider_event_id,
            "Delivery:m1:a@b.example:2019-11-05T16:33:54+00:00"
        );
    }
}
