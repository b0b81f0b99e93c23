//! `GET /openapi.json`: the OpenAPI 3.1 document of the HTTP API, generated from the code.
//!
//! One source of truth: [`super::routes`] lists every handler once; [`super::configure`]
//! registers each at the method(s) and path its `#[utoipa::path]` annotation declares, and
//! [`document`] describes exactly those operations. A route cannot be served without being
//! documented, nor documented without being served (`tests/it/openapi.rs` checks both against a
//! running app). Response schemas are the serialized view types themselves (`ToSchema` next to
//! `Serialize`); request bodies, which the handlers parse by hand to name every bad field, are
//! described by the schema-only types below.

use std::sync::OnceLock;

use actix_web::{FromRequest, Handler, HttpResponse, Responder, web};
use serde::Serialize;
use utoipa::openapi::path::{HttpMethod, Operation, Paths};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{Content, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi, ToSchema};

use super::view::{FanOutView, MessageView};

/// The name of the bearer security scheme in the document.
pub const BEARER: &str = "bearer";

/// Where routes go: an actix `ServiceConfig` (serving them) or a [`Listing`] (describing them).
pub trait Routes {
    /// `handler` at the method(s) and path `P` (its `#[utoipa::path]` struct) declares.
    fn add<P: utoipa::Path, H, Args>(&mut self, handler: H)
    where
        H: Handler<Args>,
        Args: FromRequest + 'static,
        H::Output: Responder + 'static;
}

fn actix_method(m: &HttpMethod) -> actix_web::http::Method {
    use actix_web::http::Method;
    match m {
        HttpMethod::Get => Method::GET,
        HttpMethod::Post => Method::POST,
        HttpMethod::Put => Method::PUT,
        HttpMethod::Delete => Method::DELETE,
        HttpMethod::Options => Method::OPTIONS,
        HttpMethod::Head => Method::HEAD,
        HttpMethod::Patch => Method::PATCH,
        HttpMethod::Trace => Method::TRACE,
    }
}

impl Routes for web::ServiceConfig {
    fn add<P: utoipa::Path, H, Args>(&mut self, handler: H)
    where
        H: Handler<Args>,
        Args: FromRequest + 'static,
        H::Output: Responder + 'static,
    {
        let path = P::path();
        for m in P::methods() {
            self.route(&path, web::method(actix_method(&m)).to(handler.clone()));
        }
    }
}

/// One listed route.
#[derive(Clone)]
pub struct Listed {
    /// Upper case: `GET`, `POST`.
    pub method: String,
    pub path: String,
    /// The handler function's name (`show_message`): its operation id must be the same.
    pub handler: &'static str,
    pub operation: Operation,
}

/// Every route [`super::routes`] lists, in its order.
#[derive(Default)]
pub struct Listing(pub Vec<Listed>);

impl Routes for Listing {
    fn add<P: utoipa::Path, H, Args>(&mut self, _handler: H)
    where
        H: Handler<Args>,
        Args: FromRequest + 'static,
        H::Output: Responder + 'static,
    {
        let full = std::any::type_name::<H>();
        let handler = full.rsplit_once("::").map_or(full, |(_, h)| h);
        for m in P::methods() {
            self.0.push(Listed {
                method: actix_method(&m).as_str().to_owned(),
                path: P::path(),
                handler,
                operation: P::operation(),
            });
        }
    }
}

/// The routes as listed: what [`super::configure`] serves.
pub fn listing() -> Listing {
    let mut l = Listing::default();
    super::routes(&mut l);
    l
}

/// The document's fixed parts; the paths come from [`listing`].
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Herald",
        description = "Herald's HTTP API: enqueue messages (webhooks, email) through the \
            transactional outbox, follow their delivery, ingest providers' delivery receipts, \
            and support's explain / replay / dead-letter routes.\n\n\
            Token-guarded routes take `Authorization: Bearer <token>`; each operation's \
            `security` lists the token scopes that may call it (alternatives), repeated as \
            `x-herald-scope`. A missing or unknown token is a 401, a token without the scope a \
            403. `/v1/ingest/{source}` is authenticated by the provider's signature instead. \
            Errors are `application/problem+json` (RFC 9457) naming the offending `field`."
    ),
    components(schemas(
        MessageView,
        FanOutView,
        Enqueued,
        Payload,
        NewMessageRequest,
        WebhookPayload,
        EmailPayload,
        EmailAttachment,
        ReplayRequestBody,
        SkipRequestBody,
        RedriveRequestBody,
        super::problem::ProblemBody,
        super::view::Ready,
        super::view::NotReadyProblem,
        super::view::UnmatchedReceipts,
        super::view::EndpointList,
        super::view::EndpointEnabled,
        super::view::IngestAck,
        crate::support::view::Explanation,
        crate::support::Replayed,
        crate::support::DeadLetterPage,
        crate::support::RedriveReport,
    )),
    modifiers(&Security)
)]
struct ApiDoc;

