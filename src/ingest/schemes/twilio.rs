//! Twilio: `X-Twilio-Signature` = base64 HMAC-SHA1 (auth token) of the full public URL followed,
//! for form bodies, by `name + value` for every parameter: names sorted, and a name sent several
//! times (array parameters such as `MessagingBinding.Address`) once per distinct value, the
//! values sorted — as Twilio's own validators (twilio-python, twilio-node) compute it. URL variants are tried: as configured, without an explicit port, with the default port. For
//! JSON bodies the URL carries `bodySHA256`, which must equal the body's SHA-256, and only the
//! URL is signed. Twilio gives no event id or time: dedup on (MessageSid, MessageStatus).

use base64::Engine;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use url::Url;

use super::SchemeConfigError;
use crate::ingest::{RawRequest, ReceiptEvent, Source, VerifyError, constant_time_eq};

pub struct Twilio {
    tokens: Vec<String>,
    public_url: Url,
}

impl Twilio {
    pub fn new(tokens: Vec<String>, public_url: &str) -> Result<Self, SchemeConfigError> {
        let public_url = Url::parse(public_url).map_err(SchemeConfigError::InvalidUrl)?;
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

/// What Twilio appends to the URL for a form body: `name + value` for each parameter, names
/// sorted and, for a name sent several times, each distinct value once, the values sorted (byte
/// order, which for UTF-8 is code-point order). Arrival order never matters.
pub fn signed_params(params: &[(String, String)]) -> String {
    let mut sorted: Vec<(&str, &str)> = params
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    sorted.sort_unstable();
    // A value repeated under one name is signed once.
    sorted.dedup();
    sorted.iter().map(|(k, v)| format!("{k}{v}")).collect()
}

/// Form parameters as a JSON object: a name sent once keeps its string, a name sent several
/// times (an array parameter) keeps every value, in arrival order.
fn form_fields(params: Vec<(String, String)>) -> Map<String, Value> {
    let mut fields = Map::new();
    for (k, v) in params {
        match fields.get_mut(&k) {
            None => {
                fields.insert(k, Value::String(v));
            }
            Some(Value::Array(values)) => values.push(Value::String(v)),
            Some(first) => {
                let first = first.take();
                fields.insert(k, Value::Array(vec![first, Value::String(v)]));
            }
        }
    }
    fields
}

/// How Twilio signed: with the account's Auth Token, HMAC-SHA1; with a SharedKey, the
/// algorithm its `X-Twilio-Webhooks-Signature-Settings` header names
/// (`key=webhooks_sharedkey_…,algorithm=HMAC_SHA256`), as twilio-python's `RequestValidator`
/// reads it. The same string is signed either way.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Algorithm {
    Sha1,
    Sha256,
}

fn algorithm(settings: Option<&str>) -> Result<Algorithm, VerifyError> {
    let named = settings.unwrap_or("").split(',').find_map(|part| {
        let (name, value) = part.split_once('=')?;
        (name.trim() == "algorithm" && !value.trim().is_empty()).then(|| value.trim())
    });
    match named {
        None => Ok(Algorithm::Sha1),
        Some(a) if a.eq_ignore_ascii_case("HMAC_SHA1") => Ok(Algorithm::Sha1),
        Some(a) if a.eq_ignore_ascii_case("HMAC_SHA256") => Ok(Algorithm::Sha256),
        Some(_) => Err(VerifyError::NotAccepted(
            "X-Twilio-Webhooks-Signature-Settings names an algorithm other than HMAC_SHA1 or HMAC_SHA256",
        )),
    }
}

fn sign_with(algorithm: Algorithm, token: &str, data: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    match algorithm {
        Algorithm::Sha1 => {
            let mut mac = <Hmac<sha1::Sha1> as Mac>::new_from_slice(token.as_bytes())
                .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
            mac.update(data.as_bytes());
            b64.encode(mac.finalize().into_bytes())
        }
        Algorithm::Sha256 => {
            let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(token.as_bytes())
                .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
            mac.update(data.as_bytes());
            b64.encode(mac.finalize().into_bytes())
        }
    }
}

#[cfg(test)]
fn sign(token: &str, data: &str) -> String {
    sign_with(Algorithm::Sha1, token, data)
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
        let algorithm = algorithm(r.header("x-twilio-webhooks-signature-settings"))?;
        let url = self.called_url(r.query).ok_or(VerifyError::Mismatch)?;
        let body_sha = url
            .query_pairs()
            .find(|(k, _)| k == "bodySHA256")
            .map(|(_, v)| v.into_owned());
        let params: Vec<(String, String)> = if body_sha.is_some() {
            Vec::new()
        } else {
            url::form_urlencoded::parse(r.body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        };
        let suffix = signed_params(&params);
        let ok = url_variants(&url).iter().any(|u| {
            let data = format!("{u}{suffix}");
            self.tokens.iter().any(|t| {
                constant_time_eq(
                    sign_with(algorithm, t, &data).as_bytes(),
                    given.trim().as_bytes(),
                )
            })
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
        } else if r.method.eq_ignore_ascii_case("GET") {
            // A callback configured as GET (a call's StatusCallbackMethod) carries its
            // parameters in the query, which the signed URL covers; it has no body.
            form_fields(
                url::form_urlencoded::parse(r.query.unwrap_or("").as_bytes())
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect(),
            )
        } else {
            form_fields(params)
        };
        let get = |k: &str| {
            crate::ingest::nonblank(fields.get(k).and_then(|v| v.as_str())).map(str::to_owned)
        };
        // SMS status callbacks carry MessageSid/MessageStatus; voice callbacks CallSid/CallStatus.
        // Twilio's request for an incoming message (SmsStatus `received`, no MessageStatus) or
        // an incoming call (Direction `inbound`) at this URL is no receipt: refused, not stored
        // (it holds the sender's number and the text).
        // (A status of a message sent is never `received` or `receiving`, in either field.)
        if [get("MessageStatus"), get("SmsStatus")]
            .iter()
            .flatten()
            .any(|s| s == "received" || s == "receiving")
        {
            return Err(VerifyError::Unparsable(
                "an incoming message (status received), not a status callback".into(),
            ));
        }
        if get("MessageSid").is_none() && get("Direction").is_some_and(|d| d == "inbound") {
            return Err(VerifyError::Unparsable(
                "an incoming call (Direction inbound), not a status callback".into(),
            ));
        }
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
    fn a_shared_key_signature_is_checked_with_the_algorithm_its_settings_name() {
        let url = "https://mycompany.com/myapp.php";
        let body = b"MessageSid=SM1&MessageStatus=delivered";
        let data = format!("{url}MessageSidSM1MessageStatusdelivered");
        let v = Twilio::new(vec!["auth-token".into(), "shared-secret".into()], url).unwrap();
        let verify = |headers: Vec<(String, String)>| {
            v.verify(
                &RawRequest {
                    headers: &headers,
                    body,
                    query: None,
                    method: "POST",
                },
                Utc::now(),
            )
            .map(|e| e.len())
        };
        let sig = |alg, key| ("x-twilio-signature".to_owned(), sign_with(alg, key, &data));
        let settings = |v: &str| {
            (
                "x-twilio-webhooks-signature-settings".to_owned(),
                v.to_owned(),
            )
        };
        let shared = "key=webhooks_sharedkey_abc, algorithm=HMAC_SHA256";
        assert_eq!(
            verify(vec![
                sig(Algorithm::Sha256, "shared-secret"),
                settings(shared)
            ]),
            Ok(1)
        );
        assert_eq!(verify(vec![sig(Algorithm::Sha1, "auth-token")]), Ok(1));
        assert_eq!(
            verify(vec![
                sig(Algorithm::Sha1, "auth-token"),
                settings("algorithm=hmac_sha1")
            ]),
            Ok(1)
        );
        // The algorithm the header names, not another: a SHA-1 signature under HMAC_SHA256
        // settings, and a SHA-256 one without them, are refused.
        assert_eq!(
            verify(vec![
                sig(Algorithm::Sha1, "shared-secret"),
                settings(shared)
            ]),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify(vec![sig(Algorithm::Sha256, "shared-secret")]),
            Err(VerifyError::Mismatch)
        );
        assert!(matches!(
            verify(vec![
                sig(Algorithm::Sha256, "shared-secret"),
                settings("key=k,algorithm=HMAC_MD5")
            ]),
            Err(VerifyError::NotAccepted(_))
        ));
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
                    method: "POST",
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
                    query: None,
                    method: "POST",
                },
                Utc::now()
            ),
            Err(VerifyError::Mismatch)
        );
    }

