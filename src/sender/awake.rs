//! Staying awake (PostgreSQL, listening): while a sender's claims keep finding rows, it promises
//! in the database to claim again every [`CADENCE`], and applications' inserts skip the
//! wake-up meanwhile (migration 000021) — a notifying commit holds PostgreSQL's notify-queue
//! lock until it is flushed, so notifying commits flush one at a time.
//!
//! The promise ends in two steps, so that no row waits for the poll because of it: the sender
//! withdraws it and looks whether any transaction still holds the lock that every inserting
//! transaction takes before it looks at the promise (`Db::settle_awake`); until none does, it
//! keeps claiming at growing intervals (up to [`SETTLING_MAX`]); then it claims once more,
//! which sees every row whose wake-up was skipped, and only then waits for wake-ups again.
//!
//! [`Phase::after_claim`] is the whole decision, a plain function of what the claim found.

use std::time::{Duration, Instant};

/// How long a sender stays awake after its last claim that found rows. Shorter than the gap
/// between rows at light load, where each insert's wake-up costs little: a sender becomes awake
/// only when its claims find rows this close together.
pub const LINGER: Duration = Duration::from_millis(10);
/// How often an awake sender claims, at least (its claims that find rows are not delayed).
pub const CADENCE: Duration = Duration::from_millis(2);
/// How long a promise lasts in the database unless renewed: what one left by a sender that died
/// awake costs (rows whose wake-up it skipped wait for the next poll).
pub const PROMISE: Duration = Duration::from_secs(1);
/// How long an awake sender with no room for a claim keeps its promise: then it withdraws it,
/// and settles once it has room (`Phase::when_full`).
pub const FULL_FOR: Duration = Duration::from_millis(100);
/// The longest wait between a settling sender's claims (while an application's transaction that
/// inserted a due row stays open).
pub const SETTLING_MAX: Duration = Duration::from_millis(50);

/// Where a sender is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waits for a wake-up or the poll between claims that find nothing. `last_found`: its last
    /// claim that found rows.
    Asleep { last_found: Option<Instant> },
    /// Has promised to claim every [`CADENCE`]: `found_at` its last claim that found rows,
    /// `promised_at` its last promise.
    Awake {
        found_at: Instant,
        promised_at: Instant,
    },
    /// Withdrawing its promise: settles before each claim, and waits `wait` after one that
    /// found nothing before it was settled.
    Settling { wait: Duration },
}

impl Default for Phase {
    fn default() -> Self {
        Phase::Asleep { last_found: None }
    }
}

/// How long the claim loop waits after a claim that found fewer rows than it asked for (a wake-up
/// ends any wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// For a wake-up or the poll.
    Asleep,
    /// At most this long.
    For(Duration),
}

/// What the claim loop does after a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Next {
    pub phase: Phase,
    /// Promise (again) now.
    pub promise: bool,
    pub wait: Wait,
}

impl Phase {
    /// Whether the next claim must be preceded by `Db::settle_awake` (and told its answer).
    pub fn settles_first(self) -> bool {
        matches!(self, Phase::Settling { .. })
    }

    /// Whether a promise may be outstanding (to withdraw when the sender stops).
    pub fn has_promised(self) -> bool {
        !matches!(self, Phase::Asleep { .. })
    }

    /// The phase of a sender that has had no room to claim for [`FULL_FOR`]: an awake one
    /// withdraws its promise and settles (before its next claim); others are unchanged.
    pub fn when_full(self) -> Phase {
        match self {
            Phase::Awake { .. } => Phase::Settling { wait: CADENCE },
            p => p,
        }
    }

