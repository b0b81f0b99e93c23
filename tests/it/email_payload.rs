//! The email message as it leaves Herald, read back with a real parser (mail-parser), on both
//! backends: relay correlation read back by each provider's own normalizer and matched by the
//! reconciler, attachments and List-Unsubscribe on the wire, DKIM signatures verified with the
//! public key by an independent verifier (dkimpy), every invalid payload field a 422 naming it,
//! and a malformed address inserted by plain SQL dead-lettered without any connection.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use chrono::Utc;
use hmac::{Hmac, Mac};
use mail_parser::{MessageParser, MimeHeaders};
use serde_json::{Value, json};

use crate::both_backends;
use crate::sns;
use crate::support::app::spawn_app_with;
use crate::support::smtp_sink::SmtpSink;
use crate::support::{Backend, TestApp};

/// An event id with characters every provider slot must carry (`:` `_` `@` `.`).
const EVENT: &str = "order-42:placed_2026@x.example";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

async fn post_email(app: &TestApp, id: &str, payload: Value) -> reqwest::Response {
    app.post_message(json!({
        "event_id": id, "channel": "email", "destination": "Ada <ada@example.com>",
        "payload": payload,
    }))
    .await
}

/// Sends one email through the sink and returns its raw content.
async fn send_one(app: &TestApp, sink: &SmtpSink, id: &str, payload: Value) -> String {
    let r = post_email(app, id, payload).await;
    assert_eq!(
        r.status(),
        201,
        "{id}: {}",
        r.text().await.unwrap_or_default()
    );
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.message(id).await["state"], "delivered");
    let mail = sink.wait_for_mail(1, Duration::from_secs(10)).await;
    mail[0].data.clone()
}

/// The text of a header of the message, unfolded.
fn header(raw: &str, name: &str) -> Option<String> {
    let m = MessageParser::default()
        .parse(raw.as_bytes())
        .expect("parses");
    m.header(name).and_then(|h| h.as_text()).map(str::to_owned)
}

