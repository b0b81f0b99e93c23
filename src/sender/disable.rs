//! Automatic disabling of a named endpoint that keeps failing (`disable_after_failures`,
//! `disable_after_seconds`): failed attempts in a row are counted per endpoint; when the count
//! reaches the threshold and the streak spans at least the period, the endpoint is disabled in
//! the database (every process stops sending to it) until an explicit call enables it again.
//! Its messages stay queued, their attempts unspent.
//!
//! What counts is [`effect`], a plain function. Streaks are counted per process.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use crate::channels::webhook::AutoDisable;
use crate::domain::AttemptClass;

/// What an attempt's class does to its endpoint's streak of failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The endpoint answered: the streak ends.
    Reset,
    /// One more failure.
    Fail,
    /// Says nothing of the endpoint's health.
    Neither,
}

/// Accepted and conflict (409: it may already have the message) show a working endpoint; a
/// rate limit is the receiver pacing Herald, not failing; everything else — errors, timeouts,
/// refused connections, permanent refusals — is a failure.
pub fn effect(class: AttemptClass) -> Effect {
    match class {
        AttemptClass::Accepted | AttemptClass::Conflict => Effect::Reset,
        AttemptClass::RateLimited | AttemptClass::Exhausted => Effect::Neither,
        AttemptClass::Transient
        | AttemptClass::NotSent
        | AttemptClass::Ambiguous
        | AttemptClass::Permanent => Effect::Fail,
    }
}

/// A streak that reached its rule's threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tripped {
    pub failures: u32,
    pub since: DateTime<Utc>,
}

/// Streaks of failures per endpoint, in one process.
#[derive(Debug, Default)]
pub struct Streaks {
    by_endpoint: Mutex<HashMap<String, (u32, DateTime<Utc>)>>,
}

impl Streaks {
    /// Forgets `endpoint`'s streak (it was enabled again: failures before that do not count).
    pub fn reset(&self, endpoint: &str) {
        let mut map = self.by_endpoint.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(endpoint);
    }

    /// Counts one attempt's class for `endpoint`; `Some` when the streak trips `rule` now (the
    /// streak then starts again from zero).
    pub fn observe(
        &self,
        endpoint: &str,
        class: AttemptClass,
        at: DateTime<Utc>,
        rule: AutoDisable,
    ) -> Option<Tripped> {
        let mut map = self.by_endpoint.lock().unwrap_or_else(|p| p.into_inner());
        match effect(class) {
            Effect::Neither => None,
            Effect::Reset => {
                map.remove(endpoint);
                None
            }
            Effect::Fail => {
                let (count, since) = map.entry(endpoint.to_owned()).or_insert((0, at));
                *count += 1;
                let span = (at - *since).to_std().unwrap_or_default();
                if *count >= rule.failures && span >= rule.over {
                    let tripped = Tripped {
                        failures: *count,
                        since: *since,
                    };
                    map.remove(endpoint);
                    Some(tripped)
                } else {
                    None
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        "2026-12-01T10:00:00Z".parse::<DateTime<Utc>>().unwrap() + chrono::TimeDelta::seconds(s)
    }

    #[test]
    fn every_class_has_an_effect() {
        use AttemptClass::*;
        for c in AttemptClass::ALL {
            let want = match c {
                Accepted | Conflict => Effect::Reset,
                RateLimited | Exhausted => Effect::Neither,
                _ => Effect::Fail,
            };
            assert_eq!(effect(*c), want, "{c}");
        }
    }

    #[test]
    fn an_enabled_endpoint_starts_a_new_streak() {
        let rule = AutoDisable {
            failures: 3,
            over: Duration::ZERO,
        };
        let s = Streaks::default();
        // Sends in flight when it was disabled fail and count…
        for t in [0, 1] {
            assert_eq!(s.observe("a", AttemptClass::Transient, at(t), rule), None);
        }
        // …but not once it is enabled again: two failures more do not trip it.
        s.reset("a");
        for t in [2, 3] {
            assert_eq!(s.observe("a", AttemptClass::Transient, at(t), rule), None);
        }
        assert!(
            s.observe("a", AttemptClass::Transient, at(4), rule)
                .is_some()
        );
    }

    #[test]
    fn a_streak_trips_at_the_count_once_it_spans_the_period() {
        let rule = AutoDisable {
            failures: 3,
            over: Duration::from_secs(60),
        };
        let s = Streaks::default();
        for t in [0, 1, 2, 30] {
            assert_eq!(
                s.observe("a", AttemptClass::Transient, at(t), rule),
                None,
                "{t}"
            );
        }
        // Four failures, but only 59 s apart; the 61st second trips it.
        assert_eq!(s.observe("a", AttemptClass::Permanent, at(59), rule), None);
        assert_eq!(
            s.observe("a", AttemptClass::NotSent, at(61), rule),
            Some(Tripped {
                failures: 6,
                since: at(0)
            })
        );
        // It starts again after tripping.
        assert_eq!(s.observe("a", AttemptClass::Transient, at(62), rule), None);
    }

    #[test]
    fn an_answer_ends_the_streak_and_a_rate_limit_does_not() {
        let rule = AutoDisable {
            failures: 2,
            over: Duration::ZERO,
        };
        let s = Streaks::default();
        assert_eq!(s.observe("a", AttemptClass::Transient, at(0), rule), None);
        assert_eq!(s.observe("a", AttemptClass::RateLimited, at(1), rule), None);
        assert_eq!(s.observe("b", AttemptClass::Transient, at(1), rule), None);
        assert!(
            s.observe("a", AttemptClass::Ambiguous, at(2), rule)
                .is_some()
        );
        assert_eq!(s.observe("b", AttemptClass::Accepted, at(3), rule), None);
        assert_eq!(s.observe("b", AttemptClass::Transient, at(4), rule), None);
        assert_eq!(s.observe("b", AttemptClass::Conflict, at(5), rule), None);
        assert_eq!(s.observe("b", AttemptClass::Transient, at(6), rule), None);
    }
}
