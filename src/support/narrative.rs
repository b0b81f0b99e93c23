//! The plain-language paragraph of an explanation: a pure function of the facts already in the
//! [`Explanation`] (attempts, replays, receipts, state). It states what the rows say, in their
//! order, and guesses nothing: where a fact is missing the sentence leaves it out.

use crate::domain::{AttemptClass, Channel, State};

use super::view::{
    Answer, AttemptEntry, Explanation, OrderingFacts, PlaceBefore, ReceiptEntry, ReplayEntry,
};

/// A duration in milliseconds as a person reads it: `850 ms`, `4.08 s`, `126 s`, `2 min 6 s`.
pub fn human_ms(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1000 {
        return format!("{ms} ms");
    }
    if ms < 60_000 {
        let s = ms as f64 / 1000.0;
        let text = format!("{s:.2}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        return format!("{text} s");
    }
    let total = ms / 1000;
    let (h, m, s) = (total / 3600, (total % 3600) / 60, total % 60);
    match (h, s) {
        (0, 0) => format!("{m} min"),
        (0, _) => format!("{m} min {s} s"),
        (_, _) => format!("{h} h {m} min"),
    }
}

/// A Retry-After as sent: seconds as `120 s` (`0 s`, not `0 ms`), a date as it is.
fn human_retry_after(raw: &str) -> String {
    match raw.trim().parse::<u64>() {
        Ok(0) => "0 s".to_owned(),
        Ok(s) => human_ms((s as i64).saturating_mul(1000)),
        Err(_) => raw.trim().to_owned(),
    }
}

/// Herald's delay reason without its leading `class: ` (the sentence names the class already).
fn reason_text(a: &AttemptEntry) -> Option<&str> {
    let r = a.delay_reason.as_deref()?;
    let prefix = format!("{}: ", a.class);
    Some(r.strip_prefix(prefix.as_str()).unwrap_or(r))
}

fn attempt_sentence(a: &AttemptEntry) -> String {
    let mut s = format!("Attempt {} at {} ", a.attempt, a.started_at);
    let answer = Answer::of(a.status, a.error_kind.as_deref());
    match answer {
        Answer::Status(code) => s.push_str(&format!("got {code}")),
        Answer::LeaseExpired => s.push_str("lost its sender before an outcome was recorded"),
        Answer::WrittenToFile => s.push_str(
            "was written as an .eml file to the mail directory (no SMTP relay is configured)",
        ),
        Answer::Failed(kind) => s.push_str(&format!("failed ({kind})")),
        Answer::Nothing => s.push_str("ended without a status"),
    }
    if let Some(ra) = a.retry_after.as_deref() {
        s.push_str(&format!(" with Retry-After {}", human_retry_after(ra)));
    }
    // A lost sender's attempt "took" until the lease watchdog found it, downtime included: not
    // the request's duration (a walk-through read 16 s for a request killed after 0.8 s).
    let took = if answer == Answer::LeaseExpired {
        format!(
            " (the lease watchdog found it {} after it began)",
            human_ms(a.duration_ms)
        )
    } else {
        format!(" after {}", human_ms(a.duration_ms))
    };
    s.push_str(&format!("{took}, classified {}", a.class));
    let why = reason_text(a);
    match a.next_state.as_str() {
        "retryable" => {
            match a.delay_ms {
                Some(ms) => s.push_str(&format!("; Herald set the next attempt {} later", human_ms(ms))),
                None => s.push_str("; Herald scheduled a retry"),
            }
            if let Some(why) = why {
                s.push_str(&format!(" ({why})"));
            }
        }
        "delivered" if answer == Answer::WrittenToFile => {
            s.push_str(&format!(
                "; delivered at {} to the directory, not to any mail server",
                a.finished_at
            ))
        }
        "delivered" => s.push_str(&format!(
            "; the receiver accepted it: delivered at {}",
            a.finished_at
        )),
        "dead_letter" => {
            s.push_str("; Herald dead-lettered it");
            if let Some(why) = why {
                s.push_str(&format!(" ({why})"));
            }
        }
        "unconfirmed" => {
            s.push_str("; Herald left it unconfirmed");
            if let Some(why) = why {
                s.push_str(&format!(" ({why})"));
            }
        }
        "lease_lost" => s.push_str(
            "; its outcome arrived after another sender had taken the message over and was not applied",
        ),
        other => s.push_str(&format!("; it became {other}")),
    }
    match (a.note.as_deref(), a.next_state.as_str()) {
        // A next transaction for recipients refused 452 that failed once its content may have
        // left: those may have it (a walk-through saw "those did not get it" of recipients
        // whose content had gone in full).
        (Some(note), "delivered") if note.contains(crate::channels::email::SENT_AGAIN) => s
            .push_str(&format!(
                " — but not to every recipient: {note} (those did not get it from this attempt, \
                 but for those sent again, who may have; none is retried)"
            )),
        (Some(note), "delivered") => s.push_str(&format!(
            " — but not to every recipient: {note} (those did not get it, and are not retried)"
        )),
        (Some(note), _) => s.push_str(&format!(" — {note}")),
        (None, _) => {}
    }
    s.push('.');
    s
}

fn replay_sentence(r: &ReplayEntry) -> String {
    let mut s = format!(
        "At {} {} replayed it from {}{} (reason: \u{201c}{}\u{201d}); a new attempt series began at attempt {} with the same event id",
        r.replayed_at,
        r.who,
        r.from_state,
        if r.forced { ", forced" } else { "" },
        r.reason,
        r.series_start
    );
    if r.expires_at_before != r.expires_at_after {
        match &r.expires_at_after {
            Some(t) => s.push_str(&format!(" and expires_at set to {t}")),
            None => s.push_str(" and expires_at cleared"),
        }
    }
    s.push('.');
    s
}

fn receipt_sentence(r: &ReceiptEntry) -> String {
    let when = r
        .event_time
        .as_deref()
        .map(|t| format!(" at {t}"))
        .unwrap_or_else(|| " (no event time given)".to_owned());
    let what = match r.event_type.as_str() {
        "delivered" => format!("the provider reported it delivered{when}"),
        "bounced" => format!("the recipient's server bounced it{when}"),
        "complained" => format!("the recipient marked it as spam{when}"),
        "failed" => format!("the provider reported that it failed{when}"),
        "deferred" => format!("the provider reported a delay{when}"),
        other => format!("the provider reported {other}{when}"),
    };
    let of = r
        .before_replay_at
        .as_deref()
        .map(|t| format!(" of the send before the replay at {t}"))
        .unwrap_or_default();
    let mut s = format!(
        "Receipt from {}{of}: {what} (arrived {}",
        r.source, r.received_at
    );
    match (r.outcome.as_deref(), r.outcome_reason.as_deref()) {
        (Some(o), Some(why)) => s.push_str(&format!("; {o}: {why})")),
        (Some(o), None) => s.push_str(&format!("; {o})")),
        (None, _) => s.push_str("; not applied yet)"),
    }
    s.push('.');
    s
}

/// The most receipts the paragraph tells one by one.
const RECEIPT_SENTENCES_MAX: usize = 20;

/// The receipts' sentences: each of them, or past [`RECEIPT_SENTENCES_MAX`] those that changed
/// the delivery status (`applied`) and the latest, and a count of the rest by type — the receipt
/// timeline lists every one. A walk-through's email with 6,000 opens had a paragraph of 1.17 M
/// characters.
fn receipt_sentences(receipts: &[ReceiptEntry]) -> Vec<String> {
    let some = SomeReceipts::of(
        receipts.len(),
        RECEIPT_SENTENCES_MAX,
        |i| receipts[i].outcome.as_deref() == Some("applied"),
        |i| receipts[i].event_type.as_str(),
    );
    let mut out: Vec<String> = some
        .untold
        .as_ref()
        .map(|untold| {
            format!(
                "Of its {} receipts, {untold}: the receipt timeline lists every one; the ones \
                 that set its delivery status and the latest follow.",
                receipts.len()
            )
        })
        .into_iter()
        .collect();
    out.extend(some.told.iter().map(|&i| receipt_sentence(&receipts[i])));
    out
}

/// Which of a message's many receipts a person is told of one by one: all of them up to `max`;
/// past it those that changed the delivery status (`applied`, the latest `max / 2` of them) and
/// the latest, in time order, and the rest counted by type. The explanation's paragraph and the
/// admin page choose alike (a walk-through's email with 6,000 opens: a paragraph of 1.17 M
/// characters, a page of 4.6 MB).
pub struct SomeReceipts {
    /// The indexes told, ascending.
    pub told: Vec<usize>,
    /// `None` when all are told; else "N are not told here (open 5000, click 980)".
    pub untold: Option<String>,
}

impl SomeReceipts {
    pub fn of<'a>(
        n: usize,
        max: usize,
        applied: impl Fn(usize) -> bool,
        event_type: impl Fn(usize) -> &'a str,
    ) -> Self {
        if n <= max {
            return Self {
                told: (0..n).collect(),
                untold: None,
            };
        }
        let applied: Vec<usize> = (0..n).filter(|&i| applied(i)).collect();
        let keep_applied = applied.len().min(max / 2);
        let mut told: Vec<usize> = applied[applied.len() - keep_applied..].to_vec();
        told.extend(n - (max - keep_applied)..n);
        told.sort_unstable();
        told.dedup();
        let mut left: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
        for i in (0..n).filter(|i| told.binary_search(i).is_err()) {
            *left.entry(event_type(i)).or_default() += 1;
        }
        let by_type = left
            .iter()
            .map(|(t, n)| format!("{t} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let untold = format!("{} are not told here ({by_type})", n - told.len());
        Self {
            told,
            untold: Some(untold),
        }
    }
}

/// Where a keyed message stands in its key.
fn ordering_sentence(e: &Explanation, o: &OrderingFacts) -> String {
    let place = o.seq.map(|n| format!(" (place {n})")).unwrap_or_default();
    if let Some(by) = &o.blocked_by {
        let state = o.head_state.map(|s| s.as_str()).unwrap_or("dead_letter");
        if o.head_state.is_some_and(|s| !s.is_terminal()) {
            return format!(
                "It waits in ordering key {}{place}: behind {by}, the key's head, replayed and \
                 now {state}; it goes after {by}, whatever its own due time says.{}",
                o.key,
                expiry_while_waiting(e)
            );
        }
        return format!(
            "It waits in ordering key {}{place}: blocked by {by}, the key's head, which is {state}; \
             the key moves on when {by} is replayed, canceled or skipped.{}",
            o.key,
            expiry_while_waiting(e)
        );
    }
    let skipped = |o: &OrderingFacts| match (&o.skipped_by, &o.skip_reason) {
        (Some(who), Some(why)) => format!("skipped by {who}: \u{201c}{why}\u{201d}"),
        (Some(who), None) => format!("skipped by {who}"),
        _ => "skip".to_owned(),
    };
    if let Some(at) = &o.released_at {
        // The skip that released it, or the `skip` policy (a skip of its own before a replay
        // is another release).
        let by = if o.skipped_at.as_ref() == Some(at) {
            skipped(o)
        } else {
            "skip".to_owned()
        };
        return format!(
            "It no longer holds ordering key {}{place}: it was released at {at} ({by}), so the \
             key's later messages went on.",
            o.key
        );
    }
    // Skipped, then replayed: it took its place in the key again.
    let before = match &o.skipped_at {
        Some(at) => format!(
            "It was released from ordering key {} at {at} ({}), so the key's later messages went \
             on, and replayed since. ",
            o.key,
            skipped(o)
        ),
        None => String::new(),
    };
    before + &place_sentence(e, o, &place)
}

/// What a message waiting in its key does about its `expires_at`: nothing while it waits — the
/// claim that would send it once the key moves on expires it instead when that time has passed
/// ([`crate::storage::sql`]'s claim). An operator's walk-through read a blocked message whose
/// expiry had passed, and nothing said it would never be sent.
fn expiry_while_waiting(e: &Explanation) -> String {
    match &e.expires_at {
        Some(t) => format!(
            " Its expires_at is {t}: if the key moves on only after that, it is expired then, \
             not sent."
        ),
        None => String::new(),
    }
}

/// Where a keyed message that does not block its key, and was not released from it, stands.
fn place_sentence(e: &Explanation, o: &OrderingFacts, place: &str) -> String {
    if o.head.as_deref() == Some(e.event_id.as_str()) {
        return if matches!(e.state, State::DeadLetter | State::Unconfirmed) {
            format!(
                "It holds ordering key {}{place}: the key's later messages wait until it is \
                 replayed, canceled or skipped (head-of-line policy block).",
                o.key
            )
        } else {
            format!(
                "It is the head of ordering key {}{place}: the key's later messages wait for it.",
                o.key
            )
        };
    }
    match (&o.head, o.head_state) {
        (Some(h), Some(s)) if e.state == State::Scheduled && e.next_attempt_at.is_none() => {
            format!(
                "It waits in ordering key {}{place} behind {h}, the key's head ({s}).{}",
                o.key,
                expiry_while_waiting(e)
            )
        }
        _ => format!("It is in ordering key {}{place}.", o.key),
    }
}

/// Why a keyed message's first attempt came `late` ms after it was due: the place before it in
/// its key, as that place is now.
fn waited_sentence(attempt: i32, late: i64, key: &str, p: &PlaceBefore) -> String {
    let released = match (&p.released_at, &p.skipped_by) {
        (Some(at), Some(who)) => format!("; released at {at}, skipped by {who}"),
        (Some(at), None) => format!("; released at {at} by the skip policy"),
        _ => String::new(),
    };
    format!(
        "Attempt {attempt} went {} after it was due: it waited its turn in ordering key {key} \
         behind {}, the place before it (now {}{released}).",
        human_ms(late),
        p.event_id,
        p.state
    )
}

/// Who refused a message dead-lettered as `permanent`: the receiver (or mail server), by its
/// answer, or Herald itself before any request (no status; the attempt's `error_kind` says
/// why) — support must not chase a receiver that never saw it.
fn permanent_why(e: &Explanation) -> String {
    let last = e.attempt_timeline.last();
    match last
        .filter(|a| a.status.is_none())
        .and_then(|a| a.error_kind.as_deref())
    {
        Some(crate::channels::webhook::REFUSED_DESTINATION) => {
            "Herald's SSRF guard refused its destination, so no request was made \
             (HERALD_ALLOW_NETWORKS exempts a network)"
                .to_owned()
        }
        Some(kind) => {
            format!("Herald could not send it as written ({kind}), so no request was made")
        }
        None if e.channel == Channel::Email => "the mail server refused it permanently".to_owned(),
        None => "the receiver refused it permanently".to_owned(),
    }
}

/// The attempts of the current series whose request may have arrived though no answer came
/// (ambiguous: a timeout, a dropped connection; or a sender lost mid-send) and that Herald went on
/// from — retried, or dead-lettered with its budget spent.
fn may_have_arrived(e: &Explanation) -> Vec<String> {
    let since = e.replays.last().map_or(0, |r| r.series_start);
    e.attempt_timeline
        .iter()
        .filter(|a| {
            a.attempt >= since && matches!(a.next_state.as_str(), "retryable" | "dead_letter")
        })
        .filter(|a| {
            a.class == AttemptClass::Ambiguous
                || Answer::of(a.status, a.error_kind.as_deref()) == Answer::LeaseExpired
        })
        .map(|a| a.attempt.to_string())
        .collect()
}

fn state_sentence(e: &Explanation) -> String {
    match e.state {
        // Left unconfirmed by its last attempt, delivered since: a receipt settled it (also
        // one stored while the attempt was still in flight, settled by a later pass).
        State::Delivered
            if e.attempt_timeline
                .last()
                .is_some_and(|a| a.next_state == "unconfirmed") =>
        {
            "It is delivered: a receipt proved the provider had accepted it, which settled the \
             unconfirmed attempt."
                .to_owned()
        }
        State::Delivered => {
            // An attempt of this series that may have arrived, then retried: the receiver may
            // have it twice (support's question after a timeout; it said nothing of it).
            match may_have_arrived(e).as_slice() {
                [] => "It is delivered.".to_owned(),
                [one] => format!(
                    "It is delivered. Attempt {one} may have arrived too (its answer never came), \
                     so the receiver may have it twice, under the same event id, by which it can \
                     drop the copy."
                ),
                many => format!(
                    "It is delivered. Attempts {} may have arrived too (their answers never came), \
                     so the receiver may have it more than once, under the same event id, by \
                     which it can drop the copies.",
                    many.join(", ")
                ),
            }
        }
        State::DeadLetter => {
            let why = if e.state_reason.as_deref() == Some("unconfirmed") {
                "it stayed unconfirmed past the deadline and no receipt settled it".to_owned()
            } else {
                match e.last_error_class {
                    Some(AttemptClass::Permanent) => permanent_why(e),
                    Some(AttemptClass::Exhausted) => format!(
                        "its attempt budget was spent ({} of {} in this series)",
                        e.series_attempts, e.max_attempts
                    ),
                    Some(c) => format!("of a {c} outcome"),
                    None => "of an outcome not recorded on the message".to_owned(),
                }
            };
            // Dead after timeouts: each request may have arrived (a walk-through read "failed …
            // dead-lettered" of a message whose receiver had all three).
            let arrived = match may_have_arrived(e).as_slice() {
                [] => String::new(),
                [one] => format!(
                    " Attempt {one} may have arrived (its answer never came): the receiver may \
                     have it, under its event id."
                ),
                many => format!(
                    " Attempts {} may have arrived (their answers never came): the receiver may \
                     have it, under its event id.",
                    many.join(", ")
                ),
            };
            format!(
                "It is dead-lettered because {why}; it stays dead until someone replays it.{arrived}"
            )
        }
        State::Unconfirmed => {
            let why = match e.last_error_class {
                Some(AttemptClass::Conflict) => {
                    "the receiver answered 409, so it may already have this event"
                }
                Some(AttemptClass::Ambiguous) => {
                    "the last attempt's outcome is unknown and it is at_most_once"
                }
                _ => "its last outcome was not definite",
            };
            format!(
                "It is unconfirmed: {why}. Herald does not send it again on its own; a receipt can settle it, or a replay sends it again with the same event id."
            )
        }
        State::Expired => {
            // Sent before (and retried) or never sent at all.
            let sent = if e.attempt_timeline.is_empty() {
                "sent"
            } else {
                "sent again"
            };
            // Its last attempt's outcome ended it: the retry would have come after the expiry.
            let at_the_answer = e
                .attempt_timeline
                .last()
                .is_some_and(|a| a.next_state == "expired");
            // Ended before its expiry came: held back (a pause, a limit) until after it.
            let held_past = e.attempt_timeline.is_empty()
                && e.expires_at
                    .as_deref()
                    .is_some_and(|t| t > e.updated_at.as_str());
            match &e.expires_at {
                Some(t) if held_past => format!(
                    "It expired at {}: Herald held it back (its destination paused or limited) until after its expires_at ({t}), so no request was made.",
                    e.updated_at
                ),
                Some(t) if at_the_answer => format!(
                    "It expired {}: the next attempt would have come after its expires_at ({t}), so no further request was made.",
                    match e.attempt_timeline.last() {
                        Some(a) if a.error_kind.as_deref() == Some("lease_expired") => {
                            "when that attempt's lease ran out"
                        }
                        _ => "at that answer",
                    }
                ),
                Some(t) => format!(
                    "It expired: its expires_at ({t}) passed before it could be {sent}, so no further request was made."
                ),
                None => format!("It expired before it could be {sent}."),
            }
        }
        State::Canceled => format!(
            "It was canceled (at {}); nothing more is sent.",
            e.updated_at
        ),
        State::Scheduled | State::Retryable => {
            let mut s = match &e.next_attempt_at {
                Some(t) => format!("It is {}; the next attempt is due at {t}.", e.state),
                None => format!("It is {}.", e.state),
            };
            if held_back(e, AttemptClass::RateLimited) {
                s.push_str(
                    " Herald put it back without making a request: its destination was \
                     paused (a receiver or relay asked Herald to slow down, refused its \
                     session, or could not be reached), at its rate limit, or at its cap on \
                     sends in flight; holding spends no attempt.",
                );
            } else if held_back(e, AttemptClass::NotSent) && e.endpoint_disabled.is_none() {
                // Its class says `not_sent` over what its last attempt said (an operator's
                // walk-through found a message whose only attempt was ambiguous, and one never
                // tried, both `not_sent` after a stop, with no word of why).
                s.push_str(
                    " Herald put it back without making a request: it was claimed but not \
                     sent, because Herald was stopping, or no send slot or SMTP connection came \
                     free in time; that spends no attempt.",
                );
            }
            s
        }
        State::Sending => match &e.lease_until {
            Some(t) => format!(
                "Attempt {} is in flight: a sender claimed it and holds its lease until {t}. A \
                 sender lost before it records the outcome leaves the message to the lease \
                 watchdog of a running Herald after then (the receiver may have it).",
                e.attempts
            ),
            None => "It is marked sending, but no sender holds a lease on it (a row written as \
                     sending by SQL): nothing sends it or takes it back. Write rows as scheduled \
                     (the default)."
                .to_owned(),
        },
    }
}

/// Whether the sender put `e` back without a request, saying `class`: `rate_limited` for a
/// paused destination, its rate or its cap on sends in flight; `not_sent` for a claim it did
/// not send (stopping, no send slot or SMTP connection in time, a disabled endpoint). The
/// message then says that class while no attempt of it does — none was made, or its last one
/// was of another class. (Behind a 429, or a send that was not made, the two cannot be told
/// apart, and that attempt's own sentence says why it waits.)
fn held_back(e: &Explanation, class: AttemptClass) -> bool {
    // Attempts of the current series only: a 429 before the last replay says nothing of now.
    let series = e.replays.len() + 1;
    e.state == State::Retryable
        && e.last_error_class == Some(class)
        && e.attempt_timeline
            .last()
            .filter(|a| a.series == series)
            .is_none_or(|a| a.class != class)
}

/// How much later than the delay `before` set `a` was made, when that is more than a poll's
/// slack (2 s, and a fifth of the delay): time it was held without a request, or waited for a
/// busy sender, which no attempt row records.
fn later_than_set(before: &AttemptEntry, a: &AttemptEntry) -> Option<i64> {
    let delay = before
        .delay_ms
        .filter(|_| before.next_state == "retryable")?;
    later_than_due(&before.finished_at, delay, a)
}

/// How much later than `from` + `delay` ms `a` began, when that is more than a poll's slack.
fn later_than_due(from: &str, delay: i64, a: &AttemptEntry) -> Option<i64> {
    let late = ms_between(from, &a.started_at)? - delay;
    (late > 2_000.max(delay / 5)).then_some(late)
}

/// Milliseconds from one of the explanation's times (RFC 3339) to another.
fn ms_between(from: &str, to: &str) -> Option<i64> {
    let parse = |t: &str| chrono::DateTime::parse_from_rfc3339(t).ok();
    Some((parse(to)? - parse(from)?).num_milliseconds())
}

/// Whether a message was scheduled for later than it was created: by more than a second (on
/// PostgreSQL the two defaults are read a fraction of a millisecond apart, which said "created
/// at X for X+0.1 ms" of every message sent at once).
fn scheduled_later(created_at: &str, scheduled_at: &str) -> bool {
    match ms_between(created_at, scheduled_at) {
        Some(ms) => ms > 1_000,
        None => created_at != scheduled_at,
    }
}

/// The paragraph for `e`.
pub fn narrate(e: &Explanation) -> String {
    let channel = match e.channel {
        Channel::Email => "Email",
        Channel::Webhook => "Webhook",
    };
    let mut parts = vec![format!(
        "{channel} message {} to {} was created at {}{}.",
        e.event_id,
        e.destination,
        e.created_at,
        if scheduled_later(&e.created_at, &e.scheduled_at) {
            format!(" for {}", e.scheduled_at)
        } else {
            String::new()
        }
    )];
    // Claimed, its attempt not yet recorded: the state's sentence says so (it said "No attempt
    // has been made" of a message whose request the receiver already had).
    if e.attempt_timeline.is_empty() && e.state != State::Sending {
        parts.push("No attempt has been made.".to_owned());
    }
    let mut replays = e.replays.iter().peekable();
    let mut before: Option<&AttemptEntry> = None;
    for a in &e.attempt_timeline {
        while let Some(r) = replays.next_if(|r| r.series_start <= a.attempt) {
            parts.push(replay_sentence(r));
            before = None;
        }
        // A keyed message's first attempt that came late: it waited for the place before it.
        // Only when that place ended after this message was due: one that ended before says
        // nothing of its lateness, which the sentence below then gives.
        let due = e.scheduled_at.as_str().max(e.created_at.as_str());
        let waited = match (&e.ordering, before) {
            (Some(o), None) if !e.replays.iter().any(|r| r.series_start <= a.attempt) => o
                .before
                .as_ref()
                .filter(|p| {
                    p.ended_at
                        .as_deref()
                        .and_then(|t| ms_between(due, t))
                        .is_some_and(|ms| ms > 1_000)
                })
                .and_then(|p| later_than_due(due, 0, a).map(|late| (o, p, late))),
            _ => None,
        };
        if let Some((o, p, late)) = waited {
            parts.push(waited_sentence(a.attempt, late, &o.key, p));
        }
        // The first attempt of a series is due when the message was scheduled or replayed.
        let late = match before {
            Some(b) => later_than_set(b, a).map(|l| (l, "the time set")),
            // Said by the sentence above: what it waited behind.
            None if waited.is_some() => None,
            None => {
                // Due when scheduled (a past scheduled_at: when created), or replayed.
                let due = e
                    .replays
                    .iter()
                    .rfind(|r| r.series_start <= a.attempt)
                    .map_or_else(
                        || e.scheduled_at.as_str().max(e.created_at.as_str()),
                        |r| r.replayed_at.as_str(),
                    );
                later_than_due(due, 0, a).map(|l| (l, "it was due"))
            }
        };
        if let Some((late, since)) = late {
            parts.push(format!(
                "Attempt {} went {} after {since}: meanwhile Herald held it without a request \
                 (its destination paused or at a limit, its endpoint disabled) or was busy.",
                a.attempt,
                human_ms(late)
            ));
        }
        parts.push(attempt_sentence(a));
        before = Some(a);
    }
    for r in replays {
        parts.push(replay_sentence(r));
    }
    parts.extend(receipt_sentences(&e.receipt_timeline));
    // Receipts only of sends before its last replay: none yet says anything of the new send.
    if let Some(last) = e.replays.last()
        && !e.receipt_timeline.is_empty()
        && e.receipt_timeline
            .iter()
            .all(|r| r.before_replay_at.is_some())
    {
        parts.push(format!(
            "No receipt has come for the send since the replay at {}.",
            last.replayed_at
        ));
    }
    parts.push(state_sentence(e));
    if let Some(d) = &e.endpoint_disabled {
        let why = d
            .reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        parts.push(format!(
            "It waits for its endpoint {}, which Herald disabled at {}{why}: nothing is sent to \
             it until the endpoint is enabled again (herald endpoint enable {}, or POST \
             /v1/endpoints/{}/enable), and waiting spends no attempt.",
            d.endpoint, d.since, d.endpoint, d.endpoint
        ));
    }
    if let Some(o) = &e.ordering {
        parts.push(ordering_sentence(e, o));
    }
    if let Some(status) = &e.delivery_status {
        let at = e
            .delivery_status_at
            .as_deref()
            .map(|t| format!(" (event time {t})"))
            .unwrap_or_default();
        parts.push(format!(
            "Its delivery status from receipts is {status}{at}."
        ));
    }
    parts.join(" ")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::domain::Semantics;

    pub(crate) fn base(state: State) -> Explanation {
        Explanation {
            event_id: "order-1:shipped".into(),
            fingerprint: Some("ab".repeat(32)),
            channel: Channel::Webhook,
            destination: "https://hooks.example.com/…".into(),
            semantics: Semantics::AtLeastOnce,
            enqueued_by: Some("shop".into()),
            created_at: "2026-12-01T10:00:00.000000Z".into(),
            scheduled_at: "2026-12-01T10:00:00.000000Z".into(),
            expires_at: None,
            updated_at: "2026-12-01T10:05:00.000000Z".into(),
            state,
            state_reason: None,
            last_error_class: None,
            next_attempt_at: None,
            lease_until: None,
            delivery_status: None,
            delivery_status_at: None,
            provider_message_id: None,
            attempts: 0,
            max_attempts: 4,
            series_start: 1,
            series_attempts: 0,
            retry_policy: "default".into(),
            retry_policy_version: Some("default@0000".into()),
            attempt_timeline: Vec::new(),
            receipt_timeline: Vec::new(),
            replays: Vec::new(),
            ordering: None,
            endpoint_disabled: None,
            explanation: String::new(),
        }
    }

    pub(crate) fn attempt(
        n: i32,
        status: Option<i32>,
        class: AttemptClass,
        next: &str,
    ) -> AttemptEntry {
        AttemptEntry {
            attempt: n,
            series: 1,
            started_at: format!("2026-12-01T10:0{n}:00.000000Z"),
            finished_at: format!("2026-12-01T10:0{n}:00.250000Z"),
            duration_ms: 250,
            status,
            error_kind: None,
            class,
            retry_after: None,
            delay_ms: None,
            delay_reason: None,
            policy_version: "default@0000".into(),
            next_state: next.into(),
            provider_message_id: None,
            note: None,
        }
    }

    #[test]
    fn a_retry_after_of_zero_reads_in_seconds() {
        assert_eq!(super::human_retry_after("0"), "0 s");
        assert_eq!(super::human_retry_after("120"), "2 min");
    }

    #[test]
    fn a_receipt_that_settled_an_unconfirmed_attempt_is_named() {
        let mut e = base(State::Delivered);
        e.attempt_timeline = vec![attempt(1, Some(409), AttemptClass::Conflict, "unconfirmed")];
        assert!(narrate(&e).ends_with(
            "It is delivered: a receipt proved the provider had accepted it, which settled the unconfirmed attempt."
        ));
        e.attempt_timeline = vec![attempt(1, Some(200), AttemptClass::Accepted, "delivered")];
        assert!(narrate(&e).ends_with("It is delivered."));
    }

    #[test]
    fn an_attempt_made_well_after_its_time_says_so() {
        let mut e = base(State::Delivered);
        let mut a1 = attempt(1, Some(503), AttemptClass::Transient, "retryable");
        a1.delay_ms = Some(1000);
        let mut a2 = attempt(2, Some(200), AttemptClass::Accepted, "delivered");
        // Set for 10:01:01.25; made 6 s later (a destination paused by another's 429).
        a2.started_at = "2026-12-01T10:01:07.250000Z".into();
        e.attempt_timeline = vec![a1.clone(), a2.clone()];
        let text = narrate(&e);
        assert!(
            text.contains("Attempt 2 went 6 s after the time set: meanwhile Herald held it"),
            "{text}"
        );
        assert!(text.find("went 6 s").unwrap() < text.find("Attempt 2 at").unwrap());
        // Within a poll's slack: nothing to say.
        a2.started_at = "2026-12-01T10:01:02.500000Z".into();
        e.attempt_timeline = vec![a1, a2];
        assert!(!narrate(&e).contains("after the time set"));
        // The first attempt, against when it was due (scheduled, here at creation).
        assert!(
            narrate(&e).contains("Attempt 1 went 1 min after it was due: meanwhile Herald held it"),
            "{}",
            narrate(&e)
        );
        e.scheduled_at = "2026-12-01T10:00:59.000000Z".into();
        assert!(!narrate(&e).contains("after it was due"));
        // Scheduled in the past: due when it was created.
        e.scheduled_at = "2026-12-01T07:00:00.000000Z".into();
        assert!(narrate(&e).contains("Attempt 1 went 1 min after it was due"));
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human_ms(850), "850 ms");
        assert_eq!(human_ms(4080), "4.08 s");
        assert_eq!(human_ms(1000), "1 s");
        assert_eq!(human_ms(59_990), "59.99 s");
        assert_eq!(human_ms(126_000), "2 min 6 s");
        assert_eq!(human_ms(120_000), "2 min");
        assert_eq!(human_ms(7_260_000), "2 h 1 min");
        assert_eq!(human_ms(-5), "0 ms");
    }

    #[test]
    fn delivered_at_once() {
        let mut e = base(State::Delivered);
        e.attempts = 1;
        e.attempt_timeline = vec![attempt(1, Some(200), AttemptClass::Accepted, "delivered")];
        e.attempt_timeline[0].delay_reason = Some("accepted by the receiver".into());
        e.attempt_timeline[0].started_at = "2026-12-01T10:00:00.005000Z".into();
        e.attempt_timeline[0].finished_at = "2026-12-01T10:00:00.255000Z".into();
        assert_eq!(
            narrate(&e),
            "Webhook message order-1:shipped to https://hooks.example.com/… was created at \
             2026-12-01T10:00:00.000000Z. Attempt 1 at 2026-12-01T10:00:00.005000Z got 200 after \
             250 ms, classified accepted; the receiver accepted it: delivered at \
             2026-12-01T10:00:00.255000Z. It is delivered."
        );
    }

    #[test]
    fn retried_then_delivered_names_each_delay_and_why() {
        let mut e = base(State::Delivered);
        let mut a1 = attempt(1, Some(503), AttemptClass::Transient, "retryable");
        a1.delay_ms = Some(1040);
        a1.delay_reason = Some(
            "transient: backoff after attempt 1: min(cap 60s, base 1s × 2^0) = 1.000s, jitter +4.0% → 1.040s".into(),
        );
        let mut a2 = attempt(2, Some(429), AttemptClass::RateLimited, "retryable");
        a2.retry_after = Some("120".into());
        a2.delay_ms = Some(126_000);
        a2.delay_reason = Some("rate_limited: Retry-After 120s, jitter +6.000s → 126.000s".into());
        let a3 = attempt(3, Some(200), AttemptClass::Accepted, "delivered");
        e.attempt_timeline = vec![a1, a2, a3];
        e.delivery_status = Some("bounced".into());
        e.delivery_status_at = Some("2026-12-01T10:09:00.000000Z".into());
        e.receipt_timeline = vec![ReceiptEntry {
            source: "resend".into(),
            provider_event_id: "evt_1".into(),
            event_type: "bounced".into(),
            provider_type: "email.bounced".into(),
            event_time: Some("2026-12-01T10:09:00.000000Z".into()),
            received_at: "2026-12-01T10:09:02.000000Z".into(),
            reconciled_at: Some("2026-12-01T10:09:02.100000Z".into()),
            outcome: Some("applied".into()),
            outcome_reason: Some("newer than the current status".into()),
            before_replay_at: None,
        }];
        let text = narrate(&e);
        for want in [
            "Attempt 1 at 2026-12-01T10:01:00.000000Z got 503 after 250 ms, classified transient; \
             Herald set the next attempt 1.04 s later (backoff after attempt 1: min(cap 60s, base 1s × 2^0) = 1.000s, \
             jitter +4.0% → 1.040s).",
            "Attempt 2 at 2026-12-01T10:02:00.000000Z got 429 with Retry-After 2 min after 250 ms, \
             classified rate_limited; Herald set the next attempt 2 min 6 s later (Retry-After 120s, jitter +6.000s → \
             126.000s).",
            "Attempt 3 at 2026-12-01T10:03:00.000000Z got 200 after 250 ms, classified accepted; \
             the receiver accepted it: delivered at 2026-12-01T10:03:00.250000Z.",
            "Receipt from resend: the recipient's server bounced it at 2026-12-01T10:09:00.000000Z \
             (arrived 2026-12-01T10:09:02.000000Z; applied: newer than the current status).",
            "It is delivered. Its delivery status from receipts is bounced (event time \
             2026-12-01T10:09:00.000000Z).",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn dead_lettered_permanent_and_exhausted() {
        let mut e = base(State::DeadLetter);
        e.last_error_class = Some(AttemptClass::Permanent);
        let mut a = attempt(1, Some(404), AttemptClass::Permanent, "dead_letter");
        a.delay_reason = Some("permanent refusal: dead-lettered at once".into());
        e.attempt_timeline = vec![a];
        let text = narrate(&e);
        assert!(
            text.contains("got 404 after 250 ms, classified permanent; Herald dead-lettered it (permanent refusal: dead-lettered at once)."),
            "{text}"
        );
        assert!(
            text.ends_with("It is dead-lettered because the receiver refused it permanently; it stays dead until someone replays it."),
            "{text}"
        );

        // Refused by Herald before any request: not the receiver.
        let mut e = base(State::DeadLetter);
        e.last_error_class = Some(AttemptClass::Permanent);
        let mut a = attempt(1, None, AttemptClass::Permanent, "dead_letter");
        a.error_kind = Some("refused_destination".into());
        e.attempt_timeline = vec![a];
        let text = narrate(&e);
        assert!(
            text.contains("It is dead-lettered because Herald's SSRF guard refused its destination, so no request was made"),
            "{text}"
        );
        e.attempt_timeline[0].error_kind = Some("unknown_endpoint".into());
        assert!(
            narrate(&e).contains("because Herald could not send it as written (unknown_endpoint), so no request was made"),
            "{}",
            narrate(&e)
        );
        e.attempt_timeline[0].status = Some(550);
        e.attempt_timeline[0].error_kind = None;
        e.channel = Channel::Email;
        assert!(narrate(&e).contains("because the mail server refused it permanently"));

        let mut e = base(State::DeadLetter);
        e.last_error_class = Some(AttemptClass::Exhausted);
        e.attempts = 2;
        e.series_attempts = 2;
        e.max_attempts = 2;
        let mut a1 = attempt(1, None, AttemptClass::NotSent, "retryable");
        a1.error_kind = Some("connect".into());
        a1.delay_ms = Some(1000);
        let mut a2 = attempt(2, Some(500), AttemptClass::Transient, "dead_letter");
        a2.delay_reason = Some("attempt budget spent (2 of 2); last attempt was transient".into());
        e.attempt_timeline = vec![a1, a2];
        let text = narrate(&e);
        assert!(
            text.contains("failed (connect) after 250 ms, classified not_sent; Herald set the next attempt 1 s later."),
            "{text}"
        );
        assert!(
            text.contains("Herald dead-lettered it (attempt budget spent (2 of 2); last attempt was transient)."),
            "{text}"
        );
        assert!(
            text.contains("its attempt budget was spent (2 of 2 in this series)"),
            "{text}"
        );
        assert!(!text.contains("may have arrived"), "{text}");
        // Dead after timeouts: each request may have arrived, and it says so.
        e.attempt_timeline = vec![
            attempt(1, None, AttemptClass::Ambiguous, "retryable"),
            attempt(2, None, AttemptClass::Ambiguous, "dead_letter"),
        ];
        let text = narrate(&e);
        assert!(
            text.ends_with(
                "replays it. Attempts 1, 2 may have arrived (their answers never came): the \
                 receiver may have it, under its event id."
            ),
            "{text}"
        );
    }

    #[test]
    fn unconfirmed_after_a_409() {
        let mut e = base(State::Unconfirmed);
        e.last_error_class = Some(AttemptClass::Conflict);
        let mut a = attempt(1, Some(409), AttemptClass::Conflict, "unconfirmed");
        a.delay_reason = Some("409 conflict: the receiver may already have this event; settle by event id, no blind retry".into());
        e.attempt_timeline = vec![a];
        let text = narrate(&e);
        assert!(text.contains("got 409 after 250 ms, classified conflict; Herald left it unconfirmed (409 conflict: the receiver may already have this event"), "{text}");
        assert!(
            text.contains("It is unconfirmed: the receiver answered 409, so it may already have this event. Herald does not send it again on its own"),
            "{text}"
        );
        // Dead-lettered at the unconfirmed deadline.
        e.state = State::DeadLetter;
        e.state_reason = Some("unconfirmed".into());
        assert!(narrate(&e).contains(
            "dead-lettered because it stayed unconfirmed past the deadline and no receipt settled it"
        ));
    }

    #[test]
    fn expired_before_any_attempt() {
        let mut e = base(State::Expired);
        e.expires_at = Some("2026-12-01T10:01:00.000000Z".into());
        assert_eq!(
            narrate(&e),
            "Webhook message order-1:shipped to https://hooks.example.com/… was created at \
             2026-12-01T10:00:00.000000Z. No attempt has been made. It expired: its expires_at \
             (2026-12-01T10:01:00.000000Z) passed before it could be sent, so no further request \
             was made."
        );
        // Sent once and retried: it could not be sent *again*.
        e.attempt_timeline = vec![attempt(1, Some(503), AttemptClass::Transient, "retryable")];
        assert!(
            narrate(&e).contains("passed before it could be sent again"),
            "{}",
            narrate(&e)
        );
        // Held back past its expiry before any attempt: ended then.
        let mut held = base(State::Expired);
        held.expires_at = Some("2026-12-01T10:01:00.000000Z".into());
        held.updated_at = "2026-12-01T10:00:05.000000Z".into();
        assert!(
            narrate(&held).contains(
                "It expired at 2026-12-01T10:00:05.000000Z: Herald held it back (its destination \
                 paused or limited) until after its expires_at (2026-12-01T10:01:00.000000Z)"
            ),
            "{}",
            narrate(&held)
        );
        // Ended by the watchdog when its lease ran out: no answer came.
        let mut lost = attempt(1, None, AttemptClass::Ambiguous, "expired");
        lost.error_kind = Some("lease_expired".into());
        e.attempt_timeline = vec![lost];
        assert!(
            narrate(&e).contains("It expired when that attempt's lease ran out: the next attempt"),
            "{}",
            narrate(&e)
        );
        // Ended by its attempt's answer: the retry would have come after the expiry.
        e.attempt_timeline = vec![attempt(1, Some(429), AttemptClass::RateLimited, "expired")];
        assert!(
            narrate(&e).contains(
                "It expired at that answer: the next attempt would have come after its \
                 expires_at (2026-12-01T10:01:00.000000Z)"
            ),
            "{}",
            narrate(&e)
        );
    }

    #[test]
    fn delivered_after_an_attempt_that_may_have_arrived_says_it_may_be_there_twice() {
        let mut e = base(State::Delivered);
        e.attempt_timeline = vec![
            attempt(1, None, AttemptClass::Ambiguous, "retryable"),
            attempt(2, Some(503), AttemptClass::Transient, "retryable"),
            attempt(3, Some(250), AttemptClass::Accepted, "delivered"),
        ];
        let text = narrate(&e);
        assert!(
            text.ends_with(
                "It is delivered. Attempt 1 may have arrived too (its answer never came), so the \
                 receiver may have it twice, under the same event id, by which it can drop the copy."
            ),
            "{text}"
        );
        e.attempt_timeline[1] = attempt(2, None, AttemptClass::Ambiguous, "retryable");
        assert!(narrate(&e).contains("Attempts 1, 2 may have arrived too"));
        // Before a replay: the replay's own sentence says it was sent again.
        e.replays = vec![ReplayEntry {
            replayed_at: "2026-12-01T10:01:30.000000Z".into(),
            who: "support-ana".into(),
            reason: "again".into(),
            from_state: State::Delivered,
            forced: true,
            series_start: 3,
            expires_at_before: None,
            expires_at_after: None,
        }];
        assert!(narrate(&e).ends_with("It is delivered."), "{}", narrate(&e));
        // Nothing ambiguous: nothing said.
        let mut plain = base(State::Delivered);
        plain.attempt_timeline = vec![
            attempt(1, Some(503), AttemptClass::Transient, "retryable"),
            attempt(2, Some(250), AttemptClass::Accepted, "delivered"),
        ];
        assert!(narrate(&plain).ends_with("It is delivered."));
    }

    #[test]
    fn a_replay_sits_between_the_series() {
        let mut e = base(State::Delivered);
        e.attempt_timeline = vec![
            attempt(1, Some(404), AttemptClass::Permanent, "dead_letter"),
            attempt(2, Some(200), AttemptClass::Accepted, "delivered"),
        ];
        e.replays = vec![ReplayEntry {
            replayed_at: "2026-12-01T10:01:30.000000Z".into(),
            who: "support-ana".into(),
            reason: "endpoint fixed".into(),
            from_state: State::DeadLetter,
            forced: false,
            series_start: 2,
            expires_at_before: Some("2026-12-01T10:01:10.000000Z".into()),
            expires_at_after: None,
        }];
        let text = narrate(&e);
        let replay = text
            .find("At 2026-12-01T10:01:30.000000Z support-ana replayed it from dead_letter (reason: \u{201c}endpoint fixed\u{201d}); a new attempt series began at attempt 2 with the same event id and expires_at cleared.")
            .expect(&text);
        assert!(text.find("Attempt 1 ").unwrap() < replay);
        assert!(replay < text.find("Attempt 2 ").unwrap());
        assert!(!text.contains("No receipt"), "no receipt at all: {text}");

        // Receipts of the send before it are said to be; with none since, that is said too.
        let receipt = |before: Option<&str>| ReceiptEntry {
            source: "sg".into(),
            provider_event_id: "evt".into(),
            event_type: "bounced".into(),
            provider_type: "bounce".into(),
            event_time: Some("2026-12-01T10:00:50.000000Z".into()),
            received_at: "2026-12-01T10:00:51.000000Z".into(),
            reconciled_at: None,
            outcome: Some("applied".into()),
            outcome_reason: None,
            before_replay_at: before.map(str::to_owned),
        };
        e.receipt_timeline = vec![receipt(Some("2026-12-01T10:01:30.000000Z"))];
        let text = narrate(&e);
        assert!(
            text.contains(
                "Receipt from sg of the send before the replay at 2026-12-01T10:01:30.000000Z: \
                 the recipient's server bounced it at 2026-12-01T10:00:50.000000Z"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "No receipt has come for the send since the replay at 2026-12-01T10:01:30.000000Z."
            ),
            "{text}"
        );
        e.receipt_timeline.push(receipt(None));
        let text = narrate(&e);
        assert!(!text.contains("No receipt"), "{text}");
        assert!(
            text.contains("Receipt from sg: the recipient's server"),
            "{text}"
        );
        // Thousands of receipts (opens): the bounce that set the status, the latest 19, and a
        // count of the rest — not one sentence each (1.17 M characters, a walk-through).
        let open = |n: usize| ReceiptEntry {
            provider_event_id: format!("open-{n}"),
            event_type: "open".into(),
            provider_type: "open".into(),
            outcome: Some("history".into()),
            ..receipt(None)
        };
        e.receipt_timeline = vec![open(0), receipt(None)];
        e.receipt_timeline.extend((1..6000).map(open));
        let text = narrate(&e);
        assert!(text.len() < 10_000, "{}", text.len());
        assert!(
            text.contains(
                "Of its 6001 receipts, 5981 are not told here (open 5981): the receipt timeline \
                 lists every one"
            ),
            "{text}"
        );
        assert_eq!(text.matches("Receipt from sg").count(), 20, "{text}");
        assert!(text.contains("the recipient's server bounced it"), "{text}");
    }

    #[test]
    fn pending_in_flight_and_canceled() {
        let mut e = base(State::Retryable);
        e.next_attempt_at = Some("2026-12-01T10:07:00.000000Z".into());
        assert!(
            narrate(&e).ends_with(
                "It is retryable; the next attempt is due at 2026-12-01T10:07:00.000000Z."
            )
        );
        // Put back without a request: no attempt says rate_limited, the message does.
        e.last_error_class = Some(AttemptClass::RateLimited);
        let held = " Herald put it back without making a request: its destination was paused";
        assert!(narrate(&e).contains(held), "{}", narrate(&e));
        e.attempt_timeline = vec![attempt(1, Some(503), AttemptClass::Transient, "retryable")];
        assert!(narrate(&e).contains(held));
        e.attempt_timeline = vec![attempt(
            1,
            Some(429),
            AttemptClass::RateLimited,
            "retryable",
        )];
        assert!(!narrate(&e).contains(held));
        e.attempt_timeline.clear();
        e.last_error_class = Some(AttemptClass::Transient);
        assert!(!narrate(&e).contains(held));
        // Claimed and not sent (Herald stopping): never tried, or over an earlier ambiguous.
        e.last_error_class = Some(AttemptClass::NotSent);
        let unsent = " Herald put it back without making a request: it was claimed but not sent";
        assert!(narrate(&e).contains(unsent), "{}", narrate(&e));
        e.attempt_timeline = vec![attempt(1, None, AttemptClass::Ambiguous, "retryable")];
        assert!(narrate(&e).contains(unsent), "{}", narrate(&e));
        // A send that failed to connect says so itself.
        e.attempt_timeline = vec![attempt(1, None, AttemptClass::NotSent, "retryable")];
        assert!(!narrate(&e).contains(unsent));
        // Claimed, its attempt not recorded yet: in flight, not "no attempt" (a walk-through
        // read both of a message the receiver already had), with the lease it holds.
        let mut e = base(State::Sending);
        e.attempts = 1;
        e.lease_until = Some("2026-12-01T10:00:30.000000Z".into());
        let text = narrate(&e);
        assert!(!text.contains("No attempt has been made"), "{text}");
        assert!(
            text.contains(
                "Attempt 1 is in flight: a sender claimed it and holds its lease until \
                 2026-12-01T10:00:30.000000Z."
            ),
            "{text}"
        );
        e.lease_until = None;
        assert!(narrate(&e).contains("no sender holds a lease on it"));
        assert!(
            narrate(&base(State::Canceled)).ends_with(
                "It was canceled (at 2026-12-01T10:05:00.000000Z); nothing more is sent."
            )
        );
        let mut e = base(State::Delivered);
        e.channel = Channel::Email;
        // A fraction of a millisecond apart (PostgreSQL's two defaults): not scheduled later.
        e.scheduled_at = "2026-12-01T10:00:00.000096Z".into();
        assert!(narrate(&e).contains("was created at 2026-12-01T10:00:00.000000Z."));
        e.scheduled_at = "2026-12-01T11:00:00.000000Z".into();
        assert!(narrate(&e).starts_with("Email message order-1:shipped to https://hooks.example.com/… was created at 2026-12-01T10:00:00.000000Z for 2026-12-01T11:00:00.000000Z."));
    }

    #[test]
    fn an_expired_lease_and_a_lost_one_are_told_apart() {
        let mut a = attempt(1, None, AttemptClass::Ambiguous, "retryable");
        a.error_kind = Some("lease_expired".into());
        assert!(attempt_sentence(&a).contains(
            "lost its sender before an outcome was recorded (the lease watchdog found it 250 ms \
             after it began)"
        ));
        let a = attempt(1, Some(200), AttemptClass::Accepted, "lease_lost");
        assert!(attempt_sentence(&a).contains("was not applied"));
    }

    fn keyed(e: &mut Explanation, head: &str, head_state: State, blocked: bool) {
        e.ordering = Some(OrderingFacts {
            key: "order-1".into(),
            seq: Some(2),
            policy: None,
            policy_applied: crate::domain::OrderingPolicy::Block,
            head: Some(head.into()),
            head_state: Some(head_state),
            blocked_by: blocked.then(|| head.to_owned()),
            released_at: None,
            skipped_by: None,
            skip_reason: None,
            skipped_at: None,
            before: None,
        });
    }

    #[test]
    fn a_keyed_message_says_where_it_stands_in_its_key() {
        let mut e = base(State::Scheduled);
        keyed(&mut e, "order-1:created", State::DeadLetter, true);
        let text = narrate(&e);
        assert!(
            text.contains("blocked by order-1:created, the key's head, which is dead_letter"),
            "{text}"
        );
        assert!(text.contains("replayed, canceled or skipped"), "{text}");
        assert!(!text.contains("expires_at"), "{text}");
        // Waiting does not expire it; the claim after the key moves on does.
        e.expires_at = Some("2026-12-01T10:01:00.000000Z".into());
        let text = narrate(&e);
        assert!(
            text.contains(
                "skipped. Its expires_at is 2026-12-01T10:01:00.000000Z: if the key moves on only \
                 after that, it is expired then, not sent."
            ),
            "{text}"
        );
        let mut e = base(State::Scheduled);
        keyed(&mut e, "order-1:created", State::Sending, false);
        let text = narrate(&e);
        assert!(
            text.contains("waits in ordering key order-1 (place 2) behind order-1:created"),
            "{text}"
        );
        let mut e = base(State::DeadLetter);
        keyed(&mut e, "order-1:shipped", State::DeadLetter, false);
        assert!(narrate(&e).contains("It holds ordering key order-1 (place 2)"));
        let mut e = base(State::DeadLetter);
        keyed(&mut e, "x", State::Sending, false);
        if let Some(o) = e.ordering.as_mut() {
            o.released_at = Some("2026-12-01T10:06:00.000000Z".into());
        }
        assert!(narrate(&e).contains("released at 2026-12-01T10:06:00.000000Z (skip)"));
        // A skip before (then replayed) is not this release's.
        if let Some(o) = e.ordering.as_mut() {
            o.skipped_by = Some("desk".into());
            o.skip_reason = Some("order voided".into());
            o.skipped_at = Some("2026-12-01T10:01:00.000000Z".into());
        }
        assert!(narrate(&e).contains("released at 2026-12-01T10:06:00.000000Z (skip)"));
        if let Some(o) = e.ordering.as_mut() {
            o.skipped_at = o.released_at.clone();
        }
        assert!(
            narrate(&e).contains(
                "released at 2026-12-01T10:06:00.000000Z (skipped by desk: \u{201c}order voided\u{201d})"
            )
        );
        // Skipped, then replayed and delivered: the skip is still told.
        let mut e = base(State::Delivered);
        keyed(&mut e, "x", State::Sending, false);
        if let Some(o) = e.ordering.as_mut() {
            o.skipped_by = Some("desk".into());
            o.skip_reason = Some("order voided".into());
            o.skipped_at = Some("2026-12-01T10:01:00.000000Z".into());
        }
        assert!(
            narrate(&e).ends_with(
                "It was released from ordering key order-1 at 2026-12-01T10:01:00.000000Z \
                 (skipped by desk: \u{201c}order voided\u{201d}), so the key's later messages \
                 went on, and replayed since. It is in ordering key order-1 (place 2)."
            ),
            "{}",
            narrate(&e)
        );
        let mut e = base(State::Delivered);
        keyed(&mut e, "x", State::Sending, false);
        assert!(narrate(&e).ends_with("It is in ordering key order-1 (place 2)."));
        assert!(!narrate(&base(State::Delivered)).contains("ordering key"));
    }

    #[test]
    fn a_keyed_message_sent_late_says_what_it_waited_behind() {
        let mut e = base(State::Delivered);
        keyed(&mut e, "x", State::Sending, false);
        // Due at 10:00, first attempt at 10:03: it waited for the place before it.
        e.attempt_timeline = vec![attempt(3, Some(200), AttemptClass::Accepted, "delivered")];
        let before = |released: Option<&str>, who: Option<&str>| PlaceBefore {
            event_id: "order-1:created".into(),
            state: State::DeadLetter,
            released_at: released.map(str::to_owned),
            skipped_by: who.map(str::to_owned),
            // It stopped holding the key a second before this message's attempt.
            ended_at: Some("2026-12-01T10:02:59.000000Z".into()),
        };
        let said = |e: &Explanation| {
            narrate(e)
                .split(". ")
                .find(|s| s.contains("waited its turn"))
                .map(str::to_owned)
        };
        assert_eq!(said(&e), None, "nothing known of the place before it");
        let at = "2026-12-01T10:02:59.000000Z";
        for (released, who, tail) in [
            (None, None, "(now dead_letter)".to_owned()),
            (
                Some(at),
                Some("desk"),
                format!("(now dead_letter; released at {at}, skipped by desk)"),
            ),
            (
                Some(at),
                None,
                format!("(now dead_letter; released at {at} by the skip policy)"),
            ),
        ] {
            e.ordering.as_mut().unwrap().before = Some(before(released, who));
            let text = said(&e).unwrap_or_else(|| narrate(&e));
            assert!(
                text.starts_with("Attempt 3 went 3 min after it was due: it waited its turn in ordering key order-1 behind order-1:created, the place before it ")
                    && text.contains(&tail),
                "{text}"
            );
        }
        // A place that ended before this message was due, or one not known to have ended, says
        // nothing of its lateness: the general sentence gives it.
        for ended in [Some("2026-12-01T09:59:00.000000Z"), None] {
            let mut early = e.clone();
            if let Some(p) = early.ordering.as_mut().and_then(|o| o.before.as_mut()) {
                p.ended_at = ended.map(str::to_owned);
            }
            assert_eq!(said(&early), None, "{ended:?}");
            assert!(
                narrate(&early)
                    .contains("Attempt 3 went 3 min after it was due: meanwhile Herald held it"),
                "{}",
                narrate(&early)
            );
        }
        assert!(
            !narrate(&e).contains("meanwhile Herald held it"),
            "one reason, not two: {}",
            narrate(&e)
        );
        // On time, or a replayed series (due at its replay): not said.
        let mut on_time = e.clone();
        on_time.attempt_timeline[0].started_at = "2026-12-01T10:00:01.000000Z".into();
        assert_eq!(said(&on_time), None);
        let mut replayed = e.clone();
        replayed.replays = vec![ReplayEntry {
            replayed_at: "2026-12-01T10:02:00.000000Z".into(),
            who: "desk".into(),
            reason: "again".into(),
            from_state: State::DeadLetter,
            forced: false,
            series_start: 3,
            expires_at_before: None,
            expires_at_after: None,
        }];
        assert_eq!(said(&replayed), None);
    }
}
