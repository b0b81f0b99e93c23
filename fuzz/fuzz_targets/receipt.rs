//! Every receipt scheme's verifier on fuzzed headers and body; and the generic HMAC scheme on a
//! fuzzed body it signs correctly, so the normalizer behind the signature sees it. Never a panic;
//! junk never verifies.
#![no_main]

use chrono::{TimeZone, Utc};
use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;

const SCHEMES: &[(&str, &str)] = &[
    ("hmac", "k"),
    ("stripe", "whsec_s"),
    (
        "standard-webhooks",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    ),
    ("postmark", "hook:pw"),
    ("mailgun", "mg-key"),
    ("twilio", "tw-token"),
    ("ses", ""),
    ("plivo", "k"),
    ("messagebird", "k"),
];

const HEADERS: &[&str] = &[
    "x-signature",
    "stripe-signature",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "authorization",
    "x-twilio-signature",
    "x-plivo-signature-v3",
    "x-plivo-signature-v3-nonce",
    "messagebird-signature-jwt",
];

fuzz_target!(|data: &[u8]| {
    let at = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
    // Up to the first NUL: one header value per line, then the body.
    let (head, body) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    let headers: Vec<(String, String)> = String::from_utf8_lossy(head)
        .lines()
        .zip(HEADERS)
        .map(|(v, n)| (n.to_string(), v.to_owned()))
        .collect();
    for (scheme, secret) in SCHEMES {
        let secrets: Vec<String> = if secret.is_empty() {
            vec![]
        } else {
            vec![secret.to_string()]
        };
        let v = herald::ingest::verify_offline(
            scheme,
            &secrets,
            &headers,
            body,
            Some("https://hooks.example/in"),
            None,
            at,
        )
        .expect("a valid configuration");
        assert!(!v.valid, "{scheme} accepted fuzzed input");
    }
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"k").unwrap();
    mac.update(body);
    let signed = vec![(
        "x-signature".to_owned(),
        hex::encode(mac.finalize().into_bytes()),
    )];
    let v = herald::ingest::verify_offline("hmac", &["k".into()], &signed, body, None, None, at)
        .expect("a valid configuration");
    assert!(v.signature_valid && [200, 400].contains(&v.status));
});
