//! The retry policy: versioned configuration and the pure backoff arithmetic.
//!
//! The version is derived from the parameters themselves and from the classification table
//! (`NAME@<8 hex>`), so two different parameter sets, or the same parameters under a changed
//! table, can never record the same version on their attempts.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::domain::InvalidField;

/// Exponential backoff with jitter, a Retry-After ceiling and an attempt budget.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub name: String,
    /// `NAME@hash-of-parameters-and-classification-table`; recorded on every attempt and on
    /// every message Herald enqueues (`retry_policy_version`).
    pub version: String,
    pub base: Duration,
    pub cap: Duration,
    pub max_attempts: u32,
    pub retry_after_max: Duration,
    /// Fraction in [0, 1): backoff delays move by ±jitter, Retry-After delays by +jitter.
    pub jitter: f64,
}

/// A delay and the reason it was chosen, in words for the attempt timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Delay {
    pub delay: Duration,
    pub reason: String,
}

/// The global policy and the endpoints' own (by endpoint name), as messages record and show
/// them.
pub fn policies(
    global: &RetryPolicy,
    endpoints: &std::collections::BTreeMap<String, RetryPolicy>,
) -> crate::domain::policies::Policies {
    crate::domain::policies::Policies::new(
        global.id(),
        endpoints.iter().map(|(n, p)| (n.clone(), p.id())),
    )
}

/// The global policy and the endpoints' own, as `herald_retry_policies` keeps them.
pub fn records(
    global: &RetryPolicy,
    endpoints: &std::collections::BTreeMap<String, RetryPolicy>,
) -> Vec<crate::storage::retry_policies::PolicyRecord> {
    std::iter::once(global)
        .chain(endpoints.values())
        .map(|p| crate::storage::retry_policies::PolicyRecord {
            version: p.version.clone(),
            name: p.name.clone(),
            max_attempts: i32::try_from(p.max_attempts).unwrap_or(i32::MAX),
            parameters: serde_json::json!({
                "base_ms": p.base.as_millis() as u64,
                "cap_ms": p.cap.as_millis() as u64,
                "jitter": p.jitter,
                "retry_after_max_ms": p.retry_after_max.as_millis() as u64,
                "max_attempts": p.max_attempts,
            })
            .to_string(),
        })
        .collect()
}

impl RetryPolicy {
    /// Its name, version and budget, as messages record and show them.
    pub fn id(&self) -> crate::domain::policies::PolicyId {
        crate::domain::policies::PolicyId {
            name: self.name.clone(),
            version: self.version.clone(),
            max_attempts: self.max_attempts,
        }
    }

