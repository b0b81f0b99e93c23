//! The email channel: SMTP over pooled lettre connections, or — by default — a directory of
//! `.eml` files. Every message has a deterministic `Message-ID` derived from the event id and an
//! `X-Herald-Event-Id` header, so a receiver can drop duplicates.
//!
//! An SMTP attempt knows how far it got ([`Stage`]), and that decides its class:
//!
//! - **Connecting** (DNS, TCP, TLS, the greeting, EHLO, STARTTLS, AUTH): any failure is
//!   `not_sent`, a reply code included — a 421 or 554 greeting, a 535 to AUTH. The message never
//!   left, so it is retried (also under `at_most_once`) and never dead-lettered for what the
//!   server said about the session; the attempt keeps the code (`response_status`) and an error
//!   kind naming the step ([`ConnectStep`]: `smtp_greeting_refused`, `smtp_starttls_refused`,
//!   `smtp_auth_refused`).
//! - **Envelope** (MAIL FROM, RCPT TO, DATA): a reply code decides (4xx `transient`, 5xx
//!   `permanent`); a timeout or a lost connection is `not_sent` — the server cannot have
//!   accepted content it never received.
//! - **Content**: the final reply decides the same way; a timeout or a lost connection once the
//!   content is on its way is `ambiguous`.
//! - **CHUNKING** (RFC 3030, when the relay offers it with PIPELINING; `smtp_chunking`): an
//!   `at_least_once` message's content leaves in the envelope's write, after `BDAT n LAST`, so
//!   the attempt is at the content stage from that write on. A reply decides as above; a timeout
//!   is `ambiguous`, and so is a lost connection unless a reply read before it proved that
//!   nothing was taken (a refused MAIL FROM, every recipient refused, a 421 after which the
//!   server closed) ([`chunked_end`]). `at_most_once` messages never go this way.
//!
//! After any failure the connection is closed, never parked for reuse: a 421 (the server
//! closing the channel) anywhere included. The whole attempt is bounded by the SMTP timeout,
//! connecting and waiting for one of the pool's `smtp_pool_size` connections included. Waiting
//! may take half of it at most: a message that got no connection by then is `not_sent`
//! (`pool_timeout`), nothing having been sent, and put back without spending an attempt; so no
//! dialogue begins with less than half the timeout left.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tracing::info;

use lettre::Message;
use lettre::address::Envelope;
use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::{Credentials, DEFAULT_MECHANISMS};
use lettre::transport::smtp::client::{AsyncSmtpConnection, Tls, TlsParameters};
use lettre::transport::smtp::commands::{Data, Ehlo, Mail, Noop, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::response::{Response, Severity};
use lettre::transport::smtp::{SMTP_PORT, SUBMISSION_PORT, SUBMISSIONS_PORT};
use serde_json::Value;

use super::{Outgoing, SendReport};
use crate::clock::Clock;
use crate::domain::classify::classify_smtp_code;
use crate::domain::{AttemptClass, InvalidField, Semantics};
use crate::secret::Secret;

pub mod attachments;
pub mod dkim;
pub mod list_unsubscribe;
pub mod relay;

use attachments::Attachment;
use dkim::DkimSigner;
use list_unsubscribe::ListUnsubscribe;
use relay::RelayProvider;

/// The recipient (`destination`) of an email: `a@b.example` or `Name <a@b.example>`.
pub fn parse_recipient(destination: &str) -> Result<Mailbox, InvalidField> {
    parse_mailbox(destination)
        .ok_or_else(|| InvalidField::new("destination", "must be an email address"))
}

/// An address as it goes on the wire, its domain an internationalized one's ASCII form (IDNA
/// A-labels, `bücher.example` → `xn--bcher-kva.example`), so that mail to it needs no SMTPUTF8:
/// RFC 5321's envelope and RFC 5322's headers take only those. An address with a non-ASCII
/// local part (`josé@…`) still needs SMTPUTF8, which no conversion can spare it. A non-ASCII
/// domain that IDNA refuses (a zero-width joiner, say, which lettre's own check lets through) is
/// no address.
fn parse_mailbox(s: &str) -> Option<Mailbox> {
    Mailbox::from_str(s).ok().and_then(ascii_domain)
}

/// [`parse_mailbox`]'s conversion of a parsed address.
fn ascii_domain(m: Mailbox) -> Option<Mailbox> {
    let domain = m.email.domain();
    if domain.is_ascii() {
        return Some(m);
    }
    let ascii = idna::domain_to_ascii(domain).ok()?;
    let email = lettre::Address::new(m.email.user(), ascii).ok()?;
    Some(Mailbox::new(m.name, email))
}

/// `{"from"?, "to"?: […], "cc"?, "bcc"?, "reply_to"?, "subject", "text"?, "html"?, "headers"?,
/// "attachments"?, "list_unsubscribe"?, "list_unsubscribe_post"?}`.
#[derive(Debug, Clone)]
pub struct EmailPayload {
    pub from: Option<Mailbox>,
    pub to: Vec<Mailbox>,
    pub cc: Vec<Mailbox>,
    pub bcc: Vec<Mailbox>,
    pub reply_to: Option<Mailbox>,
    pub subject: String,
    pub text: Option<String>,
    pub html: Option<String>,
    pub headers: Vec<(String, String)>,
    /// At most [`attachments::MAX_COUNT`], [`attachments::MAX_TOTAL_BYTES`] decoded in total.
    pub attachments: Vec<Attachment>,
    /// `List-Unsubscribe` and, for one-click, `List-Unsubscribe-Post`.
    pub list_unsubscribe: Option<ListUnsubscribe>,
}

impl EmailPayload {
    /// Every field checked, the first invalid one named (`payload.attachments[0].content_base64`).
    /// The sender calls this at every send, where a failure is `permanent`. It lets through what
    /// only enqueue refuses (see [`Self::parse_all`]), so that a row accepted before those
    /// refusals existed, or written by SQL, is sent as it was then: a custom `X-Herald-…`
    /// header or a bare `X-` is dropped, a name given twice keeps its last value, and an empty
    /// text is an empty body.
    pub fn parse(payload: &Value) -> Result<Self, InvalidField> {
        Self::parse_with(payload, false).map_err(|mut e| e.swap_remove(0))
    }

    /// Every field checked, every invalid one named (never an empty list): what the enqueue
    /// paths answer (a 422 lists them all). Stricter than [`Self::parse`]: an `X-Herald-…` or a
    /// bare `X-` custom header, a header name given twice, and an empty body are refused.
    pub fn parse_all(payload: &Value) -> Result<Self, Vec<InvalidField>> {
        Self::parse_with(payload, true)
    }

    fn parse_with(payload: &Value, at_enqueue: bool) -> Result<Self, Vec<InvalidField>> {
        let obj = payload.as_object().ok_or_else(|| {
            vec![InvalidField::new(
                "payload",
                "must be an object with a subject",
            )]
        })?;
        const KNOWN: &[&str] = &[
            "from",
            "to",
            "cc",
            "bcc",
            "reply_to",
            "subject",
            "text",
            "html",
            "headers",
            "attachments",
            "list_unsubscribe",
            "list_unsubscribe_post",
        ];
        let mut errors: Vec<InvalidField> = obj
            .keys()
            .filter(|k| !KNOWN.contains(&k.as_str()))
            .map(|k| InvalidField::new(format!("payload.{k}"), "is not a known field"))
            .collect();
        let string = |field: &'static str, key: &str| -> Result<Option<String>, InvalidField> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(InvalidField::new(field, "must be a string")),
            }
        };
        // A display name is written unbroken where it has no space (see [`folds`]).
        let foldable = |m: Mailbox| m.name.as_deref().is_none_or(folds).then_some(m);
        let mailbox = |field: &'static str, key: &str| -> Result<Option<Mailbox>, InvalidField> {
            string(field, key)?
                .map(|s| {
                    parse_mailbox(&s)
                        .and_then(foldable)
                        .ok_or_else(|| InvalidField::new(field, "must be an email address"))
                })
                .transpose()
        };
        let list = |field: &'static str, key: &str| -> Result<Vec<Mailbox>, InvalidField> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .and_then(parse_mailbox)
                            .and_then(foldable)
                            .ok_or_else(|| {
                                InvalidField::new(field, "must be a list of email addresses")
                            })
                    })
                    .collect(),
                Some(_) => Err(InvalidField::new(
                    field,
                    "must be a list of email addresses",
                )),
            }
        };
        let subject = (|| {
            let subject = string("payload.subject", "subject")?.unwrap_or_default();
            if subject.trim().is_empty() {
                return Err(InvalidField::new("payload.subject", "is required"));
            }
            if subject.contains(['\r', '\n']) {
                return Err(InvalidField::new("payload.subject", "must be one line"));
            }
            // As a custom header's value: it went out raw (`Subject: a^[b`). Refused at enqueue
            // only: a row taken before is sent as it was then.
            if at_enqueue && has_control(&subject) {
                return Err(InvalidField::new(
                    "payload.subject",
                    "must not hold a control character (but tab)",
                ));
            }
            if !folds(&subject) {
                return Err(InvalidField::new(
                    "payload.subject",
                    format!(
                        "has a run of more than {MAX_HEADER_WORD} characters without a space (SMTP's line limit)"
                    ),
                ));
            }
            Ok(subject)
        })();
        let body = (|| {
            let text = string("payload.text", "text")?;
            let html = string("payload.html", "html")?;
            // An empty string is no body: a message needs one that says something. Nor is one
            // of blank lines (spaces, tabs, line breaks): it says nothing either, and its DKIM
            // signature (lettre's) fails to verify — its relaxed body hashes as a line break,
            // not as empty (RFC 6376 §3.4.4).
            // (With attachments the message is multipart: a blank text beside them is fine.)
            let attached = obj
                .get("attachments")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
            let blank = |b: &str| {
                b.is_empty()
                    || (!attached && b.chars().all(|c| matches!(c, ' ' | '\t' | '\r' | '\n')))
            };
            let empty = |b: &Option<String>| b.as_deref().is_none_or(|b| at_enqueue && blank(b));
            if empty(&text) && empty(&html) {
                return Err(InvalidField::new(
                    "payload.text",
                    "text or html is required, and not empty or blank",
                ));
            }
            Ok((text, html))
        })();
        let headers = match obj.get("headers") {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Object(h)) => {
                let mut parsed = Vec::with_capacity(h.len());
                for (k, v) in h {
                    // Sent as before these refusals: Herald's own and bare names dropped.
                    if !at_enqueue && (is_herald_header(k) || k.eq_ignore_ascii_case("x-")) {
                        continue;
                    }
                    match parse_header(k, v, at_enqueue) {
                        Ok(h) => parsed.push(h),
                        Err(e) => errors.push(e),
                    }
                }
                if at_enqueue {
                    errors.extend(super::repeated_header(
                        parsed.iter().map(|(k, _)| k.as_str()),
                    ));
                }
                Ok(parsed)
            }
            Some(_) => Err(InvalidField::new(
                "payload.headers",
                "must be an object of strings",
            )),
        };
        /// The value, or its refusal added to `errors`.
        fn take<T>(errors: &mut Vec<InvalidField>, r: Result<T, InvalidField>) -> Option<T> {
            r.map_err(|e| errors.push(e)).ok()
        }
        let e = &mut errors;
        let subject = take(e, subject);
        let body = take(e, body);
        let headers = take(e, headers);
        let from = take(e, mailbox("payload.from", "from"));
        let to = take(e, list("payload.to", "to"));
        let cc = take(e, list("payload.cc", "cc"));
        let bcc = take(e, list("payload.bcc", "bcc"));
        let reply_to = take(e, mailbox("payload.reply_to", "reply_to"));
        let attachments = take(e, attachments::parse(obj.get("attachments")));
        let list_unsubscribe = take(
            e,
            list_unsubscribe::parse(
                obj.get("list_unsubscribe"),
                obj.get("list_unsubscribe_post"),
            ),
        );
        match (
            subject,
            body,
            headers,
            from,
            to,
            cc,
            bcc,
            reply_to,
            attachments,
            list_unsubscribe,
        ) {
            (
                Some(subject),
                Some((text, html)),
                Some(headers),
                Some(from),
                Some(to),
                Some(cc),
                Some(bcc),
                Some(reply_to),
                Some(attachments),
                Some(list_unsubscribe),
            ) if errors.is_empty() => Ok(Self {
                from,
                to,
                cc,
                bcc,
                reply_to,
                subject,
                text,
                html,
                headers,
                attachments,
                list_unsubscribe,
            }),
            _ => Err(errors),
        }
    }
}

/// Herald's own header names (`X-Herald-…`: its event id), which a payload may not set.
fn is_herald_header(name: &str) -> bool {
    name.as_bytes()
        .get(..9)
        .is_some_and(|b| b.eq_ignore_ascii_case(b"x-herald-"))
}

/// Whether a one-line header value holds a control character other than tab (a NUL is refused
/// on its own, with its path, as anywhere in a payload).
fn has_control(value: &str) -> bool {
    value
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\t' | '\0'))
}

/// A custom header: an `X-…` name of printable ASCII (RFC 5322 `ftext`: no control character,
/// space or `:` — lettre's own check lets CR and LF through, and it writes the name as given, so
/// `X-A\r\nReply-To` would have been a header of its own) with a one-line string value (no
/// control character but tab). The relay headers Herald merges its correlation into
/// ([`relay::JSON_OBJECT_HEADERS`]) must hold a JSON object; it is written again with a space
/// after each `,` and `:`, where the header can fold.
fn parse_header(
    name: &str,
    value: &Value,
    at_enqueue: bool,
) -> Result<(String, String), InvalidField> {
    let v = value
        .as_str()
        // A NUL is refused on its own, with its path, as anywhere in a payload.
        .filter(|v| !has_control(v));
    // `X-` and a name after it; never Herald's own `X-Herald-…` (its event id header, which a
    // payload could otherwise have spoofed: it was dropped without a word).
    if is_herald_header(name) {
        return Err(InvalidField::new(
            "payload.headers",
            format!("{name:?}: X-Herald-… headers are Herald's own"),
        ));
    }
    // lettre takes names of at most 76 characters (a header line's first fold).
    if name.len() > MAX_HEADER_NAME {
        return Err(InvalidField::new(
            "payload.headers",
            format!(
                "\"{}…\": a custom header name is at most {MAX_HEADER_NAME} characters",
                name.chars().take(20).collect::<String>().escape_debug()
            ),
        ));
    }
    let ok_name = (name.starts_with("X-") || name.starts_with("x-"))
        && name.len() > 2
        && name
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b':');
    let (Some(v), true) = (
        v,
        ok_name && HeaderName::new_from_ascii(name.to_owned()).is_ok(),
    ) else {
        return Err(InvalidField::new(
            "payload.headers",
            format!("{name:?}: custom headers are X-… names with one-line string values"),
        ));
    };
    let json_object = relay::JSON_OBJECT_HEADERS
        .iter()
        .any(|h| h.eq_ignore_ascii_case(name));
    let v = if json_object {
        // Read and written again (Herald adds its id): a key given twice would keep only its
        // last value, an integer past 64 bits would become a double, each sent as another value.
        // Refused at enqueue; a row accepted before, or written by SQL, is sent as then.
        let refused = |m: String| Err(InvalidField::new(format!("payload.headers.{name}"), m));
        if at_enqueue && let Some(key) = crate::domain::duplicate_keys(v.as_bytes(), 1).first() {
            return refused(format!("gives {key} more than once; give it once"));
        }
        if at_enqueue && let Some(at) = crate::domain::integers_beyond_64_bits(v.as_bytes()).first()
        {
            return refused(format!(
                "holds at {at} an integer no 64-bit integer holds, which would be sent as \
                 another number"
            ));
        }
        match serde_json::from_str::<Value>(v) {
            // SendGrid's `unique_args` is where the id goes: one that is not an object would
            // have to be replaced, losing what the application put there.
            Ok(Value::Object(o))
                if name.eq_ignore_ascii_case(relay::SENDGRID)
                    && o.get("unique_args").is_some_and(|a| !a.is_object()) =>
            {
                return Err(InvalidField::new(
                    format!("payload.headers.{name}"),
                    "its unique_args must be a JSON object (Herald adds herald_event_id to it)",
                ));
            }
            Ok(o @ Value::Object(_)) => relay::spaced_json(&o),
            Ok(_) => {
                return refused(
                    "must be a JSON object (Herald adds herald_event_id to it)".to_owned(),
                );
            }
            // `1e400`, which no double holds, among others: what the parser says, with where.
            Err(e) => return refused(format!("is not JSON Herald can read: {e}")),
        }
    } else {
        v.to_owned()
    };
    // SMTP lines end at 998 characters and a header folds only at spaces: a longer run would
    // come back as a 5xx after DATA (a dead letter) instead of a 422 now. Judged as sent (a
    // relay JSON header with its non-ASCII escaped, `\u00eb`); a row taken before that, whose
    // relay JSON was judged unescaped, is sent as then.
    if (at_enqueue || !json_object) && (v.len() > MAX_HEADER_VALUE || !folds(&v)) {
        return Err(InvalidField::new(
            format!("payload.headers.{name}"),
            format!(
                "too long: at most {MAX_HEADER_VALUE} bytes, and no run of more than \
                 {MAX_HEADER_WORD} without a space (SMTP's line limit)"
            ),
        ));
    }
    Ok((name.to_owned(), v))
}

/// Whether a header value can be folded under SMTP's line limit: lettre folds only at spaces
/// (not at tabs or other white space) and never breaks an ASCII word, so no ASCII run between
/// spaces may be longer than [`MAX_HEADER_WORD`]. A run with non-ASCII text goes out as RFC 2047
/// encoded words, which lettre writes in pieces it can fold.
pub(crate) fn folds(v: &str) -> bool {
    v.split(' ')
        .all(|w| w.len() <= MAX_HEADER_WORD || !w.is_ascii())
}

/// The longest custom header value accepted.
const MAX_HEADER_VALUE: usize = 8000;
/// The longest custom header name lettre takes.
const MAX_HEADER_NAME: usize = 76;
/// The longest run without white space in a custom header value: what fits on one SMTP line
/// with a header name before it.
const MAX_HEADER_WORD: usize = 900;

/// `<sha256(event_id)[..32 hex]@domain>`: the same event id always gives the same Message-ID.
pub fn message_id(event_id: &str, domain: &str) -> String {
    format!("<{}@{domain}>", crate::domain::email_message_key(event_id))
}

/// What [`build_message`] adds beyond the row: relay correlation and a DKIM signature.
#[derive(Debug, Clone, Default)]
pub struct MessageOptions {
    /// `smtp_provider`: where the event id is also written for that relay's receipts.
    pub relay: Option<RelayProvider>,
    /// `dkim_*`: sign every message.
    pub dkim: Option<Arc<DkimSigner>>,
}

