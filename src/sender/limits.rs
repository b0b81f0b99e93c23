//! Per-destination limits: a rate (token bucket, as GCRA) and a cap on sends in flight.
//!
//! A message is bound to one or two *keys*: its named endpoint (`endpoint:NAME`, when that
//! endpoint has limits of its own) and its host (`https://host:443`, or `smtp` for the relay).
//! It may be sent only when every key admits it. One that is not admitted is put back — due
//! again at the instant its key will admit it, its attempt not spent — so a slow or rate-limited
//! destination never holds a send slot while it waits, and the other destinations go on.
//!
//! The rate is a GCRA ("theoretical arrival time"): `per_second` sends a second on average,
//! `burst` at once after a quiet spell. A message put back for the rate *reserves* its slot, so
//! held messages come back one per slot, in the order they were held, and the one that comes back
//! at its slot is admitted without waiting again. The cap counts sends in flight per key; a
//! message over it comes back after about one recent send time of that destination.
//!
//! Limits are per Herald process (as the pauses of [`super::throttle`] are): with N processes on
//! one database, a destination sees at most N × `per_second`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

pub use crate::channels::Limit;

/// A message over its cap comes back after the destination's recent send time, within these.
const CAP_WAIT_MIN: Duration = Duration::from_millis(100);
const CAP_WAIT_MAX: Duration = Duration::from_secs(5);
/// A reservation no message came back for within this is forgotten.
const RESERVATION_TTL: chrono::TimeDelta = chrono::TimeDelta::minutes(10);

/// Why a message was not admitted, and when its key will admit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub until: DateTime<Utc>,
    pub why: HeldBy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldBy {
    Rate,
    InFlight,
}

impl HeldBy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rate => "rate_limit",
            Self::InFlight => "max_in_flight",
        }
    }
}

/// `t + by`, held at the ends of time rather than overflowing.
fn later(t: DateTime<Utc>, by: chrono::TimeDelta) -> DateTime<Utc> {
    t.checked_add_signed(by)
        .unwrap_or(if by < chrono::TimeDelta::zero() {
            DateTime::<Utc>::MIN_UTC
        } else {
            DateTime::<Utc>::MAX_UTC
        })
}

/// GCRA state of one key.
#[derive(Debug)]
struct Rate {
    /// Time between sends.
    interval: chrono::TimeDelta,
    /// How far ahead of now the theoretical arrival time may be and still admit.
    tolerance: chrono::TimeDelta,
    tat: Option<DateTime<Utc>>,
    /// Messages put back for the rate: their slot.
    reserved: HashMap<i64, DateTime<Utc>>,
}

impl Rate {
    fn new(per_second: f64, burst: u32) -> Self {
        let interval = chrono::TimeDelta::microseconds((1e6 / per_second).round().max(1.0) as i64);
        Self {
            interval,
            tolerance: interval * (burst.max(1) as i32 - 1),
            tat: None,
            reserved: HashMap::new(),
        }
    }

    /// `Ok` when `message` may go at `now` (and takes its slot), else the slot reserved for it.
    fn check(&self, message: i64, now: DateTime<Utc>) -> Result<(), DateTime<Utc>> {
        if let Some(slot) = self.reserved.get(&message) {
            return if *slot <= now { Ok(()) } else { Err(*slot) };
        }
        let tat = self.tat.unwrap_or(now).max(now);
        let allowed_at = later(tat, -self.tolerance);
        if allowed_at <= now {
            Ok(())
        } else {
            Err(allowed_at)
        }
    }

    fn take(&mut self, message: i64, now: DateTime<Utc>) {
        if self.reserved.remove(&message).is_some() {
            return;
        }
        let tat = self.tat.unwrap_or(now).max(now);
        self.tat = Some(later(tat, self.interval));
    }

