//! Per-destination slow-down. A receiver that says "slow down" — HTTP 429 or a 503 with
//! `Retry-After`, an SMTP 421 — or that answers with a burst of transient errors slows **every**
//! message bound to it, not only the one that got the answer: until the pause ends, messages for
//! that destination are put back (`retryable` at the pause's end) without a request and without
//! spending an attempt.
//!
//! A destination is a webhook URL's scheme, host and port, or the SMTP relay. The pause is kept
//! per Herald process: each process learns it from the first such answer it sees.
//! [`Throttle::observe`] and [`Throttle::paused_until`] are the whole interface; the rule is
//! [`pause_for`], a plain function.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::AttemptClass;

/// Transient answers from one destination within [`BURST_WINDOW`] that count as a burst.
pub const BURST_COUNT: usize = 5;
/// The window of a burst.
pub const BURST_WINDOW: Duration = Duration::from_secs(10);

/// What one answer tells about its destination.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answer {
    pub class: AttemptClass,
    /// HTTP status or SMTP reply code.
    pub status: Option<u16>,
    /// The delay the retry policy chose for this message (Retry-After honoured, clamped,
    /// jittered), when it will be retried.
    pub delay: Option<Duration>,
    /// The receiver asked to wait (a `Retry-After` it sent).
    pub asked: bool,
    pub is_smtp: bool,
}

/// How long a destination should be left alone after `answer`, given how many transient answers
/// it gave within the burst window before it (`recent_transient`). `None`: no pause.
///
/// - 429 (and a 503 that carried Retry-After, already in `delay`): the chosen delay;
/// - SMTP 421 ("service not available, closing channel"): the chosen delay;
/// - the [`BURST_COUNT`]-th transient answer within [`BURST_WINDOW`]: the chosen delay;
/// - anything else: none.
pub fn pause_for(answer: &Answer, recent_transient: usize) -> Option<Duration> {
    let slow_down = match (answer.class, answer.status, answer.is_smtp) {
        (AttemptClass::RateLimited, _, _) => true,
        (AttemptClass::Transient, Some(503), false) => answer.asked,
        (AttemptClass::Transient, Some(421), true) => true,
        (AttemptClass::Transient, _, _) => recent_transient + 1 >= BURST_COUNT,
        _ => false,
    };
    if slow_down { answer.delay } else { None }
}

#[derive(Debug, Default)]
struct Entry {
    paused_until: Option<DateTime<Utc>>,
    transient: Vec<DateTime<Utc>>,
}

/// The pauses of one process.
#[derive(Debug, Default)]
pub struct Throttle {
    entries: Mutex<HashMap<String, Entry>>,
}

impl Throttle {
    /// Until when `destination` is paused, if it is at `now`.
    pub fn paused_until(&self, destination: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(destination)
            .and_then(|e| e.paused_until)
            .filter(|until| *until > now)
    }

    /// Records an answer from `destination`; returns the pause it started, if any.
    pub fn observe(
        &self,
        destination: &str,
        answer: &Answer,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let entry = entries.entry(destination.to_owned()).or_default();
        let window = chrono::Duration::from_std(BURST_WINDOW).unwrap_or_default();
        entry.transient.retain(|t| now - *t < window);
        let pause = pause_for(answer, entry.transient.len());
        if answer.class == AttemptClass::Transient {
            entry.transient.push(now);
        } else if answer.class == AttemptClass::Accepted {
            entry.transient.clear();
        }
        let until = now + chrono::Duration::from_std(pause?).unwrap_or_default();
        // A pause only ever grows: a shorter one learnt later does not end a longer one.
        let until = entry.paused_until.map_or(until, |u| u.max(until));
        entry.paused_until = Some(until);
        entry.transient.clear();
        Some(until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(class: AttemptClass, status: u16, delay: Option<u64>, is_smtp: bool) -> Answer {
        Answer {
            class,
            status: Some(status),
            delay: delay.map(Duration::from_secs),
            asked: status == 503,
            is_smtp,
        }
    }

    #[test]
    fn which_answers_pause_a_destination() {
        use AttemptClass::*;
        let d = Some(Duration::from_secs(30));
        assert_eq!(pause_for(&answer(RateLimited, 429, Some(30), false), 0), d);
        assert_eq!(pause_for(&answer(Transient, 503, Some(30), false), 0), d);
        let unasked = Answer {
            asked: false,
            ..answer(Transient, 503, Some(30), false)
        };
        assert_eq!(pause_for(&unasked, 0), None, "a 503 without Retry-After");
        assert_eq!(pause_for(&answer(Transient, 421, Some(30), true), 0), d);
        // A lone 500, an HTTP 421 (misdirected request), a 4xx SMTP reply: no pause …
        assert_eq!(pause_for(&answer(Transient, 500, Some(30), false), 0), None);
        assert_eq!(pause_for(&answer(Permanent, 421, None, false), 0), None);
        assert_eq!(pause_for(&answer(Transient, 451, Some(30), true), 0), None);
        // … until they come in a burst.
        assert_eq!(
            pause_for(&answer(Transient, 451, Some(30), true), BURST_COUNT - 1),
            d
        );
        assert_eq!(pause_for(&answer(Accepted, 200, None, false), 99), None);
        // The last attempt (no retry, no delay) pauses nothing.
        assert_eq!(pause_for(&answer(RateLimited, 429, None, false), 0), None);
    }

    #[test]
    fn a_pause_holds_every_message_of_the_destination_until_it_ends() {
        let t = Throttle::default();
        let now: DateTime<Utc> = "2026-12-01T10:00:00Z".parse().unwrap();
        let a = answer(AttemptClass::RateLimited, 429, Some(30), false);
        let until = t.observe("https://a.example:443", &a, now).unwrap();
        assert_eq!(until, now + chrono::Duration::seconds(30));
        assert_eq!(t.paused_until("https://a.example:443", now), Some(until));
        assert_eq!(t.paused_until("https://b.example:443", now), None);
        assert_eq!(
            t.paused_until("https://a.example:443", until),
            None,
            "over at its end"
        );
        // A shorter pause learnt later does not shorten it.
        let short = answer(AttemptClass::RateLimited, 429, Some(5), false);
        assert_eq!(t.observe("https://a.example:443", &short, now), Some(until));
    }

    #[test]
    fn a_burst_of_transient_answers_pauses_and_a_success_resets_the_count() {
        let t = Throttle::default();
        let now: DateTime<Utc> = "2026-12-01T10:00:00Z".parse().unwrap();
        let e = answer(AttemptClass::Transient, 500, Some(8), false);
        for i in 0..BURST_COUNT - 1 {
            assert_eq!(
                t.observe("d", &e, now + chrono::Duration::seconds(i as i64)),
                None
            );
        }
        let ok = answer(AttemptClass::Accepted, 200, None, false);
        assert_eq!(t.observe("d", &ok, now), None);
        for i in 0..BURST_COUNT - 1 {
            assert_eq!(
                t.observe("d", &e, now + chrono::Duration::seconds(i as i64)),
                None
            );
        }
        let at = now + chrono::Duration::seconds(5);
        assert_eq!(
            t.observe("d", &e, at),
            Some(at + chrono::Duration::seconds(8))
        );
        // Spread out over more than the window: no burst.
        let t = Throttle::default();
        for i in 0..BURST_COUNT * 2 {
            assert_eq!(
                t.observe("d", &e, now + chrono::Duration::seconds(11 * i as i64)),
                None
            );
        }
    }
}
