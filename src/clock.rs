//! Time, injectable: production reads the system clock, tests shift it.
//! Every timestamp is truncated to microseconds, the precision both backends store.

use std::sync::Mutex;

use chrono::{DateTime, SubsecRound, Utc};

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
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
/// database's `now()` become due as usual), and a test can jump ahead to make retries due.
#[derive(Debug, Default)]
pub struct OffsetClock(Mutex<chrono::Duration>);

impl OffsetClock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn advance(&self, by: std::time::Duration) {
        let mut o = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *o += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> DateTime<Utc> {
        let offset = *self.0.lock().unwrap_or_else(|p| p.into_inner());
        (Utc::now() + offset).trunc_subsecs(6)
    }
}

impl OffsetClock {
    /// Moves the clock so that it reads `at` now (and keeps running from there): published
    /// examples carry old timestamps.
    pub fn set_to(&self, at: DateTime<Utc>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = at - Utc::now();
    }
}
