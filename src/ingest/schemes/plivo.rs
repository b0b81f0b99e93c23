//! Plivo V3 signatures: `X-Plivo-Signature-V3` (or `X-Plivo-Signature-Ma-V3`, the main
//! account's token) = base64 HMAC-SHA256 (auth token) of the URL and parameters followed by
//! `.` and `X-Plivo-Signature-V3-Nonce`, several signatures comma-separated. The string is built
//! exactly as plivo-python (`signature_v3.py`) and plivo-go (`utils.go`) build it:
//!
//! - GET: `scheme://host/path`, then `?` and the query parameters sorted by name as
//!   `name=value` joined by `&` (decoded values; a repeated name once per value, values sorted).
//! - POST: `scheme://host/path`, then `?` if there is a query or a body parameter, the query as
//!   for GET, a `.` between the query and the body parameters when both exist, and the body
//!   parameters sorted by name as `namevalue` with no separators.
//!
//! Where the two SDKs differ (plivo-go keeps only the first value of a repeated name and trims
//! every trailing `.`), both strings are tried. V1 and V2 are not accepted (V2 signs no
//! parameters). Plivo signs no timestamp, so the nonce is the receipt's replay key: a nonce
//! already kept for a *different* event of the source (`herald_replay_keys`, for
//! `retention_unmatched_receipt_days`) is a replay, refused (401) and never stored; the same
//! event again is a duplicate. Receipts:
//! dedup on (`MessageUUID`, `Status`); event time from the status's own time field.

use base64::Engine;
use chrono::{DateTime, NaiveDateTime, TimeZone, Utc};
use std::collections::BTreeMap;

use super::params::{all_values, as_object, first_values, form_pairs, received_url};
use super::{SchemeConfigError, hmac_sha256};
use crate::ingest::{RawRequest, ReceiptEvent, Source, VerifyError, constant_time_eq};

pub struct Plivo {
    tokens: Vec<String>,
    public_url: String,
}

impl Plivo {
    pub fn new(tokens: Vec<String>, public_url: &str) -> Result<Self, SchemeConfigError> {
        url::Url::parse(public_url).map_err(SchemeConfigError::InvalidUrl)?;
        Ok(Self {
            tokens,
            public_url: public_url.to_owned(),
        })
    }
}

/// `name=value&…`, names sorted, each value of a repeated name (values sorted).
fn query_string(params: &BTreeMap<String, Vec<String>>) -> String {
    let mut parts = Vec::new();
    for (k, vs) in params {
        let mut vs = vs.clone();
        vs.sort();
        parts.extend(vs.iter().map(|v| format!("{k}={v}")));
    }
    parts.join("&")
}

/// `namevalue…`, names sorted, each value of a repeated name (values sorted).
fn params_string(params: &BTreeMap<String, Vec<String>>) -> String {
    let mut out = String::new();
    for (k, vs) in params {
        let mut vs = vs.clone();
        vs.sort();
        for v in vs {
            out.push_str(k);
            out.push_str(&v);
        }
    }
    out
}

fn only_first(params: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, Vec<String>> {
    params
        .iter()
        .map(|(k, vs)| (k.clone(), vs.iter().take(1).cloned().collect()))
        .collect()
}

/// The strings the SDKs sign (before `.{nonce}`) for a request to `url` (the URL as received)
/// with `body_params` (POST form fields): plivo-python's, then plivo-go's where it differs.
pub fn signed_strings(url: &str, method: &str, body_params: &[(String, String)]) -> Vec<String> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, q),
        None => (url, ""),
    };
    let base = base.split_once('#').map_or(base, |(b, _)| b);
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    let query_params = all_values(&form_pairs(query.as_bytes()));
    let body = all_values(body_params);
    let build = |q: &BTreeMap<String, Vec<String>>, b: &BTreeMap<String, Vec<String>>, go: bool| {
        if method.eq_ignore_ascii_case("GET") {
            // The body has no parameters on a GET: everything is in the query.
            let qs = query_string(q);
            if qs.is_empty() {
                base.to_owned()
            } else {
                format!("{base}?{qs}")
            }
        } else {
            let qs = query_string(q);
            let ps = params_string(b);
            let mut s = base.to_owned();
            if !qs.is_empty() || !ps.is_empty() {
                s.push('?');
            }
            s.push_str(&qs);
            if !qs.is_empty() {
                if go {
                    s.push('.');
                    s.push_str(&ps);
                    while s.ends_with('.') {
                        s.pop();
                    }
                    return s;
                }
                if !ps.is_empty() {
                    s.push('.');
                }
            }
            s.push_str(&ps);
            s
        }
    };
    let python = build(&query_params, &body, false);
    let go = build(&only_first(&query_params), &only_first(&body), true);
    if go == python {
        vec![python]
    } else {
        vec![python, go]
    }
}