/// The bearer scheme; every operation that names it also gets `x-herald-scope` (the scopes
/// it accepts) and the token errors 401 and 403.
struct Security;

impl Modify for Security {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        let mut http = Http::new(HttpAuthScheme::Bearer);
        http.description = Some(
            "An API token: `HERALD_API_TOKEN` (scope admin) or a `[tokens.NAME]` entry with \
             scope `send`, `support` or `admin`."
                .into(),
        );
        components.add_security_scheme(BEARER, SecurityScheme::Http(http));
    }
}

fn problem_response(description: &str) -> RefOr<utoipa::openapi::Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/problem+json",
            Content::new(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                "Problem",
            )))),
        )
        .into()
}

/// The document's tags (groups of operations, as generated clients name their modules).
const TAGS: &[(&str, &str)] = &[
    ("messages", "Enqueue messages and follow them"),
    ("receipts", "Providers' delivery receipts"),
    ("endpoints", "Named webhook endpoints"),
    (
        "support",
        "Explain, replay, dead letters and redrive (scope support or admin)",
    ),
    ("operations", "Health, readiness, metrics and this document"),
];

/// The tag of the operation at `path` (by the route's resource).
fn tag_of(path: &str) -> &'static str {
    let support = path.starts_with("/v1/sends/")
        || path.starts_with("/v1/dead-letters")
        || path.ends_with("/explain")
        || path.ends_with("/replay")
        || path.ends_with("/skip");
    if support {
        "support"
    } else if path.starts_with("/v1/messages") {
        "messages"
    } else if path.starts_with("/v1/ingest/") || path.starts_with("/v1/receipts/") {
        "receipts"
    } else if path.starts_with("/v1/endpoints") {
        "endpoints"
    } else {
        "operations"
    }
}

/// Fills in what every operation of a kind shares: the scopes, the token errors, and the
/// storage errors (500, 503 with `Retry-After`) of every route that reads the database.
fn complete(op: &mut Operation) {
    let id = op.operation_id.clone().unwrap_or_default();
    let scopes: Vec<String> = op
        .security
        .iter()
        .flatten()
        .filter_map(|r| serde_json::to_value(r).ok())
        .filter_map(|v| v.get(BEARER).cloned())
        .filter_map(|v| serde_json::from_value::<Vec<String>>(v).ok())
        .flatten()
        .collect();
    let responses = &mut op.responses.responses;
    if !scopes.is_empty() {
        responses.entry("401".into()).or_insert_with(|| {
            problem_response("No valid bearer token (`WWW-Authenticate: Bearer`)")
        });
        responses.entry("403".into()).or_insert_with(|| {
            problem_response(&format!(
                "The token's scope is not one of: {}",
                scopes.join(", ")
            ))
        });
        let ext = op.extensions.get_or_insert_with(Default::default);
        ext.insert("x-herald-scope".into(), serde_json::json!(scopes));
    }
    if !matches!(id.as_str(), "healthz" | "openapi_json") {
        responses
            .entry("500".into())
            .or_insert_with(|| problem_response("Internal error; nothing was stored"));
        responses.entry("503".into()).or_insert_with(|| {
            problem_response(
                "Storage is unavailable: send the same request again (`Retry-After` says when); a write that was not confirmed in time may still be stored, the same event id never twice",
            )
        });
    }
}

/// The whole document: [`ApiDoc`] with every listed route's operation.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut api = ApiDoc::openapi();
    let mut paths = Paths::new();
    for l in listing().0 {
        let mut op = l.operation;
        op.tags = Some(vec![tag_of(&l.path).to_owned()]);
        complete(&mut op);
        let method = match l.method.as_str() {
            "GET" => HttpMethod::Get,
            "POST" => HttpMethod::Post,
            "PUT" => HttpMethod::Put,
            "DELETE" => HttpMethod::Delete,
            "PATCH" => HttpMethod::Patch,
            "HEAD" => HttpMethod::Head,
            "OPTIONS" => HttpMethod::Options,
            _ => HttpMethod::Trace,
        };
        paths.add_path_operation(&l.path, vec![method], op);
    }
    api.paths = paths;
    api.tags = Some(
        TAGS.iter()
            .map(|(name, about)| {
                let mut t = utoipa::openapi::tag::Tag::new(*name);
                t.description = Some((*about).to_owned());
                t
            })
            .collect(),
    );
    api
}

