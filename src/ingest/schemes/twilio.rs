//! Twilio: `X-Twilio-Signature` = base64 HMAC-SHA1 (auth token) of the full public URL followed,
//! for form bodies, by every parameter name and value (names sorted, each name's values sorted).
//! URL variants are tried: as configured, without an explicit port, with the default port. For
//! JSON bodies the URL carries `bodySHA256`, which must equal the body's SHA-256, and only the
//! URL is signed. Twilio gives no event id or time: dedup on (MessageSid, MessageStatus).

use base64::Engine;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use url::Url;

use crate::ingest::{RawRequest, ReceiptEvent, Source, VerifyError, constant_time_eq};

pub struct Twilio {
    tokens: Vec<String>,
    public_url: Url,
}

impl Twilio {
    pub fn new(tokens: Vec<String>, public_url: &str) -> Result<Self, String> {
        let public_url = Url::parse(public_url).map_err(|e| format!("is not a valid URL ({e})"))?;
        Ok(Self { tokens, public_url })
    }

    /// The URL as Twilio called it: the configured public URL, plus the request's query string
    /// (verbatim, never re-encoded) when the configured URL has none; a `bodySHA256` the request
    /// carries is appended to a configured query that lacks it.
    fn called_url(&self, query: Option<&str>) -> Option<Url> {
        let base = self.public_url.as_str();
        let query = query.filter(|q| !q.is_empty());
        let full = match (self.public_url.query(), query) {
            (None, Some(q)) => format!("{base}?{q}"),
            (Some(own), Some(q)) if !own.contains("bodySHA256=") => {
                match q.split('&').find(|p| p.starts_with("bodySHA256=")) {
                    Some(sha) => format!("{base}&{sha}"),
                    None => base.to_owned(),
                }
            }
            _ => base.to_owned(),
        };
        Url::parse(&full).ok()
    }
}

/// The URL forms Twilio may have signed: as is, without an explicit port, with the default port.
pub fn url_variants(u: &Url) -> Vec<String> {
    let mut out = vec![u.as_str().to_owned()];
    let default = match u.scheme() {
        "https" => 443,
        "http" => 80,
        _ => return out,
    };
    let mut other = u.clone();
    if u.port().is_some() {
        if other.set_port(None).is_ok() {
            out.push(other.as_str().to_owned());
        }
    } else if let Some(host) = u.host_str() {
        // `Url` drops a default port when set, so spell it out by hand.
        let s = u.as_str();
        let with = s.replacen(host, &format!("{host}:{default}"), 1);
        out.push(with);
    }
    out
}

