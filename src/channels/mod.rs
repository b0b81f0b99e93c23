//! Channels: how a claimed message leaves Herald. Each returns a [`SendReport`]: the receiver's
//! answer as classified data. A channel never touches the database.

pub mod email;
pub mod webhook;

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::{AttemptClass, InvalidField, Semantics};

/// A claimed message as a channel sends it: what goes out, nothing of how it is stored.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub event_id: &'a str,
    /// A URL or `endpoint:NAME` (webhook), or the recipient address (email).
    pub destination: &'a str,
    /// The message's payload as enqueued; each channel parses its own shape.
    pub payload: &'a serde_json::Value,
    /// What a lost answer may cost: under `at_most_once` the email channel keeps the content
    /// back until the envelope was answered (no CHUNKING), so a connection lost before then
    /// stays `not_sent`.
    pub semantics: Semantics,
    /// A webhook's request body as already serialized for its request fingerprint: exactly
    /// `WebhookPayload::parse(payload)`'s `body_bytes()` (the sender serializes it once, at the
    /// clearance, and the request shares these bytes); `None` for an email, or to let the
    /// webhook channel serialize `payload`'s body itself.
    pub body: Option<&'a bytes::Bytes>,
}

/// What one send did, as the attempt row records it.
#[derive(Debug, Clone)]
pub struct SendReport {
    pub class: AttemptClass,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    /// HTTP status or SMTP reply code, when an answer came.
    pub status: Option<u16>,
    /// `connect`, `timeout`, `connection_lost`, `invalid_payload`, `invalid_event_id`, `unknown_endpoint`, `refused_destination` (SSRF guard) …
    pub error_kind: Option<String>,
    /// Raw Retry-After header value, as seen.
    pub retry_after_raw: Option<String>,
    /// Retry-After to honour (only for statuses that honour it).
    pub retry_after: Option<Duration>,
    pub provider_message_id: Option<String>,
    /// A short, redacted excerpt of the answer.
    pub excerpt: Option<String>,
    /// The request went over a connection opened before this send (an SMTP pool's parked one):
    /// its answer says nothing of whether new connections are taken ([`crate::sender::throttle`]).
    /// False where Herald cannot tell (a webhook's keep-alive connection, reqwest's pool).
    pub reused_connection: bool,
}

impl SendReport {
    /// A send that failed before any request left Herald.
    pub fn refused(
        class: AttemptClass,
        kind: &str,
        at: DateTime<Utc>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            class,
            started_at: at,
            finished_at: at,
            status: None,
            error_kind: Some(kind.to_owned()),
            retry_after_raw: None,
            retry_after: None,
            provider_message_id: None,
            excerpt: Some(redact_excerpt(&detail.into())),
            reused_connection: false,
        }
    }

    /// Herald's own refusal of what was stored, before any request (a payload it cannot read or
    /// send, an event id or header no request can carry, an email with a bare line end): it
    /// says nothing of the receiver, so it neither counts toward disabling an endpoint nor slows
    /// a destination down.
    pub fn says_nothing_of_the_receiver(&self) -> bool {
        self.status.is_none()
            && matches!(
                self.error_kind.as_deref(),
                Some(
                    "invalid_payload"
                        | webhook::INVALID_EVENT_ID
                        | webhook::INVALID_HEADER
                        | email::kind::BARE_LINE_END
                )
            )
    }
}

/// Whether an event id can travel in a header as it is: no control character (an `UPDATE`
/// can store one; the insert refuses them) and no space at either end (SQL takes one; the API
/// does not), which the reader's parser trims — a tab or a space so trimmed failed the webhook
/// signature over the id at the receiver. A webhook's must also be ASCII (see its channel).
pub fn event_id_fits_a_header(id: &str) -> bool {
    !id.chars().any(char::is_control) && id.trim_matches(' ') == id
}

pub use crate::crypto::install_crypto_provider;

/// An email payload's custom header given twice (names compare without case), refused at
/// enqueue: only one of the two would reach the receiver. (A webhook's: `check_written_headers`.)
pub fn repeated_header<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<InvalidField> {
    let mut seen = std::collections::HashSet::new();
    names
        .into_iter()
        .find(|k| !seen.insert(k.to_ascii_lowercase()))
        .map(|k| {
            InvalidField::new(
                "payload.headers",
                format!("{k:?}: given twice (header names ignore case)"),
            )
        })
}