/// Builds the RFC 5322 message for a claimed row. Deterministic but for `Date` and the DKIM
/// timestamp: the same row gives the same Message-ID, headers and body on every attempt.
pub fn build_message(
    row: &Outgoing<'_>,
    default_from: &Mailbox,
    domain: &str,
    options: &MessageOptions,
) -> Result<Message, InvalidField> {
    let p = EmailPayload::parse(row.payload)?;
    let to = parse_recipient(row.destination)?;
    let from = p.from.clone().unwrap_or_else(|| default_from.clone());
    // The envelope from the addresses in hand — the sender, then To, Cc and Bcc in that order,
    // as lettre would take it from the headers, but without parsing them back out of the
    // headers it has just written (that parse was half of what building a message cost,
    // measured in `herald-bench email_smtp`).
    // Each address once: the same one as `destination` and in `bcc` got RCPT TO twice in one
    // transaction.
    let mut recipients: Vec<lettre::Address> = Vec::new();
    for m in std::iter::once(&to).chain(p.to.iter().chain(&p.cc).chain(&p.bcc)) {
        // The domain compares without case, the local part as written (RFC 5321 §2.4).
        let same = |r: &lettre::Address| {
            r.user() == m.email.user() && r.domain().eq_ignore_ascii_case(m.email.domain())
        };
        if !recipients.iter().any(same) {
            recipients.push(m.email.clone());
        }
    }
    let envelope = Envelope::new(Some(from.email.clone()), recipients)
        .map_err(|e| InvalidField::new("payload", format!("cannot build the email: {e}")))?;
    // Each address header set once, whole: lettre's `to`, `cc` and `bcc` parse the header built
    // so far back out of its text to add one more.
    use lettre::message::{Mailboxes, header};
    let mut b = Message::builder()
        .envelope(envelope)
        .from(from)
        .mailbox(header::To::from(
            std::iter::once(to).chain(p.to).collect::<Mailboxes>(),
        ))
        .subject(p.subject.clone())
        .message_id(Some(message_id(row.event_id, domain)));
    if !p.cc.is_empty() {
        b = b.mailbox(header::Cc::from(p.cc.into_iter().collect::<Mailboxes>()));
    }
    if !p.bcc.is_empty() {
        b = b.mailbox(header::Bcc::from(p.bcc.into_iter().collect::<Mailboxes>()));
    }
    if let Some(r) = p.reply_to {
        b = b.reply_to(r);
    }
    let (text, html) = (p.text.map(crlf_only), p.html.map(crlf_only));
    let body = match (text, html) {
        (Some(t), Some(h)) => Body::Multi(MultiPart::alternative_plain_html(t, h)),
        (Some(t), None) => Body::Single(SinglePart::plain(t)),
        (None, Some(h)) => Body::Single(SinglePart::html(h)),
        (None, None) => {
            return Err(InvalidField::new(
                "payload.text",
                "text or html is required",
            ));
        }
    };
    let built = if p.attachments.is_empty() {
        match body {
            Body::Multi(m) => b.multipart(m),
            Body::Single(s) => b.singlepart(s),
        }
    } else {
        let mut mixed = match body {
            Body::Multi(m) => MultiPart::mixed().multipart(m),
            Body::Single(s) => MultiPart::mixed().singlepart(s),
        };
        for a in p.attachments {
            // Base64 whatever the bytes: lettre writes ASCII content with short lines as 7bit,
            // as given, and a bare CR or LF in it would reach the wire (see `bare_line_end`).
            let content = lettre::message::Body::new_with_encoding(
                a.content,
                lettre::message::header::ContentTransferEncoding::Base64,
            )
            .map_err(|_| InvalidField::new("payload.attachments", "cannot be encoded"))?;
            mixed = mixed.singlepart(
                lettre::message::Attachment::new(a.filename).body(content, a.content_type),
            );
        }
        b.multipart(mixed)
    };
    let mut message =
        built.map_err(|e| InvalidField::new("payload", format!("cannot build the email: {e}")))?;
    let custom = match options.relay {
        Some(provider) => relay::correlate(provider, row.event_id, p.headers),
        None => p.headers,
    };
    let headers = message.headers_mut();
    let mut insert = |name: &str, value: String| {
        if let Ok(name) = HeaderName::new_from_ascii(name.to_owned()) {
            headers.insert_raw(HeaderValue::new(name, value));
        }
    };
    for (k, v) in custom {
        insert(&k, v);
    }
    if let Some(l) = &p.list_unsubscribe {
        insert("List-Unsubscribe", l.header_value());
        if l.one_click {
            insert(
                "List-Unsubscribe-Post",
                list_unsubscribe::ONE_CLICK.to_owned(),
            );
        }
    }
    insert("X-Herald-Event-Id", row.event_id.to_owned());
    if let Some(signer) = &options.dkim {
        signer.sign(&mut message);
    }
    Ok(message)
}

/// `text` with every line ending CRLF: a lone CR becomes a line break (lettre makes each lone LF
/// a CRLF, but leaves a lone CR as it is, and a CR or LF that is not part of a CRLF must never
/// reach an SMTP server: see [`bare_line_end`]).
fn crlf_only(text: String) -> String {
    if !text.contains('\r') {
        return text;
    }
    text.replace("\r\n", "\n").replace('\r', "\n")
}

/// Where `content` has a CR or an LF that is not part of a CRLF. RFC 5321 §2.3.8 forbids them,
/// and a relay that takes a bare one for a line end can be made to end the content early and run
/// what follows as commands of Herald's session ("SMTP smuggling", CVE-2023-51764): `<LF>.<CRLF>`
/// in an attachment. Herald's messages are built without any (text normalized, attachments in
/// base64); a message that has one anyway is not sent.
pub fn bare_line_end(content: &[u8]) -> Option<usize> {
    content.iter().enumerate().find_map(|(i, &b)| {
        let bare = match b {
            b'\r' => content.get(i + 1) != Some(&b'\n'),
            b'\n' => i == 0 || content[i - 1] != b'\r',
            _ => false,
        };
        bare.then_some(i)
    })
}

/// The message body before attachments are added around it.
enum Body {
    Single(SinglePart),
    Multi(MultiPart),
}

impl EmailChannel {
    /// Adds relay correlation (`smtp_provider`) and a DKIM signature (`dkim_*`) to every message.
    pub fn with_message_options(mut self, options: MessageOptions) -> Self {
        self.options = options;
        self
    }
}

/// Why the email channel cannot be built from its settings. The text never quotes `smtp_url`: it
/// may carry a password.
#[derive(Debug, thiserror::Error)]
pub enum EmailConfigError {
    /// Not a URL at all (the parser's cause), or not one of the accepted forms (no cause).
    #[error("smtp_url is not a valid smtp:// or smtps:// URL")]
    SmtpUrl(#[source] Option<url::ParseError>),
    /// A URL of the right kind with a part Herald does not take (named, the value never shown).
    #[error("smtp_url: {0}")]
    SmtpUrlPart(&'static str),
    #[error("smtp_url: the host is not valid for TLS")]
    TlsHost(#[source] lettre::transport::smtp::Error),
    #[error("mail_from must be an email address")]
    MailFrom(#[source] lettre::address::AddressError),
    /// AUTH credentials for a relay reached over a network without TLS.
    #[error("smtp_url: credentials would cross the network in clear")]
    CleartextCredentials,
}

/// Checks `smtp_url` as [`EmailChannel::new`] reads it (start-up validation). Credentials — in
/// the URL or, `config_credentials`, from the configuration — are refused unless TLS is certain
/// (`smtps://` or `?tls=required`) or the relay is on this host: plain `smtp://` and
/// `tls=opportunistic` (which a man in the middle can strip) would send them in clear.
pub fn check_smtp_url(url: &str, config_credentials: bool) -> Result<(), EmailConfigError> {
    super::install_crypto_provider();
    let relay = SmtpRelay::parse(url, None)?;
    let protected = matches!(relay.tls, Tls::Required(_) | Tls::Wrapper(_));
    let local = relay.host == "localhost"
        || relay
            .host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if (relay.credentials.is_some() || config_credentials) && !protected && !local {
        return Err(EmailConfigError::CleartextCredentials);
    }
    Ok(())
}

/// The default sender (`mail_from`): `herald@example.com` or `Name <herald@example.com>`.
pub fn parse_mail_from(from: &str) -> Result<Mailbox, EmailConfigError> {
    Mailbox::from_str(from)
        .map_err(EmailConfigError::MailFrom)
        .and_then(|m| {
            ascii_domain(m).ok_or(EmailConfigError::MailFrom(
                lettre::address::AddressError::InvalidDomain,
            ))
        })
}

/// Where email goes.
#[derive(Clone)]
pub enum EmailTransport {
    /// One `.eml` file per message, named after its Message-ID hash (a resend overwrites it).
    Directory(PathBuf),
    Smtp(Arc<SmtpPool>),
}

/// Sends email. Cheap to clone.
#[derive(Clone)]
pub struct EmailChannel {
    transport: EmailTransport,
    from: Mailbox,
    domain: Arc<str>,
    /// Relay correlation and DKIM ([`EmailChannel::with_message_options`]).
    options: MessageOptions,
    clock: Arc<dyn Clock>,
}

/// Bounds of the SMTP transport, and whom it trusts besides the webpki roots.
#[derive(Debug, Clone)]
pub struct SmtpLimits {
    /// One whole attempt, waiting for a pool slot and connecting included.
    pub timeout: Duration,
    /// Open connections at most, in use or parked ([`DEFAULT_POOL_SIZE`]).
    pub pool_size: usize,
    /// How long a parked connection stays open unused ([`DEFAULT_IDLE_TIMEOUT`]).
    pub idle_timeout: Duration,
    /// Pipeline the envelope when the relay offers PIPELINING (`smtp_pipelining`).
    pub pipelining: bool,
    /// With pipelining, send an `at_least_once` message's content by `BDAT n LAST` in the
    /// envelope's write when the relay offers CHUNKING (`smtp_chunking`; see [`transmit`]).
    pub chunking: bool,
    /// `smtp_noop_after_idle_ms`: a connection parked this long or longer is checked with a NOOP
    /// of its own before reuse; one parked less, by an RSET in its envelope's group
    /// ([`DEFAULT_NOOP_AFTER_IDLE`]).
    pub noop_after_idle: Duration,
    /// `smtp_ca_file`: CA certificates trusted in addition to the webpki roots.
    pub ca: Option<SmtpCa>,
    /// `smtp_username` + `smtp_password` from the configuration: AUTH credentials that win over
    /// any in the URL.
    pub credentials: Option<(Secret, Secret)>,
}

impl SmtpLimits {
    /// `timeout` and `pool_size` as given, every other bound at its default, pipelining and
    /// chunking on, no extra CA, no credentials.
    pub fn new(timeout: Duration, pool_size: usize) -> Self {
        Self {
            timeout,
            pool_size,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            pipelining: true,
            chunking: true,
            noop_after_idle: DEFAULT_NOOP_AFTER_IDLE,
            ca: None,
            credentials: None,
        }
    }
}

impl EmailChannel {
    /// `smtp_url`: `smtp://host:port` (plain), `smtp://…?tls=required`, `smtps://…`; `None`: the
    /// `.eml` directory. Needs no async runtime: connections are opened by the first sends.
    pub fn new(
        smtp_url: Option<&str>,
        limits: SmtpLimits,
        mail_dir: PathBuf,
        from: &str,
        domain: &str,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, EmailConfigError> {
        super::install_crypto_provider();
        let transport = match smtp_url {
            Some(url) => {
                let mut relay = SmtpRelay::parse(url, limits.ca.as_ref())?;
                if let Some((user, password)) = &limits.credentials {
                    relay.credentials = Some(Credentials::new(
                        user.expose().to_owned(),
                        password.expose().to_owned(),
                    ));
                    relay.secrets =
                        super::Secrets::new(&login_secrets(user.expose(), password.expose()));
                }
                EmailTransport::Smtp(Arc::new(SmtpPool::new(relay, &limits)))
            }
            None => EmailTransport::Directory(mail_dir),
        };
        let from = parse_mail_from(from)?;
        Ok(Self {
            transport,
            from,
            domain: domain.into(),
            options: MessageOptions::default(),
            clock,
        })
    }

    pub async fn send(&self, row: &Outgoing<'_>) -> SendReport {
        self.send_while(row, &|| true).await
    }

    /// As [`EmailChannel::send`], asking `still_clear` once a connection slot (or a parked
    /// connection) is had, just before a connection is made or used: a relay paused while the
    /// message waited for one (the fifth of a row of refused connections, answered meanwhile)
    /// is not connected to — the report says `held_by_pause` ([`kind::HELD`]), for the sender to
    /// put the message back. Before, every send waiting for one of the pool's slots connected
    /// all the same, after the pause had begun: 20 attempts for 20 mails to a relay that was
    /// down, with the default pool of 10.
    pub async fn send_while(
        &self,
        row: &Outgoing<'_>,
        still_clear: &(dyn Fn() -> bool + Sync),
    ) -> SendReport {
        let now = self.clock.now();
        // Timed from `now`, not from after the build (a DKIM signature takes a while): the
        // answer's time, which a pause runs from, is then never earlier than the answer.
        let started = std::time::Instant::now();
        // One that no header carries as it is would go into X-Herald-Event-Id so (lettre
        // passes most control characters; see `event_id_fits_a_header`). Other Unicode is
        // encoded (RFC 2047), as ever.
        if !super::event_id_fits_a_header(row.event_id) {
            return SendReport::refused(
                AttemptClass::Permanent,
                crate::channels::webhook::INVALID_EVENT_ID,
                now,
                "its event id holds a control character, or a space at an end, which an email \
                 header cannot carry as it is",
            );
        }
        let message = match build_message(row, &self.from, &self.domain, &self.options) {
            Ok(m) => m,
            Err(e) => {
                return SendReport::refused(
                    AttemptClass::Permanent,
                    "invalid_payload",
                    now,
                    e.to_string(),
                );
            }
        };
        let mut report = match &self.transport {
            EmailTransport::Directory(dir) => {
                write_eml(dir, row.event_id, &self.domain, &message.formatted(), now).await
            }
            EmailTransport::Smtp(pool) => {
                let content = message.formatted();
                if bare_line_end(&content).is_some() {
                    return SendReport::refused(
                        AttemptClass::Permanent,
                        kind::BARE_LINE_END,
                        now,
                        "the built message has a CR or LF outside a CRLF; not sent",
                    );
                }
                let mut reused = false;
                let sent = pool
                    .send_noting(
                        message.envelope(),
                        &content,
                        row.semantics,
                        still_clear,
                        &mut reused,
                    )
                    .await;
                let mut report = match sent {
                    Ok(accepted) => accepted.report(now, &pool.relay.secrets),
                    Err(failure) => failure.report(now, &pool.relay.secrets),
                };
                report.reused_connection = reused;
                report
            }
        };
        report.started_at = now;
        report.finished_at =
            now + chrono::Duration::from_std(started.elapsed()).unwrap_or_default();
        report
    }
}

/// The SMTP server as `smtp_url` names it (the same URL forms lettre's `from_url` accepts).
struct SmtpRelay {
    host: String,
    port: u16,
    tls: Tls,
    hello: ClientId,
    credentials: Option<Credentials>,
    /// The credentials as a relay's reply may echo them back (a 535 repeating the AUTH it
    /// got): hidden in every attempt's excerpt ([`login_secrets`]).
    secrets: super::Secrets,
}

/// What of a login a relay may repeat in its reply: the password, the user name (an account's
/// address, or an access key id: SES's SMTP user is one; an SMTP walk-through found it kept in
/// clear), and the AUTH PLAIN and LOGIN responses that carry them (base64). Shorter than 4
/// characters, either could be any word of a reply, and stays.
fn login_secrets(user: &str, password: &str) -> Vec<String> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let mut found = vec![
        password.to_owned(),
        b64(password),
        user.to_owned(),
        b64(user),
        b64(&format!("\0{user}\0{password}")),
        b64(&format!("{user}\0{user}\0{password}")),
    ];
    found.retain(|s| s.chars().count() >= 4);
    found
}

/// Shows where and how, never the credentials.
impl std::fmt::Debug for SmtpRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpRelay")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "[redacted]"),
            )
            .finish()
    }
}

impl SmtpRelay {
    /// `smtp://[user:pass@]host[:port][/ehlo-name][?tls=required|opportunistic]`,
    /// `smtps://…`; TLS trusts the webpki roots and `ca`. The error never quotes the URL: it may
    /// carry a password.
    fn parse(text: &str, ca: Option<&SmtpCa>) -> Result<Self, EmailConfigError> {
        let bad = || EmailConfigError::SmtpUrl(None);
        let url = url::Url::parse(text).map_err(|e| EmailConfigError::SmtpUrl(Some(e)))?;
        let host = match url.host().ok_or_else(bad)? {
            url::Host::Domain(d) => d.to_owned(),
            url::Host::Ipv4(ip) => ip.to_string(),
            url::Host::Ipv6(ip) => ip.to_string(),
        };
        // Every other part is refused rather than ignored: a mistyped `?TLS=required` read as
        // no TLS at all would send the mail in clear.
        let part = |why| Err(EmailConfigError::SmtpUrlPart(why));
        if url.query_pairs().any(|(k, _)| k != "tls") {
            return part("the only query parameter is tls (required or opportunistic)");
        }
        if url.query_pairs().count() > 1 {
            return part("tls is given more than once");
        }
        if url.fragment().is_some() {
            return part("a fragment (#…) is not part of a relay's address");
        }
        if url.port() == Some(0) {
            return part("port 0 is not a port to connect to");
        }
        if !url.username().is_empty() && url.password().is_none() {
            return part("a user name needs its password (user:password@host)");
        }
        if url.username().is_empty() && url.password().is_some() {
            return part("a password needs its user name (user:password@host)");
        }
        let tls_param = url
            .query_pairs()
            .find(|(k, _)| k == "tls")
            .map(|(_, v)| v.into_owned());
        // Verification is never turned off: a private CA is trusted by adding it (`smtp_ca_file`).
        let params = || {
            let mut b = TlsParameters::builder(host.clone());
            for cert in ca.map(|c| c.certs.as_slice()).unwrap_or_default() {
                b = b.add_root_certificate(cert.clone());
            }
            b.build().map_err(EmailConfigError::TlsHost)
        };
        let (default_port, tls) = match (url.scheme(), tls_param.as_deref()) {
            ("smtp", None) => (SMTP_PORT, Tls::None),
            ("smtp", Some("required")) => (SUBMISSION_PORT, Tls::Required(params()?)),
            ("smtp", Some("opportunistic")) => (SUBMISSION_PORT, Tls::Opportunistic(params()?)),
            ("smtps", None) => (SUBMISSIONS_PORT, Tls::Wrapper(params()?)),
            ("smtps", Some(_)) => {
                return part("tls does not apply to smtps:// (TLS from the first byte)");
            }
            _ => return Err(bad()),
        };
        // An empty path, or `/`; anything else must be a name (`//` is not one).
        let hello = match url.path().trim_matches('/') {
            "" if url.path().len() <= 1 => ClientId::default(),
            name if is_mail_domain(name) => ClientId::Domain(name.to_owned()),
            _ => return part("the path, the EHLO name, must be a host name"),
        };
        let (credentials, secrets) = match url.password() {
            Some(password) => {
                let user = percent_decode(url.username()).ok_or_else(bad)?;
                let password = percent_decode(password).ok_or_else(bad)?;
                let secrets = super::Secrets::new(&login_secrets(&user, &password));
                (Some(Credentials::new(user, password)), secrets)
            }
            None => (None, super::Secrets::default()),
        };
        Ok(Self {
            port: url.port().unwrap_or(default_port),
            host,
            tls,
            hello,
            credentials,
            secrets,
        })
    }
}

/// A name to say in EHLO or after the @ of a Message-ID: a host name (RFC 5321's `Domain`:
/// dot-separated labels of letters, digits and inner hyphens, 1–63 characters each), or an
/// address literal that is one (`[192.0.2.7]`, `[IPv6:2001:db8::1]`).
pub fn is_mail_domain(name: &str) -> bool {
    if let Some(inner) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        return match inner.get(..5) {
            Some(tag) if tag.eq_ignore_ascii_case("IPv6:") => {
                inner[5..].parse::<std::net::Ipv6Addr>().is_ok()
            }
            _ => inner.parse::<std::net::Ipv4Addr>().is_ok(),
        };
    }
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    name.len() <= 253 && name.split('.').all(label)
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The CA certificates of `smtp_ca_file`, trusted for the relay's certificate in addition to
/// the webpki roots (a relay with a private CA). Read and checked once, at start-up.
#[derive(Clone)]
pub struct SmtpCa {
    certs: Vec<lettre::transport::smtp::client::Certificate>,
}

impl std::fmt::Debug for SmtpCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SmtpCa({} certificates)", self.certs.len())
    }
}