    /// Reserves the next free slot for `message`; returns it.
    fn reserve(&mut self, message: i64, now: DateTime<Utc>) -> DateTime<Utc> {
        if let Some(slot) = self.reserved.get(&message) {
            return *slot;
        }
        self.reserved
            .retain(|_, slot| now - *slot < RESERVATION_TTL);
        let tat = self.tat.unwrap_or(now).max(now);
        let slot = later(tat, -self.tolerance).max(now);
        self.tat = Some(later(tat, self.interval));
        self.reserved.insert(message, slot);
        slot
    }
}

#[derive(Debug, Default)]
struct Key {
    rate: Option<Rate>,
    in_flight: u32,
    /// A smoothed recent send time, for the wait of a message over the cap.
    send_time: Option<Duration>,
}

/// The limits of one process: a key's state lives as long as the process.
#[derive(Debug, Default)]
pub struct Limits {
    keys: Mutex<HashMap<String, Key>>,
    /// Woken whenever a send ends and frees its places.
    freed: tokio::sync::Notify,
}

/// A send admitted by [`Limits::admit`]: holds its in-flight places until dropped.
#[derive(Debug)]
pub struct Permit {
    limits: Arc<Limits>,
    keys: Vec<String>,
    since: std::time::Instant,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let took = self.since.elapsed();
        let mut keys = self.limits.keys.lock().unwrap_or_else(|p| p.into_inner());
        for k in &self.keys {
            if let Some(state) = keys.get_mut(k) {
                state.in_flight = state.in_flight.saturating_sub(1);
                state.send_time = Some(match state.send_time {
                    Some(t) => (t * 7 + took) / 8,
                    None => took,
                });
            }
        }
        drop(keys);
        self.limits.freed.notify_waiters();
    }
}

