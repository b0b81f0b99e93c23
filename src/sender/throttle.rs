//! Per-destination slow-down. A receiver that says "slow down" — HTTP 429 or a 503 with
//! `Retry-After`, an SMTP 421 (at the greeting or later), an SMTP relay refusing Herald's
//! session (its login, TLS, greeting) — or that answers with a burst of transient errors, or
//! cannot be reached at all in a burst of tries (connection refused, no such name, connect
//! timeout), slows **every** message bound to it, not only the one that got the answer:
//! until the pause ends, messages for that destination are put back (`retryable` shortly after
//! the pause's end, spread out) without a request and without spending an attempt.
//!
//! The pause is the destination's own, not any one message's backoff: the `Retry-After` it asked
//! for (as the retry policy clamps it), else the policy's base delay doubled for every pause in a
//! row, at most [`MAX_PAUSE`]; an accepted answer ends the row. Answers that come during a pause
//! (of sends already out when it began) do not add to the row.
//!
//! A destination is a webhook URL's scheme, host and port, or the SMTP relay. Pauses are kept per
//! Herald process: each process learns one from the first such answer it sees.
//! [`Throttle::observe`] and [`Throttle::paused_until`] are the whole interface; the rules are
//! [`slows_down`] and [`pause_length`], plain functions.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::AttemptClass;

/// The pause key of the SMTP relay: every email goes through the one relay configured. A
/// webhook's is its URL's scheme, host and port.
pub const SMTP_RELAY: &str = "smtp";

/// What is paused at one moment ([`Throttle::paused_count`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Paused {
    /// Webhook destinations (scheme, host and port) paused.
    pub webhook: usize,
    /// The SMTP relay is paused.
    pub relay: bool,
}

/// Transient answers from one destination within [`BURST_WINDOW`] that count as a burst.
pub const BURST_COUNT: usize = 5;
/// The window of a burst.
pub const BURST_WINDOW: Duration = Duration::from_secs(10);
/// The longest pause without a `Retry-After` asking for more.
pub const MAX_PAUSE: Duration = Duration::from_secs(300);
/// The most messages a destination remembers having spent an attempt on it while it could not
/// be reached or refused the session ([`Observed::back`]); those past them go at their own
/// backoff.
pub const MAX_BACK: usize = 1024;

/// How long after its last pause a destination that could not be reached keeps the messages to
/// bring back ([`Observed::back`]) while none is due to probe it (their backoff, which grows to
/// hours, is longer than the pause): about as long as the default retry schedule lasts.
pub const KEEP_SPENT: Duration = Duration::from_secs(24 * 3600);

/// Beyond this many troubled destinations in one process (a flood of messages to dead hosts),
/// those whose pause is over forget their messages to bring back after minutes, not a day: the
/// map and the lock every claim takes stay small.
pub const MAX_KEPT: usize = 4096;

/// Drops the destinations there is nothing to remember of ([`Entry::forgotten`]).
fn forget(entries: &mut HashMap<String, Entry>, now: DateTime<Utc>) {
    let keep_spent = entries.len() <= MAX_KEPT;
    entries.retain(|_, e| !e.forgotten(now, keep_spent));
}

/// What [`Throttle::observe`] learnt from one answer.
#[derive(Debug, Default, PartialEq)]
pub struct Observed {
    /// The pause it started (or armed again), if it did.
    pub paused_until: Option<DateTime<Utc>>,
    /// The probe's acceptance, after a pause because the destination could not be reached or
    /// refused Herald's session: the messages that spent an attempt on that meanwhile, to be
    /// tried again now rather than at their own backoff, which grew while it was down (a
    /// probe's could reach hours), and those held while the probe was out (up to [`MAX_BACK`]
    /// in all, the accepted one not among them). Those held by the pause itself come back at
    /// its end.
    pub back: Vec<i64>,
}

/// What one answer tells about its destination.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answer<'a> {
    pub class: AttemptClass,
    /// HTTP status or SMTP reply code.
    pub status: Option<u16>,
    /// The wait the receiver asked for (`Retry-After`, clamped by the retry policy).
    pub asked: Option<Duration>,
    pub is_smtp: bool,
    /// The error kind, when the answer has one (`smtp_auth_refused`, `recipients_refused`, …).
    pub error_kind: Option<&'a str>,
    /// The message it answered (a probe's answer ends the probe).
    pub message: i64,
    /// It came over a connection opened before this send ([`crate::channels::SendReport::reused_connection`]):
    /// it says nothing of whether new connections are taken.
    pub reused: bool,
}

/// SMTP error kinds that say the relay refused Herald's session itself — its greeting, STARTTLS,
/// TLS, the login, or a `530` asking for one: a configuration fault (or a relay refusing every
/// client), the same for every message. Each pauses the relay at once, so that the messages
/// behind the one that met it wait without spending attempts while the operator mends it.
pub const SESSION_REFUSED: &[&str] = crate::channels::email::kind::SESSION_REFUSED;

/// Error kinds of a send that never reached its destination: the connection refused, the name
/// not resolved, the connect timed out, the TLS handshake failed (a webhook's `connect` is all of
/// these), or an SMTP relay's connection closed before its greeting. Such failures count towards
/// a burst; a pause they start is probed by one message before the others go (a destination that
/// is down is down for all), and a probe that still cannot reach it pauses it again at once.
pub const UNREACHABLE: &[&str] = &["connect", "connect_timeout"];

impl Answer<'_> {
    /// The send never reached the destination ([`UNREACHABLE`]): no reply, no status.
    fn unreachable(&self) -> bool {
        self.status.is_none() && self.error_kind.is_some_and(|k| UNREACHABLE.contains(&k))
    }

    fn session_refused(&self) -> bool {
        self.is_smtp
            && self
                .error_kind
                .is_some_and(|k| SESSION_REFUSED.contains(&k))
    }
}