/// Why `smtp_ca_file` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SmtpCaError {
    #[error("cannot read the file")]
    Read(#[source] std::io::Error),
    #[error("not a PEM file")]
    Pem(#[source] rustls::pki_types::pem::Error),
    #[error("no CERTIFICATE block in the file")]
    Empty,
    #[error("certificate {index} of the file is not a valid X.509 certificate")]
    Invalid {
        index: usize,
        #[source]
        source: rustls::Error,
    },
}

impl SmtpCa {
    /// Every `CERTIFICATE` block of a PEM file (other blocks are skipped); at least one, each a
    /// valid trust anchor.
    pub fn load(path: &std::path::Path) -> Result<Self, SmtpCaError> {
        let pem = std::fs::read(path).map_err(SmtpCaError::Read)?;
        Self::from_pem(&pem)
    }

    pub fn from_pem(pem: &[u8]) -> Result<Self, SmtpCaError> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let ders = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(SmtpCaError::Pem)?;
        if ders.is_empty() {
            return Err(SmtpCaError::Empty);
        }
        let mut store = rustls::RootCertStore::empty();
        let mut certs = Vec::with_capacity(ders.len());
        for (i, der) in ders.into_iter().enumerate() {
            store
                .add(der.clone())
                .map_err(|source| SmtpCaError::Invalid {
                    index: i + 1,
                    source,
                })?;
            // With rustls, a DER certificate is taken as it is: this cannot fail.
            if let Ok(cert) = lettre::transport::smtp::client::Certificate::from_der(der.to_vec()) {
                certs.push(cert);
            }
        }
        Ok(Self { certs })
    }
}

/// How far an SMTP attempt got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Opening a connection, up to this step: nothing of the message has left Herald.
    Connect(ConnectStep),
    /// MAIL FROM, RCPT TO, DATA up to the server's 354: only the envelope has left, and a server
    /// cannot accept a message whose content it has not received.
    Envelope,
    /// The content and its final dot are being written, or the final reply is awaited — with
    /// CHUNKING from the write that carries the envelope, `BDAT` and the content: the server may
    /// have accepted the message.
    Content,
}

/// The steps of opening a connection, each named in the error kind of a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectStep {
    /// DNS, TCP, TLS for `smtps://`, the server's greeting and its answers to EHLO (lettre reads
    /// the greeting and sends EHLO in one call, so a refusal of either is `smtp_greeting_refused`;
    /// without STARTTLS, the second EHLO, which asks for PIPELINING, counts here too).
    Hello,
    /// STARTTLS and the EHLOs after it (the one that asks for PIPELINING included).
    StartTls,
    /// AUTH, when `smtp_url` carries credentials.
    Auth,
}

/// Why an SMTP attempt did not end with a reply to the content.
#[derive(Debug)]
pub enum SmtpFailure {
    /// The attempt's deadline (the SMTP timeout) passed at this stage.
    Timeout(Stage),
    /// The deadline passed while every pool slot was taken: no connection was even opened.
    PoolTimeout,
    /// A slot (or a parked connection) was had, but the relay had been paused meanwhile (the
    /// sender's `still_clear` said so): no connection was made or used.
    Held,
    /// lettre reported an error at this stage: a negative reply, or a network, TLS or protocol
    /// failure.
    Smtp(Stage, lettre::transport::smtp::Error),
    /// The TCP connection could not be opened (refused, unreachable, the name did not resolve).
    Tcp(std::io::Error),
    /// The message needs an extension the server does not offer (8BITMIME, SMTPUTF8).
    Unsupported(&'static str),
    /// The server refused every recipient at RCPT TO (none was a 421, which ends the session
    /// and is [`SmtpFailure::Smtp`]): nothing was sent — or, with CHUNKING, the content was sent
    /// and refused with them (a 421 among them, when the replies stopped before BDAT's).
    RecipientsRefused(Vec<RefusedRecipient>),
}

/// A recipient the server refused at RCPT TO, as the attempt records it: masked
/// (`a***@e***.com`), with the reply code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedRecipient {
    pub masked: String,
    pub code: u16,
    /// Its place among the envelope's recipients (a next transaction names it again; the
    /// address itself is not kept here).
    pub index: usize,
    /// Refused with 452, then sent in a next transaction that failed once its content may
    /// have left ([`send_to_the_rest`]): it may have got the message.
    pub sent_again: bool,
}

/// How many refused recipients an attempt lists by name (masked); the rest are counted.
const REFUSED_LISTED: usize = 10;

/// `refused at RCPT TO: a***@e***.com 550, b***@e***.com 451`, at most [`REFUSED_LISTED`] named.
fn refused_list(refused: &[RefusedRecipient]) -> String {
    let mut out = String::from("refused at RCPT TO: ");
    for (i, r) in refused.iter().take(REFUSED_LISTED).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&format!("{} {}", r.masked, r.code));
    }
    if refused.len() > REFUSED_LISTED {
        out.push_str(&format!(" and {} more", refused.len() - REFUSED_LISTED));
    }
    let again: Vec<&str> = refused
        .iter()
        .filter(|r| r.sent_again)
        .map(|r| r.masked.as_str())
        .collect();
    if !again.is_empty() {
        let named = again[..again.len().min(REFUSED_LISTED)].join(", ");
        let more = match again.len().saturating_sub(REFUSED_LISTED) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        out.push_str(&format!(" ({SENT_AGAIN} {named}{more})"));
    }
    out
}

/// How [`refused_list`] names the recipients a next transaction may have reached.
pub const SENT_AGAIN: &str = "sent again in a next transaction whose end is unknown:";

/// What the server said when it took the message: its final reply, and the recipients it had
/// refused at RCPT TO (the message went to the others).
#[derive(Debug)]
pub struct Accepted {
    pub reply: Response,
    pub refused: Vec<RefusedRecipient>,
}

impl Accepted {
    /// `accepted` with the reply code; the queue id, when the reply names one, is the provider
    /// message id; refused recipients make the error kind `recipients_refused` and are listed
    /// (masked) in the excerpt. lettre takes a 3xx for a positive reply, but to the content only
    /// a 2xx says it was taken: a 3xx there (a server out of step, `354` again) is `ambiguous`,
    /// `unexpected_reply` — the content left, and nothing says what became of it. It was
    /// classified `permanent` (a dead letter) by its code.
    fn report(&self, now: chrono::DateTime<chrono::Utc>, secrets: &super::Secrets) -> SendReport {
        let code = smtp_code(&self.reply.code().to_string());
        let text = secrets.hide(&self.reply.message().collect::<Vec<_>>().join(" "));
        let class = match code {
            300..=399 => AttemptClass::Ambiguous,
            c => classify_smtp_code(c),
        };
        let mut r = SendReport::refused(class, "", now, text.as_str());
        r.error_kind = (class == AttemptClass::Ambiguous).then(|| "unexpected_reply".to_owned());
        r.status = Some(code);
        r.provider_message_id = queue_id(&text);
        if !self.refused.is_empty() {
            r.error_kind = Some(kind::RECIPIENTS_REFUSED.to_owned());
            let reply = r.excerpt.take().unwrap_or_default();
            r.excerpt = Some(format!("{reply}; {}", refused_list(&self.refused)));
        }
        r
    }
}

/// The queue id in a server's reply to the content, when it names one: Postfix (and the relays
/// that answer like it) `2.0.0 Ok: queued as ABC123`, Exim `OK id=1abcde-000123-XY`, Amazon
/// SES `Ok 0100018c…-000000` (the `mail.messageId` of its receipts). A reply without one
/// (`250 OK`), or with something that does not look like an id (letters, digits, `.`, `-`,
/// `_`; at most 128 characters), gives none.
pub fn queue_id(reply: &str) -> Option<String> {
    // ASCII lower-casing keeps byte offsets.
    let lower = reply.to_ascii_lowercase();
    let after = if let Some(i) = lower.find("queued as ") {
        i + "queued as ".len()
    } else if let Some(i) = lower
        .match_indices("id=")
        .map(|(i, _)| i)
        .find(|&i| i == 0 || lower.as_bytes()[i - 1].is_ascii_whitespace())
    {
        i + "id=".len()
    } else {
        return ses_message_id(reply);
    };
    let token = reply[after..].split_whitespace().next()?;
    let token = token.trim_matches(|c| matches!(c, '<' | '>' | '(' | ')' | '[' | ']' | ',' | ';'));
    let token = token.trim_end_matches('.');
    let plausible = !token.is_empty()
        && token.len() <= 128
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    plausible.then(|| token.to_owned())
}

/// SES's answer to the content: `Ok`, then its message id, groups of hex digits joined by `-`
/// (`0100018c9f0e5a3b-6c1d…-000000`). Only that shape: Gmail's `OK  1733490000 d1-…gsmtp`
/// names a time and a trace, no id a receipt will quote.
fn ses_message_id(reply: &str) -> Option<String> {
    let mut words = reply.split_whitespace();
    let ok = words
        .by_ref()
        .find(|w| !w.starts_with(|c: char| c.is_ascii_digit()))?;
    let id = words.next()?;
    let shaped = ok.eq_ignore_ascii_case("ok")
        && words.next().is_none()
        && (32..=128).contains(&id.len())
        && id.contains('-')
        && id
            .split('-')
            .all(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_hexdigit()));
    shaped.then(|| id.to_owned())
}

/// Whether the relay sent a line that is no SMTP reply (lettre's response error), rather than
/// ending the connection before a whole reply came (also a response error in lettre, whose
/// words for it are fixed: "incomplete response"); or a whole line that is not UTF-8
/// ([`is_undecodable`]).
fn is_garbled(e: &lettre::transport::smtp::Error) -> bool {
    (e.is_response() && !e.to_string().contains("incomplete response")) || is_undecodable(e)
}

/// A reply line that is not UTF-8 (`250 … f\xfcr …` from a relay writing Latin-1): lettre reads
/// replies as text, and the `read_line` of futures-util it uses fails it as an I/O error
/// (`InvalidData`, its fixed words "stream did not contain valid UTF-8") once the whole line is
/// in, its bytes consumed. The reply, and its code, cannot be
/// known: it is a reply that could not be read, not a lost connection; and no reply more is
/// coming for it (a walk-through saw the pipelined path wait out the timeout for one).
fn is_undecodable(e: &lettre::transport::smtp::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::InvalidData
                && io.to_string().contains("valid UTF-8");
        }
        source = s.source();
    }
    false
}

impl SmtpFailure {
    /// The class, error kind and reply code: before the envelope the stage decides (`not_sent`,
    /// whatever the reply); from MAIL FROM on a reply code decides, else the stage.
    pub fn classify(&self) -> (AttemptClass, &'static str, Option<u16>) {
        match self {
            SmtpFailure::Unsupported(_) => (AttemptClass::Permanent, "unsupported_by_server", None),
            // Any 4xx may pass (that recipient may be accepted later): transient, with the first
            // 4xx; all 5xx: permanent, with the first.
            SmtpFailure::RecipientsRefused(refused) => {
                let code = refused
                    .iter()
                    .map(|r| r.code)
                    .find(|c| (400..500).contains(&as_rcpt_reply(*c)))
                    .or_else(|| refused.first().map(|r| r.code))
                    .unwrap_or(550);
                (
                    classify_smtp_code(as_rcpt_reply(code)),
                    kind::RECIPIENTS_REFUSED,
                    Some(code),
                )
            }
            SmtpFailure::PoolTimeout => (AttemptClass::NotSent, kind::POOL_TIMEOUT, None),
            SmtpFailure::Held => (AttemptClass::NotSent, kind::HELD, None),
            SmtpFailure::Tcp(_) => (AttemptClass::NotSent, "connect", None),
            SmtpFailure::Timeout(Stage::Connect(_)) => {
                (AttemptClass::NotSent, "connect_timeout", None)
            }
            SmtpFailure::Smtp(Stage::Connect(step), e) => {
                let code = reply_code(e);
                let kind = match (step, code) {
                    (ConnectStep::Hello, Some(_)) => kind::GREETING_REFUSED,
                    (ConnectStep::StartTls, Some(_)) => kind::STARTTLS_REFUSED,
                    (ConnectStep::Auth, Some(_)) => kind::AUTH_REFUSED,
                    _ if e.is_timeout() => "connect_timeout",
                    _ if is_tls_failure(e) => kind::TLS,
                    (ConnectStep::Hello, None) => "connect",
                    // E.g. the server does not offer STARTTLS although `tls=required`.
                    (ConnectStep::StartTls, None) => kind::TLS,
                    // E.g. no authentication mechanism in common.
                    (ConnectStep::Auth, None) => kind::AUTH,
                };
                (AttemptClass::NotSent, kind, code)
            }
            // "530 authentication required" (or "must issue STARTTLS first") in the envelope: a
            // configuration fault on our side, not this message's — never sent, not dead.
            SmtpFailure::Smtp(Stage::Envelope, e) if reply_code(e) == Some(530) => {
                (AttemptClass::NotSent, kind::AUTH_REQUIRED, Some(530))
            }
            SmtpFailure::Smtp(_, e) if e.status().is_some() => {
                let code = reply_code(e).unwrap_or(0);
                (classify_smtp_code(code), "smtp_reply", Some(code))
            }
            SmtpFailure::Timeout(Stage::Envelope) => {
                (AttemptClass::NotSent, "timeout_before_data", None)
            }
            // A line that is no SMTP reply (a code out of range, a multi-line reply whose code
            // changes, plain text): the relay is broken, not the network.
            SmtpFailure::Smtp(Stage::Envelope, e) if is_garbled(e) => (
                AttemptClass::NotSent,
                kind::UNPARSABLE_REPLY_BEFORE_DATA,
                None,
            ),
            SmtpFailure::Smtp(Stage::Envelope, _) => {
                (AttemptClass::NotSent, "connection_lost_before_data", None)
            }
            SmtpFailure::Timeout(Stage::Content) => (AttemptClass::Ambiguous, "timeout", None),
            SmtpFailure::Smtp(Stage::Content, e) if is_garbled(e) => {
                (AttemptClass::Ambiguous, kind::UNPARSABLE_REPLY, None)
            }
            SmtpFailure::Smtp(Stage::Content, _) => {
                (AttemptClass::Ambiguous, "connection_lost", None)
            }
        }
    }

    /// `secrets`: the relay's credentials as a reply may echo them ([`login_secrets`]),
    /// hidden in the excerpt.
    fn report(&self, now: chrono::DateTime<chrono::Utc>, secrets: &super::Secrets) -> SendReport {
        let (class, kind, status) = self.classify();
        let detail = match self {
            SmtpFailure::Timeout(stage) => format!("no answer within the SMTP timeout ({stage:?})"),
            SmtpFailure::PoolTimeout => {
                "no SMTP connection slot free within the SMTP timeout".to_owned()
            }
            SmtpFailure::Held => "the relay paused while it waited for a connection".to_owned(),
            SmtpFailure::Smtp(_, e) => e.to_string(),
            SmtpFailure::Tcp(e) => format!("connection failed: {e}"),
            SmtpFailure::Unsupported(what) => (*what).to_owned(),
            SmtpFailure::RecipientsRefused(_) => String::new(),
        };
        let mut r = SendReport::refused(class, kind, now, secrets.hide(&detail));
        r.status = status;
        if let SmtpFailure::RecipientsRefused(refused) = self {
            // Masked addresses, kept out of the redaction (which would hide them entirely).
            r.excerpt = Some(format!("every recipient {}", refused_list(refused)));
        }
        r
    }
}

/// How long a parked connection stays open unused, unless `smtp_idle_timeout_seconds` says
/// otherwise (lettre's pool default).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Open connections to the relay at most, unless `smtp_pool_size` says otherwise (lettre's pool
/// default).
pub const DEFAULT_POOL_SIZE: usize = 10;
/// How long a connection may have been parked and still be checked by the RSET at the head of its
/// pipelined envelope, unless `smtp_noop_after_idle_ms` says otherwise; one parked longer gets a
/// NOOP of its own first, bounded by [`reuse_check_bound`] (see [`transmit`]).
pub const DEFAULT_NOOP_AFTER_IDLE: Duration = Duration::from_secs(1);
/// Bound on the polite QUIT when a connection is retired.
const QUIT_WITHIN: Duration = Duration::from_secs(5);
/// Longest NOOP check of a parked connection; shorter with a short SMTP timeout (a quarter of
/// it), so a connection that went silent while parked leaves most of the attempt to a new one.
const REUSE_CHECK_MAX: Duration = Duration::from_secs(2);

