//! The header parsers Herald applies to what others send: `Retry-After` (a receiver's answer)
//! and `Authorization: Bearer` (an API client). Nothing may panic. A Retry-After of digits is
//! exactly that many seconds, capped at u32::MAX (computed here without the parser's own
//! arithmetic); anything else is a delay exactly when `httpdate` reads it as a date (the parser
//! uses that same crate, so this half checks the partition and the absence of panics, not the
//! date arithmetic). A bearer token is never empty, never padded, and part of the header.

#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let now = chrono::DateTime::from_timestamp(1_764_000_000, 0).expect("a valid instant");
    let got = herald::domain::classify::parse_retry_after(s, now);
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        let digits = t.trim_start_matches('0');
        let secs = if digits.len() > 10 {
            u64::from(u32::MAX)
        } else {
            digits.parse::<u64>().unwrap_or(0).min(u64::from(u32::MAX))
        };
        assert_eq!(got, Some(Duration::from_secs(secs)), "{s:?}");
    } else {
        assert_eq!(
            got.is_some(),
            httpdate::parse_http_date(t).is_ok(),
            "{s:?} gave {got:?}"
        );
    }
    if let Some(token) = herald::auth::Tokens::bearer(s) {
        assert!(!token.is_empty() && token == token.trim() && s.contains(token));
    }
});
