//! Time, injectable: production reads the system clock, tests shift it.
//! Every timestamp is truncated to microseconds, the precision both backends store.

use std::sync::Mutex;

use chrono::{DateTime, SubsecRound, Utc};

pub trait Clock: Send + Sync + 'static {
    /// This process's reading of the time (it may be skewed).
    fn now(&self) -> DateTime<Utc>;

    /// How far this clock has been moved from real time *on purpose*: a test letting time pass.
    /// On PostgreSQL lease and due times come from the database's clock, moved by this shift, so
    /// moving the clock moves time for every process at once while a skewed clock (whose `now`
    /// is wrong but whose shift is zero) changes nothing. Zero in production.
    fn shift(&self) -> chrono::Duration {
        chrono::Duration::zero()
    }

    /// "Now" for the storage layer: this reading and the shift.
    fn storage_now(&self) -> Now {
        Now {
            local: self.now(),
            shift: self.shift(),
        }
    }
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now().trunc_subsecs(6)
    }
}

/// The system clock shifted by an adjustable offset: time keeps moving (so rows inserted with the
/// database's `now()` become due as usual), and a test can jump ahead to make retries due, or
/// freeze it at an instant (published examples are checked at their own second).
#[derive(Debug, Default)]
pub struct OffsetClock {
    offset: Mutex<chrono::Duration>,
    frozen: Mutex<Option<DateTime<Utc>>>,
}

impl OffsetClock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn advance(&self, by: std::time::Duration) {
        let mut o = self.offset.lock().unwrap_or_else(|p| p.into_inner());
        *o += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
    }

    /// Stops the clock at `at`.
    pub fn freeze(&self, at: DateTime<Utc>) {
        *self.frozen.lock().unwrap_or_else(|p| p.into_inner()) = Some(at.trunc_subsecs(6));
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> DateTime<Utc> {
        if let Some(at) = *self.frozen.lock().unwrap_or_else(|p| p.into_inner()) {
            return at;
        }
        let offset = *self.offset.lock().unwrap_or_else(|p| p.into_inner());
        (Utc::now() + offset).trunc_subsecs(6)
    }

    /// Every move of this clock is deliberate: the database's time moves with it.
    fn shift(&self) -> chrono::Duration {
        self.now() - Utc::now()
    }
}

/// "Now" for a statement that compares or sets lease and due times.
///
/// SQLite (one process) uses `local`, the process's clock. PostgreSQL, shared by several
/// processes whose clocks may disagree, uses the database's own `now()` moved by `shift`: a
/// process with a skewed clock can then neither claim early, steal a live lease, nor keep a dead
/// one. `shift` is zero in production; tests move it to let time pass for everyone at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Now {
    pub local: DateTime<Utc>,
    pub shift: chrono::Duration,
}

impl Now {
    /// The shift in microseconds, as the PostgreSQL statements take it.
    pub fn shift_micros(&self) -> f64 {
        self.shift.num_microseconds().unwrap_or(0) as f64
    }
}
