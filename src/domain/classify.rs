//! The classification table of DESIGN.md "Response classification": a receiver's answer (an HTTP
//! status, an SMTP reply code, a Retry-After value) as an [`AttemptClass`]. Pure functions; the
//! channels classify with them and the retry policy's version covers them ([`table_digest`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use super::AttemptClass;

/// Bumped when a classification rule changes in a way the code tables cannot see (how a reply
/// is read, which stage of an SMTP session a failure counts to).
/// 2: an SMTP reply before the envelope (greeting, STARTTLS, AUTH) is `not_sent`, whatever its code.
/// 3: SMTP recipients refused at RCPT TO (other than 421) no longer fail the message while another
/// is accepted (`accepted`, the refused ones listed); all refused: transient if any reply is 4xx.
/// 4: an SMTP 530 in the envelope (authentication or STARTTLS required) is `not_sent`.
const TABLE_REVISION: u32 = 4;

/// Class of an HTTP status code. 3xx counts as permanent: Herald does not follow redirects, a
/// moved endpoint is a configuration error to fix, not to retry.
pub fn classify_http_status(status: u16) -> AttemptClass {
    match status {
        200..=299 => AttemptClass::Accepted,
        409 => AttemptClass::Conflict,
        429 => AttemptClass::RateLimited,
        408 | 425 | 500 | 502 | 503 | 504 => AttemptClass::Transient,
        // Other server errors (507, 520-ish proxies …): the server's trouble, worth a retry.
        500..=599 => AttemptClass::Transient,
        _ => AttemptClass::Permanent,
    }
}

/// Whether the receiver's Retry-After is honoured for this status.
pub fn honours_retry_after(status: u16) -> bool {
    matches!(status, 429 | 503)
}

/// Class of an SMTP reply code: 2xx accepted, 4xx transient, 5xx (and anything odd) permanent.
pub fn classify_smtp_code(code: u16) -> AttemptClass {
    match code {
        200..=299 => AttemptClass::Accepted,
        400..=499 => AttemptClass::Transient,
        _ => AttemptClass::Permanent,
    }
}

/// Parses a Retry-After value: delta-seconds or an HTTP-date (relative to `now`; a past date
/// means "now"). Anything else is ignored (`None`).
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(
            value
                .parse::<u64>()
                .unwrap_or(u64::MAX)
                .min(u32::MAX as u64),
        ));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let at: DateTime<Utc> = at.into();
    Some((at - now).to_std().unwrap_or(Duration::ZERO))
}

/// A digest of the whole classification table as these functions define it: every HTTP status
/// 100–599 with its class and whether Retry-After is honoured, every SMTP code 200–599, and
/// [`TABLE_REVISION`]. The retry policy's version includes it, so changing a code's class changes
/// the version recorded on every later attempt.
pub fn table_digest() -> String {
    digest_of(
        classify_http_status,
        honours_retry_after,
        classify_smtp_code,
    )
}

fn digest_of(
    http: impl Fn(u16) -> AttemptClass,
    retry_after: impl Fn(u16) -> bool,
    smtp: impl Fn(u16) -> AttemptClass,
) -> String {
    let mut h = Sha256::new();
    h.update(format!("revision={TABLE_REVISION};"));
    for code in 100..=599u16 {
        h.update(format!("http {code}={} {};", http(code), retry_after(code)));
    }
    for code in 200..=599u16 {
        h.update(format!("smtp {code}={};", smtp(code)));
    }
    hex::encode(&h.finalize()[..4])
}

#[cfg(test)]
mod tests {
    use super::*;

    const PINNED: &str = "6a0706ee";

    #[test]
    fn http_classification_table() {
        for s in [200, 201, 202, 204, 299] {
            assert_eq!(classify_http_status(s), AttemptClass::Accepted, "{s}");
        }
        assert_eq!(classify_http_status(409), AttemptClass::Conflict);
        assert_eq!(classify_http_status(429), AttemptClass::RateLimited);
        for s in [408, 425, 500, 502, 503, 504, 507] {
            assert_eq!(classify_http_status(s), AttemptClass::Transient, "{s}");
        }
        for s in [
            301, 302, 400, 401, 403, 404, 405, 410, 413, 415, 422, 451, 100,
        ] {
            assert_eq!(classify_http_status(s), AttemptClass::Permanent, "{s}");
        }
        assert!(honours_retry_after(429) && honours_retry_after(503));
        assert!(!honours_retry_after(500) && !honours_retry_after(200));
    }

    #[test]
    fn smtp_classification() {
        assert_eq!(classify_smtp_code(250), AttemptClass::Accepted);
        assert_eq!(classify_smtp_code(451), AttemptClass::Transient);
        assert_eq!(classify_smtp_code(421), AttemptClass::Transient);
        assert_eq!(classify_smtp_code(550), AttemptClass::Permanent);
        assert_eq!(classify_smtp_code(554), AttemptClass::Permanent);
    }

    #[test]
    fn retry_after_parses_both_forms() {
        let now: DateTime<Utc> = "2015-10-21T07:28:00Z".parse().unwrap();
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:30:00 GMT", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("-5", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("", now), None);
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(Duration::from_secs(u32::MAX as u64))
        );
    }

    /// The digest of today's table, pinned: a change to any code's class, or to which statuses
    /// honour Retry-After, fails here first. Then check the change is meant, bump
    /// `TABLE_REVISION` if only a rule the table cannot see changed, and pin the new value —
    /// every attempt after the release records a new policy version.
    #[test]
    fn the_digest_of_todays_table_is_pinned() {
        assert_eq!(table_digest(), PINNED);
    }

    #[test]
    fn the_digest_follows_every_code_of_the_table() {
        let real = table_digest();
        assert_eq!(real, table_digest(), "stable");
        assert_eq!(real.len(), 8);
        // One code moved to another class changes the digest, whichever table it is in.
        let http_409_transient = digest_of(
            |c| {
                if c == 409 {
                    AttemptClass::Transient
                } else {
                    classify_http_status(c)
                }
            },
            honours_retry_after,
            classify_smtp_code,
        );
        assert_ne!(real, http_409_transient);
        let ra_on_502 = digest_of(
            classify_http_status,
            |c| c == 502 || honours_retry_after(c),
            classify_smtp_code,
        );
        assert_ne!(real, ra_on_502);
        let smtp_552_transient = digest_of(classify_http_status, honours_retry_after, |c| {
            if c == 552 {
                AttemptClass::Transient
            } else {
                classify_smtp_code(c)
            }
        });
        assert_ne!(real, smtp_552_transient);
    }
}
