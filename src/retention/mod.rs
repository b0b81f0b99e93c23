//! Retention: finished messages, their attempts and receipts, and unmatched receipts are deleted
//! after configurable ages, in small batches (one bounded transaction each, never a long lock).
//!
//! - `delivered`, `canceled`, `expired` messages: after `retention_delivered_days` since they
//!   last changed (`updated_at`: when they reached that state), with their attempts, matched
//!   receipts and fan-out links.
//! - `dead_letter` messages: after `retention_dead_letter_days` (longer by default: a human may
//!   still replay them), likewise with everything of theirs.
//! - Unmatched receipts (no message ever claimed them): after `retention_unmatched_receipt_days`
//!   since they arrived.
//! - Every other state (`scheduled`, `sending`, `retryable`, `unconfirmed`) is never deleted.
//!
//! An age of 0 keeps that kind forever. The server runs a pass every
//! `retention_interval_seconds`; `herald purge` runs one pass and prints what it deleted.
//! Times come from the injected clock, so tests move time instead of sleeping.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::watch;

use crate::clock::Clock;
use crate::storage::retention::{Finished, PurgedBatch};
use crate::storage::{Db, StorageError};

/// The retention settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionConfig {
    /// `delivered`, `canceled` and `expired` messages; 0 = forever.
    pub delivered_days: u32,
    /// `dead_letter` messages; 0 = forever.
    pub dead_letter_days: u32,
    /// Receipts no message claimed; 0 = forever.
    pub unmatched_receipt_days: u32,
    /// Rows per transaction (1–10,000).
    pub batch_size: u32,
    /// Between two passes of the server's background task.
    pub interval: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            delivered_days: 30,
            dead_letter_days: 90,
            unmatched_receipt_days: 90,
            batch_size: 500,
            interval: Duration::from_secs(3600),
        }
    }
}

/// The instants before which each kind is purged; `None` keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cutoffs {
    pub done: Option<DateTime<Utc>>,
    pub dead_letter: Option<DateTime<Utc>>,
    pub unmatched_receipts: Option<DateTime<Utc>>,
}

/// The cutoffs at `now` (pure).
pub fn cutoffs(config: &RetentionConfig, now: DateTime<Utc>) -> Cutoffs {
    // An age reaching before year 1 keeps everything: nothing stored is older (every time is
    // within the years 1-9999), and PostgreSQL refuses a cutoff before 4713 BC — which failed
    // the whole pass, every kind's purge with it (9999999 days).
    let before = |days: u32| {
        (days > 0)
            .then(|| now.checked_sub_signed(chrono::Duration::days(i64::from(days))))
            .flatten()
            .filter(|t| chrono::Datelike::year(t) >= 1)
    };
    Cutoffs {
        done: before(config.delivered_days),
        dead_letter: before(config.dead_letter_days),
        unmatched_receipts: before(config.unmatched_receipt_days),
    }
}

/// What one pass deleted, batch by batch (each batch is one transaction).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RetentionReport {
    /// Batches of `delivered` / `canceled` / `expired` messages.
    pub done_batches: Vec<PurgedBatch>,
    pub dead_letter_batches: Vec<PurgedBatch>,
    /// Receipts deleted per batch.
    pub unmatched_receipt_batches: Vec<usize>,
    /// Replay keys (`herald_replay_keys`) deleted per batch: those first seen before the
    /// unmatched receipts' cutoff.
    pub replay_key_batches: Vec<usize>,
}

impl RetentionReport {
    pub fn messages(&self) -> usize {
        self.done_batches
            .iter()
            .chain(&self.dead_letter_batches)
            .map(|b| b.messages)
            .sum()
    }

    pub fn unmatched_receipts(&self) -> usize {
        self.unmatched_receipt_batches.iter().sum()
    }

