//! Amazon SES via SNS: the SNS envelope is signed with RSA PKCS#1 v1.5 — SHA1 for
//! `SignatureVersion` 1, SHA256 for 2 — over `key\nvalue\n` of its fields in a fixed order, with
//! the certificate at `SigningCertURL`. That URL must be `https://sns.<region>.amazonaws.com[.cn]/…
//! .pem`; certificates are fetched over HTTPS once and cached (or pinned in configuration).
//! `TopicArn` must be one of `topic_arns` when that list is set. The envelope's signed `Timestamp`
//! must be within ±`tolerance_seconds` (default 300) of now. A `SubscriptionConfirmation` is
//! confirmed by an explicit, logged GET of its `SubscribeURL` (same host policy) unless
//! `confirm_subscriptions = false`. Dedup on the SNS `MessageId` (kept across SNS retries).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use chrono::{DateTime, Utc};
use rsa::RsaPublicKey;
use rsa::pkcs1v15::{Signature, VerifyingKey};
use rsa::pkcs8::DecodePublicKey;
use rsa::signature::Verifier;
use serde_json::Value;
use x509_cert::der::{DecodePem, Encode};

use crate::ingest::{RawRequest, ReceiptEvent, Source, VerifyError, iso_time, str_at, within};

/// Why an HTTPS GET to SNS (a signing certificate, a subscription confirmation) gave nothing.
/// Neither the text nor a cause names the URL: a SubscribeURL carries a token.
#[derive(Debug, thiserror::Error)]
pub enum CertFetchError {
    #[error("no pinned certificate for that URL")]
    NotPinned,
    /// The blocking runtime for the request could not start.
    #[error(transparent)]
    Runtime(std::io::Error),
    /// The HTTP client could not be built.
    #[error(transparent)]
    Client(reqwest::Error),
    /// The cause has its URL removed.
    #[error("request failed")]
    Request(#[source] reqwest::Error),
    #[error("HTTP {0}")]
    Status(reqwest::StatusCode),
    /// The cause has its URL removed.
    #[error("body failed")]
    Body(#[source] reqwest::Error),
    #[error("response over 64 KiB")]
    TooLarge,
    /// SNS answered the certificate URL 400, 403, 404 or 410, now or lately: there is no such
    /// certificate, so the signature cannot verify.
    #[error("no certificate at that URL")]
    NoSuchCertificate,
    /// [`CERT_FETCHES_AT_ONCE`] fetches were running already.
    #[error("certificate fetches throttled")]
    Throttled,
}

/// Where signing certificates come from: fetched and cached, or given (tests, pinning, offline).
pub trait CertStore: Send + Sync {
    /// The PEM certificate at `url` (already checked against the URL policy).
    fn get(&self, url: &str) -> Result<Vec<u8>, CertFetchError>;
}

/// Certificates given up front, keyed by URL.
#[derive(Debug, Default, Clone)]
pub struct StaticCertStore(pub HashMap<String, Vec<u8>>);

impl CertStore for StaticCertStore {
    fn get(&self, url: &str) -> Result<Vec<u8>, CertFetchError> {
        self.0.get(url).cloned().ok_or(CertFetchError::NotPinned)
    }
}

/// Fetches over HTTPS (TLS-verified by the system's web PKI) and caches by URL. Called from a
/// blocking thread, never from the async executor.
///
/// Anyone who knows a configured topic ARN can send a well-formed envelope naming a certificate
/// URL of the right shape that does not exist (any hex after `SimpleNotificationService-`), so
/// what fetching costs is bounded:
/// - a URL SNS answered 400, 403, 404 or 410 (no such certificate: S3 answers 403 for a
///   missing object) is remembered for [`CERT_REFUSED_FOR`] and answered at once, as a signature
///   that does not verify (401), never fetched again meanwhile; any other answer (a 429, a 5xx)
///   is an outage, not a verdict, and is tried again at the next request;
/// - at most [`CERT_FETCHES_AT_ONCE`] fetches run at a time: beyond them a request is asked to
///   retry (503, as SNS does), so invented URLs tie up that many signature-checking threads at
///   most, never all of them. A fetch of a missing certificate takes a round trip to SNS (about
///   0.1 s), so keeping the slots busy — and a genuine new certificate waiting — takes a steady
///   flood of forged requests, not one a second. Pinning the certificates
///   (`certificates` in the source's configuration) takes fetching out of the picture.
pub struct HttpsCertStore {
    pinned: StaticCertStore,
    cache: Mutex<HashMap<String, Vec<u8>>>,
    refused: Mutex<HashMap<String, std::time::Instant>>,
    fetching: std::sync::atomic::AtomicUsize,
    fetch: Box<CertFetch>,
}

/// How [`HttpsCertStore`] gets a certificate it has not cached: [`https_get`].
type CertFetch = dyn Fn(&str) -> Result<Vec<u8>, CertFetchError> + Send + Sync;

/// How long a certificate URL SNS answered with a client error is refused without a fetch.
pub const CERT_REFUSED_FOR: Duration = Duration::from_secs(600);
/// Fetches of uncached certificate URLs running at once, at most.
pub const CERT_FETCHES_AT_ONCE: usize = 2;
/// Refused URLs remembered at most (the oldest forgotten first beyond that).
const CERT_REFUSED_MAX: usize = 1024;

impl HttpsCertStore {
    pub fn new(pinned: StaticCertStore) -> Self {
        Self::with_fetch(pinned, https_get)
    }

    /// With `fetch` in place of the HTTPS GET (its caching and bounds tested without a network).
    pub fn with_fetch(
        pinned: StaticCertStore,
        fetch: impl Fn(&str) -> Result<Vec<u8>, CertFetchError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            pinned,
            cache: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
            fetching: std::sync::atomic::AtomicUsize::new(0),
            fetch: Box::new(fetch),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One blocking HTTPS GET (certificates, subscription confirmations): rare, cached, bounded.
fn https_get(url: &str) -> Result<Vec<u8>, CertFetchError> {
    crate::crypto::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CertFetchError::Runtime)?;
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(CertFetchError::Client)?;
        // Errors are reduced to their kind, their causes stripped of the URL: a SubscribeURL
        // carries a token.
        let mut resp = client
            .get(url)
            .send()
            .await
            .map_err(|e| CertFetchError::Request(e.without_url()))?;
        if !resp.status().is_success() {
            return Err(CertFetchError::Status(resp.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| CertFetchError::Body(e.without_url()))?
        {
            body.extend_from_slice(&chunk);
            if body.len() > 64 * 1024 {
                return Err(CertFetchError::TooLarge);
            }
        }
        Ok(body)
    })
}

impl CertStore for HttpsCertStore {
    fn get(&self, url: &str) -> Result<Vec<u8>, CertFetchError> {
        self.get_at(url, std::time::Instant::now())
    }
}

impl HttpsCertStore {
    /// [`CertStore::get`] at `now`.
    fn get_at(&self, url: &str, now: std::time::Instant) -> Result<Vec<u8>, CertFetchError> {
        if let Ok(pem) = self.pinned.get(url) {
            return Ok(pem);
        }
        if let Some(pem) = lock(&self.cache).get(url) {
            return Ok(pem.clone());
        }
        {
            let mut refused = lock(&self.refused);
            refused.retain(|_, at| now.duration_since(*at) < CERT_REFUSED_FOR);
            if refused.contains_key(url) {
                return Err(CertFetchError::NoSuchCertificate);
            }
        }
        use std::sync::atomic::Ordering;
        if self
            .fetching
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < CERT_FETCHES_AT_ONCE).then_some(n + 1)
            })
            .is_err()
        {
            return Err(CertFetchError::Throttled);
        }
        // The slot is given back however the fetch ends, a panic included.
        struct Slot<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Slot<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            }
        }
        let slot = Slot(&self.fetching);
        let fetched = (self.fetch)(url);
        drop(slot);
        match fetched {
            Ok(pem) => {
                tracing::info!(host = %crate::telemetry::mask_url(url), "SNS signing certificate fetched and cached");
                lock(&self.cache).insert(url.to_owned(), pem.clone());
                Ok(pem)
            }
            Err(CertFetchError::Status(s)) if matches!(s.as_u16(), 400 | 403 | 404 | 410) => {
                let mut refused = lock(&self.refused);
                if refused.len() >= CERT_REFUSED_MAX
                    && let Some(oldest) = refused
                        .iter()
                        .min_by_key(|(_, at)| **at)
                        .map(|(u, _)| u.clone())
                {
                    refused.remove(&oldest);
                }
                refused.insert(url.to_owned(), now);
                Err(CertFetchError::NoSuchCertificate)
            }
            Err(e) => Err(e),
        }
    }
}

