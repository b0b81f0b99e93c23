//! Receipt ingest through `POST /v1/ingest/{source}` on both backends: verify, persist before
//! acknowledging, deduplicate, refuse what does not verify.

use chrono::{TimeZone, Utc};
use herald::crypto::signing::SigningKey;
use herald::metrics::ReceiptVerdict;
use serde_json::{Value, json};

use crate::both_backends;
use crate::support::Backend;
use crate::support::app::{TestApp, spawn_app_with};

const RESEND: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn sources() -> String {
    format!(
        "ingest_max_body_bytes = 4096\n\
         [sources.resend]\nscheme = \"standard-webhooks\"\nsecrets = [\"whsec_b2xkc2VjcmV0b2xkc2VjcmV0b2xkc2VjcmV0\", \"{RESEND}\"]\n\
         [sources.pm]\nscheme = \"postmark\"\nusername = \"hook\"\npassword = \"s3cret\"\n"
    )
}

async fn post(
    app: &TestApp,
    source: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> reqwest::Response {
    let mut r = app
        .http
        .post(format!("{}/v1/ingest/{source}", app.base))
        .body(body.to_vec());
    for (n, v) in headers {
        r = r.header(*n, v);
    }
    r.send().await.expect("POST /v1/ingest")
}

fn resend_headers(id: &str, t: i64, body: &[u8]) -> Vec<(&'static str, String)> {
    let sig = SigningKey::parse(RESEND).unwrap().sign(id, t, body);
    vec![
        ("svix-id", id.to_owned()),
        ("svix-timestamp", t.to_string()),
        ("svix-signature", sig),
    ]
}

async fn receipts_are_stored_before_the_answer_and_deduplicated(backend: Backend) {
    let app = spawn_app_with(backend, &sources()).await;
    let body = serde_json::to_vec(&json!({
        "type": "email.delivered", "created_at": "2026-11-30T10:00:00.000Z",
        "data": {"email_id": "em_1", "tags": {"herald_event_id": "order-1:placed"}}
    }))
    .unwrap();
    let now = Utc::now().timestamp();
    let r = post(&app, "resend", &resend_headers("msg_1", now, &body), &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"stored": 1, "duplicates": 0})
    );
    // The provider retries the same event: acknowledged again, stored once, counted.
    let r = post(&app, "resend", &resend_headers("msg_1", now, &body), &body).await;
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"stored": 0, "duplicates": 1})
    );
    let rows = app.db.receipts_of_source("resend").unwrap();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(
        (row.provider_event_id.as_str(), row.event_type.as_str()),
        ("msg_1", "delivered")
    );
    assert_eq!(row.provider_type, "email.delivered");
    assert_eq!(
        row.event_time,
        Some(Utc.with_ymd_and_hms(2026, 11, 30, 10, 0, 0).unwrap())
    );
    assert_eq!(row.herald_event_id.as_deref(), Some("order-1:placed"));
    assert_eq!(row.provider_message_id.as_deref(), Some("em_1"));
    assert_eq!(row.raw["data"]["email_id"], "em_1");
    assert_eq!(
        app.herald
            .metrics
            .receipts_count("resend", ReceiptVerdict::Duplicate),
        1
    );
    // A NUL in a provider's free text (PostgreSQL refuses it in text and JSONB) is still stored.
    let nul =
        br#"{"type":"email.bounced","data":{"email_id":"em_2","diagnostic":"550 \u0000 no"}}"#;
    let r = post(&app, "resend", &resend_headers("msg_nul", now, nul), nul).await;
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"stored": 1, "duplicates": 0})
    );
    // A signed year before 1 (PostgreSQL refuses a time before 4713 BC, and with it the group
    // commit the receipt is in: a 503 once): stored, without an event time.
    let ancient = br#"{"type":"email.delivered","created_at":"-5000-01-01 00:00:00+00","data":{"email_id":"em_3"}}"#;
    let r = post(
        &app,
        "resend",
        &resend_headers("msg_old", now, ancient),
        ancient,
    )
    .await;
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"stored": 1, "duplicates": 0})
    );
    // An id too long for an index entry (PostgreSQL refused it, and the group with it): 400
    // naming it, nothing stored.
    let long = "m".repeat(3000);
    let r = post(&app, "resend", &resend_headers(&long, now, &body), &body).await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["field"], "webhook-id");
    let mut rows = app.db.receipts_of_source("resend").unwrap();
    rows.sort_by(|a, b| a.provider_event_id.cmp(&b.provider_event_id));
    let ids: Vec<_> = rows.iter().map(|r| r.provider_event_id.as_str()).collect();
    assert_eq!(ids, ["msg_1", "msg_nul", "msg_old"]);
    assert_eq!(rows[2].event_time, None);
    app.stop().await;
}

