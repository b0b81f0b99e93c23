//! Every provider's own published example (fixtures/providers/<scheme>/<case>/, see SOURCE.md
//! there) through `POST /v1/ingest/{source}` with the clock at the example's time, on both
//! backends; and through `herald verify-receipt`.

use std::path::{Path, PathBuf};

use chrono::{TimeZone, Utc};
use serde_json::Value;

use crate::both_backends;
use crate::support::Backend;
use crate::support::app::spawn_app_with;

/// Every scheme of the interface contract that has published examples.
const SCHEMES: &[&str] = &[
    "standard-webhooks",
    "stripe",
    "twilio",
    "mailgun",
    "postmark",
    "sendgrid",
    "ses",
];

/// (event id, normalized type, provider type, event time, provider message id).
type Normalized<'a> = (&'a str, &'a str, &'a str, Option<i64>, Option<&'a str>);

struct Case {
    name: String,
    scheme: &'static str,
    dir: PathBuf,
    spec: Value,
    body: Vec<u8>,
}

fn cases() -> Vec<Case> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/providers");
    let mut out = Vec::new();
    for scheme in SCHEMES {
        let mut dirs: Vec<_> = std::fs::read_dir(root.join(scheme))
            .unwrap_or_else(|e| panic!("fixtures/providers/{scheme}: {e}"))
            .map(|e| e.unwrap().path())
            .filter(|p| p.join("case.json").exists())
            .collect();
        dirs.sort();
        for dir in dirs {
            let spec: Value =
                serde_json::from_slice(&std::fs::read(dir.join("case.json")).unwrap()).unwrap();
            // Asymmetric v1a (ed25519) signatures are not supported by this version.
            if spec.get("public_key").is_some() {
                continue;
            }
            let body = std::fs::read(dir.join("body")).unwrap();
            let name = format!("{scheme}/{}", dir.file_name().unwrap().to_string_lossy());
            out.push(Case {
                name,
                scheme,
                dir,
                spec,
                body,
            });
        }
    }
    out
}

fn source_toml(i: usize, c: &Case) -> String {
    let s = &c.spec;
    let mut t = format!("[sources.f{i}]\nscheme = {:?}\n", c.scheme);
    if let Some(secret) = s["secret"].as_str() {
        t += &format!("secrets = [{secret:?}]\n");
    }
    if let Some(url) = s["url"].as_str() {
        t += &format!("public_url = {url:?}\n");
    }
    if let Some(arns) = s.get("allowed_topic_arns") {
        t += &format!("topic_arns = {arns}\nconfirm_subscriptions = false\n");
    }
    if let (Some(url), Some(file)) = (s["cert_url"].as_str(), s["cert_file"].as_str()) {
        // The injectable certificate store: the published certificate pinned for its URL.
        t += &format!(
            "certificates = {{ {url:?} = {:?} }}\n",
            c.dir.join(file).display().to_string()
        );
    }
    if let Some(auth) = s.get("basic_auth") {
        t += &format!(
            "username = {:?}\npassword = {:?}\n",
            auth["username"].as_str().unwrap(),
            auth["password"].as_str().unwrap()
        );
    }
    t
}