/// `GET /openapi.json`: this document (built once).
#[utoipa::path(
    get,
    path = "/openapi.json",
    description = "This OpenAPI 3.1 document. Unauthenticated.",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json", body = Object))
)]
pub async fn openapi_json() -> HttpResponse {
    static TEXT: OnceLock<String> = OnceLock::new();
    let text = TEXT.get_or_init(|| {
        document().to_pretty_json().unwrap_or_else(|e| {
            format!("{{\"error\": \"the document could not be written: {e}\"}}")
        })
    });
    HttpResponse::Ok()
        .content_type("application/json")
        .body(text.as_str())
}

/// `POST /v1/messages` and `GET /v1/messages/{event_id}`: one message, or a fan-out (a
/// `type:EVENT.TYPE` destination) with its children.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code, clippy::large_enum_variant)] // A schema only: never built.
pub enum Enqueued {
    Message(MessageView),
    FanOut(FanOutView),
}

/// The `POST /v1/messages` body (DESIGN.md "Interface contract"). Unknown fields are refused.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // A schema only: `parse_new_message` reads the body.
pub struct NewMessageRequest {
    /// 1–255 visible ASCII characters; or send it as the `Idempotency-Key` header.
    #[schema(
        example = "order-42:placed",
        min_length = 1,
        max_length = 255,
        pattern = "^[!-~]+$"
    )]
    event_id: Option<String>,
    channel: crate::domain::Channel,
    /// Webhook: an `http(s)://` URL, `endpoint:NAME` or `type:EVENT.TYPE` (fan-out); email:
    /// the recipient.
    #[schema(example = "https://example.com/hooks")]
    destination: String,
    /// A webhook or an email payload, by `channel`.
    payload: Payload,
    /// Not before this time (RFC 3339).
    #[schema(format = DateTime)]
    scheduled_at: Option<String>,
    /// Never after this time (RFC 3339).
    #[schema(format = DateTime)]
    expires_at: Option<String>,
    /// Default `at_least_once`.
    semantics: Option<crate::domain::Semantics>,
    /// The attempt budget (default: the configured one).
    #[schema(minimum = 1)]
    max_attempts: Option<u32>,
    /// Messages with the same key to the same destination are delivered one at a time, in
    /// order (README "Ordered delivery"); 1–255 visible ASCII characters.
    #[schema(
        example = "order-42",
        min_length = 1,
        max_length = 255,
        pattern = "^[!-~]+$"
    )]
    ordering_key: Option<String>,
    /// What a keyed message that ends in `dead_letter` or `unconfirmed` does to the ones after
    /// it: `block` or `skip` (default: the named endpoint's, else `block`).
    ordering_policy: Option<crate::domain::OrderingPolicy>,
}

/// The payload by channel.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code, clippy::large_enum_variant)] // A schema only: never built.
pub enum Payload {
    Webhook(WebhookPayload),
    Email(EmailPayload),
}

/// A webhook payload: the request body sent is exactly `body` serialized.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct WebhookPayload {
    /// Any JSON.
    #[schema(value_type = Object)]
    body: serde_json::Value,
    /// Extra request headers; Herald's own cannot be overridden.
    headers: Option<std::collections::BTreeMap<String, String>>,
}

/// An email payload (README "Email messages"): `text` or `html` required.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct EmailPayload {
    from: Option<String>,
    to: Option<Vec<String>>,
    cc: Option<Vec<String>>,
    bcc: Option<Vec<String>>,
    reply_to: Option<String>,
    subject: String,
    text: Option<String>,
    html: Option<String>,
    /// Custom `X-…` headers.
    headers: Option<std::collections::BTreeMap<String, String>>,
    /// At most 10, at most 1 MiB decoded together.
    attachments: Option<Vec<EmailAttachment>>,
    /// The `List-Unsubscribe` header: one to four `<URI>`s.
    list_unsubscribe: Option<String>,
    /// `true`: also `List-Unsubscribe-Post: List-Unsubscribe=One-Click`.
    list_unsubscribe_post: Option<bool>,
}

/// One email attachment.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct EmailAttachment {
    filename: String,
    content_type: String,
    /// Standard base64 with padding.
    content_base64: String,
}

