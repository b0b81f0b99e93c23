//! The admin pages as `maud` templates (compiled with Herald; every value is HTML-escaped). No
//! script, no inline style, nothing from another origin: the stylesheet is `/admin/static/`.

use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};

use super::data::{AttemptFacts, MAX_REASON, MessageDetail, ReceiptFacts, Replayable, replayable};
use crate::auth::Principal;
use crate::domain::{AttemptClass, Channel};
use crate::storage::admin::{DeadLetterFilter, MessageSummary};
use crate::storage::models::UNCONFIRMED_DEADLINE_REASON;
use crate::support::view::Answer;

/// Who is signed in, for the header (and the sign-out form's CSRF token).
pub struct Viewer<'a> {
    pub who: &'a Principal,
    pub csrf: &'a str,
    /// What a refused replay form was sent with: the form comes back with it.
    pub typed: Option<&'a TypedReplay>,
}

/// The dead-letter list's links to other pages.
pub struct Pages {
    /// The first page (the newest), from any later one.
    pub first: Option<String>,
    /// The page after this one.
    pub next: Option<String>,
}

/// A replay form as it was sent.
pub struct TypedReplay {
    pub reason: String,
    /// `keep`, `clear` or `set` (`None`: the form had no choice, the message no `expires_at`).
    pub expires: Option<String>,
    pub expires_at: String,
}

impl<'a> Viewer<'a> {
    /// `who`, with its form's CSRF token, and no reason typed.
    pub fn new(who: &'a Principal, csrf: &'a str) -> Self {
        Self {
            who,
            csrf,
            typed: None,
        }
    }
}

fn ts(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string()
}

fn opt_ts(t: &Option<DateTime<Utc>>) -> String {
    t.as_ref().map(ts).unwrap_or_else(|| "—".into())
}

/// `1234` ms → `1.234 s`; longer spans in minutes or hours.
pub fn duration(ms: i64) -> String {
    match ms {
        ms if ms < 1_000 => format!("{ms} ms"),
        ms if ms < 120_000 => format!("{:.1} s", ms as f64 / 1000.0),
        ms if ms < 7_200_000 => format!("{:.1} min", ms as f64 / 60_000.0),
        ms => format!("{:.1} h", ms as f64 / 3_600_000.0),
    }
}

/// A link to a message's page.
pub fn message_href(event_id: &str) -> String {
    format!("/admin/message?event_id={}", encode(event_id))
}

fn encode(v: &str) -> String {
    url::form_urlencoded::byte_serialize(v.as_bytes()).collect()
}

