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

/// [`Normalized`] with an owned event id (the SMS ones are composed), per case.
type NamedReceipt<'a> = (
    &'a str,
    (String, &'a str, &'a str, Option<i64>, Option<&'a str>),
);

struct Case {
    name: String,
    scheme: &'static str,
    dir: PathBuf,
    spec: Value,
    body: Vec<u8>,
}

/// The SMS schemes: their examples also carry `method`, `options` (scheme options of the source)
/// and a `url` whose query is the request's own.
const SMS_SCHEMES: &[&str] = &["vonage", "telnyx", "plivo", "messagebird"];

fn cases() -> Vec<Case> {
    cases_of(SCHEMES)
}

fn cases_of(schemes: &[&'static str]) -> Vec<Case> {
    let root = crate::support::repo_path("fixtures/providers");
    let mut out = Vec::new();
    for scheme in schemes {
        let mut dirs: Vec<_> = std::fs::read_dir(root.join(scheme))
            .unwrap_or_else(|e| panic!("fixtures/providers/{scheme}: {e}"))
            .map(|e| e.unwrap().path())
            .filter(|p| p.join("case.json").exists())
            .collect();
        dirs.sort();
        for dir in dirs {
            let spec: Value =
                serde_json::from_slice(&std::fs::read(dir.join("case.json")).unwrap()).unwrap();
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
    if let Some(pk) = s["public_key"].as_str() {
        // Standard Webhooks v1a: the public key, never the published private seed.
        t += &format!("secrets = [\"whpk_{pk}\"]\n");
    } else if let Some(secret) = s["secret"].as_str() {
        t += &format!("secrets = [{secret:?}]\n");
    }
    let takes_url =
        herald::ingest::schemes::keys_of(c.scheme).is_some_and(|k| k.contains(&"public_url"));
    if let Some(url) = s["url"].as_str().filter(|_| takes_url) {
        // The SMS schemes take the query as received: the public URL is the part before it.
        let url = if SMS_SCHEMES.contains(&c.scheme) {
            url.split_once('?').map_or(url, |(base, _)| base)
        } else {
            url
        };
        t += &format!("public_url = {url:?}\n");
    }
    if let Some(options) = s["options"].as_object() {
        for (k, v) in options {
            t += &format!("{k} = {v}\n");
        }
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
    assert_eq!((stored, refused), (14, 33));

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
        ("standard-webhooks/sdk-valid-v1a-ed25519", sw),
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

/// A case's request through the endpoint: its method, and the query of its URL (SMS schemes).
async fn send(app: &crate::support::TestApp, i: usize, c: &Case) -> (u16, Value) {
    let query = c.spec["url"]
        .as_str()
        .and_then(|u| u.split_once('?'))
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    let url = format!("{}/v1/ingest/f{i}{query}", app.base);
    let mut req = match c.spec["method"].as_str().unwrap_or("POST") {
        "GET" => reqwest::Client::new().get(url),
        _ => reqwest::Client::new().post(url),
    }
    .body(c.body.clone());
    for (n, v) in c.spec["headers"].as_object().unwrap() {
        req = req.header(n.as_str(), v.as_str().unwrap());
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The SMS providers' published examples (and the derived and generated cases beside them, see
/// each SOURCE.md) through `GET`/`POST /v1/ingest/{source}`. MessageBird's reference cases for
/// PUT, PATCH and DELETE (the method is not signed) are checked offline only.
async fn sms_examples_get_the_documented_verdict(backend: Backend) {
    let cases: Vec<Case> = cases_of(SMS_SCHEMES)
        .into_iter()
        .filter(|c| matches!(c.spec["method"].as_str(), Some("GET" | "POST")))
        .collect();
    let toml: String = cases
        .iter()
        .enumerate()
        .map(|(i, c)| source_toml(i, c))
        .collect();
    let app = spawn_app_with(backend, &toml).await;
    let (mut stored, mut verified_only, mut refused) = (0, Vec::new(), 0);
    for (i, c) in cases.iter().enumerate() {
        app.clock.freeze(
            Utc.timestamp_opt(c.spec["at"].as_i64().unwrap(), 0)
                .unwrap(),
        );
        let (status, answer) = send(&app, i, c).await;
        let rows = app.db.receipts_of_source(&format!("f{i}")).unwrap();
        match (c.spec["expect"].as_str().unwrap(), status) {
            ("valid", 200) => {
                assert!(!rows.is_empty(), "{}: stored", c.name);
                stored += 1;
            }
            ("valid", 400) => {
                assert!(
                    answer["type"].as_str().unwrap().ends_with("/unparsable"),
                    "{}: {answer}",
                    c.name
                );
                assert!(rows.is_empty());
                verified_only.push(c.name.as_str());
            }
            ("invalid", 401) => {
                assert!(rows.is_empty(), "{}: nothing stored", c.name);
                refused += 1;
            }
            (expect, _) => panic!("{}: expected {expect}, got {status} {answer}", c.name),
        }
    }
    // Verified, but not a delivery receipt: the SDKs' vectors are inbound messages and voice
    // callbacks, MessageBird's reference bodies are not status reports.
    let verified_only: Vec<&str> = verified_only
        .iter()
        .map(|n| n.split('/').next().unwrap())
        .collect();
    let count = |s: &str| verified_only.iter().filter(|x| **x == s).count();
    assert_eq!(
        (
            count("vonage"),
            count("plivo"),
            count("messagebird"),
            count("telnyx")
        ),
        (5, 4, 12, 0)
    );
    assert_eq!((stored, refused), (8, 31));

    const UUID: &str = "aaaaaaaa-bbbb-cccc-dddd-0123456789ab";
    const TMSG: &str = "40385f64-5717-4562-b3fc-2c963f66afa6";
    const TFIN: &str = "4ee8c3a6-4995-4309-a3c6-38e3db9ea4be";
    const PUUID: &str = "db3ce55a-7f1d-11e1-8ea7-1231380bc196";
    let expected: Vec<NamedReceipt<'_>> = vec![
        (
            "vonage/derived-valid-dlr-get-sha256",
            (
                "0A0000000123ABCD1:delivered".into(),
                "delivered",
                "delivered",
                Some(1577887200),
                Some("0A0000000123ABCD1"),
            ),
        ),
        (
            "vonage/derived-valid-messages-status",
            (
                format!("{UUID}:delivered"),
                "delivered",
                "delivered",
                Some(1587494962),
                Some(UUID),
            ),
        ),
        (
            "telnyx/generated-valid-group-finalized",
            (
                format!("{TFIN}:15a0f99725beb029"),
                "delivered",
                "message.finalized:delivered",
                Some(1548267009),
                Some(TMSG),
            ),
        ),
        (
            "telnyx/generated-valid-group-finalized",
            (
                format!("{TFIN}:72d1ca41de9f8121"),
                "failed",
                "message.finalized:delivery_failed",
                Some(1548267009),
                Some(TMSG),
            ),
        ),
        (
            "telnyx/generated-valid-message-finalized",
            (
                TFIN.into(),
                "delivered",
                "message.finalized:delivered",
                Some(1548267005),
                Some(TMSG),
            ),
        ),
        (
            "telnyx/generated-valid-message-sent",
            (
                "86f58db9-0fe3-4adc-9d1f-46e66e6e9323".into(),
                "sent",
                "message.sent:sent",
                Some(1548267003),
                Some(TMSG),
            ),
        ),
        (
            "plivo/derived-valid-message-delivered",
            (
                format!("{PUUID}:delivered"),
                "delivered",
                "delivered",
                Some(1714979292),
                Some(PUUID),
            ),
        ),
        (
            "plivo/derived-valid-message-sent-get",
            (
                format!("{PUUID}:sent"),
                "sent",
                "sent",
                Some(1714979290),
                Some(PUUID),
            ),
        ),
        (
            "messagebird/derived-valid-status-report-get",
            (
                "efa6405d518d4c0c88cce11f7db775fb:e03d152bbe638d9f:delivered:2021-07-05T09:59:58+00:00"
                    .into(),
                "delivered",
                "delivered",
                Some(1625479198),
                Some("efa6405d518d4c0c88cce11f7db775fb"),
            ),
        ),
    ];
    let mut normalized = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let mut rows = app.db.receipts_of_source(&format!("f{i}")).unwrap();
        rows.sort_by(|a, b| a.provider_event_id.cmp(&b.provider_event_id));
        for r in rows {
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
    let normalized: Vec<NamedReceipt<'_>> = normalized
        .iter()
        .map(|(n, (a, b, c, d, e))| {
            (
                n.as_str(),
                (a.clone(), b.as_str(), c.as_str(), *d, e.as_deref()),
            )
        })
        .collect();
    assert_eq!(normalized, expected);
    app.stop().await;
}

both_backends!(sms_examples_get_the_documented_verdict);

/// Every SMS example and every Standard Webhooks one (v1a included) through the real `herald
/// verify-receipt` binary: `--method`, `--param` for scheme options, `--url` with the query.
#[test]
fn verify_receipt_gives_every_example_its_verdict_offline() {
    let mut all = cases_of(SMS_SCHEMES);
    all.extend(cases_of(&["standard-webhooks"]));
    assert_eq!(all.len(), 47 + 18 + 9 + 7 + 14);
    let mut wrong = Vec::new();
    for c in &all {
        let s = &c.spec;
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_herald"));
        cmd.args(["verify-receipt", "--scheme", c.scheme]);
        let secret = match s["public_key"].as_str() {
            Some(pk) => format!("whpk_{pk}"),
            None => s["secret"].as_str().unwrap().to_owned(),
        };
        cmd.args(["--secret", &secret]);
        for (n, v) in s["headers"].as_object().unwrap() {
            cmd.args(["--header", &format!("{n}: {}", v.as_str().unwrap())]);
        }
        cmd.arg("--body-file").arg(c.dir.join("body"));
        if let Some(url) = s["url"].as_str() {
            cmd.args(["--url", url]);
        }
        if let Some(m) = s["method"].as_str() {
            cmd.args(["--method", m]);
        }
        for (k, v) in s["options"].as_object().into_iter().flatten() {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            cmd.args(["--param", &format!("{k}={v}")]);
        }
        cmd.args(["--at", &s["at"].as_i64().unwrap().to_string()]);
        let out = cmd.output().unwrap();
        let verdict: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}: {}", c.name, String::from_utf8_lossy(&out.stderr)));
        // A receipt outside its time window is refused whatever its signature, which the
        // verdict still checks (`signature_valid`, to point at the clock).
        let stale = verdict["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("timestamp outside the tolerance"));
        let accepted = verdict["signature_valid"].as_bool().unwrap() && !stale;
        let expected = s["expect"] == "valid";
        // Exit 0 exactly when stored; a verified body that is not a receipt is 1 with status 400.
        let exit_ok = out.status.code() == Some(if verdict["valid"] == true { 0 } else { 1 });
        if accepted != expected || !exit_ok {
            wrong.push(format!("{}: {verdict}", c.name));
        }
        // Refused for its time alone: every such case of the corpus is signed with its secret,
        // and the verdict says so (MessageBird's expired token too, whose window is its own).
        if stale && verdict["signature_valid"] != true {
            wrong.push(format!(
                "{} (stale, signature not checked): {verdict}",
                c.name
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn verify_receipt_refuses_unknown_or_misplaced_params_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("body");
    std::fs::write(&body, b"").unwrap();
    let run = |param: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["verify-receipt", "--scheme", "vonage", "--secret", "s"])
            .arg("--body-file")
            .arg(&body)
            .args(["--param", param])
            .output()
            .unwrap()
    };
    for (param, says) in [
        (
            "signature_method=crc32",
            "--param signature_method: \"crc32\" is not one of",
        ),
        ("no_such_option=1", "no_such_option"),
        ("secrets=x", "--param secrets: is given by its own option"),
        ("novalue", "KEY=VALUE"),
        // A value of the wrong kind names its key; a key the scheme does not read is refused.
        (
            "tolerance_seconds=abc",
            "--param tolerance_seconds: invalid type",
        ),
        (
            "event_id_pointer=/id",
            "--param event_id_pointer: does not apply to scheme vonage",
        ),
    ] {
        let out = run(param);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{param}: {err}");
        assert!(err.contains(says), "{param}: {err}");
    }
    // A source it cannot build names the option to change, not a configuration key.
    for (args, says) in [
        (
            &["--scheme", "nope", "--secret", "s"][..],
            "--scheme: unknown scheme \"nope\"; one of: standard-webhooks",
        ),
        (
            &["--scheme", "twilio", "--secret", "s"][..],
            "--url: is required for twilio",
        ),
        (
            &["--scheme", "ses", "--secret", "s"][..],
            "--secret: does not apply to scheme ses",
        ),
        (
            &["--scheme", "postmark", "--secret", "no-colon"][..],
            "--secret: postmark takes username:password",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
            .arg("verify-receipt")
            .args(args)
            .arg("--body-file")
            .arg(&body)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // Nor is a body file it cannot read a refused signature (exit 1).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["verify-receipt", "--scheme", "stripe", "--secret", "s"])
        .args(["--body-file", "/nonexistent/body.json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--body-file: cannot read"), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .args([
            "verify-receipt",
            "--scheme",
            "ses",
            "--cert-file",
            "/nonexistent/c.pem",
        ])
        .arg("--body-file")
        .arg(&body)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--cert-file: cannot read"), "{err}");
}

#[test]
fn verify_receipt_checks_a_published_example_offline() {
    let c = cases()
        .into_iter()
        .find(|c| c.name == "stripe/sdk-valid-1")
        .unwrap();
    let at = c.spec["at"].as_i64().unwrap();
    let run_at = |body: &Path, at: i64, secret: &str| {
        let header = c.spec["headers"]["Stripe-Signature"].as_str().unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["verify-receipt", "--scheme", "stripe", "--secret", secret])
            .args(["--header", &format!("Stripe-Signature: {header}")])
            .arg("--body-file")
            .arg(body)
            .args(["--at", &at.to_string()])
            .output()
            .unwrap()
    };
    let run = |body: &Path| run_at(body, at, "webhook_secret");
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
    // Outside its time window (an hour later): refused, but the signature itself matches, and
    // the verdict says so, pointing at the clock rather than the secret; with the wrong secret
    // it does not.
    for (secret, matches) in [("webhook_secret", true), ("another_secret", false)] {
        let late = run_at(&c.dir.join("body"), at + 3600, secret);
        assert_eq!(late.status.code(), Some(1), "{secret}");
        let verdict: Value = serde_json::from_slice(&late.stdout).unwrap();
        assert_eq!(verdict["signature_valid"], matches, "{secret}: {verdict}");
        let error = verdict["error"].as_str().unwrap();
        assert!(
            error.starts_with("timestamp outside the tolerance"),
            "{error}"
        );
        assert_eq!(
            error.contains("the signature itself matches"),
            matches,
            "{error}"
        );
    }
}