/// The region of an SNS topic ARN: `arn:aws:sns:us-east-1:123456789012:name` → `us-east-1`.
pub fn topic_region(arn: &str) -> Option<&str> {
    let mut parts = arn.split(':');
    let (tag, partition, service, region) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let ok = tag == "arn"
        && partition.starts_with("aws")
        && service == "sns"
        && region.len() >= 3
        && region.contains('-')
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    ok.then_some(region)
}

/// Whether `raw` is an SNS URL of the topic's own region: `https://sns.<region>.amazonaws.com/…`
/// (`.com.cn` for `cn-` regions), default port; for certificates the path must be
/// `/SimpleNotificationService-<hex>.pem` without a query. A bucket or host merely *named* like
/// SNS does not pass.
pub fn sns_url_allowed(raw: &str, certificate: bool, region: &str) -> bool {
    let Ok(u) = url::Url::parse(raw) else {
        return false;
    };
    let domain = if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    };
    let host_ok = u.host_str() == Some(format!("sns.{region}.{domain}").as_str());
    let cert_ok = !certificate
        || (u.query().is_none()
            && u.path()
                .strip_prefix("/SimpleNotificationService-")
                .and_then(|p| p.strip_suffix(".pem"))
                .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit())));
    u.scheme() == "https" && host_ok && u.port().is_none() && cert_ok
}