async fn what_does_not_verify_is_refused_and_not_stored(backend: Backend) {
    let app = spawn_app_with(backend, &sources()).await;
    let body = br#"{"type":"email.bounced","created_at":"2026-11-30T10:00:00Z","data":{}}"#;
    let now = Utc::now().timestamp();
    // Wrong signature.
    let mut h = resend_headers("msg_bad", now, body);
    h[2].1 = SigningKey::parse(&SigningKey::generate())
        .unwrap()
        .sign("msg_bad", now, body);
    assert_eq!(post(&app, "resend", &h, body).await.status(), 401);
    // No signature at all.
    assert_eq!(post(&app, "resend", &[], body).await.status(), 401);
    // An id that is not text (a byte past ASCII): refused as not matching, not as "missing"
    // (the header was there; it was left out unread).
    let h = resend_headers("msg_x", now, body);
    let r = app
        .http
        .post(format!("{}/v1/ingest/resend", app.base))
        .header(
            "svix-id",
            reqwest::header::HeaderValue::from_bytes(b"msg_\xff").unwrap(),
        )
        .header(h[1].0, &h[1].1)
        .header(h[2].0, &h[2].1)
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let p: Value = r.json().await.unwrap();
    let detail = p["detail"].as_str().unwrap_or_default();
    assert!(!detail.is_empty() && !detail.contains("missing"), "{p}");
    // Stale, and from the future (well past the 300 s tolerance: the clock keeps running; the
    // exact boundary is unit-tested with a fixed clock).
    for t in [now - 400, now + 400] {
        assert_eq!(
            post(&app, "resend", &resend_headers("msg_old", t, body), body)
                .await
                .status(),
            401
        );
    }
    // A valid signature over a body that is not JSON: 400, nothing stored.
    let junk = b"definitely not json";
    let r = post(&app, "resend", &resend_headers("msg_junk", now, junk), junk).await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    // Signed, but JSON that is no event object: 400.
    for junk in [&b"5"[..], b"null", b"\"str\"", b"[1,2]"] {
        let r = post(&app, "resend", &resend_headers("msg_list", now, junk), junk).await;
        assert_eq!(r.status(), 400, "{}", String::from_utf8_lossy(junk));
    }
    // Signed with an empty id, which would be the key of every receipt without one: 400
    // naming it, and a later event with an empty id is not taken for a duplicate of it.
    for t in [now, now + 1] {
        let r = post(&app, "resend", &resend_headers("", t, body), body).await;
        assert_eq!(r.status(), 400);
        let p: Value = r.json().await.unwrap();
        // As the provider's request holds it (it was named by Herald's column).
        assert_eq!(p["field"], "webhook-id", "{p}");
    }
    // Over the body limit (4096 here): 413.
    let big = vec![b'x'; 5000];
    assert_eq!(
        post(&app, "resend", &resend_headers("msg_big", now, &big), &big)
            .await
            .status(),
        413
    );
    // Unknown source: 404.
    assert_eq!(
        post(&app, "nope", &resend_headers("msg_1", now, body), body)
            .await
            .status(),
        404
    );
    // Postmark: basic auth only.
    let pm = br#"{"RecordType":"Delivery","MessageID":"m1","Recipient":"a@b.example","DeliveredAt":"2026-11-30T10:00:00Z"}"#;
    let bad = [("authorization", "Basic aG9vazp3cm9uZw==".to_owned())];
    assert_eq!(post(&app, "pm", &bad, pm).await.status(), 401);
    let good = [("authorization", "Basic aG9vazpzM2NyZXQ=".to_owned())];
    assert_eq!(post(&app, "pm", &good, pm).await.status(), 200);
    assert!(
        app.db.receipts_of_source("resend").unwrap().is_empty(),
        "nothing refused was stored"
    );
    assert_eq!(app.db.receipts_of_source("pm").unwrap().len(), 1);
    app.stop().await;
}