/// Whether `answer` (with `recent_transient` transient answers from the same destination within
/// the burst window before it; `probe`: it is the answer of the message that went first after a
/// pause) asks for the whole destination to slow down:
/// - a 429, or a 503 with `Retry-After`;
/// - an SMTP 421 ("service not available, closing channel"), whatever stage it came at;
/// - the relay refusing Herald's session ([`SESSION_REFUSED`]);
/// - the [`BURST_COUNT`]-th transient answer (an SMTP 4xx at the greeting included) within
///   [`BURST_WINDOW`]. Refused recipients (`recipients_refused`: a full mailbox, say) are the
///   recipients' own, not the relay's: they do not count. A destination that could not be
///   reached ([`UNREACHABLE`]) counts as a transient answer;
/// - a probe that could not reach the destination: it is still down.
pub fn slows_down(answer: &Answer<'_>, recent_transient: usize, probe: bool) -> bool {
    match (answer.class, answer.status, answer.is_smtp) {
        (_, Some(421), true) => true,
        _ if answer.session_refused() => true,
        _ if probe && answer.unreachable() => true,
        (AttemptClass::RateLimited, _, _) => true,
        (AttemptClass::Transient, Some(503), false) => answer.asked.is_some(),
        _ if is_transient(answer) => recent_transient + 1 >= BURST_COUNT,
        _ => false,
    }
}

/// A transient answer for the burst count: the class, an SMTP 4xx that stopped the session
/// before the envelope (classed `not_sent`: nothing left), no answer at all because the
/// destination could not be reached ([`UNREACHABLE`]), or none because it stopped answering a
/// request it had (`ambiguous` without a status: a timeout, a dropped connection) — a receiver
/// that hangs or drops is as troubled as one answering 500 (an operator's walk-through: 30
/// messages to a hanging receiver made 80 attempts in 12 s, none paused).
fn is_transient(answer: &Answer<'_>) -> bool {
    answer.error_kind != Some(crate::channels::email::kind::RECIPIENTS_REFUSED)
        && (answer.class == AttemptClass::Transient
            || answer.unreachable()
            || (answer.class == AttemptClass::Ambiguous && answer.status.is_none())
            || (answer.is_smtp && matches!(answer.status, Some(400..=499))))
}

/// How long the destination is left alone: what it asked for, else `base` doubled for each
/// earlier pause in a row (`streak`), at most [`MAX_PAUSE`].
pub fn pause_length(asked: Option<Duration>, base: Duration, streak: u32) -> Duration {
    asked.unwrap_or_else(|| base.saturating_mul(1u32 << streak.min(16)).min(MAX_PAUSE))
}

#[derive(Debug, Default)]
struct Entry {
    paused_until: Option<DateTime<Utc>>,
    /// Pauses in a row, without an accepted answer between them.
    streak: u32,
    transient: Vec<DateTime<Utc>>,
    /// The last pause came from the relay refusing the session ([`SESSION_REFUSED`]) or from a
    /// destination that could not be reached ([`UNREACHABLE`]): once it ends, one message goes
    /// first (the probe) and the others wait for its answer, rather than each spending an
    /// attempt on the same refusal.
    half_open: bool,
    /// The probe in flight: its message id, and since when.
    probe: Option<(i64, DateTime<Utc>)>,
    /// Tries in a row that could not reach the destination ([`UNREACHABLE`]), however slowly
    /// each failed: a connect that runs into its timeout (5 s, or the SMTP timeout's 30 s) never
    /// makes a burst within [`BURST_WINDOW`], and a relay dropping connections silently cost
    /// every message its attempts. Any reply ends the row.
    unreachable: usize,
    /// The messages whose try could not reach the destination or was refused its session, in
    /// the order they came, each once, at most [`MAX_BACK`] ([`Observed::back`]).
    spent: Vec<i64>,
    /// The messages held while the probe is out (at most [`MAX_BACK`]): back with its
    /// acceptance; let go at its other answers (a new pause, which they wait for, or the
    /// destination open to all).
    held: Vec<i64>,
    /// The probe got a reply that was no acceptance (a 500, a refused recipient): the
    /// destination takes new connections again, and the next acceptance brings back `spent`.
    reached: bool,
}

impl Entry {
    /// Nothing to remember any more: no pause for a good while (the longest one and a window
    /// over; [`KEEP_SPENT`] while it holds messages to bring back), no probe out, no transient
    /// answer within the window. The map holds only troubled destinations; a host given up on
    /// would stay in it (and in the gauge) for ever.
    /// `keep_spent`: false when the map holds too many destinations ([`MAX_KEPT`]).
    fn forgotten(&self, now: DateTime<Utc>, keep_spent: bool) -> bool {
        let window = chrono::Duration::from_std(BURST_WINDOW).unwrap_or_default();
        let long = if self.spent.is_empty() || !keep_spent {
            chrono::Duration::from_std(MAX_PAUSE).unwrap_or_default() + window
        } else {
            chrono::Duration::from_std(KEEP_SPENT).unwrap_or_default()
        };
        self.probe.is_none_or(|(_, since)| now - since > long)
            && self.paused_until.is_none_or(|until| now - until > long)
            && self.transient.iter().all(|t| now - *t >= window)
    }
}

/// The pauses of one process.
#[derive(Debug)]
pub struct Throttle {
    base: Duration,
    /// How long a probe may be out before another message may probe instead (its send lost).
    probe_timeout: Duration,
    entries: Mutex<HashMap<String, Entry>>,
}