/// The canonical string SNS signs.
pub fn canonical(envelope: &Value) -> Option<String> {
    let kind = envelope.get("Type")?.as_str()?;
    let keys: &[&str] = match kind {
        "Notification" => &[
            "Message",
            "MessageId",
            "Subject",
            "Timestamp",
            "TopicArn",
            "Type",
        ],
        "SubscriptionConfirmation" | "UnsubscribeConfirmation" => &[
            "Message",
            "MessageId",
            "SubscribeURL",
            "Timestamp",
            "Token",
            "TopicArn",
            "Type",
        ],
        _ => return None,
    };
    let mut out = String::new();
    for k in keys {
        match envelope.get(*k) {
            Some(Value::String(v)) => {
                out.push_str(k);
                out.push('\n');
                out.push_str(v);
                out.push('\n');
            }
            // Subject is optional on notifications; every other field is required.
            None | Some(Value::Null) if *k == "Subject" => {}
            _ => return None,
        }
    }
    Some(out)
}

pub struct Ses {
    topic_arns: Vec<String>,
    certs: Arc<dyn CertStore>,
    confirm: bool,
    tolerance: u64,
}

impl Ses {
    pub fn new(
        topic_arns: Vec<String>,
        certs: Arc<dyn CertStore>,
        confirm: bool,
        tolerance: u64,
    ) -> Self {
        Self {
            topic_arns,
            certs,
            confirm,
            tolerance,
        }
    }

    fn verify_signature(&self, env: &Value, region: &str) -> Result<(), VerifyError> {
        let text = canonical(env).ok_or(VerifyError::Missing("SNS envelope fields"))?;
        let cert_url =
            str_at(env, "/SigningCertURL").ok_or(VerifyError::Missing("SigningCertURL"))?;
        if !sns_url_allowed(&cert_url, true, region) {
            return Err(VerifyError::NotAccepted(
                "SigningCertURL is not an SNS certificate URL of the topic's region",
            ));
        }
        let sig = str_at(env, "/Signature").ok_or(VerifyError::Missing("Signature"))?;
        let sig = base64::engine::general_purpose::STANDARD
            .decode(sig)
            .map_err(|_| VerifyError::Mismatch)?;
        let sig = Signature::try_from(sig.as_slice()).map_err(|_| VerifyError::Mismatch)?;
        let pem = self.certs.get(&cert_url).map_err(|e| match e {
            // No such certificate (SNS's 4xx): a forged envelope, not an outage; not logged
            // (per request and unauthenticated).
            CertFetchError::NoSuchCertificate => VerifyError::Mismatch,
            CertFetchError::Throttled => {
                tracing::debug!("SNS signing certificate fetch throttled; asked to retry");
                VerifyError::Unavailable("SNS signing certificate")
            }
            e => {
                tracing::warn!(error = %e, "SNS signing certificate unavailable");
                VerifyError::Unavailable("SNS signing certificate")
            }
        })?;
        let cert = x509_cert::Certificate::from_pem(&pem).map_err(|_| VerifyError::Mismatch)?;
        let spki = cert
            .tbs_certificate
            .subject_public_key_info
            .to_der()
            .map_err(|_| VerifyError::Mismatch)?;
        let key = RsaPublicKey::from_public_key_der(&spki).map_err(|_| VerifyError::Mismatch)?;
        let ok = match str_at(env, "/SignatureVersion").as_deref() {
            Some("1") => VerifyingKey::<sha1::Sha1>::new(key)
                .verify(text.as_bytes(), &sig)
                .is_ok(),
            Some("2") => VerifyingKey::<sha2::Sha256>::new(key)
                .verify(text.as_bytes(), &sig)
                .is_ok(),
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(VerifyError::Mismatch)
        }
    }
}

/// What an SES `Bounce` says of its recipients, for a `Transient` one of subtype `General`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Recipients {
    /// A recipient's DSN says delivery failed (`action` `failed`, or a 4.x.x / 5.x.x `status`).
    Failed,
    /// No recipient carries a failure: what an automatic reply is filed as.
    NoFailure,
}

