//! Support views as text for a terminal (`herald explain`, `herald dlq list` …): aligned tables
//! of the same facts the JSON carries, nothing more.

use std::fmt::Write;

use super::view::Explanation;
use super::{DeadLetterPage, RedriveReport, Replayed};

/// Left-aligned columns, two spaces apart; a `-` for an empty cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    let cell = |s: &str| {
        if s.is_empty() {
            "-".to_owned()
        } else {
            s.to_owned()
        }
    };
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell(c).chars().count());
            }
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: Vec<String>| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}  ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut out, headers.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(&mut out, r.iter().map(|c| cell(c)).collect());
    }
    out
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(|x| x.to_string()).unwrap_or_default()
}

/// `herald explain FP`.
pub fn explanation(e: &Explanation) -> String {
    let mut out = String::new();
    let fields: Vec<(&str, String)> = vec![
        ("event id", e.event_id.clone()),
        ("fingerprint", opt(&e.fingerprint)),
        ("channel", e.channel.to_string()),
        ("destination", e.destination.clone()),
        ("semantics", e.semantics.to_string()),
        ("enqueued by", opt(&e.enqueued_by)),
        ("created", e.created_at.clone()),
        ("scheduled", e.scheduled_at.clone()),
        ("expires", opt(&e.expires_at)),
        (
            "state",
            match (&e.state_reason, &e.last_error_class) {
                // In flight: the class of the attempt or hold before says nothing of this one
                // (a re-check read `sending (rate_limited)`).
                _ if e.state == crate::domain::State::Sending => e.state.to_string(),
                (Some(r), _) => format!("{} ({r})", e.state),
                (None, Some(c)) => format!("{} ({c})", e.state),
                (None, None) => e.state.to_string(),
            },
        ),
        // In flight: the lease, not the due time the claim went by (it read as one passed).
        match (e.state, &e.lease_until) {
            (crate::domain::State::Sending, Some(t)) => ("lease until", t.clone()),
            _ => ("next attempt", opt(&e.next_attempt_at)),
        },
        (
            "delivery status",
            match (&e.delivery_status, &e.delivery_status_at) {
                (Some(s), Some(t)) => format!("{s} (event time {t})"),
                (Some(s), None) => s.clone(),
                _ => String::new(),
            },
        ),
        ("provider id", opt(&e.provider_message_id)),
        (
            "attempts",
            format!(
                "{} in all; {} of {} in the current series (from attempt {})",
                e.attempts, e.series_attempts, e.max_attempts, e.series_start
            ),
        ),
    ];
    for (k, v) in fields {
        let v = if v.is_empty() { "-".to_owned() } else { v };
        let _ = writeln!(out, "{k:<16} {v}");
    }
    out.push_str("\nAttempts\n");
    // Claimed, not yet recorded: said after the recorded ones (a re-check read "none" above "is
    // in flight", and attempts 1 and 2 without the third, in flight).
    let in_flight = (e.state == crate::domain::State::Sending)
        .then(|| format!("  attempt {} in flight, not recorded yet\n", e.attempts));
    if e.attempt_timeline.is_empty() {
        if in_flight.is_none() {
            out.push_str("  none\n");
        }
    } else {
        let rows: Vec<Vec<String>> = e
            .attempt_timeline
            .iter()
            .map(|a| {
                vec![
                    a.attempt.to_string(),
                    a.series.to_string(),
                    a.started_at.clone(),
                    format!("{} ms", a.duration_ms),
                    match (a.status, &a.error_kind) {
                        (Some(s), _) => s.to_string(),
                        (None, Some(k)) => k.clone(),
                        (None, None) => String::new(),
                    },
                    a.class.to_string(),
                    opt(&a.retry_after),
                    a.delay_ms
                        .map(super::narrative::human_ms)
                        .unwrap_or_default(),
                    a.next_state.clone(),
                    a.policy_version.clone(),
                    match (&a.delay_reason, &a.note) {
                        (Some(r), Some(n)) => format!("{r}; {n}"),
                        (r, n) => opt(&r.clone().or(n.clone())),
                    },
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "#",
                "SERIES",
                "STARTED",
                "TOOK",
                "STATUS",
                "CLASS",
                "RETRY-AFTER",
                "DELAY",
                "THEN",
                "POLICY",
                "WHY",
            ],
            &rows,
        ));
    }
    out.push_str(in_flight.as_deref().unwrap_or_default());
    out.push_str("\nReceipts\n");
    if e.receipt_timeline.is_empty() {
        out.push_str("  none\n");
    } else {
        let rows: Vec<Vec<String>> = e
            .receipt_timeline
            .iter()
            .map(|r| {
                vec![
                    opt(&r.event_time),
                    r.received_at.clone(),
                    r.source.clone(),
                    r.event_type.clone(),
                    match (&r.before_replay_at, e.replays.is_empty()) {
                        (Some(t), _) => format!("before replay {t}"),
                        (None, true) => "-".to_owned(),
                        (None, false) => "current".to_owned(),
                    },
                    opt(&r.outcome),
                    opt(&r.outcome_reason),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "EVENT TIME",
                "ARRIVED",
                "SOURCE",
                "TYPE",
                "SEND",
                "OUTCOME",
                "WHY",
            ],
            &rows,
        ));
    }
    out.push_str("\nReplays\n");
    if e.replays.is_empty() {
        out.push_str("  none\n");
    } else {
        let rows: Vec<Vec<String>> = e
            .replays
            .iter()
            .map(|r| {
                vec![
                    r.replayed_at.clone(),
                    r.who.clone(),
                    r.from_state.to_string(),
                    if r.forced { "yes".into() } else { "no".into() },
                    r.series_start.to_string(),
                    r.reason.clone(),
                ]
            })
            .collect();
        out.push_str(&table(
            &["AT", "WHO", "FROM", "FORCED", "SERIES FROM", "REASON"],
            &rows,
        ));
    }
    out.push('\n');
    out.push_str(&e.explanation);
    out.push('\n');
    out
}

