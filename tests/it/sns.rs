//! Amazon SES via SNS end to end, with a key and certificate made for the test (openssl): both
//! signature versions, a real SES event's normalization, subscription confirmation, and the
//! topic and certificate-URL policies.

use std::path::Path;
use std::process::Command;

use base64::Engine;
use chrono::Utc;
use serde_json::{Value, json};

use crate::both_backends;
use crate::support::Backend;
use crate::support::app::{TestApp, spawn_app_with};

pub(crate) const TOPIC: &str = "arn:aws:sns:us-east-1:123456789012:ses-events";
pub(crate) const CERT_URL: &str =
    "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0123abcd.pem";

/// A throwaway RSA key (`key.pem`) and self-signed certificate (`cert.pem`) in `dir`, standing
/// in for an SNS signing certificate.
pub(crate) fn signing_certificate(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
            "-days",
            "2",
            "-subj",
            "/CN=sns.amazonaws.com",
        ],
    );
}

pub(crate) fn openssl(dir: &Path, args: &[&str]) {
    let ok = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        ok.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

/// Signs an envelope as SNS does: the canonical string, RSA PKCS#1 v1.5, SHA1 (v1) or SHA256 (v2).
pub(crate) fn sign(dir: &Path, mut env: Value, version: &str) -> Vec<u8> {
    env["SignatureVersion"] = json!(version);
    env["SigningCertURL"] = env
        .get("SigningCertURL")
        .cloned()
        .unwrap_or(json!(CERT_URL));
    let text = herald::ingest::schemes::ses::canonical(&env).expect("canonical");
    std::fs::write(dir.join("msg"), text).unwrap();
    let digest = if version == "1" { "-sha1" } else { "-sha256" };
    openssl(
        dir,
        &["dgst", digest, "-sign", "key.pem", "-out", "sig", "msg"],
    );
    let sig =
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(dir.join("sig")).unwrap());
    env["Signature"] = json!(sig);
    serde_json::to_vec(&env).unwrap()
}