fn sign(token: &str, data: &str, nonce: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(hmac_sha256(
        token.as_bytes(),
        &[data.as_bytes(), b".", nonce.as_bytes()],
    ))
}

/// `YYYY-mm-dd HH:MM:SS.SSSSSS` (UTC) → time.
fn plivo_time(s: &str) -> Option<DateTime<Utc>> {
    NaiveDateTime::parse_from_str(s.trim(), "%Y-%m-%d %H:%M:%S%.f")
        .ok()
        .map(|t| Utc.from_utc_datetime(&t))
        // A year past 9999 (`%Y` takes more digits) is no event time: a delivery status dated
        // so could not be stored on the message, and failed the reconciler's whole batch.
        .and_then(crate::ingest::plausible)
}

fn vocabulary(status: &str) -> &'static str {
    match status {
        "queued" => "queued",
        "sent" => "sent",
        "delivered" => "delivered",
        "undelivered" | "failed" => "failed",
        "rejected" => "dropped",
        "read" => "read",
        _ => "other",
    }
}

/// The time field that says when a status happened, falling back to the latest given.
fn event_time(status: &str, p: &BTreeMap<String, String>) -> Option<DateTime<Utc>> {
    let at = |k: &str| p.get(k).and_then(|v| plivo_time(v));
    let own = match status {
        "queued" => at("QueuedTime"),
        "sent" => at("SentTime"),
        _ => at("DeliveryReportTime"),
    };
    own.or_else(|| {
        [
            "DeliveryReportTime",
            "SentTime",
            "QueuedTime",
            "MessageTime",
        ]
        .iter()
        .find_map(|k| at(k))
    })
}