/// The delivery limits of one destination (a host, a named endpoint, the SMTP relay): a rate
/// (token bucket) and a cap on sends in flight. `None`: no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limit {
    pub per_second: Option<f64>,
    /// Sends admitted at once after a quiet spell (at least 1). Default: `per_second`, rounded up.
    pub burst: Option<u32>,
    pub max_in_flight: Option<u32>,
}

impl Limit {
    /// The burst in force with a rate: as set, else the rate rounded up.
    pub fn burst_in_force(&self) -> Option<u32> {
        let per_second = self.per_second?;
        Some(self.burst.unwrap_or(per_second.ceil() as u32))
    }

    /// Checks the numbers of `rate_limit_per_second`, `burst` and `max_in_flight` under `key`
    /// (`endpoints.NAME`, `destinations.HOST`…); a refusal names the offending key.
    pub fn parse(
        key: &str,
        per_second: Option<f64>,
        burst: Option<u32>,
        max_in_flight: Option<u32>,
    ) -> Result<Self, crate::domain::InvalidField> {
        use crate::domain::InvalidField;
        // At least one a day: a slower rate's slots would lie centuries ahead.
        if let Some(r) = per_second
            && !(r.is_finite() && (1.0 / 86_400.0..=1_000_000.0).contains(&r))
        {
            return Err(InvalidField::new(
                format!("{key}.rate_limit_per_second"),
                "must be a number of sends a second from 0.0000116 (one a day) to 1000000",
            ));
        }
        if burst.is_some_and(|b| !(1..=100_000).contains(&b)) {
            return Err(InvalidField::new(
                format!("{key}.burst"),
                "must be in 1–100000",
            ));
        }
        if burst.is_some() && per_second.is_none() {
            return Err(InvalidField::new(
                format!("{key}.burst"),
                "needs rate_limit_per_second",
            ));
        }
        if max_in_flight.is_some_and(|n| !(1..=100_000).contains(&n)) {
            return Err(InvalidField::new(
                format!("{key}.max_in_flight"),
                "must be in 1–100000",
            ));
        }
        Ok(Self {
            per_second,
            burst,
            max_in_flight,
        })
    }

    pub fn is_none(&self) -> bool {
        self.per_second.is_none() && self.max_in_flight.is_none()
    }
}

/// Secrets an answer may echo of the request (see [`webhook::Endpoint::secrets`] and the SMTP
/// relay's login). Each is found a character at a time, each character as written or as any echo
/// encodes it — escaped for JSON (`\/`, `\u002f`), as an HTML entity (`&#43;`, `&#x2F;`,
/// `&amp;`), percent-encoded, `+` and a space for each other — in any mix of them and in any
/// ASCII case ([`spellings`]), so that every encoder's own choice of what to escape is covered;
/// and by its base64. A run that spells the first half of a secret or more (8 bytes at least)
/// is hidden too: an echo cut short, or a receiver showing a token's beginning. Made
/// once, with the configuration; `Debug` shows only how many.
#[derive(Clone, Default)]
pub struct Secrets {
    /// Each secret, ASCII-lower-cased.
    plain: Vec<Vec<u8>>,
    /// The base64 of each, lower-cased (found in any case, as the rest).
    base64: Vec<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({})", self.plain.len())
    }
}

/// The shortest beginning of a secret that is hidden alone ([`Secrets`]).
const SHORTEST_PART: usize = 8;

