//! SMS delivery receipts end to end, on both backends: a message goes out through an endpoint
//! that answers with the provider's message id (as an SMS provider's send API does), then the
//! provider's signed receipts — built here the way each provider signs them — arrive out of
//! order through `GET`/`POST /v1/ingest/{source}`, are stored before the answer, deduplicated,
//! and the reconciler applies them by the provider's event time.

use base64::Engine;
use chrono::{DateTime, TimeZone, Utc};
use ed25519_dalek::Signer;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::both_backends;
use crate::support::app::{spawn_app_with, webhook};
use crate::support::{Backend, Receiver, Reply, TestApp};

const PUBLIC: &str = "https://herald.example/v1/ingest/sms";

/// An app with `source` (TOML for `[sources.sms]`) and an endpoint answering 202
/// `{"id": provider_id}`; message `id` has been sent through it, its provider id captured.
async fn sent_message(backend: Backend, source: &str, id: &str, pid: &str) -> (TestApp, Receiver) {
    let rx = Receiver::start().await;
    let app = spawn_app_with(
        backend,
        &format!(
            "[sources.sms]\n{source}\n[endpoints.sms]\nurl = \"{}\"\nprovider_message_id_pointer = \"/id\"\n",
            rx.url
        ),
    )
    .await;
    rx.script([Reply::Full(
        202,
        vec![("content-type".into(), "application/json".into())],
        format!(r#"{{"id": "{pid}"}}"#),
    )]);
    let r = app
        .post_message(webhook(id, "endpoint:sms", json!({"to": "+15550001"})))
        .await;
    assert_eq!(r.status(), 201);
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row(id).provider_message_id.as_deref(), Some(pid));
    (app, rx)
}