impl Source for Plivo {
    fn scheme(&self) -> &'static str {
        "plivo"
    }

    fn verify(
        &self,
        r: &RawRequest<'_>,
        _now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        let nonce = r
            .header("x-plivo-signature-v3-nonce")
            .ok_or(VerifyError::Missing("X-Plivo-Signature-V3-Nonce"))?;
        let sigs: Vec<&str> = ["x-plivo-signature-v3", "x-plivo-signature-ma-v3"]
            .iter()
            .filter_map(|h| r.header(h))
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if sigs.is_empty() {
            return Err(VerifyError::Missing("X-Plivo-Signature-V3"));
        }
        let url = received_url(&self.public_url, r.query);
        let body_params = if r.method.eq_ignore_ascii_case("GET") {
            Vec::new()
        } else {
            form_pairs(r.body)
        };
        let candidates: Vec<String> = signed_strings(&url, r.method, &body_params)
            .iter()
            .flat_map(|s| self.tokens.iter().map(move |t| sign(t, s, nonce)))
            .collect();
        let ok = sigs.iter().any(|given| {
            candidates
                .iter()
                .any(|c| constant_time_eq(c.as_bytes(), given.as_bytes()))
        });
        if !ok {
            return Err(VerifyError::Mismatch);
        }
        let pairs = if r.method.eq_ignore_ascii_case("GET") {
            form_pairs(r.query.unwrap_or("").as_bytes())
        } else {
            body_params
        };
        let params = first_values(&pairs);
        let (Some(id), Some(status)) = (
            crate::ingest::nonblank(params.get("MessageUUID")),
            params.get("Status"),
        ) else {
            return Err(VerifyError::Unparsable(
                "not a message status callback (no MessageUUID and Status)".into(),
            ));
        };
        Ok(vec![ReceiptEvent {
            provider_event_id: format!("{id}:{status}"),
            event_type: vocabulary(status).into(),
            provider_type: status.clone(),
            event_time: event_time(status, &params),
            herald_event_id: None,
            provider_message_id: Some(id.clone()),
            raw: as_object(&params),
            replay_key: Some(format!("plivo-nonce:{nonce}")),
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_past_year_9999_is_no_event_time() {
        assert!(plivo_time("2026-12-06 10:00:00").is_some());
        assert!(plivo_time("9999-12-31 23:59:59.999").is_some());
        assert_eq!(plivo_time("10000-01-01 00:00:00"), None);
        assert_eq!(plivo_time("123456-01-01 00:00:00"), None);
    }

    /// plivo-go `utils_test.go` `TestValidateSignatureV3Pass1..4`: auth token, nonce and params.
    const TOKEN: &str = "Y2Q2ZDgxZmY5YWRiOTI5YmQ1Njg0MTAxZWIyOTc4";
    const NONCE: &str = "31627761595286130198";
    const BASE: &str = "https://plivobin.non-prod.plivops.com/api/v1/validate_signature03.xml";

    fn go_params() -> Vec<(String, String)> {
        [
            ("Direction", "outbound"),
            ("From", "19792014278"),
            ("ALegUUID", "3e82ae9d-2c78-4d85-b1a4-6eae7dbafb36"),
            ("CallStatus", "in-progress"),
            ("BillRate", "0.002"),
            ("ParentAuthID", "MANWVLYTK4ZWU1YTY4QA"),
            (
                "To",
                "sip:PlivoSignature382029104058171078704104@phone-qa.voice.plivodev.com",
            ),
            ("ALegRequestUUID", "3e82ae9d-2c78-4d85-b1a4-6eae7dbafb36"),
            ("CallUUID", "3e82ae9d-2c78-4d85-b1a4-6eae7dbafb36"),
            ("RequestUUID", "3e82ae9d-2c78-4d85-b1a4-6eae7dbafb36"),
            (
                "SIP-H-To",
                "<sip:PlivoSignature382029104058171078704104@52.9.11.55;transport=udp>;tag=1",
            ),
            ("SessionStart", "2020-04-08 11:34:33.238707"),
            ("Event", "StartApp"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn encoded(p: &[(String, String)]) -> String {
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(p)
            .finish()
    }

    /// Each published case as the request Plivo would make: POST with the params as the form
    /// body; GET with them in the query beside the URL's own.
    fn verdict(url_query: Option<&str>, method: &str, sig: &str) -> Result<(), VerifyError> {
        let p = go_params();
        let public = format!("{BASE}/");
        let (query, body) = match (method, url_query) {
            ("GET", Some(q)) => (Some(format!("{q}&{}", encoded(&p))), String::new()),
            ("GET", None) => (Some(encoded(&p)), String::new()),
            (_, q) => (q.map(str::to_owned), encoded(&p)),
        };
        let public = if url_query.is_some() {
            public
        } else {
            BASE.to_owned()
        };
        let h = vec![
            ("x-plivo-signature-v3".to_owned(), sig.to_owned()),
            ("x-plivo-signature-v3-nonce".to_owned(), NONCE.to_owned()),
        ];
        let v = Plivo::new(vec!["other".into(), TOKEN.into()], &public).unwrap();
        match v.verify(
            &RawRequest {
                headers: &h,
                body: body.as_bytes(),
                query: query.as_deref(),
                method,
            },
            Utc::now(),
        ) {
            // Voice callbacks: verified, but not a message status.
            Err(VerifyError::Unparsable(_)) => Ok(()),
            Ok(_) => panic!("a voice callback stored as a receipt"),
            Err(e) => Err(e),
        }
    }

    #[test]
    fn plivo_go_published_v3_vectors() {
        let q = Some("a=b&c=d");
        assert_eq!(
            verdict(q, "POST", "k7Pusd4OxCIjR5IfA9iedDNu/h/gbdYqdzG/MiYtd1c="),
            Ok(())
        );
        assert_eq!(
            verdict(q, "GET", "UBq8jAtd32wR8EK9VgxbBn4n5rpI/l1H9iN4WfSEHFQ="),
            Ok(())
        );
        assert_eq!(
            verdict(None, "POST", "iAjE5QqI37mbkYe4w3jTMudqEzbDufdqi7sYwTu64e0="),
            Ok(())
        );
        assert_eq!(
            verdict(None, "GET", "i/MQsaQSAd6fiKhOh2qeeeLHZ9faldADSb3/7+Akfbc="),
            Ok(())
        );
        // Several comma-separated signatures, one of them right.
        assert_eq!(
            verdict(
                None,
                "GET",
                "bm9wZQ==,i/MQsaQSAd6fiKhOh2qeeeLHZ9faldADSb3/7+Akfbc="
            ),
            Ok(())
        );
        // The POST signature does not hold for a GET, nor without the query.
        assert_eq!(
            verdict(q, "GET", "k7Pusd4OxCIjR5IfA9iedDNu/h/gbdYqdzG/MiYtd1c="),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verdict(None, "POST", "k7Pusd4OxCIjR5IfA9iedDNu/h/gbdYqdzG/MiYtd1c="),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn the_sdks_strings_and_where_they_differ() {
        let p = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(signed_strings("https://h/x", "POST", &[]), ["https://h/x"]);
        assert_eq!(
            signed_strings("https://h/x?b=2&a=1", "POST", &[]),
            ["https://h/x?a=1&b=2"]
        );
        assert_eq!(
            signed_strings("https://h/x", "POST", &p(&[("b", "2"), ("a", "1")])),
            ["https://h/x?a1b2"]
        );
        assert_eq!(
            signed_strings("https://h/x?q=1", "POST", &p(&[("a", "1")])),
            ["https://h/x?q=1.a1"]
        );
        assert_eq!(
            signed_strings("https://h/x?q=1&a=%20", "GET", &[]),
            ["https://h/x?a= &q=1"]
        );
        // plivo-python signs every value of a repeated name, plivo-go the first; plivo-go
        // trims every trailing dot.
        assert_eq!(
            signed_strings("https://h/x?a=2&a=1", "GET", &[]),
            ["https://h/x?a=1&a=2", "https://h/x?a=2"]
        );
        assert_eq!(
            signed_strings("https://h/x?q=1", "POST", &p(&[("a", "v.")])),
            ["https://h/x?q=1.av.", "https://h/x?q=1.av"]
        );
    }

    #[test]
    fn message_callbacks_normalize_with_the_nonce_as_replay_key() {
        let body = "MessageUUID=m-1&Status=delivered&To=%2B15550001&DeliveryReportTime=2024-01-02+03%3A04%3A05.123456&SentTime=2024-01-02+03%3A04%3A00.000000";
        let url = "https://h.example/plivo";
        let strings = signed_strings(url, "POST", &form_pairs(body.as_bytes()));
        let h = vec![
            (
                "x-plivo-signature-ma-v3".to_owned(),
                sign("tok", &strings[0], "n-1"),
            ),
            ("x-plivo-signature-v3-nonce".to_owned(), "n-1".to_owned()),
        ];
        let v = Plivo::new(vec!["tok".into()], url).unwrap();
        let r = RawRequest {
            headers: &h,
            body: body.as_bytes(),
            query: None,
            method: "POST",
        };
        let e = &v.verify(&r, Utc::now()).unwrap()[0];
        assert_eq!(
            (
                e.provider_event_id.as_str(),
                e.event_type.as_str(),
                e.event_time.unwrap().timestamp_micros(),
                e.replay_key.as_deref()
            ),
            (
                "m-1:delivered",
                "delivered",
                1704164645123456,
                Some("plivo-nonce:n-1")
            )
        );
        // V2 headers alone are not accepted.
        let v2 = vec![
            ("x-plivo-signature-v2".to_owned(), "x".to_owned()),
            ("x-plivo-signature-v2-nonce".to_owned(), "1".to_owned()),
        ];
        assert!(matches!(
            v.verify(&RawRequest { headers: &v2, ..r }, Utc::now()),
            Err(VerifyError::Missing(_))
        ));
    }

    #[test]
    fn every_status_maps_into_the_vocabulary_with_its_own_time() {
        let got: Vec<_> = [
            "queued",
            "sent",
            "delivered",
            "undelivered",
            "failed",
            "rejected",
            "read",
            "x",
        ]
        .iter()
        .map(|s| vocabulary(s))
        .collect();
        assert_eq!(
            got,
            [
                "queued",
                "sent",
                "delivered",
                "failed",
                "failed",
                "dropped",
                "read",
                "other"
            ]
        );
        let p: BTreeMap<String, String> = [
            ("MessageTime", "2024-01-01 00:00:01.000000"),
            ("QueuedTime", "2024-01-01 00:00:02.000000"),
            ("SentTime", "2024-01-01 00:00:03.000000"),
            ("DeliveryReportTime", "bad"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let secs = |s| event_time(s, &p).map(|t| t.timestamp() % 60);
        assert_eq!(
            (secs("queued"), secs("sent"), secs("delivered")),
            (Some(2), Some(3), Some(3)),
            "a receipt time that does not parse falls back to the latest given"
        );
        assert_eq!(event_time("delivered", &BTreeMap::new()), None);
    }
}
