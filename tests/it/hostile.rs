//! Hostile input, as property tests (proptest): every receipt scheme's verifier and normalizer
//! (junk requests, and hostile bodies *correctly signed*, so the normalizer behind the signature
//! sees them), the header parsers (`Retry-After`, `Authorization: Bearer`) and the message API
//! (`POST /v1/messages` parsing and planning). Nothing panics; junk is never accepted; what is
//! refused names a field. The SMS schemes' parsers have their own property tests in
//! `src/ingest/schemes/mod.rs` (`hostile_input`).
//!
//! Bounded: a fixed number of cases per property (`HERALD_PROPTEST_CASES` scales them: the
//! number given replaces the default 256; the costly signatures run an eighth and a sixteenth of
//! it), no regression files written. Each property prints how many cases passed.

use std::time::Duration;

use base64::Engine as _;
use chrono::{DateTime, TimeZone, Utc};
use hmac::{Hmac, Mac};
use proptest::prelude::*;
use serde_json::{Value, json};

use herald::ingest::{VOCABULARY, Verdict, verify_offline};

/// Cases per property: `HERALD_PROPTEST_CASES`, else 256; `divisor` for costly ones.
fn config(divisor: u32) -> ProptestConfig {
    let cases = std::env::var("HERALD_PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases: (cases / divisor).max(1),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Runs one property for its configured cases, and prints how many passed (`--nocapture` shows
/// the lines, `proptest <name>: <n> cases passed`): the issue's note reports the count. (The
/// runner answers `Ok` only once that many cases passed; the count is of the cases run.)
fn check<S: Strategy>(
    name: &str,
    config: ProptestConfig,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let passed = std::cell::Cell::new(0u32);
    let result = proptest::test_runner::TestRunner::new(config).run(&strategy, |value| {
        test(value)?;
        passed.set(passed.get() + 1);
        Ok(())
    });
    if let Err(e) = result {
        panic!("proptest {name}: {e}");
    }
    eprintln!("proptest {name}: {} cases passed", passed.get());
}

/// Keys the normalizers look for, so that hostile bodies reach their branches.
const KEYS: &[&str] = &[
    "id",
    "type",
    "event",
    "timestamp",
    "created",
    "data",
    "object",
    "metadata",
    "herald_event_id",
    "event-data",
    "user-variables",
    "message",
    "headers",
    "message-id",
    "severity",
    "sg_event_id",
    "sg_message_id",
    "smtp-id",
    "custom_args",
    "email",
    "reason",
    "RecordType",
    "MessageID",
    "Metadata",
    "BouncedAt",
    "DeliveredAt",
    "ReceivedAt",
    "Type",
    "TypeCode",
    "eventType",
    "notificationType",
    "mail",
    "tags",
    "messageId",
    "bounce",
    "bounceType",
    "complaint",
    "delivery",
    "MessageSid",
    "MessageStatus",
    "SmsStatus",
    "ErrorCode",
    "at",
    "message_id",
    "email_id",
    "created_at",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("delivered".to_owned()),
        Just("bounced".to_owned()),
        Just("Bounce".to_owned()),
        Just("Complaint".to_owned()),
        Just("Delivery".to_owned()),
        Just("email.delivered".to_owned()),
        Just("failed".to_owned()),
        Just("permanent".to_owned()),
        Just("2026-11-30T10:00:00Z".to_owned()),
        Just("2026-11-30T10:00:00.123456789+14:00".to_owned()),
        Just("9999-12-31T23:59:59Z".to_owned()),
        Just("1700000000".to_owned()),
        Just("1e308".to_owned()),
        Just("-1".to_owned()),
        Just("NaN".to_owned()),
        Just("<a@b>".to_owned()),
        Just("herald_event_id".to_owned()),
        Just("{\"herald_event_id\":\"x\"}".to_owned()),
        "[ -~]{0,12}",
        any::<String>(),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop_oneof![
            Just(1e308),
            Just(-1e308),
            Just(0.5),
            Just(-0.0),
            Just(1.7e9),
            Just(4.0e12),
            any::<f64>()
        ]
        .prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        text().prop_map(Value::from),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(KEYS).prop_map(str::to_owned),
        1 => "[a-z_-]{0,6}",
    ]
}

/// Any JSON value, nested a few levels, with the keys the normalizers read.
fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..7)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A request body: hostile JSON (mostly objects and arrays), or raw bytes.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