/// `herald dlq list`.
pub fn dead_letters(page: &DeadLetterPage) -> String {
    let rows: Vec<Vec<String>> = page
        .dead_letters
        .iter()
        .map(|d| {
            vec![
                d.dead_lettered_at.clone(),
                d.fingerprint
                    .as_deref()
                    .map(|f| f.chars().take(12).collect())
                    .unwrap_or_default(),
                d.event_id.clone(),
                d.channel.to_string(),
                d.destination.clone(),
                {
                    let class = match (&d.state_reason, &d.class) {
                        (Some(r), _) => r.clone(),
                        (None, c) => opt(c),
                    };
                    match &d.delivery_status {
                        Some(s) => format!("{class} (receipts: {s})"),
                        None => class,
                    }
                },
                d.attempts.to_string(),
                d.last_attempt
                    .as_ref()
                    .map(|l| match (l.status, &l.error_kind) {
                        (Some(s), _) => format!("{s} {}", l.class),
                        (None, Some(k)) => format!("{k} {}", l.class),
                        (None, None) => l.class.to_string(),
                    })
                    .unwrap_or_default(),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "DEAD-LETTERED",
            "FINGERPRINT",
            "EVENT ID",
            "CHANNEL",
            "DESTINATION",
            "CLASS",
            "ATTEMPTS",
            "LAST",
        ],
        &rows,
    );
    let _ = writeln!(out, "{} dead letter(s)", page.dead_letters.len());
    if let Some(next) = &page.next {
        let _ = writeln!(out, "more: --after {next}");
    }
    out
}

/// `herald replay FP`.
pub fn replayed(r: &Replayed) -> String {
    format!(
        "replayed {} ({}) from {}{}: now {}, a new attempt series from attempt {}, due {}\n",
        r.event_id,
        match &r.fingerprint {
            Some(f) => format!("fingerprint {f}"),
            // Written by SQL and never attempted: its fingerprint comes with its first attempt.
            None => "no fingerprint until its first attempt".to_owned(),
        },
        r.replay.from_state,
        if r.replay.forced { ", forced" } else { "" },
        r.state,
        r.replay.series_start,
        opt(&r.next_attempt_at),
    )
}

/// `herald dlq redrive`.
pub fn redrive(r: &RedriveReport) -> String {
    let mut out = String::new();
    if !r.redriven.is_empty() {
        let rows: Vec<Vec<String>> = r
            .redriven
            .iter()
            .map(|x| {
                vec![
                    opt(&x.fingerprint),
                    x.event_id.clone(),
                    x.from_state.to_string(),
                    x.series_start.to_string(),
                ]
            })
            .collect();
        out.push_str(&table(
            &["FINGERPRINT", "EVENT ID", "FROM", "SERIES FROM"],
            &rows,
        ));
    }
    for s in &r.skipped {
        let _ = writeln!(out, "skipped {}: {}", s.event_id, s.reason);
    }
    let _ = writeln!(
        out,
        "{} redriven, {} skipped (limit {}){}",
        r.redriven.len(),
        r.skipped.len(),
        r.limit,
        match (&r.more, &r.next) {
            (true, Some(next)) => {
                format!("; more dead letters match: run it again with --after {next}")
            }
            (true, None) => "; more dead letters match: run it again".to_owned(),
            (false, _) => String::new(),
        }
    );
    out
}

#[cfg(test)]
mod tests {
    /// In flight, its attempt not recorded yet: the lease, and the attempt in flight, not a
    /// passed "next attempt" above "none" (a re-check walk-through).
    #[test]
    fn a_message_in_flight_shows_its_lease() {
        use crate::domain::State;
        let mut e = crate::support::narrative::tests::base(State::Sending);
        e.attempts = 1;
        e.last_error_class = Some(crate::domain::AttemptClass::RateLimited);
        e.next_attempt_at = Some("2026-12-01T10:00:00.000000Z".into());
        e.lease_until = Some("2026-12-01T10:00:30.000000Z".into());
        let out = super::explanation(&e);
        assert!(
            out.contains("lease until      2026-12-01T10:00:30.000000Z"),
            "{out}"
        );
        assert!(!out.contains("next attempt"), "{out}");
        assert!(out.contains("state            sending\n"), "{out}");
        assert!(
            out.contains("Attempts\n  attempt 1 in flight, not recorded yet\n"),
            "{out}"
        );
        // After recorded attempts too.
        e.attempt_timeline = vec![crate::support::narrative::tests::attempt(
            1,
            Some(503),
            crate::domain::AttemptClass::Transient,
            "retryable",
        )];
        e.attempts = 2;
        let out = super::explanation(&e);
        assert!(
            out.contains("\n  attempt 2 in flight, not recorded yet\n\nReceipts"),
            "{out}"
        );
        e.attempt_timeline.clear();
        e.state = State::Retryable;
        let out = super::explanation(&e);
        assert!(
            out.contains("next attempt     2026-12-01T10:00:00.000000Z"),
            "{out}"
        );
        assert!(out.contains("Attempts\n  none\n"), "{out}");
    }

    #[test]
    fn tables_align_and_mark_empty_cells() {
        let t = super::table(
            &["A", "BB", "C"],
            &[
                vec!["xxx".into(), "".into(), "last".into()],
                vec!["y".into(), "z".into(), "".into()],
            ],
        );
        assert_eq!(t, "A    BB  C\nxxx  -   last\ny    z   -\n");
    }

    #[test]
    fn a_replay_names_its_fingerprint_or_says_it_has_none_yet() {
        use crate::domain::State;
        let mut r = crate::support::Replayed {
            event_id: "sql-exp".into(),
            fingerprint: None,
            state: State::Scheduled,
            next_attempt_at: Some("2026-12-06T00:00:00.000000Z".into()),
            replay: crate::support::view::ReplayEntry {
                replayed_at: "2026-12-06T00:00:00.000000Z".into(),
                who: "cli:ana".into(),
                reason: "expired by mistake".into(),
                from_state: State::Expired,
                forced: false,
                series_start: 1,
                expires_at_before: None,
                expires_at_after: None,
            },
        };
        assert_eq!(
            super::replayed(&r),
            "replayed sql-exp (no fingerprint until its first attempt) from expired: now scheduled, \
             a new attempt series from attempt 1, due 2026-12-06T00:00:00.000000Z\n"
        );
        r.fingerprint = Some("ab12".into());
        assert!(super::replayed(&r).starts_with("replayed sql-exp (fingerprint ab12) from"));
    }
}
