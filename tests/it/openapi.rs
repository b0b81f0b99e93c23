//! `GET /openapi.json` against a running app: every documented operation is a served route (not
//! the default 404), and real answers match their documented schemas — closed: a field the API
//! returns that the document does not name is a failure.

use serde_json::{Value, json};

use crate::both_backends;
use crate::support::{Backend, Receiver, Reply, app};

async fn document(t: &crate::support::TestApp) -> Value {
    // No token: the document is open.
    let r = reqwest::get(format!("{}/openapi.json", t.base))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    r.json().await.unwrap()
}

/// The answer of a route nobody registered: the default 404, or its 405 for a path served with
/// other methods.
fn is_default_404(status: u16, body: &Value) -> bool {
    (status == 404 && body["title"] == "No such route")
        || (status == 405 && body["title"] == "This route does not take that method")
}

async fn every_documented_operation_is_served(backend: Backend) {
    let t = app::spawn_app(backend).await;
    let d = document(&t).await;
    // The probe can tell: a route nobody registered is the default 404.
    let r = t
        .http
        .get(format!("{}/v1/no-such-route", t.base))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert!(is_default_404(status, &r.json().await.unwrap()));
    let mut probed = 0;
    for (method, path, _) in operations(&d) {
        let (status, body) = probe(&t, &t.http, &method, &path).await;
        assert!(
            !is_default_404(status, &body),
            "{method} {path} is documented but not served"
        );
        probed += 1;
    }
    // A path served with another method: 405, naming the methods it takes (in the problem and
    // in `Allow`); a path not served at all: 404.
    for (method, path, allow) in [
        ("PUT", "/v1/ingest/esp", "POST, GET"),
        ("DELETE", "/v1/messages/some-id", "GET, HEAD"),
        ("GET", "/v1/messages", "POST"),
    ] {
        let r = t
            .http
            .request(method.parse().unwrap(), format!("{}{path}", t.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405, "{method} {path}");
        assert_eq!(r.headers()["allow"], allow, "{method} {path}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["detail"], format!("it takes {allow}"));
    }
    let r = t
        .http
        .put(format!("{}/v1/ingest", t.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Every route `configure` registers was probed.
    assert_eq!(probed, herald::http::openapi::listing().0.len());
    assert!(probed >= 18, "{probed} operations");
    t.stop().await;
}

/// (method, path, operation) of every operation in the document.
fn operations(d: &Value) -> Vec<(String, String, Value)> {
    let mut ops = Vec::new();
    for (path, item) in d["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            ops.push((method.clone(), path.clone(), op.clone()));
        }
    }
    ops
}

/// Calls `method path` with made-up parameters (no such message, endpoint or source) and, for a
/// POST, an empty object (refused for its fields: nothing is written).
async fn probe(
    t: &crate::support::TestApp,
    client: &reqwest::Client,
    method: &str,
    path: &str,
) -> (u16, Value) {
    let concrete = path
        .replace("{event_id}", "openapi-probe")
        .replace("{fingerprint}", "0123456789abcdef")
        .replace("{name}", "no-such-endpoint")
        .replace("{source}", "no-such-source");
    assert!(
        !concrete.contains('{'),
        "{path}: a parameter the probe does not know"
    );
    let url = format!("{}{concrete}", t.base);
    let req = match method {
        "get" => client.get(&url),
        "post" => client.post(&url).json(&json!({})),
        other => panic!("{other} {path}: a method the probe does not send"),
    };
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The scopes each operation documents are the ones Herald enforces: no token is a 401 on every
/// token route (and on no open one), a token whose scope is listed passes the guard, any other
/// is a 403.
async fn documented_scopes_are_the_enforced_ones(backend: Backend) {
    let digest = herald::auth::digest_hex;
    let extra = format!(
        "[tokens.shop]\nsha256 = \"{}\"\nscope = \"send\"\n\
         [tokens.desk]\nsha256 = \"{}\"\nscope = \"support\"\n",
        digest("oa-send-token-0123456789"),
        digest("oa-support-token-0123456789"),
    );
    let t = app::spawn_app_with(backend, &extra).await;
    let d = document(&t).await;
    let clients = [
        ("send", app::client_with_token("oa-send-token-0123456789")),
        (
            "support",
            app::client_with_token("oa-support-token-0123456789"),
        ),
        ("admin", app::client_with_token(app::ADMIN_TOKEN)),
    ];
    let anonymous = reqwest::Client::new();
    let mut guarded = 0;
    for (method, path, op) in operations(&d) {
        let what = format!("{method} {path}");
        let scopes: Vec<String> =
            serde_json::from_value(op["x-herald-scope"].clone()).unwrap_or_default();
        let (status, _) = probe(&t, &anonymous, &method, &path).await;
        assert_eq!(
            status == 401,
            !scopes.is_empty(),
            "{what} without a token: {status}"
        );
        if scopes.is_empty() {
            continue;
        }
        guarded += 1;
        for (scope, client) in &clients {
            let (status, body) = probe(&t, client, &method, &path).await;
            let listed = scopes.iter().any(|s| s == scope);
            assert_ne!(status, 401, "{what} as {scope}");
            assert_eq!(
                status == 403,
                !listed,
                "{what} as {scope}: {status} {body}, documented {scopes:?}"
            );
        }
    }
    assert!(guarded >= 12, "{guarded} token routes");
    t.stop().await;
}

/// The schema `r` names.
fn resolve<'a>(d: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => {
            let name = r.strip_prefix("#/components/schemas/").unwrap();
            resolve(d, &d["components"]["schemas"][name])
        }
        None => schema,
    }
}

/// Checks `v` against `schema` (the subset utoipa writes: `type` (one or several), `enum`,
/// `properties`, `required`, `items`, `oneOf`, `$ref`, `format: date-time`), treating every object
/// with `properties` as closed. Returns where it does not match.
fn check(d: &Value, schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    let schema = resolve(d, schema);
    if let Some(alts) = schema["oneOf"].as_array() {
        let ok = alts.iter().filter(|s| check(d, s, v, at).is_ok()).count();
        return if ok == 1 {
            Ok(())
        } else {
            Err(format!("{at}: {ok} of oneOf match {v}"))
        };
    }
    if let Some(t) = schema.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let is = |ty: &str| match ty {
            "null" => v.is_null(),
            "string" => v.is_string(),
            "boolean" => v.is_boolean(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "array" => v.is_array(),
            "object" => v.is_object(),
            _ => false,
        };
        if !types.iter().any(|ty| is(ty)) {
            return Err(format!("{at}: {v} is not {types:?}"));
        }
    }
    if schema["format"] == "date-time"
        && let Some(t) = v.as_str()
        && chrono::DateTime::parse_from_rfc3339(t).is_err()
    {
        return Err(format!("{at}: {t:?} is not an RFC 3339 time"));
    }
    if let Some(values) = schema["enum"].as_array()
        && !values.contains(v)
    {
        return Err(format!("{at}: {v} is not one of {values:?}"));
    }
    if let (Some(obj), Some(props)) = (v.as_object(), schema["properties"].as_object()) {
        for req in schema["required"].as_array().into_iter().flatten() {
            let k = req.as_str().unwrap();
            if !obj.contains_key(k) {
                return Err(format!("{at}: required {k} missing"));
            }
        }
        for (k, val) in obj {
            let s = props
                .get(k)
                .ok_or_else(|| format!("{at}: {k} is not in the document"))?;
            check(d, s, val, &format!("{at}.{k}"))?;
        }
    }
    if let (Some(items), Some(s)) = (v.as_array(), schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            check(d, s, item, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

/// Sends `req` and checks its answer against the documented response of `method path` for its
/// status.
async fn answer(d: &Value, method: &str, path: &str, req: reqwest::RequestBuilder) -> Value {
    let r = req.send().await.unwrap();
    let status = r.status().as_u16().to_string();
    let content_type = r.headers()["content-type"].to_str().unwrap().to_owned();
    let body: Value = r.json().await.unwrap();
    let op = &d["paths"][path][method];
    let documented = &op["responses"][&status];
    assert!(
        documented.is_object(),
        "{method} {path} answered {status}, not documented: {body}"
    );
    let media = &documented["content"][&content_type];
    assert!(
        media.is_object(),
        "{method} {path} {status}: {content_type} not documented"
    );
    if let Err(e) = check(d, &media["schema"], &body, "$") {
        panic!("{method} {path} {status}: {e}\n{body}");
    }
    body
}

async fn real_answers_match_their_schemas(backend: Backend) {
    let rx = Receiver::start().await;
    let t = app::spawn_app_with(
        backend,
        &format!(
            "[endpoints.orders]\nurl = \"{}\"\nevent_types = [\"order.*\"]\n",
            rx.url
        ),
    )
    .await;
    let d = document(&t).await;
    let base = &t.base;
    let http = &t.http;

    // The validator can fail: a field the document does not name, a wrong type.
    let view = &json!({"$ref": "#/components/schemas/IngestAck"});
    assert!(check(&d, view, &json!({"stored": 1, "duplicates": 0}), "$").is_ok());
    assert!(
        check(
            &d,
            view,
            &json!({"stored": 1, "duplicates": 0, "x": 1}),
            "$"
        )
        .is_err()
    );
    assert!(check(&d, view, &json!({"stored": "1", "duplicates": 0}), "$").is_err());
    assert!(check(&d, view, &json!({"stored": 1}), "$").is_err());
    let time = &json!({"type": "string", "format": "date-time"});
    assert!(check(&d, time, &json!("2026-12-01T09:00:00.000000Z"), "$").is_ok());
    assert!(check(&d, time, &json!("tomorrow"), "$").is_err());

    rx.script([Reply::Status(200)]);
    let msg = json!({"event_id": "oa-1", "channel": "webhook", "destination": rx.url,
        "payload": {"body": {"n": 1}}});
    let created = answer(
        &d,
        "post",
        "/v1/messages",
        http.post(format!("{base}/v1/messages")).json(&msg),
    )
    .await;
    assert_eq!(created["state"], "scheduled");
    answer(
        &d,
        "post",
        "/v1/messages",
        http.post(format!("{base}/v1/messages")).json(&msg),
    )
    .await;
    let fanout = json!({"event_id": "oa-fan", "channel": "webhook",
        "destination": "type:order.placed", "payload": {"body": {}}});
    let f = answer(
        &d,
        "post",
        "/v1/messages",
        http.post(format!("{base}/v1/messages")).json(&fanout),
    )
    .await;
    assert_eq!(f["endpoints"], json!(["orders"]));
    let bad = json!({"channel": "sms", "destination": "x", "payload": [], "extra": 1});
    let p = answer(
        &d,
        "post",
        "/v1/messages",
        http.post(format!("{base}/v1/messages")).json(&bad),
    )
    .await;
    assert_eq!(p["status"], 422);

    t.run_until_idle().await;
    let m = "/v1/messages/{event_id}";
    let shown = answer(&d, "get", m, http.get(format!("{base}/v1/messages/oa-1"))).await;
    assert_eq!(shown["state"], "delivered");
    answer(&d, "get", m, http.get(format!("{base}/v1/messages/oa-fan"))).await;
    answer(&d, "get", m, http.get(format!("{base}/v1/messages/nope"))).await;
    // Without a token: 401.
    answer(
        &d,
        "get",
        m,
        reqwest::Client::new().get(format!("{base}/v1/messages/oa-1")),
    )
    .await;
    let fp = shown["fingerprint"].as_str().unwrap();
    let e = answer(
        &d,
        "get",
        "/v1/sends/{fingerprint}",
        http.get(format!("{base}/v1/sends/{fp}")),
    )
    .await;
    assert_eq!(e["attempt_timeline"].as_array().unwrap().len(), 1);
    answer(
        &d,
        "get",
        "/v1/messages/{event_id}/explain",
        http.get(format!("{base}/v1/messages/oa-1/explain")),
    )
    .await;
    // Delivered: a replay needs force (409), then is done.
    let replay = "/v1/messages/{event_id}/replay";
    let url = format!("{base}/v1/messages/oa-1/replay");
    let p = answer(
        &d,
        "post",
        replay,
        http.post(&url).json(&json!({"reason": "r"})),
    )
    .await;
    assert_eq!(p["status"], 409);
    let done = answer(
        &d,
        "post",
        replay,
        http.post(&url)
            .json(&json!({"reason": "again", "force": true})),
    )
    .await;
    assert_eq!(done["replay"]["forced"], true);

    let later = json!({"event_id": "oa-2", "channel": "webhook", "destination": rx.url,
        "payload": {"body": {}}, "scheduled_at": "2099-01-01T00:00:00Z"});
    answer(
        &d,
        "post",
        "/v1/messages",
        http.post(format!("{base}/v1/messages")).json(&later),
    )
    .await;
    let c = answer(
        &d,
        "post",
        "/v1/messages/{event_id}/cancel",
        http.post(format!("{base}/v1/messages/oa-2/cancel")),
    )
    .await;
    assert_eq!(c["state"], "canceled");

    answer(
        &d,
        "get",
        "/v1/dead-letters",
        http.get(format!("{base}/v1/dead-letters?limit=5")),
    )
    .await;
    answer(
        &d,
        "get",
        "/v1/dead-letters",
        http.get(format!("{base}/v1/dead-letters?colour=red")),
    )
    .await;
    answer(
        &d,
        "post",
        "/v1/dead-letters/redrive",
        http.post(format!("{base}/v1/dead-letters/redrive"))
            .json(&json!({"reason": "none there"})),
    )
    .await;
    let eps = answer(
        &d,
        "get",
        "/v1/endpoints",
        http.get(format!("{base}/v1/endpoints")),
    )
    .await;
    assert_eq!(eps["endpoints"][0]["name"], "orders");
    answer(
        &d,
        "post",
        "/v1/endpoints/{name}/enable",
        http.post(format!("{base}/v1/endpoints/orders/enable")),
    )
    .await;
    answer(
        &d,
        "get",
        "/v1/receipts/unmatched",
        http.get(format!("{base}/v1/receipts/unmatched")),
    )
    .await;
    answer(
        &d,
        "post",
        "/v1/ingest/{source}",
        http.post(format!("{base}/v1/ingest/nope")).body("{}"),
    )
    .await;
    // Ready, or not (the test drives the sender itself): either answer is as documented.
    answer(&d, "get", "/readyz", http.get(format!("{base}/readyz"))).await;
    t.stop().await;
}

both_backends!(
    every_documented_operation_is_served,
    documented_scopes_are_the_enforced_ones,
    real_answers_match_their_schemas
);
