//! Header parsers: `Retry-After` and `Authorization: Bearer` on any text.
#![no_main]

use chrono::{TimeZone, Utc};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let now = Utc.timestamp_opt(1_800_000_000, 0).unwrap();
    let _ = herald::domain::classify::parse_retry_after(s, now);
    if let Some(t) = herald::auth::Tokens::bearer(s) {
        assert!(!t.is_empty() && t == t.trim() && s.contains(t));
    }
});
