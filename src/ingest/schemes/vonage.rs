//! Vonage, two signing schemes under one source:
//!
//! - **SMS API** signed webhooks: a `sig` parameter over the other parameters sorted by name,
//!   each as `&name=value` with `&` and `=` in the value replaced by `_` (as vonage-node-sdk's
//!   `verifySignature` and vonage-ruby-sdk's `Signature#check` build it). The method is the
//!   source's `signature_method` — `md5hash` (MD5 of the string followed by the secret) or the
//!   HMACs `md5`, `sha1`, `sha256`, `sha512` — and is never guessed from the signature's length,
//!   so nobody can choose the weakest one. The signed `timestamp` parameter must be within the
//!   tolerance, both ways. Parameters come from the query (GET) or the body (POST form or JSON).
//!   A delivery receipt (`status`, `messageId`, `scts`) has no event id: dedup on
//!   (`messageId`, `status`); event time `scts` (`YYMMDDHHMM`, UTC).
//! - **Messages API** signed webhooks: `Authorization: Bearer <JWT>`, HS256 with the signature
//!   secret, `iss = "Vonage"`, `iat` within the tolerance, and `payload_hash` = SHA-256 of the raw
//!   body. A status (`status`, `message_uuid`, `timestamp`): dedup on (`message_uuid`, `status`).

use chrono::{DateTime, NaiveDateTime, TimeZone, Utc};
use hmac::{Hmac, Mac};
use md5::Md5;
use serde_json::Value;
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};

use super::params::{as_object, first_values, request_params};
use super::{SchemeConfigError, jwt};
use crate::ingest::{
    RawRequest, ReceiptEvent, Source, VerifyError, constant_time_eq, iso_time, str_at, within,
};

/// The SMS API's `signature_method`, as chosen in the Vonage dashboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureMethod {
    /// MD5 over the string followed by the secret (not an HMAC).
    Md5Hash,
    Md5,
    Sha1,
    Sha256,
    Sha512,
}

impl SignatureMethod {
    pub const NAMES: &'static str = "md5hash, md5, sha1, sha256 or sha512";

    pub fn parse(s: &str) -> Result<Self, SchemeConfigError> {
        Ok(match s {
            "md5hash" => Self::Md5Hash,
            "md5" => Self::Md5,
            "sha1" => Self::Sha1,
            "sha256" => Self::Sha256,
            "sha512" => Self::Sha512,
            other => return Err(SchemeConfigError::SignatureMethod(other.to_owned())),
        })
    }

    /// The lowercase hex digest of `data` under `secret`.
    pub fn digest(self, secret: &str, data: &str) -> String {
        fn mac<M: Mac + hmac::digest::KeyInit>(secret: &str, data: &str) -> String {
            let mut m = <M as hmac::digest::KeyInit>::new_from_slice(secret.as_bytes())
                .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
            m.update(data.as_bytes());
            hex::encode(m.finalize().into_bytes())
        }
        match self {
            Self::Md5Hash => {
                let mut h = Md5::new();
                h.update(data.as_bytes());
                h.update(secret.as_bytes());
                hex::encode(h.finalize())
            }
            Self::Md5 => mac::<Hmac<Md5>>(secret, data),
            Self::Sha1 => mac::<Hmac<Sha1>>(secret, data),
            Self::Sha256 => mac::<Hmac<Sha256>>(secret, data),
            Self::Sha512 => mac::<Hmac<Sha512>>(secret, data),
        }
    }
}

/// The string the SMS API signs: `&name=value` for each parameter but `sig`, names sorted,
/// `&` and `=` in values replaced by `_`.
pub fn sms_signed_string<'a>(params: impl IntoIterator<Item = (&'a String, &'a String)>) -> String {
    let mut pairs: Vec<(&String, &String)> = params
        .into_iter()
        .filter(|(k, _)| k.as_str() != "sig")
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("&{k}={}", v.replace(['&', '='], "_")))
        .collect()
}

pub struct Vonage {
    secrets: Vec<String>,
    method: Option<SignatureMethod>,
    tolerance: u64,
}

impl Vonage {
    pub fn new(secrets: Vec<String>, method: Option<SignatureMethod>, tolerance: u64) -> Self {
        Self {
            secrets,
            method,
            tolerance,
        }
    }