/// The frame of every page.
pub fn layout(title: &str, viewer: Option<&Viewer>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { (title) " · Herald admin" }
                link rel="stylesheet" href="/admin/static/admin.css";
            }
            body {
                header.top {
                    a.brand href="/admin" { "Herald" }
                    @if let Some(v) = viewer {
                        nav {
                            a href="/admin" { "Search" }
                            a href="/admin/dead-letters" { "Dead letters" }
                        }
                        form.signout method="post" action="/admin/sign-out" {
                            span.who { (v.who.name) " (" (v.who.scope) ")" }
                            input type="hidden" name="csrf" value=(v.csrf);
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The sign-in form, with the reason the last try was refused.
pub fn sign_in(error: Option<&str>) -> Markup {
    layout(
        "Sign in",
        None,
        html! {
            section.card.narrow {
                h1 { "Sign in" }
                p { "Paste an API token with the " code { "support" } " or " code { "admin" } " scope. "
                    "Herald keeps only a signed session cookie (8 hours); the token itself is never stored in it." }
                @if let Some(e) = error {
                    p.error role="alert" id="sign-in-error" { (e) }
                }
                form method="post" action="/admin/sign-in" {
                    label for="token" { "API token" }
                    input #token type="password" name="token" autocomplete="off" required autofocus;
                    button #sign-in type="submit" { "Sign in" }
                }
            }
        },
    )
}

fn search_form(q: &str) -> Markup {
    html! {
        form.search method="get" action="/admin/search" {
            label for="q" { "Event id or request fingerprint (at least 8 hex digits)" }
            div.row {
                input #q type="search" name="q" value=(q) required;
                button #search type="submit" { "Search" }
            }
        }
    }
}

/// The start page: the search box and the attempts chart.
pub fn home(viewer: &Viewer, chart: Markup) -> Markup {
    layout(
        "Search",
        Some(viewer),
        html! {
            section.card { h1 { "Find a send" } (search_form("")) }
            section.card { h2 { "Attempts" } (chart) }
        },
    )
}

/// Search results: nothing, or several messages sharing a fingerprint prefix.
pub fn results(viewer: &Viewer, q: &str, rows: &[MessageSummary], more: bool) -> Markup {
    layout(
        "Search",
        Some(viewer),
        html! {
            section.card {
                h1 { "Search" }
                (search_form(q))
                @if rows.is_empty() {
                    p #nothing-found { "No message has that event id or a fingerprint starting with it. "
                        "(A finished message is deleted by retention: retention_delivered_days, retention_dead_letter_days.)" }
                } @else {
                    @if more {
                        p { "More than " (rows.len()) " messages match; the newest " (rows.len()) ", newest first." }
                    } @else {
                        p { (rows.len()) (if rows.len() == 1 { " message matches." } else { " messages match; the newest first." }) }
                    }
                    (summary_table(rows))
                }
            }
        },
    )
}

fn summary_table(rows: &[MessageSummary]) -> Markup {
    html! {
        div.scroll {
            table.list {
                thead { tr { th { "Event id" } th { "Channel" } th { "Destination" } th { "State" }
                             th { "Class" } th { "Attempts" } th { "Since" } th { "Fingerprint" } } }
                tbody {
                    @for r in rows {
                        tr {
                            td { a href=(message_href(&r.event_id)) { (r.event_id) } }
                            td { (r.channel) }
                            td { (super::data::mask_destination(r.channel, &r.destination)) }
                            td { span class=(format!("state s-{}", r.state)) { (r.state) } }
                            td { @if let Some(c) = r.last_error_class { span class=(format!("class k-{c}")) { (c) } } }
                            td.num { (r.attempts) }
                            td { (ts(&r.updated_at)) }
                            td.mono { (r.request_fingerprint.as_deref().map(|f| &f[..f.len().min(16)]).unwrap_or("—")) }
                        }
                    }
                }
            }
        }
    }
}

/// One line of the timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub at: DateTime<Utc>,
    /// `enqueued`, `attempt`, `receipt`, `replay`, `skip`, `deadline` or `now`.
    pub kind: &'static str,
    pub title: String,
    pub detail: String,
    /// A class to colour the line with.
    pub class: Option<AttemptClass>,
}

fn attempt_entry(a: &AttemptFacts) -> Entry {
    let answer = match Answer::of(a.status, a.error_kind.as_deref()) {
        Answer::Status(s) => format!("answered {s}"),
        Answer::WrittenToFile => crate::channels::email::WRITTEN_TO_FILE_WORDS.into(),
        Answer::LeaseExpired => "failed: lease_expired".into(),
        Answer::Failed(k) => format!("failed: {k}"),
        Answer::Nothing => "no answer".into(),
    };
    let then = match (a.next_state.as_str(), a.delay_ms) {
        ("retryable", Some(ms)) => format!("retry in {}", duration(ms)),
        ("lease_lost", _) => "outcome refused: another claim held the message".into(),
        (s, _) => format!("→ {s}"),
    };
    let mut detail = format!(
        "{answer} after {}, classified {}; {then}",
        duration(a.duration_ms),
        a.class
    );
    if let Some(r) = &a.delay_reason {
        detail.push_str(&format!(" ({r})"));
    }
    if let Some(n) = &a.note {
        detail.push_str(&format!("; {n}"));
    }
    if let Some(ra) = &a.retry_after {
        detail.push_str(&format!("; Retry-After: {ra}"));
    }
    Entry {
        at: a.started_at,
        kind: "attempt",
        title: format!("Attempt {}", a.number),
        detail,
        class: Some(a.class),
    }
}

fn receipt_entry(r: &ReceiptFacts) -> Entry {
    let outcome = match (&r.outcome, &r.outcome_reason) {
        (Some(o), Some(why)) => format!("{o}: {why}"),
        (Some(o), None) => o.clone(),
        (None, _) => "not applied yet".into(),
    };
    Entry {
        at: r.event_time.unwrap_or(r.received_at),
        kind: "receipt",
        title: format!("Receipt {} from {}", r.event_type, r.source),
        detail: format!(
            "{} ({}); event time {}, arrived {}; {outcome}",
            r.provider_type,
            r.provider_event_id,
            opt_ts(&r.event_time),
            ts(&r.received_at)
        ),
        class: None,
    }
}

/// A replay: who, why, from which state, and where its series began.
fn replay_entry(r: &crate::support::view::ReplayEntry) -> Option<Entry> {
    let at = DateTime::parse_from_rfc3339(&r.replayed_at)
        .ok()?
        .with_timezone(&Utc);
    Some(Entry {
        at,
        kind: "replay",
        title: format!("Replayed by {}", r.who),
        detail: format!(
            "from {}{}: \u{201c}{}\u{201d}; a new series began at attempt {}",
            r.from_state,
            if r.forced { " (forced)" } else { "" },
            r.reason,
            r.series_start
        ),
        class: None,
    })
}

/// An explicit skip: who, why, from which state; its key's later messages went on.
fn skip_entry(s: &super::data::SkipFacts) -> Entry {
    Entry {
        at: s.skipped_at,
        kind: "skip",
        title: format!("Skipped by {}", s.who),
        detail: format!(
            "from {}: \u{201c}{}\u{201d}; it stopped holding its ordering key, whose later messages went on",
            s.from_state, s.reason
        ),
        class: None,
    }
}

/// The message's story in time order: enqueued, each attempt, each receipt (at its event time,
/// else its arrival), each replay and skip, and where it stands now.
pub fn timeline(d: &MessageDetail, at_now: DateTime<Utc>) -> Vec<Entry> {
    let m = &d.message;
    let mut entries = vec![Entry {
        at: m.created_at,
        kind: "enqueued",
        title: "Enqueued".into(),
        detail: format!(
            "{} to {}{}, {}, due {}",
            m.channel,
            m.destination,
            m.enqueued_by
                .as_ref()
                .map(|t| format!(" by token {t}"))
                .unwrap_or_default(),
            m.semantics,
            ts(&m.scheduled_at)
        ),
        class: None,
    }];
    entries.extend(d.attempts.iter().map(attempt_entry));
    let shown = shown_receipts(d);
    entries.extend(shown.told.iter().map(|&i| receipt_entry(&d.receipts[i])));
    entries.extend(d.skips.iter().map(skip_entry));
    entries.extend(d.replays.iter().filter_map(replay_entry));
    // The unconfirmed deadline's move to dead_letter has no attempt of its own: its line (only
    // "Now" said it, a walk-through).
    if m.state == crate::domain::State::DeadLetter
        && m.state_reason.as_deref() == Some(UNCONFIRMED_DEADLINE_REASON)
    {
        entries.push(Entry {
            at: m.updated_at,
            kind: "deadline",
            title: "Dead-lettered at the unconfirmed deadline".into(),
            detail: "no receipt proved it arrived in time; a person decides whether it did".into(),
            class: None,
        });
    }
    // Stable: equal times keep enqueued, attempts, receipts, skips, replays in that order (a
    // skip comes before a replay of the skipped message).
    entries.sort_by_key(|e| e.at);
    let mut now = format!("state {}", m.state);
    if let Some(r) = &m.state_reason {
        now.push_str(&format!(" ({r})"));
    }
    if let Some(c) = m.last_error_class {
        now.push_str(&format!("; last class {c}"));
    }
    if let Some(s) = &m.delivery_status {
        // A receipt without an event time sets it too: then no "at —".
        match &m.delivery_status_at {
            Some(t) => now.push_str(&format!("; delivery status {s} at {}", ts(t))),
            None => now.push_str(&format!("; delivery status {s} (no event time given)")),
        }
    }
    if let Some(t) = &m.next_attempt_at {
        now.push_str(&format!("; next attempt due {}", ts(t)));
    }
    // At this moment, last whatever the times before it say (a receipt's event time far ahead
    // made "Now" read 9999-12-31; a walk-through found it).
    entries.push(Entry {
        at: at_now,
        kind: "now",
        title: "Now".into(),
        detail: now,
        class: m.last_error_class,
    });
    entries
}

/// A notice above the message: a replay done, or refused.
pub enum Notice<'a> {
    Info(&'a str),
    Error(&'a str),
}

/// The most receipts a message's page shows (in its timeline and its table).
const RECEIPTS_SHOWN_MAX: usize = 100;

/// The receipts the page shows ([`crate::support::narrative::SomeReceipts`]).
fn shown_receipts(d: &MessageDetail) -> crate::support::narrative::SomeReceipts {
    crate::support::narrative::SomeReceipts::of(
        d.receipts.len(),
        RECEIPTS_SHOWN_MAX,
        |i| d.receipts[i].outcome.as_deref() == Some("applied"),
        |i| d.receipts[i].event_type.as_str(),
    )
}

/// A message's page: facts, the timeline, attempts and receipts in detail, the replay form.
pub fn message(
    viewer: &Viewer,
    d: &MessageDetail,
    notice: Option<Notice>,
    now: DateTime<Utc>,
) -> Markup {
    let m = &d.message;
    let can = replayable(m.state, m.delivery_status.as_deref());
    layout(
        &m.event_id,
        Some(viewer),
        html! {
            @match notice {
                Some(Notice::Info(t)) => p.notice #notice role="status" { (t) },
                Some(Notice::Error(t)) => p.error #notice role="alert" { (t) },
                None => {},
            }
            section.card {
                h1 { "Message " span.mono #event-id { (m.event_id) } }
                dl.facts {
                    dt { "State" } dd { span #state class=(format!("state s-{}", m.state)) { (m.state) }
                        @if let Some(r) = &m.state_reason { " — " (r) } }
                    dt { "Delivery status" } dd { (m.delivery_status.as_deref().unwrap_or("—"))
                        @if m.delivery_status_at.is_some() { " at " (opt_ts(&m.delivery_status_at)) } }
                    dt { "Channel" } dd { (m.channel) }
                    dt { "Destination" } dd #destination { (m.destination) }
                    dt { "Attempts" } dd { (m.attempts)
                        @if m.attempt_base > 0 { " (" (m.attempts - m.attempt_base) " since the last replay)" }
                        @if let Some(max) = m.max_attempts { " — budget " (max) " per series" } }
                    dt { "Last class" } dd { @if let Some(c) = m.last_error_class { span class=(format!("class k-{c}")) { (c) } } @else { "—" } }
                    dt { "Fingerprint" } dd.mono #fingerprint { (m.fingerprint.as_deref().unwrap_or("— (not sent yet)")) }
                    dt { "Semantics" } dd { (m.semantics) }
                    dt { "Retry policy" } dd { (m.retry_policy) @if let Some(v) = &m.retry_policy_version { " (version " (v) ")" } }
                    dt { "Provider message id" } dd.mono { (m.provider_message_id.as_deref().unwrap_or("—")) }
                    dt { "Enqueued by" } dd { (m.enqueued_by.as_deref().unwrap_or("SQL or the library")) }
                    dt { "Created" } dd { (ts(&m.created_at)) }
                    @if let Some(t) = &m.expires_at { dt { "Expires" } dd { (ts(t)) } }
                }
                @if let Some(e) = &d.explanation { p.explanation #explanation { (e) } }
            }
            section.card {
                h2 { "Timeline" }
                ol.timeline #timeline {
                    @for e in timeline(d, now) {
                        li class=(format!("t-{}{}", e.kind, e.class.map(|c| format!(" k-{c}")).unwrap_or_default())) {
                            time { (ts(&e.at)) }
                            strong { (e.title) }
                            span { (e.detail) }
                        }
                    }
                }
            }
            section.card {
                h2 { "Attempts" }
                @if d.attempts.is_empty() { p { "None yet." } } @else {
                    div.scroll {
                        table.list #attempts {
                            thead { tr { th { "#" } th { "Started" } th { "Duration" } th { "Status / error" }
                                         th { "Class" } th { "Led to" } th { "Delay" } th { "Reason" } th { "Policy" } } }
                            tbody {
                                @for a in &d.attempts {
                                    tr {
                                        td.num { (a.number) }
                                        td { (ts(&a.started_at)) }
                                        td.num { (duration(a.duration_ms)) }
                                        td.status { @if let Some(s) = a.status { (s) } @else { (a.error_kind.as_deref().unwrap_or("—")) } }
                                        td { span class=(format!("class k-{}", a.class)) { (a.class) } }
                                        td { (a.next_state) }
                                        td.num { (a.delay_ms.map(duration).unwrap_or_else(|| "—".into())) }
                                        td {
                                            (a.delay_reason.as_deref().unwrap_or("—"))
                                            @if let Some(n) = &a.note { br; span.note { (n) } }
                                        }
                                        td { (a.policy_version) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            section.card {
                h2 { "Receipts" }
                @if d.receipts.is_empty() { p { "None." } } @else {
                    @let shown = shown_receipts(d);
                    @if let Some(untold) = &shown.untold {
                        p #receipts-untold { "Of its " (d.receipts.len()) " receipts, " (untold)
                            ": those that set its delivery status and the latest are shown here and in the timeline; "
                            code { "GET /v1/messages/{event_id}/explain" } " lists every one." }
                    }
                    div.scroll {
                        table.list #receipts {
                            thead { tr { th { "Event time" } th { "Arrived" } th { "Type" } th { "Source" }
                                         th { "Provider event" } th { "Outcome" } } }
                            tbody {
                                @for r in shown.told.iter().map(|&i| &d.receipts[i]) {
                                    tr {
                                        td { (opt_ts(&r.event_time)) }
                                        td { (ts(&r.received_at)) }
                                        td { (r.event_type) " (" (r.provider_type) ")" }
                                        td { (r.source) }
                                        td.mono { (r.provider_event_id) }
                                        td { (r.outcome.as_deref().unwrap_or("pending"))
                                             @if let Some(why) = &r.outcome_reason { " — " (why) } }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if can != Replayable::No {
                section.card #replay {
                    h2 { "Replay" }
                    p { "Sends the message again with its original event id (receivers drop duplicates by it). "
                        "The reason is recorded with your token's name." }
                    form method="post" action="/admin/replay" {
                        input type="hidden" name="csrf" value=(viewer.csrf);
                        // In hex as well: every page's text is written out where it holds a
                        // control character (`page`), and this value must come back as it is.
                        input type="hidden" name="event_id" value=(m.event_id);
                        input type="hidden" name="event_id_hex" value=(hex::encode(m.event_id.as_bytes()));
                        label for="reason" { "Reason" }
                        input #reason type="text" name="reason" required maxlength=(MAX_REASON)
                            value=[viewer.typed.map(|t| t.reason.as_str())]
                            placeholder="e.g. receiver fixed their schema (ticket 123)";
                        @if can == Replayable::WithForce {
                            label.check { input #force type="checkbox" name="force" value="1";
                                (if m.state == crate::domain::State::Delivered {
                                    " It was delivered: send it again anyway"
                                } else {
                                    " Its receipts say it arrived: send it again anyway"
                                }) }
                        }
                        @if let Some(t) = m.expires_at {
                            // A passed expires_at would expire the replay at once: it is
                            // cleared unless a person keeps it or gives a later time.
                            @let passed = t <= now;
                            // As sent, when the form comes back refused.
                            @let chosen = viewer.typed.and_then(|t| t.expires.as_deref())
                                .unwrap_or(if passed { "clear" } else { "keep" });
                            label for="expires" { "Its expires_at, " (ts(&t)) (if passed { " (passed)" } else { "" }) }
                            select #expires name="expires" {
                                option value="keep" selected[chosen == "keep"] { "keep it" }
                                option value="clear" selected[chosen == "clear"] { "clear it (no deadline)" }
                                option value="set" selected[chosen == "set"] { "set it to the time below" }
                            }
                            label for="expires_at" { "The time to set" }
                            input #expires_at type="text" name="expires_at"
                                value=[viewer.typed.map(|t| t.expires_at.as_str()).filter(|v| !v.is_empty())]
                                placeholder="RFC 3339, e.g. 2026-12-31T09:00:00Z";
                        }
                        button #replay-button type="submit" { "Replay" }
                    }
                }
            }
        },
    )
}

/// Dead letters, newest first, with filters and a link to the next page.
pub fn dead_letters(
    viewer: &Viewer,
    filter: &DeadLetterFilter,
    rows: &[MessageSummary],
    pages: Pages,
) -> Markup {
    let selected = |on: bool| on.then_some("selected");
    layout(
        "Dead letters",
        Some(viewer),
        html! {
            section.card {
                h1 { "Dead letters" }
                form.filters method="get" action="/admin/dead-letters" {
                    label for="channel" { "Channel" }
                    select #channel name="channel" {
                        option value="" { "any" }
                        @for c in Channel::ALL {
                            option value=(c) selected=[selected(filter.channel == Some(*c))] { (c) }
                        }
                    }
                    label for="class" { "Class" }
                    select #class name="class" {
                        option value="" { "any" }
                        // Not `accepted`: an accepted send is delivered, never a dead letter.
                        @for c in AttemptClass::ALL.iter().filter(|c| **c != AttemptClass::Accepted) {
                            option value=(c) selected=[selected(filter.class == Some(*c))] { (c) }
                        }
                        option value=(UNCONFIRMED_DEADLINE_REASON) selected=[selected(filter.unconfirmed)] {
                            (UNCONFIRMED_DEADLINE_REASON) " (no proof by the deadline)"
                        }
                    }
                    button #filter type="submit" { "Filter" }
                }
                @if rows.is_empty() {
                    p #no-dead-letters { "No dead letters match." }
                } @else {
                    (summary_table(rows))
                }
                @if pages.first.is_some() || pages.next.is_some() {
                    p.pages {
                        @if let Some(href) = pages.first { a #first-page href=(href) { "← Newest" } }
                        @if let Some(href) = pages.next { a #next-page href=(href) { "Older →" } }
                    }
                }
            }
        },
    )
}

/// A page for an error: what happened, and where to go.
pub fn error(viewer: Option<&Viewer>, title: &str, detail: &str) -> Markup {
    layout(
        title,
        viewer,
        html! {
            section.card.narrow {
                h1 { (title) }
                p.error #error { (detail) }
                p { a href="/admin" { "Back to the admin page" } }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::data::{MessageFacts, ReceiptFacts};
    use crate::domain::{Semantics, State};

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn detail() -> MessageDetail {
        MessageDetail {
            message: MessageFacts {
                event_id: "order-1<script>".into(),
                channel: Channel::Webhook,
                destination: "https://hooks.example.com/…".into(),
                state: State::DeadLetter,
                state_reason: None,
                delivery_status: None,
                delivery_status_at: None,
                attempts: 2,
                attempt_base: 0,
                max_attempts: Some(4),
                semantics: Semantics::AtLeastOnce,
                fingerprint: Some("ab".repeat(32)),
                last_error_class: Some(AttemptClass::Permanent),
                provider_message_id: None,
                enqueued_by: Some("shop".into()),
                retry_policy: "default".into(),
                retry_policy_version: Some("1".into()),
                created_at: at("2026-12-01T10:00:00Z"),
                scheduled_at: at("2026-12-01T10:00:00Z"),
                next_attempt_at: None,
                expires_at: None,
                updated_at: at("2026-12-01T10:00:02Z"),
            },
            attempts: vec![
                AttemptFacts {
                    number: 1,
                    started_at: at("2026-12-01T10:00:01Z"),
                    duration_ms: 12,
                    status: Some(503),
                    error_kind: None,
                    class: AttemptClass::Transient,
                    retry_after: Some("2".into()),
                    delay_ms: Some(2000),
                    delay_reason: Some("Retry-After honoured".into()),
                    next_state: "retryable".into(),
                    policy_version: "1".into(),
                    note: None,
                },
                AttemptFacts {
                    number: 2,
                    started_at: at("2026-12-01T10:00:04Z"),
                    duration_ms: 8,
                    status: Some(400),
                    error_kind: None,
                    class: AttemptClass::Permanent,
                    retry_after: None,
                    delay_ms: None,
                    delay_reason: None,
                    next_state: "dead_letter".into(),
                    policy_version: "1".into(),
                    note: None,
                },
            ],
            receipts: vec![ReceiptFacts {
                source: "resend".into(),
                provider_event_id: "evt_1".into(),
                event_type: "bounced".into(),
                provider_type: "email.bounced".into(),
                event_time: Some(at("2026-12-01T10:00:02Z")),
                received_at: at("2026-12-01T10:00:30Z"),
                outcome: Some("applied".into()),
                outcome_reason: None,
            }],
            explanation: None,
            replays: vec![crate::support::view::ReplayEntry {
                replayed_at: "2026-12-01T10:00:40.000000Z".into(),
                who: "desk".into(),
                reason: "receiver fixed".into(),
                from_state: State::DeadLetter,
                forced: false,
                series_start: 3,
                expires_at_before: None,
                expires_at_after: None,
            }],
            skips: vec![super::super::data::SkipFacts {
                who: "desk".into(),
                reason: "order voided".into(),
                from_state: State::DeadLetter,
                skipped_at: at("2026-12-01T10:00:35Z"),
            }],
        }
    }

    #[test]
    fn the_unconfirmed_deadline_has_its_line() {
        let mut d = detail();
        d.message.state = crate::domain::State::DeadLetter;
        d.message.state_reason = Some(UNCONFIRMED_DEADLINE_REASON.into());
        d.message.updated_at = at("2026-12-02T10:00:00Z");
        let t = timeline(&d, Utc::now());
        let line = t.iter().find(|e| e.kind == "deadline").expect("its line");
        assert_eq!(
            (line.at, line.title.as_str()),
            (
                at("2026-12-02T10:00:00Z"),
                "Dead-lettered at the unconfirmed deadline"
            )
        );
        assert_eq!(t[t.len() - 2].kind, "deadline", "last before now");
        d.message.state_reason = None;
        assert!(
            !timeline(&d, Utc::now())
                .iter()
                .any(|e| e.kind == "deadline")
        );
    }

    #[test]
    fn the_timeline_follows_time_not_kind() {
        let t = timeline(&detail(), Utc::now());
        let kinds: Vec<_> = t.iter().map(|e| (e.kind, e.title.as_str())).collect();
        assert_eq!(
            kinds,
            [
                ("enqueued", "Enqueued"),
                ("attempt", "Attempt 1"),
                ("receipt", "Receipt bounced from resend"),
                ("attempt", "Attempt 2"),
                ("skip", "Skipped by desk"),
                ("replay", "Replayed by desk"),
                ("now", "Now"),
            ]
        );
        assert_eq!(
            t[4].detail,
            "from dead_letter: \u{201c}order voided\u{201d}; it stopped holding its ordering key, whose later messages went on"
        );
        assert_eq!(
            t[5].detail,
            "from dead_letter: \u{201c}receiver fixed\u{201d}; a new series began at attempt 3"
        );
        assert_eq!(
            t[1].detail,
            "answered 503 after 12 ms, classified transient; retry in 2.0 s (Retry-After honoured); Retry-After: 2"
        );
        assert_eq!(
            t[3].detail,
            "answered 400 after 8 ms, classified permanent; → dead_letter"
        );
        assert!(
            t[2].detail
                .contains("event time 2026-12-01 10:00:02.000 UTC")
        );
        assert_eq!(t[6].detail, "state dead_letter; last class permanent");
    }

    /// Thousands of receipts (opens): the page shows the bounce that set the status and the
    /// latest, and counts the rest (6,000 made a page of 4.6 MB; a walk-through).
    #[test]
    fn a_message_with_thousands_of_receipts_shows_some() {
        let mut d = detail();
        let bounce = d.receipts[0].clone();
        d.receipts = (0..3000)
            .map(|n| ReceiptFacts {
                provider_event_id: format!("open-{n}"),
                event_type: "open".into(),
                provider_type: "email.opened".into(),
                outcome: Some("history".into()),
                ..bounce.clone()
            })
            .collect();
        d.receipts.insert(1, bounce);
        let who = Principal {
            name: "desk".into(),
            scope: crate::auth::Scope::Support,
        };
        let html = message(&Viewer::new(&who, "tok"), &d, None, Utc::now()).into_string();
        assert!(html.len() < 200_000, "{}", html.len());
        assert!(
            html.contains("Of its 3001 receipts, 2901 are not told here (open 2901)"),
            "{html}"
        );
        assert!(html.contains(">evt_1<"), "the bounce that set the status");
        assert!(html.contains(">open-2999<") && !html.contains(">open-0<"));
        let t = timeline(&d, Utc::now());
        assert_eq!(t.iter().filter(|e| e.kind == "receipt").count(), 100);
    }

    #[test]
    fn the_message_page_escapes_and_offers_replay() {
        let viewer = Viewer {
            who: &Principal {
                name: "desk".into(),
                scope: crate::auth::Scope::Support,
            },
            csrf: "tok",
            typed: None,
        };
        let html = message(&viewer, &detail(), None, Utc::now()).into_string();
        assert!(!html.contains("order-1<script>"), "escaped");
        assert!(html.contains("order-1&lt;script&gt;"));
        assert!(html.contains("action=\"/admin/replay\""));
        assert!(html.contains("name=\"csrf\" value=\"tok\""));
        assert!(
            !html.contains("name=\"force\""),
            "a dead letter needs no force"
        );
        assert!(!html.contains("<script"));
        assert!(!html.contains("style="));
        let mut delivered = detail();
        delivered.message.state = State::Delivered;
        let html = message(&viewer, &delivered, None, Utc::now()).into_string();
        assert!(html.contains("name=\"force\""));
        let mut sending = detail();
        sending.message.state = State::Sending;
        let html = message(&viewer, &sending, None, Utc::now()).into_string();
        assert!(!html.contains("/admin/replay"));
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(duration(12), "12 ms");
        assert_eq!(duration(1500), "1.5 s");
        assert_eq!(duration(300_000), "5.0 min");
        assert_eq!(duration(10_800_000), "3.0 h");
    }
}
