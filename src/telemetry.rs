//! Logging set-up and masking helpers. Log lines carry event ids, classes and hashes; never
//! bodies, addresses, tokens or full URLs.

use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;

/// `log_format` / `HERALD_LOG_FORMAT`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines; ANSI colours only when stderr is a terminal (and `NO_COLOR` unset).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message`, the event's fields
    /// and the current span's (`span.event_id`, `span.host`, …). Never coloured.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!("{other:?} is not a log format (text or json)")),
        }
    }
}

static ACTIVE: OnceLock<LogFormat> = OnceLock::new();

/// The format [`init`] installed, if it ran.
pub fn active_format() -> Option<LogFormat> {
    ACTIVE.get().copied()
}

/// Whether text logs on a stream are coloured: only on a terminal, and never with `NO_COLOR`.
pub fn use_ansi(is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Where the HTTP server logs, at ERROR, each request it could not read (a malformed header, a
/// head too large): the client's doing, answered 400 or 431, and one line each would let anyone
/// fill the log. Off unless `RUST_LOG` names it (`RUST_LOG=info,actix_http=debug`).
const UNREADABLE_REQUESTS: &str = "actix_http::h1::dispatcher";

/// `RUST_LOG`'s directives (default `info`), and the HTTP server's unreadable requests off
/// unless they name `actix_http`.
fn log_filter(rust_log: Option<&str>) -> EnvFilter {
    let given = rust_log
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| Some((v, EnvFilter::try_new(v).ok()?)));
    // A directive whose target is the dispatcher's or a module above it (`actix_http`,
    // `actix_http::h1`): the operator asked for those lines.
    let names_it = |v: &str| {
        v.split(',').any(|d| {
            let target = d.split(['=', '[']).next().unwrap_or("").trim();
            !target.is_empty()
                && UNREADABLE_REQUESTS
                    .strip_prefix(target)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
        })
    };
    let (filter, named) = match given {
        Some((v, filter)) => (filter, names_it(v)),
        None => (EnvFilter::new("info"), false),
    };
    if named {
        return filter;
    }
    match format!("{UNREADABLE_REQUESTS}=off").parse() {
        Ok(off) => filter.add_directive(off),
        Err(_) => filter,
    }
}

/// Installs the global subscriber: `RUST_LOG` (default `info`) to stderr, as `format` says.
pub fn init(format: LogFormat) {
    let filter = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests) is harmless: keep the first subscriber.
    let installed = match format {
        LogFormat::Text => builder
            .with_ansi(use_ansi(
                std::io::stderr().is_terminal(),
                std::env::var_os("NO_COLOR").as_deref(),
            ))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    if installed.is_ok() {
        let _ = ACTIVE.set(format);
    }
}

/// `user@example.com` → `u***@e***.com`.
pub fn mask_email(address: &str) -> String {
    // `Name <local@domain>`: the address in the brackets (the display name is not shown).
    let address = match address.trim_end().strip_suffix('>') {
        Some(rest) => rest.rsplit_once('<').map_or(rest, |(_, inner)| inner),
        None => address,
    };
    let Some((local, domain)) = address.rsplit_once('@') else {
        return mask_opaque(address);
    };
    let (host, tld) = domain.rsplit_once('.').unwrap_or((domain, ""));
    let first = |s: &str| s.chars().next().map(String::from).unwrap_or_default();
    let tld = if tld.is_empty() {
        String::new()
    } else {
        format!(".{tld}")
    };
    format!("{}***@{}***{}", first(local), first(host), tld)
}

/// How an address's `@` may be written besides an HTML numeric reference (`&#64;`, `&#x0040;`,
/// with or without its `;`, read by [`numeric_at`]): as it is, percent-encoded (a URL),
/// JSON-escaped, as HTML's named reference, full-width or small. Lower case (the text is
/// compared so).
const AT_SIGNS: &[&str] = &["@", "%40", "&commat;", "\\u0040", "\u{ff20}", "\u{fe6b}"];

/// The HTML numeric reference at the start of `text` (lower-cased): `&#`, then decimal digits or
/// `x` and hexadecimal ones, leading zeros allowed. Its code point, and where its digits end
/// (the caller decides whether a `;` must follow). Read for hiding a secret's characters
/// (`channels::Secrets`) and for masking an address's `@` ([`at_sign`]).
pub(crate) fn html_numeric_reference(text: &[u8]) -> Option<(u32, usize)> {
    let code = text.strip_prefix(b"&#")?;
    let (digits, radix) = match code.strip_prefix(b"x") {
        Some(hex) => (hex, 16),
        None => (code, 10),
    };
    let n = digits
        .iter()
        .take_while(|b| {
            if radix == 16 {
                b.is_ascii_hexdigit()
            } else {
                b.is_ascii_digit()
            }
        })
        .count();
    // ASCII digits, always text; none at all is no number.
    let value = u32::from_str_radix(std::str::from_utf8(&digits[..n]).ok()?, radix).ok()?;
    Some((value, text.len() - digits.len() + n))
}

/// The length of an HTML numeric reference to `@` at the start of `text` (lower-cased): `&#64`
/// or `&#x40`, leading zeros allowed, then `;` or not.
fn numeric_at(text: &str) -> Option<usize> {
    let (value, end) = html_numeric_reference(text.as_bytes())?;
    (value == 64).then(|| end + usize::from(text[end..].starts_with(';')))
}

/// Where the first `@` of `text` is, however written ([`AT_SIGNS`], [`numeric_at`]), and how
/// long it is there.
fn at_sign(text: &str) -> Option<(usize, usize)> {
    if !text
        .bytes()
        .any(|b| matches!(b, b'@' | b'%' | b'&' | b'\\' | 0xef))
    {
        return None;
    }
    let lower = text.to_ascii_lowercase();
    let numeric = lower
        .match_indices("&#")
        .find_map(|(i, _)| numeric_at(&lower[i..]).map(|len| (i, len)));
    AT_SIGNS
        .iter()
        .filter_map(|sign| lower.find(sign).map(|i| (i, sign.len())))
        .chain(numeric)
        .min()
}

/// `text` with every `:`-separated part that holds an address masked (a provider's composite
/// event id such as Postmark's `Delivery:ID:ada@example.com:TIME`), its `@` written in any of
/// the ways an echo writes it (`ada%40example.com`, `ada&#64;example.com`, `ada＠example.com`).
pub fn mask_emails_in(text: &str) -> String {
    text.split(':')
        .map(|part| match at_sign(part) {
            Some((at, len)) => mask_email(&format!("{}@{}", &part[..at], &part[at + len..])),
            None => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(":")
}

/// Free text (a reason, a provider's event type): each word holding an `@`, however written
/// ([`at_sign`]), masked as [`mask_emails_in`] does, the other words as they are. Masking the
/// text whole took its words with it (`soft bounce for harry@example.com` became
/// `s***@e***.com`).
pub fn mask_emails_in_words(text: &str) -> String {
    text.split(' ')
        .map(|w| {
            if at_sign(w).is_some() {
                mask_emails_in(w)
            } else {
                w.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// An event id as logs show it: as it is, but an address in it masked as [`mask_emails_in`]
/// does (an application may key its messages by address, `signup:ada@example.com`; logs carry
/// event ids and no address). No copy when it holds none.
pub struct LogEventId<'a>(pub &'a str);

impl std::fmt::Display for LogEventId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = self.0;
        // No allocation on the send path for an id without an `@` however written.
        if at_sign(id).is_some() {
            f.write_str(&mask_emails_in(id))
        } else {
            f.write_str(id)
        }
    }
}

/// A URL reduced to scheme and host: path, query and credentials can carry secrets.
pub fn mask_url(url: &str) -> String {
    match url::Url::parse(url) {
        // The port stays (one that is not the scheme's own): it tells two receivers on one
        // host apart, and is no secret.
        Ok(u) => format!(
            "{}://{}{}/…",
            u.scheme(),
            u.host_str().unwrap_or("?"),
            u.port().map(|p| format!(":{p}")).unwrap_or_default()
        ),
        Err(_) => mask_opaque(url),
    }
}

/// Whether `c` is a character text shown to a person must not carry raw: a control character
/// (C0 but for line feed, carriage return and tab; DEL; C1) or a bidirectional-formatting one
/// that reorders what follows it (the embeddings, overrides and isolates) or breaks a line (the
/// line and paragraph separators), which would drive a terminal or turn the words around it
/// backwards. The marks (U+200E, U+200F, U+061C), which names in Hebrew or Arabic carry, are
/// taken.
pub fn unprintable(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        | '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Whether `text` holds what a stored identifier or reason may not: any control character (line
/// breaks and tabs too) or an [`unprintable`] one. The one rule of the API's destination check,
/// the reasons' check and the table's `herald_outbox_printable` trigger.
pub fn holds_unprintable(text: &str) -> bool {
    text.chars().any(|c| c.is_control() || unprintable(c))
}

/// `text` with each [`unprintable`] character written out as `\u{…}`, for a page or a terminal:
/// stored text an application or a provider wrote (an event id inserted by SQL before such ids
/// were refused, a receipt's type, a replay reason) is shown, never obeyed.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    escape_unprintable(text, |c| format!("\\u{{{:x}}}", c as u32))
}

/// `text` with each [`unprintable`] character replaced by `escape(c)`; borrowed when none is.
fn escape_unprintable(text: &str, escape: impl Fn(char) -> String) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(unprintable) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unprintable(c) {
            out.push_str(&escape(c));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `value` as JSON with each [`unprintable`] character escaped as `\uXXXX`: the same value to
/// any JSON reader, but nothing a terminal obeys or that turns the words around it backwards when
/// the document is printed (`herald explain --json`, `curl` on the API). serde_json escapes C0
/// already, not DEL, C1 or the bidirectional controls; outside strings JSON is ASCII, so every
/// such character found is inside a string, and each is in the Basic Multilingual Plane.
pub fn json_printable<T: serde::Serialize + ?Sized>(
    value: &T,
    pretty: bool,
) -> serde_json::Result<String> {
    let json = if pretty {
        serde_json::to_string_pretty(value)?
    } else {
        serde_json::to_string(value)?
    };
    // Not copied when nothing needs escaping (every answer passes here).
    let escaped = match escape_unprintable(&json, |c| format!("\\u{:04x}", c as u32)) {
        std::borrow::Cow::Owned(escaped) => Some(escaped),
        std::borrow::Cow::Borrowed(_) => None,
    };
    Ok(escaped.unwrap_or(json))
}

fn mask_opaque(value: &str) -> String {
    format!("[{} chars]", value.chars().count())
}

#[cfg(test)]
mod tests {
    /// The HTTP server's unreadable-request lines are off unless a directive names the
    /// dispatcher or a module above it; a `RUST_LOG` that does not parse is `info` (and off).
    #[test]
    fn unreadable_requests_are_off_unless_named() {
        let off = |v: Option<&str>| log_filter(v).to_string().contains("dispatcher=off");
        for v in [
            None,
            Some(""),
            Some("info"),
            Some("debug,actix_http::h2=debug"),
            Some("actix_http_extra=debug"),
            Some("bogus=loud"),
        ] {
            assert!(off(v), "{v:?}: {}", log_filter(v));
        }
        for v in [
            "info,actix_http=debug",
            "actix_http::h1=warn",
            "actix_http::h1::dispatcher=error",
            "trace,actix_http=trace",
        ] {
            assert!(!off(Some(v)), "{v}: {}", log_filter(Some(v)));
        }
        assert!(log_filter(Some("warn")).to_string().contains("warn"));
    }
    use super::*;

    #[test]
    fn an_event_id_is_logged_with_an_address_in_it_masked() {
        let shown = |id: &str| LogEventId(id).to_string();
        assert_eq!(shown("order-42:placed"), "order-42:placed");
        assert_eq!(shown("signup:ada@example.com:1"), "signup:a***@e***.com:1");
        assert_eq!(shown("signup:ada%40example.com"), "signup:a***@e***.com");
    }

    #[test]
    fn a_percent_encoded_address_is_masked_too() {
        assert_eq!(
            mask_emails_in("Delivery:9:ada%40example.com:T1"),
            mask_emails_in("Delivery:9:ada@example.com:T1")
        );
        assert!(!mask_emails_in("x:ADA%40EXAMPLE.COM").contains("ADA%40"));
        assert_eq!(mask_emails_in("100%25:plain"), "100%25:plain");
        // An `@` written as an echo may write it: an HTML reference, JSON-escaped, full-width.
        for written in [
            "nina\\u0040example.com",
            "nina&#64;example.com",
            "NINA&#X40;EXAMPLE.COM",
            "nina&commat;example.com",
            "nina\u{ff20}example.com",
            "nina\u{fe6b}example.com",
            "nina&#064;example.com",
            "nina&#x0040;example.com",
            "nina&#64example.com",
        ] {
            let masked = mask_emails_in(&format!("x:{written}"));
            assert_eq!(masked.to_ascii_lowercase(), "x:n***@e***.com", "{written}");
        }
        assert_eq!(mask_emails_in("a&b:c\\d"), "a&b:c\\d");
    }

    #[test]
    fn unprintable_characters_are_written_out() {
        assert_eq!(printable("plain café\nline\ttab"), "plain café\nline\ttab");
        assert_eq!(
            printable("evil\u{1b}[31m rtl-\u{202e}gnp \u{85}\u{2066}"),
            "evil\\u{1b}[31m rtl-\\u{202e}gnp \\u{85}\\u{2066}"
        );
        assert!(matches!(printable("ok"), std::borrow::Cow::Borrowed(_)));
        // A right-to-left mark in a Hebrew or Arabic name is no threat: taken as it is.
        assert_eq!(
            printable("\u{5d3}\u{5e0}\u{200f} <d@example.com>"),
            "\u{5d3}\u{5e0}\u{200f} <d@example.com>"
        );
    }

    #[test]
    fn json_is_escaped_where_a_terminal_would_obey_it_and_reads_back_the_same() {
        let value = serde_json::json!({
            "event_id": "evil\u{1b}[31m rtl-\u{202e}gnp \u{7f}\u{85}\u{2066}",
            "name": "\u{5d3}\u{200f} café",
            "nested": ["\u{2028}", 1, null],
        });
        for pretty in [false, true] {
            let json = json_printable(&value, pretty).unwrap();
            assert!(!json.chars().any(unprintable), "{json}");
            assert!(
                json.contains("\\u202e") && json.contains("\\u007f"),
                "{json}"
            );
            assert!(
                json.contains("\u{200f} café"),
                "marks and letters stay: {json}"
            );
            assert_eq!(
                serde_json::from_str::<serde_json::Value>(&json).unwrap(),
                value
            );
        }
        assert_eq!(json_printable(&"ok", false).unwrap(), "\"ok\"");
    }

    #[test]
    fn log_formats_and_colour() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!(" text ".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert!(
            "JSON5"
                .parse::<LogFormat>()
                .unwrap_err()
                .contains("text or json")
        );
        let no_color = std::ffi::OsStr::new("1");
        assert!(use_ansi(true, None));
        assert!(use_ansi(true, Some(std::ffi::OsStr::new(""))));
        assert!(!use_ansi(true, Some(no_color)));
        assert!(!use_ansi(false, None));
    }

    #[test]
    fn masks_keep_only_a_hint() {
        assert_eq!(mask_email("user@example.com"), "u***@e***.com");
        assert_eq!(mask_email("nodomain"), "[8 chars]");
        // A display name is not shown, nor is its first letter; the brackets go.
        assert_eq!(
            mask_email("Ada Lovelace <ada@example.com>"),
            "a***@e***.com"
        );
        assert_eq!(
            mask_email("\"a@b\" <zed@corp.example>"),
            "z***@c***.example"
        );
        assert_eq!(
            mask_url("https://u:p@hooks.example.com/secret/path?token=x"),
            "https://hooks.example.com/…"
        );
        // A port of its own stays, the scheme's default is not written.
        assert_eq!(
            mask_url("http://10.0.0.7:8080/h?k=v"),
            "http://10.0.0.7:8080/…"
        );
        assert_eq!(mask_url("https://a.example:443/h"), "https://a.example/…");
    }
}