/// The time every request is checked at, and signed for.
fn at() -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000, 0).unwrap()
}

fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().to_vec()
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// What a verified, normalized event must look like whatever the body was.
fn assert_sane(scheme: &str, v: &Verdict) {
    assert!(
        [200, 400].contains(&v.status),
        "{scheme}: a correctly signed request answered {}: {:?}",
        v.status,
        v.error
    );
    assert!(v.signature_valid, "{scheme}: the signature did not verify");
    assert_eq!(v.valid, v.status == 200);
    assert_eq!(v.valid, v.error.is_none());
    for e in &v.events {
        assert!(
            !e.provider_event_id.is_empty(),
            "{scheme}: an event without an id: {e:?}"
        );
        assert!(
            VOCABULARY.contains(&e.event_type.as_str()) || e.event_type == "other",
            "{scheme}: event type {:?} is not Herald's vocabulary",
            e.event_type
        );
    }
    // `herald verify-receipt` prints it.
    serde_json::to_string(v).unwrap();
}

/// Signed, as each provider signs: (secrets, headers, body, url).
type Signed = (Vec<String>, Vec<(String, String)>, Vec<u8>, Option<String>);

fn h(name: &str, value: impl Into<String>) -> (String, String) {
    (name.to_owned(), value.into())
}

const WHSEC: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn signed_hmac(body: Vec<u8>) -> Signed {
    let sig = hex::encode(hmac_sha256(b"k", &[&body]));
    (vec!["k".into()], vec![h("x-signature", sig)], body, None)
}

fn signed_stripe(body: Vec<u8>) -> Signed {
    let t = at().timestamp().to_string();
    let sig = hex::encode(hmac_sha256(b"whsec_s", &[t.as_bytes(), b".", &body]));
    (
        vec!["whsec_s".into()],
        vec![h("stripe-signature", format!("t={t},v1={sig}"))],
        body,
        None,
    )
}

fn signed_standard_webhooks(body: Vec<u8>) -> Signed {
    let t = at().timestamp();
    // By hand: the `standardwebhooks` crate refuses to sign a body that is not UTF-8.
    let key = B64.decode(WHSEC.trim_start_matches("whsec_")).unwrap();
    let ts = t.to_string();
    let mac = hmac_sha256(&key, &[b"msg_hostile.", ts.as_bytes(), b".", &body]);
    let sig = format!("v1,{}", B64.encode(mac));
    (
        vec![WHSEC.into()],
        vec![
            h("webhook-id", "msg_hostile"),
            h("webhook-timestamp", t.to_string()),
            h("webhook-signature", sig),
        ],
        body,
        None,
    )
}

fn signed_postmark(body: Vec<u8>) -> Signed {
    (
        vec!["hook:pw".into()],
        vec![h(
            "authorization",
            format!("Basic {}", B64.encode("hook:pw")),
        )],
        body,
        None,
    )
}

/// Mailgun signs inside the body: the hostile value is its `event-data`, beside hostile keys.
fn signed_mailgun(data: Value, extra: Value) -> Signed {
    let t = at().timestamp().to_string();
    let token = "tok-0123456789abcdef";
    let sig = hex::encode(hmac_sha256(b"mg-key", &[t.as_bytes(), token.as_bytes()]));
    let mut body = json!({"signature": {"timestamp": t, "token": token, "signature": sig}});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            if k != "signature" {
                body[k] = v;
            }
        }
    }
    body["event-data"] = data;
    (
        vec!["mg-key".into()],
        Vec::new(),
        serde_json::to_vec(&body).unwrap(),
        None,
    )
}