impl Secrets {
    pub fn new(secrets: &[String]) -> Self {
        use base64::Engine;
        let mut plain: Vec<Vec<u8>> = secrets
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| s.to_ascii_lowercase().into_bytes())
            .collect();
        plain.sort_unstable();
        plain.dedup();
        let base64 = secrets
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| {
                base64::engine::general_purpose::STANDARD
                    .encode(s)
                    .to_ascii_lowercase()
            })
            .collect();
        Self { plain, base64 }
    }

    /// `text` with every run that spells a secret (or its first half, see [`Secrets`]) replaced
    /// by `[secret]`.
    pub fn hide(&self, text: &str) -> String {
        if self.plain.is_empty() {
            return text.to_owned();
        }
        // Every run found marks its bytes (ASCII lower-casing keeps byte offsets; a run begins
        // and ends on character boundaries); a run of marked bytes becomes one `[secret]`.
        let lower = text.to_ascii_lowercase();
        let t = lower.as_bytes();
        let mut hidden = vec![false; t.len()];
        let mut scratch = Scratch::default();
        // Each encoded character of the answer (`%…`, `\\…`, `&…`) and the byte it spells, read
        // once for every secret alike.
        let mut escapes: Vec<(u8, usize)> = Vec::new();
        let mut escaped: Vec<(usize, u8)> = Vec::new();
        for p in memchr::memchr3_iter(b'%', b'\\', b'&', t) {
            escapes.clear();
            spellings(t, p, &mut escapes);
            escaped.extend(escapes.iter().skip(1).map(|(b, _)| (p, *b)));
        }
        for secret in &self.plain {
            // Half of it, and 8 bytes at least (all of a shorter one).
            let least = secret
                .len()
                .min(secret.len().div_ceil(2).max(SHORTEST_PART));
            // Only where its first character begins, as written or encoded: every other byte of
            // an answer (up to 64 KiB) is passed over at once (memchr's vectorized search).
            let first = secret[0];
            let other = match first {
                b'+' => b' ',
                b' ' => b'+',
                b => b,
            };
            let mut written = memchr::memchr2_iter(first, other, t).peekable();
            let mut encoded = escaped
                .iter()
                .filter(|(_, b)| *b == first)
                .map(|(p, _)| *p)
                .peekable();
            let mut at = 0;
            loop {
                while written.next_if(|p| *p < at).is_some() {}
                while encoded.next_if(|p| *p < at).is_some() {}
                at = match (written.peek(), encoded.peek()) {
                    (Some(a), Some(b)) => *a.min(b),
                    (Some(a), None) | (None, Some(a)) => *a,
                    (None, None) => break,
                };
                match spelled(&lower, at, secret, least, &mut scratch) {
                    Some(end) => {
                        hidden[at..end].fill(true);
                        at = end;
                    }
                    None => at += 1,
                }
            }
        }
        for form in &self.base64 {
            let mut at = 0;
            while let Some(i) = lower[at..].find(form.as_str()) {
                hidden[at + i..at + i + form.len()].fill(true);
                at += i + form.len();
            }
        }
        let mut out = String::with_capacity(text.len());
        let mut i = 0;
        while i < text.len() {
            let start = i;
            let marked = hidden[i];
            while i < text.len() && hidden[i] == marked {
                i += 1;
            }
            if marked {
                out.push_str("[secret]");
            } else {
                out.push_str(&text[start..i]);
            }
        }
        out
    }
}

/// Room [`spelled`] reuses from one position to the next: the ends reached so far (an encoding
/// may be read in more than one way: `%` alone, or `%25`), the next ones, and one position's
/// spellings.
#[derive(Default)]
struct Scratch {
    ends: Vec<usize>,
    next: Vec<usize>,
    spellings: Vec<(u8, usize)>,
}

/// The end of the longest run of `text` from `at` that spells `secret`, or at least its first
/// `least` bytes, each character as written or encoded ([`spellings`]), ending on a character
/// boundary — a part of it only where no letter or digit follows (`application/` of a secret
/// `application/json` in `application/xml` is another word), or where it spells more than
/// three quarters and what follows is no longer than what is missing (a masked tail); `None` if
/// there is none.
fn spelled(
    text: &str,
    at: usize,
    secret: &[u8],
    least: usize,
    scratch: &mut Scratch,
) -> Option<usize> {
    let t = text.as_bytes();
    let Scratch {
        ends,
        next,
        spellings: here,
    } = scratch;
    ends.clear();
    ends.push(at);
    let mut matched = 0;
    for (k, &c) in secret.iter().enumerate() {
        next.clear();
        for &j in ends.iter() {
            here.clear();
            spellings(t, j, here);
            next.extend(here.iter().filter(|(b, _)| *b == c).map(|(_, end)| *end));
        }
        if next.is_empty() {
            break;
        }
        next.sort_unstable();
        next.dedup();
        std::mem::swap(ends, next);
        matched = k + 1;
    }
    // The longest run only: a shorter one inside it is no part standing alone. A part ends
    // where the text's word does (no letter or digit after it: an echo cut short, `…`), or
    // spells more than three quarters of the secret (a token echoed with its last characters
    // changed or masked); one that stops inside a character ends before it.
    let mut end = ends.iter().copied().max()?;
    if matched == secret.len() {
        return Some(end);
    }
    while !text.is_char_boundary(end) {
        // A byte of a character as written (no encoding ends inside one): one of the secret's.
        end -= 1;
        matched -= 1;
    }
    let stands_alone = || {
        text.get(end..)
            .is_some_and(|after| after.chars().next().is_none_or(|c| !c.is_alphanumeric()))
    };
    // A masked tail: what follows, up to the word's end, is no longer than what is missing.
    let rest = text.get(end..).map_or(0, |after| {
        after
            .chars()
            .take_while(|c| c.is_alphanumeric())
            .map(char::len_utf8)
            .sum::<usize>()
    });
    let most = matched * 4 > secret.len() * 3 && rest <= secret.len() - matched;
    (end > at && matched >= least && (most || stands_alone())).then_some(end)
}

