//! The email channel: SMTP through lettre's pooled async transport, or — by default — a
//! directory of `.eml` files. Every message has a deterministic `Message-ID` derived from the
//! event id and an `X-Herald-Event-Id` header, so a receiver can drop duplicates.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::SendReport;
use crate::clock::Clock;
use crate::domain::{AttemptClass, InvalidField};
use crate::sender::decide::classify_smtp_code;
use crate::storage::models::OutboxRow;

/// The recipient (`destination`) of an email: `a@b.example` or `Name <a@b.example>`.
pub fn parse_recipient(destination: &str) -> Result<Mailbox, InvalidField> {
    Mailbox::from_str(destination)
        .map_err(|_| InvalidField::new("destination", "must be an email address"))
}

/// `{"from"?, "to"?: […], "cc"?, "bcc"?, "reply_to"?, "subject", "text"?, "html"?, "headers"?}`.
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
}

impl EmailPayload {
    pub fn parse(payload: &Value) -> Result<Self, InvalidField> {
        let obj = payload
            .as_object()
            .ok_or_else(|| InvalidField::new("payload", "must be an object with a subject"))?;
        const KNOWN: &[&str] = &[
            "from", "to", "cc", "bcc", "reply_to", "subject", "text", "html", "headers",
        ];
        if let Some(k) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(InvalidField::new("payload", format!("unknown field {k:?}")));
        }
        let string = |field: &'static str, key: &str| -> Result<Option<String>, InvalidField> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(InvalidField::new(field, "must be a string")),
            }
        };
        let mailbox = |field: &'static str, key: &str| -> Result<Option<Mailbox>, InvalidField> {
            string(field, key)?
                .map(|s| {
                    Mailbox::from_str(&s)
                        .map_err(|_| InvalidField::new(field, "must be an email address"))
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
                            .and_then(|s| Mailbox::from_str(s).ok())
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
        let subject = string("payload.subject", "subject")?.unwrap_or_default();
        if subject.trim().is_empty() {
            return Err(InvalidField::new("payload.subject", "is required"));
        }
        if subject.contains(['\r', '\n']) {
            return Err(InvalidField::new("payload.subject", "must be one line"));
        }
        let text = string("payload.text", "text")?;
        let html = string("payload.html", "html")?;
        if text.is_none() && html.is_none() {
            return Err(InvalidField::new(
                "payload.text",
                "text or html is required",
            ));
        }
        let headers = match obj.get("headers") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(h)) => h
                .iter()
                .map(|(k, v)| {
                    let v = v.as_str().filter(|v| !v.contains(['\r', '\n']));
                    let ok_name = k.starts_with("X-") || k.starts_with("x-");
                    match (v, ok_name && HeaderName::new_from_ascii(k.clone()).is_ok()) {
                        (Some(v), true) => Ok((k.clone(), v.to_owned())),
                        _ => Err(InvalidField::new(
                            "payload.headers",
                            format!(
                                "{k:?}: custom headers are X-… names with one-line string values"
                            ),
                        )),
                    }
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(InvalidField::new(
                    "payload.headers",
                    "must be an object of strings",
                ));
            }
        };
        Ok(Self {
            from: mailbox("payload.from", "from")?,
            to: list("payload.to", "to")?,
            cc: list("payload.cc", "cc")?,
            bcc: list("payload.bcc", "bcc")?,
            reply_to: mailbox("payload.reply_to", "reply_to")?,
            subject,
            text,
            html,
            headers,
        })
    }
}

/// `<sha256(event_id)[..32 hex]@domain>`: the same event id always gives the same Message-ID.
pub fn message_id(event_id: &str, domain: &str) -> String {
    let h = Sha256::digest(event_id.as_bytes());
    format!("<{}@{domain}>", hex::encode(&h[..16]))
}

/// Builds the RFC 5322 message for a claimed row.
pub fn build_message(
    row: &OutboxRow,
    default_from: &Mailbox,
    domain: &str,
) -> Result<Message, InvalidField> {
    let p = EmailPayload::parse(&row.payload)?;
    let to = parse_recipient(&row.destination)?;
    let mut b = Message::builder()
        .from(p.from.clone().unwrap_or_else(|| default_from.clone()))
        .to(to)
        .subject(p.subject.clone())
        .message_id(Some(message_id(&row.event_id, domain)));
    for m in p.to {
        b = b.to(m);
    }
    for m in p.cc {
        b = b.cc(m);
    }
    for m in p.bcc {
        b = b.bcc(m);
    }
    if let Some(r) = p.reply_to {
        b = b.reply_to(r);
    }
    let built = match (p.text, p.html) {
        (Some(t), Some(h)) => b.multipart(MultiPart::alternative_plain_html(t, h)),
        (Some(t), None) => b.singlepart(SinglePart::plain(t)),
        (None, Some(h)) => b.singlepart(SinglePart::html(h)),
        (None, None) => {
            return Err(InvalidField::new(
                "payload.text",
                "text or html is required",
            ));
        }
    };
    let mut message =
        built.map_err(|e| InvalidField::new("payload", format!("cannot build the email: {e}")))?;
    let headers = message.headers_mut();
    for (k, v) in p.headers {
        if let Ok(name) = HeaderName::new_from_ascii(k) {
            headers.insert_raw(HeaderValue::new(name, v));
        }
    }
    if let Ok(name) = HeaderName::new_from_ascii("X-Herald-Event-Id".to_owned()) {
        headers.insert_raw(HeaderValue::new(name, row.event_id.clone()));
    }
    Ok(message)
}