    pub fn new(
        name: String,
        base_seconds: f64,
        cap_seconds: f64,
        max_attempts: u32,
        retry_after_max_seconds: f64,
        jitter: f64,
    ) -> Result<Self, InvalidField> {
        let seconds = |field: &'static str, v: f64| {
            if v.is_finite() && v > 0.0 && v <= 31_536_000.0 {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(InvalidField::new(
                    field,
                    "must be a positive number of seconds up to a year",
                ))
            }
        };
        let base = seconds("retry_base_seconds", base_seconds)?;
        let cap = seconds("retry_cap_seconds", cap_seconds)?;
        let retry_after_max = seconds("retry_after_max_seconds", retry_after_max_seconds)?;
        if cap < base {
            return Err(InvalidField::new(
                "retry_cap_seconds",
                "must not be below retry_base_seconds",
            ));
        }
        if !(1..=100).contains(&max_attempts) {
            return Err(InvalidField::new(
                "retry_max_attempts",
                "must be between 1 and 100",
            ));
        }
        if !(jitter.is_finite() && (0.0..1.0).contains(&jitter)) {
            return Err(InvalidField::new("retry_jitter", "must be in [0, 1)"));
        }
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(InvalidField::new(
                "retry_policy_name",
                "must be letters, digits, - or _",
            ));
        }
        // `backoff=` names how the delay is computed from these (`cap-mirror`: a jitter move
        // past the cap goes as far down, see [`RetryPolicy::backoff`]): a change to it is a new
        // version, as a reclassified code is.
        let canonical = format!(
            "backoff=cap-mirror;base={};cap={};max={};ra_max={};jitter={};table={}",
            base.as_micros(),
            cap.as_micros(),
            max_attempts,
            retry_after_max.as_micros(),
            jitter,
            crate::domain::classify::table_digest()
        );
        let hash = hex::encode(&Sha256::digest(canonical.as_bytes())[..4]);
        Ok(Self {
            version: format!("{name}@{hash}"),
            name,
            base,
            cap,
            max_attempts,
            retry_after_max,
            jitter,
        })
    }

    /// Exponential backoff for the retry after attempt number `attempt` (1-based):
    /// `min(cap, base · 2^(attempt-1))`, moved by ±jitter (`unit` in [0, 1) picks where). A
    /// move that would pass the cap goes as far down instead: the cap stays the longest wait,
    /// and retries at the cap keep their spread (capped after the jitter, every upward move
    /// there gave the cap itself, and half of a backlog at the cap came due at one moment).
    pub fn backoff(&self, attempt: u32, unit: f64) -> Delay {
        let exp = attempt.saturating_sub(1).min(62);
        let raw = self.base.as_secs_f64() * 2f64.powi(exp as i32);
        let cap = self.cap.as_secs_f64();
        let nominal = raw.min(cap);
        let moved = self.jitter * (2.0 * unit.clamp(0.0, 1.0) - 1.0);
        let past_cap = nominal * (1.0 + moved) > cap;
        let factor = if past_cap {
            1.0 - moved.abs()
        } else {
            1.0 + moved
        };
        let delay = whole_ms((nominal * factor).min(cap), f64::round);
        let jittered = delay.as_secs_f64();
        Delay {
            delay,
            reason: format!(
                "backoff after attempt {attempt}: min(cap {cap}s, base {}s × 2^{exp}) = {nominal:.3}s, jitter {:+.1}%{} → {jittered:.3}s",
                self.base.as_secs_f64(),
                (factor - 1.0) * 100.0,
                if past_cap {
                    " (down: never past the cap)"
                } else {
                    ""
                },
            ),
        }
    }

    /// The receiver's Retry-After, clamped to [`base`, `retry_after_max`], plus up to `jitter` of
    /// it (never earlier than asked). The floor keeps `Retry-After: 0` (or a past date) from
    /// spending the whole budget in a burst.
    pub fn after_retry_after(&self, asked: Duration, unit: f64) -> Delay {
        let floor = self.base.min(self.retry_after_max);
        let clamped = asked.clamp(floor, self.retry_after_max);
        let extra = clamped.as_secs_f64() * self.jitter * unit.clamp(0.0, 1.0);
        // Up to the millisecond: never earlier than asked.
        let delay = whole_ms(clamped.as_secs_f64() + extra, f64::ceil);
        let total = delay.as_secs_f64();
        let clamp_note = if asked > self.retry_after_max {
            format!(" clamped to {}s", self.retry_after_max.as_secs_f64())
        } else if asked < floor {
            format!(" raised to the base {}s", floor.as_secs_f64())
        } else {
            String::new()
        };
        Delay {
            delay,
            reason: format!(
                "Retry-After {}{clamp_note}, jitter +{extra:.3}s → {total:.3}s",
                seconds(asked)
            ),
        }
    }
}

/// `secs` in whole milliseconds (`round` picks how), the delay the reason then writes
/// (`→ 0.836s`) and the attempt's `delay_ms` records: both say the same (it was 835 ms beside
/// `0.836s`).
fn whole_ms(secs: f64, round: fn(f64) -> f64) -> Duration {
    Duration::from_millis(round(secs.max(0.0) * 1000.0) as u64)
}

