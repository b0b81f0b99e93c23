//! Readiness: why this process should not get traffic right now. The decision is a pure function
//! ([`readiness`]) over what `/readyz` found; the sender's [`Heartbeat`] is what "the sender is
//! making progress" means.

use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// When the sender loop last completed an iteration (a claim that answered), by Herald's clock.
///
/// `None` while no sender loop runs — the sender disabled, not started yet, or stopped — and then
/// a stall is never a reason: a process that does not send cannot be stalled.
#[derive(Debug)]
pub struct Heartbeat {
    last: Mutex<Option<DateTime<Utc>>>,
    /// How long without a beat counts as stalled.
    limit: Duration,
}

impl Heartbeat {
    /// A heartbeat that is stalled after `limit` without a beat.
    pub fn new(limit: Duration) -> Self {
        Self {
            last: Mutex::new(None),
            limit,
        }
    }

    /// The limit the sender is held to: three poll intervals, and never less than one lease (a
    /// loop waiting for in-flight sends is bounded by their timeouts, which are shorter).
    pub fn limit_for(poll_interval: Duration, lease: Duration) -> Duration {
        (poll_interval * 3).max(lease)
    }

    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// The loop completed an iteration that began at `at` (the time read *before* its claim, so a
    /// claim that was blocked for a while never looks fresh).
    pub fn beat(&self, at: DateTime<Utc>) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        // Iterations may finish out of order by a moment; the heartbeat never goes back.
        if last.is_none_or(|l| at > l) {
            *last = Some(at);
        }
    }

    /// The loop ended: no longer watched.
    pub fn stop(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The last beat, if a loop runs.
    pub fn last(&self) -> Option<DateTime<Utc>> {
        *self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One reason `/readyz` is not ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct NotReady {
    /// `database`, `migrations_pending` or `sender_stalled`.
    pub reason: &'static str,
    pub detail: String,
    /// `migrations_pending`: the versions not applied.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<String>,
}

/// What `/readyz` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Findings {
    /// The database answered a trivial query.
    pub database: bool,
    /// Embedded migrations not applied to the database (`None`: not checked, the database did not
    /// answer).
    pub pending_migrations: Option<Vec<String>>,
    /// The sender loop's last beat, `None` when no loop runs.
    pub sender_last_beat: Option<DateTime<Utc>>,
    pub sender_limit: Duration,
    pub now: DateTime<Utc>,
}

/// Every reason not to be ready; empty means ready.
pub fn readiness(f: &Findings) -> Vec<NotReady> {
    let mut reasons = Vec::new();
    if !f.database {
        reasons.push(NotReady {
            reason: "database",
            detail: "the database did not answer".into(),
            pending: Vec::new(),
        });
    }
    if let Some(pending) = &f.pending_migrations
        && !pending.is_empty()
    {
        reasons.push(NotReady {
            reason: "migrations_pending",
            detail: format!(
                "{} embedded migration(s) not applied; run `herald migrate`",
                pending.len()
            ),
            pending: pending.clone(),
        });
    }
    if let Some(last) = f.sender_last_beat {
        let age = (f.now - last).to_std().unwrap_or(Duration::ZERO);
        if age > f.sender_limit {
            reasons.push(NotReady {
                reason: "sender_stalled",
                detail: format!(
                    "the sender last completed an iteration {} s ago (limit {} s)",
                    age.as_secs(),
                    f.sender_limit.as_secs()
                ),
                pending: Vec::new(),
            });
        }
    }
    reasons
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 0).unwrap()
    }

    fn healthy() -> Findings {
        Findings {
            database: true,
            pending_migrations: Some(Vec::new()),
            sender_last_beat: Some(t(0)),
            sender_limit: Duration::from_secs(60),
            now: t(10),
        }
    }

    fn reasons(f: &Findings) -> Vec<&'static str> {
        readiness(f).iter().map(|r| r.reason).collect()
    }

    #[test]
    fn ready_when_every_check_passes() {
        assert!(readiness(&healthy()).is_empty());
    }

    #[test]
    fn each_reason_on_its_own_and_together() {
        let down = Findings {
            database: false,
            pending_migrations: None,
            ..healthy()
        };
        assert_eq!(reasons(&down), ["database"]);
        let old = Findings {
            pending_migrations: Some(vec!["20261201000004".into()]),
            ..healthy()
        };
        let r = readiness(&old);
        assert_eq!(r[0].reason, "migrations_pending");
        assert_eq!(r[0].pending, ["20261201000004"]);
        let stalled = Findings {
            now: t(61),
            ..healthy()
        };
        assert_eq!(reasons(&stalled), ["sender_stalled"]);
        let all = Findings {
            database: false,
            pending_migrations: Some(vec!["x".into()]),
            now: t(100),
            ..healthy()
        };
        assert_eq!(
            reasons(&all),
            ["database", "migrations_pending", "sender_stalled"]
        );
    }

    #[test]
    fn the_stall_limit_is_exclusive_and_no_loop_is_never_stalled() {
        assert!(
            readiness(&Findings {
                now: t(60),
                ..healthy()
            })
            .is_empty()
        );
        assert!(
            readiness(&Findings {
                sender_last_beat: None,
                now: t(1_000_000),
                ..healthy()
            })
            .is_empty()
        );
        // A beat from the future (a clock moved back) is not a stall.
        assert!(
            readiness(&Findings {
                sender_last_beat: Some(t(50)),
                ..healthy()
            })
            .is_empty()
        );
    }

    #[test]
    fn the_limit_is_three_polls_but_at_least_a_lease() {
        let s = Duration::from_secs;
        assert_eq!(
            Heartbeat::limit_for(Duration::from_millis(1000), s(60)),
            s(60)
        );
        assert_eq!(Heartbeat::limit_for(s(30), s(60)), s(90));
    }

    #[test]
    fn the_heartbeat_never_goes_back_and_stops() {
        let h = Heartbeat::new(Duration::from_secs(1));
        assert_eq!(h.last(), None);
        h.beat(t(5));
        h.beat(t(3));
        assert_eq!(h.last(), Some(t(5)));
        h.stop();
        assert_eq!(h.last(), None);
    }
}
