//! Any bytes as a `POST /v1/messages` body (with or without an `Idempotency-Key`): parsed and
//! planned, or refused field by field. Nothing may panic, and every refusal names a field.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte: whether an idempotency key comes first, up to the first newline.
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let (key, body) = if flags & 1 == 1 {
        match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (
                Some(String::from_utf8_lossy(&rest[..i]).into_owned()),
                &rest[i + 1..],
            ),
            None => (None, rest),
        }
    } else {
        (None, rest)
    };
    let at = chrono::DateTime::from_timestamp(1_764_000_000, 0).expect("a valid instant");
    let errors = match herald::http::parse_new_message(body, key.as_deref()) {
        Err(errors) => errors,
        Ok(m) => match m.plan(&herald::outbox::Limits::default(), at) {
            Err(errors) => errors,
            Ok(_) => return,
        },
    };
    assert!(!errors.is_empty(), "a refusal without a reason");
    let sent = serde_json::from_slice::<serde_json::Value>(body).ok();
    for e in &errors {
        let head = e.field.split(['.', '[']).next().unwrap_or_default();
        assert!(
            head == "body"
                || head.eq_ignore_ascii_case("idempotency-key")
                || herald::http::MESSAGE_FIELDS.contains(&head)
                || sent.as_ref().and_then(|v| v.get(&e.field)).is_some(),
            "{e:?} does not name a field of the request"
        );
        assert!(!e.message.is_empty(), "{e:?}");
    }
});