async fn post(app: &TestApp, body: Vec<u8>) -> (u16, Value) {
    let r = app
        .http
        .post(format!("{}/v1/ingest/ses", app.base))
        .header("x-amz-sns-message-type", "Notification")
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

pub(crate) fn notification(id: &str, message: &Value) -> Value {
    json!({"Type": "Notification", "MessageId": id, "TopicArn": TOPIC,
           "Message": message.to_string(), "Timestamp": Utc::now().to_rfc3339()})
}

async fn ses_events_through_sns(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    signing_certificate(dir.path());
    let toml = format!(
        "[sources.ses]\nscheme = \"ses\"\ntopic_arns = [\"{TOPIC}\"]\nconfirm_subscriptions = false\n\
         certificates = {{ \"{CERT_URL}\" = {:?} }}\n",
        dir.path().join("cert.pem").display().to_string()
    );
    let app = spawn_app_with(backend, &toml).await;
    let bounce = json!({
        "eventType": "Bounce",
        "bounce": {"bounceType": "Permanent", "timestamp": "2026-11-30T10:00:05.000Z"},
        "mail": {"timestamp": "2026-11-30T10:00:00.000Z", "messageId": "0100019abc",
                 "tags": {"herald_event_id": ["order-9:placed"]}}
    });
    let d = dir.path();
    // SignatureVersion 2 (SHA256) and 1 (SHA1).
    assert_eq!(
        post(&app, sign(d, notification("sns-1", &bounce), "2")).await,
        (200, json!({"stored": 1, "duplicates": 0}))
    );
    assert_eq!(
        post(&app, sign(d, notification("sns-2", &bounce), "1"))
            .await
            .0,
        200
    );
    // SNS retries keep the MessageId: a duplicate.
    assert_eq!(
        post(&app, sign(d, notification("sns-1", &bounce), "2"))
            .await
            .1,
        json!({"stored": 0, "duplicates": 1})
    );
    let rows = app.db.receipts_of_source("ses").unwrap();
    assert_eq!(rows.len(), 2);
    let r = &rows[0];
    assert_eq!(
        (
            r.provider_event_id.as_str(),
            r.event_type.as_str(),
            r.provider_type.as_str()
        ),
        ("sns-1", "bounced", "Bounce")
    );
    assert_eq!(
        r.event_time.unwrap().to_rfc3339(),
        "2026-11-30T10:00:05+00:00",
        "bounce.timestamp, not mail.timestamp"
    );
    assert_eq!(r.herald_event_id.as_deref(), Some("order-9:placed"));
    assert_eq!(r.provider_message_id.as_deref(), Some("0100019abc"));

    // A subscription confirmation verifies and stores nothing (confirmation is off here).
    let confirm = json!({"Type": "SubscriptionConfirmation", "MessageId": "sub-1", "TopicArn": TOPIC,
        "Message": "You have chosen to subscribe", "Token": "tok", "Timestamp": Utc::now().to_rfc3339(),
        "SubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&Token=tok"});
    assert_eq!(
        post(&app, sign(d, confirm, "2")).await,
        (200, json!({"stored": 0, "duplicates": 0}))
    );

    // SES's notices that a topic was set up (an event destination's plain text, an identity's
    // notification type) are taken and store nothing; a message that is neither is a 400.
    let mut validated = notification("sns-v", &json!(null));
    validated["Message"] =
        json!("Successfully validated SNS topic for Amazon SES event destination creation.");
    let subscribed = json!({"notificationType": "AmazonSnsSubscriptionSucceeded",
        "message": "You have successfully subscribed your Amazon SNS topic 'x' to receive 'Bounce' notifications"});
    for env in [validated, notification("sns-s", &subscribed)] {
        assert_eq!(
            post(&app, sign(d, env, "2")).await,
            (200, json!({"stored": 0, "duplicates": 0}))
        );
    }
    let mut prose = notification("sns-p", &json!(null));
    prose["Message"] = json!("hello");
    assert_eq!(post(&app, sign(d, prose, "2")).await.0, 400);

    // Refused: another topic (even correctly signed), a certificate URL of another region or
    // host, a tampered message, an unknown signature version.
    let mut other = notification("sns-3", &bounce);
    other["TopicArn"] = json!("arn:aws:sns:us-east-1:999999999999:not-ours");
    let (status, p) = post(&app, sign(d, other, "2")).await;
    assert_eq!(status, 401);
    assert_eq!(
        p["detail"],
        "TopicArn is not one of the source's topic_arns"
    );
    for url in [
        "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-0123abcd.pem",
        "https://sns.s3.amazonaws.com/SimpleNotificationService-0123abcd.pem",
    ] {
        let mut env = notification("sns-4", &bounce);
        env["SigningCertURL"] = json!(url);
        let (status, p) = post(&app, sign(d, env, "2")).await;
        assert_eq!(status, 401, "{url}");
        assert_eq!(
            p["detail"], "SigningCertURL is not an SNS certificate URL of the topic's region",
            "{url}"
        );
    }
    let signed = sign(d, notification("sns-5", &bounce), "2");
    let mut tampered: Value = serde_json::from_slice(&signed).unwrap();
    tampered["Message"] = json!(
        tampered["Message"]
            .as_str()
            .unwrap()
            .replace("Permanent", "Transient")
    );
    assert_eq!(
        post(&app, serde_json::to_vec(&tampered).unwrap()).await.0,
        401
    );
    assert_eq!(
        post(&app, sign(d, notification("sns-6", &bounce), "3"))
            .await
            .0,
        401
    );
    // Correctly signed, but published outside the default ±300 s: stale, in both directions.
    for shift in [-400, 400] {
        let mut env = notification("sns-7", &bounce);
        env["Timestamp"] = json!((Utc::now() + chrono::Duration::seconds(shift)).to_rfc3339());
        assert_eq!(post(&app, sign(d, env, "2")).await.0, 401, "{shift} s");
    }
    assert_eq!(
        app.db.receipts_of_source("ses").unwrap().len(),
        2,
        "nothing refused was stored"
    );
    app.stop().await;
}

both_backends!(ses_events_through_sns);