/// `POST /v1/messages/{event_id}/skip`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // A schema only: `support::parse_skip_body` reads the body.
pub struct SkipRequestBody {
    /// Why (at most 500 characters, no control characters); audited.
    reason: String,
}

/// `POST /v1/sends/{fingerprint}/replay` and `POST /v1/messages/{event_id}/replay`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // A schema only: `support::parse_replay_body` reads the body.
pub struct ReplayRequestBody {
    /// Why (at most 500 characters, no control characters); audited.
    reason: String,
    /// Needed to replay a `delivered` message.
    force: Option<bool>,
    /// Absent: keep `expires_at`; `null`: clear it; a time: set it.
    #[schema(format = DateTime)]
    expires_at: Option<String>,
}

/// `POST /v1/dead-letters/redrive`: the reason, a limit and the listing's filters.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // A schema only: `support::parse_redrive_body` reads the body.
pub struct RedriveRequestBody {
    reason: String,
    /// Default 100, at most 1000.
    #[schema(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    #[schema(format = DateTime)]
    expires_at: Option<String>,
    /// An attempt class, or `unconfirmed`.
    class: Option<String>,
    /// `endpoint:NAME` or a host.
    destination: Option<String>,
    channel: Option<crate::domain::Channel>,
    #[schema(format = DateTime)]
    since: Option<String>,
    #[schema(format = DateTime)]
    until: Option<String>,
    /// The `next` of the redrive before, with the same filters (others: 422): start past the
    /// dead letters it looked at (those it skipped are still dead letters), among those
    /// dead-lettered before the sweep's first run.
    after: Option<String>,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::*;

    fn doc() -> Value {
        serde_json::to_value(document()).unwrap()
    }