async fn published_examples_get_the_documented_verdict(backend: Backend) {
    let cases = cases();
    assert!(cases.len() >= 30, "only {} fixtures found", cases.len());
    let toml: String = cases
        .iter()
        .enumerate()
        .map(|(i, c)| source_toml(i, c))
        .collect();
    let app = spawn_app_with(backend, &toml).await;
    let (mut stored, mut refused) = (0, 0);
    for (i, c) in cases.iter().enumerate() {
        let at = c.spec["at"].as_i64().unwrap_or(0);
        app.clock.freeze(Utc.timestamp_opt(at, 0).unwrap());
        let mut req = app
            .http
            .post(format!("{}/v1/ingest/f{i}", app.base))
            .body(c.body.clone());
        for (n, v) in c.spec["headers"].as_object().unwrap() {
            req = req.header(n.as_str(), v.as_str().unwrap());
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let answer: Value = r.json().await.unwrap_or(Value::Null);
        let rows = app.db.receipts_of_source(&format!("f{i}")).unwrap();
        match c.spec["expect"].as_str().unwrap() {
            "valid" => {
                // Accepted: stored (200), or — examples that are not delivery events, such as a
                // voice call's parameters or a bare signature envelope — a verified body Herald
                // cannot store (400 unparsable). Never 401.
                match status {
                    200 => {
                        assert_eq!(rows.len(), 1, "{}: stored", c.name);
                        stored += 1;
                    }
                    400 => {
                        assert!(
                            answer["type"].as_str().unwrap().ends_with("/unparsable"),
                            "{}: {answer}",
                            c.name
                        );
                        assert!(rows.is_empty());
                    }
                    _ => panic!("{}: expected acceptance, got {status} {answer}", c.name),
                }
            }
            "invalid" => {
                assert_eq!(status, 401, "{}: {answer}", c.name);
                assert!(rows.is_empty(), "{}: nothing stored", c.name);
                refused += 1;
            }
            other => panic!("{}: expect {other:?}", c.name),
        }
    }
    let accepted_only: Vec<_> = cases
        .iter()
        .enumerate()
        .filter(|(i, c)| {
            c.spec["expect"] == "valid"
                && app
                    .db
                    .receipts_of_source(&format!("f{i}"))
                    .unwrap()
                    .is_empty()
        })
        .map(|(_, c)| c.name.as_str())
        .collect();
    // Verified, but not a delivery event Herald can store: a bare signature envelope, a JSON body
    // that is not a status callback, a callback without any Sid.
    assert_eq!(
        accepted_only,
        [
            "twilio/sdk-valid-array-param",
            "twilio/sdk-valid-duplicate-params",
            "twilio/sdk-valid-duplicate-values",
            "twilio/sdk-valid-json-bodysha256",
            "mailgun/sdk-valid-1",
            "ses/sdk-valid-sns-v1"
        ]
    );
    assert_eq!((stored, refused), (13, 31));

    // What every stored example normalizes to: (event id, type, provider type, event time,
    // provider message id). None of the published examples carries a herald_event_id.
    let sw = (
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "other",
        "unknown",
        None,
        None,
    );
    let tw = (
        "CA1234567890ABCDE:unknown",
        "other",
        "unknown",
        None,
        Some("CA1234567890ABCDE"),
    );
    let expected: Vec<(&str, Normalized<'_>)> = vec![
        ("standard-webhooks/sdk-valid-1", sw),
        ("standard-webhooks/sdk-valid-multi-sig", sw),
        ("standard-webhooks/sdk-valid-unprefixed-secret", sw),
        ("standard-webhooks/svix-docs-valid-1", sw),
        (
            "stripe/sdk-valid-1",
            (
                "evt_123",
                "other",
                "customer.created",
                Some(1533204620),
                Some("cus_123"),
            ),
        ),
        ("twilio/sdk-valid-1", tw),
        ("twilio/sdk-valid-port-added-http", tw),
        ("twilio/sdk-valid-port-added-https", tw),
        ("twilio/sdk-valid-port-removed-http", tw),
        ("twilio/sdk-valid-port-removed-https", tw),
        (
            "postmark/docs-bounce-valid",
            (
                "42",
                "bounced",
                "Bounce",
                Some(1406914090),
                Some("883953f4-6105-42a2-a16a-77a8eac79483"),
            ),
        ),
        (
            "sendgrid/sdk-valid-1",
            (
                "ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA",
                "dropped",
                "dropped",
                Some(1600112492),
                Some("LRzXl_NHStOGhQ4kofSm_A"),
            ),
        ),
        (
            "sendgrid/sdk-valid-2-object-body",
            // No sg_event_id: the event's own bytes are its identity.
            (
                "eea38441e385d441f79d7ee2d875d19793e70ef3bbb439ca2431bb6d6ca4b475",
                "other",
                "test_event",
                None,
                None,
            ),
        ),
    ];
    let mut normalized = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        for r in app.db.receipts_of_source(&format!("f{i}")).unwrap() {
            assert_eq!(r.herald_event_id, None, "{}", c.name);
            normalized.push((
                c.name.clone(),
                (
                    r.provider_event_id,
                    r.event_type,
                    r.provider_type,
                    r.event_time.map(|t| t.timestamp()),
                    r.provider_message_id,
                ),
            ));
        }
    }
    let normalized: Vec<(&str, Normalized<'_>)> = normalized
        .iter()
        .map(|(n, (a, b, c, d, e))| {
            (
                n.as_str(),
                (a.as_str(), b.as_str(), c.as_str(), *d, e.as_deref()),
            )
        })
        .collect();
    assert_eq!(normalized, expected);
    app.stop().await;
}

both_backends!(published_examples_get_the_documented_verdict);

#[test]
fn verify_receipt_checks_a_published_example_offline() {
    let c = cases()
        .into_iter()
        .find(|c| c.name == "stripe/sdk-valid-1")
        .unwrap();
    let run = |body: &Path| {
        let header = c.spec["headers"]["Stripe-Signature"].as_str().unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
            .args([
                "verify-receipt",
                "--scheme",
                "stripe",
                "--secret",
                "webhook_secret",
            ])
            .args(["--header", &format!("Stripe-Signature: {header}")])
            .arg("--body-file")
            .arg(body)
            .args(["--at", &c.spec["at"].as_i64().unwrap().to_string()])
            .output()
            .unwrap()
    };
    let ok = run(&c.dir.join("body"));
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let verdict: Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(verdict["valid"], true);
    assert_eq!(verdict["events"][0]["provider_event_id"], "evt_123");
    let dir = tempfile::tempdir().unwrap();
    let tampered = dir.path().join("body");
    let mut bytes = c.body.clone();
    bytes.push(b' ');
    std::fs::write(&tampered, bytes).unwrap();
    let bad = run(&tampered);
    assert_eq!(bad.status.code(), Some(1));
    let verdict: Value = serde_json::from_slice(&bad.stdout).unwrap();
    assert_eq!(
        (verdict["valid"].as_bool(), verdict["status"].as_u64()),
        (Some(false), Some(401))
    );
}