/// Twilio: a form body, signed over the URL and the sorted parameters.
fn signed_twilio(params: Vec<(String, String)>) -> Signed {
    let url = "https://hooks.example/twilio";
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&params)
        .finish()
        .into_bytes();
    let decoded: Vec<(String, String)> = url::form_urlencoded::parse(&body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let data = format!(
        "{url}{}",
        herald::ingest::schemes::twilio::signed_params(&decoded)
    );
    let mut mac = Hmac::<sha1::Sha1>::new_from_slice(b"tw-token").unwrap();
    mac.update(data.as_bytes());
    (
        vec!["tw-token".into()],
        vec![
            h(
                "x-twilio-signature",
                B64.encode(mac.finalize().into_bytes()),
            ),
            h("content-type", "application/x-www-form-urlencoded"),
        ],
        body,
        Some(url.into()),
    )
}

/// SendGrid: ECDSA P-256 over the timestamp and the body, with a key of the test's own.
fn signed_sendgrid(body: Vec<u8>) -> Signed {
    use p256::ecdsa::signature::Signer;
    let key = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
    // SubjectPublicKeyInfo of a P-256 key: the fixed DER header, then the uncompressed point.
    let mut public = hex::decode("3059301306072a8648ce3d020106082a8648ce3d030107034200").unwrap();
    public.extend_from_slice(key.verifying_key().to_encoded_point(false).as_bytes());
    let t = at().timestamp().to_string();
    let signed = [t.as_bytes(), &body].concat();
    let sig: p256::ecdsa::Signature = key.sign(&signed);
    (
        vec![B64.encode(&public)],
        vec![
            h(
                "x-twilio-email-event-webhook-signature",
                B64.encode(sig.to_der().as_bytes()),
            ),
            h("x-twilio-email-event-webhook-timestamp", t),
        ],
        body,
        None,
    )
}

/// A throwaway SNS signing key (DER) and its certificate (PEM), made once.
fn sns_key() -> &'static (rsa::RsaPrivateKey, Vec<u8>) {
    static KEY: std::sync::OnceLock<(rsa::RsaPrivateKey, Vec<u8>)> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        use rsa::pkcs8::DecodePrivateKey;
        let dir = tempfile::tempdir().unwrap();
        crate::sns::signing_certificate(dir.path());
        crate::sns::openssl(
            dir.path(),
            &[
                "pkcs8", "-topk8", "-nocrypt", "-in", "key.pem", "-outform", "DER", "-out",
                "key.der",
            ],
        );
        let der = std::fs::read(dir.path().join("key.der")).unwrap();
        (
            rsa::RsaPrivateKey::from_pkcs8_der(&der).unwrap(),
            std::fs::read(dir.path().join("cert.pem")).unwrap(),
        )
    })
}

/// SES through SNS: a correctly signed envelope (SignatureVersion 2) whose `Message` is hostile.
fn signed_ses(message: String, message_id: String) -> (Vec<u8>, Vec<u8>) {
    use rsa::signature::{SignatureEncoding, Signer};
    let (key, cert) = sns_key();
    let mut env = json!({
        "Type": "Notification", "MessageId": message_id, "TopicArn": crate::sns::TOPIC,
        "Message": message, "Timestamp": at().to_rfc3339(), "SignatureVersion": "2",
        "SigningCertURL": crate::sns::CERT_URL,
    });
    let canonical = herald::ingest::schemes::ses::canonical(&env).expect("canonical");
    let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key.clone());
    env["Signature"] = json!(B64.encode(signer.sign(canonical.as_bytes()).to_vec()));
    (serde_json::to_vec(&env).unwrap(), cert.clone())
}

/// An SNS notification envelope checked against `cert`, as the `ses` scheme checks it.
fn verify_ses(body: &[u8], cert: Vec<u8>) -> Verdict {
    verify_offline(
        "ses",
        &[],
        &[h("x-amz-sns-message-type", "Notification")],
        body,
        None,
        Some(cert),
        at(),
    )
    .unwrap()
}