fn reuse_check_bound(timeout: Duration) -> Duration {
    (timeout / 4).min(REUSE_CHECK_MAX)
}

/// An open connection and the pool slot it occupies: the slot is free again only once the
/// connection is gone (dropped, or retired after its QUIT).
struct Pooled {
    conn: AsyncSmtpConnection,
    /// What Herald will use of what the server offered in its EHLO reply ([`offers`]).
    uses: Uses,
    /// The connection's own TCP socket, a second handle on it, to see whether the server ended
    /// the session while the connection was parked ([`Pooled::ended_while_parked`]). `None` for
    /// `smtps://`, whose socket lettre opens itself.
    watch: Option<std::net::TcpStream>,
    _slot: OwnedSemaphorePermit,
}

/// The extensions a connection uses: offered by the server and allowed by the configuration.
#[derive(Debug, Clone, Copy, Default)]
struct Uses {
    /// PIPELINING (RFC 2920), `smtp_pipelining`.
    pipelining: bool,
    /// CHUNKING (RFC 3030) with pipelining, `smtp_chunking`.
    chunking: bool,
}

impl Pooled {
    /// Whether the server ended the session while the connection was parked: it closed it, or
    /// wrote something (a `421` before closing). An SMTP server says nothing unasked, so anything
    /// to read between two messages, the end of the stream included, means the session is over.
    /// A look at the socket (a non-blocking `MSG_PEEK`), nothing on the wire.
    fn ended_while_parked(&self) -> bool {
        let Some(socket) = &self.watch else {
            return false;
        };
        !matches!(socket.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

/// Pooled SMTP connections to one relay: at most `pool_size` open at once, in use or parked
/// (an attempt waits for a slot within its own deadline; running out while waiting is
/// `not_sent`, `pool_timeout`). Opened on demand, parked after a successful send, dropped
/// unwritten when the server ended its session while it was parked (a look at the socket,
/// [`Pooled::ended_while_parked`]), checked on reuse ([`transmit`]: after a short rest an RSET
/// at the head of the pipelined envelope, else a NOOP of its own, bounded; one that fails, or
/// that stays silent past the NOOP's bound, is closed and replaced within the same attempt, while
/// one that stays silent after its RSET costs the attempt), closed after a failure, and retired
/// (QUIT) once it has been parked for `idle_timeout` — by a background reaper, so an idle relay
/// sees its sessions end without waiting for the next send.
pub struct SmtpPool {
    relay: SmtpRelay,
    timeout: Duration,
    idle_timeout: Duration,
    /// `smtp_pipelining`: pipeline when the relay offers it.
    pipelining: bool,
    /// `smtp_chunking`: with pipelining, BDAT when the relay offers CHUNKING.
    chunking: bool,
    /// Bound on the NOOP check of a parked connection ([`reuse_check_bound`]).
    reuse_check: Duration,
    /// Parked this long or longer: a NOOP check, not an RSET in the group.
    noop_after_idle: Duration,
    /// One permit per open connection.
    slots: Arc<Semaphore>,
    idle: Arc<Mutex<Idle>>,
    /// Signalled when a connection is parked, for attempts waiting for a slot.
    parked: Notify,
}

impl std::fmt::Debug for SmtpPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpPool")
            .field("relay", &self.relay)
            .field("timeout", &self.timeout)
            .field("idle_timeout", &self.idle_timeout)
            .finish_non_exhaustive()
    }
}

/// The parked connections, each with the time it was parked, and whether a reaper is watching
/// them (changed only under the lock, so a connection is never parked unwatched).
#[derive(Default)]
struct Idle {
    parked: Vec<(Pooled, Instant)>,
    reaper: bool,
}

impl Idle {
    /// Retires the connections parked for `max_idle` or longer.
    fn retire_stale(&mut self, max_idle: Duration) {
        let (fresh, stale): (Vec<_>, Vec<_>) = self
            .parked
            .drain(..)
            .partition(|(_, since)| since.elapsed() < max_idle);
        self.parked = fresh;
        for (p, _) in stale {
            retire(p);
        }
    }
}

fn lock(idle: &Mutex<Idle>) -> std::sync::MutexGuard<'_, Idle> {
    idle.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sleeps until the oldest parked connection has been idle for `max_idle`, retires what is stale,
/// and again, until nothing is parked (or the pool is gone).
async fn reap(idle: std::sync::Weak<Mutex<Idle>>, max_idle: Duration) {
    loop {
        let next = {
            let Some(idle) = idle.upgrade() else { return };
            let mut idle = lock(&idle);
            idle.retire_stale(max_idle);
            match idle.parked.iter().map(|(_, since)| *since + max_idle).min() {
                Some(at) => at,
                None => {
                    idle.reaper = false;
                    return;
                }
            }
        };
        tokio::time::sleep_until(tokio::time::Instant::from_std(next)).await;
    }
}

impl SmtpPool {
    fn new(relay: SmtpRelay, limits: &SmtpLimits) -> Self {
        Self {
            relay,
            timeout: limits.timeout,
            idle_timeout: limits.idle_timeout,
            pipelining: limits.pipelining,
            chunking: limits.chunking,
            reuse_check: reuse_check_bound(limits.timeout),
            noop_after_idle: limits.noop_after_idle,
            slots: Arc::new(Semaphore::new(limits.pool_size.max(1))),
            idle: Arc::default(),
            parked: Notify::new(),
        }
    }

    /// One attempt, bounded by the SMTP timeout as a whole, waiting for a slot included. A
    /// reused connection that fails its check ([`transmit`]) is closed and the next parked one,
    /// or a new one, carries the same attempt.
    ///
    /// `semantics`: only an `at_least_once` message is sent with CHUNKING, whose content leaves
    /// with the envelope ([`transmit`]); and on a reused connection only when its socket can be
    /// watched, so that one the server closed while parked is never written to.
    pub async fn send(
        &self,
        envelope: &Envelope,
        content: &[u8],
        semantics: Semantics,
        still_clear: &(dyn Fn() -> bool + Sync),
    ) -> Result<Accepted, SmtpFailure> {
        self.send_noting(envelope, content, semantics, still_clear, &mut false)
            .await
    }

    /// As [`SmtpPool::send`], setting `reused` when the dialogue that ended the attempt ran on a
    /// parked connection, opened before this send: its answer says nothing of whether the relay
    /// takes new sessions ([`SendReport::reused_connection`]).
    pub async fn send_noting(
        &self,
        envelope: &Envelope,
        content: &[u8],
        semantics: Semantics,
        still_clear: &(dyn Fn() -> bool + Sync),
        reused: &mut bool,
    ) -> Result<Accepted, SmtpFailure> {
        let started = tokio::time::Instant::now();
        let deadline = started + self.timeout;
        // A dialogue never begins with less than half the timeout left: waiting for a
        // connection longer is `pool_timeout`, put back unsent. (Begun with milliseconds left,
        // its content went out and the timeout made it ambiguous: sent again, a duplicate.)
        let wait_until = started + self.timeout / 2;
        loop {
            *reused = false;
            let (mut pooled, reuse) = self.checkout(wait_until, deadline, still_clear).await?;
            *reused = reuse.is_some();
            let uses = Uses {
                chunking: pooled.uses.chunking
                    && semantics == Semantics::AtLeastOnce
                    && (reuse.is_none() || pooled.watch.is_some()),
                ..pooled.uses
            };
            let mut stage = Stage::Envelope;
            let result = tokio::time::timeout_at(
                deadline,
                transmit(
                    &mut pooled.conn,
                    uses,
                    reuse,
                    envelope,
                    content,
                    &mut stage,
                    &mut Vec::new(),
                ),
            )
            .await;
            let failure = match result {
                // Only after a 2xx to the content is the session where a next message can
                // begin: after a 3xx (the server still reading content, say) it is dropped
                // unparked, as after any failure, or the next message's commands would be
                // read as this one's content.
                Ok(Ok(mut resp)) if resp.reply.code().severity == Severity::PositiveCompletion => {
                    let until = Until {
                        start: wait_until,
                        end: deadline,
                    };
                    if send_to_the_rest(&mut pooled.conn, uses, envelope, content, until, &mut resp)
                        .await
                    {
                        self.checkin(pooled);
                    }
                    return Ok(resp);
                }
                Ok(Ok(resp)) => {
                    drop(pooled);
                    return Ok(resp);
                }
                // Closed by the server while parked, refused (a 421) or silent: closed here (its
                // slot with it). Nothing of this message can have been accepted on it. With time
                // left, the next parked connection or a new one carries the attempt.
                Ok(Err(Cut::Stale(check))) if tokio::time::Instant::now() < deadline => {
                    info!(check, "a reused SMTP connection failed its check; replaced");
                    continue;
                }
                Ok(Err(Cut::Stale(_))) => SmtpFailure::Timeout(Stage::Envelope),
                Ok(Err(Cut::Failed(e))) => e,
                Err(_) => SmtpFailure::Timeout(stage),
            };
            // A failed dialogue is closed without QUIT: mid-content, a QUIT would be read as more
            // of the message; after a 421 the server is closing the channel anyway.
            drop(pooled);
            return Err(failure);
        }
    }

    /// A parked connection, else a new one in a free slot, else — waiting until `wait_until` —
    /// whichever of the two comes first (a new one connects by the `deadline`). A parked
    /// connection comes with how [`transmit`] is to check it; a new one needs no check.
    async fn checkout(
        &self,
        wait_until: tokio::time::Instant,
        deadline: tokio::time::Instant,
        still_clear: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Pooled, Option<Reuse>), SmtpFailure> {
        loop {
            // Registered before looking, so a connection parked after the look wakes this wait.
            let parked = self.parked.notified();
            tokio::pin!(parked);
            parked.as_mut().enable();
            if let Some((p, since)) = self.take_idle() {
                if p.ended_while_parked() {
                    info!("a parked SMTP connection was ended by the server; dropped");
                    continue;
                }
                if !still_clear() {
                    // Parked again as it was, for the next message the pause lets through.
                    self.park(p, since);
                    return Err(SmtpFailure::Held);
                }
                let reuse = Reuse {
                    in_group: since.elapsed() < self.noop_after_idle,
                    noop_until: deadline.min(tokio::time::Instant::now() + self.reuse_check),
                };
                return Ok((p, Some(reuse)));
            }
            let slot = tokio::select! {
                // A connection parked meanwhile is reused rather than a slot filled with a new one.
                biased;
                () = &mut parked => continue,
                slot = self.slots.clone().acquire_owned() => slot,
                () = tokio::time::sleep_until(wait_until) => return Err(SmtpFailure::PoolTimeout),
            };
            // The semaphore is never closed.
            let Ok(slot) = slot else {
                return Err(SmtpFailure::PoolTimeout);
            };
            if !still_clear() {
                return Err(SmtpFailure::Held);
            }
            let mut step = ConnectStep::Hello;
            return match tokio::time::timeout_at(deadline, self.connect(&mut step)).await {
                Ok(Ok((conn, uses, watch))) => Ok((
                    Pooled {
                        conn,
                        uses,
                        watch,
                        _slot: slot,
                    },
                    None,
                )),
                Ok(Err(ConnectError::Tcp(e))) => Err(SmtpFailure::Tcp(e)),
                Ok(Err(ConnectError::Smtp(e))) => Err(SmtpFailure::Smtp(Stage::Connect(step), e)),
                Err(_) => Err(SmtpFailure::Timeout(Stage::Connect(step))),
            };
        }
    }

    /// The most recently parked connection that has not been idle too long, with when it was
    /// parked; retires the others that have.
    fn take_idle(&self) -> Option<(Pooled, Instant)> {
        let mut idle = lock(&self.idle);
        idle.retire_stale(self.idle_timeout);
        idle.parked.pop()
    }

    /// TCP (and TLS for smtps), greeting, EHLO, STARTTLS when asked for, AUTH when configured;
    /// `step` says how far it got. Also whether the server offers PIPELINING and CHUNKING: lettre
    /// keeps only the EHLO keywords it knows, so Herald asks again (EHLO may be repeated at any
    /// time, RFC 5321 §4.1.4; one round trip per connection, not per message), after TLS and
    /// before AUTH. A server that refuses the repeated EHLO is used without either. And, but for
    /// `smtps://`, a second handle on the TCP socket ([`Pooled::ended_while_parked`]).
    async fn connect(
        &self,
        step: &mut ConnectStep,
    ) -> Result<(AsyncSmtpConnection, Uses, Option<std::net::TcpStream>), ConnectError> {
        *step = ConnectStep::Hello;
        let r = &self.relay;
        let mut watch = None;
        let mut conn = match &r.tls {
            Tls::Wrapper(p) => {
                AsyncSmtpConnection::connect_tokio1(
                    (r.host.as_str(), r.port),
                    Some(self.timeout),
                    &r.hello,
                    Some(p.clone()),
                    None,
                )
                .await?
            }
            _ => {
                // Our own TCP connection, with Nagle off: a small write right behind another
                // one, before any reply (lettre's `message`, still used for content that is not
                // UTF-8, writes the final `.` apart from the content), would wait with Nagle on
                // for the server's delayed ACK (~40 ms a message on Linux). (The caller bounds
                // the time.)
                let tcp = tokio::net::TcpStream::connect((r.host.as_str(), r.port))
                    .await
                    .map_err(ConnectError::Tcp)?;
                tcp.set_nodelay(true).map_err(ConnectError::Tcp)?;
                // A duplicate of the socket's descriptor, non-blocking as tokio made it; the
                // connection ends (FIN) once both handles are closed, which happens together
                // (both are the `Pooled`'s).
                let socket = tcp.into_std().map_err(ConnectError::Tcp)?;
                watch = Some(socket.try_clone().map_err(ConnectError::Tcp)?);
                let tcp = tokio::net::TcpStream::from_std(socket).map_err(ConnectError::Tcp)?;
                AsyncSmtpConnection::connect_with_transport(Box::new(tcp), &r.hello).await?
            }
        };
        match &r.tls {
            Tls::Opportunistic(p) if conn.can_starttls() => {
                *step = ConnectStep::StartTls;
                conn.starttls(p.clone(), &r.hello).await?
            }
            Tls::Required(p) => {
                *step = ConnectStep::StartTls;
                conn.starttls(p.clone(), &r.hello).await?
            }
            _ => {}
        }
        let uses = if self.pipelining {
            match conn.command(Ehlo::new(r.hello.clone())).await {
                Ok(reply) => {
                    let pipelining = offers(&reply, "PIPELINING");
                    Uses {
                        pipelining,
                        chunking: pipelining && self.chunking && offers(&reply, "CHUNKING"),
                    }
                }
                // Refused (Python's smtpd answers a second EHLO `503 Duplicate HELO/EHLO`): the
                // session is as it was after the first; it goes on without pipelining.
                Err(e) if reply_code(&e).is_some_and(|code| code != 421) => Uses::default(),
                Err(e) => return Err(e.into()),
            }
        } else {
            Uses::default()
        };
        if let Some(c) = &r.credentials {
            *step = ConnectStep::Auth;
            conn.auth(DEFAULT_MECHANISMS, c).await?;
        }
        Ok((conn, uses, watch))
    }

    /// Parks a healthy connection, with a reaper watching it (started when none is).
    fn checkin(&self, p: Pooled) {
        self.park(p, Instant::now());
    }

    /// Parks `p` as idle since `since` (a connection taken and put back unused keeps its time),
    /// with a reaper to retire it once idle too long.
    fn park(&self, p: Pooled, since: Instant) {
        if p.conn.has_broken() {
            return;
        }
        let mut idle = lock(&self.idle);
        idle.parked.push((p, since));
        if !idle.reaper
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            idle.reaper = true;
            rt.spawn(reap(Arc::downgrade(&self.idle), self.idle_timeout));
        }
        drop(idle);
        self.parked.notify_one();
    }
}

/// Why a connection could not be opened.
enum ConnectError {
    Tcp(std::io::Error),
    Smtp(lettre::transport::smtp::Error),
}

impl From<lettre::transport::smtp::Error> for ConnectError {
    fn from(e: lettre::transport::smtp::Error) -> Self {
        ConnectError::Smtp(e)
    }
}

/// A healthy connection no longer needed (idle too long): QUIT (bounded) and close, in the
/// background; its slot is free once it is closed.
fn retire(mut p: Pooled) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let _ = tokio::time::timeout(QUIT_WITHIN, p.conn.abort()).await;
            drop(p);
        });
    }
}

/// Whether an EHLO reply offers an extension (`PIPELINING`, `CHUNKING`): a keyword on a line
/// after the first (which names the server, RFC 5321 §4.1.1.1), case-insensitive.
fn offers(ehlo: &Response, keyword: &str) -> bool {
    ehlo.message().skip(1).any(|line| {
        line.split_whitespace()
            .next()
            .is_some_and(|k| k.eq_ignore_ascii_case(keyword))
    })
}

/// The longest pipelined group Herald writes before reading a reply. RFC 2920 §3.1: a client
/// that writes a whole group before reading must keep it within what the connection buffers
/// both ways, or client and server can each wait for the other to read (a server writes a reply
/// per command). About 60 recipients fit; an envelope with more goes one command at a time.
/// With CHUNKING this bounds the group's commands, not the chunk behind them: until it has read
/// the whole chunk the server writes only the commands' replies, which fit those buffers.
const PIPELINED_GROUP_MAX: usize = 4096;

/// The RSET at the head of a group that checks a reused connection ([`transmit`]).
const RSET: &str = "RSET\r\n";

/// Commands written as they are, in one write (a pipelined group ends with its last CRLF).
/// With `reset`, [`RSET`] goes first (the check of a reused connection), and after the group
/// its `chunk` (a `BDAT n LAST`'s content, else nothing), without a copy of either of its own:
/// lettre's `command` formats the whole write once.
struct Pipelined<'a> {
    reset: bool,
    group: &'a str,
    chunk: &'a str,
}

impl std::fmt::Display for Pipelined<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.reset {
            f.write_str(RSET)?;
        }
        f.write_str(self.group)?;
        f.write_str(self.chunk)
    }
}