    /// The next phase after a claim at `now` that `found` rows (or not); `settled`: what the
    /// settle before it said (only asked while [`Phase::Settling`]).
    pub fn after_claim(self, now: Instant, found: bool, settled: bool) -> Next {
        let awake = |promised_at: Instant, promise: bool| Next {
            phase: Phase::Awake {
                found_at: now,
                promised_at,
            },
            promise,
            wait: Wait::For(CADENCE),
        };
        match self {
            Phase::Asleep { last_found } => {
                if !found {
                    Next {
                        phase: self,
                        promise: false,
                        wait: Wait::Asleep,
                    }
                } else if last_found.is_some_and(|t| now.saturating_duration_since(t) < LINGER) {
                    awake(now, true)
                } else {
                    Next {
                        phase: Phase::Asleep {
                            last_found: Some(now),
                        },
                        promise: false,
                        wait: Wait::Asleep,
                    }
                }
            }
            Phase::Awake {
                found_at,
                promised_at,
            } => {
                if found {
                    let renew = now.saturating_duration_since(promised_at) >= PROMISE / 2;
                    awake(if renew { now } else { promised_at }, renew)
                } else if now.saturating_duration_since(found_at) < LINGER {
                    Next {
                        phase: self,
                        promise: false,
                        wait: Wait::For(CADENCE),
                    }
                } else {
                    // Settle at once, before the next claim.
                    Next {
                        phase: Phase::Settling { wait: CADENCE },
                        promise: false,
                        wait: Wait::For(Duration::ZERO),
                    }
                }
            }
            Phase::Settling { wait } => {
                if found {
                    awake(now, true)
                } else if settled {
                    Next {
                        phase: Phase::Asleep { last_found: None },
                        promise: false,
                        wait: Wait::Asleep,
                    }
                } else {
                    Next {
                        phase: Phase::Settling {
                            wait: (wait * 2).min(SETTLING_MAX),
                        },
                        promise: false,
                        wait: Wait::For(wait),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_sender_becomes_awake_only_when_its_claims_find_rows_close_together() {
        let t0 = Instant::now();
        let asleep = Phase::default();
        // Nothing found: asleep, waiting for a wake-up.
        let n = asleep.after_claim(t0, false, false);
        assert_eq!((n.phase, n.promise, n.wait), (asleep, false, Wait::Asleep));
        // Rows found once: still asleep (light load: each insert's wake-up is cheap).
        let n = asleep.after_claim(t0, true, false);
        assert_eq!(
            n.phase,
            Phase::Asleep {
                last_found: Some(t0)
            }
        );
        assert_eq!((n.promise, n.wait), (false, Wait::Asleep));
        // Found again within LINGER: awake, promising, claiming every CADENCE.
        let m = n.phase.after_claim(t0 + LINGER - ms(1), true, false);
        assert_eq!(
            m.phase,
            Phase::Awake {
                found_at: t0 + LINGER - ms(1),
                promised_at: t0 + LINGER - ms(1)
            }
        );
        assert_eq!((m.promise, m.wait), (true, Wait::For(CADENCE)));
        // Found again only after LINGER: still asleep.
        let m = n.phase.after_claim(t0 + LINGER, true, false);
        assert_eq!(
            m.phase,
            Phase::Asleep {
                last_found: Some(t0 + LINGER)
            }
        );
        assert!(!m.promise);
        // A claim that found nothing in between keeps the last find.
        let m = n.phase.after_claim(t0 + ms(3), false, false);
        assert_eq!(m.phase, n.phase);
    }

    #[test]
    fn an_awake_sender_renews_its_promise_at_half_its_length_and_lingers_then_settles() {
        let t0 = Instant::now();
        let awake = Phase::Awake {
            found_at: t0,
            promised_at: t0,
        };
        // Rows again: awake, the promise renewed only once half of it has passed.
        let n = awake.after_claim(t0 + ms(5), true, false);
        assert_eq!(
            n.phase,
            Phase::Awake {
                found_at: t0 + ms(5),
                promised_at: t0
            }
        );
        assert_eq!((n.promise, n.wait), (false, Wait::For(CADENCE)));
        let n = awake.after_claim(t0 + PROMISE / 2, true, false);
        assert_eq!(
            n.phase,
            Phase::Awake {
                found_at: t0 + PROMISE / 2,
                promised_at: t0 + PROMISE / 2
            }
        );
        assert!(n.promise);
        // Nothing found within LINGER of the last find: still awake, claiming every CADENCE.
        let n = awake.after_claim(t0 + LINGER - ms(1), false, false);
        assert_eq!(
            (n.phase, n.promise, n.wait),
            (awake, false, Wait::For(CADENCE))
        );
        // Nothing for LINGER: settling, at once.
        let n = awake.after_claim(t0 + LINGER, false, false);
        assert_eq!(n.phase, Phase::Settling { wait: CADENCE });
        assert_eq!((n.promise, n.wait), (false, Wait::For(Duration::ZERO)));
        assert!(n.phase.settles_first() && n.phase.has_promised());
        assert!(!awake.settles_first() && awake.has_promised());
        assert!(!Phase::default().settles_first() && !Phase::default().has_promised());
        // No room to claim for FULL_FOR: the promise cannot be kept; settling.
        assert_eq!(awake.when_full(), Phase::Settling { wait: CADENCE });
        let settling = Phase::Settling { wait: ms(8) };
        assert_eq!(settling.when_full(), settling);
        assert_eq!(Phase::default().when_full(), Phase::default());
    }

    #[test]
    fn a_settling_sender_sleeps_only_after_a_claim_made_once_settled() {
        let t0 = Instant::now();
        let settling = Phase::Settling { wait: CADENCE };
        // Not settled (a transaction that may have skipped its wake-up is open): claims again,
        // waiting longer each time, up to SETTLING_MAX.
        let mut phase = settling;
        let mut waits = Vec::new();
        for _ in 0..8 {
            let n = phase.after_claim(t0, false, false);
            assert!(!n.promise);
            let Wait::For(w) = n.wait else {
                panic!("a settling sender waited for a wake-up: {n:?}")
            };
            waits.push(w.as_millis());
            phase = n.phase;
        }
        assert_eq!(waits, [2, 4, 8, 16, 32, 50, 50, 50]);
        // Settled, and the claim after it found nothing: asleep.
        let n = phase.after_claim(t0, false, true);
        assert_eq!(
            (n.phase, n.promise, n.wait),
            (Phase::default(), false, Wait::Asleep)
        );
        // Rows found while settling (settled or not): awake again, promising again.
        for settled in [false, true] {
            let n = settling.after_claim(t0, true, settled);
            assert_eq!(
                n.phase,
                Phase::Awake {
                    found_at: t0,
                    promised_at: t0
                }
            );
            assert_eq!((n.promise, n.wait), (true, Wait::For(CADENCE)));
        }
    }
}