    fn verify_sms(
        &self,
        r: &RawRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        let pairs = request_params(r).ok_or(VerifyError::Missing("sig"))?;
        let params = first_values(&pairs);
        let given = params.get("sig").ok_or(VerifyError::Missing("sig"))?;
        // Without a configured method there is nothing to check against: refused, not guessed.
        let method = self.method.ok_or(VerifyError::NotAccepted(
            "an SMS API signature, and this source has no signature_method configured",
        ))?;
        let signed = sms_signed_string(&params);
        let given = given.trim().to_ascii_lowercase();
        let ok = self
            .secrets
            .iter()
            .any(|s| constant_time_eq(method.digest(s, &signed).as_bytes(), given.as_bytes()));
        if !ok {
            return Err(VerifyError::Mismatch);
        }
        let t: i64 = params
            .get("timestamp")
            .ok_or(VerifyError::Missing("timestamp"))?
            .trim()
            .parse()
            .map_err(|_| VerifyError::NotAccepted("the signed timestamp is not whole seconds"))?;
        if !within(t, now, self.tolerance, true) {
            return Err(VerifyError::Stale(self.tolerance));
        }
        let (Some(id), Some(status)) = (
            crate::ingest::nonblank(params.get("messageId")),
            params.get("status"),
        ) else {
            return Err(VerifyError::Unparsable(
                "not a delivery receipt (no messageId and status)".into(),
            ));
        };
        let mut stored = params.clone();
        // The signature is not part of the event (nor anything to keep around).
        stored.remove("sig");
        Ok(vec![ReceiptEvent {
            provider_event_id: format!("{id}:{status}"),
            event_type: sms_vocabulary(status).into(),
            provider_type: status.clone(),
            event_time: params.get("scts").and_then(|s| scts_time(s)),
            // The send's `client-ref`, echoed: Herald's event id when the application put it
            // there, which matches a message whose send left no provider id (a timeout, a 409).
            herald_event_id: crate::ingest::nonblank(params.get("client-ref")).cloned(),
            provider_message_id: Some(id.clone()),
            raw: as_object(&stored),
            replay_key: None,
        }])
    }

    fn verify_messages(
        &self,
        token: &str,
        r: &RawRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        let claims = jwt::verify_hmac(token, &self.secrets, &[jsonwebtoken::Algorithm::HS256])?;
        if jwt::claim_str(&claims, "iss") != Some("Vonage") {
            return Err(VerifyError::NotAccepted("the token's iss is not Vonage"));
        }
        let iat = jwt::claim_secs(&claims, "iat").ok_or(VerifyError::Missing("iat"))?;
        if !within(iat, now, self.tolerance, true) {
            return Err(VerifyError::Stale(self.tolerance));
        }
        let hash =
            jwt::claim_str(&claims, "payload_hash").ok_or(VerifyError::Missing("payload_hash"))?;
        if !jwt::sha256_claim_matches(hash, r.body) {
            return Err(VerifyError::Mismatch);
        }
        let body: Value =
            serde_json::from_slice(r.body).map_err(|e| VerifyError::Unparsable(e.to_string()))?;
        let (Some(id), Some(status)) = (
            crate::ingest::nonblank(str_at(&body, "/message_uuid")),
            str_at(&body, "/status"),
        ) else {
            return Err(VerifyError::Unparsable(
                "not a message status (no message_uuid and status)".into(),
            ));
        };
        Ok(vec![ReceiptEvent {
            provider_event_id: format!("{id}:{status}"),
            event_type: messages_vocabulary(&status).into(),
            event_time: body.get("timestamp").and_then(iso_time),
            provider_type: status,
            herald_event_id: crate::ingest::nonblank(str_at(&body, "/client_ref")),
            provider_message_id: Some(id),
            raw: body,
            replay_key: None,
        }])
    }
}

/// `scts` (`YYMMDDHHMM`, the carrier's time, UTC) → time.
pub fn scts_time(s: &str) -> Option<DateTime<Utc>> {
    if s.len() != 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    NaiveDateTime::parse_from_str(&format!("20{s}00"), "%Y%m%d%H%M%S")
        .ok()
        .map(|t| Utc.from_utc_datetime(&t))
}

/// SMS API delivery receipt statuses.
fn sms_vocabulary(status: &str) -> &'static str {
    match status {
        "accepted" => "sent",
        "buffered" => "deferred",
        "delivered" => "delivered",
        "expired" | "failed" => "failed",
        "rejected" => "dropped",
        _ => "other",
    }
}

/// Messages API statuses.
fn messages_vocabulary(status: &str) -> &'static str {
    match status {
        "submitted" => "sent",
        "delivered" => "delivered",
        "rejected" => "dropped",
        "undeliverable" => "failed",
        "read" => "read",
        _ => "other",
    }
}