/// A duration as the reason writes it: whole seconds as `7s`, else to the millisecond (an
/// HTTP-date's `6.311s`, not `6.310898s`).
fn seconds(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy::new("default".into(), 5.0, 3600.0, 10, 600.0, 0.2).unwrap()
    }

    #[test]
    fn the_delay_is_the_one_the_reason_writes() {
        let p = policy();
        for unit in [0.0, 0.123_456, 0.5, 0.999_9] {
            for d in [
                p.backoff(3, unit),
                p.after_retry_after(Duration::from_millis(6_310_898), unit),
            ] {
                let written = d.reason.rsplit("→ ").next().unwrap().trim_end_matches('s');
                let written_ms = (written.parse::<f64>().unwrap() * 1000.0).round() as u128;
                assert_eq!(d.delay.as_millis(), written_ms, "{}", d.reason);
                assert_eq!(d.delay.subsec_nanos() % 1_000_000, 0, "whole milliseconds");
            }
        }
        let d = p.after_retry_after(Duration::from_micros(6_310_898), 0.0);
        assert!(d.reason.starts_with("Retry-After 6.311s"), "{}", d.reason);
        let d = p.after_retry_after(Duration::from_secs(7), 0.0);
        assert!(d.reason.starts_with("Retry-After 7s,"), "{}", d.reason);
    }

    #[test]
    fn backoff_doubles_from_base_and_stops_at_cap() {
        let p = policy();
        let mid = |n| p.backoff(n, 0.5).delay;
        assert_eq!(mid(1), Duration::from_secs(5));
        assert_eq!(mid(2), Duration::from_secs(10));
        assert_eq!(mid(4), Duration::from_secs(40));
        assert_eq!(mid(10), Duration::from_secs(2560));
        assert_eq!(mid(11), Duration::from_secs(3600));
        assert_eq!(mid(4000), Duration::from_secs(3600));
    }

    #[test]
    fn jitter_is_bounded_and_never_exceeds_the_cap() {
        let p = policy();
        assert_eq!(p.backoff(3, 0.0).delay, Duration::from_secs(16));
        assert_eq!(p.backoff(3, 1.0).delay, Duration::from_secs(24));
        // At the cap an upward move goes as far down: never past it, and still spread.
        assert_eq!(p.backoff(20, 1.0).delay, Duration::from_secs(2880));
        assert_eq!(p.backoff(20, 0.0).delay, Duration::from_secs(2880));
        assert_eq!(p.backoff(20, 0.5).delay, Duration::from_secs(3600));
        let at_cap: std::collections::BTreeSet<Duration> = (0..100)
            .map(|i| p.backoff(20, i as f64 / 100.0).delay)
            .collect();
        assert!(at_cap.len() > 40, "{at_cap:?}");
        assert!(
            at_cap
                .iter()
                .all(|d| (Duration::from_secs(2880)..=Duration::from_secs(3600)).contains(d)),
            "{at_cap:?}"
        );
        assert!(
            p.backoff(20, 0.75)
                .reason
                .contains("jitter -10.0% (down: never past the cap) → 3240.000s"),
            "{}",
            p.backoff(20, 0.75).reason
        );
        for i in 0..100 {
            let d = p.backoff(3, i as f64 / 100.0).delay;
            assert!(
                d >= Duration::from_secs(16) && d <= Duration::from_secs(24),
                "{d:?}"
            );
        }
        assert!(p.backoff(3, 0.25).reason.contains("jitter -10.0%"));
    }

    #[test]
    fn retry_after_is_clamped_and_only_ever_delayed() {
        let p = policy();
        let d = p.after_retry_after(Duration::from_secs(30), 0.0);
        assert_eq!(d.delay, Duration::from_secs(30));
        let d = p.after_retry_after(Duration::from_secs(30), 0.5);
        assert_eq!(d.delay, Duration::from_secs(33));
        let d = p.after_retry_after(Duration::from_secs(86_400), 0.0);
        assert_eq!(d.delay, Duration::from_secs(600));
        assert!(d.reason.contains("clamped to 600s"), "{}", d.reason);
        let d = p.after_retry_after(Duration::ZERO, 0.0);
        assert_eq!(
            d.delay,
            Duration::from_secs(5),
            "Retry-After: 0 waits at least the base"
        );
        assert!(d.reason.contains("raised to the base 5s"), "{}", d.reason);
    }

    #[test]
    fn version_follows_the_parameters() {
        let a = policy();
        let b = RetryPolicy::new("default".into(), 5.0, 3600.0, 11, 600.0, 0.2).unwrap();
        assert!(a.version.starts_with("default@"));
        assert_ne!(a.version, b.version);
        assert_eq!(a.version, policy().version);
    }

    #[test]
    fn nonsense_is_refused_with_the_key() {
        let bad = |r: Result<RetryPolicy, InvalidField>| r.unwrap_err().field;
        assert_eq!(
            bad(RetryPolicy::new("d".into(), 0.0, 1.0, 3, 1.0, 0.1)),
            "retry_base_seconds"
        );
        assert_eq!(
            bad(RetryPolicy::new("d".into(), 5.0, 1.0, 3, 1.0, 0.1)),
            "retry_cap_seconds"
        );
        assert_eq!(
            bad(RetryPolicy::new("d".into(), 1.0, 1.0, 0, 1.0, 0.1)),
            "retry_max_attempts"
        );
        assert_eq!(
            bad(RetryPolicy::new("d".into(), 1.0, 1.0, 3, 1.0, 1.5)),
            "retry_jitter"
        );
        assert_eq!(
            bad(RetryPolicy::new("a b".into(), 1.0, 1.0, 3, 1.0, 0.1)),
            "retry_policy_name"
        );
    }
}