impl Limits {
    /// Admits `message` under every `(key, limit)`, or says which key holds it and until when.
    /// Admission is all or nothing: a key that would admit takes nothing when another holds.
    pub fn admit(
        self: &Arc<Self>,
        message: i64,
        bound: &[(&str, Limit)],
        now: DateTime<Utc>,
    ) -> Result<Permit, Held> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        for (key, limit) in bound {
            let state = keys.entry((*key).to_owned()).or_default();
            match (limit.per_second, &state.rate) {
                (Some(per_second), None) => {
                    let burst = limit.burst_in_force().unwrap_or(1);
                    state.rate = Some(Rate::new(per_second, burst));
                }
                (None, Some(_)) => state.rate = None,
                _ => {}
            }
        }
        // First every cap (nothing taken), then every rate.
        for (key, limit) in bound {
            let state = &keys[*key];
            if let Some(cap) = limit.max_in_flight
                && state.in_flight >= cap
            {
                let wait = state
                    .send_time
                    .unwrap_or(CAP_WAIT_MIN)
                    .clamp(CAP_WAIT_MIN, CAP_WAIT_MAX);
                return Err(Held {
                    until: now + chrono::TimeDelta::from_std(wait).unwrap_or_default(),
                    why: HeldBy::InFlight,
                });
            }
        }
        let mut held: Option<&str> = None;
        for (key, _) in bound {
            if let Some(rate) = &keys[*key].rate
                && rate.check(message, now).is_err()
            {
                held = Some(key);
                break;
            }
        }
        if let Some(key) = held {
            let slot = keys
                .get_mut(key)
                .and_then(|s| s.rate.as_mut())
                .map_or(now, |r| r.reserve(message, now));
            return Err(Held {
                until: slot,
                why: HeldBy::Rate,
            });
        }
        for (key, _) in bound {
            if let Some(state) = keys.get_mut(*key) {
                if let Some(rate) = &mut state.rate {
                    rate.take(message, now);
                }
                state.in_flight += 1;
            }
        }
        Ok(Permit {
            limits: self.clone(),
            keys: bound.iter().map(|(k, _)| (*k).to_owned()).collect(),
            since: std::time::Instant::now(),
        })
    }

    /// As [`Limits::admit`], but a message over a cap waits up to `patience` for a send to the
    /// same destination to end (a fast destination frees its places within milliseconds, so its
    /// messages are not put back); held by a rate, or still over the cap after `patience`, it is
    /// `Err` as with `admit`. The wait holds the caller's send slot: `patience` bounds what a slow
    /// destination can take from the others.
    pub async fn admit_within(
        self: &Arc<Self>,
        message: i64,
        bound: &[(&str, Limit)],
        now: impl Fn() -> DateTime<Utc>,
        patience: Duration,
    ) -> Result<Permit, Held> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let freed = self.freed.notified();
            match self.admit(message, bound, now()) {
                Err(held) if held.why == HeldBy::InFlight => {
                    if tokio::time::timeout_at(deadline, freed).await.is_err() {
                        return Err(held);
                    }
                }
                other => return other,
            }
        }
    }

    /// Sends in flight under `key` now.
    pub fn in_flight(&self, key: &str) -> u32 {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(key).map_or(0, |k| k.in_flight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> DateTime<Utc> {
        "2026-12-01T10:00:00Z".parse().unwrap()
    }

    fn ms(n: i64) -> chrono::TimeDelta {
        chrono::TimeDelta::milliseconds(n)
    }

    fn rate(per_second: f64, burst: u32) -> Limit {
        Limit {
            per_second: Some(per_second),
            burst: Some(burst),
            max_in_flight: None,
        }
    }

    #[test]
    fn the_rate_admits_a_burst_then_one_per_interval_and_held_ones_keep_their_order() {
        let l = Arc::new(Limits::default());
        let bound = [("h", rate(10.0, 3))];
        // A burst of three at once …
        let permits: Vec<_> = (1..=3)
            .map(|id| l.admit(id, &bound, t0()).unwrap())
            .collect();
        drop(permits);
        // … then the next slots, 100 ms apart, reserved in the order they were asked for.
        let slots: Vec<_> = (4..=7)
            .map(|id| l.admit(id, &bound, t0()).unwrap_err())
            .collect();
        for (i, held) in slots.iter().enumerate() {
            assert_eq!(held.why, HeldBy::Rate);
            assert_eq!(held.until, t0() + ms(100 * (i as i64 + 1)), "slot {i}");
        }
        // Asking again does not move a reservation.
        assert_eq!(l.admit(5, &bound, t0() + ms(50)).unwrap_err(), slots[1]);
        // Back at its slot, a held message goes without waiting again …
        assert!(l.admit(4, &bound, t0() + ms(100)).is_ok());
        assert!(l.admit(5, &bound, t0() + ms(200)).is_ok());
        // … and a newcomer queues behind the reservations.
        assert_eq!(
            l.admit(8, &bound, t0() + ms(200)).unwrap_err().until,
            t0() + ms(500)
        );
    }

    /// The slowest rate configuration takes (one a day) with the largest burst, and slots
    /// near the end of time: no overflow, no panic.
    #[test]
    fn the_slowest_rate_and_the_end_of_time_do_not_overflow() {
        assert!(Limit::parse("x", Some(1.0 / 86_400.0), Some(100_000), None).is_ok());
        for refused in [1e-13, 1e-6, 0.0, -1.0, f64::NAN, 1e7] {
            let e = Limit::parse("x", Some(refused), None, None).unwrap_err();
            assert_eq!(e.field, "x.rate_limit_per_second", "{refused}");
        }
        let l = Arc::new(Limits::default());
        let bound = [("h", rate(1.0 / 86_400.0, 100_000))];
        for now in [t0(), DateTime::<Utc>::MAX_UTC - chrono::TimeDelta::days(1)] {
            for id in 1..=3 {
                drop(l.admit(id, &bound, now));
            }
        }
        assert_eq!(
            later(t0(), chrono::TimeDelta::MAX),
            DateTime::<Utc>::MAX_UTC
        );
        assert_eq!(
            later(t0(), chrono::TimeDelta::MIN),
            DateTime::<Utc>::MIN_UTC
        );
    }

    #[test]
    fn after_a_quiet_spell_the_burst_is_back_and_not_more() {
        let l = Arc::new(Limits::default());
        let bound = [("h", rate(2.0, 2))];
        for id in 1..=2 {
            assert!(l.admit(id, &bound, t0()).is_ok());
        }
        assert!(l.admit(3, &bound, t0()).is_err());
        let later = t0() + chrono::TimeDelta::seconds(60);
        for id in 10..=11 {
            assert!(l.admit(id, &bound, later).is_ok(), "{id}");
        }
        assert!(l.admit(12, &bound, later).is_err());
    }

    #[test]
    fn the_cap_counts_sends_in_flight_and_frees_on_drop() {
        let l = Arc::new(Limits::default());
        let cap = Limit {
            max_in_flight: Some(2),
            ..Limit::default()
        };
        let bound = [("slow", cap)];
        let a = l.admit(1, &bound, t0()).unwrap();
        let _b = l.admit(2, &bound, t0()).unwrap();
        let held = l.admit(3, &bound, t0()).unwrap_err();
        assert_eq!(held.why, HeldBy::InFlight);
        assert!(held.until > t0() && held.until <= t0() + ms(5000));
        // Another key is not held by this one's cap.
        assert!(l.admit(4, &[("fast", cap)], t0()).is_ok());
        assert_eq!(l.in_flight("slow"), 2);
        drop(a);
        assert_eq!(l.in_flight("slow"), 1);
        assert!(l.admit(3, &bound, t0()).is_ok());
    }

    #[tokio::test]
    async fn a_message_over_the_cap_waits_briefly_for_a_place() {
        let l = Arc::new(Limits::default());
        let cap = Limit {
            max_in_flight: Some(1),
            ..Limit::default()
        };
        let first = l.admit(1, &[("d", cap)], t0()).unwrap();
        // Nobody frees the place: held after the patience runs out.
        let held = l
            .admit_within(2, &[("d", cap)], t0, Duration::from_millis(20))
            .await
            .unwrap_err();
        assert_eq!(held.why, HeldBy::InFlight);
        // The place frees while it waits: admitted.
        let l2 = l.clone();
        let waiter = tokio::spawn(async move {
            l2.admit_within(2, &[("d", cap)], t0, Duration::from_secs(30))
                .await
                .is_ok()
        });
        tokio::task::yield_now().await;
        drop(first);
        assert!(waiter.await.unwrap());
    }

    #[test]
    fn admission_is_all_or_nothing_over_the_keys() {
        let l = Arc::new(Limits::default());
        let endpoint = rate(1.0, 1);
        let host = Limit {
            max_in_flight: Some(1),
            ..Limit::default()
        };
        let both = [("endpoint:billing", endpoint), ("https://h:443", host)];
        let first = l.admit(1, &both, t0()).unwrap();
        // The host's cap holds the second: the endpoint's token is not spent on it …
        assert_eq!(l.admit(2, &both, t0()).unwrap_err().why, HeldBy::InFlight);
        drop(first);
        // … so once the host frees, only the endpoint's rate (one a second) decides.
        let held = l.admit(2, &both, t0()).unwrap_err();
        assert_eq!((held.why, held.until), (HeldBy::Rate, t0() + ms(1000)));
        assert_eq!(l.in_flight("https://h:443"), 0);
        assert!(l.admit(2, &both, t0() + ms(1000)).is_ok());
    }

    #[test]
    fn no_limit_admits_everything() {
        let l = Arc::new(Limits::default());
        let permits: Vec<_> = (0..1000)
            .map(|id| l.admit(id, &[("h", Limit::default())], t0()).unwrap())
            .collect();
        assert_eq!(l.in_flight("h"), 1000);
        drop(permits);
        assert_eq!(l.in_flight("h"), 0);
        assert!(Limit::default().is_none());
    }
}