fn verify(scheme: &str, s: Signed) -> Verdict {
    let (secrets, headers, body, url) = s;
    verify_offline(
        scheme,
        &secrets,
        &headers,
        &body,
        url.as_deref(),
        None,
        at(),
    )
    .unwrap_or_else(|e| panic!("{scheme}: configuration refused: {e:?}"))
}

/// Every scheme with a valid configuration, for the junk property: (scheme, secret).
fn schemes() -> Vec<(&'static str, String)> {
    let sendgrid = signed_sendgrid(Vec::new()).0.remove(0);
    vec![
        ("hmac", "k".into()),
        ("stripe", "whsec_s".into()),
        ("standard-webhooks", WHSEC.into()),
        ("postmark", "hook:pw".into()),
        ("mailgun", "mg-key".into()),
        ("twilio", "tw-token".into()),
        ("sendgrid", sendgrid),
        ("ses", String::new()),
    ]
}

/// Header names the verifiers read, to be filled with junk.
const HEADERS: &[&str] = &[
    "x-signature",
    "x-timestamp",
    "stripe-signature",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
    "authorization",
    "x-twilio-signature",
    "x-twilio-email-event-webhook-signature",
    "x-twilio-email-event-webhook-timestamp",
    "x-amz-sns-message-type",
    "content-type",
];

fn header_junk() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("t=1800000000,v1=00".to_owned()),
        Just("v1,AAAA".to_owned()),
        Just("v1a,AAAA".to_owned()),
        Just("Basic aG9vazpwdw".to_owned()),
        Just("Basic ".to_owned()),
        Just("1800000000".to_owned()),
        Just("MEUCIQ==".to_owned()),
        Just("sha256=".to_owned()),
        "[ -~]{0,40}",
        any::<String>(),
    ]
}

/// Junk headers and bodies: refused (401, or 503 where a certificate cannot be had), never
/// accepted, never a panic — whatever the scheme.
#[test]
fn junk_requests_are_refused_by_every_scheme() {
    let strategy = (
        prop::collection::vec(prop::option::of(header_junk()), HEADERS.len()),
        body(),
        prop::option::of("https://hooks\\.example/[ -~]{0,12}"),
    );
    check(
        "junk_requests_are_refused_by_every_scheme",
        config(1),
        strategy,
        |(values, body, url)| {
            let headers: Vec<(String, String)> = HEADERS
                .iter()
                .zip(values)
                .filter_map(|(n, v)| Some((n.to_string(), v?)))
                .collect();
            for (scheme, secret) in schemes() {
                let secrets = if secret.is_empty() {
                    vec![]
                } else {
                    vec![secret]
                };
                let url = url
                    .clone()
                    .or_else(|| (scheme == "twilio").then(|| "https://hooks.example/t".into()));
                let v = verify(scheme, (secrets, headers.clone(), body.clone(), url));
                prop_assert!(
                    !v.valid && !v.signature_valid,
                    "{} accepted junk: {:?}",
                    scheme,
                    v
                );
                prop_assert!([401, 503].contains(&v.status), "{}: {}", scheme, v.status);
                prop_assert!(v.error.is_some());
            }
            Ok(())
        },
    );
}

/// Hostile bodies behind a valid signature reach the normalizers: 200 with sane events, or
/// 400 (verified but unparsable) — never a panic, never a 5xx.
#[test]
fn signed_hostile_bodies_are_normalized_or_refused() {
    check(
        "signed_hostile_bodies_are_normalized_or_refused",
        config(1),
        body(),
        |body| {
            assert_sane("hmac", &verify("hmac", signed_hmac(body.clone())));
            assert_sane("stripe", &verify("stripe", signed_stripe(body.clone())));
            assert_sane(
                "standard-webhooks",
                &verify("standard-webhooks", signed_standard_webhooks(body.clone())),
            );
            assert_sane("postmark", &verify("postmark", signed_postmark(body)));
            Ok(())
        },
    );
}

#[test]
fn signed_hostile_mailgun_event_data() {
    check(
        "signed_hostile_mailgun_event_data",
        config(1),
        (json_value(), json_value()),
        |(data, extra)| {
            assert_sane("mailgun", &verify("mailgun", signed_mailgun(data, extra)));
            Ok(())
        },
    );
}