/// How the replies to a chunked group end an attempt ([`chunked_end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkedEnd {
    /// BDAT's reply was positive (as DATA's final reply counts: lettre's `Ok`), after an
    /// accepted MAIL FROM and at least one accepted recipient: the server took the message.
    Accepted,
    /// The reply at this index (a negative one) proves the message was not taken.
    Refused(usize),
    /// Every recipient was refused: there is no one to take the message for.
    RecipientsRefused,
    /// The RSET that checked a reused connection was refused with a 421 and the server then
    /// ended the session, as a 421 announces: nothing after the RSET was taken.
    Stale,
    /// The replies stopped (a lost connection) before any of them proved the message was not
    /// taken: the server may have taken it.
    Unknown,
}

/// What the reply codes read for a chunked group decide: `codes` in order — RSET's when
/// `reset`, MAIL FROM's, one per recipient, BDAT's — stopping short where the connection was
/// lost. A pure function of the codes, so every way a server can answer is tested below.
///
/// The content left with the envelope, so only a reply can prove the message was not taken:
/// BDAT's own, a refused MAIL FROM (no transaction), every recipient refused, or a 421 after
/// which the server said no more (it ended the session as the 421 announced, before the BDAT).
/// A 421 followed by more replies proves nothing: that server did not close, and BDAT's reply
/// decides — where MAIL FROM was taken and some recipient was: a positive BDAT after a refused
/// MAIL FROM or with every recipient refused takes nothing. A lost connection with none of
/// those is [`ChunkedEnd::Unknown`].
fn chunked_end(codes: &[u16], reset: bool, recipients: usize) -> ChunkedEnd {
    // As lettre reads a reply: 2xx and 3xx are `Ok`, 4xx and 5xx an error.
    let positive = |c: u16| (200..400).contains(&c);
    let mail = usize::from(reset);
    let bdat = mail + recipients + 1;
    // RSET is answered 250, or 421 by a server going away; after anything else the replies may
    // be out of step with the commands: nothing can be read from them.
    if reset
        && codes
            .first()
            .is_some_and(|&c| !(200..300).contains(&c) && c != 421)
    {
        return ChunkedEnd::Unknown;
    }
    // A positive BDAT takes the message — but not after a refused MAIL FROM or with every
    // recipient refused: there is no transaction, or no one to deliver to (RFC 3030 has the
    // server answer 503 or 554; a relay that said 250 all the same was taken at its word, and
    // a 451 to every recipient was a mail lost as delivered: an email walk-through).
    let envelope_taken = codes.get(mail).is_some_and(|&c| positive(c))
        && codes
            .get(mail + 1..bdat)
            .is_some_and(|r| r.iter().any(|&c| positive(c)));
    match codes.get(bdat) {
        Some(&c) if positive(c) && envelope_taken => return ChunkedEnd::Accepted,
        _ => {}
    }
    if codes.get(mail).is_some_and(|&c| !positive(c)) {
        return ChunkedEnd::Refused(mail);
    }
    // Every reply read, BDAT's negative: a 421 refusing a recipient (the session ending there)
    // decides for the whole message, as it does with DATA.
    if let Some(i) = codes
        .get(mail + 1..bdat)
        .filter(|_| codes.len() > bdat)
        .and_then(|r| r.iter().position(|&c| c == 421))
    {
        return ChunkedEnd::Refused(mail + 1 + i);
    }
    let rcpts = codes.get(mail + 1..mail + 1 + recipients);
    if rcpts.is_some_and(|r| !r.iter().any(|&c| positive(c))) {
        return ChunkedEnd::RecipientsRefused;
    }
    if codes.len() > bdat {
        return ChunkedEnd::Refused(bdat);
    }
    match codes.last() {
        Some(421) if reset && codes.len() == 1 => ChunkedEnd::Stale,
        Some(421) => ChunkedEnd::Refused(codes.len() - 1),
        _ => ChunkedEnd::Unknown,
    }
}

/// Why [`transmit`] stopped short of the server's answer to the content.
enum Cut {
    /// A reused connection failed its check (a lost connection, a reply that is not a positive
    /// completion, or a NOOP unanswered by its time): closed by the server while parked, refused,
    /// or gone silent. Only the check and the envelope can have left on it, never the content, so
    /// the server cannot have accepted the message: another connection carries the same attempt.
    /// With CHUNKING the content did leave, and only a 421 answering the RSET after which the
    /// server ended the session counts ([`ChunkedEnd::Stale`]): it took nothing after the 421.
    /// With the check that failed: `rset` or `noop`.
    Stale(&'static str),
    Failed(SmtpFailure),
}

impl From<SmtpFailure> for Cut {
    fn from(f: SmtpFailure) -> Self {
        Cut::Failed(f)
    }
}

/// How [`transmit`] checks a reused connection.
#[derive(Debug, Clone, Copy)]
struct Reuse {
    /// Parked for less than `smtp_noop_after_idle_ms`: with the envelope pipelined, the check is
    /// an RSET at the head of its group, its answer awaited for as long as the attempt allows.
    in_group: bool,
    /// Otherwise the check is a NOOP of its own, failed if unanswered by this time.
    noop_until: tokio::time::Instant,
}

/// A positive completion (2xx): what the check of a reused connection must get.
fn completed(reply: &Result<Response, lettre::transport::smtp::Error>) -> bool {
    matches!(reply, Ok(r) if r.code().severity == Severity::PositiveCompletion)
}

/// MAIL FROM, RCPT TO, DATA, then the content; `stage` says how far it got. With
/// `uses.chunking` (see [`SmtpPool::send`] for when) and the envelope pipelined, the content goes
/// by `BDAT n LAST` in the envelope's write instead ([`transmit_chunked`]).
///
/// With `pipelining` (the server offered it, RFC 2920) MAIL FROM, every RCPT TO and DATA leave
/// in one write, up to [`PIPELINED_GROUP_MAX`] bytes, and their replies are read in order: two
/// round trips a message instead of three or more. Nothing of the content leaves before the
/// server's 354, so the envelope stage stays what it was: the server cannot have accepted the
/// message.
///
/// A reused connection (`reuse`) is checked first ([`Cut::Stale`] when it fails). After a short
/// rest, with the envelope pipelined, the check is an RSET at the head of the same write: RFC
/// 2920 §3.1 lets RSET stand anywhere in a group (NOOP, like DATA, only at its end), and between
/// two messages it resets nothing, so reuse costs no round trip of its own. Its answer is awaited
/// for as long as the attempt allows, not for the NOOP's short bound: Postfix and Exim hold the
/// replies to a pipelined group until they need more input (here after DATA), so RSET's 250
/// comes only once the relay has run its RCPT TO checks (DNS lists, policy services), which may
/// take seconds. A connection that was closed meanwhile answers at once (the end of the stream,
/// or a 421). After a longer rest — when a NAT or firewall may have dropped the connection
/// without a word — or with an envelope too long for one group, or without pipelining, the check
/// is a NOOP of its own, answered within its bound before MAIL FROM leaves.
///
/// Recipients: a refusal at RCPT TO (4xx or 5xx, but not 421) is recorded and the next recipient
/// tried; when at least one was accepted the message goes to those and counts as accepted, the
/// refused ones listed; when none was, nothing is sent ([`SmtpFailure::RecipientsRefused`]).
/// Pipelined, the DATA already left with the envelope and a server may have answered it 354
/// (RFC 2920 warns a client not to assume a refusal): its reply is not waited for, and the
/// caller closes the connection, which ends any DATA without a message. A 421 ends the session
/// at once, wherever it comes; so does any other failure (the caller closes the connection,
/// unread replies with it).
async fn transmit(
    conn: &mut AsyncSmtpConnection,
    uses: Uses,
    reuse: Option<Reuse>,
    envelope: &Envelope,
    content: &[u8],
    stage: &mut Stage,
    refused_seen: &mut Vec<usize>,
) -> Result<Accepted, Cut> {
    *stage = Stage::Envelope;
    let envelope_err = |e| SmtpFailure::Smtp(Stage::Envelope, e);
    let mut mail_options = Vec::new();
    // Non-ASCII addresses: the envelope's, and a header's (a `Reply-To`, say: lettre writes an
    // address's UTF-8 as it is, where names and subjects become RFC 2047 encoded words), which
    // RFC 6532 lets through only under SMTPUTF8, never under 8BITMIME alone.
    let head = content
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(content, |end| &content[..end]);
    let non_ascii = envelope
        .to()
        .iter()
        .chain(envelope.from())
        .any(|a| !AsRef::<str>::as_ref(a).is_ascii())
        || !head.is_ascii();
    if non_ascii {
        if !conn.server_info().supports_feature(Extension::SmtpUtfEight) {
            return Err(SmtpFailure::Unsupported(
                "non-ASCII addresses need SMTPUTF8, which the server does not offer",
            )
            .into());
        }
        mail_options.push(MailParameter::SmtpUtfEight);
    }
    if !content.is_ascii() {
        if !conn.server_info().supports_feature(Extension::EightBitMime) {
            return Err(SmtpFailure::Unsupported(
                "8-bit content needs 8BITMIME, which the server does not offer",
            )
            .into());
        }
        mail_options.push(MailParameter::Body(MailBodyParameter::EightBitMime));
    }
    let mail = Mail::new(envelope.from().cloned(), mail_options);
    // lettre's `command` takes text: content that is not UTF-8 (Herald's own messages always
    // are) goes by DATA, through lettre's `message`.
    let text = std::str::from_utf8(content).ok();
    let chunk = text.filter(|_| uses.chunking);
    let group = uses
        .pipelining
        .then(|| {
            let mut group = mail.to_string();
            for to in envelope.to() {
                group.push_str(&Rcpt::new(to.clone(), vec![]).to_string());
            }
            match chunk {
                Some(_) => group.push_str(&format!("BDAT {} LAST\r\n", content.len())),
                None => group.push_str(&Data.to_string()),
            }
            group
        })
        .filter(|g| g.len() <= PIPELINED_GROUP_MAX);
    let pipelining = group.is_some();
    let chunk = chunk.filter(|_| pipelining);
    // The RSET counts towards the group's size too.
    let in_group = reuse.is_some_and(|r| r.in_group)
        && group
            .as_ref()
            .is_some_and(|g| g.len() + RSET.len() <= PIPELINED_GROUP_MAX);
    if let Some(r) = reuse
        && !in_group
    {
        let reply = tokio::time::timeout_at(r.noop_until, conn.command(Noop)).await;
        if !reply.is_ok_and(|reply| completed(&reply)) {
            return Err(Cut::Stale("noop"));
        }
    }
    if let (Some(group), Some(chunk)) = (&group, chunk) {
        return transmit_chunked(conn, in_group, group, chunk, envelope, stage, refused_seen).await;
    }
    match group {
        // Writes the whole group (RSET first when it is the check), then reads the first reply:
        // RSET's, which must be a 250, then MAIL FROM's; or MAIL FROM's at once.
        Some(group) => {
            let first = conn
                .command(Pipelined {
                    reset: in_group,
                    group: &group,
                    chunk: "",
                })
                .await;
            if !in_group {
                first
            } else if completed(&first) {
                conn.read_response().await
            } else {
                return Err(Cut::Stale("rset"));
            }
        }
        None => conn.command(mail).await,
    }
    .map_err(envelope_err)?;
    let mut accepted = 0usize;
    let mut refused = Vec::new();
    for (index, to) in envelope.to().iter().enumerate() {
        let reply = if pipelining {
            conn.read_response().await
        } else {
            conn.command(Rcpt::new(to.clone(), vec![])).await
        };
        match reply {
            Ok(_) => accepted += 1,
            Err(e) => match reply_code(&e) {
                Some(code) if code != 421 => {
                    refused_seen.push(index);
                    refused.push(RefusedRecipient {
                        masked: crate::telemetry::mask_email(to.as_ref()),
                        code,
                        index,
                        sent_again: false,
                    });
                }
                // A 421 (the server closing the channel), a lost connection, a garbled reply.
                _ => return Err(envelope_err(e).into()),
            },
        }
    }
    if accepted == 0 {
        return Err(SmtpFailure::RecipientsRefused(refused).into());
    }
    if pipelining {
        conn.read_response().await
    } else {
        conn.command(Data).await
    }
    .map_err(envelope_err)?;
    *stage = Stage::Content;
    // lettre's `message` writes the content and its final dot in two writes; this is one write of
    // the same bytes. lettre's `command` takes text, so content that is not UTF-8 (Herald's own
    // messages always are) is left to `message`.
    let reply = match text {
        Some(text) => conn.command(DataTransparent(text)).await,
        None => conn.message(content).await,
    }
    .map_err(|e| SmtpFailure::Smtp(Stage::Content, e))?;
    Ok(Accepted { reply, refused })
}

/// What a server that takes a limited number of recipients per transaction answers to the rest:
/// RFC 5321 §4.5.3.1.10 has it answer 452 ("too many recipients", `4.5.3`) and the client send
/// those in a next transaction.
const MORE_RECIPIENTS_LATER: u16 = 452;

/// A reply code to RCPT TO as Herald takes it: 552 as [`MORE_RECIPIENTS_LATER`]. Older servers
/// answered 552 for too many recipients, and RFC 5321 §4.5.3.1.10 has the client take it as 452
/// (it was a permanent refusal, dead-lettering a message to a relay's 101st recipient: an SMTP
/// walk-through). The code kept and shown is the server's.
fn as_rcpt_reply(code: u16) -> u16 {
    if code == 552 {
        MORE_RECIPIENTS_LATER
    } else {
        code
    }
}

/// How long next transactions may take ([`send_to_the_rest`]): begun by `start` (half the
/// attempt's time left, as a first one: one begun with milliseconds left sends its content and
/// runs out of time before the reply, which says nothing of what became of it), ended by `end`.
#[derive(Debug, Clone, Copy)]
struct Until {
    start: tokio::time::Instant,
    end: tokio::time::Instant,
}

/// After `taken`, a transaction the server took: sends the recipients it refused with
/// [`MORE_RECIPIENTS_LATER`] again, in next transactions on the same connection, for as long as
/// each takes at least one of them and the attempt's time lasts (`until`). Those a next
/// transaction took leave `taken.refused`; those refused again keep their new code; a next
/// transaction that fails otherwise (no reply, a refused content, the time up) leaves the list as
/// it was — they were refused, and may have been sent since: the message was taken for the others
/// all the same. (A 452 for a full mailbox is tried once more that way and then stays refused.)
/// Returns whether the connection is fit to be parked.
async fn send_to_the_rest(
    conn: &mut AsyncSmtpConnection,
    uses: Uses,
    envelope: &Envelope,
    content: &[u8],
    until: Until,
    taken: &mut Accepted,
) -> bool {
    loop {
        if conn.has_broken() {
            return false;
        }
        // Places in `envelope` of the recipients a next transaction sends to, in its order.
        let rest: Vec<usize> = taken
            .refused
            .iter()
            .filter(|r| as_rcpt_reply(r.code) == MORE_RECIPIENTS_LATER)
            .map(|r| r.index)
            .collect();
        let to: Vec<_> = rest
            .iter()
            .filter_map(|&i| envelope.to().get(i).cloned())
            .collect();
        let Ok(next) = Envelope::new(envelope.from().cloned(), to) else {
            return true;
        };
        if tokio::time::Instant::now() > until.start {
            info!(
                recipients = rest.len(),
                "too little time left for a next transaction: recipients refused 452 left so"
            );
            return true;
        }
        let mut stage = Stage::Envelope;
        let mut refused_seen = Vec::new();
        let sent = tokio::time::timeout_at(
            until.end,
            transmit(
                conn,
                uses,
                None,
                &next,
                content,
                &mut stage,
                &mut refused_seen,
            ),
        )
        .await;
        let (again, fit) = match sent {
            Ok(Ok(more)) if more.reply.code().severity == Severity::PositiveCompletion => {
                (more.refused, true)
            }
            Ok(Err(Cut::Failed(SmtpFailure::RecipientsRefused(again)))) => (again, false),
            // Failed once its content may have left (a lost connection or the time up after
            // DATA or with BDAT, a 3xx to the content): those it was for — the recipients it
            // did not refuse at RCPT TO — may have it. A refusal of the content (a 4xx or 5xx
            // to it) says they do not.
            failed => {
                // Decided by the failure, not by how far `stage` got: with BDAT it says
                // `Content` from the write on, also when a reply to the envelope then proved
                // nothing was taken.
                let may_have_left = match &failed {
                    Err(_) => stage == Stage::Content,
                    Ok(Ok(_)) => true,
                    Ok(Err(Cut::Failed(SmtpFailure::Timeout(Stage::Content)))) => true,
                    Ok(Err(Cut::Failed(SmtpFailure::Smtp(Stage::Content, e)))) => {
                        reply_code(e).is_none()
                    }
                    _ => false,
                };
                if may_have_left {
                    let sent: Vec<usize> = (0..rest.len())
                        .filter(|i| !refused_seen.contains(i))
                        .map(|i| rest[i])
                        .collect();
                    for r in taken.refused.iter_mut().filter(|r| sent.contains(&r.index)) {
                        r.sent_again = true;
                    }
                }
                return false;
            }
        };
        info!(
            recipients = rest.len(),
            refused_again = again.len(),
            "recipients the relay took no more of in one transaction sent in the next"
        );
        // A place in `next` is `rest`'s at that place.
        let again: Vec<(usize, u16)> = again
            .iter()
            .filter_map(|r| Some((*rest.get(r.index)?, r.code)))
            .collect();
        taken.refused.retain_mut(|r| {
            if !rest.contains(&r.index) {
                return true;
            }
            match again.iter().find(|(i, _)| *i == r.index) {
                Some(&(_, code)) => {
                    r.code = code;
                    true
                }
                None => false,
            }
        });
        // None taken (a server that took the content of a transaction whose every recipient it
        // had refused): no next one.
        if !fit || again.len() >= rest.len() {
            return fit;
        }
    }
}

/// The pipelined envelope with `BDAT n LAST` at its end and the content right behind it, all
/// in one write (RFC 3030 with RFC 2920; RSET first when it checks a reused connection), then
/// every reply in order: one round trip a message. No dot-stuffing: BDAT counts bytes.
///
/// From that write on the server may take the message, so the stage is [`Stage::Content`] at
/// once: a timeout, or a connection lost before the replies prove otherwise, is ambiguous
/// ([`chunked_end`] says which replies prove it). Hence only for `at_least_once` messages, and
/// on a reused connection only when its socket was seen open just before
/// ([`Pooled::ended_while_parked`]), so that a connection closed while parked is replaced
/// without a word, not written to. A server that replies to a chunk it will not take still reads
/// all of it first (RFC 3030 §2), so a refusal leaves the session in step; the connection is
/// closed after any failure all the same.
async fn transmit_chunked(
    conn: &mut AsyncSmtpConnection,
    reset: bool,
    group: &str,
    chunk: &str,
    envelope: &Envelope,
    stage: &mut Stage,
    refused_seen: &mut Vec<usize>,
) -> Result<Accepted, Cut> {
    *stage = Stage::Content;
    let recipients = envelope.to().len();
    let expected = usize::from(reset) + recipients + 2;
    let mut replies = Vec::with_capacity(expected);
    let mut next = conn
        .command(Pipelined {
            reset,
            group,
            chunk,
        })
        .await;
    // An I/O error (not a reply that ended early or could not be parsed) may be the write's: a
    // relay that refused MAIL FROM or every recipient and closed stops reading the chunk, and
    // the write fails with its refusal waiting unread. The replies are read on, once.
    let mut drained = false;
    let lost = loop {
        match next {
            Err(e) if e.status().is_none() => {
                if drained || e.is_response() || is_undecodable(&e) {
                    break Some(e);
                }
                drained = true;
            }
            reply => replies.push(reply),
        }
        if replies.len() == expected {
            break None;
        }
        next = conn.read_response().await;
    };
    let code = |r: &Result<Response, lettre::transport::smtp::Error>| match r {
        Ok(reply) => smtp_code(&reply.code().to_string()),
        Err(e) => reply_code(e).unwrap_or(0),
    };
    let codes: Vec<u16> = replies.iter().map(code).collect();
    let mail = usize::from(reset);
    refused_seen.extend(
        codes
            .iter()
            .skip(mail + 1)
            .take(recipients)
            .enumerate()
            .filter(|(_, c)| !(200..400).contains(*c))
            .map(|(i, _)| i),
    );
    let refused = || -> Vec<RefusedRecipient> {
        envelope
            .to()
            .iter()
            .zip(codes.iter().skip(mail + 1))
            .enumerate()
            .filter(|(_, (_, c))| !(200..400).contains(*c))
            .map(|(index, (to, &code))| RefusedRecipient {
                masked: crate::telemetry::mask_email(to.as_ref()),
                code,
                index,
                sent_again: false,
            })
            .collect()
    };
    // A positive code is lettre's `Ok`, a negative one its error (`code` above), so each arm
    // finds the reply it names; were it otherwise, the end would be the ambiguous one below.
    match chunked_end(&codes, reset, recipients) {
        ChunkedEnd::Accepted => {
            let refused = refused();
            if codes.contains(&421) {
                // A server that announced the end of its session is not parked for the next
                // message, though it went on and took this one (QUIT, marking it broken).
                conn.abort().await;
            }
            if let Some(Ok(reply)) = replies.pop() {
                return Ok(Accepted { reply, refused });
            }
        }
        ChunkedEnd::RecipientsRefused => {
            return Err(SmtpFailure::RecipientsRefused(refused()).into());
        }
        ChunkedEnd::Stale => return Err(Cut::Stale("rset")),
        ChunkedEnd::Refused(i) => {
            // The envelope's refusals keep their stage: a 530 at MAIL FROM is still ours.
            let at = if i == expected - 1 {
                Stage::Content
            } else {
                Stage::Envelope
            };
            if let Err(e) = replies.swap_remove(i) {
                return Err(SmtpFailure::Smtp(at, e).into());
            }
        }
        ChunkedEnd::Unknown => {}
    }
    Err(match lost {
        Some(e) => SmtpFailure::Smtp(Stage::Content, e),
        None => SmtpFailure::Timeout(Stage::Content),
    }
    .into())
}

/// The content as it goes after DATA's 354 (RFC 5321 §4.5.2, transparency): a `.` that begins
/// a line gets a second `.` before it, and `<CRLF>.<CRLF>` ends it — whose first `<CRLF>` is the
/// last line's own end (§4.1.1.4): content that ends with one gets only `.<CRLF>`. lettre's
/// `message` writes `<CRLF>.<CRLF>` after it anyway, a blank line more than BDAT sends (a
/// walk-through saw a text end `\n\n\n` by DATA and `\n\n` by BDAT); otherwise the same bytes
/// (a line begins after `<CRLF>`, not after a bare `<CR>` or `<LF>`), formatted straight into
/// the one buffer lettre's `command` writes: no copy of the content of its own.
struct DataTransparent<'a>(&'a str);