/// SES's event in Herald's vocabulary. SES retries a soft bounce itself (its `DeliveryDelay`
/// events say so) and publishes a `Bounce` only once it stopped trying: every bounce is
/// `bounced`, whatever its type, but for a `Transient` bounce of subtype `General` (SES's
/// catch-all, and what an out-of-office or other automatic reply to a delivered message is
/// filed as) whose recipients carry no failed DSN: that one says nothing certain about
/// delivery and is kept in the history (`other`). (`Transient` and `Undetermined` bounces were
/// `deferred`, which nothing after them ever settled.)
fn vocabulary(
    event: &str,
    bounce_type: Option<&str>,
    bounce_sub_type: Option<&str>,
    recipients: Recipients,
) -> &'static str {
    match (event, bounce_type) {
        ("Send", _) => "sent",
        ("Delivery", _) => "delivered",
        ("DeliveryDelay", _) => "deferred",
        ("Bounce", Some("Transient"))
            if bounce_sub_type.is_none_or(|s| s == "General")
                && recipients == Recipients::NoFailure =>
        {
            "other"
        }
        ("Bounce", _) => "bounced",
        ("Reject", _) => "dropped",
        ("Rendering Failure", _) => "failed",
        ("Open", _) => "opened",
        ("Click", _) => "clicked",
        ("Complaint", _) => "complained",
        ("Subscription", _) => "unsubscribed",
        _ => "other",
    }
}

/// The object holding an SES event's own time: `Bounce` → `bounce`, `Rendering Failure` →
/// `failure`, `DeliveryDelay` → `deliveryDelay`.
fn detail_key(event: &str) -> String {
    match event {
        "Rendering Failure" => "failure".into(),
        other => {
            let mut c = other.chars();
            c.next()
                .map(|f| f.to_ascii_lowercase().to_string() + c.as_str())
                .unwrap_or_default()
        }
    }
}

fn normalize(message_id: String, ses: Value) -> ReceiptEvent {
    let event = str_at(&ses, "/eventType")
        .or_else(|| str_at(&ses, "/notificationType"))
        .unwrap_or_else(|| "unknown".into());
    let detail = ses.get(detail_key(&event));
    let event_time = detail
        .and_then(|d| d.get("timestamp"))
        .and_then(iso_time)
        .or_else(|| {
            // Events of the send itself carry no time of their own (`reject` holds only a
            // reason): they happened when SES took the message. Without it a `Reject` sorted
            // before the `Send` of the same message and never became its status.
            if matches!(event.as_str(), "Send" | "Reject" | "Rendering Failure") {
                ses.pointer("/mail/timestamp").and_then(iso_time)
            } else {
                None
            }
        });
    let bounce_type = str_at(&ses, "/bounce/bounceType");
    let bounce_sub_type = str_at(&ses, "/bounce/bounceSubType");
    let failed = ses
        .pointer("/bounce/bouncedRecipients")
        .and_then(Value::as_array)
        .is_some_and(|all| {
            all.iter().any(|r| {
                str_at(r, "/action").is_some_and(|a| a.eq_ignore_ascii_case("failed"))
                    || str_at(r, "/status")
                        .is_some_and(|s| s.starts_with("4.") || s.starts_with("5."))
            })
        });
    let recipients = if failed {
        Recipients::Failed
    } else {
        Recipients::NoFailure
    };
    // SES tag values allow few characters: Herald writes its event id encoded
    // (`domain::ses_tag`), and a value in that encoding is decoded back here.
    let tags = ses
        .pointer("/mail/tags/herald_event_id")
        .and_then(|v| match v {
            Value::Array(a) => a.first().and_then(|x| x.as_str()),
            Value::String(s) => Some(s.as_str()),
            _ => None,
        })
        .map(crate::domain::ses_tag::decode);
    let header = ses
        .pointer("/mail/headers")
        .and_then(|h| h.as_array())
        .and_then(|items| {
            items.iter().find_map(|x| {
                (x.get("name")?
                    .as_str()?
                    .eq_ignore_ascii_case("x-herald-event-id"))
                .then(|| x.get("value")?.as_str().map(str::to_owned))
                .flatten()
            })
        });
    ReceiptEvent {
        provider_event_id: message_id,
        event_type: vocabulary(
            &event,
            bounce_type.as_deref(),
            bounce_sub_type.as_deref(),
            recipients,
        )
        .into(),
        provider_type: event,
        event_time,
        herald_event_id: tags.or(header),
        provider_message_id: str_at(&ses, "/mail/messageId"),
        raw: ses,
        replay_key: None,
    }
}