#[test]
fn signed_hostile_twilio_forms() {
    let name = prop_oneof![
        prop::sample::select(
            &[
                "MessageSid",
                "MessageStatus",
                "SmsStatus",
                "ErrorCode",
                "SmsSid",
                "To",
                "From",
                "AccountSid",
                "RawDlrDoneDate"
            ][..]
        )
        .prop_map(str::to_owned),
        "[ -~]{0,6}",
        any::<String>(),
    ];
    let params = prop::collection::vec((name, text()), 0..8);
    check("signed_hostile_twilio_forms", config(1), params, |params| {
        assert_sane("twilio", &verify("twilio", signed_twilio(params)));
        Ok(())
    });
}

// ECDSA signing in a debug build is slow: an eighth of the cases.
#[test]
fn signed_hostile_sendgrid_batches() {
    let events = prop_oneof![
        prop::collection::vec(json_value(), 0..4).prop_map(Value::Array),
        json_value(),
    ];
    check(
        "signed_hostile_sendgrid_batches",
        config(8),
        events,
        |events| {
            let body = serde_json::to_vec(&events).unwrap();
            assert_sane("sendgrid", &verify("sendgrid", signed_sendgrid(body)));
            Ok(())
        },
    );
}

// RSA-2048 signing in a debug build is slower still: a sixteenth.
#[test]
fn signed_hostile_ses_messages() {
    let message = prop_oneof![
        3 => json_value().prop_map(|v| v.to_string()),
        1 => any::<String>(),
    ];
    check(
        "signed_hostile_ses_messages",
        config(16),
        (message, text()),
        |(message, message_id)| {
            let (body, cert) = signed_ses(message, message_id);
            assert_sane("ses", &verify_ses(&body, cert));
            Ok(())
        },
    );
}

/// Found by `signed_hostile_ses_messages`: a correctly signed envelope with an empty `MessageId`
/// was refused as "missing signature" (401); it is verified but malformed: 400.
#[test]
fn a_signed_envelope_without_a_message_id_is_unparsable() {
    let (body, cert) = signed_ses("{}".into(), String::new());
    let v = verify_ses(&body, cert);
    assert!(v.signature_valid, "{v:?}");
    assert_eq!(v.status, 400, "{v:?}");
    assert_eq!(v.error.as_deref(), Some("unparsable body: no MessageId"));
}

/// `herald verify-receipt --scheme ses --param 'topic_arns=[…]'` judges the topic as the server
/// does, and says it is the topic (it was "signature does not match", or valid offline).
#[test]
fn an_envelope_of_another_topic_is_refused_for_its_topic_offline_too() {
    let (body, cert) = signed_ses("{}".into(), "m-1".into());
    let judge = |topics: &str| {
        let params = [("topic_arns".to_owned(), topics.to_owned())];
        let headers = [h("x-amz-sns-message-type", "Notification")];
        herald::ingest::verify_request_offline(
            &herald::ingest::OfflineRequest {
                scheme: "ses",
                headers: &headers,
                params: &params,
                ..Default::default()
            },
            &body,
            Some(cert.clone()),
            at(),
        )
        .unwrap()
    };
    let ours = judge(&format!("[\"{}\"]", crate::sns::TOPIC));
    assert!(ours.valid, "{ours:?}");
    let other = judge(r#"["arn:aws:sns:us-east-1:999999999999:other"]"#);
    assert_eq!(
        (other.valid, other.status, other.error.as_deref()),
        (
            false,
            401,
            Some("TopicArn is not one of the source's topic_arns (the signature itself matches)")
        ),
        "{other:?}"
    );
    assert!(other.signature_valid, "{other:?}");
}

// --- Header parsers -----------------------------------------------------------------------------

/// Retry-After: any text is a delay or nothing, never a panic; delta-seconds are exact (capped
/// at u32::MAX seconds); an HTTP-date is its distance from now (a past one: none).
#[test]
fn retry_after_parses_any_text() {
    use herald::domain::classify::parse_retry_after;
    let text = prop_oneof![
        any::<String>(),
        "[0-9 ]{0,25}",
        "[A-Za-z]{3}, [0-9]{2} [A-Za-z]{3} [0-9]{4} [0-9:]{8} GMT",
    ];
    check("retry_after_parses_any_text", config(1), text, |s| {
        let now = at();
        if let Some(d) = parse_retry_after(&s, now) {
            let t = s.trim();
            if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
                let n = t.parse::<u64>().unwrap_or(u64::MAX).min(u32::MAX as u64);
                prop_assert_eq!(d, Duration::from_secs(n));
            } else {
                prop_assert!(httpdate::parse_http_date(t).is_ok(), "{:?} gave {:?}", s, d);
            }
        }
        Ok(())
    });
}