impl std::fmt::Display for DataTransparent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.0;
        let (mut line_start, mut after_cr, mut from) = (true, false, 0);
        for (i, b) in text.bytes().enumerate() {
            if b == b'.' && line_start {
                // Up to and including this dot, then the dot once more (ASCII: a char boundary).
                f.write_str(&text[from..=i])?;
                from = i;
            }
            line_start = after_cr && b == b'\n';
            after_cr = b == b'\r';
        }
        f.write_str(&text[from..])?;
        if text.ends_with("\r\n") {
            f.write_str(".\r\n")
        } else {
            f.write_str("\r\n.\r\n")
        }
    }
}

fn smtp_code(code: &str) -> u16 {
    code.parse().unwrap_or(0)
}

/// Whether a connection failed in TLS: lettre reports a failed handshake (an untrusted or
/// mismatched certificate) as a connection error, with rustls' error inside its I/O error.
fn is_tls_failure(e: &lettre::transport::smtp::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(err) = source {
        let inner = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|i| i as &(dyn std::error::Error + 'static));
        if err.is::<rustls::Error>() || inner.is_some_and(|i| i.is::<rustls::Error>()) {
            return true;
        }
        source = err.source();
    }
    e.is_tls()
}

/// The reply code of a negative answer, if the error is one.
fn reply_code(e: &lettre::transport::smtp::Error) -> Option<u16> {
    e.status().map(|c| smtp_code(&c.to_string()))
}

/// The error kind of an email written to `mail_dir` (no `smtp_url`): accepted, with no reply
/// code, since no server was asked.
pub const WRITTEN_TO_FILE: &str = "written_to_file";
/// How the sender's reason and the admin page put [`WRITTEN_TO_FILE`].
pub const WRITTEN_TO_FILE_WORDS: &str = "written to the mail directory (no SMTP relay)";

/// The error kinds other parts decide by (the sender's throttle, the support note), named once.
pub mod kind {
    /// The built message has a CR or LF outside a CRLF; it is not sent.
    pub const BARE_LINE_END: &str = "bare_line_end";
    /// Recipients refused at RCPT TO (some, the message went to the others; or all).
    pub const RECIPIENTS_REFUSED: &str = "recipients_refused";
    /// The relay refused Herald's session: its greeting, STARTTLS, TLS, the login, or a `530`
    /// asking for one ([`SESSION_REFUSED`]).
    pub const GREETING_REFUSED: &str = "smtp_greeting_refused";
    pub const STARTTLS_REFUSED: &str = "smtp_starttls_refused";
    pub const AUTH_REFUSED: &str = "smtp_auth_refused";
    pub const AUTH_REQUIRED: &str = "smtp_auth_required";
    /// No authentication mechanism in common.
    pub const AUTH: &str = "smtp_auth";
    pub const TLS: &str = "tls";
    /// No connection slot free within the SMTP timeout (the sender holds the relay's messages).
    pub const POOL_TIMEOUT: &str = "pool_timeout";
    /// The relay paused while the message waited for a connection: put back unsent by the
    /// sender, never an attempt.
    pub const HELD: &str = "held_by_pause";
    /// The relay answered with a line that is no SMTP reply: after the content (`ambiguous`),
    /// or before it (`not_sent`).
    pub const UNPARSABLE_REPLY: &str = "unparsable_reply";
    pub const UNPARSABLE_REPLY_BEFORE_DATA: &str = "unparsable_reply_before_data";
    /// Every kind that says the relay refused the session itself.
    pub const SESSION_REFUSED: &[&str] = &[
        GREETING_REFUSED,
        STARTTLS_REFUSED,
        AUTH_REFUSED,
        AUTH_REQUIRED,
        AUTH,
        TLS,
    ];
}

/// Creates the mail directory (and its parents) when missing, each for its owner only (0700):
/// its files hold messages. A directory that exists keeps its mode.
pub(crate) fn create_mail_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

async fn write_eml(
    dir: &std::path::Path,
    event_id: &str,
    domain: &str,
    bytes: &[u8],
    now: chrono::DateTime<chrono::Utc>,
) -> SendReport {
    let id = message_id(event_id, domain);
    let stem = id
        .trim_start_matches('<')
        .split('@')
        .next()
        .unwrap_or("message")
        .to_owned();
    let path = dir.join(format!("{stem}.eml"));
    let tmp = dir.join(format!(".{stem}.eml.tmp"));
    let result = async {
        create_mail_dir(dir)?;
        // The owner's only (0600): the file holds the message, addresses and body.
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .await?;
        // A leftover of an earlier try keeps its old mode through `open`: set it.
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .await?;
        tokio::io::AsyncWriteExt::write_all(&mut file, bytes).await?;
        drop(file);
        tokio::fs::rename(&tmp, &path).await
    }
    .await;
    match result {
        Ok(()) => {
            let mut r = SendReport::refused(
                AttemptClass::Accepted,
                "",
                now,
                format!("written {stem}.eml"),
            );
            // No server answered: no reply code to show (a 250 read as a relay's acceptance).
            r.error_kind = Some(WRITTEN_TO_FILE.to_owned());
            r
        }
        // A full disk or a missing permission may heal; the message stays queued.
        Err(e) => SendReport::refused(
            AttemptClass::Transient,
            "mail_dir",
            now,
            e.kind().to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_internationalized_domain_is_written_in_its_ascii_form() {
        let m = parse_recipient("Ada <ada@Bücher.example>").unwrap();
        assert_eq!(
            (m.name.as_deref(), m.email.to_string().as_str()),
            (Some("Ada"), "ada@xn--bcher-kva.example")
        );
        // The domain only: a non-ASCII local part is left to SMTPUTF8.
        let m = parse_recipient("josé@straße.example").unwrap();
        assert_eq!(m.email.to_string(), "josé@xn--strae-oqa.example");
        let m = parse_recipient("ada@example.com").unwrap();
        assert_eq!(m.email.to_string(), "ada@example.com");
        assert_eq!(
            parse_mail_from("Desk <desk@bücher.example>")
                .unwrap()
                .email
                .to_string(),
            "desk@xn--bcher-kva.example"
        );
        let p = EmailPayload::parse(&json!({"subject": "s", "text": "t",
            "from": "a@bücher.example", "to": ["b@bücher.example"], "cc": ["c@bücher.example"],
            "bcc": ["d@bücher.example"], "reply_to": "e@bücher.example"}))
        .unwrap();
        let all: Vec<String> = [&p.from, &p.reply_to]
            .into_iter()
            .flatten()
            .chain(p.to.iter().chain(&p.cc).chain(&p.bcc))
            .map(|m| m.email.to_string())
            .collect();
        assert_eq!(all.len(), 5);
        assert!(
            all.iter().all(|a| a.ends_with("@xn--bcher-kva.example")),
            "{all:?}"
        );
        // A domain IDNA refuses is no address, though lettre takes it.
        for d in ["a\u{200D}b.example", "a\u{FFFD}b.example"] {
            assert!(parse_recipient(&format!("ada@{d}")).is_err(), "{d:?}");
            assert!(parse_mail_from(&format!("ada@{d}")).is_err(), "{d:?}");
        }
    }

    #[test]
    fn a_dot_that_begins_a_line_is_doubled_and_the_content_ends_with_a_lone_dot() {
        let cases: &[(&[u8], &[u8])] = &[
            (b"", b"\r\n.\r\n"),
            (b".", b"..\r\n.\r\n"),
            // The last line's CRLF is the first of the end's.
            (b"hello\r\n", b"hello\r\n.\r\n"),
            (b"\r\n", b"\r\n.\r\n"),
            (b"a\r\n\r\n", b"a\r\n\r\n.\r\n"),
            (b".hidden\r\nok", b"..hidden\r\nok\r\n.\r\n"),
            (b"a\r\n.\r\nb", b"a\r\n..\r\nb\r\n.\r\n"),
            (b"a\r\n..x", b"a\r\n...x\r\n.\r\n"),
            (b"a.b\r\nc.", b"a.b\r\nc.\r\n.\r\n"),
            // A line begins after CRLF only, as lettre has it: not after a bare CR or LF.
            (b"a\r.b", b"a\r.b\r\n.\r\n"),
            (b"a\n.b", b"a\n.b\r\n.\r\n"),
            (b"a\r\r\n.b", b"a\r\r\n..b\r\n.\r\n"),
            (b"a\r", b"a\r\r\n.\r\n"),
            (b"\r\n.x", b"\r\n..x\r\n.\r\n"),
            (b"\n\r\n.x", b"\n\r\n..x\r\n.\r\n"),
            (b"a\r\n\n.x", b"a\r\n\n.x\r\n.\r\n"),
            (
                "\u{e9}\r\n.\u{e9}".as_bytes(),
                "\u{e9}\r\n..\u{e9}\r\n.\r\n".as_bytes(),
            ),
        ];
        for (content, sent) in cases {
            let content = std::str::from_utf8(content).unwrap();
            assert_eq!(
                DataTransparent(content).to_string().as_bytes(),
                *sent,
                "{content:?}"
            );
        }
    }

    /// Every content of up to 6 characters from `.`, CR, LF and `a` (5,461 of them, and a few
    /// with a non-ASCII letter), sent both ways over one SMTP connection to a server on
    /// loopback that records what reaches it: lettre's `message`, then Herald's one write. The
    /// bytes must be the same.
    #[tokio::test]
    async fn the_content_in_one_write_is_what_lettre_sends_in_two() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            sock.write_all(b"220 recorder\r\n").await.unwrap();
            let (mut got, mut buf, mut greeted) = (Vec::new(), Vec::new(), false);
            let mut chunk = [0u8; 4096];
            loop {
                let n = sock.read(&mut chunk).await.unwrap();
                if n == 0 {
                    return got;
                }
                buf.extend_from_slice(&chunk[..n]);
                // The EHLO, then one content after another, each answered once it has ended (a
                // stuffed content holds no CRLF . CRLF but its end).
                if !greeted && buf.ends_with(b"\r\n") {
                    greeted = true;
                    buf.clear();
                    sock.write_all(b"250 recorder\r\n").await.unwrap();
                } else if greeted && buf.ends_with(b"\r\n.\r\n") {
                    got.push(std::mem::take(&mut buf));
                    sock.write_all(b"250 2.0.0 ok\r\n").await.unwrap();
                }
            }
        });
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        // As Herald's own connections (see `connect`): with Nagle on, each `message` would wait
        // about 40 ms for the recorder's delayed ACK before its final dot.
        tcp.set_nodelay(true).unwrap();
        let hello = lettre::transport::smtp::extension::ClientId::Domain("test".into());
        let mut conn = AsyncSmtpConnection::connect_with_transport(Box::new(tcp), &hello)
            .await
            .unwrap();
        let mut contents: Vec<String> = vec![String::new()];
        for _ in 0..6 {
            let longer: Vec<String> = contents
                .iter()
                .filter(|c| c.len() == contents.last().unwrap().len())
                .flat_map(|c| [".", "\r", "\n", "a"].map(|x| format!("{c}{x}")))
                .collect();
            contents.extend(longer);
        }
        contents.extend(["\u{e9}\r\n.\u{e9}", ".\u{e9}.\r\n..", "\u{e9}\r\r\n."].map(String::from));
        assert_eq!(contents.len(), 5_461 + 3);
        for c in &contents {
            conn.message(c.as_bytes()).await.unwrap();
            conn.command(DataTransparent(c)).await.unwrap();
        }
        drop(conn);
        let got = server.await.unwrap();
        assert_eq!(got.len(), 2 * contents.len());
        for (c, pair) in contents.iter().zip(got.chunks(2)) {
            // But for lettre's blank line after content that ends with CRLF.
            let lettre = if c.ends_with("\r\n") {
                [&pair[0][..pair[0].len() - 5], b".\r\n"].concat()
            } else {
                pair[0].clone()
            };
            assert_eq!(pair[1], lettre, "{c:?}");
        }
    }

    #[test]
    fn a_chunked_group_is_decided_by_the_replies_that_prove_something() {
        use ChunkedEnd::*;
        // (codes read, reset, recipients, end). Reused: RSET, MAIL, RCPT…, BDAT.
        let cases: &[(&[u16], bool, usize, ChunkedEnd)] = &[
            // Every reply read.
            (&[250, 250, 250, 250], true, 1, Accepted),
            (&[250, 250, 250], false, 1, Accepted),
            (&[250, 250, 550, 250, 250], true, 2, Accepted),
            (&[250, 250, 250, 451], true, 1, Refused(3)),
            (&[250, 250, 250, 554], false, 2, Refused(3)),
            (&[250, 550, 503, 503], true, 1, Refused(1)),
            (&[530, 503, 503], false, 1, Refused(0)),
            (&[250, 250, 550, 554], true, 1, RecipientsRefused),
            (&[250, 550, 451, 503], false, 2, RecipientsRefused),
            // A server that said 421 to the RSET and went on: BDAT's reply decides.
            (&[421, 250, 250, 250], true, 1, Accepted),
            (&[421, 250, 250, 451], true, 1, Refused(3)),
            // Lost before any reply: the content may have been taken.
            (&[], true, 1, Unknown),
            (&[], false, 1, Unknown),
            // Lost part-way, nothing proved.
            (&[250], true, 1, Unknown),
            (&[250, 250], true, 1, Unknown),
            (&[250, 250, 250], true, 1, Unknown),
            (&[250, 250, 550], true, 2, Unknown),
            (&[250, 250, 550], false, 2, Unknown),
            // Lost after a reply that proves it.
            (&[250, 550], true, 1, Refused(1)),
            (&[550], false, 3, Refused(0)),
            (&[250, 250, 550], true, 1, RecipientsRefused),
            (&[250, 550, 551], false, 2, RecipientsRefused),
            // A 421, then nothing: the server ended the session as it said.
            (&[421], true, 1, Stale),
            (&[421], false, 1, Refused(0)),
            (&[250, 421], true, 1, Refused(1)),
            (&[250, 250, 421], true, 2, Refused(2)),
            // A 421 followed by more replies proves nothing by itself.
            (&[421, 250], true, 1, Unknown),
            (&[250, 250, 421, 250], true, 2, Unknown),
            // Any other answer to the RSET: the replies may be out of step, nothing is proved.
            (&[502], true, 1, Unknown),
            (&[502, 250, 250, 250], true, 1, Unknown),
            (&[354, 250, 550], true, 1, Unknown),
            // A 421 refusing a recipient decides for the message, as with DATA (BDAT refused).
            (&[250, 250, 421, 250, 503], true, 2, Refused(2)),
            // (Lost before BDAT's reply with every recipient refused, a 421 among them.)
            (&[250, 250, 421, 503], true, 2, RecipientsRefused),
            (&[250, 421, 503], false, 1, Refused(1)),
            (&[250, 421, 250, 554], false, 2, Refused(1)),
            // …unless BDAT's reply says the message was taken all the same.
            (&[250, 421, 250, 250], false, 2, Accepted),
            // …but not after a refused MAIL FROM, or with every recipient refused: nothing to
            // take, whatever BDAT's reply says.
            (&[250, 250, 550, 250], true, 1, RecipientsRefused),
            (&[250, 451, 451, 250], false, 2, RecipientsRefused),
            (&[553, 503, 250], false, 1, Refused(0)),
            (&[250, 553, 250, 250], true, 1, Refused(1)),
        ];
        for (codes, reset, recipients, end) in cases {
            assert_eq!(
                chunked_end(codes, *reset, *recipients),
                *end,
                "{codes:?} reset={reset} recipients={recipients}"
            );
        }
    }

    #[test]
    fn extensions_are_ehlo_keywords_after_the_server_name() {
        use lettre::transport::smtp::response::{Category, Code, Detail, Severity};
        let ehlo = |lines: &[&str]| {
            let code = Code::new(
                Severity::PositiveCompletion,
                Category::MailSystem,
                Detail::Zero,
            );
            Response::new(code, lines.iter().map(|l| (*l).to_owned()).collect())
        };
        let postfix = ehlo(&[
            "mx.example.com Hello",
            "SIZE 10240000",
            "PIPELINING",
            "8BITMIME",
            "CHUNKING",
        ]);
        assert!(offers(&postfix, "PIPELINING"));
        assert!(offers(&postfix, "CHUNKING"));
        assert!(!offers(&postfix, "SMTPUTF8"));
        assert!(offers(&ehlo(&["mx", "pipelining"]), "PIPELINING"));
        for without in [
            &["mx.example.com", "8BITMIME", "XPIPELINING"][..],
            &["PIPELINING"],
            &["CHUNKING"],
            &["mx.example.com", "SIZE PIPELINING"],
        ] {
            assert!(!offers(&ehlo(without), "PIPELINING"), "{without:?}");
            assert!(!offers(&ehlo(without), "CHUNKING"), "{without:?}");
        }
    }

    #[test]
    fn header_values_that_cannot_fold_below_the_line_limit_are_refused() {
        let field = |v: String| parse_header("X-Tag", &json!(v), true).map_err(|e| e.field);
        assert!(field("a ".repeat(3000)).is_ok());
        assert!(field("a".repeat(900)).is_ok());
        assert_eq!(field("a".repeat(901)), Err("payload.headers.X-Tag".into()));
        assert_eq!(
            field("a ".repeat(4001)),
            Err("payload.headers.X-Tag".into())
        );
        // lettre folds at spaces only: a tab is no place to fold.
        assert_eq!(
            field(format!("{}\t", "a".repeat(899)).repeat(8)),
            Err("payload.headers.X-Tag".into())
        );
        // A relay JSON header is written spaced, and judged as written: one long string in it
        // cannot fold.
        let smtpapi = |v: String| parse_header("X-SMTPAPI", &json!(v), true);
        let (_, spaced) = smtpapi(r#"{"a":"b","c":{"d":1}}"#.into()).unwrap();
        assert_eq!(spaced, r#"{"a": "b", "c": {"d": 1}}"#);
        assert!(smtpapi(format!(r#"{{"k":"{}"}}"#, "a".repeat(1200))).is_err());
    }

    #[test]
    fn header_names_and_values_are_one_printable_line() {
        let field = |n: &str, v: &str| {
            parse_header(n, &json!(v), true)
                .map(|_| ())
                .map_err(|e| e.field)
        };
        assert_eq!(field("X-Tag", "a\tb"), Ok(()));
        // Up to lettre's 76 characters, and past them a refusal that says so.
        assert_eq!(field(&format!("X-{}", "N".repeat(74)), "v"), Ok(()));
        let long = parse_header(&format!("X-{}", "N".repeat(75)), &json!("v"), true).unwrap_err();
        assert!(
            long.message.ends_with("is at most 76 characters"),
            "{}",
            long.message
        );
        for name in [
            "X-A\r\nReply-To",
            "X-A\nB",
            "X-A\u{0}",
            "X-A\tB",
            "X-A B",
            "X-A:B",
            "X-Ä",
        ] {
            assert_eq!(field(name, "v"), Err("payload.headers".into()), "{name:?}");
        }
        for value in ["a\rb", "a\nb", "a\u{b}b", "a\u{85}b"] {
            assert_eq!(
                field("X-Tag", value),
                Err("payload.headers".into()),
                "{value:?}"
            );
        }
    }

    #[test]
    fn bare_line_ends_are_found() {
        assert_eq!(bare_line_end(b"a\r\nb\r\n"), None);
        assert_eq!(bare_line_end(b""), None);
        assert_eq!(bare_line_end(b"\nx"), Some(0));
        assert_eq!(bare_line_end(b"a\n.\r\n"), Some(1));
        assert_eq!(bare_line_end(b"a\r\n.\r"), Some(4));
        assert_eq!(bare_line_end(b"a\rb"), Some(1));
        assert_eq!(bare_line_end(b"a\r\r\n"), Some(1));
        assert_eq!(crlf_only("a\rb\r\nc\n".into()), "a\nb\nc\n");
        assert_eq!(crlf_only("plain\n".into()), "plain\n");
    }

    #[test]
    fn payload_validation_names_fields() {
        let field = |v| EmailPayload::parse(&v).unwrap_err().field;
        assert_eq!(field(json!({"text": "x"})), "payload.subject");
        assert_eq!(field(json!({"subject": "s"})), "payload.text");
        assert_eq!(
            field(json!({"subject": "s", "text": "t", "to": ["nope"]})),
            "payload.to"
        );
        assert_eq!(
            field(json!({"subject": "s", "text": "t", "from": "nope"})),
            "payload.from"
        );
        assert_eq!(
            field(json!({"subject": "s", "text": "t", "headers": {"Subject": "x"}})),
            "payload.headers"
        );
        assert_eq!(
            field(json!({"subject": "a\nb", "text": "t"})),
            "payload.subject"
        );
        for control in ["a\u{1b}b", "a\u{7f}b", "a\u{85}b"] {
            let at_enqueue = EmailPayload::parse_all(&json!({"subject": control, "text": "t"}));
            assert_eq!(
                at_enqueue.unwrap_err()[0].field,
                "payload.subject",
                "{control:?}"
            );
            // Taken before this check, or written by SQL: sent as it was then.
            assert!(EmailPayload::parse(&json!({"subject": control, "text": "t"})).is_ok());
        }
        assert!(EmailPayload::parse(&json!({"subject": "a\tb", "text": "t"})).is_ok());
        assert!(
            EmailPayload::parse(
                &json!({"subject": "s", "html": "<p>h</p>", "cc": ["a@b.example"]})
            )
            .is_ok()
        );
    }

    #[test]
    fn every_bad_field_of_a_payload_is_named_at_once() {
        let fields = |v: Value| {
            EmailPayload::parse_all(&v)
                .err()
                .unwrap_or_default()
                .into_iter()
                .map(|e| e.field)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            fields(
                json!({"subject": "", "from": "nope", "cc": ["x"], "bcc": "y",
                          "reply_to": "z", "headers": {"Subject": "s"}})
            ),
            [
                "payload.headers",
                "payload.subject",
                "payload.text",
                "payload.from",
                "payload.cc",
                "payload.bcc",
                "payload.reply_to"
            ]
        );
        // Custom headers: Herald's own, a name given twice, a bare prefix.
        for headers in [
            json!({"X-Herald-Event-Id": "spoof"}),
            json!({"x-herald-anything": "v"}),
            json!({"X-Tag": "a", "x-tag": "b"}),
            json!({"X-": "v"}),
            // A name whose 9th byte falls inside a character (it panicked on a byte slice).
            json!({"X-Heraldé": "v"}),
            json!({"ééééé": "v"}),
        ] {
            let p = json!({"subject": "s", "text": "t", "headers": headers});
            assert_eq!(fields(p), ["payload.headers"], "{headers}");
        }
        // At send time (a row accepted before these refusals, or written by SQL) the same
        // payloads are sent as they were then, not dead-lettered.
        let lenient = json!({"subject": "s", "text": "", "headers":
            {"X-Herald-Event-Id": "spoof", "X-": "v", "X-Tag": "a", "x-tag": "b"}});
        let p = EmailPayload::parse(&lenient).unwrap();
        assert_eq!(
            p.headers,
            [
                ("X-Tag".to_owned(), "a".to_owned()),
                ("x-tag".to_owned(), "b".to_owned())
            ]
        );
        // An empty body is none; an empty text beside an html is fine.
        assert_eq!(
            fields(json!({"subject": "s", "text": ""})),
            ["payload.text"]
        );
        // Nor is a blank one (its DKIM signature, lettre's, would not verify); a row taken
        // before is sent as it was.
        for blank in [
            json!({"subject": "s", "text": "\n"}),
            json!({"subject": "s", "text": "  \n\t\n", "html": " \r\n"}),
        ] {
            assert_eq!(fields(blank.clone()), ["payload.text"], "{blank}");
            assert!(EmailPayload::parse(&blank).is_ok(), "{blank}");
        }
        assert!(EmailPayload::parse_all(&json!({"subject": "s", "text": "\n.\n"})).is_ok());
        // Beside attachments (multipart), a blank text is fine.
        assert!(
            EmailPayload::parse_all(&json!({"subject": "s", "text": "\n", "attachments": [
                {"filename": "a.txt", "content_type": "text/plain", "content_base64": "aGk="}]}))
            .is_ok()
        );
        assert!(
            EmailPayload::parse_all(&json!({"subject": "s", "text": "", "html": "<p>h</p>"}))
                .is_ok()
        );
        assert!(
            EmailPayload::parse_all(
                &json!({"subject": "s", "text": "t", "headers": {"X-Tag": "a", "X-Other": "b"}})
            )
            .is_ok()
        );
    }

    #[test]
    fn new_payload_fields_are_checked_at_parse_time() {
        let field = |v| EmailPayload::parse(&v).unwrap_err().field;
        let base = json!({"subject": "s", "text": "t"});
        let with = |k: &str, v: Value| {
            let mut p = base.clone();
            p[k] = v;
            p
        };
        assert_eq!(
            field(with(
                "attachments",
                json!([{"filename": "a", "content_type": "text/plain", "content_base64": "!"}])
            )),
            "payload.attachments[0].content_base64"
        );
        assert_eq!(
            field(with("list_unsubscribe", json!("https://x.example"))),
            "payload.list_unsubscribe"
        );
        assert_eq!(
            field(with("list_unsubscribe_post", json!(true))),
            "payload.list_unsubscribe_post"
        );
        // The relay headers Herald merges into must be JSON objects.
        for (name, value) in [
            ("X-SMTPAPI", "nope"),
            ("x-mailgun-variables", "[1]"),
            ("X-SMTPAPI", r#"{"unique_args": "not an object"}"#),
        ] {
            assert_eq!(
                field(with("headers", json!({name: value}))),
                format!("payload.headers.{name}")
            );
        }
        // Read and written again, these would go as other values: refused at enqueue, a row
        // accepted before (or written by SQL) sent as then.
        for (name, value, says) in [
            (
                "X-Mailgun-Variables",
                r#"{"a": 1, "a": 2}"#,
                "gives a more than once",
            ),
            (
                "X-SMTPAPI",
                r#"{"unique_args": {"a": 1, "a": 2}}"#,
                "gives unique_args.a more than once",
            ),
            (
                "X-SMTPAPI",
                r#"{"a": 18446744073709551617}"#,
                "holds at a an integer",
            ),
            (
                "X-SMTPAPI",
                r#"{"a": 1e400}"#,
                "is not JSON Herald can read: number out of range",
            ),
        ] {
            let payload = with("headers", json!({name: value}));
            let refused = EmailPayload::parse_all(&payload).unwrap_err();
            assert_eq!(refused[0].field, format!("payload.headers.{name}"));
            assert!(
                refused[0].message.starts_with(says),
                "{}",
                refused[0].message
            );
            if !value.contains("1e400") {
                assert!(EmailPayload::parse(&payload).is_ok(), "{value}");
            }
        }
        let p = EmailPayload::parse(&with(
            "headers",
            json!({"X-SMTPAPI": "{\"category\": \"welcome\"}"}),
        ))
        .unwrap();
        assert_eq!(p.headers.len(), 1);
    }

    /// The envelope Herald hands lettre is the one lettre would take from the headers: the
    /// sender, then the destination, To, Cc and Bcc in order; the address headers are the ones
    /// lettre writes when they are added one by one; and the Bcc header still goes.
    #[test]
    fn the_envelope_is_the_one_lettre_takes_from_the_headers() {
        let payload = json!({"subject": "s", "text": "t", "from": "Desk <desk@example.com>",
            "to": ["b@example.com", "Bea <b2@example.com>"], "cc": ["c@example.com"],
            "bcc": ["d@example.com"], "reply_to": "e@example.com"});
        let row = Outgoing {
            event_id: "env-1",
            destination: "Ada <ada@example.com>",
            payload: &payload,
            semantics: Semantics::AtLeastOnce,
            body: None,
        };
        let default_from: Mailbox = "herald@example.com".parse().unwrap();
        let built =
            build_message(&row, &default_from, "h.example", &MessageOptions::default()).unwrap();
        let mb = |s: &str| s.parse::<Mailbox>().unwrap();
        let lettres = Message::builder()
            .from(mb("Desk <desk@example.com>"))
            .to(mb("Ada <ada@example.com>"))
            .to(mb("b@example.com"))
            .to(mb("Bea <b2@example.com>"))
            .cc(mb("c@example.com"))
            .bcc(mb("d@example.com"))
            .subject("s")
            .body(String::from("t"))
            .unwrap();
        assert_eq!(built.envelope(), lettres.envelope());
        for h in ["From", "To", "Cc"] {
            assert_eq!(
                built.headers().get_raw(h),
                lettres.headers().get_raw(h),
                "{h}"
            );
        }
        assert_eq!(
            built.envelope().from().map(|a| a.to_string()).as_deref(),
            Some("desk@example.com")
        );
        assert_eq!(built.envelope().to().len(), 5);
        // An address given twice (the destination again in bcc, a cc repeated) gets one RCPT.
        let twice = json!({"subject": "s", "text": "t", "cc": ["c@example.com", "c@EXAMPLE.com"],
            "bcc": ["ada@example.com"]});
        let built = build_message(
            &Outgoing {
                payload: &twice,
                ..row
            },
            &default_from,
            "h.example",
            &MessageOptions::default(),
        )
        .unwrap();
        assert_eq!(
            built.envelope().to(),
            ["ada@example.com", "c@example.com"].map(|a| a.parse::<lettre::Address>().unwrap())
        );
        // Without a `from`, the default sender.
        let plain = json!({"subject": "s", "text": "t"});
        let row = Outgoing {
            payload: &plain,
            ..row
        };
        let built =
            build_message(&row, &default_from, "h.example", &MessageOptions::default()).unwrap();
        assert_eq!(
            built.envelope().from().map(|a| a.to_string()).as_deref(),
            Some("herald@example.com")
        );
        assert_eq!(
            built.envelope().to(),
            ["ada@example.com".parse::<lettre::Address>().unwrap()]
        );
        let text = String::from_utf8(
            build_message(
                &Outgoing {
                    payload: &payload,
                    ..row
                },
                &default_from,
                "h.example",
                &MessageOptions::default(),
            )
            .unwrap()
            .formatted(),
        )
        .unwrap();
        assert!(
            !text.contains("Bcc:") && !text.contains("d@example.com"),
            "{text}"
        );
        // An internationalized domain goes in its ASCII form, in the envelope as in the headers.
        let idn = json!({"subject": "s", "text": "t", "cc": ["c@bücher.example"]});
        let built = build_message(
            &Outgoing {
                destination: "ada@bücher.example",
                payload: &idn,
                ..row
            },
            &default_from,
            "h.example",
            &MessageOptions::default(),
        )
        .unwrap();
        let to: Vec<String> = built
            .envelope()
            .to()
            .iter()
            .map(|a| a.to_string())
            .collect();
        assert_eq!(to, ["ada@xn--bcher-kva.example", "c@xn--bcher-kva.example"]);
        let headers = built.headers();
        assert_eq!(headers.get_raw("To"), Some("ada@xn--bcher-kva.example"));
        assert_eq!(headers.get_raw("Cc"), Some("c@xn--bcher-kva.example"));
    }

    #[test]
    fn messages_carry_correlation_unsubscribe_and_attachments() {
        let payload = json!({
            "subject": "Your receipt", "text": "Thanks", "html": "<p>Thanks</p>",
            "headers": {"X-SMTPAPI": "{\"category\": [\"receipts\"]}"},
            "list_unsubscribe": "<https://example.com/u/42>, <mailto:u@example.com>",
            "list_unsubscribe_post": true,
            "attachments": [{"filename": "../r.pdf", "content_type": "application/pdf", "content_base64": "JVBERi0x"}],
        });
        let row = Outgoing {
            event_id: "order-42:placed",
            destination: "ada@example.com",
            payload: &payload,
            semantics: Semantics::AtLeastOnce,
            body: None,
        };
        let from: Mailbox = "herald@example.com".parse().unwrap();
        let options = MessageOptions {
            relay: Some(RelayProvider::SendGrid),
            dkim: None,
        };
        let m = build_message(&row, &from, "h.example", &options).unwrap();
        let h = m.headers();
        let smtpapi: Value = serde_json::from_str(h.get_raw("X-SMTPAPI").unwrap()).unwrap();
        assert_eq!(
            smtpapi,
            json!({"category": ["receipts"], "unique_args": {"herald_event_id": "order-42:placed"}})
        );
        assert_eq!(
            h.get_raw("List-Unsubscribe"),
            Some("<https://example.com/u/42>, <mailto:u@example.com>")
        );
        assert_eq!(
            h.get_raw("List-Unsubscribe-Post"),
            Some("List-Unsubscribe=One-Click")
        );
        assert_eq!(h.get_raw("X-Herald-Event-Id"), Some("order-42:placed"));
        let text = String::from_utf8(m.formatted()).unwrap();
        assert!(text.contains("multipart/mixed"), "{text}");
        assert!(text.contains("multipart/alternative"), "{text}");
        assert!(text.contains("filename=\"r.pdf\""), "{text}");
        // Without a provider: no relay header, the message's own kept as it is.
        let m = build_message(&row, &from, "h.example", &MessageOptions::default()).unwrap();
        assert_eq!(
            m.headers().get_raw("X-SMTPAPI"),
            Some("{\"category\": [\"receipts\"]}")
        );
        // A malformed stored destination cannot build: permanent, before any connection.
        let bad = Outgoing {
            destination: "not an address",
            ..row
        };
        assert_eq!(
            build_message(&bad, &from, "h.example", &options)
                .unwrap_err()
                .field,
            "destination"
        );
    }

    /// The message `payload` (event `e-1` to ada@example.com) is built into, as it goes out.
    fn wire_text(payload: &Value, options: &MessageOptions) -> String {
        let row = Outgoing {
            event_id: "e-1",
            destination: "ada@example.com",
            payload,
            semantics: Semantics::AtLeastOnce,
            body: None,
        };
        let from: Mailbox = "herald@example.com".parse().unwrap();
        let built = build_message(&row, &from, "h.example", options).unwrap();
        String::from_utf8(built.formatted()).unwrap()
    }

    #[test]
    fn long_non_ascii_runs_fold_below_the_smtp_line_limit() {
        // 1,200 bytes of CJK without a space, in the subject, a display name and a header.
        let run = "日本語".repeat(134);
        let payload = json!({"subject": run, "text": "t", "from": format!("{run} <a@example.com>"),
            "headers": {"X-Tag": run}});
        let text = wire_text(&payload, &MessageOptions::default());
        let longest = text.split("\r\n").map(str::len).max().unwrap();
        assert!(longest < 998, "{longest}");
    }

    #[test]
    fn long_relay_headers_fold_below_the_smtp_line_limit() {
        let categories: Vec<String> = (0..150).map(|i| format!("category-{i}")).collect();
        let payload = json!({"subject": "s", "text": "t",
            "headers": {"X-SMTPAPI": json!({"category": categories}).to_string()}});
        let options = MessageOptions {
            relay: Some(RelayProvider::SendGrid),
            dkim: None,
        };
        let text = wire_text(&payload, &options);
        assert!(text.split("\r\n").all(|l| l.len() < 998));
        let unfolded = text.replace("\r\n ", " ");
        let value = unfolded
            .split("\r\n")
            .find_map(|l| l.strip_prefix("X-SMTPAPI: "))
            .unwrap();
        let v: Value = serde_json::from_str(value).unwrap();
        assert_eq!(v["category"].as_array().unwrap().len(), 150);
        assert_eq!(v["unique_args"]["herald_event_id"], "e-1");
    }

    #[test]
    fn only_a_failure_after_the_content_left_is_ambiguous() {
        let class = |f: SmtpFailure| f.classify();
        assert_eq!(
            class(SmtpFailure::Timeout(Stage::Connect(ConnectStep::Auth))),
            (AttemptClass::NotSent, "connect_timeout", None)
        );
        assert_eq!(
            class(SmtpFailure::Timeout(Stage::Envelope)),
            (AttemptClass::NotSent, "timeout_before_data", None)
        );
        assert_eq!(
            class(SmtpFailure::Timeout(Stage::Content)),
            (AttemptClass::Ambiguous, "timeout", None)
        );
        assert_eq!(
            class(SmtpFailure::PoolTimeout),
            (AttemptClass::NotSent, "pool_timeout", None)
        );
        assert_eq!(
            class(SmtpFailure::Unsupported("8BITMIME")),
            (AttemptClass::Permanent, "unsupported_by_server", None)
        );
    }

    #[test]
    fn the_queue_id_is_read_from_the_reply_to_the_content() {
        let table = [
            // Postfix, and relays answering like it.
            ("2.0.0 Ok: queued as ABC123", Some("ABC123")),
            ("Ok: queued as 4Xq1Bz6yKxz9tYp", Some("4Xq1Bz6yKxz9tYp")),
            (
                "2.0.0 OK: queued as em_4yM2nTvR8oPcX3uZiKeLg7sB",
                Some("em_4yM2nTvR8oPcX3uZiKeLg7sB"),
            ),
            (
                "Ok: Queued As 9GcK5t_kQZ-ElPwCs3uBnA.",
                Some("9GcK5t_kQZ-ElPwCs3uBnA"),
            ),
            ("2.0.0 Ok: queued as <ABC123>", Some("ABC123")),
            // Exim.
            ("OK id=1abcde-000123-XY", Some("1abcde-000123-XY")),
            (
                "OK id=1tGZ2f-00000000abc-0Xyz",
                Some("1tGZ2f-00000000abc-0Xyz"),
            ),
            // Amazon SES (its reply's words after the code).
            (
                "Ok 0100018c9f0e5a3b-6c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f-000000",
                Some("0100018c9f0e5a3b-6c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f-000000"),
            ),
            (
                "2.0.0 Ok 010001870dbae81e-35118332-f389-474c-8b37-69ce1e1934ae-000000",
                Some("010001870dbae81e-35118332-f389-474c-8b37-69ce1e1934ae-000000"),
            ),
            // Not SES's shape: Gmail's time and trace, a short or non-hex word, more words.
            (
                "2.0.0 OK  1733490000 d1-20020a05600c4f4100b0042fgsmtp",
                None,
            ),
            ("OK 1733490000", None),
            ("Ok 0100018c-000000", None),
            (
                "Ok 0100018c9f0e5a3b-6c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5g-000000",
                None,
            ),
            (
                "Ok 0100018c9f0e5a3b-6c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f-000000 extra",
                None,
            ),
            (
                "Accepted 0100018c9f0e5a3b-6c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f-000000",
                None,
            ),
            // No id given.
            ("OK", None),
            ("2.0.0 Ok", None),
            ("2.0.0 Ok: queued", None),
            ("Ok: queued as", None),
            ("OK id=", None),
            ("OK msgid=abc", None),
            // Not an id: an address, or something else entirely.
            ("2.0.0 Ok: queued as ada@example.com", None),
            ("OK id=\u{e9}t\u{e9}", None),
            ("", None),
        ];
        for (reply, want) in table {
            assert_eq!(queue_id(reply).as_deref(), want, "{reply:?}");
        }
        assert_eq!(queue_id(&format!("queued as {}", "a".repeat(129))), None);
    }

    fn refused(list: &[(&str, u16)]) -> Vec<RefusedRecipient> {
        list.iter()
            .enumerate()
            .map(|(index, (m, code))| RefusedRecipient {
                masked: (*m).to_owned(),
                code: *code,
                index,
                sent_again: false,
            })
            .collect()
    }

    #[test]
    fn all_recipients_refused_is_transient_if_any_refusal_is() {
        let class = |list: &[(&str, u16)]| SmtpFailure::RecipientsRefused(refused(list)).classify();
        let (a, b) = ("a***@e***.com", "b***@e***.com");
        for (list, class_, code) in [
            (&[(a, 550), (b, 551)][..], AttemptClass::Permanent, 550),
            (&[(a, 550), (b, 452)], AttemptClass::Transient, 452),
            (&[(a, 450)], AttemptClass::Transient, 450),
            // 552 to RCPT TO is taken as 452 (RFC 5321 §4.5.3.1.10), its code kept.
            (&[(a, 550), (b, 552)], AttemptClass::Transient, 552),
            (&[(a, 552)], AttemptClass::Transient, 552),
        ] {
            assert_eq!(
                class(list),
                (class_, "recipients_refused", Some(code)),
                "{list:?}"
            );
        }
        let now = chrono::Utc::now();
        let r = SmtpFailure::RecipientsRefused(refused(&[("a***@e***.com", 553)]))
            .report(now, &super::super::Secrets::default());
        assert_eq!(
            r.excerpt.as_deref(),
            Some("every recipient refused at RCPT TO: a***@e***.com 553")
        );
        let many: Vec<_> = (0..12).map(|_| ("x***@e***.com", 550)).collect();
        let listed = refused_list(&refused(&many));
        assert!(listed.ends_with("x***@e***.com 550 and 2 more"), "{listed}");
    }

    #[test]
    fn an_accepted_message_keeps_its_queue_id_and_lists_refused_recipients() {
        use lettre::transport::smtp::response::{Category, Code, Detail, Severity};
        let ok = Code::new(
            Severity::PositiveCompletion,
            Category::MailSystem,
            Detail::Zero,
        );
        let reply = Response::new(ok, vec!["2.0.0 Ok: queued as ABC123".to_owned()]);
        let now = chrono::Utc::now();
        let r = Accepted {
            reply: reply.clone(),
            refused: Vec::new(),
        }
        .report(now, &super::super::Secrets::default());
        assert_eq!(
            (r.class, r.status, r.error_kind.as_deref()),
            (AttemptClass::Accepted, Some(250), None)
        );
        assert_eq!(r.provider_message_id.as_deref(), Some("ABC123"));
        let r = Accepted {
            reply,
            refused: refused(&[("c***@e***.com", 550)]),
        }
        .report(now, &super::super::Secrets::default());
        assert_eq!(
            (r.class, r.error_kind.as_deref()),
            (AttemptClass::Accepted, Some("recipients_refused"))
        );
        assert_eq!(
            r.excerpt.as_deref(),
            Some("2.0.0 Ok: queued as ABC123; refused at RCPT TO: c***@e***.com 550")
        );
        // A 3xx to the content is no acceptance, nor a refusal.
        let again = Code::new(
            Severity::PositiveIntermediate,
            Category::MailSystem,
            Detail::Four,
        );
        let r = Accepted {
            reply: Response::new(again, vec!["go ahead".to_owned()]),
            refused: Vec::new(),
        }
        .report(now, &super::super::Secrets::default());
        assert_eq!(
            (r.class, r.status, r.error_kind.as_deref()),
            (AttemptClass::Ambiguous, Some(354), Some("unexpected_reply"))
        );
    }

    #[test]
    fn the_ca_file_must_hold_valid_certificates() {
        assert!(matches!(
            SmtpCa::from_pem(b"").unwrap_err(),
            SmtpCaError::Empty
        ));
        let key_only =
            b"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n";
        assert!(matches!(
            SmtpCa::from_pem(key_only).unwrap_err(),
            SmtpCaError::Empty
        ));
        let garbage = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(matches!(
            SmtpCa::from_pem(garbage).unwrap_err(),
            SmtpCaError::Invalid { index: 1, .. }
        ));
        let missing = SmtpCa::load(std::path::Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert!(matches!(missing, SmtpCaError::Read(_)), "{missing:?}");
    }

    #[test]
    fn the_relay_debug_never_shows_credentials() {
        super::super::install_crypto_provider();
        let relay = SmtpRelay::parse("smtps://relay-user-9:hunter2@mail.example", None).unwrap();
        let pool = SmtpPool::new(relay, &SmtpLimits::new(Duration::from_secs(1), 1));
        let shown = format!("{pool:?}");
        assert!(shown.contains("mail.example"), "{shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("relay-user-9"),
            "{shown}"
        );
    }

    #[test]
    fn the_reuse_check_is_a_quarter_of_the_timeout_at_most_two_seconds() {
        assert_eq!(
            reuse_check_bound(Duration::from_secs(30)),
            Duration::from_secs(2)
        );
        assert_eq!(
            reuse_check_bound(Duration::from_millis(2000)),
            Duration::from_millis(500)
        );
    }

    /// A pool of one slot for a relay where nothing listens (a connection attempt would be
    /// refused), and an envelope to send with it.
    fn pool_of_one_at_a_closed_port(timeout: Duration) -> (SmtpPool, Envelope) {
        super::super::install_crypto_provider();
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let relay = SmtpRelay::parse(&format!("smtp://{closed}"), None).unwrap();
        let to: lettre::Address = "a@b.example".parse().unwrap();
        (
            SmtpPool::new(relay, &SmtpLimits::new(timeout, 1)),
            Envelope::new(Some(to.clone()), vec![to]).unwrap(),
        )
    }

    #[tokio::test]
    async fn waiting_for_a_pool_slot_ends_at_half_the_timeout_and_is_not_sent() {
        let timeout = Duration::from_millis(2000);
        let (pool, envelope) = pool_of_one_at_a_closed_port(timeout);
        let taken = pool.slots.clone().try_acquire_owned().unwrap();
        let started = Instant::now();
        let failure = pool
            .send(&envelope, b"x", Semantics::AtLeastOnce, &|| true)
            .await
            .unwrap_err();
        assert!(matches!(failure, SmtpFailure::PoolTimeout), "{failure:?}");
        // Half the timeout at most: the dialogue keeps the other half.
        assert!(started.elapsed() >= timeout / 2);
        assert!(started.elapsed() < timeout, "{:?}", started.elapsed());
        // With the slot free the same pool goes on to connect (and is refused).
        drop(taken);
        let failure = pool
            .send(&envelope, b"x", Semantics::AtLeastOnce, &|| true)
            .await
            .unwrap_err();
        assert_eq!(failure.classify(), (AttemptClass::NotSent, "connect", None));
    }

    /// A send that waited for a slot asks `still_clear` once it has one, before it connects: the
    /// relay paused meanwhile (the sender's answer) keeps it from connecting at all.
    #[tokio::test]
    async fn a_send_that_got_its_slot_after_a_pause_does_not_connect() {
        let (pool, envelope) = pool_of_one_at_a_closed_port(Duration::from_millis(2000));
        let taken = pool.slots.clone().try_acquire_owned().unwrap();
        let asked = std::sync::atomic::AtomicUsize::new(0);
        let paused = || {
            asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            false
        };
        let send = pool.send(&envelope, b"x", Semantics::AtLeastOnce, &paused);
        let free = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(taken);
        };
        let (failure, ()) = tokio::join!(send, free);
        let failure = failure.unwrap_err();
        // Not `connect` (refused): no connection was tried.
        assert_eq!(
            failure.classify(),
            (AttemptClass::NotSent, kind::HELD, None)
        );
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Its slot went back with it.
        assert!(pool.slots.clone().try_acquire_owned().is_ok());
    }

    #[test]
    fn smtp_urls_parse_like_lettre() {
        super::super::install_crypto_provider();
        let r = SmtpRelay::parse("smtp://127.0.0.1:2525", None).unwrap();
        assert_eq!((r.host.as_str(), r.port), ("127.0.0.1", 2525));
        assert!(matches!(r.tls, Tls::None) && r.credentials.is_none());
        let r = SmtpRelay::parse("smtp://mail.example?tls=required", None).unwrap();
        assert!(matches!(r.tls, Tls::Required(_)) && r.port == 587);
        let r = SmtpRelay::parse("smtp://mail.example?tls=opportunistic", None).unwrap();
        assert!(matches!(r.tls, Tls::Opportunistic(_)) && r.port == 587);
        let r = SmtpRelay::parse("smtps://u%40x:p%2Fw@mail.example/herald.example", None).unwrap();
        assert!(matches!(r.tls, Tls::Wrapper(_)) && r.port == 465);
        assert!(r.credentials.is_some());
        assert!(matches!(&r.hello, ClientId::Domain(d) if d == "herald.example"));
        let r = SmtpRelay::parse("smtp://[::1]:25", None).unwrap();
        assert_eq!(r.host, "::1");
        assert_eq!(percent_decode("u%40x").as_deref(), Some("u@x"));
        assert_eq!(percent_decode("bad%4"), None);
        for bad in [
            "http://mail.example",
            "smtp://x?tls=maybe",
            "smtp:///nohost",
            "nope",
        ] {
            assert!(SmtpRelay::parse(bad, None).is_err(), "{bad}");
        }
        // A part Herald would ignore is refused, named; the value is never shown.
        for (bad, says) in [
            (
                "smtp://mail.example?TLS=required",
                "the only query parameter is tls",
            ),
            (
                "smtp://mail.example?starttls=required",
                "the only query parameter is tls",
            ),
            (
                "smtp://127.0.0.1?foo=bar",
                "the only query parameter is tls",
            ),
            (
                "smtp://m.example?tls=required&tls=opportunistic",
                "more than once",
            ),
            ("smtp://127.0.0.1:2525#frag", "fragment"),
            (
                "smtps://m.example?tls=opportunistic",
                "does not apply to smtps://",
            ),
            (
                "smtps://m.example?tls=required",
                "does not apply to smtps://",
            ),
            ("smtp://127.0.0.1:0", "port 0"),
            ("smtp://hunter2@127.0.0.1", "needs its password"),
            ("smtp://127.0.0.1/bad%20name!", "must be a host name"),
        ] {
            let err = SmtpRelay::parse(bad, None).err().unwrap().to_string();
            assert!(err.contains(says), "{bad}: {err}");
            assert!(!err.contains("hunter2") && !err.contains("#frag"), "{err}");
        }
        for name in [
            "herald.example",
            "mx-1",
            "[192.0.2.7]",
            "[IPv6:2001:db8::1]",
        ] {
            assert!(is_mail_domain(name), "{name}");
        }
        for name in [
            "a b",
            "[]",
            "x_y",
            "a/b",
            "é.example",
            "-bad-",
            "a..b",
            "-a-.",
            "a.",
            "[999.1.1.1]",
            "[2001:db8::1]",
            "%2e%2e",
        ] {
            assert!(!is_mail_domain(name), "{name}");
        }
        for bad in ["smtp://:pw@127.0.0.1", "smtp://127.0.0.1//"] {
            assert!(SmtpRelay::parse(bad, None).is_err(), "{bad}");
        }
        // The message and every cause behind it.
        let chain = |e: &dyn std::error::Error| {
            std::iter::successors(Some(e), |e| e.source())
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(": ")
        };
        for url in [
            "ftp://u:hunter2@mail.example",
            "smtp://u:hunter2@mail.example:99999",
        ] {
            let err = chain(&SmtpRelay::parse(url, None).err().unwrap());
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn refusals_read_as_they_always_have() {
        let smtp = |url| SmtpRelay::parse(url, None).err().unwrap().to_string();
        for url in ["nope", "http://mail.example", "smtp://x?tls=maybe"] {
            assert_eq!(
                smtp(url),
                "smtp_url is not a valid smtp:// or smtps:// URL",
                "{url}"
            );
        }
        let from = EmailChannel::new(
            None,
            SmtpLimits::new(Duration::from_secs(1), DEFAULT_POOL_SIZE),
            PathBuf::from("unused"),
            "not an address",
            "h.example",
            Arc::new(crate::clock::SystemClock),
        )
        .err()
        .unwrap();
        assert_eq!(from.to_string(), "mail_from must be an email address");
    }

    #[test]
    fn message_id_is_deterministic() {
        assert_eq!(
            message_id("e-1", "h.example"),
            message_id("e-1", "h.example")
        );
        assert_ne!(
            message_id("e-1", "h.example"),
            message_id("e-2", "h.example")
        );
        assert!(message_id("e-1", "h.example").ends_with("@h.example>"));
    }
}