    /// (method, path) of every operation in the document.
    fn operations(d: &Value) -> Vec<(String, String, Value)> {
        let mut ops = Vec::new();
        for (path, item) in d["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                ops.push((method.to_uppercase(), path.clone(), op.clone()));
            }
        }
        ops
    }

    #[test]
    fn every_route_served_is_documented_once_and_nothing_else() {
        let listed = listing().0;
        let served: BTreeSet<_> = listed
            .iter()
            .map(|l| (l.method.clone(), l.path.clone()))
            .collect();
        assert_eq!(served.len(), listed.len(), "a route is listed twice");
        let d = doc();
        let documented: BTreeSet<_> = operations(&d).into_iter().map(|(m, p, _)| (m, p)).collect();
        assert_eq!(served, documented);
        // The routes of the interface contract are all there.
        for (m, p) in [
            ("POST", "/v1/messages"),
            ("GET", "/v1/messages/{event_id}"),
            ("POST", "/v1/messages/{event_id}/cancel"),
            ("POST", "/v1/ingest/{source}"),
            ("GET", "/v1/ingest/{source}"),
            ("GET", "/v1/sends/{fingerprint}"),
            ("POST", "/v1/sends/{fingerprint}/replay"),
            ("GET", "/v1/dead-letters"),
            ("POST", "/v1/dead-letters/redrive"),
            ("GET", "/metrics"),
            ("GET", "/healthz"),
            ("GET", "/readyz"),
            ("GET", "/openapi.json"),
        ] {
            assert!(served.contains(&(m.into(), p.into())), "{m} {p}");
        }
        // Each entry pairs a handler with its own annotation, and operation ids are unique.
        let mut ids = BTreeSet::new();
        for l in &listed {
            assert_eq!(l.operation.operation_id.as_deref(), Some(l.handler));
            assert!(ids.insert(l.handler), "{} twice", l.handler);
        }
    }

    /// Every `$ref` in `v`.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                if let Some(Value::String(r)) = o.get("$ref") {
                    out.push(r.clone());
                }
                o.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    #[test]
    fn the_document_is_openapi_3_and_every_ref_resolves() {
        let d = doc();
        assert!(d["openapi"].as_str().unwrap().starts_with("3."));
        assert_eq!(d["info"]["title"], "Herald");
        assert_eq!(d["info"]["version"], env!("CARGO_PKG_VERSION"));
        let mut all = Vec::new();
        refs(&d, &mut all);
        assert!(all.len() > 20);
        for r in &all {
            let name = r.strip_prefix("#/components/schemas/").expect(r);
            assert!(
                d["components"]["schemas"][name].is_object(),
                "{r} does not resolve"
            );
        }
        for (method, path, op) in operations(&d) {
            let what = format!("{method} {path}");
            let responses = op["responses"].as_object().unwrap();
            assert!(
                responses.keys().any(|s| s.starts_with('2')),
                "{what}: no 2xx"
            );
            for (status, r) in responses {
                assert!(r["description"].is_string(), "{what} {status}");
                if status.starts_with('4') || status.starts_with('5') {
                    let content = r["content"].as_object().unwrap();
                    assert!(
                        content.keys().all(|c| c == "application/problem+json"),
                        "{what} {status}: {content:?}"
                    );
                }
            }
            // Every `{param}` of the path is a declared path parameter, and nothing else is.
            let in_path: BTreeSet<String> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
                .map(str::to_owned)
                .collect();
            let declared: BTreeSet<String> = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "path")
                .map(|p| {
                    assert_eq!(p["required"], true, "{what}");
                    p["name"].as_str().unwrap().to_owned()
                })
                .collect();
            assert_eq!(in_path, declared, "{what}");
            // Token routes name the bearer scheme with Herald's scopes, and say so in
            // `x-herald-scope`; the open ones (health, metrics, this document, ingest) none.
            let scopes: BTreeSet<String> = op["security"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|req| req[BEARER].as_array().unwrap().clone())
                .map(|s| s.as_str().unwrap().to_owned())
                .collect();
            let open = !path.starts_with("/v1/") || path.starts_with("/v1/ingest/");
            assert_eq!(scopes.is_empty(), open, "{what}");
            assert!(
                scopes
                    .iter()
                    .all(|s| ["send", "support", "admin"].contains(&s.as_str()))
            );
            if !open {
                assert!(scopes.contains("admin"), "{what}: admin may do everything");
                let ext: BTreeSet<String> =
                    serde_json::from_value(op["x-herald-scope"].clone()).unwrap();
                assert_eq!(ext, scopes, "{what}");
                assert!(responses.contains_key("401") && responses.contains_key("403"));
            }
        }
        assert_eq!(
            d["components"]["securitySchemes"][BEARER]["scheme"],
            "bearer"
        );
        // Every operation is in one declared tag, and every tag has an operation.
        let declared: BTreeSet<&str> = TAGS.iter().map(|(t, _)| *t).collect();
        let used: BTreeSet<String> = operations(&d)
            .iter()
            .map(|(_, _, op)| {
                let tags = op["tags"].as_array().unwrap();
                assert_eq!(tags.len(), 1);
                tags[0].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(
            used.iter().map(String::as_str).collect::<BTreeSet<_>>(),
            declared
        );
        assert_eq!(tag_of("/v1/messages/{event_id}/replay"), "support");
        assert_eq!(tag_of("/v1/messages/{event_id}/cancel"), "messages");
    }

    #[test]
    fn contract_strings_are_enums_in_the_document() {
        let d = doc();
        let s = &d["components"]["schemas"];
        let values = |name: &str| -> Vec<String> {
            serde_json::from_value(s[name]["enum"].clone()).unwrap()
        };
        use crate::domain::{AttemptClass, Channel, Semantics, State};
        let all = |v: Vec<&str>| v.into_iter().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            values("State"),
            all(State::ALL.iter().map(|x| x.as_str()).collect())
        );
        assert_eq!(
            values("AttemptClass"),
            all(AttemptClass::ALL.iter().map(|x| x.as_str()).collect())
        );
        assert_eq!(
            values("Channel"),
            all(Channel::ALL.iter().map(|x| x.as_str()).collect())
        );
        assert_eq!(
            values("Semantics"),
            all(Semantics::ALL.iter().map(|x| x.as_str()).collect())
        );
        // The request body of POST /v1/messages, as DESIGN.md names its fields.
        let body = &s["NewMessageRequest"];
        let props: BTreeSet<&str> = body["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        // Exactly the fields `parse_new_message` accepts.
        assert_eq!(
            props,
            crate::http::MESSAGE_FIELDS
                .iter()
                .copied()
                .collect::<BTreeSet<_>>()
        );
        assert_eq!(body["additionalProperties"], false);
        // As `EventId::parse` and `OrderingKey::parse` check them: bytes 0x21–0x7e, 1–255.
        for key in ["event_id", "ordering_key"] {
            let p = &body["properties"][key];
            assert_eq!(
                (&p["minLength"], &p["maxLength"], &p["pattern"]),
                (
                    &serde_json::json!(1),
                    &serde_json::json!(255),
                    &serde_json::json!("^[!-~]+$")
                ),
                "{key}: {p}"
            );
        }
        assert_eq!(s["Problem"]["properties"]["type"]["type"], "string");
    }
}
