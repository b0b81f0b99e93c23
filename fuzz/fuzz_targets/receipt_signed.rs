//! Hostile bodies, correctly signed, through each body-signing scheme's verifier and normalizer
//! (`herald::ingest::verify_offline`, what ingest and `herald verify-receipt` run): the first
//! byte picks the scheme, the rest is the body. Nothing may panic; the signature always checks
//! out; the answer is 200 with events in Herald's vocabulary, or 400 with a reason.

#![no_main]

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use herald::ingest::schemes::hmac_sha256;
use herald::ingest::{VOCABULARY, verify_offline};
use libfuzzer_sys::fuzz_target;

const WHSEC: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn h(name: &str, value: String) -> (String, String) {
    (name.to_owned(), value)
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, input)) = data.split_first() else {
        return;
    };
    let at = chrono::DateTime::from_timestamp(1_764_000_000, 0).expect("a valid instant");
    let t = at.timestamp().to_string();
    let mut body = input.to_vec();
    let (scheme, secret, headers) = match which % 5 {
        0 => (
            "hmac",
            "k",
            vec![h("x-signature", hex::encode(hmac_sha256(b"k", &[&body])))],
        ),
        1 => {
            let mac = hmac_sha256(b"whsec_s", &[t.as_bytes(), b".", &body]);
            (
                "stripe",
                "whsec_s",
                vec![h(
                    "stripe-signature",
                    format!("t={t},v1={}", hex::encode(mac)),
                )],
            )
        }
        2 => {
            let key = B64
                .decode(WHSEC.trim_start_matches("whsec_"))
                .expect("a base64 key");
            let mac = hmac_sha256(&key, &[b"msg_fuzz.", t.as_bytes(), b".", &body]);
            (
                "standard-webhooks",
                WHSEC,
                vec![
                    h("webhook-id", "msg_fuzz".into()),
                    h("webhook-timestamp", t.clone()),
                    h("webhook-signature", format!("v1,{}", B64.encode(mac))),
                ],
            )
        }
        3 => (
            "postmark",
            "hook:pw",
            vec![h(
                "authorization",
                format!("Basic {}", B64.encode("hook:pw")),
            )],
        ),
        _ => {
            // Mailgun signs inside the body: the input is its `event-data` (as JSON where it
            // parses, else as a string).
            let data = serde_json::from_slice::<serde_json::Value>(input).unwrap_or_else(|_| {
                serde_json::Value::String(String::from_utf8_lossy(input).into_owned())
            });
            let token = "tok-0123456789abcdef";
            let sig = hex::encode(hmac_sha256(b"mg-key", &[t.as_bytes(), token.as_bytes()]));
            body = serde_json::to_vec(&serde_json::json!({
                "signature": {"timestamp": t, "token": token, "signature": sig},
                "event-data": data,
            }))
            .expect("JSON");
            ("mailgun", "mg-key", Vec::new())
        }
    };
    let v = verify_offline(
        scheme,
        &[secret.to_owned()],
        &headers,
        &body,
        None,
        None,
        at,
    )
    .expect("the scheme's configuration is valid");
    assert!(v.signature_valid, "{scheme}: the signature did not verify");
    assert!(
        [200, 400].contains(&v.status),
        "{scheme}: a correctly signed request answered {}",
        v.status
    );
    assert_eq!(v.valid, v.status == 200);
    assert_eq!(v.valid, v.error.is_none());
    for e in &v.events {
        assert!(
            !e.provider_event_id.is_empty(),
            "{scheme}: an event without an id"
        );
        assert!(
            VOCABULARY.contains(&e.event_type.as_str()) || e.event_type == "other",
            "{scheme}: event type {:?} is not Herald's vocabulary",
            e.event_type
        );
    }
    serde_json::to_string(&v).expect("the verdict serializes");
});