/// Where email goes.
#[derive(Clone)]
pub enum EmailTransport {
    /// One `.eml` file per message, named after its Message-ID hash (a resend overwrites it).
    Directory(PathBuf),
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
}

/// Sends email. Cheap to clone.
#[derive(Clone)]
pub struct EmailChannel {
    transport: EmailTransport,
    /// Bound on one whole SMTP send: lettre's own timeout does not cover every read.
    timeout: Duration,
    from: Mailbox,
    domain: Arc<str>,
    clock: Arc<dyn Clock>,
}

impl EmailChannel {
    /// `smtp_url`: `smtp://host:port` (plain), `smtp://…?tls=required`, `smtps://…`; `None`: the
    /// `.eml` directory.
    pub fn new(
        smtp_url: Option<&str>,
        timeout: Duration,
        mail_dir: PathBuf,
        from: &str,
        domain: &str,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, String> {
        super::install_crypto_provider();
        let transport = match smtp_url {
            Some(url) => EmailTransport::Smtp(
                AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
                    .map_err(|_| "smtp_url is not a valid smtp:// or smtps:// URL".to_owned())?
                    .timeout(Some(timeout))
                    .build(),
            ),
            None => EmailTransport::Directory(mail_dir),
        };
        let from =
            Mailbox::from_str(from).map_err(|_| "mail_from must be an email address".to_owned())?;
        Ok(Self {
            transport,
            timeout,
            from,
            domain: domain.into(),
            clock,
        })
    }

    pub async fn send(&self, row: &OutboxRow) -> SendReport {
        let now = self.clock.now();
        let message = match build_message(row, &self.from, &self.domain) {
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
        let started = std::time::Instant::now();
        let mut report = match &self.transport {
            EmailTransport::Directory(dir) => {
                write_eml(dir, &row.event_id, &self.domain, &message.formatted(), now).await
            }
            EmailTransport::Smtp(t) => {
                match tokio::time::timeout(self.timeout, t.send(message)).await {
                    Err(_) => SendReport::refused(
                        AttemptClass::Ambiguous,
                        "timeout",
                        now,
                        "no answer within the SMTP timeout",
                    ),
                    Ok(Ok(resp)) => {
                        let code = smtp_code(&resp.code().to_string());
                        let mut r = SendReport::refused(
                            classify_smtp_code(code),
                            "",
                            now,
                            resp.message().collect::<Vec<_>>().join(" "),
                        );
                        r.error_kind = None;
                        r.status = Some(code);
                        r
                    }
                    Ok(Err(e)) => smtp_error_report(&e, now),
                }
            }
        };
        report.started_at = now;
        report.finished_at =
            now + chrono::Duration::from_std(started.elapsed()).unwrap_or_default();
        report
    }
}

fn smtp_code(code: &str) -> u16 {
    code.parse().unwrap_or(0)
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
        tokio::fs::create_dir_all(dir).await?;
        tokio::fs::write(&tmp, bytes).await?;
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
            r.error_kind = None;
            r.status = Some(250);
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

fn smtp_error_report(
    e: &lettre::transport::smtp::Error,
    now: chrono::DateTime<chrono::Utc>,
) -> SendReport {
    let code = e.status().map(|c| smtp_code(&c.to_string()));
    let (class, kind) = if let Some(code) = code {
        (classify_smtp_code(code), "smtp_reply")
    } else if e.is_timeout() {
        (AttemptClass::Ambiguous, "timeout")
    } else if never_connected(e) {
        (AttemptClass::NotSent, "connect")
    } else if e.is_tls() {
        (AttemptClass::NotSent, "tls")
    } else {
        // The connection broke somewhere in the dialogue: the message may have been accepted.
        (AttemptClass::Ambiguous, "connection_lost")
    };
    let mut r = SendReport::refused(class, kind, now, e.to_string());
    r.status = code;
    r
}

fn never_connected(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            return matches!(
                io.kind(),
                ConnectionRefused
                    | AddrNotAvailable
                    | HostUnreachable
                    | NetworkUnreachable
                    | NotFound
            );
        }
        cur = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        assert!(
            EmailPayload::parse(
                &json!({"subject": "s", "html": "<p>h</p>", "cc": ["a@b.example"]})
            )
            .is_ok()
        );
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
