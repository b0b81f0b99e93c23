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

/// A payload's custom header given twice (names compare without case), refused at enqueue for
/// webhooks and email alike: only one of the two would reach the receiver.
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
/// relay's login), as the forms to look for: each as written and as an echo writes it
/// ([`secret_forms`]: escaped for JSON or HTML, percent-encoded, base64), lower-cased to be found
/// in any ASCII case (an echo that upper-cases header values). Made once, with the configuration;
/// `Debug` shows only how many forms.
#[derive(Clone, Default)]
pub struct Secrets {
    forms: Vec<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} forms)", self.forms.len())
    }
}

impl Secrets {
    pub fn new(secrets: &[String]) -> Self {
        let mut forms: Vec<String> = secrets
            .iter()
            .filter(|s| !s.is_empty())
            .flat_map(|s| secret_forms(s))
            .filter(|f| !f.is_empty())
            .map(|f| f.to_ascii_lowercase())
            .collect();
        forms.sort_unstable();
        forms.dedup();
        Self { forms }
    }

    /// `text` with every occurrence of each form replaced by `[secret]`.
    pub fn hide(&self, text: &str) -> String {
        hide_forms(text, &self.forms)
    }
}

fn hide_forms(text: &str, forms: &[String]) -> String {
    if forms.is_empty() {
        return text.to_owned();
    }
    // Every form found marks its bytes (ASCII lower-casing keeps byte offsets, and a match
    // begins and ends on character boundaries); a run of marked bytes becomes one `[secret]`.
    // One pass over the text per form, one copy of it in all.
    let lower = text.to_ascii_lowercase();
    let mut hidden = vec![false; text.len()];
    for form in forms {
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

/// `secret` and the forms an answer that echoes it may write it in: `/` escaped for JSON (`\/`,
/// `\\/`, `\u002f`), its `/`, `+` and `=` as HTML entities, percent-encoded (as a URL or a form
/// carries it), and its base64.
fn secret_forms(secret: &str) -> Vec<String> {
    use base64::Engine;
    let html = secret
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;");
    let mut forms = vec![
        secret.to_owned(),
        secret.replace('/', r"\/"),
        secret.replace('/', r"\\/"),
        secret.replace('/', r"\u002f"),
        // Go's JSON escapes these three, and some encoders `+`.
        secret
            .replace('<', r"\u003c")
            .replace('>', r"\u003e")
            .replace('&', r"\u0026")
            .replace('+', r"\u002b"),
        html.clone(),
        html.replace('/', "&#x2F;")
            .replace('+', "&#43;")
            .replace('=', "&#61;"),
        html.replace('/', "&#47;"),
        // A form's decoding reads `+` as a space.
        secret.replace('+', " "),
        base64::engine::general_purpose::STANDARD.encode(secret),
    ];
    let mut percent = String::new();
    for b in secret.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            percent.push(char::from(b));
        } else {
            percent.push_str(&format!("%{b:02X}"));
        }
    }
    forms.push(percent.replace("%20", "+"));
    forms.push(percent);
    forms
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
        );
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