async fn ingest_with_storage_down_is_503_never_2xx() {
    let app = crate::support::app::spawn_app_with(Backend::Sqlite, &sources()).await;
    let body = br#"{"type":"email.sent","data":{}}"#;
    let mut req = actix_web::test::TestRequest::post()
        .uri("/v1/ingest/resend")
        .set_payload(body.to_vec());
    for (n, v) in resend_headers("msg_down", Utc::now().timestamp(), body) {
        req = req.insert_header((n, v));
    }
    let resp = crate::support::app::call_with_storage_down(&app, vec![req]).await;
    assert_eq!(resp[0].status(), 503);
    assert!(resp[0].headers().contains_key("retry-after"));
    app.stop().await;
}

#[actix_web::test]
async fn ingest_storage_down() {
    ingest_with_storage_down_is_503_never_2xx().await
}

both_backends!(
    receipts_are_stored_before_the_answer_and_deduplicated,
    what_does_not_verify_is_refused_and_not_stored,
);

/// PostgreSQL stops answering for this database mid-run: ingest says 503 (never 2xx), stores
/// nothing, and accepts again once the database is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_answers_503_while_postgres_is_unreachable() {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    let app = spawn_app_with(Backend::Postgres, &sources()).await;
    let body = br#"{"type":"email.delivered","data":{"email_id":"em_9"}}"#;
    let now = Utc::now().timestamp();
    let name = url::Url::parse(&app.test_db.url)
        .unwrap()
        .path()
        .trim_start_matches('/')
        .to_owned();
    let admin_url = app.test_db.url.replace(&format!("/{name}"), "/postgres");
    let mut admin = diesel::pg::PgConnection::establish(&admin_url).unwrap();
    let stop = format!(
        "ALTER DATABASE {name} ALLOW_CONNECTIONS false; \
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}';"
    );
    admin.batch_execute(&stop).unwrap();
    let r = post(&app, "resend", &resend_headers("msg_down", now, body), body).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    admin
        .batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        .unwrap();
    // The provider retries: stored now — and not a duplicate, so nothing was stored before.
    let r = post(&app, "resend", &resend_headers("msg_down", now, body), body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"stored": 1, "duplicates": 0})
    );
    assert_eq!(app.db.receipts_of_source("resend").unwrap().len(), 1);
    app.stop().await;
}