impl Source for Ses {
    fn scheme(&self) -> &'static str {
        "ses"
    }

    fn id_field(&self) -> &str {
        "MessageId"
    }

    fn verify(
        &self,
        r: &RawRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        // The signature lives inside the JSON envelope: without one there is nothing to verify.
        let env: Value =
            serde_json::from_slice(r.body).map_err(|_| VerifyError::Missing("SNS envelope"))?;
        // The topic first: an SNS signature only proves SNS sent it, not that it is our topic;
        // nothing is fetched or confirmed for a stranger's topic.
        let topic = str_at(&env, "/TopicArn").unwrap_or_default();
        if !self.topic_arns.is_empty() && !self.topic_arns.contains(&topic) {
            return Err(VerifyError::NotAccepted(
                "TopicArn is not one of the source's topic_arns",
            ));
        }
        let region = topic_region(&topic).ok_or(VerifyError::NotAccepted(
            "TopicArn is not an SNS topic ARN with a region",
        ))?;
        // The window before the signature: a stale envelope never costs a certificate fetch.
        // `Timestamp` is one of the signed fields, so the signature check below covers it.
        let t = env
            .get("Timestamp")
            .and_then(iso_time)
            .ok_or(VerifyError::Mismatch)?;
        if !within(t.timestamp(), now, self.tolerance, true) {
            return Err(VerifyError::Stale(self.tolerance));
        }
        self.verify_signature(&env, region)?;
        match str_at(&env, "/Type").as_deref() {
            Some("SubscriptionConfirmation") => {
                let url = str_at(&env, "/SubscribeURL").unwrap_or_default();
                if !self.confirm {
                    tracing::warn!(topic = %topic, "SNS subscription confirmation received; confirm_subscriptions is off, not confirmed");
                } else if !sns_url_allowed(&url, false, region) {
                    tracing::warn!(topic = %topic, "SNS SubscribeURL outside the SNS host policy; not confirmed");
                } else {
                    match https_get(&url) {
                        Ok(_) => tracing::info!(topic = %topic, "SNS subscription confirmed"),
                        Err(e) => {
                            tracing::warn!(topic = %topic, error = %e, "SNS subscription confirmation failed; SNS will retry");
                            return Err(VerifyError::Unavailable("SNS subscription confirmation"));
                        }
                    }
                }
                Ok(Vec::new())
            }
            Some("UnsubscribeConfirmation") => {
                tracing::warn!(topic = %topic, "SNS unsubscribe confirmation received");
                Ok(Vec::new())
            }
            _ => {
                // Verified already: an envelope without its MessageId is malformed (400), not
                // unauthenticated.
                let id = str_at(&env, "/MessageId")
                    .ok_or_else(|| VerifyError::Unparsable("no MessageId".into()))?;
                let message = str_at(&env, "/Message").unwrap_or_default();
                // SES's own word when a topic is set up — as an event destination (plain text)
                // or for an identity's notifications (`AmazonSnsSubscriptionSucceeded`): no
                // receipt, taken (a 400 had SNS retry it and logged a refusal).
                if message.starts_with("Successfully validated SNS topic") {
                    tracing::info!(topic = %topic, "SES validated the topic as an event destination");
                    return Ok(Vec::new());
                }
                let ses: Value = serde_json::from_str(&message)
                    .ok()
                    .filter(Value::is_object)
                    .ok_or_else(|| VerifyError::Unparsable("Message is not an SES event".into()))?;
                if str_at(&ses, "/notificationType").as_deref()
                    == Some("AmazonSnsSubscriptionSucceeded")
                {
                    tracing::info!(topic = %topic, "SES subscribed the topic to an identity's notifications");
                    return Ok(Vec::new());
                }
                Ok(vec![normalize(id, ses)])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// aws-sdk-java-v2's `validateMessageTest` (fixtures/providers/ses/sdk-valid-sns-v1): a
    /// genuine SignatureVersion 1 envelope, published 2015-09-20T01:22:14.001Z.
    fn published_at(at: i64, tolerance: Option<u64>) -> Result<Vec<ReceiptEvent>, VerifyError> {
        use chrono::TimeZone;
        let dir = crate::ingest::schemes::fixture_path("ses/sdk-valid-sns-v1");
        let case: Value =
            serde_json::from_slice(&std::fs::read(dir.join("case.json")).unwrap()).unwrap();
        let body = std::fs::read(dir.join("body")).unwrap();
        let config = crate::ingest::schemes::SourceConfig {
            scheme: "ses".into(),
            topic_arns: serde_json::from_value(case["allowed_topic_arns"].clone()).unwrap(),
            confirm_subscriptions: Some(false),
            certificates: [(
                case["cert_url"].as_str().unwrap().to_owned(),
                dir.join(case["cert_file"].as_str().unwrap()),
            )]
            .into(),
            tolerance_seconds: tolerance,
            ..Default::default()
        };
        let ses = crate::ingest::schemes::build("sources.ses", &config).unwrap();
        let r = RawRequest {
            headers: &[],
            body: &body,
            query: None,
            method: "POST",
        };
        ses.verify(&r, Utc.timestamp_opt(at, 0).unwrap())
    }

    #[test]
    fn a_certificate_url_sns_refuses_is_remembered_and_fetches_are_bounded() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::time::Instant;
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        // `hold` fetches wait until released: fetches in flight, held by the test.
        let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let store = Arc::new(HttpsCertStore::with_fetch(
            StaticCertStore::default(),
            move |url| {
                counted.fetch_add(1, Ordering::SeqCst);
                if url.starts_with("https://x/hold") {
                    held_tx.send(()).unwrap();
                    lock(&release_rx).recv().unwrap();
                }
                match url {
                    "https://x/real.pem" | "https://x/hold-1.pem" | "https://x/hold-2.pem" => {
                        Ok(b"PEM".to_vec())
                    }
                    "https://x/busy.pem" => Err(CertFetchError::Status(
                        reqwest::StatusCode::TOO_MANY_REQUESTS,
                    )),
                    "https://x/down.pem" => Err(CertFetchError::Status(
                        reqwest::StatusCode::SERVICE_UNAVAILABLE,
                    )),
                    _ => Err(CertFetchError::Status(reqwest::StatusCode::NOT_FOUND)),
                }
            },
        ));
        let fetches = || calls.load(Ordering::SeqCst);
        let t0 = Instant::now();
        let at = move |s: u64| t0 + Duration::from_secs(s);
        // An invented URL: fetched once, then refused from memory (no fetch) for ten minutes.
        let invented = "https://x/invented.pem";
        assert!(matches!(
            store.get_at(invented, at(0)),
            Err(CertFetchError::NoSuchCertificate)
        ));
        assert!(matches!(
            store.get_at(invented, at(5)),
            Err(CertFetchError::NoSuchCertificate)
        ));
        assert_eq!(fetches(), 1);
        // Fetched and cached; a cached one is never fetched again.
        assert_eq!(store.get_at("https://x/real.pem", at(6)).unwrap(), b"PEM");
        assert_eq!(store.get_at("https://x/real.pem", at(7)).unwrap(), b"PEM");
        assert_eq!(fetches(), 2);
        // A 429 or a 5xx is an outage, not a verdict: not remembered, tried again.
        for url in ["https://x/busy.pem", "https://x/down.pem"] {
            for s in [8, 9] {
                assert!(
                    matches!(store.get_at(url, at(s)), Err(CertFetchError::Status(_))),
                    "{url}"
                );
            }
        }
        assert_eq!(fetches(), 6);
        // Two fetches in flight: a third uncached URL is asked to retry, unfetched; a cached one
        // and a refused one are answered as ever.
        let holders: Vec<_> = ["https://x/hold-1.pem", "https://x/hold-2.pem"]
            .into_iter()
            .map(|url| {
                let store = store.clone();
                let t = std::thread::spawn(move || store.get_at(url, at(10)).is_ok());
                held_rx.recv().unwrap();
                t
            })
            .collect();
        assert!(matches!(
            store.get_at("https://x/third.pem", at(10)),
            Err(CertFetchError::Throttled)
        ));
        assert_eq!(store.get_at("https://x/real.pem", at(10)).unwrap(), b"PEM");
        assert!(matches!(
            store.get_at(invented, at(10)),
            Err(CertFetchError::NoSuchCertificate)
        ));
        assert_eq!(fetches(), 8);
        for t in holders {
            release_tx.send(()).unwrap();
            assert!(t.join().unwrap());
        }
        // Slots free again: fetched (and refused).
        assert!(matches!(
            store.get_at("https://x/third.pem", at(11)),
            Err(CertFetchError::NoSuchCertificate)
        ));
        assert_eq!(fetches(), 9);
        // Ten minutes on, the invented URL is fetched (and refused) again.
        assert!(matches!(
            store.get_at(invented, at(601)),
            Err(CertFetchError::NoSuchCertificate)
        ));
        assert_eq!(fetches(), 10);
    }

    #[test]
    fn the_envelope_timestamp_is_checked_by_default() {
        const PUBLISHED: i64 = 1442712134; // 2015-09-20T01:22:14Z
        // Its Message ("boo") is no SES event: a verified envelope answers Unparsable (400).
        let verified = |r: Result<Vec<ReceiptEvent>, VerifyError>| {
            matches!(r, Err(VerifyError::Unparsable(_)))
        };
        for at in [PUBLISHED - 299, PUBLISHED, PUBLISHED + 300] {
            assert!(verified(published_at(at, None)), "at {at}");
        }
        for at in [PUBLISHED - 301, PUBLISHED + 301, PUBLISHED + 86_400] {
            assert_eq!(
                published_at(at, None),
                Err(VerifyError::Stale(300)),
                "at {at}"
            );
        }
        assert!(verified(published_at(PUBLISHED + 3600, Some(3600))));
        assert_eq!(
            published_at(PUBLISHED + 3601, Some(3600)),
            Err(VerifyError::Stale(3600))
        );
    }

    /// The published envelope, its certificate fetched by `fetch` (nothing pinned).
    fn fetched_with(
        fetch: impl Fn(&str) -> Result<Vec<u8>, CertFetchError> + Send + Sync + 'static,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        use chrono::TimeZone;
        let dir = crate::ingest::schemes::fixture_path("ses/sdk-valid-sns-v1");
        let case: Value =
            serde_json::from_slice(&std::fs::read(dir.join("case.json")).unwrap()).unwrap();
        let body = std::fs::read(dir.join("body")).unwrap();
        let ses = Ses::new(
            serde_json::from_value(case["allowed_topic_arns"].clone()).unwrap(),
            Arc::new(HttpsCertStore::with_fetch(
                StaticCertStore::default(),
                fetch,
            )),
            false,
            300,
        );
        let r = RawRequest {
            headers: &[],
            body: &body,
            query: None,
            method: "POST",
        };
        ses.verify(&r, Utc.timestamp_opt(1442712134, 0).unwrap())
    }

    #[test]
    fn a_certificate_sns_does_not_have_is_a_refusal_and_an_outage_a_retry() {
        use reqwest::StatusCode;
        // A forged envelope naming an invented certificate: 401, not 503.
        for status in [StatusCode::NOT_FOUND, StatusCode::FORBIDDEN] {
            assert_eq!(
                fetched_with(move |_| Err(CertFetchError::Status(status))),
                Err(VerifyError::Mismatch)
            );
        }
        assert_eq!(
            fetched_with(|_| Err(CertFetchError::Status(StatusCode::BAD_GATEWAY))),
            Err(VerifyError::Unavailable("SNS signing certificate"))
        );
    }

    #[test]
    fn an_unpinned_certificate_reads_as_it_always_has() {
        let err = StaticCertStore::default().get("https://x").unwrap_err();
        assert_eq!(err.to_string(), "no pinned certificate for that URL");
    }

    #[test]
    fn cert_url_policy() {
        let r = "us-east-1";
        let ok = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-bb750dd4.pem";
        assert!(sns_url_allowed(ok, true, r));
        let cn = "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-0a.pem";
        assert!(sns_url_allowed(cn, true, "cn-north-1"));
        assert!(sns_url_allowed(
            "https://sns.us-east-1.amazonaws.com/?Action=Confirm",
            false,
            r
        ));
        for bad in [
            "http://sns.us-east-1.amazonaws.com/SimpleNotificationService-ab.pem",
            "https://sns.us-east-1.amazonaws.com.evil.com/SimpleNotificationService-ab.pem",
            "https://evil.com/sns.us-east-1.amazonaws.com/SimpleNotificationService-ab.pem",
            "https://sns.us-east-1.amazonaws.com:8443/SimpleNotificationService-ab.pem",
            "https://sns.s3.amazonaws.com/SimpleNotificationService-ab.pem",
            "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-ab.pem",
            "https://sns.us-east-1.amazonaws.com/x.pem",
            "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-zz.pem",
            "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-ab.pem?x=1",
            "not a url",
        ] {
            assert!(!sns_url_allowed(bad, true, r), "{bad}");
        }
        assert_eq!(
            topic_region("arn:aws:sns:us-east-1:810605503585:just_testing"),
            Some("us-east-1")
        );
        assert_eq!(
            topic_region("arn:aws-cn:sns:cn-north-1:1:t"),
            Some("cn-north-1")
        );
        assert_eq!(topic_region("arn:aws:sqs:us-east-1:1:t"), None);
        assert_eq!(topic_region("arn:aws:sns:s3:1:t"), None, "not a region");
        assert_eq!(topic_region("garbage"), None);
    }

    #[test]
    fn canonical_strings() {
        let n = json!({"Type": "Notification", "Message": "m", "MessageId": "i", "Timestamp": "t", "TopicArn": "a"});
        assert_eq!(
            canonical(&n).unwrap(),
            "Message\nm\nMessageId\ni\nTimestamp\nt\nTopicArn\na\nType\nNotification\n"
        );
        let c = json!({"Type": "SubscriptionConfirmation", "Message": "m", "MessageId": "i", "Timestamp": "t", "TopicArn": "a"});
        assert_eq!(canonical(&c), None, "SubscribeURL and Token are required");
        assert_eq!(canonical(&json!({"Type": "Other"})), None);
    }

    #[test]
    fn ses_events_normalize_by_their_own_time() {
        let ses = json!({"eventType": "Bounce", "bounce": {"bounceType": "Permanent", "timestamp": "2017-08-05T00:41:02.669Z"},
            "mail": {"timestamp": "2017-08-05T00:40:01.123Z", "messageId": "0100015dad", "tags": {"herald_event_id": ["order-1"]}}});
        let e = normalize("sns-1".into(), ses);
        assert_eq!(
            (e.event_type.as_str(), e.provider_type.as_str()),
            ("bounced", "Bounce")
        );
        assert_eq!(
            e.event_time.unwrap().timestamp(),
            1501893662,
            "bounce.timestamp, not mail.timestamp"
        );
        assert_eq!(e.herald_event_id.as_deref(), Some("order-1"));
        assert_eq!(e.provider_message_id.as_deref(), Some("0100015dad"));
        assert_eq!(detail_key("DeliveryDelay"), "deliveryDelay");
        // The tag as Herald writes it (X-SES-MESSAGE-TAGS, encoded) is read back decoded.
        let tagged = |v: &str| {
            normalize(
                "sns-2".into(),
                json!({"eventType": "Delivery", "delivery": {"timestamp": "2017-08-05T00:41:02.669Z"},
                       "mail": {"messageId": "m", "tags": {"ses:configuration-set": ["c"], "herald_event_id": [v]}}}),
            )
            .herald_event_id
        };
        assert_eq!(
            tagged("order-1_3Aplaced_5Fx").as_deref(),
            Some("order-1:placed_x")
        );
        assert_eq!(
            tagged("plain_tag").as_deref(),
            Some("plain_tag"),
            "not Herald's encoding"
        );
        assert_eq!(detail_key("Rendering Failure"), "failure");
    }

    #[test]
    fn a_reject_outranks_the_send_it_stopped_and_every_final_bounce_is_bounced() {
        let at = |e: &ReceiptEvent| e.event_time.map(|t| t.timestamp());
        let mail = json!({"timestamp": "2017-08-05T00:40:01.123Z", "messageId": "0100015dad"});
        let send = normalize(
            "s".into(),
            json!({"eventType": "Send", "send": {}, "mail": mail}),
        );
        for (event, key, body, status) in [
            (
                "Reject",
                "reject",
                json!({"reason": "Bad content"}),
                "dropped",
            ),
            (
                "Rendering Failure",
                "failure",
                json!({"errorMessage": "x", "templateName": "t"}),
                "failed",
            ),
        ] {
            let e = normalize(
                "r".into(),
                json!({"eventType": event, key: body, "mail": mail}),
            );
            assert_eq!(e.event_type, status);
            assert_eq!(at(&e), at(&send), "{event}: the send's time, not none");
            assert!(at(&e).is_some());
            // At the same time the status order decides: it outranks `sent`.
            assert!(matches!(
                crate::reconcile::judge(Some("sent"), send.event_time, &e.event_type, e.event_time),
                crate::reconcile::Verdict::Applied { .. }
            ));
        }
        let bounce = |kind: &str, sub: Option<&str>| {
            let mut b = json!({"bounceType": kind, "timestamp": "2017-08-05T00:41:02.669Z",
                "bouncedRecipients": [{"emailAddress": "a@example.com"}]});
            if let Some(sub) = sub {
                b["bounceSubType"] = json!(sub);
            }
            normalize(
                "b".into(),
                json!({"eventType": "Bounce", "bounce": b, "mail": mail}),
            )
            .event_type
        };
        assert_eq!(bounce("Permanent", Some("General")), "bounced");
        assert_eq!(bounce("Transient", Some("MailboxFull")), "bounced");
        assert_eq!(bounce("Transient", Some("MessageTooLarge")), "bounced");
        assert_eq!(bounce("Undetermined", Some("Undetermined")), "bounced");
        assert_eq!(
            bounce("Transient", Some("General")),
            "other",
            "an automatic reply"
        );
        assert_eq!(bounce("Transient", None), "other");
        // A General soft bounce whose recipient's DSN failed is a bounce SES gave up on.
        for recipient in [
            json!({"emailAddress": "a@example.com", "action": "failed"}),
            json!({"emailAddress": "a@example.com", "status": "4.4.7"}),
            json!({"emailAddress": "a@example.com", "status": "5.0.0"}),
        ] {
            let b = json!({"bounceType": "Transient", "bounceSubType": "General",
                "timestamp": "2017-08-05T00:41:02.669Z", "bouncedRecipients": [recipient]});
            let e = normalize(
                "g".into(),
                json!({"eventType": "Bounce", "bounce": b, "mail": mail}),
            );
            assert_eq!(e.event_type, "bounced", "{recipient}");
        }
        // SES still retrying is its DeliveryDelay.
        let delay = json!({"eventType": "DeliveryDelay", "deliveryDelay": {"timestamp": "2017-08-05T00:41:02.669Z"}, "mail": mail});
        assert_eq!(normalize("d".into(), delay).event_type, "deferred");
    }
}