fn sign(token: &str, data: &str) -> String {
    let mut mac = <Hmac<sha1::Sha1> as Mac>::new_from_slice(token.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
    mac.update(data.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

fn vocabulary(status: &str) -> &'static str {
    match status {
        // PROVIDERS.md: queued, sending and sent all mean "handed on" (its lattice orders them).
        "accepted" | "scheduled" => "queued",
        "queued" | "sending" | "sent" => "sent",
        "delivered" => "delivered",
        "undelivered" | "failed" => "failed",
        "canceled" => "dropped",
        "read" => "read",
        _ => "other",
    }
}

impl Source for Twilio {
    fn scheme(&self) -> &'static str {
        "twilio"
    }

    fn verify(
        &self,
        r: &RawRequest<'_>,
        _now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        let given = r
            .header("x-twilio-signature")
            .ok_or(VerifyError::Missing("X-Twilio-Signature"))?;
        let url = self.called_url(r.query).ok_or(VerifyError::Mismatch)?;
        let body_sha = url
            .query_pairs()
            .find(|(k, _)| k == "bodySHA256")
            .map(|(_, v)| v.into_owned());
        let params: Vec<(String, String)> = if body_sha.is_some() {
            Vec::new()
        } else {
            let mut p: Vec<(String, String)> = url::form_urlencoded::parse(r.body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            p.sort();
            p
        };
        let suffix: String = params.iter().map(|(k, v)| format!("{k}{v}")).collect();
        let ok = url_variants(&url).iter().any(|u| {
            let data = format!("{u}{suffix}");
            self.tokens
                .iter()
                .any(|t| constant_time_eq(sign(t, &data).as_bytes(), given.trim().as_bytes()))
        });
        if !ok {
            return Err(VerifyError::Mismatch);
        }
        let fields: Map<String, Value> = if let Some(expected) = body_sha {
            if !constant_time_eq(
                hex::encode(Sha256::digest(r.body)).as_bytes(),
                expected.to_ascii_lowercase().as_bytes(),
            ) {
                return Err(VerifyError::Mismatch);
            }
            match serde_json::from_slice(r.body) {
                Ok(Value::Object(m)) => m,
                _ => return Err(VerifyError::Unparsable("JSON body is not an object".into())),
            }
        } else {
            params
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect()
        };
        let get = |k: &str| fields.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        // SMS status callbacks carry MessageSid/MessageStatus; voice callbacks CallSid/CallStatus.
        let sid = get("MessageSid")
            .or_else(|| get("SmsSid"))
            .or_else(|| get("CallSid"))
            .ok_or_else(|| VerifyError::Unparsable("no MessageSid or CallSid".into()))?;
        let status = get("MessageStatus")
            .or_else(|| get("SmsStatus"))
            .or_else(|| get("CallStatus"))
            .unwrap_or_else(|| "unknown".into());
        Ok(vec![ReceiptEvent {
            provider_event_id: format!("{sid}:{status}"),
            event_type: vocabulary(&status).into(),
            provider_type: status,
            event_time: None,
            herald_event_id: None,
            provider_message_id: Some(sid),
            raw: Value::Object(fields),
            replay_key: None,
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_variants_cover_ports() {
        let u = Url::parse("https://mycompany.com:443/myapp.php?foo=1").unwrap();
        // The url crate normalises the default port away.
        assert_eq!(
            url_variants(&u),
            [
                "https://mycompany.com/myapp.php?foo=1",
                "https://mycompany.com:443/myapp.php?foo=1"
            ]
        );
        let u = Url::parse("https://mycompany.com:8443/x").unwrap();
        assert_eq!(
            url_variants(&u),
            ["https://mycompany.com:8443/x", "https://mycompany.com/x"]
        );
    }

    #[test]
    fn form_signature_over_sorted_params() {
        let token = "12345";
        let url = "https://mycompany.com/myapp.php?foo=1&bar=2";
        let body = b"To=%2B18005551212&From=%2B14158675310&MessageSid=SM1&MessageStatus=delivered&CallSid=CA1";
        let data = format!(
            "{url}CallSidCA1From+14158675310MessageSidSM1MessageStatusdeliveredTo+18005551212"
        );
        let h = vec![("x-twilio-signature".to_owned(), sign(token, &data))];
        let v = Twilio::new(vec!["other".into(), token.into()], url).unwrap();
        let e = v
            .verify(
                &RawRequest {
                    headers: &h,
                    body,
                    query: None,
                },
                Utc::now(),
            )
            .unwrap();
        assert_eq!(
            (e[0].provider_event_id.as_str(), e[0].event_type.as_str()),
            ("SM1:delivered", "delivered")
        );
        let tampered = b"To=%2B18005551213&From=%2B14158675310&MessageSid=SM1&MessageStatus=delivered&CallSid=CA1";
        assert_eq!(
            v.verify(
                &RawRequest {
                    headers: &h,
                    body: tampered,
                    query: None
                },
                Utc::now()
            ),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn json_bodies_use_body_sha256() {
        let body = br#"{"MessageSid":"SM2","MessageStatus":"sent"}"#;
        let sha = hex::encode(Sha256::digest(body));
        let url = format!("https://h.example/t?bodySHA256={sha}");
        let h = vec![("x-twilio-signature".to_owned(), sign("tok", &url))];
        let v = Twilio::new(vec!["tok".into()], "https://h.example/t").unwrap();
        let q = format!("bodySHA256={sha}");
        let e = v
            .verify(
                &RawRequest {
                    headers: &h,
                    body,
                    query: Some(&q),
                },
                Utc::now(),
            )
            .unwrap();
        assert_eq!(e[0].provider_event_id, "SM2:sent");
        let other = br#"{"MessageSid":"SM2","MessageStatus":"read"}"#;
        assert_eq!(
            v.verify(
                &RawRequest {
                    headers: &h,
                    body: other,
                    query: Some(&q)
                },
                Utc::now()
            ),
            Err(VerifyError::Mismatch)
        );
    }
}