    /// Twilio's requests for an incoming message or call, signed with the source's token, are
    /// refused as no receipt (400, nothing stored); a call's status callback is a receipt.
    #[test]
    fn incoming_messages_and_calls_are_not_receipts() {
        let token = "12345";
        let url = "https://h.example/v1/ingest/twilio";
        let v = Twilio::new(vec![token.into()], url).unwrap();
        let verdict = |body: &str| {
            let params: Vec<(String, String)> = url::form_urlencoded::parse(body.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            let h = vec![(
                "x-twilio-signature".to_owned(),
                sign(token, &format!("{url}{}", signed_params(&params))),
            )];
            v.verify(
                &RawRequest {
                    headers: &h,
                    body: body.as_bytes(),
                    query: None,
                    method: "POST",
                },
                Utc::now(),
            )
        };
        for (body, why) in [
            (
                "MessageSid=SM9&SmsSid=SM9&SmsStatus=received&Body=Hi&From=%2B1555&To=%2B1666",
                "an incoming message",
            ),
            (
                "CallSid=CA9&CallStatus=ringing&Direction=inbound&From=%2B1555&To=%2B1666",
                "an incoming call",
            ),
        ] {
            match verdict(body) {
                Err(VerifyError::Unparsable(e)) => assert!(e.starts_with(why), "{e}"),
                other => panic!("{body}: {other:?}"),
            }
        }
        // A status callback carries both MessageStatus and SmsStatus; a call's carries its
        // CallStatus and an outbound Direction.
        for (body, key) in [
            (
                "MessageSid=SM9&SmsSid=SM9&SmsStatus=delivered&MessageStatus=delivered",
                "SM9:delivered",
            ),
            (
                "CallSid=CA9&CallStatus=completed&Direction=outbound-api",
                "CA9:completed",
            ),
        ] {
            let e = verdict(body).unwrap();
            assert_eq!(e[0].provider_event_id, key);
        }
    }

    /// A status callback configured as GET: its parameters are in the signed URL's query.
    #[test]
    fn a_get_callback_reads_its_parameters_from_the_query() {
        let token = "12345";
        let url = "https://h.example/v1/ingest/twilio";
        let v = Twilio::new(vec![token.into()], url).unwrap();
        let query = "CallSid=CA7&CallStatus=completed&Direction=outbound-api";
        let h = vec![(
            "x-twilio-signature".to_owned(),
            sign(token, &format!("{url}?{query}")),
        )];
        let e = v
            .verify(
                &RawRequest {
                    headers: &h,
                    body: b"",
                    query: Some(query),
                    method: "GET",
                },
                Utc::now(),
            )
            .unwrap();
        assert_eq!(e[0].provider_event_id, "CA7:completed");
    }

    /// The validators' published test vectors: auth token `12345`, and (URL as configured, query
    /// the request arrived with, body, `X-Twilio-Signature`). Where a test gives its parameters
    /// as a dict or object, the body is that dict form-encoded (`+` as `%2B`); the signature does
    /// not depend on the body's order.
    const PY: &str = "twilio/twilio-python tests/unit/test_request_validator.py @ 306691e7";
    const NODE: &str = "twilio/twilio-node spec/validation.spec.js @ 45d3d65a";
    const URI: &str = "https://mycompany.com/myapp.php?foo=1&bar=2";
    const PARAMS: &str = "CallSid=CA1234567890ABCDE&Digits=1234&From=%2B14158675309&To=%2B18005551212&Caller=%2B14158675309";
    const BODY: &str = r#"{"property": "value", "boolean": true}"#;
    const BODY_SHA: &str = "0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620";
    const EMPTY_SHA: &str = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";

    fn published() -> Vec<(String, String, Option<String>, &'static str, &'static str)> {
        let q = |s: &str| Some(s.to_owned());
        vec![
            // (origin and test, public_url, request query, body, signature)
            (
                format!("{PY} test_validation"),
                URI.into(),
                None,
                PARAMS,
                "RSOYDt4T1cUTdK1PDd93/VVr8B8=",
            ),
            (
                format!("{PY} test_compute_signature_duplicate_query_dict (body verbatim)"),
                URI.into(),
                None,
                "Sid=CA123&SidAccount=AC123&Digits=5678&Digits=1234&Digits=1234",
                "IK+Dwps556ElfBT0I3Rgjkr1wJU=",
            ),
            (
                format!("{PY} test_compute_signature_duplicate_multi_dict"),
                URI.into(),
                None,
                "Sid=CA123&SidAccount=AC123&Digits=5678&Digits=1234&Digits=1234",
                "IK+Dwps556ElfBT0I3Rgjkr1wJU=",
            ),
            (
                format!("{PY} test_validation_removes_port_on_https"),
                URI.replace(".com", ".com:1234"),
                None,
                PARAMS,
                "RSOYDt4T1cUTdK1PDd93/VVr8B8=",
            ),
            (
                format!("{PY} test_validation_removes_port_on_http"),
                URI.replace(".com", ".com:1234").replace("https", "http"),
                None,
                PARAMS,
                "Zmvh+3yNM1Phv2jhDCwEM3q5ebU=",
            ),
            (
                format!("{PY} test_validation_adds_port_on_https"),
                URI.into(),
                None,
                PARAMS,
                "kvajT1Ptam85bY51eRf/AJRuM3w=",
            ),
            (
                format!("{PY} test_validation_adds_port_on_http"),
                URI.replace("https", "http"),
                None,
                PARAMS,
                "0ZXoZLH/DfblKGATFgpif+LLRf4=",
            ),
            (
                format!("{PY} test_validation_of_body_succeeds"),
                URI.into(),
                q(&format!("foo=1&bar=2&bodySHA256={BODY_SHA}")),
                BODY,
                "a9nBmqA0ju/hNViExpshrM61xv4=",
            ),
            (
                format!("{NODE} should succeed with the correct signature"),
                URI.into(),
                None,
                PARAMS,
                "RSOYDt4T1cUTdK1PDd93/VVr8B8=",
            ),
            (
                format!("{NODE} should validate request body with an array parameter"),
                URI.into(),
                None,
                "MessagingBinding.Address=%2B1325xxxxxxx&MessagingBinding.Address=%2B1415xxxxxxx",
                "83O6e2vORAoJHUNzJjDWN1jz+BA=",
            ),
            (
                format!("{NODE} … regardless of the position of values in the array"),
                URI.into(),
                None,
                "MessagingBinding.Address=%2B1415xxxxxxx&MessagingBinding.Address=%2B1325xxxxxxx",
                "83O6e2vORAoJHUNzJjDWN1jz+BA=",
            ),
            (
                format!("{NODE} should validate request body with multiple params and values"),
                URI.into(),
                None,
                "Sid=CA123&SidAccount=AC123&Digits=5678&Digits=1234&Digits=1234",
                "IK+Dwps556ElfBT0I3Rgjkr1wJU=",
            ),
            (
                format!("{NODE} should validate request body when given"),
                URI.into(),
                q(&format!("foo=1&bar=2&bodySHA256={BODY_SHA}")),
                BODY,
                "a9nBmqA0ju/hNViExpshrM61xv4=",
            ),
            (
                format!("{NODE} should validate request body when empty"),
                URI.into(),
                q(&format!("foo=1&bar=2&bodySHA256={EMPTY_SHA}")),
                "{}",
                "Ldidvp12m26NI7eqEvxnEpkd9Hc=",
            ),
            (
                format!("{NODE} should validate request body with only sha param"),
                "https://mycompany.com/myapp.php".into(),
                q(&format!("bodySHA256={BODY_SHA}")),
                BODY,
                "y77kIzt2vzLz71DgmJGsen2scGs=",
            ),
            (
                format!("{NODE} should validate https urls with ports by stripping them"),
                URI.replace(".com", ".com:1234"),
                None,
                PARAMS,
                "RSOYDt4T1cUTdK1PDd93/VVr8B8=",
            ),
            (
                format!("{NODE} should validate urls with credentials"),
                "https://user:pass@mycompany.com/myapp.php?foo=1&bar=2".into(),
                None,
                PARAMS,
                "CukzLTc1tT5dXEDIHm/tKBanW10=",
            ),
            (
                format!("{NODE} should validate urls with just username"),
                "https://user@mycompany.com/myapp.php?foo=1&bar=2".into(),
                None,
                PARAMS,
                "2YRLlVAflCqxaNicjMpJcSTgzSs=",
            ),
            (
                format!("{NODE} should validate urls with credentials by adding port"),
                "https://user:pass@mycompany.com/myapp.php?foo=1&bar=2".into(),
                None,
                PARAMS,
                "ZQFR1PTIZXF2MXB8ZnKCvnnA+rI=",
            ),
            (
                format!("{NODE} should validate urls with special characters"),
                format!("{URI}&Body=It's+amazing"),
                None,
                PARAMS,
                "TfZzewPq8wqrGlMfyAud8+/IvJ0=",
            ),
        ]
    }

    /// Whether the signature held: stored (`Ok`) or verified but not a status callback
    /// (`Unparsable`, a 400) — never `Mismatch`/`Missing` (a 401).
    fn check(
        public_url: &str,
        query: Option<&str>,
        body: &[u8],
        sig: &str,
    ) -> Result<(), VerifyError> {
        let h = vec![("x-twilio-signature".to_owned(), sig.to_owned())];
        let v = Twilio::new(vec!["12345".into()], public_url).unwrap();
        match v.verify(
            &RawRequest {
                headers: &h,
                body,
                query,
                method: "POST",
            },
            Utc::now(),
        ) {
            Ok(_) | Err(VerifyError::Unparsable(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    #[test]
    fn published_vectors_of_twilios_validators() {
        let failed: Vec<String> = published()
            .into_iter()
            .filter_map(|(origin, url, query, body, sig)| {
                check(&url, query.as_deref(), body.as_bytes(), sig)
                    .err()
                    .map(|e| format!("{origin}: {e}"))
            })
            .collect();
        assert!(failed.is_empty(), "refused: {failed:#?}");
        // twilio-node "should fail when given the wrong signature", and "should fail validation
        // if given body but no bodySHA256 param".
        assert_eq!(
            check(URI, None, PARAMS.as_bytes(), "WRONG_SIGNATURE"),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            check(URI, None, BODY.as_bytes(), "RSOYDt4T1cUTdK1PDd93/VVr8B8="),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn repeated_names_sign_each_distinct_value_once_in_order() {
        let p = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            signed_params(&p(&[
                ("Sid", "CA123"),
                ("SidAccount", "AC123"),
                ("Digits", "5678"),
                ("Digits", "1234"),
                ("Digits", "1234")
            ])),
            "Digits1234Digits5678SidCA123SidAccountAC123"
        );
        // A value repeated under another name is its own parameter.
        assert_eq!(
            signed_params(&p(&[("B", "x"), ("A", "x"), ("B", "x")])),
            "AxBx"
        );
        assert_eq!(signed_params(&[]), "");
        // The stored event keeps every value of an array parameter.
        let f = form_fields(p(&[
            ("To", "+1"),
            ("MessagingBinding.Address", "+2"),
            ("MessagingBinding.Address", "+3"),
        ]));
        assert_eq!(f["To"], "+1");
        assert_eq!(
            f["MessagingBinding.Address"],
            serde_json::json!(["+2", "+3"])
        );
        // Tampering with one value of an array parameter breaks the signature.
        assert_eq!(
            check(
                URI,
                None,
                b"MessagingBinding.Address=%2B1325xxxxxxx&MessagingBinding.Address=%2B1415xxxxxxy",
                "83O6e2vORAoJHUNzJjDWN1jz+BA="
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
                    method: "POST",
                },
                Utc::now(),
            )
            .unwrap();
        assert_eq!(e[0].provider_event_id, "SM2:sent");
        // An empty MessageSid is none (`:sent` would be the key of every such callback).
        let blank = br#"{"MessageSid":"","MessageStatus":"sent"}"#;
        let sha = hex::encode(Sha256::digest(blank));
        let url = format!("https://h.example/t?bodySHA256={sha}");
        let hb = vec![("x-twilio-signature".to_owned(), sign("tok", &url))];
        let qb = format!("bodySHA256={sha}");
        assert!(matches!(
            v.verify(
                &RawRequest {
                    headers: &hb,
                    body: blank,
                    query: Some(&qb),
                    method: "POST",
                },
                Utc::now()
            ),
            Err(VerifyError::Unparsable(_))
        ));
        let other = br#"{"MessageSid":"SM2","MessageStatus":"read"}"#;
        assert_eq!(
            v.verify(
                &RawRequest {
                    headers: &h,
                    body: other,
                    query: Some(&q),
                    method: "POST",
                },
                Utc::now()
            ),
            Err(VerifyError::Mismatch)
        );
    }
}