/// HTML's named references an echo may write a secret's characters with.
const NAMED: &[(&[u8], u8)] = &[
    (b"amp;", b'&'),
    (b"lt;", b'<'),
    (b"gt;", b'>'),
    (b"quot;", b'"'),
    (b"apos;", b'\''),
    (b"sol;", b'/'),
    (b"plus;", b'+'),
    (b"equals;", b'='),
];

/// Pushes onto `out` each way `t` spells one character from `j`, as (the byte it spells,
/// lower-cased; where it ends): as written (`t` is lower-cased already), a space for `+` and `+`
/// for a space (a form's encoding and decoding), `%hh`, JSON's `\u00hh` (also escaped again,
/// `\\u00hh`) and `\/`, `\\/`, `\"`, `\\`, HTML's `&#ddd;`, `&#xhh;` and named references.
fn spellings(t: &[u8], j: usize, out: &mut Vec<(u8, usize)>) {
    let rest = &t[j.min(t.len())..];
    let Some(&first) = rest.first() else {
        return;
    };
    // Two hex digits (`from_str_radix` alone would take a sign: `%+f`).
    let hex = |h: &[u8]| {
        h.iter()
            .all(u8::is_ascii_hexdigit)
            .then(|| std::str::from_utf8(h).ok())
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .map(|b| b.to_ascii_lowercase())
    };
    out.push((first, j + 1));
    match first {
        b'+' => out.push((b' ', j + 1)),
        b' ' => out.push((b'+', j + 1)),
        b'%' => {
            if let Some(b) = rest.get(1..3).and_then(hex) {
                out.push((b, j + 3));
            }
        }
        b'\\' => {
            for (prefix, len) in [(&b"\\u00"[..], 6), (&b"\\\\u00"[..], 7)] {
                if rest.starts_with(prefix)
                    && let Some(b) = rest.get(len - 2..len).and_then(hex)
                {
                    out.push((b, j + len));
                }
            }
            if let Some(&c @ (b'/' | b'"' | b'\\')) = rest.get(1) {
                out.push((c, j + 2));
            }
            if rest.starts_with(b"\\\\/") {
                out.push((b'/', j + 3));
            }
        }
        b'&' => {
            if let Some((value, end)) = crate::telemetry::html_numeric_reference(rest)
                && rest.get(end) == Some(&b';')
                && let Ok(b) = u8::try_from(value)
            {
                out.push((b.to_ascii_lowercase(), j + end + 1));
            }
            for (name, ch) in NAMED {
                if rest[1..].starts_with(name) {
                    out.push((*ch, j + 1 + name.len()));
                }
            }
        }
        _ => {}
    }
}

/// A body cut short (at the read limit, or by a lost connection) ends with a piece of a token:
/// dropped back to the last space or delimiter, as a secret cut in two is found by none of its
/// forms (the excerpt keeps the first 200 characters of the words, however many spaces come
/// before them). Minified JSON keeps all but its last, cut value.
pub fn without_a_cut_word(text: &str) -> &str {
    text.trim_end_matches(|c: char| {
        !c.is_whitespace()
            && !matches!(
                c,
                '"' | '\'' | ',' | ':' | '<' | '>' | '{' | '}' | '[' | ']' | '(' | ')'
            )
    })
}