    pub fn transactions(&self) -> usize {
        self.done_batches.len()
            + self.dead_letter_batches.len()
            + self.unmatched_receipt_batches.len()
            + self.replay_key_batches.len()
    }
}

/// A pass that an error ended: the batches it committed before (deleted for good, each its own
/// transaction) and the error. Reported whole, so that a failure late in a pass does not hide
/// what the pass already deleted.
#[derive(Debug, thiserror::Error)]
#[error("retention pass failed after {} committed batches", committed.transactions())]
pub struct PassFailed {
    pub committed: RetentionReport,
    #[source]
    pub error: StorageError,
}

/// One retention pass at `now`: batch after batch of each kind until a batch comes back short.
/// Blocking (diesel).
pub fn run_once(
    db: &Db,
    config: &RetentionConfig,
    now: DateTime<Utc>,
) -> Result<RetentionReport, Box<PassFailed>> {
    run_until(db, config, now, &|| false)
}

/// [`run_once`] that ends early, between two batches (each its own transaction), once `stop()`
/// holds: a pass over a large backlog (thousands of batches) must not hold up a shutdown.
pub fn run_until(
    db: &Db,
    config: &RetentionConfig,
    now: DateTime<Utc>,
    stop: &dyn Fn() -> bool,
) -> Result<RetentionReport, Box<PassFailed>> {
    let mut report = RetentionReport::default();
    match pass(db, config, now, stop, &mut report) {
        Ok(()) => Ok(report),
        Err(error) => Err(Box::new(PassFailed {
            committed: report,
            error,
        })),
    }
}