#[test]
fn retry_after_round_trips() {
    use herald::domain::classify::parse_retry_after;
    let strategy = (any::<u64>(), -100_000i64..10_000_000);
    check(
        "retry_after_round_trips",
        config(1),
        strategy,
        |(n, ahead)| {
            let now = at();
            prop_assert_eq!(
                parse_retry_after(&n.to_string(), now),
                Some(Duration::from_secs(n.min(u32::MAX as u64)))
            );
            let then = std::time::SystemTime::from(now + chrono::TimeDelta::seconds(ahead));
            prop_assert_eq!(
                parse_retry_after(&httpdate::fmt_http_date(then), now),
                Some(Duration::from_secs(ahead.max(0) as u64))
            );
            Ok(())
        },
    );
}

/// `Authorization: Bearer`: any header value is a token or nothing; a token is never empty,
/// never padded, and always part of the header; the scheme's case does not matter.
#[test]
fn bearer_parses_any_header() {
    use herald::auth::Tokens;
    let strategy = (any::<String>(), "[bB][eE][aA][rR][eE][rR]", "[!-~]{1,40}");
    check(
        "bearer_parses_any_header",
        config(1),
        strategy,
        |(header, scheme, token)| {
            if let Some(t) = Tokens::bearer(&header) {
                prop_assert!(!t.is_empty() && t == t.trim() && header.contains(t));
            }
            let header = format!("{scheme} {token}");
            prop_assert_eq!(Tokens::bearer(&header), Some(token.as_str()));
            let padded = format!("{scheme}   {token}  ");
            prop_assert_eq!(Tokens::bearer(&padded), Some(token.as_str()));
            Ok(())
        },
    );
}

/// A presented token authenticates only when it is exactly a configured one.
#[test]
fn only_the_exact_token_authenticates() {
    let mut tokens = herald::auth::Tokens::default();
    tokens
        .add_plain(
            "default",
            "root-token-0123456789",
            herald::auth::Scope::Admin,
        )
        .unwrap();
    check(
        "only_the_exact_token_authenticates",
        config(1),
        any::<String>(),
        |presented| {
            prop_assert_eq!(
                tokens.authenticate(&presented).is_some(),
                presented == "root-token-0123456789"
            );
            Ok(())
        },
    );
}

// --- The message API ----------------------------------------------------------------------------

use herald::http::MESSAGE_FIELDS;