/// A few thousand random and malformed requests against every scheme: never a 5xx, never a
/// stored receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_and_malformed_requests_never_get_a_5xx() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let fixtures = crate::support::repo_path("fixtures/providers");
    let sendgrid_key = serde_json::from_slice::<Value>(
        &std::fs::read(fixtures.join("sendgrid/sdk-valid-1/case.json")).unwrap(),
    )
    .unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let cert = fixtures.join("ses/sdk-valid-sns-v1/cert.pem");
    let toml = format!(
        "{}[sources.sg]\nscheme = \"sendgrid\"\nsecrets = [\"{sendgrid_key}\"]\n\
         [sources.st]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\n\
         [sources.mg]\nscheme = \"mailgun\"\nsecrets = [\"key\"]\n\
         [sources.tw]\nscheme = \"twilio\"\nsecrets = [\"tok\"]\npublic_url = \"https://h.example/tw\"\n\
         [sources.ses]\nscheme = \"ses\"\nconfirm_subscriptions = false\n\
         topic_arns = [\"arn:aws:sns:us-east-1:810605503585:just_testing\"]\n\
         certificates = {{ \"https://sns.us-east-1.amazonaws.com/SimpleNotificationService-bb750dd426d95ee9390147a5624348ee.pem\" = {:?} }}\n\
         [sources.hm]\nscheme = \"hmac\"\nsecrets = [\"k\"]\nsigned = \"timestamp.body\"\n",
        sources(),
        cert.display().to_string()
    );
    let app = spawn_app_with(Backend::Sqlite, &toml).await;
    let names = [
        "resend", "pm", "sg", "st", "mg", "tw", "ses", "hm", "nope", "%2e%2e",
    ];
    let header_names = [
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "svix-signature",
        "stripe-signature",
        "x-twilio-signature",
        "x-twilio-email-event-webhook-signature",
        "x-twilio-email-event-webhook-timestamp",
        "authorization",
        "x-signature",
        "x-timestamp",
        "content-type",
    ];
    let bodies: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"{".to_vec(),
        b"[]".to_vec(),
        b"[{\"event\":1}]\r\n".to_vec(),
        b"{\"Type\":\"Notification\",\"SigningCertURL\":\"https://sns.us-east-1.amazonaws.com/x.pem\",\"Signature\":\"AAAA\",\"SignatureVersion\":\"1\",\"Message\":\"m\",\"MessageId\":\"i\",\"Timestamp\":\"t\",\"TopicArn\":\"a\"}".to_vec(),
        b"{\"signature\":{\"timestamp\":\"1\",\"token\":\"t\",\"signature\":\"00\"},\"event-data\":{}}".to_vec(),
        std::fs::read(fixtures.join("ses/sdk-valid-sns-v1/body")).unwrap(),
        vec![0xff, 0xfe, 0x00, 0x80],
        vec![b'x'; 5000],
    ];
    let mut rng = StdRng::seed_from_u64(7);
    let mut seen = std::collections::BTreeMap::new();
    for i in 0..2_000 {
        let name = names[rng.random_range(0..names.len())];
        let mut req = app.http.post(format!("{}/v1/ingest/{name}", app.base));
        for h in header_names {
            if rng.random_bool(0.4) {
                let v: String = match rng.random_range(0..4) {
                    0 => format!("{}", rng.random::<i64>()),
                    1 => format!("t={},v1={:x}", rng.random::<u32>(), rng.random::<u128>()),
                    2 => format!("v1,{}", "QUJD".repeat(rng.random_range(0..20))),
                    _ => (0..rng.random_range(0..40))
                        .map(|_| char::from(rng.random_range(32u8..127)))
                        .collect(),
                };
                req = req.header(h, v);
            }
        }
        let mut body = bodies[rng.random_range(0..bodies.len())].clone();
        if rng.random_bool(0.3) && !body.is_empty() {
            let at = rng.random_range(0..body.len());
            body[at] = rng.random();
        }
        let r = req
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        let status = r.status().as_u16();
        assert!(status < 500, "request {i} to {name}: {status}");
        *seen.entry(status).or_insert(0) += 1;
    }
    // Only refusals: 401 (unverified), 404 (unknown source), 413 (too large), and 400 for the one
    // genuinely signed SNS body when it arrives intact at the ses source (its Message is no SES
    // event). Nothing is ever stored.
    assert!(
        seen.keys().all(|s| [400, 401, 404, 413].contains(s)),
        "{seen:?}"
    );
    assert!(seen[&401] > 1000, "{seen:?}");
    for n in names {
        assert!(app.db.receipts_of_source(n).unwrap().is_empty());
    }
    app.stop().await;
}

/// SQLite held by another writer past the busy timeout: 503, and the retry stores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_answers_503_while_sqlite_is_locked() {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    let app = spawn_app_with(Backend::Sqlite, &sources()).await;
    let path = herald::storage::sqlite_path(&app.test_db.url)
        .unwrap()
        .to_owned();
    let mut holder = diesel::sqlite::SqliteConnection::establish(&path).unwrap();
    holder.batch_execute("BEGIN IMMEDIATE").unwrap();
    let body = br#"{"type":"email.delivered","data":{"email_id":"em_7"}}"#;
    let headers = resend_headers("msg_locked", Utc::now().timestamp(), body);
    let r = post(&app, "resend", &headers, body).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    holder.batch_execute("ROLLBACK").unwrap();
    let r = post(&app, "resend", &headers, body).await;
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"stored": 1, "duplicates": 0})
    );
    app.stop().await;
}