/// The batches of [`run_until`], each recorded in `report` once committed.
fn pass(
    db: &Db,
    config: &RetentionConfig,
    now: DateTime<Utc>,
    stop: &dyn Fn() -> bool,
    report: &mut RetentionReport,
) -> Result<(), StorageError> {
    let c = cutoffs(config, now);
    let n = config.batch_size.max(1);
    'pass: {
        for (which, before, out) in [
            (Finished::Done, c.done, &mut report.done_batches),
            (
                Finished::DeadLetter,
                c.dead_letter,
                &mut report.dead_letter_batches,
            ),
        ] {
            let Some(before) = before else { continue };
            loop {
                if stop() {
                    break 'pass;
                }
                let batch = db.purge_messages(which, before, n)?;
                let full = batch.messages >= n as usize;
                if batch != PurgedBatch::default() {
                    out.push(batch);
                }
                if !full {
                    break;
                }
            }
        }
        if let Some(before) = c.unmatched_receipts {
            type Purge = fn(&Db, DateTime<Utc>, u32) -> Result<usize, StorageError>;
            for (purge, out) in [
                (
                    Db::purge_unmatched_receipts as Purge,
                    &mut report.unmatched_receipt_batches,
                ),
                (
                    Db::purge_replay_keys as Purge,
                    &mut report.replay_key_batches,
                ),
            ] {
                loop {
                    if stop() {
                        break 'pass;
                    }
                    let deleted = purge(db, before, n)?;
                    if deleted > 0 {
                        out.push(deleted);
                    }
                    if deleted < n as usize {
                        break;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The server's background retention task.
#[derive(Clone)]
pub struct Retention {
    db: Db,
    clock: Arc<dyn Clock>,
    config: RetentionConfig,
}

impl Retention {
    pub fn new(db: Db, clock: Arc<dyn Clock>, config: RetentionConfig) -> Self {
        Self { db, clock, config }
    }

    /// One pass now (off the async executor).
    pub async fn run_once(&self) -> Result<RetentionReport, Box<PassFailed>> {
        self.pass(None).await
    }

    /// One pass now, ending between two batches once `stop` turns true. A pass that panicked is
    /// logged as an error (the next pass tries again), not taken for one that deleted nothing.
    async fn pass(
        &self,
        stop: Option<watch::Receiver<bool>>,
    ) -> Result<RetentionReport, Box<PassFailed>> {
        let (db, config, now) = (self.db.clone(), self.config, self.clock.now());
        let stopped = move || stop.as_ref().is_some_and(|s| *s.borrow());
        match tokio::task::spawn_blocking(move || run_until(&db, &config, now, &stopped)).await {
            Ok(r) => r,
            Err(_) => {
                tracing::error!("retention pass panicked; the next pass tries again");
                Ok(RetentionReport::default())
            }
        }
    }

    /// A pass every `interval` (the first one interval after start) until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.config.interval) => {}
                _ = stop.changed() => {}
            }
            if *stop.borrow() {
                return;
            }
            match self.pass(Some(stop.clone())).await {
                // Cut short by the stop: said, not logged as a pass that finished.
                Ok(r) if r.transactions() > 0 && *stop.borrow() => tracing::info!(
                    messages = r.messages(),
                    unmatched_receipts = r.unmatched_receipts(),
                    transactions = r.transactions(),
                    "retention pass stopped early (Herald is stopping); the next pass goes on"
                ),
                Ok(r) if r.transactions() > 0 => tracing::info!(
                    messages = r.messages(),
                    unmatched_receipts = r.unmatched_receipts(),
                    transactions = r.transactions(),
                    "retention pass"
                ),
                Ok(_) => {}
                Err(failed) => {
                    let r = &failed.committed;
                    tracing::warn!(
                        error = %failed.error.log_safe(),
                        messages = r.messages(),
                        unmatched_receipts = r.unmatched_receipts(),
                        transactions = r.transactions(),
                        "retention pass failed; the batches counted here were deleted before it did"
                    )
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn cutoffs_follow_each_age_and_zero_keeps_forever() {
        let now = at("2026-12-01T12:00:00Z");
        let c = cutoffs(&RetentionConfig::default(), now);
        assert_eq!(c.done, Some(at("2026-11-01T12:00:00Z")));
        assert_eq!(c.dead_letter, Some(at("2026-09-02T12:00:00Z")));
        assert_eq!(c.unmatched_receipts, Some(at("2026-09-02T12:00:00Z")));
        let keep = RetentionConfig {
            delivered_days: 0,
            dead_letter_days: 0,
            unmatched_receipt_days: 1,
            ..RetentionConfig::default()
        };
        let c = cutoffs(&keep, now);
        assert_eq!((c.done, c.dead_letter), (None, None));
        assert_eq!(c.unmatched_receipts, Some(at("2026-11-30T12:00:00Z")));
        // An age reaching before the calendar's start purges nothing rather than overflowing.
        let huge = RetentionConfig {
            delivered_days: u32::MAX,
            ..RetentionConfig::default()
        };
        assert_eq!(cutoffs(&huge, now).done, None);
        // Reaching before year 1 but within chrono's range (PostgreSQL refused it): the same.
        for days in [740_500, 3_000_000, 9_999_999] {
            let far = RetentionConfig {
                delivered_days: days,
                dead_letter_days: 1,
                ..RetentionConfig::default()
            };
            let c = cutoffs(&far, now);
            assert_eq!(c.done, None, "{days}");
            assert_eq!(c.dead_letter, Some(at("2026-11-30T12:00:00Z")));
        }
        let within = RetentionConfig {
            delivered_days: 700_000,
            ..RetentionConfig::default()
        };
        assert!(cutoffs(&within, now).done.is_some());
    }

    #[test]
    fn report_totals() {
        let b = |m| PurgedBatch {
            messages: m,
            attempts: 2 * m,
            receipts: 0,
            fanouts: 0,
        };
        let r = RetentionReport {
            done_batches: vec![b(3), b(1)],
            dead_letter_batches: vec![b(2)],
            unmatched_receipt_batches: vec![4],
            replay_key_batches: vec![500, 7],
        };
        assert_eq!(r.messages(), 6);
        assert_eq!(r.transactions(), 6);
    }
}