fn message_value(field: &'static str) -> BoxedStrategy<Value> {
    let valid: BoxedStrategy<Value> = match field {
        "event_id" | "ordering_key" => "[a-z0-9:-]{1,20}".prop_map(Value::from).boxed(),
        "ordering_policy" => prop::sample::select(&["block", "skip"][..])
            .prop_map(Value::from)
            .boxed(),
        "channel" => prop::sample::select(&["webhook", "email"][..])
            .prop_map(Value::from)
            .boxed(),
        "destination" => prop_oneof![
            Just(json!("https://hooks.example/in")),
            Just(json!("http://127.0.0.1:9/x")),
            Just(json!("http://169.254.169.254/latest")),
            Just(json!("endpoint:billing")),
            Just(json!("type:order.placed")),
            Just(json!("ada@example.com")),
            Just(json!("Ada <ada@example.com>")),
        ]
        .boxed(),
        "payload" => prop_oneof![
            json_value().prop_map(|b| json!({"body": b})),
            (json_value(), json_value()).prop_map(|(b, hs)| json!({"body": b, "headers": hs})),
            (text(), text(), json_value())
                .prop_map(|(s, t, hs)| json!({"subject": s, "text": t, "headers": hs})),
            json_value().prop_map(|a| json!({"subject": "s", "text": "t", "attachments": a})),
        ]
        .boxed(),
        "scheduled_at" | "expires_at" => prop_oneof![
            Just(json!("2026-11-30T10:00:00Z")),
            Just(json!("1900-01-01T00:00:00Z")),
            Just(json!("9999-12-31T23:59:59Z")),
        ]
        .boxed(),
        "semantics" => prop::sample::select(&["at_least_once", "at_most_once"][..])
            .prop_map(Value::from)
            .boxed(),
        _ => (-5i64..200).prop_map(Value::from).boxed(),
    };
    prop_oneof![3 => valid, 1 => json_value()].boxed()
}

fn message_object() -> impl Strategy<Value = serde_json::Map<String, Value>> {
    let fields: Vec<_> = MESSAGE_FIELDS
        .iter()
        .map(|f| prop::option::weighted(0.85, message_value(f)).prop_map(move |v| (*f, v)))
        .collect();
    (
        fields,
        prop::collection::vec((key(), json_value()), 0..2),
        any::<bool>(),
    )
        .prop_map(|(fields, extra, with_extra)| {
            let mut m = serde_json::Map::new();
            for (f, v) in fields {
                if let Some(v) = v {
                    m.insert(f.to_owned(), v);
                }
            }
            if with_extra {
                for (k, v) in extra {
                    m.insert(k, v);
                }
            }
            m
        })
}

/// Every refusal names a field: the body, a known field (or a path inside one), or an unknown
/// key that was sent.
fn assert_named(errors: &[herald::domain::InvalidField], sent: &serde_json::Map<String, Value>) {
    assert!(!errors.is_empty(), "a refusal without a reason");
    for e in errors {
        let head = e
            .field
            .split(['.', '['])
            .next()
            .unwrap_or_default()
            .to_owned();
        assert!(
            head == "body"
                || head.eq_ignore_ascii_case("idempotency-key")
                || MESSAGE_FIELDS.contains(&head.as_str())
                || sent.contains_key(&e.field),
            "{:?} does not name a field of the request",
            e
        );
        assert!(!e.message.is_empty(), "{e:?}");
    }
}

/// Any bytes: a message, or refusals that name the body or a field.
#[test]
fn any_bytes_are_a_message_or_named_refusals() {
    let strategy = (
        prop::collection::vec(any::<u8>(), 0..80),
        prop::option::of(any::<String>()),
    );
    check(
        "any_bytes_are_a_message_or_named_refusals",
        config(1),
        strategy,
        |(bytes, key)| {
            if let Err(errors) = herald::http::parse_new_message(&bytes, key.as_deref()) {
                assert_named(&errors, &serde_json::Map::new());
            }
            Ok(())
        },
    );
}

/// Message-shaped objects with hostile values: parsing and planning never panic, and every
/// refusal names its field.
#[test]
fn hostile_messages_are_planned_or_refused_by_field() {
    let strategy = (
        message_object(),
        prop::option::of(prop_oneof!["[ -~]{0,12}", any::<String>()]),
    );
    check(
        "hostile_messages_are_planned_or_refused_by_field",
        config(1),
        strategy,
        |(obj, key)| {
            let body = serde_json::to_vec(&Value::Object(obj.clone())).unwrap();
            match herald::http::parse_new_message(&body, key.as_deref()) {
                Err(errors) => assert_named(&errors, &obj),
                Ok(m) => {
                    let limits = herald::outbox::Limits::default();
                    if let Err(errors) = m.plan(&limits, at()) {
                        assert_named(&errors, &obj);
                    }
                }
            }
            Ok(())
        },
    );
}