/// Postmark credential rotation: during the switch both pairs are configured (the single-pair keys
/// and the `credentials` list together) and either one's requests are stored; anything else is
/// refused and stores nothing.
async fn postmark_accepts_any_configured_credential_pair(backend: Backend) {
    use base64::Engine;
    let app = spawn_app_with(
        backend,
        "[sources.pm]\nscheme = \"postmark\"\nusername = \"hook\"\npassword = \"old-s3cret\"\n\
         credentials = [{ username = \"hook\", password = \"new-s3cret\" }, { username = \"hook-2\", password = \"third\" }]\n\
         [sources.listed]\nscheme = \"postmark\"\n\
         credentials = [{ username = \"a\", password = \"1\" }, { username = \"b\", password = \"2\" }]\n",
    )
    .await;
    let auth = |pair: &str| {
        [(
            "authorization",
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            ),
        )]
    };
    let delivery = |n: usize| {
        format!(
            r#"{{"RecordType":"Delivery","MessageID":"m{n}","Recipient":"a@b.example","DeliveredAt":"2026-11-30T10:00:00Z"}}"#
        )
        .into_bytes()
    };
    for (i, (source, pair, status)) in [
        ("pm", "hook:old-s3cret", 200),
        ("pm", "hook:new-s3cret", 200),
        ("pm", "hook-2:third", 200),
        ("pm", "hook:third", 401),
        ("pm", "hook-2:new-s3cret", 401),
        ("pm", "hook:", 401),
        ("listed", "a:1", 200),
        ("listed", "b:2", 200),
        ("listed", "a:2", 401),
    ]
    .into_iter()
    .enumerate()
    {
        let r = post(&app, source, &auth(pair), &delivery(i)).await;
        assert_eq!(r.status(), status, "{source} {pair}");
    }
    assert_eq!(app.db.receipts_of_source("pm").unwrap().len(), 3);
    assert_eq!(app.db.receipts_of_source("listed").unwrap().len(), 2);
    app.stop().await;
}

both_backends!(postmark_accepts_any_configured_credential_pair);

/// SendGrid's signed timestamp is held to `tolerance_seconds` (default 300) although nothing in
/// the source's configuration asks for it: sendgrid-python's published example, stale by one
/// second, is refused and not stored; at its own time it is stored.
async fn a_stale_sendgrid_timestamp_is_refused_by_default(backend: Backend) {
    let dir = crate::support::repo_path("fixtures/providers/sendgrid/sdk-valid-1");
    let case: Value =
        serde_json::from_slice(&std::fs::read(dir.join("case.json")).unwrap()).unwrap();
    let body = std::fs::read(dir.join("body")).unwrap();
    let app = spawn_app_with(
        backend,
        &format!(
            "[sources.sg]\nscheme = \"sendgrid\"\nsecrets = [{:?}]\n",
            case["secret"].as_str().unwrap()
        ),
    )
    .await;
    let headers: Vec<(&str, String)> = case["headers"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str().unwrap().to_owned()))
        .collect();
    let signed_at = case["at"].as_i64().unwrap();
    for at in [signed_at + 301, signed_at - 301] {
        app.clock.freeze(Utc.timestamp_opt(at, 0).unwrap());
        let r = post(&app, "sg", &headers, &body).await;
        assert_eq!(r.status(), 401, "at {at}");
        let problem = r.json::<Value>().await.unwrap();
        assert!(
            problem["detail"].as_str().unwrap().contains("tolerance"),
            "{problem}"
        );
    }
    assert!(app.db.receipts_of_source("sg").unwrap().is_empty());
    app.clock
        .freeze(Utc.timestamp_opt(signed_at + 300, 0).unwrap());
    let r = post(&app, "sg", &headers, &body).await;
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"stored": 1, "duplicates": 0})
    );
    app.stop().await;
}

both_backends!(a_stale_sendgrid_timestamp_is_refused_by_default);