async fn ingest(
    app: &TestApp,
    source: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> reqwest::Response {
    let mut r = app
        .http
        .post(format!("{}/v1/ingest/{source}", app.base))
        .body(body);
    for (n, v) in headers {
        r = r.header(*n, v);
    }
    r.send().await.expect("POST /v1/ingest")
}

/// The stored receipt names the message by Herald's event id, and the reconciler applies it:
/// the correlation went through the provider's slot alone (the receipts carry no Message-ID and
/// no provider message id Herald knows).
async fn assert_correlated(app: &TestApp, source: &str, status: &str) {
    let rows = app.db.receipts_of_source(source).unwrap();
    assert_eq!(rows.len(), 1, "{source}");
    assert_eq!(rows[0].herald_event_id.as_deref(), Some(EVENT), "{source}");
    assert!(app.herald.reconciler.run_until_idle().await.unwrap() >= 1);
    let view = app.message(EVENT).await;
    assert_eq!(view["delivery_status"], status, "{source}: {view}");
}

fn relay_app_toml(sink: &SmtpSink, provider: &str, source: &str) -> String {
    format!(
        "smtp_url = \"{}\"\nsmtp_provider = \"{provider}\"\n{source}",
        sink.url
    )
}

/// SendGrid: `X-SMTPAPI: {"unique_args": {"herald_event_id": …}}`; the Event Webhook carries
/// each unique argument as a top-level key of every event (signed with a key made here).
async fn sendgrid_correlation_round_trips(backend: Backend) {
    use p256::ecdsa::signature::Signer;
    let key = p256::ecdsa::SigningKey::from_bytes(&[7u8; 32].into()).unwrap();
    // SubjectPublicKeyInfo DER of a P-256 key: the fixed algorithm prefix, then the point.
    let mut public = hex::decode("3059301306072a8648ce3d020106082a8648ce3d030107034200").unwrap();
    public.extend_from_slice(key.verifying_key().to_encoded_point(false).as_bytes());
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(
        backend,
        &relay_app_toml(
            &sink,
            "sendgrid",
            &format!(
                "[sources.sg]\nscheme = \"sendgrid\"\nsecrets = [\"{}\"]\n",
                b64(&public)
            ),
        ),
    )
    .await;
    let raw = send_one(
        &app,
        &sink,
        EVENT,
        json!({"subject": "Receipt", "text": "Thanks",
               "headers": {"X-SMTPAPI": "{\"category\": [\"reçus\"], \"unique_args\": {\"client\": \"Zoë\"}}"}}),
    )
    .await;
    // JSON the relay reads: past ASCII escaped, not RFC 2047 words inside the JSON (a
    // walk-through: `{"category": =?utf-8?b?…?=`, which no JSON parser reads).
    let sent = header(&raw, "X-SMTPAPI").unwrap();
    // As on the wire (unfolded, not decoded: the parser above decodes encoded words).
    let wire: String = raw
        .split("\r\n")
        .skip_while(|l| !l.starts_with("X-SMTPAPI:"))
        .enumerate()
        .take_while(|(i, l)| *i == 0 || l.starts_with(' ') || l.starts_with('\t'))
        .map(|(_, l)| l.trim_start_matches("X-SMTPAPI:").trim_start())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(wire.is_ascii() && !wire.contains("=?"), "{wire}");
    assert_eq!(
        serde_json::from_str::<Value>(&wire).unwrap(),
        serde_json::from_str::<Value>(&sent).unwrap()
    );
    let smtpapi: Value = serde_json::from_str(&sent).unwrap();
    assert_eq!(
        (&smtpapi["category"], &smtpapi["unique_args"]["client"]),
        (&json!(["reçus"]), &json!("Zoë")),
        "the message's own kept"
    );
    // What SendGrid posts back: the unique arguments merged into the event.
    let mut event = json!({"email": "ada@example.com", "timestamp": Utc::now().timestamp(),
                           "event": "delivered", "sg_event_id": "sg-ev-1",
                           "sg_message_id": "14c5d75ce93.filter0001.1", "response": "250 OK"});
    for (k, v) in smtpapi["unique_args"].as_object().unwrap() {
        event[k] = v.clone();
    }
    let mut body = serde_json::to_vec(&json!([event])).unwrap();
    body.extend_from_slice(b"\r\n");
    let ts = Utc::now().timestamp().to_string();
    let signed = [ts.as_bytes(), &body].concat();
    let sig: p256::ecdsa::Signature = key.sign(&signed);
    let r = ingest(
        &app,
        "sg",
        &[
            (
                "x-twilio-email-event-webhook-signature",
                b64(sig.to_der().as_bytes()),
            ),
            ("x-twilio-email-event-webhook-timestamp", ts),
        ],
        body,
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_correlated(&app, "sg", "delivered").await;
    app.stop().await;
}

/// Mailgun: `X-Mailgun-Variables: {"herald_event_id": …}`; its webhook carries the variables as
/// `event-data.user-variables`.
async fn mailgun_correlation_round_trips(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(
        backend,
        &relay_app_toml(
            &sink,
            "mailgun",
            "[sources.mg]\nscheme = \"mailgun\"\nsecrets = [\"mg-key\"]\n",
        ),
    )
    .await;
    let raw = send_one(
        &app,
        &sink,
        EVENT,
        json!({"subject": "Hi", "text": "Hello"}),
    )
    .await;
    let vars: Value = serde_json::from_str(&header(&raw, "X-Mailgun-Variables").unwrap()).unwrap();
    let t = Utc::now().timestamp().to_string();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"mg-key").unwrap();
    mac.update(format!("{t}tok-corr").as_bytes());
    let body = serde_json::to_vec(&json!({
        "signature": {"timestamp": t, "token": "tok-corr",
                      "signature": hex::encode(mac.finalize().into_bytes())},
        "event-data": {"id": "mg-ev-1", "event": "failed", "severity": "permanent",
                       "timestamp": Utc::now().timestamp() as f64 + 0.25,
                       "recipient": "ada@example.com", "user-variables": vars}
    }))
    .unwrap();
    assert_eq!(ingest(&app, "mg", &[], body).await.status(), 200);
    assert_correlated(&app, "mg", "bounced").await;
    app.stop().await;
}

/// Postmark: every `X-PM-Metadata-NAME` header becomes `Metadata.NAME` in its webhooks.
async fn postmark_correlation_round_trips(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(
        backend,
        &relay_app_toml(
            &sink,
            "postmark",
            "[sources.pm]\nscheme = \"postmark\"\nusername = \"hook\"\npassword = \"s3cret\"\n",
        ),
    )
    .await;
    let raw = send_one(
        &app,
        &sink,
        EVENT,
        json!({"subject": "Hi", "text": "Hello"}),
    )
    .await;
    let parsed = MessageParser::default().parse(raw.as_bytes()).unwrap();
    let metadata: serde_json::Map<String, Value> = parsed
        .headers()
        .iter()
        .filter_map(|h| {
            let name = h.name();
            let key = name
                .get(..14)
                .filter(|p| p.eq_ignore_ascii_case("X-PM-Metadata-"))
                .map(|_| &name[14..])?;
            Some((key.to_owned(), json!(h.value().as_text()?)))
        })
        .collect();
    assert_eq!(metadata.len(), 1, "{metadata:?}");
    let body = serde_json::to_vec(&json!({
        "RecordType": "Delivery", "ServerID": 23, "MessageStream": "outbound",
        "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483", "Recipient": "ada@example.com",
        "Tag": "", "DeliveredAt": Utc::now().to_rfc3339(), "Details": "Test delivery webhook details",
        "Metadata": metadata
    }))
    .unwrap();
    let auth = format!("Basic {}", b64(b"hook:s3cret"));
    assert_eq!(
        ingest(&app, "pm", &[("authorization", auth)], body)
            .await
            .status(),
        200
    );
    assert_correlated(&app, "pm", "delivered").await;
    app.stop().await;
}

/// SES: `X-SES-MESSAGE-TAGS: herald_event_id=…` (encoded to SES's tag alphabet); event publishing
/// echoes each tag in `mail.tags` as a list, and the normalizer decodes it.
async fn ses_correlation_round_trips(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    sns::signing_certificate(dir.path());
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(
        backend,
        &relay_app_toml(
            &sink,
            "ses",
            &format!(
                "[sources.ses]\nscheme = \"ses\"\ntopic_arns = [\"{}\"]\nconfirm_subscriptions = false\n\
                 certificates = {{ \"{}\" = {:?} }}\n",
                sns::TOPIC,
                sns::CERT_URL,
                dir.path().join("cert.pem").display().to_string()
            ),
        ),
    )
    .await;
    let raw = send_one(
        &app,
        &sink,
        EVENT,
        json!({"subject": "Hi", "text": "Hello",
               "headers": {"X-SES-MESSAGE-TAGS": "campaign=spring"}}),
    )
    .await;
    let tags_header = header(&raw, "X-SES-MESSAGE-TAGS").unwrap();
    // Every tag within SES's documented alphabet.
    let mut tags = serde_json::Map::new();
    tags.insert("ses:configuration-set".into(), json!(["herald"]));
    for tag in tags_header.split(',') {
        let (name, value) = tag.trim().split_once('=').unwrap();
        assert!(
            value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "{value}"
        );
        tags.insert(name.to_owned(), json!([value]));
    }
    assert_eq!(
        tags["campaign"],
        json!(["spring"]),
        "the message's own tag kept"
    );
    let now = Utc::now().to_rfc3339();
    let delivery = json!({
        "eventType": "Delivery",
        "mail": {"timestamp": now, "source": "herald@localhost", "messageId": "0100019ses0000",
                 "destination": ["ada@example.com"], "tags": tags},
        "delivery": {"timestamp": now, "recipients": ["ada@example.com"],
                     "smtpResponse": "250 2.6.0 Message received"}
    });
    let body = sns::sign(dir.path(), sns::notification("sns-corr-1", &delivery), "2");
    let r = ingest(
        &app,
        "ses",
        &[("x-amz-sns-message-type", "Notification".to_owned())],
        body,
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_correlated(&app, "ses", "delivered").await;
    app.stop().await;
}

/// Resend's SMTP relay documents no tag header (its webhooks echo `tags` set through its API
/// only), so nothing is invented: the event id goes as `Resend-Idempotency-Key`, which Resend's
/// SMTP relay documents, and a retry of the same event id is deduplicated by Resend itself.
async fn resend_gets_the_idempotency_key(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(backend, &relay_app_toml(&sink, "resend", "")).await;
    let raw = send_one(
        &app,
        &sink,
        EVENT,
        json!({"subject": "Hi", "text": "Hello"}),
    )
    .await;
    assert_eq!(
        header(&raw, "Resend-Idempotency-Key").as_deref(),
        Some(EVENT)
    );
    assert_eq!(header(&raw, "X-Herald-Event-Id").as_deref(), Some(EVENT));
    for other in ["X-SMTPAPI", "X-Mailgun-Variables", "X-SES-MESSAGE-TAGS"] {
        assert_eq!(header(&raw, other), None, "{other}");
    }
    app.stop().await;
}

/// Without `smtp_provider`, no relay header at all.
async fn without_a_provider_no_relay_header_is_written(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(backend, &format!("smtp_url = \"{}\"\n", sink.url)).await;
    let raw = send_one(
        &app,
        &sink,
        EVENT,
        json!({"subject": "Hi", "text": "Hello"}),
    )
    .await;
    for other in [
        "X-SMTPAPI",
        "X-Mailgun-Variables",
        "X-PM-Metadata-herald_event_id",
        "X-SES-MESSAGE-TAGS",
        "Resend-Idempotency-Key",
    ] {
        assert_eq!(header(&raw, other), None, "{other}");
    }
    assert_eq!(header(&raw, "X-Herald-Event-Id").as_deref(), Some(EVENT));
    app.stop().await;
}

/// Text, html, two attachments and one-click unsubscribe, as a mail client reads them.
async fn attachments_and_list_unsubscribe_reach_the_wire(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(backend, &format!("smtp_url = \"{}\"\n", sink.url)).await;
    let binary: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    let raw = send_one(
        &app,
        &sink,
        "with-attachments",
        json!({
            "subject": "Your invoice", "text": "Invoice attached.", "html": "<p>Invoice attached.</p>",
            "list_unsubscribe": "<https://example.com/u/42?l=a,b>, <mailto:unsubscribe@example.com?subject=42>",
            "list_unsubscribe_post": true,
            "attachments": [
                {"filename": "../../invoice 42.pdf", "content_type": "application/pdf",
                 "content_base64": b64(&binary)},
                {"filename": "C:\\tmp\\\"rows\".csv", "content_type": "text/csv; charset=utf-8",
                 "content_base64": b64(b"a,b\r\n1,2\r\n")},
            ],
        }),
    )
    .await;
    let m = MessageParser::default().parse(raw.as_bytes()).unwrap();
    assert_eq!(m.subject(), Some("Your invoice"));
    assert_eq!(
        m.body_text(0).as_deref().map(str::trim),
        Some("Invoice attached.")
    );
    assert_eq!(
        m.body_html(0).as_deref().map(str::trim),
        Some("<p>Invoice attached.</p>")
    );
    assert_eq!(
        m.message_id(),
        Some(
            herald::channels::email::message_id("with-attachments", "herald.localhost")
                .trim_matches(['<', '>'])
        )
    );
    let attachments: Vec<_> = m.attachments().collect();
    assert_eq!(attachments.len(), 2);
    assert_eq!(attachments[0].attachment_name(), Some("invoice 42.pdf"));
    let ct = attachments[0].content_type().unwrap();
    assert_eq!((ct.ctype(), ct.subtype()), ("application", Some("pdf")));
    assert_eq!(attachments[0].contents(), binary.as_slice());
    assert_eq!(attachments[1].attachment_name(), Some("_rows_.csv"));
    let ct = attachments[1].content_type().unwrap();
    assert_eq!((ct.ctype(), ct.subtype()), ("text", Some("csv")));
    assert_eq!(attachments[1].contents(), b"a,b\r\n1,2\r\n");
    let raw_header = |name: &str| {
        m.header_raw(name)
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
    };
    assert_eq!(
        raw_header("List-Unsubscribe").as_deref(),
        Some("<https://example.com/u/42?l=a,b>, <mailto:unsubscribe@example.com?subject=42>")
    );
    assert_eq!(
        raw_header("List-Unsubscribe-Post").as_deref(),
        Some("List-Unsubscribe=One-Click")
    );
    app.stop().await;
}

/// No CR or LF outside a CRLF reaches the SMTP server, whatever the payload holds: a text with
/// lone CRs, and a text attachment built to end the content early on a relay that takes a bare
/// LF for a line end ("SMTP smuggling"). The text keeps its lines; the attachment goes in base64
/// and arrives byte for byte; one message arrives, nothing after it.
async fn no_bare_line_end_reaches_the_wire(backend: Backend) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(backend, &format!("smtp_url = \"{}\"\n", sink.url)).await;
    let smuggled = b"x\n.\r\nMAIL FROM:<ceo@bank.example>\r\nRCPT TO:<victim@example.com>\r\n\
                     DATA\r\nforged\r\n.\r\n";
    let raw = send_one(
        &app,
        &sink,
        "smuggle-1",
        json!({
            "subject": "Report", "text": "line one\rline two\n.\rend",
            "attachments": [
                {"filename": "report.txt", "content_type": "text/plain", "content_base64": b64(smuggled)},
            ],
        }),
    )
    .await;
    assert_eq!(
        herald::channels::email::bare_line_end(raw.as_bytes()),
        None,
        "{raw:?}"
    );
    let m = MessageParser::default().parse(raw.as_bytes()).unwrap();
    let text = m.body_text(0).unwrap();
    assert_eq!(
        text.lines().map(str::trim_end).collect::<Vec<_>>(),
        ["line one", "line two", ".", "end"]
    );
    let attachments: Vec<_> = m.attachments().collect();
    assert_eq!(attachments[0].contents(), smuggled);
    assert!(raw.contains("Content-Transfer-Encoding: base64"));
    assert_eq!(sink.received().len(), 1);
    app.stop().await;
}

/// Each invalid field is a 422 naming it, and nothing is stored; the attachment limit is 1 MiB
/// decoded when `max_payload_bytes` leaves room for it.
async fn invalid_payload_fields_are_422_naming_the_field(backend: Backend) {
    let app = spawn_app_with(backend, "max_payload_bytes = 2000000\n").await;
    let ok_attachment =
        json!({"filename": "a.txt", "content_type": "text/plain", "content_base64": "YQ=="});
    let with = |k: &str, v: Value| {
        let mut p = json!({"subject": "s", "text": "t"});
        p[k] = v;
        p
    };
    let attachment = |k: &str, v: Value| {
        let mut a = ok_attachment.clone();
        a[k] = v;
        with("attachments", json!([ok_attachment.clone(), a]))
    };
    let big = |n: usize| {
        with(
            "attachments",
            json!([{"filename": "big.bin", "content_type": "application/octet-stream",
                    "content_base64": b64(&vec![1u8; n])}]),
        )
    };
    let cases = [
        (
            attachment("content_base64", json!("%%%")),
            "payload.attachments[1].content_base64",
        ),
        (
            attachment("content_type", json!("multipart/mixed")),
            "payload.attachments[1].content_type",
        ),
        (
            attachment("content_type", json!("nonsense")),
            "payload.attachments[1].content_type",
        ),
        (
            attachment("filename", json!("../")),
            "payload.attachments[1].filename",
        ),
        (attachment("size", json!(1)), "payload.attachments[1].size"),
        (with("attachments", json!({"a": 1})), "payload.attachments"),
        (big(1024 * 1024 + 1), "payload.attachments"),
        (
            with("list_unsubscribe", json!("https://example.com/u")),
            "payload.list_unsubscribe",
        ),
        (
            with("list_unsubscribe", json!("<ftp://example.com/u>")),
            "payload.list_unsubscribe",
        ),
        (
            with("list_unsubscribe_post", json!(true)),
            "payload.list_unsubscribe_post",
        ),
        (
            json!({"subject": "s", "text": "t", "list_unsubscribe": "<mailto:u@example.com>",
                   "list_unsubscribe_post": true}),
            "payload.list_unsubscribe_post",
        ),
        (
            with("headers", json!({"X-SMTPAPI": "not json"})),
            "payload.headers.X-SMTPAPI",
        ),
        // A header of its own smuggled in through a custom header's name.
        (
            with(
                "headers",
                json!({"X-A\r\nReply-To": "attacker@evil.example"}),
            ),
            "payload.headers",
        ),
        // Runs that no header can fold under SMTP's line limit.
        (with("subject", json!("A".repeat(1200))), "payload.subject"),
        (
            with("from", json!(format!("{} <a@b.example>", "N".repeat(1100)))),
            "payload.from",
        ),
        (
            attachment(
                "content_type",
                json!(format!("text/plain; x={}", "a".repeat(1000))),
            ),
            "payload.attachments[1].content_type",
        ),
    ];
    for (i, (payload, field)) in cases.into_iter().enumerate() {
        let id = format!("bad-{i}");
        let r = post_email(&app, &id, payload).await;
        assert_eq!(r.status(), 422, "{field}");
        let p: Value = r.json().await.unwrap();
        assert_eq!(p["field"], field, "{p}");
        let lookup = app
            .http
            .get(format!("{}/v1/messages/{id}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(lookup.status(), 404, "{id} was not stored");
    }
    // Exactly at the limit is accepted.
    assert_eq!(
        post_email(&app, "at-limit", big(1024 * 1024))
            .await
            .status(),
        201
    );
    app.stop().await;
    // With the default max_payload_bytes (256 KiB) the payload limit comes first: the request
    // is refused as too large before its fields are looked at.
    let app = spawn_app_with(backend, "").await;
    assert_eq!(
        post_email(&app, "too-big", big(300 * 1024)).await.status(),
        413
    );
    app.stop().await;
}

/// A row the application inserted by plain SQL with an address that is none, or a payload that
/// cannot build: `dead_letter`, `permanent`, and the SMTP server never sees a connection.
async fn a_malformed_address_inserted_by_sql_is_dead_lettered_without_a_connection(
    backend: Backend,
) {
    let sink = SmtpSink::start().await;
    let app = spawn_app_with(backend, &format!("smtp_url = \"{}\"\n", sink.url)).await;
    app.raw_sql(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) VALUES \
         ('sql-bad-address', 'email', 'not an address', '{\"subject\": \"s\", \"text\": \"t\"}'), \
         ('sql-bad-attachment', 'email', 'ada@example.com', \
          '{\"subject\": \"s\", \"text\": \"t\", \"attachments\": [{\"filename\": \"a\", \
          \"content_type\": \"text/plain\", \"content_base64\": \"%%%\"}]}')",
    );
    assert_eq!(app.run_until_idle().await, 2);
    for (id, field) in [
        ("sql-bad-address", "destination"),
        (
            "sql-bad-attachment",
            "payload.attachments[0].content_base64",
        ),
    ] {
        let view = app.message(id).await;
        assert_eq!(
            (view["state"].as_str(), view["last_error_class"].as_str()),
            (Some("dead_letter"), Some("permanent")),
            "{id}: {view}"
        );
        let attempts = app.attempts(id);
        assert_eq!(attempts.len(), 1, "{id}");
        assert_eq!(attempts[0].class.to_string(), "permanent");
        assert_eq!(attempts[0].error_kind.as_deref(), Some("invalid_payload"));
        assert!(
            attempts[0]
                .response_excerpt
                .as_deref()
                .is_some_and(|e| e.starts_with(field)),
            "{id}: {:?}",
            attempts[0].response_excerpt
        );
    }
    assert_eq!(sink.connections(), 0, "no SMTP connection for either");
    // The sink was there all along: a valid row reaches it.
    app.raw_sql(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) VALUES \
         ('sql-good', 'email', 'ada@example.com', '{\"subject\": \"s\", \"text\": \"t\"}')",
    );
    assert_eq!(app.run_until_idle().await, 1);
    sink.wait_for_mail(1, Duration::from_secs(10)).await;
    assert_eq!(sink.connections(), 1);
    app.stop().await;
}

/// A DKIM record (`v=DKIM1; k=…; p=…`) for the key in `dir/key.pem`.
fn dkim_record(dir: &Path, kind: &str) -> String {
    sns::openssl(
        dir,
        &[
            "pkey", "-in", "key.pem", "-pubout", "-outform", "DER", "-out", "pub.der",
        ],
    );
    let spki = std::fs::read(dir.join("pub.der")).unwrap();
    let p = match kind {
        // RFC 8463: the bare 32-byte public key.
        "ed25519" => b64(&spki[spki.len() - 32..]),
        _ => b64(&spki),
    };
    format!("v=DKIM1; k={kind}; p={p}")
}

/// dkimpy (Debian's python3-dkim, installed by scripts/install-deps) verifies `eml` with `record`
/// served as the TXT record of `herald._domainkey.example.com`, and nothing from the network.
fn dkimpy_verifies(dir: &Path, eml: &[u8], record: &str) -> bool {
    std::fs::write(dir.join("m.eml"), eml).unwrap();
    std::fs::write(dir.join("record.txt"), record).unwrap();
    let script = "import sys, dkim\n\
        msg = open(sys.argv[1], 'rb').read()\n\
        rec = open(sys.argv[2], 'rb').read()\n\
        def dns(name, timeout=5):\n\
        \x20   return rec if name.rstrip(b'.') == b'herald._domainkey.example.com' else None\n\
        sys.exit(0 if dkim.verify(msg, dnsfunc=dns) else 3)\n";
    let out = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(script)
        .arg(dir.join("m.eml"))
        .arg(dir.join("record.txt"))
        .output()
        .expect("/usr/bin/python3 (scripts/install-deps installs python3-dkim)");
    match out.status.code() {
        Some(0) => true,
        Some(3) => false,
        _ => panic!(
            "dkimpy did not run (scripts/install-deps installs python3-dkim): {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Each key kind (Ed25519 PKCS#8, RSA PKCS#8, RSA PKCS#1): the signature header is well-formed,
/// covers the headers that matter, and verifies with the public key; a changed subject does not.
async fn dkim_signatures_verify_with_the_public_key(backend: Backend) {
    for (kind, genkey) in [
        (
            "ed25519",
            &["genpkey", "-algorithm", "ed25519", "-out", "key.pem"][..],
        ),
        (
            "rsa",
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
                "key.pem",
            ][..],
        ),
        (
            "rsa",
            &["genrsa", "-traditional", "-out", "key.pem", "2048"][..],
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        sns::openssl(dir.path(), genkey);
        let pem = std::fs::read_to_string(dir.path().join("key.pem")).unwrap();
        let mail_dir = dir.path().join("mail");
        let app = spawn_app_with(
            backend,
            &format!(
                "mail_dir = {:?}\ndkim_selector = \"herald\"\ndkim_domain = \"example.com\"\n\
                 dkim_key_file = {:?}\nmail_from = \"Herald <herald@example.com>\"\n",
                mail_dir.display().to_string(),
                dir.path().join("key.pem").display().to_string()
            ),
        )
        .await;
        let shown = format!("{:?}", app.herald.settings);
        let key_line = pem.lines().nth(1).unwrap();
        assert!(!shown.contains(key_line), "the key never shows");
        let r = post_email(
            &app,
            "signed",
            json!({"subject": "Signed", "text": "Hello", "html": "<p>Hello</p>",
                   "list_unsubscribe": "<https://example.com/u/1>", "list_unsubscribe_post": true,
                   "attachments": [{"filename": "a.txt", "content_type": "text/plain",
                                    "content_base64": b64(b"attached")}]}),
        )
        .await;
        assert_eq!(r.status(), 201);
        assert_eq!(app.run_until_idle().await, 1);
        assert_eq!(app.message("signed").await["state"], "delivered");
        let file = std::fs::read_dir(&mail_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "eml"))
            .unwrap();
        let eml = std::fs::read(&file).unwrap();
        let text = String::from_utf8(eml.clone()).unwrap();
        let sig = header(&text, "DKIM-Signature").expect("a DKIM-Signature header");
        let tags: std::collections::BTreeMap<String, String> = sig
            .split(';')
            .filter_map(|t| t.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.split_whitespace().collect()))
            .collect();
        assert_eq!(tags["v"], "1");
        assert_eq!(tags["a"], format!("{kind}-sha256"));
        assert_eq!(
            (tags["d"].as_str(), tags["s"].as_str()),
            ("example.com", "herald")
        );
        assert_eq!(tags["c"], "relaxed/relaxed");
        let signed: Vec<&str> = tags["h"].split(':').collect();
        for h in [
            "from",
            "to",
            "subject",
            "date",
            "message-id",
            "list-unsubscribe",
            "list-unsubscribe-post",
        ] {
            assert!(signed.contains(&h), "{h} in h={}", tags["h"]);
        }
        for t in ["bh", "b"] {
            assert!(
                base64::engine::general_purpose::STANDARD
                    .decode(&tags[t])
                    .is_ok_and(|b| !b.is_empty()),
                "{t}= is base64"
            );
        }
        let record = dkim_record(dir.path(), kind);
        assert!(
            dkimpy_verifies(dir.path(), &eml, &record),
            "{kind}: verifies"
        );
        let tampered = text.replacen("Subject: Signed", "Subject: Signed!", 1);
        assert_ne!(tampered, text);
        assert!(
            !dkimpy_verifies(dir.path(), tampered.as_bytes(), &record),
            "{kind}: a changed subject does not verify"
        );
        // Nor does a header added above the signed one (each signed field is listed once more
        // than it occurs, RFC 6376 §8.15): a prepended Subject kept the signature valid.
        for added in [
            "Subject: Urgent: wire the money\r\n",
            "To: mallory@example.net\r\n",
        ] {
            let prepended = format!("{added}{text}");
            assert!(
                !dkimpy_verifies(dir.path(), prepended.as_bytes(), &record),
                "{kind}: {added:?} added, and it verifies"
            );
        }
        app.stop().await;
    }
}

both_backends!(
    sendgrid_correlation_round_trips,
    mailgun_correlation_round_trips,
    postmark_correlation_round_trips,
    ses_correlation_round_trips,
    resend_gets_the_idempotency_key,
    without_a_provider_no_relay_header_is_written,
    attachments_and_list_unsubscribe_reach_the_wire,
    no_bare_line_end_reaches_the_wire,
    invalid_payload_fields_are_422_naming_the_field,
    a_malformed_address_inserted_by_sql_is_dead_lettered_without_a_connection,
    dkim_signatures_verify_with_the_public_key,
);