impl Throttle {
    /// `base`: the first pause when the destination asked for none (the retry policy's base);
    /// `probe_timeout`: the longest a probe's send may take.
    pub fn new(base: Duration, probe_timeout: Duration) -> Self {
        Self {
            base,
            probe_timeout,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Until when `destination` is paused for `message` at `now`, if it is. After a pause for a
    /// refused session, the first message to ask is the probe and goes; the others are held for
    /// `base` at a time until its answer comes (the probe itself may ask again).
    pub fn paused_until(
        &self,
        destination: &str,
        message: i64,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let e = entries.get_mut(destination)?;
        if let Some(until) = e.paused_until.filter(|until| *until > now) {
            return Some(until);
        }
        if !e.half_open {
            return None;
        }
        let timeout = chrono::Duration::from_std(self.probe_timeout).unwrap_or_default();
        match e.probe {
            // Held a second at least (a small retry base would claim and put back every held
            // message many times a second while the probe is out), and no longer than the
            // probe's answer may take: a retry base of 15 minutes held them that long after the
            // probe was accepted. The probe's acceptance brings them back at once
            // ([`Observed::back`]).
            Some((id, since)) if id != message && now - since < timeout => {
                if e.held.len() < MAX_BACK
                    && !e.held.contains(&message)
                    && !e.spent.contains(&message)
                {
                    e.held.push(message);
                }
                let hold = self.base.clamp(
                    Duration::from_secs(1),
                    self.probe_timeout.max(Duration::from_secs(1)),
                );
                Some(now + chrono::Duration::from_std(hold).unwrap_or_default())
            }
            // The probe, asking again just before its request (after waiting for a send slot):
            // its time runs from the request.
            _ => {
                e.probe = Some((message, now));
                None
            }
        }
    }

    /// How many destinations are paused at `now`, webhook hosts and the SMTP relay
    /// ([`SMTP_RELAY`]) apart: those whose pause runs, and those whose pause ended and whose
    /// probe is out, its answer not come yet (not known to be back). One whose pause ended with
    /// no message to probe it is not counted: nothing waits for it.
    pub fn paused_count(&self, now: DateTime<Utc>) -> Paused {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        forget(&mut entries, now);
        let timeout = chrono::Duration::from_std(self.probe_timeout).unwrap_or_default();
        let mut paused = Paused::default();
        for (destination, e) in entries.iter() {
            // A probe whose send never came (its message canceled, held by a limit) counts only
            // as long as another may not probe instead.
            let probing = e.probe.is_some_and(|(_, since)| now - since < timeout);
            if probing || e.paused_until.is_some_and(|until| until > now) {
                if destination == SMTP_RELAY {
                    paused.relay = true;
                } else {
                    paused.webhook += 1;
                }
            }
        }
        paused
    }

    /// Records an answer from `destination`: the pause it started, if any, and the messages to
    /// try again now that it is back ([`Observed`]).
    pub fn observe(&self, destination: &str, answer: &Answer, now: DateTime<Utc>) -> Observed {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut probe = false;
        if let Some(e) = entries.get_mut(destination) {
            // The probe's answer ends the probe (a late answer of a send from before the pause
            // does not); a reply past the session — accepted, any HTTP status, an SMTP reply
            // about the message itself — shows the destination takes Herald again. A probe that
            // could not reach it pauses it again; one whose connection was lost later (no reply)
            // shows nothing: the next message probes.
            if e.probe.is_some_and(|(id, _)| id == answer.message) {
                e.probe = None;
                // A probe that went over a connection opened before the pause (the SMTP pool's
                // parked one) shows nothing of new sessions: its answer counts as another
                // send's, and the next message probes (a re-check walk-through: the probe's
                // acceptance on the pooled connection let every held mail go, each to a 421).
                probe = !answer.reused;
            }
            let session_taken = answer.class == AttemptClass::Accepted
                || (answer.status.is_some() && !answer.session_refused());
            // Only the probe's: another send's reply came on a connection opened before the
            // pause (an SMTP pool's, a keep-alive one), which shows nothing of whether new ones
            // are taken (a walk-through: a relay refusing new sessions, "421 too many
            // connections", paused; an acceptance on the pooled connection let the held
            // messages go, and one spent an attempt on the same refusal).
            if session_taken && probe {
                e.half_open = false;
            }
            if probe && answer.class != AttemptClass::Accepted {
                e.held.clear();
                e.reached |= session_taken;
            }
            if answer.status.is_some() {
                e.unreachable = 0;
            }
        }
        if answer.class == AttemptClass::Accepted {
            // Accepted on a connection opened before a refused session's (or an unreachable
            // destination's) pause: the pause and the probe stand.
            if entries
                .get(destination)
                .is_some_and(|e| e.half_open && !probe)
            {
                return Observed::default();
            }
            // All is well again: forget the destination (the map holds only troubled ones). The
            // probe's acceptance after such a pause — or any, once the probe got a reply —
            // brings back the messages that spent an attempt on its being down and those held
            // for the probe; another acceptance does not: a send on a connection opened before
            // (an SMTP pool's, a keep-alive one) shows nothing of whether new ones are taken,
            // and a relay refusing new sessions ("421 too many connections") would have each
            // of them spend another attempt at every such answer.
            let back = entries
                .remove(destination)
                .filter(|e| probe || e.reached)
                .map(|e| [e.spent, e.held].concat())
                .unwrap_or_default()
                .into_iter()
                .filter(|id| *id != answer.message)
                .collect();
            return Observed {
                paused_until: None,
                back,
            };
        }
        if !is_transient(answer) && !slows_down(answer, 0, probe) {
            return Observed::default();
        }
        if !entries.contains_key(destination) {
            forget(&mut entries, now);
        }
        let entry = entries.entry(destination.to_owned()).or_default();
        if (answer.unreachable() || answer.session_refused())
            && entry.spent.len() < MAX_BACK
            && !entry.spent.contains(&answer.message)
        {
            entry.spent.push(answer.message);
        }
        let window = chrono::Duration::from_std(BURST_WINDOW).unwrap_or_default();
        entry.transient.retain(|t| now - *t < window);
        let recent = if answer.unreachable() {
            entry.unreachable += 1;
            entry.transient.len().max(entry.unreachable - 1)
        } else {
            entry.transient.len()
        };
        if !slows_down(answer, recent, probe) {
            entry.transient.push(now);
            return Observed::default();
        }
        // During a pause no send begins (but the probe after one): an answer then is of a send
        // already out when it began, one relay hiccup seen by every open session. It arms the
        // same pause again from now, not the next in the row: eight 421s at once doubled it
        // seven times, freezing the relay's mail for five minutes.
        let in_pause = entry.paused_until.is_some_and(|u| u > now);
        // A pause that ended long ago (the destination kept for its messages to bring back) is
        // not one in a row with this one: a 429 a day after an outage gets the first pause.
        let long = chrono::Duration::from_std(MAX_PAUSE + BURST_WINDOW).unwrap_or_default();
        if entry.paused_until.is_some_and(|u| now - u > long) {
            entry.streak = 0;
        }
        let pause = pause_length(
            answer.asked,
            self.base,
            entry.streak.saturating_sub(u32::from(in_pause)),
        );
        if !in_pause {
            entry.streak = entry.streak.saturating_add(1);
        }
        entry.transient.clear();
        entry.unreachable = 0;
        let until = now + chrono::Duration::from_std(pause).unwrap_or_default();
        // A pause only ever grows: a shorter one learnt later does not end a longer one.
        let until = entry.paused_until.map_or(until, |u| u.max(until));
        entry.paused_until = Some(until);
        if answer.session_refused() || answer.unreachable() {
            // Down again: only a new probe's reply shows it back.
            entry.half_open = true;
            entry.reached = false;
        }
        Observed {
            paused_until: Some(until),
            back: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Throttle {
        /// The pause an answer started, which most of these tests look at.
        fn pause(
            &self,
            destination: &str,
            answer: &Answer,
            now: DateTime<Utc>,
        ) -> Option<DateTime<Utc>> {
            self.observe(destination, answer, now).paused_until
        }
    }

    fn answer(
        class: AttemptClass,
        status: u16,
        asked: Option<u64>,
        is_smtp: bool,
    ) -> Answer<'static> {
        Answer {
            class,
            status: Some(status),
            asked: asked.map(Duration::from_secs),
            is_smtp,
            error_kind: None,
            message: 0,
            reused: false,
        }
    }

    fn smtp_kind(class: AttemptClass, status: Option<u16>, kind: &'static str) -> Answer<'static> {
        Answer {
            class,
            status,
            asked: None,
            is_smtp: true,
            error_kind: Some(kind),
            message: 0,
            reused: false,
        }
    }

    /// One hiccup answered to every open session at once is one pause, not one per answer; the
    /// next pause in the row, after this one ended, is twice as long.
    #[test]
    fn answers_during_a_pause_do_not_lengthen_the_row() {
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        let closing = smtp_kind(AttemptClass::Transient, Some(421), "smtp_reply");
        let first = t.pause("smtp", &closing, now()).unwrap();
        assert_eq!(first, now() + chrono::Duration::seconds(5));
        for ms in 1..=7 {
            let at = now() + chrono::Duration::milliseconds(ms);
            assert_eq!(
                t.pause("smtp", &closing, at),
                Some(at + chrono::Duration::seconds(5)),
                "answer {ms} in the same pause"
            );
        }
        let after = first + chrono::Duration::seconds(1);
        assert_eq!(t.paused_until("smtp", 1, after), None);
        assert_eq!(
            t.pause("smtp", &closing, after),
            Some(after + chrono::Duration::seconds(10)),
            "the second pause in the row"
        );
    }

    #[test]
    fn after_a_refused_session_one_message_probes_and_the_others_wait_for_its_answer() {
        use AttemptClass::*;
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        let refused = smtp_kind(NotSent, Some(535), "smtp_auth_refused");
        let until = t.pause("smtp", &refused, now()).unwrap();
        assert_eq!(t.paused_until("smtp", 1, now()), Some(until));
        // The pause over: message 1 probes (and may ask again), 2 and 3 wait for its answer.
        assert_eq!(t.paused_until("smtp", 1, until), None);
        assert_eq!(t.paused_until("smtp", 1, until), None);
        let held = until + chrono::Duration::seconds(5);
        assert_eq!(t.paused_until("smtp", 2, until), Some(held));
        assert_eq!(t.paused_until("smtp", 3, until), Some(held));
        // A late answer of a send from before the pause is not the probe's: 2 still waits.
        let late_other = Answer {
            message: 9,
            ..smtp_kind(Transient, None, "connect")
        };
        assert_eq!(t.pause("smtp", &late_other, until), None);
        assert_eq!(t.paused_until("smtp", 2, until), Some(held));
        // The probe refused again: a longer pause, and a new probe after it.
        let again = t
            .pause(
                "smtp",
                &Answer {
                    message: 1,
                    ..refused
                },
                until,
            )
            .unwrap();
        assert_eq!(again, until + chrono::Duration::seconds(10));
        assert_eq!(t.paused_until("smtp", 2, again), None, "2 probes now");
        assert!(t.paused_until("smtp", 3, again).is_some());
        // The probe's connection lost with no reply: it says nothing of the relay, the next
        // message probes, the others still wait.
        let lost = Answer {
            message: 2,
            ..smtp_kind(NotSent, None, "connection_lost_before_data")
        };
        assert_eq!(t.pause("smtp", &lost, again), None);
        assert_eq!(t.paused_until("smtp", 3, again), None, "3 probes");
        assert!(t.paused_until("smtp", 4, again).is_some());
        // A retry base under a second still holds the others a second.
        let quick = Throttle::new(Duration::from_millis(50), Duration::from_secs(30));
        let until = quick.pause("smtp", &refused, now()).unwrap();
        assert_eq!(quick.paused_until("smtp", 1, until), None);
        assert_eq!(
            quick.paused_until("smtp", 2, until),
            Some(until + chrono::Duration::seconds(1))
        );
        // A probe whose answer never came (lost) gives way after the probe timeout.
        let late = again + chrono::Duration::seconds(31);
        assert_eq!(t.paused_until("smtp", 4, late), None, "4 probes instead");
        // Another send's reply, on a connection opened before the pause (a pooled one), even an
        // acceptance: it shows nothing of new sessions, the others still wait for the probe.
        let pooled = smtp_kind(Transient, Some(451), "smtp_reply");
        assert_eq!(t.pause("smtp", &pooled, late), None);
        let accepted = Answer {
            message: 7,
            ..answer(Accepted, 250, None, true)
        };
        assert_eq!(t.observe("smtp", &accepted, late), Observed::default());
        assert!(t.paused_until("smtp", 5, late).is_some());
        // The probe's session taken again (a 451 to a recipient, say): everyone goes.
        let past = Answer {
            message: 4,
            ..smtp_kind(Transient, Some(451), "smtp_reply")
        };
        assert_eq!(t.pause("smtp", &past, late), None);
        assert_eq!(t.paused_until("smtp", 4, late), None);
        assert_eq!(t.paused_until("smtp", 5, late), None);
        // A 429's pause is not half-open: all go when it ends.
        let web = answer(RateLimited, 429, Some(2), false);
        let until = t.pause("https://a.example:443", &web, now()).unwrap();
        for id in 1..4 {
            assert_eq!(t.paused_until("https://a.example:443", id, until), None);
        }
    }

    /// A probe that went over a connection opened before the pause (the SMTP pool's parked one)
    /// shows nothing of new sessions: accepted or not, the others stay held and the next message
    /// probes; a probe on a new connection opens the relay to all.
    #[test]
    fn a_probe_over_a_pooled_connection_shows_nothing_of_new_sessions() {
        use AttemptClass::*;
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        let refused = Answer {
            message: 1,
            ..smtp_kind(NotSent, Some(421), "smtp_greeting_refused")
        };
        let until = t.pause(SMTP_RELAY, &refused, now()).unwrap();
        assert_eq!(t.paused_until(SMTP_RELAY, 2, until), None, "2 probes");
        assert!(t.paused_until(SMTP_RELAY, 3, until).is_some(), "3 held");
        let pooled = |message, class, status| Answer {
            message,
            reused: true,
            ..answer(class, status, None, true)
        };
        assert_eq!(
            t.observe(SMTP_RELAY, &pooled(2, Accepted, 250), until),
            Observed::default(),
            "nothing back"
        );
        assert_eq!(t.paused_until(SMTP_RELAY, 3, until), None, "3 probes now");
        assert!(t.paused_until(SMTP_RELAY, 4, until).is_some(), "4 held");
        // A reply that is no acceptance, over a pooled connection: no more than that.
        assert_eq!(
            t.observe(SMTP_RELAY, &pooled(3, Transient, 451), until),
            Observed::default()
        );
        assert_eq!(t.paused_until(SMTP_RELAY, 4, until), None, "4 probes now");
        assert!(t.paused_until(SMTP_RELAY, 5, until).is_some(), "5 held");
        // 4 on a new connection, accepted: everyone goes, those the refusal cost and held back.
        let fresh = Answer {
            message: 4,
            ..answer(Accepted, 250, None, true)
        };
        assert_eq!(t.observe(SMTP_RELAY, &fresh, until).back, [1, 3, 5]);
        assert_eq!(t.paused_until(SMTP_RELAY, 6, until), None);
    }

    #[test]
    fn the_relay_refusing_the_session_pauses_it_and_refused_recipients_do_not() {
        use AttemptClass::*;
        for (status, kind) in [
            (Some(535), "smtp_auth_refused"),
            (Some(530), "smtp_auth_required"),
            (Some(554), "smtp_greeting_refused"),
            (Some(454), "smtp_starttls_refused"),
            (None, "tls"),
            (None, "smtp_auth"),
        ] {
            assert!(
                slows_down(&smtp_kind(NotSent, status, kind), 0, false),
                "{kind}"
            );
        }
        // A webhook's TLS failure is its receiver's alone.
        let mut http_tls = smtp_kind(NotSent, None, "tls");
        http_tls.is_smtp = false;
        assert!(!slows_down(&http_tls, 0, false));
        // A lost connection is not a refusal.
        assert!(!slows_down(&smtp_kind(NotSent, None, "connect"), 0, false));
        // Full mailboxes, however many: the recipients', not the relay's.
        let full = smtp_kind(Transient, Some(452), "recipients_refused");
        assert!(!slows_down(&full, BURST_COUNT - 1, false));
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        for i in 0..2 * BURST_COUNT {
            assert_eq!(t.pause("smtp", &full, now()), None, "{i}");
        }
        assert_eq!(
            t.pause(
                "smtp",
                &smtp_kind(NotSent, Some(535), "smtp_auth_refused"),
                now()
            ),
            Some(now() + chrono::Duration::seconds(5))
        );
    }

    fn now() -> DateTime<Utc> {
        "2026-12-01T10:00:00Z".parse().unwrap()
    }

    #[test]
    fn which_answers_slow_a_destination_down() {
        use AttemptClass::*;
        assert!(slows_down(
            &answer(RateLimited, 429, Some(30), false),
            0,
            false
        ));
        assert!(slows_down(&answer(RateLimited, 429, None, false), 0, false));
        assert!(slows_down(
            &answer(Transient, 503, Some(30), false),
            0,
            false
        ));
        assert!(
            !slows_down(&answer(Transient, 503, None, false), 0, false),
            "503 without Retry-After"
        );
        // An SMTP 421 wherever it came: in the envelope (transient) or at the greeting (not_sent).
        assert!(slows_down(&answer(Transient, 421, None, true), 0, false));
        assert!(slows_down(&answer(NotSent, 421, None, true), 0, false));
        // A lone 500, an HTTP 421 (misdirected request), a lone SMTP 451: no …
        assert!(!slows_down(&answer(Transient, 500, None, false), 0, false));
        assert!(!slows_down(&answer(Permanent, 421, None, false), 0, false));
        assert!(!slows_down(&answer(Transient, 451, None, true), 0, false));
        // … until they come in a burst, a 4xx greeting included.
        assert!(slows_down(
            &answer(Transient, 451, None, true),
            BURST_COUNT - 1,
            false
        ));
        assert!(slows_down(
            &answer(NotSent, 450, None, true),
            BURST_COUNT - 1,
            false
        ));
        assert!(!slows_down(&answer(Accepted, 200, None, false), 99, false));
        assert!(!slows_down(&answer(Permanent, 550, None, true), 99, false));
    }

    #[test]
    fn a_destination_that_cannot_be_reached_is_paused_after_a_burst_and_probed() {
        use AttemptClass::*;
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        let at = |ms: i64| now() + chrono::Duration::milliseconds(ms);
        for (smtp, kind) in [
            (true, "connect"),
            (true, "connect_timeout"),
            (false, "connect"),
        ] {
            let down = Answer {
                is_smtp: smtp,
                ..smtp_kind(NotSent, None, kind)
            };
            assert!(!slows_down(&down, 0, false), "one alone: {kind}");
            assert!(slows_down(&down, BURST_COUNT - 1, false), "a burst: {kind}");
            assert!(slows_down(&down, 0, true), "a probe: {kind}");
            // A reply with a code is not "unreachable", whatever its kind says.
            let replied = Answer {
                status: Some(500),
                ..down
            };
            assert!(!slows_down(&replied, 0, true), "{kind}");
        }
        // Connection refused, five times within the window: paused, half-open.
        let down = |message| Answer {
            message,
            is_smtp: false,
            ..smtp_kind(NotSent, None, "connect")
        };
        let d = "http://127.0.0.1:9";
        for m in 0..BURST_COUNT as i64 - 1 {
            assert_eq!(t.pause(d, &down(m), at(m)), None, "{m}");
        }
        assert_eq!(t.paused_count(at(3)), Paused::default(), "not yet");
        let until = t.pause(d, &down(4), at(4)).unwrap();
        assert_eq!(until, at(4) + chrono::Duration::seconds(5));
        assert_eq!(t.paused_until(d, 5, at(5)), Some(until));
        let one_host = Paused {
            webhook: 1,
            relay: false,
        };
        assert_eq!(t.paused_count(at(5)), one_host);
        // Over: 5 probes, 6 waits for its answer; not known to be back until it comes.
        assert_eq!(t.paused_until(d, 5, until), None);
        assert!(t.paused_until(d, 6, until).is_some());
        assert_eq!(t.paused_count(until), one_host);
        // The probe still cannot connect: paused again at once, twice as long, half-open still.
        let again = t.pause(d, &down(5), until).unwrap();
        assert_eq!(again, until + chrono::Duration::seconds(10));
        assert_eq!(t.paused_until(d, 6, again), None, "6 probes");
        assert!(t.paused_until(d, 7, again).is_some());
        // Any HTTP status from the probe shows the host is reached: everyone goes (a 500 counts
        // towards a burst as before).
        let answered = Answer {
            message: 6,
            class: Transient,
            status: Some(500),
            ..down(6)
        };
        assert_eq!(t.pause(d, &answered, again), None);
        assert_eq!(t.paused_until(d, 7, again), None);
        assert_eq!(t.paused_until(d, 8, again), None);
        assert_eq!(t.paused_count(again), Paused::default());
        // The relay counts apart.
        let relay = smtp_kind(NotSent, Some(535), "smtp_auth_refused");
        t.pause(SMTP_RELAY, &relay, again).unwrap();
        assert_eq!(
            t.paused_count(again),
            Paused {
                webhook: 0,
                relay: true
            }
        );
        // Tries that fail slowly (a connect timing out) make a row all the same: five, a
        // minute apart, pause the destination.
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        let minute = |m: i64| now() + chrono::Duration::minutes(m);
        for m in 0..BURST_COUNT as i64 - 1 {
            assert_eq!(t.pause(d, &down(m), minute(m)), None, "{m}");
        }
        let until = t.pause(d, &down(4), minute(4)).unwrap();
        assert_eq!(until, minute(4) + chrono::Duration::seconds(5));
        // A send already out when the pause began that could not connect either is no probe: it
        // starts a row of its own, and neither lengthens the pause nor adds to the pauses in a
        // row.
        let late = minute(4) + chrono::Duration::seconds(1);
        assert_eq!(t.pause(d, &down(9), late), None);
        assert_eq!(t.paused_until(d, 10, late), Some(until));
        // Any reply ends the row: four more refusals after it do not pause.
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        for m in 0..BURST_COUNT as i64 - 1 {
            t.pause(d, &down(m), minute(m));
        }
        let replied = Answer {
            class: Transient,
            status: Some(502),
            ..down(7)
        };
        assert_eq!(t.pause(d, &replied, minute(5)), None);
        for m in 0..BURST_COUNT as i64 - 1 {
            assert_eq!(t.pause(d, &down(m), minute(6 + m)), None, "{m}");
        }
    }

    #[test]
    fn a_destination_nothing_waits_for_is_forgotten_and_leaves_the_gauge() {
        use AttemptClass::*;
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        let down = Answer {
            is_smtp: false,
            ..smtp_kind(NotSent, None, "connect")
        };
        let d = "http://gone.example:80";
        let mut until = now();
        for _ in 0..BURST_COUNT {
            if let Some(u) = t.pause(d, &down, now()) {
                until = u;
            }
        }
        assert_eq!(t.paused_count(now()).webhook, 1);
        // Over, and no message asked since: not counted, though not known to be back.
        assert_eq!(t.paused_count(until).webhook, 0);
        // A probe out counts until its answer.
        assert_eq!(t.paused_until(d, 1, until), None);
        assert_eq!(t.paused_count(until).webhook, 1);
        assert!(t.entries.lock().unwrap().contains_key(d));
        // A probe that never sent (its message canceled) counts only for the probe timeout.
        let stale = until + chrono::Duration::seconds(31);
        assert_eq!(t.paused_count(stale).webhook, 0);
        // Long after, with the probe given up on (its answer lost): forgotten — a day after,
        // as it holds messages the outage cost an attempt (`KEEP_SPENT`); minutes after, if not.
        t.entries.lock().unwrap().get_mut(d).unwrap().probe = None;
        let minutes = until + chrono::Duration::minutes(6);
        assert_eq!(t.paused_count(minutes), Paused::default());
        assert!(
            !t.entries.lock().unwrap().is_empty(),
            "kept for its messages"
        );
        let later = until + chrono::Duration::hours(25);
        assert_eq!(t.paused_count(later), Paused::default());
        assert!(t.entries.lock().unwrap().is_empty());
    }

    #[test]
    fn the_pause_is_the_destinations_own() {
        let base = Duration::from_secs(5);
        assert_eq!(
            pause_length(Some(Duration::from_secs(120)), base, 7),
            Duration::from_secs(120)
        );
        assert_eq!(pause_length(None, base, 0), Duration::from_secs(5));
        assert_eq!(pause_length(None, base, 1), Duration::from_secs(10));
        assert_eq!(pause_length(None, base, 3), Duration::from_secs(40));
        assert_eq!(pause_length(None, base, 30), MAX_PAUSE);
    }

    #[test]
    fn a_pause_holds_every_message_of_the_destination_until_it_ends() {
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        let a = answer(AttemptClass::RateLimited, 429, Some(30), false);
        let until = t.pause("https://a.example:443", &a, now()).unwrap();
        assert_eq!(until, now() + chrono::Duration::seconds(30));
        assert_eq!(
            t.paused_until("https://a.example:443", 0, now()),
            Some(until)
        );
        assert_eq!(t.paused_until("https://b.example:443", 0, now()), None);
        assert_eq!(
            t.paused_until("https://a.example:443", 0, until),
            None,
            "over at its end"
        );
        // A shorter pause learnt later does not shorten it.
        let short = answer(AttemptClass::RateLimited, 429, Some(5), false);
        assert_eq!(t.pause("https://a.example:443", &short, now()), Some(until));
    }

    #[test]
    fn pauses_in_a_row_grow_and_an_accepted_answer_resets_them() {
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        let mut at = now();
        let bye = answer(AttemptClass::NotSent, 421, None, true);
        for expected in [5, 10, 20] {
            let until = t.pause("smtp", &bye, at).unwrap();
            assert_eq!(until - at, chrono::Duration::seconds(expected));
            at = until;
        }
        assert_eq!(
            t.pause("smtp", &answer(AttemptClass::Accepted, 250, None, true), at),
            None
        );
        assert_eq!(
            t.pause("smtp", &bye, at).map(|u| u - at),
            Some(chrono::Duration::seconds(5))
        );
    }

    #[test]
    fn a_burst_of_transient_answers_pauses_and_a_success_resets_the_count() {
        let t = Throttle::new(Duration::from_secs(8), Duration::from_secs(30));
        let e = answer(AttemptClass::Transient, 500, None, false);
        let s = |i: i64| now() + chrono::Duration::seconds(i);
        for i in 0..BURST_COUNT as i64 - 1 {
            assert_eq!(t.pause("d", &e, s(i)), None);
        }
        assert_eq!(
            t.pause("d", &answer(AttemptClass::Accepted, 200, None, false), s(4)),
            None
        );
        for i in 0..BURST_COUNT as i64 - 1 {
            assert_eq!(t.pause("d", &e, s(i)), None);
        }
        assert_eq!(
            t.pause("d", &e, s(5)),
            Some(s(5) + chrono::Duration::seconds(8))
        );
        // Spread out over more than the window: no burst.
        let t = Throttle::new(Duration::from_secs(8), Duration::from_secs(30));
        for i in 0..BURST_COUNT as i64 * 2 {
            assert_eq!(t.pause("d", &e, s(11 * i)), None);
        }
        // Timeouts and dropped connections (ambiguous, no status) count as well.
        let t = Throttle::new(Duration::from_secs(8), Duration::from_secs(30));
        let hung = Answer {
            status: None,
            error_kind: Some("timeout"),
            ..answer(AttemptClass::Ambiguous, 0, None, false)
        };
        for i in 0..BURST_COUNT as i64 - 1 {
            assert_eq!(t.pause("d", &hung, s(i)), None);
        }
        assert_eq!(
            t.pause("d", &hung, s(5)),
            Some(s(5) + chrono::Duration::seconds(8))
        );
    }

    #[test]
    fn only_troubled_destinations_are_remembered() {
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        for i in 0..100 {
            let ok = answer(AttemptClass::Accepted, 200, None, false);
            assert_eq!(
                t.pause(&format!("https://h{i}.example:443"), &ok, now()),
                None
            );
            let gone = answer(AttemptClass::Permanent, 404, None, false);
            assert_eq!(
                t.pause(&format!("https://g{i}.example:443"), &gone, now()),
                None
            );
        }
        assert!(t.entries.lock().unwrap().is_empty());
    }

    #[test]
    fn a_destination_back_after_an_outage_returns_the_messages_it_cost_an_attempt() {
        use AttemptClass::*;
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        let d = "http://127.0.0.1:9";
        let down = |message| Answer {
            message,
            is_smtp: false,
            ..smtp_kind(NotSent, None, "connect")
        };
        let ok = |message| Answer {
            message,
            ..answer(Accepted, 200, None, false)
        };
        // Refused twice with no pause: their own backoff is short, nothing to bring forward.
        t.observe(d, &down(1), now());
        t.observe(d, &down(2), now());
        assert_eq!(t.observe(d, &ok(3), now()), Observed::default());
        // A burst pauses it; the probe (2, already among them) is refused again.
        for m in 0..BURST_COUNT as i64 {
            t.observe(d, &down(m), now());
        }
        let until = t.paused_until(d, 2, now()).unwrap();
        assert_eq!(t.paused_until(d, 2, until), None, "2 probes");
        let until = t.pause(d, &down(2), until).unwrap();
        // The next probe (9) is accepted: each message the outage cost an attempt, once, in
        // order, comes back; not the accepted one, which is done.
        assert_eq!(t.paused_until(d, 9, until), None, "9 probes");
        // 10, held while the probe is out, comes back with its acceptance too.
        assert!(t.paused_until(d, 10, until).is_some());
        let back = t.observe(d, &ok(9), until);
        assert_eq!(back.back, [0, 1, 2, 3, 4, 10]);
        assert_eq!(back.paused_until, None);
        // And then it is forgotten: the next acceptance brings nobody.
        assert_eq!(t.observe(d, &ok(5), until).back, Vec::<i64>::new());
        // An acceptance that is not the probe's — a send on a connection opened before, which
        // says nothing of new ones — brings nobody back, and the pause stands.
        for m in 0..BURST_COUNT as i64 {
            t.observe(d, &down(m), now());
        }
        assert!(t.paused_until(d, 7, now()).is_some());
        assert_eq!(t.observe(d, &ok(8), now()), Observed::default());
        assert!(t.paused_until(d, 7, now()).is_some());
        // The probe answered with a reply that is no acceptance (a 500): the destination takes
        // connections again, and the next acceptance, whoever's, brings them back.
        for m in 0..BURST_COUNT as i64 {
            t.observe(d, &down(m), now());
        }
        let until = t.paused_until(d, 30, now()).unwrap();
        assert_eq!(t.paused_until(d, 30, until), None, "30 probes");
        assert!(t.paused_until(d, 31, until).is_some(), "31 held");
        let failed = Answer {
            class: Transient,
            status: Some(500),
            ..down(30)
        };
        assert_eq!(t.observe(d, &failed, until), Observed::default());
        // Down again before any acceptance: that reply says nothing of now; a pooled send's
        // acceptance brings nobody back.
        for m in 40..40 + BURST_COUNT as i64 {
            t.observe(d, &down(m), until);
        }
        assert!(t.paused_until(d, 33, until).is_some(), "paused again");
        assert_eq!(t.observe(d, &ok(33), until).back, Vec::<i64>::new());
        // Once more, and this time the next acceptance follows the probe's reply: back come
        // all the outage cost an attempt, those of the time before the pooled acceptance too.
        for m in 0..BURST_COUNT as i64 {
            t.observe(d, &down(m), now());
        }
        let until = t.paused_until(d, 30, now()).unwrap();
        assert_eq!(t.paused_until(d, 30, until), None, "30 probes");
        assert_eq!(t.observe(d, &failed, until), Observed::default());
        assert_eq!(
            t.observe(d, &ok(32), until).back,
            [0, 1, 2, 3, 4, 40, 41, 42, 43, 44]
        );
        // A relay refusing the session (its login) pauses at once: the message that met the
        // refusal comes back with the probe's acceptance.
        let refused = Answer {
            message: 11,
            ..smtp_kind(NotSent, Some(535), "smtp_auth_refused")
        };
        let until = t.pause(SMTP_RELAY, &refused, now()).unwrap();
        assert_eq!(t.paused_until(SMTP_RELAY, 12, until), None, "12 probes");
        let relay_ok = Answer {
            message: 12,
            ..answer(Accepted, 250, None, true)
        };
        assert_eq!(t.observe(SMTP_RELAY, &relay_ok, until).back, [11]);
        // A 429's pause costs the messages behind it nothing (held without an attempt) and the
        // one that got it waits for its Retry-After: nobody comes back early.
        let slow = Answer {
            message: 21,
            ..answer(RateLimited, 429, Some(2), false)
        };
        let until = t.pause(d, &slow, now()).unwrap();
        assert_eq!(t.observe(d, &ok(22), until).back, Vec::<i64>::new());
        // At most MAX_BACK are remembered, the first ones.
        for m in 0..MAX_BACK as i64 + 10 {
            t.observe(d, &down(100 + m), now());
        }
        let until = t.paused_until(d, 1, now()).unwrap();
        assert_eq!(t.paused_until(d, 1, until), None);
        let back = t.observe(d, &ok(1), until).back;
        assert_eq!(back.len(), MAX_BACK);
        assert_eq!(back.first(), Some(&100));
    }

    /// While the probe is out, the others are held for the retry base, but no longer than the
    /// probe's answer may take (its acceptance brings them back; a failure pauses again).
    #[test]
    fn messages_held_for_a_probe_wait_no_longer_than_its_answer_may_take() {
        let t = Throttle::new(Duration::from_secs(900), Duration::from_secs(30));
        let refused = smtp_kind(AttemptClass::NotSent, Some(535), "smtp_auth_refused");
        let until = t.pause(SMTP_RELAY, &refused, now()).unwrap();
        assert_eq!(
            until - now(),
            chrono::Duration::seconds(300),
            "the longest pause"
        );
        assert_eq!(t.paused_until(SMTP_RELAY, 1, until), None, "1 probes");
        assert_eq!(
            t.paused_until(SMTP_RELAY, 2, until),
            Some(until + chrono::Duration::seconds(30))
        );
    }

    /// A pause that ended long ago is not one in a row with a new one.
    #[test]
    fn a_pause_long_over_does_not_lengthen_the_next() {
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        let d = "http://127.0.0.1:9";
        let down = Answer {
            is_smtp: false,
            ..smtp_kind(AttemptClass::NotSent, None, "connect")
        };
        for _ in 0..BURST_COUNT {
            t.observe(d, &down, now());
        }
        let slow = answer(AttemptClass::RateLimited, 429, None, false);
        let later = now() + chrono::Duration::hours(2);
        assert_eq!(
            t.pause(d, &slow, later),
            Some(later + chrono::Duration::seconds(5))
        );
    }

    /// The messages to bring back outlive the pause by far (their own backoff is longer: hours),
    /// whatever else looks at the map meanwhile (the gauge's scrape forgets what is over); a
    /// day after the last pause they are let go.
    #[test]
    fn the_messages_to_bring_back_are_kept_for_a_day_after_the_last_pause() {
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        let d = "http://127.0.0.1:9";
        let down = |message| Answer {
            message,
            is_smtp: false,
            ..smtp_kind(AttemptClass::NotSent, None, "connect")
        };
        for m in 0..BURST_COUNT as i64 {
            t.observe(d, &down(m), now());
        }
        let later = now() + chrono::Duration::hours(3);
        assert_eq!(t.paused_count(later), Paused::default(), "not paused now");
        assert_eq!(t.paused_until(d, 7, later), None, "7 probes");
        let ok = Answer {
            message: 7,
            ..answer(AttemptClass::Accepted, 200, None, false)
        };
        assert_eq!(t.observe(d, &ok, later).back, [0, 1, 2, 3, 4]);
        for m in 0..BURST_COUNT as i64 {
            t.observe(d, &down(m), now());
        }
        let next_day = now() + chrono::Duration::hours(25);
        t.paused_count(next_day);
        assert!(t.entries.lock().unwrap().is_empty(), "let go");
    }

    /// Past MAX_KEPT troubled destinations (a flood of messages to dead hosts), those whose
    /// pause is long over forget their messages to bring back at the next look, not after a
    /// day; at or under it, they keep them.
    #[test]
    fn past_max_kept_destinations_a_pause_long_over_forgets_its_messages() {
        let t = Throttle::new(Duration::from_secs(5), Duration::from_secs(30));
        let down = |message| Answer {
            message,
            is_smtp: false,
            ..smtp_kind(AttemptClass::NotSent, None, "connect")
        };
        let host = |i: usize| format!("http://10.0.{}.{}:80", i / 250, i % 250);
        let pause_all = |n: usize| {
            for i in 0..n {
                for m in 0..BURST_COUNT as i64 {
                    t.observe(&host(i), &down(m), now());
                }
            }
        };
        // An hour later every pause (5 minutes at most) is long over; the lists are kept.
        let later = now() + chrono::Duration::hours(1);
        pause_all(MAX_KEPT);
        t.paused_count(later);
        assert_eq!(
            t.entries.lock().unwrap().len(),
            MAX_KEPT,
            "at MAX_KEPT: kept"
        );
        // One more troubled destination: the next look lets the long-over ones go.
        pause_all(MAX_KEPT + 1);
        t.paused_count(later);
        assert!(
            t.entries.lock().unwrap().is_empty(),
            "past MAX_KEPT: let go"
        );
    }
}