impl Source for Vonage {
    fn scheme(&self) -> &'static str {
        "vonage"
    }

    fn verify(
        &self,
        r: &RawRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        match r.header("authorization") {
            Some(auth) => {
                // The scheme's case is ignored (RFC 9110 §11.1).
                let token = crate::auth::Tokens::bearer(auth)
                    .ok_or(VerifyError::Missing("Authorization: Bearer"))?;
                self.verify_messages(token, r, now)
            }
            None => self.verify_sms(r, now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// vonage-node-sdk `packages/sms/__tests__/__dataSets__/signature.ts` and vonage-ruby-sdk
    /// `test/vonage/signature_test.rb`: the same parameters and signatures in both.
    fn published_params() -> BTreeMap<String, String> {
        [
            ("message-timestamp", "2013-11-21 15:27:30"),
            ("messageId", "020000001B0FE827"),
            ("msisdn", "14843472194"),
            ("text", "Test again"),
            ("timestamp", "1385047698"),
            ("to", "13239877404"),
            ("type", "text"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    const SECRET: &str = "my_secret_key_for_testing";

    #[test]
    fn published_digests_for_every_method() {
        let s = sms_signed_string(&published_params());
        for (method, sig) in [
            ("md5hash", "d2e7b1dc968737c5998ad624e02f90b7"),
            ("md5", "DDEBD46008C2D4E93CCE578A332A52D5"),
            ("sha1", "27D0D05C2876C7CB1720DBCDBA4D492E1E55C09A"),
            (
                "sha256",
                "DDB8397C2B90AAC7F3882D306475C9A5058C92322EEF43C92B298B6E0FC0D330",
            ),
            (
                "sha512",
                "E0D3C650F8C9D1A5C174D10DDDBFB003E561F59B265616208B0487C5D819481CD3C311D59CF6165ECD1139622D5BA3A256C0D763AC4A9AD9144B5A426B94FE82",
            ),
        ] {
            let m = SignatureMethod::parse(method).unwrap();
            assert_eq!(m.digest(SECRET, &s), sig.to_ascii_lowercase(), "{method}");
        }
        assert!(SignatureMethod::parse("xxxx").is_err());
    }

    /// vonage-ruby-sdk `test_check_instance_method_replaces_disallowed_characters_with_underscores`
    /// (the config's default method md5hash, the test class's secret): `_`, `&` and `=` sign
    /// alike.
    #[test]
    fn published_replacement_of_ampersand_and_equals() {
        for v in ["_", "&", "="] {
            let p = BTreeMap::from([("k".to_owned(), v.to_owned())]);
            assert_eq!(
                SignatureMethod::Md5Hash.digest(SECRET, &sms_signed_string(&p)),
                "c3d6a686ab9c7e7408bb1c0506e9629a"
            );
        }
    }

    #[test]
    fn the_method_is_configured_never_guessed() {
        let params = published_params();
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params.iter())
            .append_pair("sig", "d2e7b1dc968737c5998ad624e02f90b7")
            .finish();
        let r = RawRequest {
            headers: &[],
            body: body.as_bytes(),
            query: None,
            method: "POST",
        };
        let now = Utc.timestamp_opt(1385047698, 0).unwrap();
        let verdict =
            |m: Option<SignatureMethod>| Vonage::new(vec![SECRET.into()], m, 300).verify(&r, now);
        // Verified; an inbound message, not a receipt.
        assert!(matches!(
            verdict(Some(SignatureMethod::Md5Hash)),
            Err(VerifyError::Unparsable(_))
        ));
        assert_eq!(
            verdict(Some(SignatureMethod::Md5)),
            Err(VerifyError::Mismatch)
        );
        assert!(matches!(
            verdict(None),
            Err(VerifyError::NotAccepted(e)) if e.contains("no signature_method")
        ));
        let late = now + chrono::Duration::seconds(301);
        assert_eq!(
            Vonage::new(vec![SECRET.into()], Some(SignatureMethod::Md5Hash), 300).verify(&r, late),
            Err(VerifyError::Stale(300))
        );
    }

    /// The Vonage docs' "Sample Signed JWT" (messages/concepts/signed-webhooks) as a token:
    /// vonage-ruby-sdk `test/vonage/test.rb` `sample_webhook_token`, valid under
    /// `sample_valid_signature_secret`, invalid under `sample_invalid_signature_secret`
    /// (`jwt_test.rb`, `messaging_test.rb`). Its body is not published, so only the signature and
    /// the claims are checked here.
    #[test]
    fn the_docs_sample_jwt_verifies_under_the_published_secret() {
        const TOKEN: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJpYXQiOjE1ODc0OTQ5NjIsImp0aSI6ImM1YmE4ZjI0LTFhMTQtNGMxMC1iZmRmLTNmYmU4Y2U1MTFiNSIsImlzcyI6IlZvbmFnZSIsInBheWxvYWRfaGFzaCI6ImQ2YzBlNzRiNTg1N2RmMjBlM2I3ZTUxYjMwYzBjMmE0MGVjNzNhNzc4NzliNmYwNzRkZGM3YTIzMTdkZDAzMWIiLCJhcGlfa2V5IjoiYTFiMmMzZCIsImFwcGxpY2F0aW9uX2lkIjoiYWFhYWFhYWEtYmJiYi1jY2NjLWRkZGQtMDEyMzQ1Njc4OWFiIn0.JQRKi1d0SQitmjPINfTWMpt3XZkGsLbD7EjCdXoNSbk";
        let hs256 = [jsonwebtoken::Algorithm::HS256];
        let claims = jwt::verify_hmac(
            TOKEN,
            &["ZYtdTtGV3BCFN7tWmOWr1md66XsquMggr4W2cTtXtcPgfnI0Xw".into()],
            &hs256,
        )
        .unwrap();
        assert_eq!(
            (
                jwt::claim_str(&claims, "iss"),
                jwt::claim_secs(&claims, "iat"),
                jwt::claim_str(&claims, "payload_hash"),
            ),
            (
                Some("Vonage"),
                Some(1587494962),
                Some("d6c0e74b5857df20e3b7e51b30c0c2a40ec73a77879b6f074ddc7a2317dd031b")
            )
        );
        assert_eq!(
            jwt::verify_hmac(
                TOKEN,
                &["ZYtdTtGV3BCFN7tWmOWr1md66XsquMggr4W2cTtXtcPgf55555".into()],
                &hs256
            ),
            Err(VerifyError::Mismatch)
        );
        // Through the source, with a body that is not the (unpublished) one it covers.
        let h = vec![("authorization".to_owned(), format!("Bearer {TOKEN}"))];
        let v = Vonage::new(
            vec!["ZYtdTtGV3BCFN7tWmOWr1md66XsquMggr4W2cTtXtcPgfnI0Xw".into()],
            None,
            300,
        );
        let r = RawRequest {
            headers: &h,
            body: b"{}",
            query: None,
            method: "POST",
        };
        let at = Utc.timestamp_opt(1587494962, 0).unwrap();
        assert_eq!(v.verify(&r, at), Err(VerifyError::Mismatch));
        // The scheme in any case is the bearer scheme: its token is checked the same way.
        let upper = vec![("authorization".to_owned(), format!("BEARER {TOKEN}"))];
        let r = RawRequest {
            headers: &upper,
            ..r
        };
        assert_eq!(v.verify(&r, at), Err(VerifyError::Mismatch));
    }

    #[test]
    fn receipts_normalize() {
        let mut p: BTreeMap<String, String> = [
            ("messageId", "0A0000000123ABCD1"),
            ("msisdn", "447700900000"),
            ("status", "delivered"),
            ("scts", "2001011400"),
            ("timestamp", "1577887200"),
            ("err-code", "0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let sig = SignatureMethod::Sha256.digest("s3cret", &sms_signed_string(&p));
        p.insert("sig".into(), sig.to_uppercase());
        let query = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(p.iter())
            .finish();
        let r = RawRequest {
            headers: &[],
            body: b"",
            query: Some(&query),
            method: "GET",
        };
        let v = Vonage::new(
            vec!["old".into(), "s3cret".into()],
            Some(SignatureMethod::Sha256),
            300,
        );
        let e = v
            .verify(&r, Utc.timestamp_opt(1577887200, 0).unwrap())
            .unwrap();
        assert_eq!(
            (
                e[0].provider_event_id.as_str(),
                e[0].event_type.as_str(),
                e[0].event_time.unwrap().timestamp(),
                e[0].provider_message_id.as_deref()
            ),
            (
                "0A0000000123ABCD1:delivered",
                "delivered",
                1577887200,
                Some("0A0000000123ABCD1")
            )
        );
        assert_eq!(scts_time("2001011400").unwrap().timestamp(), 1577887200);
        for bad in ["", "20010114", "20010114000", "2013011400", "20a1011400"] {
            assert_eq!(scts_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_status_maps_into_the_vocabulary() {
        let sms: Vec<_> = [
            "accepted",
            "buffered",
            "delivered",
            "expired",
            "failed",
            "rejected",
            "unknown",
        ]
        .iter()
        .map(|s| sms_vocabulary(s))
        .collect();
        assert_eq!(
            sms,
            [
                "sent",
                "deferred",
                "delivered",
                "failed",
                "failed",
                "dropped",
                "other"
            ]
        );
        let messages: Vec<_> = [
            "submitted",
            "delivered",
            "rejected",
            "undeliverable",
            "read",
            "x",
        ]
        .iter()
        .map(|s| messages_vocabulary(s))
        .collect();
        assert_eq!(
            messages,
            ["sent", "delivered", "dropped", "failed", "read", "other"]
        );
    }
}
