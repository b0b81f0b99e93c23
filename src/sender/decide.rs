//! Pure decisions of the control plane: classify a receiver's answer, then choose the next state
//! and delay. No I/O here; see DESIGN.md "Response classification".

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::{AttemptClass, Semantics, State};
use crate::sender::policy::RetryPolicy;

/// What happens to a message after an attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub state: State,
    /// The class that decided the state (`exhausted` when the budget ran out); `None` on success.
    pub error_class: Option<AttemptClass>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub delay: Option<Duration>,
    pub reason: String,
}

/// The attempt just made, as far as the decision needs it.
#[derive(Debug, Clone, Copy)]
pub struct AttemptFacts {
    pub class: AttemptClass,
    /// Retry-After the receiver asked for, when honoured for its status.
    pub retry_after: Option<Duration>,
    /// 1-based number of the attempt just made within its series (see [`series_attempt`]): the
    /// budget and the backoff count from the start of the series.
    pub attempt: u32,
    pub max_attempts: u32,
    pub semantics: Semantics,
}

/// The number of an attempt within its attempt series: `attempts` counts every attempt the
/// message ever had, `attempt_base` is what it was when the series began (0 for the first series;
/// a replay starts a new series at `attempts`). A replayed message thus gets its whole budget
/// again, and its backoff starts over from the base delay; a series that dead-letters again stays
/// dead until someone replays it again.
pub fn series_attempt(attempts: i32, attempt_base: i32) -> u32 {
    u32::try_from(attempts.saturating_sub(attempt_base.max(0))).unwrap_or(0)
}

/// Next state for an attempt's outcome. `unit` in [0, 1) drives jitter (random in production,
/// fixed in tests).
pub fn decide(
    facts: AttemptFacts,
    policy: &RetryPolicy,
    now: DateTime<Utc>,
    unit: f64,
) -> Decision {
    let terminal = |state, class: Option<AttemptClass>, reason: &str| Decision {
        state,
        error_class: class,
        next_attempt_at: None,
        delay: None,
        reason: reason.to_owned(),
    };
    match (facts.class, facts.semantics) {
        (AttemptClass::Accepted, _) => {
            return terminal(State::Delivered, None, "accepted by the receiver");
        }
        (AttemptClass::Conflict, _) => {
            return terminal(
                State::Unconfirmed,
                Some(AttemptClass::Conflict),
                "409 conflict: the receiver may already have this event; settle by event id, no blind retry",
            );
        }
        (AttemptClass::Permanent, _) => {
            return terminal(
                State::DeadLetter,
                Some(AttemptClass::Permanent),
                "permanent refusal: dead-lettered at once",
            );
        }
        (AttemptClass::Ambiguous, Semantics::AtMostOnce) => {
            return terminal(
                State::Unconfirmed,
                Some(AttemptClass::Ambiguous),
                "ambiguous outcome under at_most_once: never repeated automatically",
            );
        }
        (AttemptClass::Exhausted, _) => {
            return terminal(
                State::DeadLetter,
                Some(AttemptClass::Exhausted),
                "attempt budget spent",
            );
        }
        _ => {}
    }
    if facts.attempt >= facts.max_attempts {
        return terminal(
            State::DeadLetter,
            Some(AttemptClass::Exhausted),
            &format!(
                "attempt budget spent ({} of {}); last attempt was {}",
                facts.attempt, facts.max_attempts, facts.class
            ),
        );
    }
    let chosen = match (facts.class, facts.retry_after) {
        (AttemptClass::RateLimited | AttemptClass::Transient, Some(asked)) => {
            policy.after_retry_after(asked, unit)
        }
        _ => policy.backoff(facts.attempt, unit),
    };
    let next = now + chrono::Duration::from_std(chosen.delay).unwrap_or(chrono::Duration::MAX);
    Decision {
        state: State::Retryable,
        error_class: Some(facts.class),
        next_attempt_at: Some(next),
        delay: Some(chosen.delay),
        reason: format!("{}: {}", facts.class, chosen.reason),
    }
}

/// Whether a send at `next` would come after the message's `expires_at`: it could never be
/// made. The one rule for a retry after an answer ([`within_expiry`]) and a claimed message held
/// back without a request (the sender's `put_back`).
pub fn too_late(next: DateTime<Utc>, expires_at: Option<DateTime<Utc>>) -> bool {
    expires_at.is_some_and(|expiry| next > expiry)
}

/// A retry set after the message's `expires_at` could never be made: the message ends `expired`
/// now (no more requests), with the class that decided it. Before, it read `retryable` for up
/// to the whole backoff after it could no longer be sent. (Due at its expiry instead, it could be
/// claimed a moment before it on PostgreSQL, whose clock the due time is moved to, and sent
/// sooner than the receiver's `Retry-After` asked.)
pub fn within_expiry(mut decision: Decision, expires_at: Option<DateTime<Utc>>) -> Decision {
    if let (State::Retryable, Some(next), Some(expiry)) =
        (decision.state, decision.next_attempt_at, expires_at)
        && too_late(next, Some(expiry))
    {
        let at = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        decision.reason = format!(
            "{}; the next attempt ({}) would come after its expires_at ({}): expired",
            decision.reason,
            at(next),
            at(expiry)
        );
        decision.state = State::Expired;
        decision.next_attempt_at = None;
        decision.delay = None;
    }
    decision
}