/// At most 200 characters, control characters dropped, anything that looks like an address or a
/// long number masked: the excerpt explains an answer without storing what it may echo back.
pub fn redact_excerpt(text: &str) -> String {
    let mut out = String::new();
    for (i, word) in text.split_whitespace().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let digits = word.chars().filter(|c| c.is_ascii_digit()).count();
        if word.contains('@') {
            out.push_str("[address]");
        } else if digits >= 8 {
            out.push_str("[number]");
        } else {
            out.extend(word.chars().filter(|c| !c.is_control()));
        }
        if out.chars().count() >= 200 {
            break;
        }
    }
    out.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burst_in_force_is_the_rate_rounded_up_unless_set() {
        let limit = |per_second, burst| Limit {
            per_second,
            burst,
            max_in_flight: None,
        };
        assert_eq!(limit(Some(2.5), None).burst_in_force(), Some(3));
        assert_eq!(limit(Some(0.01), None).burst_in_force(), Some(1));
        assert_eq!(limit(Some(2.5), Some(7)).burst_in_force(), Some(7));
        assert_eq!(limit(None, Some(7)).burst_in_force(), None, "no rate");
    }

    #[test]
    fn secrets_are_hidden_as_written_and_as_echoes_encode_them() {
        use base64::Engine;
        let secret = "sk_live_ab/cd+ef=";
        let secrets = [secret.to_owned(), String::new()];
        for echoed in [
            secret.to_owned(),
            secret.to_ascii_uppercase(),
            r"sk_live_ab\/cd+ef=".to_owned(),
            r"sk_live_ab\\/cd+ef=".to_owned(),
            r"sk_live_ab\u002fcd+ef=".to_owned(),
            "sk_live_ab&#x2F;cd&#43;ef&#61;".to_owned(),
            "sk_live_ab&#47;cd+ef=".to_owned(),
            "sk_live_ab%2Fcd%2Bef%3D".to_owned(),
            "sk_live_ab%2fcd%2bef%3d".to_owned(),
            "sk_live_ab/cd ef=".to_owned(),
            r"sk_live_ab/cd\u002bef=".to_owned(),
            base64::engine::general_purpose::STANDARD.encode(secret),
        ] {
            let text = format!(r#"{{"authorization":"Bearer {echoed}","x":1}}"#);
            assert_eq!(
                Secrets::new(&secrets).hide(&text),
                r#"{"authorization":"Bearer [secret]","x":1}"#,
                "{echoed}"
            );
        }
        assert_eq!(Secrets::new(&secrets).hide("nothing here"), "nothing here");
        // An HTML page's and Go's JSON escapes of `>`.
        let angled = ["Pw>12345&x".to_owned()];
        for echoed in ["Pw&gt;12345&amp;x", r"Pw\u003e12345\u0026x"] {
            assert_eq!(
                Secrets::new(&angled).hide(&format!("<p>{echoed}</p>")),
                "<p>[secret]</p>"
            );
        }
        // Non-ASCII around it keeps its place.
        assert_eq!(
            Secrets::new(&secrets).hide("é sk_live_ab/cd+ef= ü"),
            "é [secret] ü"
        ); // Each encoder's own choice of what to escape, in any mix: Go's html/template escapes
        // only `+`, Python's `quote` `+` and `=` but not `/`; decimal, hexadecimal and named
        // references; a JSON escape escaped again.
        for echoed in [
            "sk_live_ab/cd&#43;ef=",
            "sk_live_ab/cd%2Bef%3D",
            "sk_live_ab&sol;cd&plus;ef&equals;",
            "sk_live_ab&#x002f;cd+ef&#061;",
            r"sk_live_ab\\u002fcd+ef=",
            "SK_LIVE_AB%2fcd&#43;EF%3d",
        ] {
            assert_eq!(
                Secrets::new(&secrets).hide(&format!("<td>{echoed}</td>")),
                "<td>[secret]</td>",
                "{echoed}"
            );
        }
        let quoted = ["pa\"ss'word-99".to_owned()];
        for echoed in [
            "pa&#34;ss&#x27;word-99",
            r#"pa\"ss'word-99"#,
            "pa&quot;ss&apos;word-99",
        ] {
            assert_eq!(Secrets::new(&quoted).hide(echoed), "[secret]", "{echoed}");
        }
        // Its first half or more (8 characters at least) alone: an echo cut short, a page
        // showing a token's beginning.
        assert_eq!(
            Secrets::new(&secrets).hide("Bearer sk_live_ab/… (truncated)"),
            "Bearer [secret]… (truncated)"
        );
        assert_eq!(
            Secrets::new(&secrets).hide("Bearer sk_live_…"),
            "Bearer sk_live_…",
            "less than half: left"
        );
        let long = ["0123456789abcdefghijklmnopqrstuv".to_owned()];
        assert_eq!(
            Secrets::new(&long).hide("key 0123456789abcdef!"),
            "key [secret]!"
        );
        assert_eq!(
            Secrets::new(&long).hide("id 0123456789abcde"),
            "id 0123456789abcde"
        );
        // A short secret only whole; a part never ends inside a character.
        let short = ["pw-1234".to_owned()];
        assert_eq!(
            Secrets::new(&short).hide("pw-123 pw-1234"),
            "pw-123 [secret]"
        );
        let accented = ["abcdefgh-ö-tail".to_owned()];
        assert_eq!(
            Secrets::new(&accented).hide("abcdefgh-õ."),
            "abcdefgh-õ.",
            "another word, its letter differing within a character"
        );
        // More than three quarters, whatever follows: a token with its last characters masked.
        let token = ["abcd1234wxyz5678".to_owned()];
        assert_eq!(
            Secrets::new(&token).hide("key abcd1234wxyz5XXX"),
            "key [secret]XXX"
        );
        assert_eq!(
            Secrets::new(&token).hide("key abcd1234XXXXXXXX"),
            "key abcd1234XXXXXXXX",
            "half, then another word: the receiver's own masking"
        );
        assert_eq!(Secrets::new(&accented).hide("abcdefgh-ö…"), "[secret]…");
        assert_eq!(
            Secrets::new(&accented).hide("x abcdefgh-ö-tail"),
            "x [secret]"
        );
        // A part followed by a letter or digit is another word sharing its beginning.
        let header = ["application/json".to_owned()];
        assert_eq!(
            Secrets::new(&header).hide("expected application/xml"),
            "expected application/xml"
        );
        assert_eq!(
            Secrets::new(&header).hide("got application/js…"),
            "got [secret]…"
        );
        assert_eq!(
            Secrets::new(&header).hide("got application/javascript"),
            "got application/javascript",
            "three quarters, then a longer word"
        );
        // `%` takes two hex digits, not a sign.
        let percent = ["ab%cd-1234".to_owned()];
        assert_eq!(Secrets::new(&percent).hide("ab%25cd-1234"), "[secret]");
        let control = ["ab\u{f}cd-1234".to_owned()];
        assert_eq!(Secrets::new(&control).hide("ab%+fcd-1234"), "ab%+fcd-1234");
    }

    #[test]
    fn a_word_cut_at_the_read_limit_is_dropped() {
        assert_eq!(
            without_a_cut_word("Authorization: Bearer sk_li"),
            "Authorization: Bearer "
        );
        assert_eq!(without_a_cut_word("sk_li"), "");
        assert_eq!(
            without_a_cut_word(r#"{"a":"ok","authorization":"Bearer sk_li"#),
            r#"{"a":"ok","authorization":"Bearer "#
        );
        assert_eq!(without_a_cut_word(r#"{"a":"sk_li"#), r#"{"a":""#);
    }

    #[test]
    fn excerpts_hide_addresses_and_numbers() {
        let e = redact_excerpt("rejected user@example.com card 4111111111111111\r\n ok");
        assert_eq!(e, "rejected [address] card [number] ok");
        assert_eq!(redact_excerpt(&"a".repeat(500)).len(), 200);
    }

    #[test]
    fn only_heralds_own_refusals_of_what_is_stored_say_nothing_of_the_receiver() {
        let at = Utc::now();
        let own = [
            "invalid_payload",
            webhook::INVALID_EVENT_ID,
            webhook::INVALID_HEADER,
            email::kind::BARE_LINE_END,
        ];
        for kind in own {
            let r = SendReport::refused(AttemptClass::Permanent, kind, at, "x");
            assert!(r.says_nothing_of_the_receiver(), "{kind}");
            let answered = SendReport {
                status: Some(400),
                ..r
            };
            assert!(
                !answered.says_nothing_of_the_receiver(),
                "{kind} with a status"
            );
        }
        for kind in [
            "connect",
            "timeout",
            "refused_destination",
            "recipients_refused",
        ] {
            let r = SendReport::refused(AttemptClass::Transient, kind, at, "x");
            assert!(!r.says_nothing_of_the_receiver(), "{kind}");
        }
    }
}
