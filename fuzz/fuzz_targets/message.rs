//! `POST /v1/messages` bodies: parsing and planning never panic; a refusal names a field.
#![no_main]

use chrono::{TimeZone, Utc};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let at = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
    match herald::http::parse_new_message(data, Some("key-1")) {
        Err(errors) => assert!(!errors.is_empty() && errors.iter().all(|e| !e.field.is_empty())),
        Ok(m) => {
            if let Err(errors) = m.plan(&herald::outbox::Limits::default(), at) {
                assert!(!errors.is_empty() && errors.iter().all(|e| !e.field.is_empty()));
            }
        }
    }
});