/// A retry set before the end of the pause its own answer started ([`super::throttle`]) is set
/// at that end instead: claimed sooner it would only be put back (the probe's attempt said
/// "7.6 s later" while the relay stayed paused for 16). `decided_at` is when `decision` was
/// made (its delay runs from it).
pub fn not_before_pause(
    mut decision: Decision,
    paused_until: DateTime<Utc>,
    decided_at: DateTime<Utc>,
) -> Decision {
    if let (State::Retryable, Some(next)) = (decision.state, decision.next_attempt_at)
        && next < paused_until
    {
        let at = paused_until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        decision.reason = format!(
            "{}; its destination paused until {at}: not before",
            decision.reason
        );
        decision.next_attempt_at = Some(paused_until);
        decision.delay = (paused_until - decided_at).to_std().ok();
    }
    decision
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_within_the_pause_its_answer_started_waits_for_its_end() {
        let p = policy();
        let d = decide(facts(AttemptClass::NotSent), &p, now(), 0.5);
        let next = d.next_attempt_at.unwrap();
        let until = next + chrono::Duration::seconds(10);
        let held = not_before_pause(d.clone(), until, now());
        assert_eq!(held.next_attempt_at, Some(until));
        assert_eq!(held.delay, (until - now()).to_std().ok());
        assert!(
            held.reason.ends_with(&format!(
                "; its destination paused until {}: not before",
                until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            )),
            "{}",
            held.reason
        );
        // A retry after the pause, or no retry at all: unchanged.
        let early = next - chrono::Duration::seconds(1);
        assert_eq!(not_before_pause(d.clone(), early, now()), d);
        let dead = decide(facts(AttemptClass::Permanent), &p, now(), 0.5);
        assert_eq!(not_before_pause(dead.clone(), until, now()), dead);
    }

    #[test]
    fn a_send_is_too_late_only_after_the_expiry() {
        let expiry = now();
        let ms = chrono::Duration::milliseconds(1);
        assert!(!too_late(expiry - ms, Some(expiry)));
        assert!(
            !too_late(expiry, Some(expiry)),
            "at the expiry it may still go"
        );
        assert!(too_late(expiry + ms, Some(expiry)));
        assert!(!too_late(expiry + chrono::Duration::days(9999), None));
    }

    #[test]
    fn a_retry_after_the_expiry_ends_the_message_expired() {
        let mut f = facts(AttemptClass::RateLimited);
        f.retry_after = Some(Duration::from_secs(100));
        let d = decide(f, &policy(), now(), 0.5);
        assert_eq!(d.state, State::Retryable);
        let expiry = now() + chrono::Duration::seconds(30);
        let ended = within_expiry(d.clone(), Some(expiry));
        assert_eq!(ended.state, State::Expired);
        assert_eq!(ended.error_class, Some(AttemptClass::RateLimited));
        assert_eq!((ended.next_attempt_at, ended.delay), (None, None));
        assert!(
            ended.reason.contains("would come after its expires_at"),
            "{}",
            ended.reason
        );
        // An expiry after the retry, none, or a final state: unchanged.
        let later = now() + chrono::Duration::seconds(300);
        assert_eq!(within_expiry(d.clone(), Some(later)), d);
        assert_eq!(within_expiry(d.clone(), None), d);
        let delivered = decide(facts(AttemptClass::Accepted), &policy(), now(), 0.5);
        assert_eq!(within_expiry(delivered.clone(), Some(now())), delivered);
    }

    fn policy() -> RetryPolicy {
        RetryPolicy::new("default".into(), 1.0, 60.0, 5, 120.0, 0.2).unwrap()
    }

    fn now() -> DateTime<Utc> {
        "2026-11-30T12:00:00Z".parse().unwrap()
    }

    fn facts(class: AttemptClass) -> AttemptFacts {
        AttemptFacts {
            class,
            retry_after: None,
            attempt: 1,
            max_attempts: 5,
            semantics: Semantics::AtLeastOnce,
        }
    }

    #[test]
    fn every_class_under_both_semantics() {
        use AttemptClass::*;
        use Semantics::*;
        let expect = [
            (Accepted, AtLeastOnce, State::Delivered, None),
            (Accepted, AtMostOnce, State::Delivered, None),
            (Conflict, AtLeastOnce, State::Unconfirmed, Some(Conflict)),
            (Conflict, AtMostOnce, State::Unconfirmed, Some(Conflict)),
            (
                RateLimited,
                AtLeastOnce,
                State::Retryable,
                Some(RateLimited),
            ),
            (RateLimited, AtMostOnce, State::Retryable, Some(RateLimited)),
            (Transient, AtLeastOnce, State::Retryable, Some(Transient)),
            (Transient, AtMostOnce, State::Retryable, Some(Transient)),
            (NotSent, AtLeastOnce, State::Retryable, Some(NotSent)),
            (NotSent, AtMostOnce, State::Retryable, Some(NotSent)),
            (Ambiguous, AtLeastOnce, State::Retryable, Some(Ambiguous)),
            (Ambiguous, AtMostOnce, State::Unconfirmed, Some(Ambiguous)),
            (Permanent, AtLeastOnce, State::DeadLetter, Some(Permanent)),
            (Permanent, AtMostOnce, State::DeadLetter, Some(Permanent)),
            (Exhausted, AtLeastOnce, State::DeadLetter, Some(Exhausted)),
        ];
        for (class, semantics, state, error_class) in expect {
            let d = decide(
                AttemptFacts {
                    semantics,
                    ..facts(class)
                },
                &policy(),
                now(),
                0.5,
            );
            assert_eq!(
                (d.state, d.error_class),
                (state, error_class),
                "{class} {semantics}"
            );
            assert_eq!(
                d.next_attempt_at.is_some(),
                state == State::Retryable,
                "{class}"
            );
            assert!(!d.reason.is_empty());
        }
    }

    #[test]
    fn the_budget_counts_the_attempts_of_the_current_series() {
        assert_eq!(series_attempt(3, 0), 3);
        assert_eq!(
            series_attempt(5, 4),
            1,
            "the first attempt after a replay at 4"
        );
        assert_eq!(series_attempt(8, 4), 4);
        assert_eq!(series_attempt(0, 0), 0);
        assert_eq!(series_attempt(2, 4), 0, "never negative");
        assert_eq!(series_attempt(2, -1), 2, "a negative base counts as 0");
        // A replayed message that failed 4 times before: its 5th attempt overall is the first of
        // the new series and is retried; the series' 4th (attempt 8) spends the budget again.
        let at = |attempts| {
            decide(
                AttemptFacts {
                    attempt: series_attempt(attempts, 4),
                    max_attempts: 4,
                    ..facts(AttemptClass::Transient)
                },
                &policy(),
                now(),
                0.5,
            )
        };
        assert_eq!(at(5).state, State::Retryable);
        assert_eq!(
            at(5).delay,
            Some(Duration::from_secs(1)),
            "backoff starts over"
        );
        assert_eq!(at(7).state, State::Retryable);
        assert_eq!(at(8).state, State::DeadLetter);
        assert_eq!(at(8).error_class, Some(AttemptClass::Exhausted));
    }

    #[test]
    fn budget_exhaustion_dead_letters_and_names_the_last_class() {
        let d = decide(
            AttemptFacts {
                attempt: 5,
                ..facts(AttemptClass::Transient)
            },
            &policy(),
            now(),
            0.5,
        );
        assert_eq!(d.state, State::DeadLetter);
        assert_eq!(d.error_class, Some(AttemptClass::Exhausted));
        assert!(
            d.reason.contains("last attempt was transient"),
            "{}",
            d.reason
        );
        // A permanent answer on the last attempt stays permanent.
        let d = decide(
            AttemptFacts {
                attempt: 5,
                ..facts(AttemptClass::Permanent)
            },
            &policy(),
            now(),
            0.5,
        );
        assert_eq!(d.error_class, Some(AttemptClass::Permanent));
    }

    #[test]
    fn retry_after_wins_over_backoff_for_429_and_503() {
        let d = decide(
            AttemptFacts {
                retry_after: Some(Duration::from_secs(30)),
                attempt: 1,
                ..facts(AttemptClass::RateLimited)
            },
            &policy(),
            now(),
            0.0,
        );
        assert_eq!(d.delay, Some(Duration::from_secs(30)));
        assert_eq!(
            d.next_attempt_at,
            Some(now() + chrono::Duration::seconds(30))
        );
        assert!(
            d.reason.starts_with("rate_limited: Retry-After 30s"),
            "{}",
            d.reason
        );
        // Without Retry-After: backoff (base 1s at attempt 1, jitter at unit 0.5 is zero).
        let d = decide(
            AttemptFacts {
                attempt: 3,
                ..facts(AttemptClass::RateLimited)
            },
            &policy(),
            now(),
            0.5,
        );
        assert_eq!(d.delay, Some(Duration::from_secs(4)));
        assert!(d.reason.contains("backoff after attempt 3"), "{}", d.reason);
        // Retry-After is clamped to the policy's ceiling.
        let d = decide(
            AttemptFacts {
                retry_after: Some(Duration::from_secs(10_000)),
                ..facts(AttemptClass::Transient)
            },
            &policy(),
            now(),
            0.0,
        );
        assert_eq!(d.delay, Some(Duration::from_secs(120)));
    }
}