/// Mailgun signs only `timestamp + token`, not the body: a second event under the same signature
/// is a replay — refused with 401, never stored, counted apart from duplicates — while the same
/// event again is a duplicate (200).
async fn a_replayed_mailgun_signature_is_refused_and_stores_nothing(backend: Backend) {
    use hmac::{Hmac, Mac};
    let app = spawn_app_with(
        backend,
        "[sources.mg]\nscheme = \"mailgun\"\nsecrets = [\"key-1\"]\n",
    )
    .await;
    let t = Utc::now().timestamp().to_string();
    let signed = |token: &str, id: &str| {
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(b"key-1").unwrap();
        mac.update(format!("{t}{token}").as_bytes());
        let signature = hex::encode(mac.finalize().into_bytes());
        serde_json::to_vec(&json!({
            "signature": {"timestamp": t, "token": token, "signature": signature},
            "event-data": {"id": id, "event": "delivered", "timestamp": 1_700_000_000.5}
        }))
        .unwrap()
    };
    let body = |id: &str| signed("tok-1", id);
    let r = post(&app, "mg", &[], &body("ev-1")).await;
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"stored": 1, "duplicates": 0})
    );
    // Mailgun retrying the same event: a duplicate.
    let r = post(&app, "mg", &[], &body("ev-1")).await;
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"stored": 0, "duplicates": 1})
    );
    // Someone reusing the signature for an event of their own: refused, not stored.
    let r = post(&app, "mg", &[], &body("ev-forged")).await;
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let problem = r.json::<Value>().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("replay"),
        "{problem}"
    );
    // And again: still a replay, never a duplicate.
    assert_eq!(
        post(&app, "mg", &[], &body("ev-forged-2")).await.status(),
        401
    );
    // The genuine event once more: still a duplicate.
    let r = post(&app, "mg", &[], &body("ev-1")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"stored": 0, "duplicates": 1})
    );
    // Mailgun retrying it under a fresh signature (token `tok-2`): a duplicate, and its token is
    // kept too — whoever captured that retry cannot use its signature for another event.
    let r = post(&app, "mg", &[], &signed("tok-2", "ev-1")).await;
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"stored": 0, "duplicates": 1})
    );
    assert_eq!(
        post(&app, "mg", &[], &signed("tok-2", "ev-forged-3"))
            .await
            .status(),
        401
    );
    let count = |v| app.herald.metrics.receipts_count("mg", v);
    assert_eq!(
        (
            count(ReceiptVerdict::Duplicate),
            count(ReceiptVerdict::Replayed)
        ),
        (3, 3),
        "(duplicates, replays)"
    );
    let rows = app.db.receipts_of_source("mg").unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (
            rows[0].provider_event_id.as_str(),
            rows[0].replay_key.as_deref()
        ),
        ("ev-1", Some("tok-1"))
    );
    app.stop().await;
}

/// Several requests racing with one Mailgun signature, each with its own event: exactly one is
/// stored, every other is refused as a replay.
async fn racing_replays_store_exactly_one(backend: Backend) {
    use hmac::{Hmac, Mac};
    let app = spawn_app_with(
        backend,
        "[sources.mg]\nscheme = \"mailgun\"\nsecrets = [\"key-1\"]\n",
    )
    .await;
    let t = Utc::now().timestamp().to_string();
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(b"key-1").unwrap();
    mac.update(format!("{t}tok-race").as_bytes());
    let signature = hex::encode(mac.finalize().into_bytes());
    let bodies: Vec<Vec<u8>> = (0..8)
        .map(|i| {
            serde_json::to_vec(&json!({
                "signature": {"timestamp": t, "token": "tok-race", "signature": signature},
                "event-data": {"id": format!("ev-{i}"), "event": "delivered"}
            }))
            .unwrap()
        })
        .collect();
    let answers =
        futures_util::future::join_all(bodies.iter().map(|b| post(&app, "mg", &[], b))).await;
    let mut statuses: Vec<u16> = answers.iter().map(|r| r.status().as_u16()).collect();
    statuses.sort();
    assert_eq!(statuses, [200, 401, 401, 401, 401, 401, 401, 401]);
    assert_eq!(app.db.receipts_of_source("mg").unwrap().len(), 1);
    assert_eq!(
        app.herald
            .metrics
            .receipts_count("mg", ReceiptVerdict::Replayed),
        7
    );
    app.stop().await;
}

both_backends!(
    a_replayed_mailgun_signature_is_refused_and_stores_nothing,
    racing_replays_store_exactly_one,
);
