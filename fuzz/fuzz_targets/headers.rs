//! The header parsers Herald applies to what others send: `Retry-After` (a receiver's answer)
//! and `Authorization: Bearer` (an API client). Nothing may panic; a Retry-After of digits is
//! exactly that many seconds (capped); a bearer token is never empty and is part of the header.

#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let now = chrono::DateTime::from_timestamp(1_764_000_000, 0).expect("a valid instant");
    if let Some(d) = herald::domain::classify::parse_retry_after(s, now) {
        let t = s.trim();
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            let n = t
                .parse::<u64>()
                .unwrap_or(u64::MAX)
                .min(u64::from(u32::MAX));
            assert_eq!(d, Duration::from_secs(n));
        }
    }
    if let Some(token) = herald::auth::Tokens::bearer(s) {
        assert!(!token.is_empty() && token == token.trim() && s.contains(token));
    }
});