/// Sends one receipt request to `/v1/ingest/sms` (the query, if any, as given).
async fn ingest(
    app: &TestApp,
    get: bool,
    query: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> (u16, Value) {
    let url = format!("{}/v1/ingest/sms{query}", app.base);
    let mut r = if get {
        reqwest::Client::new().get(url)
    } else {
        reqwest::Client::new().post(url)
    }
    .body(body);
    for (n, v) in headers {
        r = r.header(*n, v);
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Reconciles and checks the message's delivery status and the event time that set it.
async fn delivery(app: &TestApp, id: &str) -> (String, Option<i64>) {
    app.herald.reconciler.run_until_idle().await.unwrap();
    let view = app.message(id).await;
    (
        view["delivery_status"].as_str().unwrap_or("").to_owned(),
        view["delivery_status_at"]
            .as_str()
            .map(|t| DateTime::parse_from_rfc3339(t).unwrap().timestamp()),
    )
}

fn form(pairs: &[(&str, String)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs.iter().map(|(k, v)| (*k, v.as_str())))
        .finish()
}

fn now(app: &TestApp) -> i64 {
    app.clock_now().timestamp()
}

// ---- Vonage ----

fn vonage_sms_query(pid: &str, status: &str, scts: DateTime<Utc>, t: i64) -> String {
    vonage_sms_query_ref(pid, status, scts, t, "a&b=c")
}

fn vonage_sms_query_ref(
    pid: &str,
    status: &str,
    scts: DateTime<Utc>,
    t: i64,
    client_ref: &str,
) -> String {
    let mut p = vec![
        ("messageId", pid.to_owned()),
        ("msisdn", "447700900000".to_owned()),
        ("status", status.to_owned()),
        ("scts", scts.format("%y%m%d%H%M").to_string()),
        ("timestamp", t.to_string()),
        ("client-ref", client_ref.to_owned()),
    ];
    let mut sorted = p.clone();
    sorted.sort();
    let signed: String = sorted
        .iter()
        .map(|(k, v)| format!("&{k}={}", v.replace(['&', '='], "_")))
        .collect();
    let mut mac = Hmac::<sha2::Sha512>::new_from_slice(b"vonage-sig-secret").unwrap();
    mac.update(signed.as_bytes());
    p.push(("sig", hex::encode_upper(mac.finalize().into_bytes())));
    format!("?{}", form(&p))
}

async fn vonage_sms_receipts_reconcile_by_scts(backend: Backend) {
    let (app, _rx) = sent_message(
        backend,
        "scheme = \"vonage\"\nsecrets = [\"vonage-sig-secret\"]\nsignature_method = \"sha512\"",
        "vn-1",
        "0A00000001",
    )
    .await;
    let t = now(&app);
    let minute = |ago: i64| Utc.timestamp_opt((t - ago) / 60 * 60, 0).unwrap();
    // The delivery receipt first, then the older "accepted" one.
    let delivered = vonage_sms_query("0A00000001", "delivered", minute(0), t);
    let accepted = vonage_sms_query("0A00000001", "accepted", minute(180), t);
    assert_eq!(
        ingest(&app, true, &delivered, &[], vec![]).await,
        (200, json!({"stored": 1, "duplicates": 0}))
    );
    assert_eq!(ingest(&app, true, &accepted, &[], vec![]).await.0, 200);
    assert_eq!(
        ingest(&app, true, &delivered, &[], vec![]).await.1,
        json!({"stored": 0, "duplicates": 1})
    );
    assert_eq!(
        delivery(&app, "vn-1").await,
        ("delivered".into(), Some(minute(0).timestamp()))
    );
    // The same request as a POST form is verified alike; a source for md5 refuses it.
    let body = delivered.trim_start_matches('?').as_bytes().to_vec();
    let form_header = [(
        "content-type",
        "application/x-www-form-urlencoded".to_owned(),
    )];
    assert_eq!(
        ingest(&app, false, "", &form_header, body).await.1,
        json!({"stored": 0, "duplicates": 1})
    );
    let stored = app.db.receipts_of_source("sms").unwrap();
    assert!(
        stored.iter().all(|r| r.raw.get("sig").is_none()),
        "the signature is not kept"
    );
    app.stop().await;
}

/// A send that left no provider id (the provider answered 409: `unconfirmed`) is settled by a
/// receipt that echoes Herald's event id in the send's `client-ref`, which the application put
/// in the body; a `client-ref` naming no message leaves the provider id to match by.
async fn an_unconfirmed_sms_is_settled_by_its_client_ref(backend: Backend) {
    let rx = Receiver::start().await;
    let app = spawn_app_with(
        backend,
        &format!(
            "[sources.sms]\nscheme = \"vonage\"\nsecrets = [\"vonage-sig-secret\"]\n\
             signature_method = \"sha512\"\n[endpoints.sms]\nurl = \"{}\"\n\
             provider_message_id_pointer = \"/id\"\n",
            rx.url
        ),
    )
    .await;
    rx.script([Reply::Status(409)]);
    let r = app
        .post_message(webhook(
            "otp-7",
            "endpoint:sms",
            json!({"to": "+15550001", "client-ref": "otp-7"}),
        ))
        .await;
    assert_eq!(r.status(), 201);
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(app.row("otp-7").state.as_str(), "unconfirmed");
    assert_eq!(app.row("otp-7").provider_message_id, None);
    let t = now(&app);
    let minute = Utc.timestamp_opt(t / 60 * 60, 0).unwrap();
    let q = vonage_sms_query_ref("0A000000F7", "delivered", minute, t, "otp-7");
    assert_eq!(ingest(&app, true, &q, &[], vec![]).await.0, 200);
    assert_eq!(
        delivery(&app, "otp-7").await,
        ("delivered".into(), Some(minute.timestamp()))
    );
    assert_eq!(app.row("otp-7").state.as_str(), "delivered", "settled");
    // An application reference that is another message's event id does not take the receipt
    // there: the provider's id, when it names a message, comes first (found by a review).
    assert_eq!(
        app.post_message(webhook("order-42", &rx.url, json!({})))
            .await
            .status(),
        201
    );
    rx.script([
        Reply::Status(200),
        Reply::Full(
            202,
            vec![("content-type".into(), "application/json".into())],
            r#"{"id": "0A000000F8"}"#.into(),
        ),
    ]);
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(
        app.post_message(webhook(
            "sms-2",
            "endpoint:sms",
            json!({"to": "+15550002", "client-ref": "order-42"}),
        ))
        .await
        .status(),
        201
    );
    assert_eq!(app.run_until_idle().await, 1);
    assert_eq!(
        app.row("sms-2").provider_message_id.as_deref(),
        Some("0A000000F8")
    );
    let q = vonage_sms_query_ref("0A000000F8", "delivered", minute, t, "order-42");
    assert_eq!(ingest(&app, true, &q, &[], vec![]).await.0, 200);
    assert_eq!(delivery(&app, "sms-2").await.0, "delivered");
    assert_eq!(
        app.message("order-42").await["delivery_status"],
        Value::Null
    );
    app.stop().await;
}

fn vonage_jwt(body: &[u8], iat: i64) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({
            "iat": iat, "jti": format!("jti-{iat}"), "iss": "Vonage",
            "payload_hash": hex::encode(Sha256::digest(body)), "api_key": "a1b2c3d",
        }),
        &jsonwebtoken::EncodingKey::from_secret(b"vonage-sig-secret"),
    )
    .unwrap()
}

async fn vonage_messages_statuses_reconcile_by_timestamp(backend: Backend) {
    let uuid = "aaaaaaaa-bbbb-cccc-dddd-0123456789ab";
    let (app, _rx) = sent_message(
        backend,
        "scheme = \"vonage\"\nsecrets = [\"old-secret\", \"vonage-sig-secret\"]",
        "vn-2",
        uuid,
    )
    .await;
    let t = now(&app);
    let status = |s: &str, at: i64| {
        serde_json::to_vec(&json!({
            "message_uuid": uuid, "to": "447700900000", "from": "Herald", "channel": "sms",
            "status": s, "timestamp": Utc.timestamp_opt(at, 0).unwrap().to_rfc3339(),
        }))
        .unwrap()
    };
    for (s, at) in [("delivered", t - 5), ("submitted", t - 30)] {
        let body = status(s, at);
        let auth = [
            ("authorization", format!("Bearer {}", vonage_jwt(&body, t))),
            ("content-type", "application/json".to_owned()),
        ];
        assert_eq!(ingest(&app, false, "", &auth, body).await.0, 200, "{s}");
    }
    // A body that is not the one the token hashed: refused, nothing stored.
    let auth = [(
        "authorization",
        format!("Bearer {}", vonage_jwt(&status("read", t), t)),
    )];
    assert_eq!(
        ingest(&app, false, "", &auth, status("rejected", t))
            .await
            .0,
        401
    );
    assert_eq!(app.db.receipts_of_source("sms").unwrap().len(), 2);
    assert_eq!(
        delivery(&app, "vn-2").await,
        ("delivered".into(), Some(t - 5))
    );
    app.stop().await;
}

// ---- Telnyx ----

/// RFC 8032 §7.1 TEST 1.
fn telnyx_key() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(
        &hex::decode("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
            .unwrap()
            .try_into()
            .unwrap(),
    )
}

fn telnyx_request(
    event: &str,
    status: &str,
    at: i64,
    t: i64,
) -> (Vec<(&'static str, String)>, Vec<u8>) {
    let body = serde_json::to_vec(&json!({"data": {
        "record_type": "event", "id": format!("ev-{event}"), "event_type": event,
        "occurred_at": Utc.timestamp_opt(at, 0).unwrap().to_rfc3339(),
        "payload": {"id": "tx-msg-1", "to": [{"phone_number": "+15550001", "status": status}]},
    }}))
    .unwrap();
    let mut signed = format!("{t}|").into_bytes();
    signed.extend_from_slice(&body);
    let sig =
        base64::engine::general_purpose::STANDARD.encode(telnyx_key().sign(&signed).to_bytes());
    (
        vec![
            ("telnyx-signature-ed25519", sig),
            ("telnyx-timestamp", t.to_string()),
            ("content-type", "application/json".to_owned()),
        ],
        body,
    )
}

async fn telnyx_events_reconcile_by_occurred_at(backend: Backend) {
    let public =
        base64::engine::general_purpose::STANDARD.encode(telnyx_key().verifying_key().to_bytes());
    let (app, _rx) = sent_message(
        backend,
        &format!("scheme = \"telnyx\"\nsecrets = [\"{public}\"]"),
        "tx-1",
        "tx-msg-1",
    )
    .await;
    let t = now(&app);
    let (h, b) = telnyx_request("message.finalized", "delivery_failed", t - 2, t);
    assert_eq!(ingest(&app, false, "", &h, b.clone()).await.0, 200);
    let (h2, b2) = telnyx_request("message.sent", "sent", t - 20, t);
    assert_eq!(ingest(&app, false, "", &h2, b2).await.0, 200);
    assert_eq!(
        ingest(&app, false, "", &h, b).await.1,
        json!({"stored": 0, "duplicates": 1}),
        "data.id deduplicates"
    );
    assert_eq!(delivery(&app, "tx-1").await, ("failed".into(), Some(t - 2)));
    // An incoming message at the profile's URL, signed: no receipt, a 400 naming it, nothing
    // stored (it holds the sender's number and text).
    let (h3, b3) = telnyx_request("message.received", "webhook_delivered", t - 1, t);
    let (status, problem) = ingest(&app, false, "", &h3, b3).await;
    assert_eq!(status, 400, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("message.received")),
        "{problem}"
    );
    assert_eq!(
        app.message("tx-1").await["receipts"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    app.stop().await;
}

// ---- Plivo ----

fn plivo_request(status: &str, at: &str, nonce: &str) -> (Vec<(&'static str, String)>, Vec<u8>) {
    let mut p = vec![
        ("MessageUUID", "pl-uuid-1".to_owned()),
        ("Status", status.to_owned()),
        ("To", "15550001".to_owned()),
        ("From", "15550002".to_owned()),
        ("ErrorCode", String::new()),
    ];
    p.push((
        if status == "sent" {
            "SentTime"
        } else {
            "DeliveryReportTime"
        },
        at.to_owned(),
    ));
    let mut sorted = p.clone();
    sorted.sort();
    let signed = format!(
        "{PUBLIC}?{}.{nonce}",
        sorted
            .iter()
            .map(|(k, v)| format!("{k}{v}"))
            .collect::<String>()
    );
    let mut mac = Hmac::<Sha256>::new_from_slice(b"plivo-auth-token").unwrap();
    mac.update(signed.as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    (
        vec![
            ("x-plivo-signature-v3", sig),
            ("x-plivo-signature-v3-nonce", nonce.to_owned()),
            (
                "content-type",
                "application/x-www-form-urlencoded".to_owned(),
            ),
        ],
        form(&p).into_bytes(),
    )
}

async fn plivo_callbacks_reconcile_and_a_reused_nonce_is_a_replay(backend: Backend) {
    let (app, _rx) = sent_message(
        backend,
        &format!("scheme = \"plivo\"\nsecrets = [\"plivo-auth-token\"]\npublic_url = \"{PUBLIC}\""),
        "pl-1",
        "pl-uuid-1",
    )
    .await;
    let (h, b) = plivo_request("delivered", "2026-01-02 03:04:05.500000", "1001");
    assert_eq!(ingest(&app, false, "", &h, b.clone()).await.0, 200);
    let (h2, b2) = plivo_request("sent", "2026-01-02 03:04:00.000000", "1002");
    assert_eq!(ingest(&app, false, "", &h2, b2).await.0, 200);
    // Plivo again with the same request (its retry): a duplicate.
    assert_eq!(
        ingest(&app, false, "", &h, b).await.1,
        json!({"stored": 0, "duplicates": 1})
    );
    // Another event under a nonce already used: a replay, refused and never stored.
    let (h3, b3) = plivo_request("undelivered", "2026-01-02 03:05:00.000000", "1001");
    let (status, problem) = ingest(&app, false, "", &h3, b3).await;
    assert_eq!(status, 401, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("replay"),
        "{problem}"
    );
    assert_eq!(app.db.receipts_of_source("sms").unwrap().len(), 2);
    let at = Utc
        .with_ymd_and_hms(2026, 1, 2, 3, 4, 5)
        .unwrap()
        .timestamp();
    assert_eq!(delivery(&app, "pl-1").await, ("delivered".into(), Some(at)));
    app.stop().await;
}

// ---- MessageBird ----

fn messagebird_get(status: &str, at: &str, now: i64) -> (String, Vec<(&'static str, String)>) {
    let query = form(&[
        ("id", "mb-msg-1".to_owned()),
        ("recipient", "31612345678".to_owned()),
        ("status", status.to_owned()),
        ("statusDatetime", at.to_owned()),
    ]);
    let url = format!("{PUBLIC}?{query}");
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS384),
        &json!({
            "iss": "MessageBird", "nbf": now, "exp": now + 60, "jti": format!("j-{status}"),
            "url_hash": hex::encode(Sha256::digest(url.as_bytes())),
        }),
        &jsonwebtoken::EncodingKey::from_secret(b"mb-signing-key"),
    )
    .unwrap();
    (
        format!("?{query}"),
        vec![("messagebird-signature-jwt", token)],
    )
}

async fn messagebird_status_reports_arrive_as_get_and_reconcile(backend: Backend) {
    let (app, _rx) = sent_message(
        backend,
        &format!(
            "scheme = \"messagebird\"\nsecrets = [\"mb-signing-key\"]\npublic_url = \"{PUBLIC}\""
        ),
        "mb-1",
        "mb-msg-1",
    )
    .await;
    let t = now(&app);
    let at = |ago: i64| Utc.timestamp_opt(t - ago, 0).unwrap().to_rfc3339();
    let (q, h) = messagebird_get("delivered", &at(3), t);
    assert_eq!(ingest(&app, true, &q, &h, vec![]).await.0, 200);
    let (q2, h2) = messagebird_get("buffered", &at(40), t);
    assert_eq!(ingest(&app, true, &q2, &h2, vec![]).await.0, 200);
    // The token signs the URL: the same token with another query is refused.
    let (q3, _) = messagebird_get("delivery_failed", &at(1), t);
    assert_eq!(ingest(&app, true, &q3, &h, vec![]).await.0, 401);
    // And a minute later the token has expired.
    app.advance(std::time::Duration::from_secs(62));
    assert_eq!(ingest(&app, true, &q, &h, vec![]).await.0, 401);
    assert_eq!(
        delivery(&app, "mb-1").await,
        ("delivered".into(), Some(t - 3))
    );
    app.stop().await;
}

/// A GET receipt is acknowledged only once stored: with the database down it is a 503.
#[actix_web::test]
async fn a_get_receipt_with_storage_down_is_503() {
    let app = spawn_app_with(
        Backend::Sqlite,
        &format!("[sources.sms]\nscheme = \"messagebird\"\nsecrets = [\"mb-signing-key\"]\npublic_url = \"{PUBLIC}\"\n"),
    )
    .await;
    let t = now(&app);
    let (q, h) = messagebird_get(
        "delivered",
        &Utc.timestamp_opt(t, 0).unwrap().to_rfc3339(),
        t,
    );
    let mut req = actix_web::test::TestRequest::get().uri(&format!("/v1/ingest/sms{q}"));
    for (n, v) in h {
        req = req.insert_header((n, v));
    }
    let resp = crate::support::app::call_with_storage_down(&app, vec![req]).await;
    assert_eq!(resp[0].status(), 503);
    assert!(resp[0].headers().contains_key("retry-after"));
    app.stop().await;
}

both_backends!(
    vonage_sms_receipts_reconcile_by_scts,
    vonage_messages_statuses_reconcile_by_timestamp,
    telnyx_events_reconcile_by_occurred_at,
    an_unconfirmed_sms_is_settled_by_its_client_ref,
    plivo_callbacks_reconcile_and_a_reused_nonce_is_a_replay,
    messagebird_status_reports_arrive_as_get_and_reconcile
);
