//! HTTP: routes and thin handlers. Extract, parse, one service call, map the result; no SQL.

pub mod openapi;
pub mod problem;
mod view;

use std::collections::BTreeMap;
use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use serde_json::{Map, Value};
use tokio::sync::Notify;

use self::openapi::Routes;
use self::problem::{Problem, ProblemBody};
use self::view::{FanOutView, MessageView, ReceiptView};
use crate::auth::{Access, Principal, Tokens, Verdict};
use crate::channels::webhook::{AllowList, Endpoint};
use crate::clock::Clock;
use crate::config::ConfiguredSource;
use crate::domain::{Channel, InvalidField, Semantics};
use crate::health::{Findings, Heartbeat, readiness};
use crate::ingest::RawRequest;
use crate::metrics::{IngestVerdict, Metrics, ReceiptVerdict};
use crate::outbox::{FanOut, Limits, NewMessage, Prepared};
use crate::storage::group_commit::{MessageWriter, ReceiptWriter};
use crate::storage::receipts::Stored;
use crate::storage::{Db, StorageError};
use crate::support::{self, SupportError};

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub db: Db,
    pub clock: Arc<dyn Clock>,
    pub wake: Arc<Notify>,
    pub tokens: Arc<Tokens>,
    pub max_payload_bytes: usize,
    /// The retry policies by destination: recorded on every message enqueued here (an
    /// endpoint's own, else the global), and the budget its view shows.
    pub policies: Arc<crate::domain::policies::Policies>,
    pub endpoints: Arc<BTreeMap<String, Endpoint>>,
    /// Networks exempt from the SSRF guard (a refused literal destination is a 422).
    pub allow_networks: Arc<AllowList>,
    pub sources: Arc<BTreeMap<String, ConfiguredSource>>,
    pub ingest_max_body_bytes: usize,
    /// The longest a request body may take to arrive (`body_read_timeout_ms`): 408 after it.
    pub body_read_timeout: std::time::Duration,
    /// Woken once receipts are committed: the reconciler applies them.
    pub reconcile_wake: Arc<tokio::sync::Notify>,
    /// This Herald's metrics (`GET /metrics`; receipts and ingest requests are counted here).
    pub metrics: Metrics,
    /// The sender loop's heartbeat (`/readyz`: a stalled sender is not ready).
    pub sender_heartbeat: Arc<Heartbeat>,
    /// The sender's pauses of destinations (`herald_paused_destinations`).
    pub pauses: Arc<crate::sender::throttle::Throttle>,
    /// Ingest's group-commit writer (on `db`): a request is answered after its group commits.
    pub receipt_writer: ReceiptWriter,
    /// `POST /v1/messages`' group-commit writer (on `db`): messages other than fan-outs (on
    /// PostgreSQL, only those without an ordering key).
    pub message_writer: MessageWriter,
    /// Which refused receipts are logged at warn.
    pub refusals: Arc<crate::ingest::RefusalLog>,
}

impl AppState {
    /// What a message enqueued through the API is checked against (`NewMessage::plan`).
    fn limits(&self) -> Limits<'_> {
        Limits {
            max_payload_bytes: self.max_payload_bytes,
            policies: Some(&self.policies),
            endpoints: Some(&self.endpoints),
            allow_networks: Some(&self.allow_networks),
        }
    }
}

/// Every route Herald serves, in one list: [`configure`] registers each handler at the
/// method(s) and path its `#[utoipa::path]` declares, and `/openapi.json` documents exactly
/// these ([`openapi::document`]). A new route goes here, with its annotation.
pub fn routes(r: &mut impl Routes) {
    r.add::<__path_healthz, _, _>(healthz);
    r.add::<__path_readyz, _, _>(readyz);
    r.add::<__path_metrics, _, _>(metrics);
    r.add::<openapi::__path_openapi_json, _, _>(openapi::openapi_json);
    r.add::<__path_create_message, _, _>(create_message);
    r.add::<__path_show_message, _, _>(show_message);
    r.add::<__path_cancel_message, _, _>(cancel_message);
    r.add::<__path_ingest_receipts, _, _>(ingest_receipts);
    // GET-signed receipts (MessageBird status reports, Vonage SMS GET receipts, a Twilio
    // callback configured as GET): the same
    // handler, the same persist-before-acknowledge rule.
    r.add::<__path_ingest_receipts_get, _, _>(ingest_receipts_get);
    r.add::<__path_unmatched_receipts, _, _>(unmatched_receipts);
    r.add::<__path_list_endpoints, _, _>(list_endpoints);
    r.add::<__path_enable_endpoint, _, _>(enable_endpoint);
    r.add::<__path_explain_by_event_id, _, _>(explain_by_event_id);
    r.add::<__path_replay_by_event_id, _, _>(replay_by_event_id);
    r.add::<__path_skip_message, _, _>(skip_message);
    r.add::<__path_explain_send, _, _>(explain_send);
    r.add::<__path_replay_send, _, _>(replay_send);
    r.add::<__path_list_dead_letters, _, _>(list_dead_letters);
    r.add::<__path_redrive_dead_letters, _, _>(redrive_dead_letters);
}

/// A HEAD request is routed as the GET it asks about (RFC 9110: every general-purpose server
/// takes HEAD wherever it takes GET; an uptime monitor or a load balancer probing `/healthz`
/// with HEAD got 405, the admin page 404). The connection writes the GET's status and headers
/// and no body: actix-http leaves the body out of an answer to a request read as HEAD. But for
/// ingest, whose GET stores a receipt (a provider's status report in the URL): HEAD has no
/// effects, so it stays a 405 there (a probe would otherwise be counted and logged as a refused
/// receipt, and a signed URL sent with HEAD would be stored).
pub fn head_as_get(mut req: actix_web::dev::ServiceRequest) -> actix_web::dev::ServiceRequest {
    // The path as routing reads it (`%69ngest` is `ingest` there), not as it was spelled.
    if req.method() == actix_web::http::Method::HEAD && takes_head(req.match_info().as_str()) {
        req.head_mut().method = actix_web::http::Method::GET;
    }
    req
}

/// Whether a path's GET is answered to HEAD too: all but ingest's.
fn takes_head(path: &str) -> bool {
    !path.starts_with("/v1/ingest/")
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    routes(cfg);
    cfg.default_service(web::to(|req: HttpRequest| async move {
        // A path Herald serves with another method: 405 naming the ones it takes (a provider
        // or a script sending PUT to an ingest URL learns what is wrong), else 404.
        // The path as routing read it (`%69ngest` is `ingest` there).
        let path = req.match_info().as_str();
        let mut allowed = allowed_methods(path);
        if let Some(get) = allowed.iter().position(|m| m == "GET")
            && takes_head(path)
        {
            allowed.insert(get + 1, "HEAD".to_owned());
        }
        if allowed.is_empty() {
            return Err::<HttpResponse, _>(Problem::new(
                StatusCode::NOT_FOUND,
                "not-found",
                "No such route",
            ));
        }
        let r = Problem::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "This route does not take that method",
        )
        .detail(format!("it takes {}", allowed.join(", ")));
        let mut r = actix_web::ResponseError::error_response(&r);
        if let Ok(v) = actix_web::http::header::HeaderValue::from_str(&allowed.join(", ")) {
            r.headers_mut().insert(actix_web::http::header::ALLOW, v);
        }
        Ok(r)
    }));
}

/// JSON bodies with [`crate::telemetry::json_printable`]: a stored event id, reason or payload
/// holding a control or bidirectional-formatting character reads the same to a client, and is
/// written `\uXXXX` where `curl` on a terminal would otherwise obey it.
pub(crate) trait PrintableJson {
    /// `value` as the body, typed `application/json`.
    fn printable_json(&mut self, value: &impl serde::Serialize) -> HttpResponse {
        self.printable_json_as("application/json", value)
    }

    fn printable_json_as(
        &mut self,
        content_type: &'static str,
        value: &impl serde::Serialize,
    ) -> HttpResponse;
}

impl PrintableJson for actix_web::HttpResponseBuilder {
    fn printable_json_as(
        &mut self,
        content_type: &'static str,
        value: &impl serde::Serialize,
    ) -> HttpResponse {
        match crate::telemetry::json_printable(value, false) {
            Ok(body) => self.content_type(content_type).body(body),
            Err(e) => HttpResponse::from_error(actix_web::error::JsonPayloadError::Serialize(e)),
        }
    }
}

/// The methods [`routes`] serves `path` with (a `{name}` segment of a route matches any one
/// segment), in their order; empty when no route has that path.
fn allowed_methods(path: &str) -> Vec<String> {
    static ROUTES: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    let routes = ROUTES.get_or_init(|| {
        openapi::listing()
            .0
            .into_iter()
            .map(|l| (l.method, l.path))
            .collect()
    });
    let segments: Vec<&str> = path.split('/').collect();
    let mut methods: Vec<String> = Vec::new();
    for (method, template) in routes {
        let t: Vec<&str> = template.split('/').collect();
        let matches = t.len() == segments.len()
            && t.iter()
                .zip(&segments)
                .all(|(t, s)| (t.starts_with('{') && t.ends_with('}') && !s.is_empty()) || t == s);
        if matches && !methods.contains(method) {
            methods.push(method.clone());
        }
    }
    methods
}

#[utoipa::path(
    get,
    path = "/healthz",
    description = "Liveness: 200 while the process runs. Unauthenticated.",
    responses((status = 200, description = "`ok`", content_type = "text/plain", body = String, example = "ok\n"))
)]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

/// How long `/readyz` and `/metrics` wait for the database: past it, it did not answer.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /readyz`: 200 when ready; else 503 problem+json whose `reasons` say why (the database
/// does not answer, embedded migrations are not applied, the sender loop has stalled).
#[utoipa::path(
    get,
    path = "/readyz",
    description = "Readiness: the database answers, migrations are applied, the sender loop beats. Unauthenticated.",
    responses(
        (status = 200, description = "Ready", body = view::Ready),
        (status = 503, description = "Not ready: `reasons` say why", body = view::NotReadyProblem, content_type = "application/problem+json"),
    )
)]
async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, Problem> {
    let db = state.db.clone();
    let probe = web::block(move || match db.ping() {
        Err(_) => (false, None),
        // A failed read of the bookkeeping table is a database that does not answer properly.
        Ok(()) => match db.pending_migrations() {
            Ok(p) => (true, Some(p)),
            Err(_) => (false, None),
        },
    });
    // A database that does not answer in time is one that does not answer.
    let (database, pending_migrations) = match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(answer) => answer?,
        Err(_) => (false, None),
    };
    let findings = Findings {
        database,
        pending_migrations,
        sender_last_beat: state.sender_heartbeat.last(),
        sender_limit: state.sender_heartbeat.limit(),
        now: state.clock.now(),
    };
    let reasons = readiness(&findings);
    if reasons.is_empty() {
        return Ok(HttpResponse::Ok().printable_json(&view::Ready { status: "ready" }));
    }
    let detail = reasons
        .iter()
        .map(|r| r.detail.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    tracing::warn!(reasons = %reasons.iter().map(|r| r.reason).collect::<Vec<_>>().join(","), "not ready");
    Ok(HttpResponse::ServiceUnavailable().printable_json_as(
        "application/problem+json",
        &view::NotReadyProblem {
            kind: "https://herald.dev/problems/not-ready",
            title: "Not ready",
            status: 503,
            detail,
            reasons,
        },
    ))
}

/// `GET /metrics`: the Prometheus text format. Unauthenticated (scrape it on an internal
/// address); no label names an address, URL, path or event id. The database gauges are left out
/// (and `herald_database_up` is 0) when the database cannot be read: the counters still answer.
#[utoipa::path(
    get,
    path = "/metrics",
    description = "Prometheus text format. Unauthenticated (scrape it on an internal address).",
    responses((status = 200, description = "The metrics", content_type = "text/plain; version=0.0.4", body = String))
)]
async fn metrics(state: web::Data<AppState>) -> Result<HttpResponse, Problem> {
    let db = state.db.clone();
    let now = state.clock.storage_now();
    let metrics = state.metrics.clone();
    let read = async move {
        let permit = metrics.database_read().await;
        // Each statement is given the scrape's whole time: one that outlasts it ends soon
        // after, its connection back in the pool (PostgreSQL cancels it).
        web::block(move || {
            let _permit = permit;
            db.db_stats(now, PROBE_TIMEOUT)
        })
        .await
    };
    let stats = match tokio::time::timeout(PROBE_TIMEOUT, read).await {
        Ok(read) => match read? {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e.log_safe(), "metrics: database gauges not read");
                None
            }
        },
        // A hung database, or an outbox locked by someone's long transaction: the scrape
        // answers without the database gauges rather than hang with it.
        Err(_) => {
            tracing::warn!("metrics: database gauges not read in time");
            None
        }
    };
    let text = state
        .metrics
        .render(
            stats.as_ref(),
            state.db.wal_state().as_ref(),
            state.sender_heartbeat.last(),
            state.pauses.paused_count(state.clock.now()),
            state.clock.now(),
        )
        .map_err(|e| {
            tracing::error!(error = %e, "metrics could not be rendered");
            Problem::internal()
        })?;
    Ok(HttpResponse::Ok()
        .content_type(crate::metrics::CONTENT_TYPE)
        .body(text))
}

/// The one value of header `name`, if given; `Err` when it is given more than once with
/// different values: which one counts would be each proxy's and framework's own choice (the
/// first here, the last elsewhere), as with a key given twice in a body.
fn one_header(
    req: &HttpRequest,
    name: impl actix_web::http::header::AsHeaderName,
) -> Result<Option<&actix_web::http::header::HeaderValue>, ()> {
    let mut values = req.headers().get_all(name);
    let first = values.next();
    match first {
        Some(v) if values.any(|other| other != v) => Err(()),
        _ => Ok(first),
    }
}

/// The caller of a token-guarded route; 401 without a token Herald knows, or with two
/// different `Authorization` headers (the first counted: a proxy appending its own would have
/// been overruled by the client's).
fn caller(req: &HttpRequest, state: &AppState) -> Result<Principal, Problem> {
    let given = one_header(req, &actix_web::http::header::AUTHORIZATION).map_err(|()| {
        Problem::unauthorized()
            .detail("Authorization was given more than once, with different values")
    })?;
    given
        .and_then(|v| v.to_str().ok())
        .and_then(Tokens::bearer)
        .and_then(|t| state.tokens.authenticate(t))
        .ok_or_else(Problem::unauthorized)
}

/// The caller, if it may do `access` (to a message enqueued by `owner`): 403 without the
/// scope; a `send` token asking for another's message gets the 404 a missing one gets.
/// What `blocked_by` says of a head another client enqueued, to a `send` token.
pub const ANOTHER_CLIENTS_MESSAGE: &str = "(another client's message)";

fn permit(who: &Principal, access: Access, owner: Option<&str>) -> Result<(), Problem> {
    match who.may(access, owner) {
        Verdict::Allowed => Ok(()),
        Verdict::NotOwn => Err(Problem::not_found("message")),
        Verdict::Forbidden => Err(Problem::forbidden(match access {
            Access::Enqueue => "send or admin",
            Access::Support | Access::OwnMessage => "support or admin",
            Access::Admin => "admin",
        })),
    }
}

/// [`caller`] then [`permit`], for routes that do not depend on a message's owner.
pub(crate) fn authorize(
    req: &HttpRequest,
    state: &AppState,
    access: Access,
) -> Result<Principal, Problem> {
    let who = caller(req, state)?;
    permit(&who, access, None)?;
    Ok(who)
}

/// Why a request body was not read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Over its limit (413).
    TooLarge,
    /// The connection failed while it came (400).
    Unreadable,
    /// Still arriving at the deadline (408, the connection then closed).
    TimedOut,
}

/// Reads a request body whole, at most `limit` bytes, within `timeout` from the first read —
/// every route that reads a body, the admin page's forms too. Without the deadline a client that
/// stopped sending held its connection and buffer for good (on ingest and at the admin sign-in,
/// without any credential).
/// A `Content-Length` over the limit is refused at once, before any byte is waited for (a client
/// declaring 1 GB and sending nothing waited out the deadline for a 408).
pub async fn read_limited(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<web::BytesMut, BodyError> {
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge);
    }
    let read = async {
        let mut body = web::BytesMut::new();
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|_| BodyError::Unreadable)?;
            if body.len() + chunk.len() > limit {
                return Err(BodyError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or(Err(BodyError::TimedOut))
}

/// [`read_limited`] within `state.body_read_timeout`, its refusals as problems: 413, 400, or
/// 408 (whose answer closes the connection). A body with a content coding (`Content-Encoding:
/// gzip`) is refused first, 415: Herald reads bodies as sent and decodes none (it answered 400
/// "not valid JSON", as if the JSON were at fault).
async fn read_body(
    req: &HttpRequest,
    state: &AppState,
    payload: web::Payload,
    limit: usize,
) -> Result<web::BytesMut, Problem> {
    let coded = req
        .headers()
        .get_all(actix_web::http::header::CONTENT_ENCODING)
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .any(|c| !c.trim().is_empty() && !c.trim().eq_ignore_ascii_case("identity"));
    if coded {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-content-encoding",
            "The request body has a content coding Herald does not decode",
        )
        .detail("send the body uncompressed, without Content-Encoding (or with identity)"));
    }
    read_limited(req, payload, limit, state.body_read_timeout)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge => Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too-large",
                "The request body is too large",
            )
            .detail(format!("the limit is {limit} bytes")),
            BodyError::Unreadable => Problem::malformed("the request body could not be read"),
            BodyError::TimedOut => Problem::new(
                StatusCode::REQUEST_TIMEOUT,
                "body-timeout",
                "The request body did not arrive in time",
            )
            .detail(format!(
                "the body must arrive within {} ms (body_read_timeout_ms)",
                state.body_read_timeout.as_millis()
            )),
        })
}

#[utoipa::path(
    post,
    path = "/v1/messages",
    description = "Enqueue a message (or a fan-out, `destination = type:EVENT.TYPE`). Acknowledged only once committed. A `send` token may read back only what it enqueued.",
    params(("Idempotency-Key" = Option<String>, Header, description = "The event id, if the body has none (both: they must be equal)")),
    request_body(content = openapi::NewMessageRequest, description = "The message"),
    security(("bearer" = ["send"]), ("bearer" = ["admin"])),
    responses(
        (status = 201, description = "Created", body = openapi::Enqueued),
        (status = 200, description = "A message with this event id was already there (enqueued by this token); it stands as it was stored", body = openapi::Enqueued,
            headers(("Herald-Existing" = String, description = "`same-request` (this request is the stored message's: same channel, destination, event id and content, semantics, max_attempts (the destination policy's where none is given), expires_at, ordering_key and ordering_policy (the endpoint's, else block, where none is given), and scheduled_at where it gives one), `different-request` (another request under the same event id: not stored), or `unknown` (a fan-out, or a row written by SQL without a fingerprint yet)"))),
        (status = 400, description = "The body is not JSON", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "The event id was taken by another token (`event-id-taken`)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "The body is too large", body = ProblemBody, content_type = "application/problem+json"),
        (status = 415, description = "The body has a Content-Encoding (Herald decodes none)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields, each named in `errors`", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn create_message(
    req: HttpRequest,
    state: web::Data<AppState>,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let who = authorize(&req, &state, Access::Enqueue)?;
    // The payload limit applies to `payload`; the envelope gets some room on top.
    let body = read_body(
        &req,
        &state,
        payload,
        state.max_payload_bytes.saturating_add(16 * 1024),
    )
    .await?;
    let idempotency_key = one_header(&req, "idempotency-key")
        .map_err(|()| {
            Problem::invalid(vec![InvalidField::new(
                "Idempotency-Key",
                "was given more than once, with different values",
            )])
        })?
        .map(|v| v.to_str().map(str::to_owned))
        .transpose()
        .map_err(|_| {
            Problem::invalid(vec![InvalidField::new(
                "Idempotency-Key",
                "must be visible ASCII",
            )])
        })?;
    json_body(&body)?;
    let now = state.clock.now();
    let message = match parse_message_or_unnamed(&body, idempotency_key.as_deref()) {
        Ok(m) => m,
        // Refused fields, but the rest parsed: its own checks run too, so that one answer
        // names every field to change, not the first ones and the rest on the next try.
        Err((mut errors, Some(standing_in))) => {
            if let Err(more) = standing_in.plan(&state.limits(), now) {
                let mut named: Vec<String> = errors.iter().map(|e| e.field.clone()).collect();
                // A refused key stands in as none: the policy's "only with a key" is not news.
                if named.iter().any(|f| f == "ordering_key") {
                    named.push("ordering_policy".to_owned());
                }
                errors.extend(more.into_iter().filter(|e| !named.contains(&e.field)));
            }
            return Err(errors.into());
        }
        Err((errors, None)) => return Err(errors.into()),
    };
    // Only a message due at once is worth waking the sender for: a later one is the poll's (a
    // wake-up for it was a claim that found nothing, one per request in a burst of them). A
    // second of grace: on PostgreSQL the claim judges by the database's clock, which may run a
    // little ahead of this process's.
    let due_now = message
        .scheduled_at
        .is_none_or(|t| t <= now + chrono::Duration::seconds(1));
    let db = state.db.clone();
    let checked = state.clone();
    let owner = who.name.clone();
    // Marked before the plan: the group writer waits a moment for a request on its way (let go
    // as soon as the plan shows it is not the writer's).
    let coming = state.message_writer.begin();
    let planned = web::block(move || -> Result<_, StorageError> {
        let mut row = match message.plan(&checked.limits(), now) {
            Err(invalid) => return Ok(Err(invalid)),
            Ok(Prepared::FanOut(plan)) => {
                // Not for the group writer: it need not wait for this one.
                drop(coming);
                // The children and their links in one transaction, over the stored
                // subscriptions; no subscriber is a 422 and nothing is written. Each child
                // records the token that enqueued it.
                let expand = |subs: &[(String, String)]| {
                    plan.expand(subs).map(|mut children| {
                        for c in &mut children {
                            c.row.enqueued_by = Some(owner.clone());
                        }
                        children
                    })
                };
                return Ok(db.enqueue_fanout(plan.event_id(), &expand)?.map(|stored| {
                    Planned::Written(Written::FanOut(FanOut::from_stored(
                        plan.event_id(),
                        stored,
                    )))
                }));
            }
            Ok(Prepared::Message(row)) => row,
        };
        row.enqueued_by = Some(owner);
        // A keyed row takes its key's insert lock: on PostgreSQL a transaction of its own (see
        // `MessageWriter::enqueue`). SQLite has one writer at a time, which orders every key's
        // inserts by itself: there a keyed row joins the group too.
        if row.ordering_key.is_none() || db.backend() == crate::storage::Backend::Sqlite {
            // Committed with the group of requests coming in meanwhile (one commit for all).
            return Ok(Ok(Planned::Plain(Box::new(row), coming)));
        }
        drop(coming);
        let asked = Asked::of(&row);
        Ok(db
            .enqueue(&row)?
            .map(|(created, stored)| Planned::Stored(created, stored, asked)))
    })
    .await??
    .map_err(Problem::invalid)?;
    // `asked`: what of this request tells a repeat of the stored request from another request
    // under its event id.
    let (created, stored, asked) = match planned {
        Planned::Written(w) => (false, Err(w), None::<Asked>),
        Planned::Stored(created, stored, asked) => (created, Ok(stored), Some(asked)),
        Planned::Plain(row, coming) => {
            let asked = Some(Asked::of(&row));
            let (created, stored) = state
                .message_writer
                .enqueue(coming, *row)
                .await?
                .map_err(Problem::invalid)?;
            (created, Ok(stored), asked)
        }
    };
    let written = match stored {
        Err(w) => w,
        // A message that was already there may have its history already.
        Ok(stored) if !created => {
            let db = state.db.clone();
            let id = stored.id;
            let receipts = web::block(move || db.receipts_of_message(id)).await??;
            Written::Message(false, stored, receipts)
        }
        Ok(stored) => Written::Message(true, stored, Vec::new()),
    };
    // A keyed message waiting behind its key's head is not due: its release wakes the sender.
    let due_now = due_now
        && !matches!(&written, Written::Message(_, stored, _) if stored.next_attempt_at.is_none());
    let (created, owners) = match &written {
        Written::Message(created, stored, _) => (*created, vec![stored.enqueued_by.clone()]),
        Written::FanOut(f) => {
            let mut owners: Vec<_> = f
                .children
                .iter()
                .filter_map(|(_, m)| m.as_ref().map(|m| m.enqueued_by.clone()))
                .collect();
            if owners.is_empty() {
                // Every child purged: nothing shows whose it was; only support and admin see it.
                owners.push(None);
            }
            (f.created, owners)
        }
    };
    if !created
        && owners
            .iter()
            .any(|o| who.may(Access::OwnMessage, o.as_deref()) != Verdict::Allowed)
    {
        // Another client's message: say only that the id is taken, nothing of that message.
        let mut p = Problem::new(
            StatusCode::CONFLICT,
            "event-id-taken",
            "A message with this event id was enqueued by another token",
        );
        p.field = Some("event_id".into());
        return Err(p);
    }
    let existing = match (&written, &asked) {
        (Written::Message(false, stored, _), Some(asked)) => {
            // A budget given or not is the destination's policy's when not: the same as asked.
            let budget = i32::try_from(state.policies.of(&stored.destination).max_attempts)
                .unwrap_or(i32::MAX);
            // A policy given or not is the endpoint's (else `block`) when not: the same.
            let ordering = crate::domain::endpoint_name(&stored.destination)
                .and_then(|name| state.endpoints.get(name))
                .and_then(|e| e.ordering_policy);
            let existing = asked.existing(stored, budget, ordering);
            if existing == EXISTING_DIFFERENT {
                tracing::info!(event_id = %crate::telemetry::LogEventId(&stored.event_id), token = %who.name, "event id already there with another request: the stored message stands");
            }
            existing
        }
        _ => EXISTING_UNKNOWN,
    };
    // Committed: only now is it acknowledged.
    let view = match written {
        Written::Message(created, stored, receipts) => {
            let mut view = MessageView::new(&stored, &state.policies);
            view.receipts = Some(receipts.iter().map(ReceiptView::new).collect());
            if created {
                tracing::info!(event_id = %crate::telemetry::LogEventId(&stored.event_id), channel = %stored.channel, token = %who.name, "message enqueued");
            }
            serde_json::to_value(view)
        }
        Written::FanOut(fanout) => {
            if fanout.created {
                tracing::info!(
                    event_id = %crate::telemetry::LogEventId(&fanout.event_id),
                    children = fanout.children.len(),
                    token = %who.name,
                    "fan-out enqueued"
                );
            }
            serde_json::to_value(FanOutView::new(&fanout, &state.policies, &who))
        }
    };
    let view = view.map_err(|_| Problem::internal())?;
    if created {
        if due_now {
            state.wake.notify_one();
        }
        Ok(HttpResponse::Created().printable_json(&view))
    } else {
        Ok(HttpResponse::Ok()
            .insert_header((EXISTING_HEADER, existing))
            .printable_json(&view))
    }
}

/// On a 200 of `POST /v1/messages` (its event id was there already): whether this request is
/// the stored message's ([`Asked`]) or another one, which is not stored (the event id's first
/// request stands), or cannot be told (a fan-out, or a row written by SQL that has no
/// fingerprint yet).
pub const EXISTING_HEADER: &str = "Herald-Existing";

/// What of a request to `POST /v1/messages` makes it the stored message's own: the same
/// fingerprint (channel, destination, event id, what is sent), semantics, budget, expiry,
/// ordering key and policy, and its `scheduled_at` where it gives one (one that gives none asks for
/// "now", which a repeat's "now" is not).
struct Asked {
    fingerprint: Option<String>,
    semantics: crate::domain::Semantics,
    max_attempts: Option<i32>,
    scheduled_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    ordering_key: Option<String>,
    ordering_policy: Option<crate::domain::OrderingPolicy>,
}

impl Asked {
    fn of(row: &crate::storage::models::NewOutboxRow) -> Self {
        Self {
            fingerprint: row.request_fingerprint.clone(),
            semantics: row.semantics,
            max_attempts: row.max_attempts,
            scheduled_at: row.scheduled_at,
            expires_at: row.expires_at,
            ordering_key: row.ordering_key.clone(),
            ordering_policy: row.ordering_policy,
        }
    }

    /// The `Herald-Existing` value for `stored`, the message already under its event id.
    /// `budget`: the attempts of a message that sets none (its destination's policy's);
    /// `ordering`: the head-of-line policy of a keyed message that sets none (its endpoint's).
    fn existing(
        &self,
        stored: &crate::storage::models::OutboxRow,
        budget: i32,
        ordering: Option<crate::domain::OrderingPolicy>,
    ) -> &'static str {
        use crate::domain::OrderingPolicy;
        let (Some(asked), Some(had)) = (&self.fingerprint, &stored.request_fingerprint) else {
            return EXISTING_UNKNOWN;
        };
        let same = asked == had
            && self.semantics == stored.semantics
            && self.max_attempts.unwrap_or(budget) == stored.max_attempts.unwrap_or(budget)
            && self.expires_at == stored.expires_at
            && self.ordering_key == stored.ordering_key
            && OrderingPolicy::effective(
                self.ordering_key.is_some(),
                self.ordering_policy,
                ordering,
            ) == OrderingPolicy::effective(
                stored.ordering_key.is_some(),
                stored.ordering_policy,
                ordering,
            )
            && self.scheduled_at.is_none_or(|t| t == stored.scheduled_at);
        if same {
            EXISTING_SAME
        } else {
            EXISTING_DIFFERENT
        }
    }
}
const EXISTING_SAME: &str = "same-request";
const EXISTING_DIFFERENT: &str = "different-request";
const EXISTING_UNKNOWN: &str = "unknown";

/// What `POST /v1/messages`' plan led to: written already (a fan-out), a keyed message stored in
/// a transaction of its own (PostgreSQL), or a message for the group writer.
enum Planned {
    Written(Written),
    /// Whether it was created, the stored row, and what of the request tells it from another.
    Stored(bool, crate::storage::models::OutboxRow, Asked),
    Plain(
        Box<crate::storage::models::NewOutboxRow>,
        crate::storage::group_commit::Coming,
    ),
}

/// What `POST /v1/messages` wrote (or found); one per request.
#[allow(clippy::large_enum_variant)]
enum Written {
    Message(
        bool,
        crate::storage::models::OutboxRow,
        Vec<crate::storage::models::ReceiptRow>,
    ),
    FanOut(FanOut),
}

#[utoipa::path(
    get,
    path = "/v1/messages/{event_id}",
    description = "A message with its receipt history, or a fan-out's children by the original event id. A `send` token sees only what it enqueued (another's is a 404).",
    params(("event_id" = String, Path, description = "The message's event id")),
    security(("bearer" = ["send"]), ("bearer" = ["support"]), ("bearer" = ["admin"])),
    responses(
        (status = 200, description = "The message or fan-out", body = openapi::Enqueued),
        (status = 404, description = "No such message", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn show_message(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let who = caller(&req, &state)?;
    let event_id = path.into_inner();
    let db = state.db.clone();
    let found = web::block(move || -> Result<_, StorageError> {
        let Some(row) = db.find_by_event_id(&event_id)? else {
            // The original event id of a fan-out: the view of its children.
            let children = db.fanout_of(&event_id)?;
            if children.is_empty() {
                return Ok(None);
            }
            let stored = crate::storage::fanout::StoredFanout {
                created: false,
                children,
            };
            return Ok(Some(Err(FanOut::from_stored(&event_id, stored))));
        };
        let receipts = db.receipts_of_message(row.id)?;
        let head = db.key_head(&row)?;
        Ok(Some(Ok((row, receipts, head))))
    })
    .await??;
    let (row, receipts, head) = match found.ok_or_else(|| Problem::not_found("message"))? {
        Ok(found) => found,
        Err(fanout) => {
            let mut owners = fanout
                .children
                .iter()
                .filter_map(|(_, m)| m.as_ref())
                .peekable();
            if owners.peek().is_none() {
                // Every child purged: nothing shows whose it was; only support and admin see it.
                permit(&who, Access::OwnMessage, None)?;
            }
            for m in owners {
                permit(&who, Access::OwnMessage, m.enqueued_by.as_deref())?;
            }
            return Ok(HttpResponse::Ok().printable_json(&FanOutView::new(
                &fanout,
                &state.policies,
                &who,
            )));
        }
    };
    permit(&who, Access::OwnMessage, row.enqueued_by.as_deref())?;
    let mut view = MessageView::for_caller(&row, &state.policies, &who);
    view.receipts = Some(receipts.iter().map(ReceiptView::new).collect());
    // Another client's head is named as such, not by its event id: a `send` token learns no
    // other client's event ids (their messages are 404s to it).
    view.blocked_by = crate::storage::ordering::blocked_by(&row, head.as_ref()).map(|h| match who
        .may(Access::OwnMessage, h.enqueued_by.as_deref())
    {
        Verdict::Allowed => h.event_id.clone(),
        _ => ANOTHER_CLIENTS_MESSAGE.to_owned(),
    });
    Ok(HttpResponse::Ok().printable_json(&view))
}

/// The most receipts `GET /v1/receipts/unmatched` lists in one page.
const UNMATCHED_PAGE_MAX: u32 = 1000;

/// `GET /v1/receipts/unmatched`: receipts no message has claimed yet (they are tried again with
/// backoff), counted, the oldest listed (`limit`, 100 unless given, at most 1000; `after`, the
/// `next` of the page before) — identifiers and types only.
#[utoipa::path(
    get,
    path = "/v1/receipts/unmatched",
    security(("bearer" = ["support"]), ("bearer" = ["admin"])),
    params(
        ("limit" = Option<u32>, Query, description = "How many to list, 1–1000 (100)"),
        ("after" = Option<i64>, Query, description = "The `next` of the page before"),
    ),
    responses(
        (status = 200, description = "Receipts no message has claimed yet: counted, the oldest listed (a page), and `next` when more follow", body = view::UnmatchedReceipts),
        (status = 422, description = "A parameter that is not `limit` or `after`, or a bad value", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn unmatched_receipts(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    authorize(&req, &state, Access::Support)?;
    // Any other parameter (a filter) would be ignored unseen: refused. The listing showed only
    // the oldest 100, and a receipt support asked about past them could not be found (a
    // walk-through, with 5,161 unmatched).
    let (mut limit, mut after) = (100u32, 0i64);
    let mut given: Vec<InvalidField> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (k, v) in url::form_urlencoded::parse(req.query_string().as_bytes()) {
        if !seen.insert(k.clone().into_owned()) {
            given.push(InvalidField::new(
                k.into_owned(),
                "is given more than once; give it once",
            ));
            continue;
        }
        match k.as_ref() {
            "limit" => match support::parse_limit(&v, UNMATCHED_PAGE_MAX) {
                Ok(n) => limit = n,
                Err(e) => given.push(e),
            },
            "after" => match v.parse::<i64>() {
                Ok(n) if n >= 0 => after = n,
                _ => given.push(InvalidField::new(
                    "after",
                    "must be the next of a page before (a receipt id)",
                )),
            },
            _ => given.push(InvalidField::new(
                k.into_owned(),
                "is not a known parameter: this listing takes limit and after",
            )),
        }
    }
    if !given.is_empty() {
        let mut p = Problem::invalid(given);
        p.title = "The request is not valid".into();
        return Err(p);
    }
    let db = state.db.clone();
    let (count, rows, more) = web::block(move || db.unmatched_receipts(after, limit)).await??;
    // The last id listed (one deleted meanwhile is not listed; the next page goes on after it).
    let next = more.then(|| rows.last().map(|r| r.id).unwrap_or(after));
    let listed: Vec<_> = rows
        .iter()
        .map(|r| view::UnmatchedReceipt {
            receipt: ReceiptView::new(r),
            // What the provider sent as these, unverified (no message has them): an address in
            // either is masked, as in the provider's event id.
            herald_event_id: r
                .herald_event_id
                .as_deref()
                .map(crate::telemetry::mask_emails_in),
            provider_message_id: r
                .provider_message_id
                .as_deref()
                .map(crate::telemetry::mask_emails_in),
            match_attempts: r.match_attempts,
            next_match_at: r.next_match_at.as_ref().map(view::ts),
        })
        .collect();
    Ok(HttpResponse::Ok().printable_json(&view::UnmatchedReceipts {
        count,
        receipts: listed,
        next,
    }))
}

/// `GET /v1/endpoints`: the named endpoints, each with its host, limits and whether Herald
/// disabled it (and why). Never its URL path, secrets or headers.
#[utoipa::path(
    get,
    path = "/v1/endpoints",
    security(("bearer" = ["support"]), ("bearer" = ["admin"])),
    responses((status = 200, description = "The named endpoints", body = view::EndpointList))
)]
async fn list_endpoints(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    authorize(&req, &state, Access::Support)?;
    let db = state.db.clone();
    let disabled = web::block(move || db.disabled_endpoints()).await??;
    let listed: Vec<_> = state
        .endpoints
        .values()
        .map(|e| {
            let off = disabled.iter().find(|d| d.name == e.name);
            view::EndpointView {
                name: e.name.clone(),
                host: e.url.host_str().map(str::to_owned),
                event_types: e.event_types.clone(),
                rate_limit_per_second: e.limit.per_second,
                burst: e.limit.burst_in_force(),
                max_in_flight: e.limit.max_in_flight,
                disable_after_failures: e.auto_disable.map(|a| a.failures),
                disable_after_seconds: e.auto_disable.map(|a| a.over.as_secs()),
                disabled: off.is_some(),
                disabled_at: off.map(|d| d.disabled_at),
                disabled_reason: off.and_then(|d| d.reason.clone()),
            }
        })
        .collect();
    Ok(HttpResponse::Ok().printable_json(&view::EndpointList { endpoints: listed }))
}

/// `POST /v1/endpoints/{name}/enable`: ends an automatic disabling (admin scope). Its held
/// messages go out as they come due again (within half a minute).
#[utoipa::path(
    post,
    path = "/v1/endpoints/{name}/enable",
    description = "End an automatic disabling; held messages go out as they come due again.",
    params(("name" = String, Path, description = "The endpoint's name")),
    security(("bearer" = ["admin"])),
    responses(
        (status = 200, description = "Enabled", body = view::EndpointEnabled),
        (status = 404, description = "No such endpoint", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn enable_endpoint(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let who = authorize(&req, &state, Access::Admin)?;
    let name = path.into_inner();
    if !state.endpoints.contains_key(&name) {
        return Err(Problem::not_found_by("endpoint", "name"));
    }
    let db = state.db.clone();
    let now = state.clock.now();
    let n = name.clone();
    let changed = web::block(move || db.enable_endpoint(&n, now)).await??;
    if changed {
        tracing::warn!(endpoint = %name, token = %who.name, "endpoint enabled again");
    }
    Ok(HttpResponse::Ok().printable_json(&view::EndpointEnabled {
        name,
        enabled: true,
        changed,
    }))
}

/// The largest support request body (a reason and a few filters).
const SUPPORT_BODY_LIMIT: usize = 16 * 1024;

async fn explain(
    state: web::Data<AppState>,
    lookup: Result<support::Lookup, InvalidField>,
) -> Result<HttpResponse, Problem> {
    let lookup = lookup.map_err(SupportError::from)?;
    let db = state.db.clone();
    let policies = state.policies.clone();
    let e = web::block(move || support::explain(&db, &lookup, &policies)).await??;
    Ok(HttpResponse::Ok().printable_json(&e))
}

/// `GET /v1/sends/{fingerprint}`: everything that happened to a send (a unique prefix of at least
/// 8 hex digits will do; an ambiguous one is a 409 listing the candidates).
#[utoipa::path(
    get,
    path = "/v1/sends/{fingerprint}",
    description = "Everything that happened to a send, with a plain-language explanation.",
    params(("fingerprint" = String, Path, description = "A fingerprint, or a unique prefix of at least 8 hex digits")),
    security(("bearer" = ["support"]), ("bearer" = ["admin"])),
    responses(
        (status = 200, description = "The explanation", body = crate::support::view::Explanation),
        (status = 404, description = "No such message", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "The prefix is ambiguous (`candidates`)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "Not 8 to 64 hex digits", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn explain_send(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    authorize(&req, &state, Access::Support)?;
    explain(state, support::Lookup::fingerprint(&path.into_inner())).await
}

/// `GET /v1/messages/{event_id}/explain`: the same by event id.
#[utoipa::path(
    get,
    path = "/v1/messages/{event_id}/explain",
    description = "The explanation of a send, by event id.",
    params(("event_id" = String, Path, description = "The message's event id")),
    security(("bearer" = ["support"]), ("bearer" = ["admin"])),
    responses(
        (status = 200, description = "The explanation", body = crate::support::view::Explanation),
        (status = 404, description = "No such message", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`fan-out`: the event id is a fan-out's; `candidates` are its messages", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn explain_by_event_id(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    authorize(&req, &state, Access::Support)?;
    explain(state, Ok(support::Lookup::event_id(&path.into_inner()))).await
}

/// A body that is not JSON at all: 400 `malformed` naming `body` (what is JSON but wrong is
/// the parser's 422, naming the field).
fn json_body(body: &[u8]) -> Result<(), Problem> {
    serde_json::from_slice::<serde::de::IgnoredAny>(body)
        .map(|_| ())
        .map_err(|e| {
            let mut p = Problem::malformed(format!("{e}"));
            p.field = Some("body".into());
            p
        })
}

async fn replay(
    req: HttpRequest,
    state: web::Data<AppState>,
    lookup: Result<support::Lookup, InvalidField>,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let who = authorize(&req, &state, Access::Support)?;
    let body = read_body(&req, &state, payload, SUPPORT_BODY_LIMIT).await?;
    json_body(&body)?;
    let request = support::parse_replay_body(&body).map_err(SupportError::from)?;
    let lookup = lookup.map_err(SupportError::from)?;
    let db = state.db.clone();
    let now = state.clock.storage_now();
    let done =
        web::block(move || support::replay(&db, now, &lookup, &request, &who.name)).await??;
    // Committed: the new series is due now.
    state.wake.notify_one();
    Ok(HttpResponse::Ok().printable_json(&done))
}

/// `POST /v1/sends/{fingerprint}/replay` `{"reason", "force"?, "expires_at"?}`.
#[utoipa::path(
    post,
    path = "/v1/sends/{fingerprint}/replay",
    description = "Send a dead-lettered, unconfirmed or expired message again (a delivered one with `force`); audited.",
    params(("fingerprint" = String, Path, description = "A fingerprint, or a unique prefix of at least 8 hex digits")),
    request_body(content = openapi::ReplayRequestBody),
    security(("bearer" = ["support"]), ("bearer" = ["admin"])),
    responses(
        (status = 200, description = "Replayed: due now", body = crate::support::Replayed),
        (status = 400, description = "The body is not JSON", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such message", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`force-required`, `in-flight`, `not-replayable`, `changed` or an ambiguous prefix", body = ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "The body is too large", body = ProblemBody, content_type = "application/problem+json"),
        (status = 415, description = "The body has a Content-Encoding (Herald decodes none)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields (`reason`, `expires_at`, `fingerprint`, …)", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn replay_send(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let lookup = support::Lookup::fingerprint(&path.into_inner());
    replay(req, state, lookup, payload).await
}

/// `POST /v1/messages/{event_id}/replay`: the same by event id.
#[utoipa::path(
    post,
    path = "/v1/messages/{event_id}/replay",
    description = "The replay of a send, by event id.",
    params(("event_id" = String, Path, description = "The message's event id")),
    request_body(content = openapi::ReplayRequestBody),
    security(("bearer" = ["support"]), ("bearer" = ["admin"])),
    responses(
        (status = 200, description = "Replayed: due now", body = crate::support::Replayed),
        (status = 400, description = "The body is not JSON", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such message", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`force-required`, `in-flight`, `not-replayable`, `changed`, or `fan-out` (by event id: a fan-out's, `candidates` its messages)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "The body is too large", body = ProblemBody, content_type = "application/problem+json"),
        (status = 415, description = "The body has a Content-Encoding (Herald decodes none)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields (`reason`, `expires_at`, …)", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn replay_by_event_id(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let lookup = Ok(support::Lookup::event_id(&path.into_inner()));
    replay(req, state, lookup, payload).await
}

/// `GET /v1/dead-letters?class=&destination=&channel=&since=&until=&after=&limit=`.
#[utoipa::path(
    get,
    path = "/v1/dead-letters",
    description = "Dead letters, oldest first, in stable keyset pages.",
    params(
        ("class" = Option<String>, Query, description = "An attempt class, or `unconfirmed`"),
        ("destination" = Option<String>, Query, description = "`endpoint:NAME` or a host (webhook URLs of that host, email addresses at that domain)"),
        ("channel" = Option<crate::domain::Channel>, Query),
        ("since" = Option<String>, Query, format = DateTime, description = "Dead-lettered at or after"),
        ("until" = Option<String>, Query, format = DateTime, description = "Dead-lettered before"),
        ("after" = Option<String>, Query, description = "The `next` of the previous page"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Page size (default 50)"),
    ),
    security(("bearer" = ["support"]), ("bearer" = ["admin"])),
    responses(
        (status = 200, description = "A page", body = crate::support::DeadLetterPage),
        (status = 400, description = "The query string is malformed", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "A bad or unknown parameter, named", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn list_dead_letters(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    authorize(&req, &state, Access::Support)?;
    let pairs = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
        .map_err(|_| {
            Problem::new(
                StatusCode::BAD_REQUEST,
                "malformed",
                "The query string is malformed",
            )
        })?
        .into_inner();
    let request = support::parse_list_query(&pairs).map_err(SupportError::from)?;
    let db = state.db.clone();
    let page = web::block(move || support::dead_letters(&db, &request)).await??;
    Ok(HttpResponse::Ok().printable_json(&page))
}

/// `POST /v1/dead-letters/redrive` `{"reason", "limit"?, "expires_at"?, "after"?, filters…}`.
#[utoipa::path(
    post,
    path = "/v1/dead-letters/redrive",
    description = "Replay up to `limit` dead letters matching the filters, oldest first, in one transaction; each audited.",
    request_body(content = openapi::RedriveRequestBody),
    security(("bearer" = ["support"]), ("bearer" = ["admin"])),
    responses(
        (status = 200, description = "What was redriven and skipped", body = crate::support::RedriveReport),
        (status = 400, description = "The body is not JSON", body = ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "The body is too large", body = ProblemBody, content_type = "application/problem+json"),
        (status = 415, description = "The body has a Content-Encoding (Herald decodes none)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields, each named", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn redrive_dead_letters(
    req: HttpRequest,
    state: web::Data<AppState>,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let who = authorize(&req, &state, Access::Support)?;
    let body = read_body(&req, &state, payload, SUPPORT_BODY_LIMIT).await?;
    json_body(&body)?;
    let request = support::parse_redrive_body(&body).map_err(SupportError::from)?;
    let db = state.db.clone();
    let now = state.clock.storage_now();
    let report = web::block(move || support::redrive(&db, now, &request, &who.name)).await??;
    if !report.redriven.is_empty() {
        state.wake.notify_one();
    }
    Ok(HttpResponse::Ok().printable_json(&report))
}

/// `POST /v1/messages/{event_id}/skip` `{"reason"}`: a dead or unconfirmed head of an ordering
/// key stops holding its key; the key's next message becomes due. 409 when it holds no key.
#[utoipa::path(
    post,
    path = "/v1/messages/{event_id}/skip",
    description = "Release an ordering key blocked by this dead or unconfirmed head: the key's next message becomes due; audited.",
    params(("event_id" = String, Path, description = "The blocking message's event id")),
    request_body(content = openapi::SkipRequestBody),
    security(("bearer" = ["support"]), ("bearer" = ["admin"])),
    responses(
        (status = 200, description = "Skipped: the key's next message is due", body = MessageView),
        (status = 400, description = "The body is not JSON", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such message", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "It holds no key (not a blocked head, or skipped already), or a fan-out's own event id (`fan-out`, `candidates` its messages)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "The body is too large", body = ProblemBody, content_type = "application/problem+json"),
        (status = 415, description = "The body has a Content-Encoding (Herald decodes none)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields (`reason`)", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn skip_message(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let who = authorize(&req, &state, Access::Support)?;
    let body = read_body(&req, &state, payload, SUPPORT_BODY_LIMIT).await?;
    json_body(&body)?;
    let request = support::parse_skip_body(&body).map_err(SupportError::from)?;
    let event_id = path.into_inner();
    let db = state.db.clone();
    let now = state.clock.storage_now();
    let name = who.name.clone();
    let row = web::block(move || support::skip(&db, now, &event_id, &request, &name)).await??;
    state.wake.notify_one();
    Ok(HttpResponse::Ok().printable_json(&MessageView::for_caller(&row, &state.policies, &who)))
}

#[utoipa::path(
    post,
    path = "/v1/messages/{event_id}/cancel",
    description = "Cancel a message not yet sent (already canceled: the same answer).",
    params(("event_id" = String, Path, description = "The message's event id")),
    security(("bearer" = ["send"]), ("bearer" = ["support"]), ("bearer" = ["admin"])),
    responses(
        (status = 200, description = "Now (or already) canceled", body = MessageView),
        (status = 404, description = "No such message", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "Already sending or finished (`not-cancelable`), or a fan-out's own event id (`fan-out`, `candidates` its messages)", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn cancel_message(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let who = caller(&req, &state)?;
    let event_id = path.into_inner();
    let db = state.db.clone();
    let now = state.clock.now();
    let asker = who.clone();
    let (changed, row) = web::block(move || -> Result<_, Problem> {
        let who = asker;
        // The owner never changes, so checking it before the cancel's own transaction is safe.
        let Some(row) = db.find_by_event_id(&event_id)? else {
            return Err(fan_out_or_not_found(&db, &who, &event_id)?);
        };
        permit(&who, Access::OwnMessage, row.enqueued_by.as_deref())?;
        Ok(crate::outbox::cancel(&db, &event_id, now)?)
    })
    .await??;
    if changed {
        tracing::info!(event_id = %crate::telemetry::LogEventId(&row.event_id), "message canceled");
    }
    Ok(HttpResponse::Ok().printable_json(&MessageView::for_caller(&row, &state.policies, &who)))
}

/// The answer for an event id no message has: a fan-out's own (409 `fan-out` naming its
/// messages, each to be canceled by its own event id) when every one of them is the caller's to
/// see, else 404.
fn fan_out_or_not_found(db: &Db, who: &Principal, event_id: &str) -> Result<Problem, Problem> {
    let children = db.fanout_messages(event_id)?;
    let theirs = !children.is_empty()
        && children.iter().all(|m| {
            matches!(
                who.may(Access::OwnMessage, m.enqueued_by.as_deref()),
                Verdict::Allowed
            )
        });
    if !theirs {
        return Ok(Problem::not_found("message"));
    }
    Ok(support::SupportError::fan_out(&children).into())
}

/// `POST` (or `GET`) `/v1/ingest/{source}`: verify over the raw bytes, store every event of the request in one
/// transaction, and only then answer 200. Authenticated by the provider's signature, not a token.
#[utoipa::path(
    post,
    path = "/v1/ingest/{source}",
    description = "A provider's delivery receipts. Authenticated by the provider's signature (the source's `scheme`), not a token.",
    params(("source" = String, Path, description = "The `[sources.NAME]` name")),
    request_body(content = String, description = "The provider's request, as it sent it", content_type = "*/*"),
    responses(
        (status = 200, description = "Every event of the request committed (only then)", body = view::IngestAck),
        (status = 400, description = "Verified, but the body cannot be parsed (`unparsable`)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "The signature does not verify, or a replay (`unauthenticated`); nothing stored", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such receipt source", body = ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "The body is too large", body = ProblemBody, content_type = "application/problem+json"),
        (status = 415, description = "The body has a Content-Encoding (Herald decodes none)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Cannot verify now (a certificate fetch failed) or storage is down: retry (`Retry-After`)", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn ingest_receipts(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let started = std::time::Instant::now();
    let name = path.into_inner();
    let answer = ingest_into(&req, &state, &name, payload).await;
    let verdict = match &answer {
        Ok(_) => IngestVerdict::Accepted,
        Err((verdict, _)) => *verdict,
    };
    // An unknown name is counted under a fixed label, never under the path's text.
    state
        .metrics
        .ingest_request(&name, verdict, started.elapsed());
    answer.map_err(|(_, p)| p)
}

/// `GET /v1/ingest/{source}`: the same handler (MessageBird status reports, Vonage SMS GET
/// receipts sign the query string), documented as its own operation.
#[utoipa::path(
    get,
    path = "/v1/ingest/{source}",
    description = "Delivery receipts a provider sends as a signed GET (MessageBird, Vonage SMS). Authenticated by the provider's signature, not a token.",
    params(("source" = String, Path, description = "The `[sources.NAME]` name")),
    responses(
        (status = 200, description = "Every event of the request committed (only then)", body = view::IngestAck),
        (status = 400, description = "Verified, but the body cannot be parsed (`unparsable`)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "The signature does not verify, or a replay (`unauthenticated`); nothing stored", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such receipt source", body = ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "The body is too large", body = ProblemBody, content_type = "application/problem+json"),
        (status = 415, description = "The body has a Content-Encoding (Herald decodes none)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "Cannot verify now (a certificate fetch failed) or storage is down: retry (`Retry-After`)", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
async fn ingest_receipts_get(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    ingest_receipts(req, state, path, payload).await
}

/// The ingest request's work; a refusal comes with its verdict.
async fn ingest_into(
    req: &HttpRequest,
    state: &AppState,
    name: &str,
    payload: web::Payload,
) -> Result<HttpResponse, (IngestVerdict, Problem)> {
    let refused = |p: Problem| (IngestVerdict::of_status(p.status), p);
    let name = name.to_owned();
    let source = state.sources.get(&name).cloned().ok_or_else(|| {
        refused(
            Problem::new(StatusCode::NOT_FOUND, "not-found", "No such receipt source").detail(
                "no source of this name is configured ([sources.NAME] in herald.toml): \
                 check the URL's last segment",
            ),
        )
    })?;
    let body = read_body(req, state, payload, state.ingest_max_body_bytes)
        .await
        .map_err(refused)?;
    // A value that is not visible ASCII is kept, its bytes read as UTF-8 (replacing what is
    // not): left out, a provider's id or signature header of such bytes was refused as
    // "missing", which it was not; so it is refused as not matching its signature.
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(n, v)| {
            let value = match v.to_str() {
                Ok(v) => v.to_owned(),
                Err(_) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
            };
            (n.as_str().to_owned(), value)
        })
        .collect();
    let now = state.clock.now();
    let query = req.uri().query().map(str::to_owned);
    let method = req.method().as_str().to_owned();
    let verifier = source.source.clone();
    // From here on the writer may wait (briefly) for this request to join its next group.
    let coming = state.receipt_writer.begin();
    // Signature checks (RSA, ECDSA) and an occasional certificate fetch run off the executor,
    // in a span naming the source: a scheme's own log lines (an event time it cannot read) say
    // which source they are of.
    let span = tracing::info_span!("ingest", source = %name);
    let verdict = web::block(move || {
        let _in = span.enter();
        let raw = RawRequest {
            headers: &headers,
            body: &body,
            query: query.as_deref(),
            method: &method,
        };
        verifier.verify_storable(&raw, now)
    })
    .await
    .map_err(|e| refused(e.into()))?;
    let events = verdict.map_err(|e| {
        let verdict = if e.status() == 503 {
            tracing::warn!(source = %name, reason = %e, "receipt not verifiable now; asked to retry");
            IngestVerdict::Unverifiable
        } else {
            // Per request and unauthenticated: each at debug; at warn only the first of a
            // source and then one a minute (junk cannot flood the log, a wrong secret shows).
            match state.refusals.take(&name, now) {
                Some(left_out) => tracing::warn!(source = %name, scheme = %source.source.scheme(), reason = %e, refused_since_last_line = left_out, "receipt refused"),
                None => tracing::debug!(source = %name, scheme = %source.source.scheme(), reason = %e, "receipt refused"),
            }
            IngestVerdict::of_status(e.status())
        };
        (verdict, Problem::from(e))
    })?;
    // Committed with the next group (one transaction, one fsync for every request in it); the
    // answer comes after that commit.
    let outcome = state
        .receipt_writer
        .store(coming, &name, events, now)
        .await
        .map_err(|e| refused(e.into()))?;
    let (stored, duplicates) = match outcome {
        Stored::Receipts { new, duplicates } => (new, duplicates),
        Stored::Replayed(n) => {
            state
                .metrics
                .receipts(&name, ReceiptVerdict::Replayed, n as u64);
            // A valid signature used again for another event: an attack or a leak, worth a warning.
            tracing::warn!(source = %name, scheme = source.source.scheme(), replayed = n, "receipt refused as a replay; nothing stored");
            return Err((IngestVerdict::Replayed, Problem::replayed()));
        }
    };
    // Committed: only now is it acknowledged.
    if stored > 0 {
        state.reconcile_wake.notify_one();
    }
    let m = &state.metrics;
    m.receipts(&name, ReceiptVerdict::Stored, stored as u64);
    m.receipts(&name, ReceiptVerdict::Duplicate, duplicates as u64);
    tracing::info!(source = %name, scheme = source.source.scheme(), stored, duplicates, "receipts stored");
    Ok(HttpResponse::Ok().printable_json(&view::IngestAck { stored, duplicates }))
}

/// The fields of a `POST /v1/messages` body; any other is refused by name.
pub const MESSAGE_FIELDS: &[&str] = &[
    "event_id",
    "channel",
    "destination",
    "payload",
    "scheduled_at",
    "expires_at",
    "semantics",
    "max_attempts",
    "ordering_key",
    "ordering_policy",
];

/// Parses the `POST /v1/messages` body, naming every offending field.
pub fn parse_new_message(
    body: &[u8],
    idempotency_key: Option<&str>,
) -> Result<NewMessage, Vec<InvalidField>> {
    parse_message_or_unnamed(body, idempotency_key).map_err(|(errors, _)| errors)
}

/// [`parse_new_message`], and when the body is a message but for fields already refused (the
/// event id missing or not the Idempotency-Key header's, a semantics, a time, a budget or an
/// ordering field no message takes), that message with stand-ins for them, for its own checks
/// (`NewMessage::plan`) to name the other fields in the same answer.
fn parse_message_or_unnamed(
    body: &[u8],
    idempotency_key: Option<&str>,
) -> Result<NewMessage, (Vec<InvalidField>, Option<Box<NewMessage>>)> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| (vec![InvalidField::of_json(body, &e)], None))?;
    let Value::Object(obj) = value else {
        return Err((
            vec![InvalidField::new("body", "must be a JSON object")],
            None,
        ));
    };
    // An integer no 64 bits hold would be stored and sent as the nearest double instead.
    let mut errors: Vec<InvalidField> = crate::domain::integers_beyond_64_bits(body)
        .into_iter()
        .take(10)
        .map(|field| {
            // A budget cannot be a string: it is named as any out-of-range budget is.
            let why = if field == "max_attempts" {
                "must be a positive integer"
            } else {
                "is an integer beyond 64 bits, which JSON parsers keep only approximately: send it as a string"
            };
            InvalidField::new(field, why)
        })
        .collect();
    // A key given twice: the parser kept the last, a proxy may have read the first, and a body
    // sent on would lose one (found by an input audit: both were taken, the last silently).
    errors.extend(crate::domain::keys_given_twice(body));
    for k in obj.keys().filter(|k| !MESSAGE_FIELDS.contains(&k.as_str())) {
        errors.push(InvalidField::new(k.clone(), "is not a known field"));
    }
    let mut string =
        |obj: &Map<String, Value>, key: &'static str, required: bool| -> Option<String> {
            match obj.get(key) {
                Some(Value::String(s)) => Some(s.clone()),
                None | Some(Value::Null) if !required => None,
                None | Some(Value::Null) => {
                    errors.push(InvalidField::new(key, "is required"));
                    None
                }
                Some(_) => {
                    errors.push(InvalidField::new(key, "must be a string"));
                    None
                }
            }
        };
    let body_event_id = string(&obj, "event_id", false);
    let channel = string(&obj, "channel", true);
    let destination = string(&obj, "destination", true);
    let scheduled_at = string(&obj, "scheduled_at", false);
    let expires_at = string(&obj, "expires_at", false);
    let semantics = string(&obj, "semantics", false);
    let ordering_key = string(&obj, "ordering_key", false);
    let ordering_policy = string(&obj, "ordering_policy", false).and_then(|p| {
        crate::domain::OrderingPolicy::parse(&p)
            .map_err(|e| errors.push(e))
            .ok()
    });
    if let Some(k) = &ordering_key
        && let Err(e) = crate::domain::OrderingKey::parse(k)
    {
        errors.push(e);
    }
    let event_id = match (body_event_id, idempotency_key) {
        (Some(a), Some(b)) if a != b => {
            errors.push(InvalidField::new(
                "event_id",
                "differs from the Idempotency-Key header",
            ));
            None
        }
        (Some(a), _) => Some(a),
        // Named as the header it came from (it was named `event_id`, a field the body lacks).
        (None, Some(b)) => match crate::domain::EventId::parse(b) {
            Ok(_) => Some(b.to_owned()),
            Err(e) => {
                errors.push(InvalidField::new("Idempotency-Key", e.message));
                None
            }
        },
        (None, None) => {
            if !errors.iter().any(|e| e.field == "event_id") {
                errors.push(InvalidField::new(
                    "event_id",
                    "is required (or send an Idempotency-Key header)",
                ));
            }
            None
        }
    };
    let channel = channel.and_then(|c| Channel::parse(&c).map_err(|e| errors.push(e)).ok());
    let mut time = |key: &'static str, v: Option<String>| -> Option<DateTime<Utc>> {
        crate::domain::parse_time(key, &v?)
            .map_err(|e| errors.push(e))
            .ok()
    };
    let scheduled_at = time("scheduled_at", scheduled_at);
    let expires_at = time("expires_at", expires_at);
    let semantics = match semantics {
        Some(s) => Semantics::parse(&s).map_err(|e| errors.push(e)).ok(),
        None => Some(Semantics::AtLeastOnce),
    };
    let max_attempts = match obj.get("max_attempts") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) => Some(n),
            None => {
                // Named once: an integer beyond 64 bits was named above.
                if !errors.iter().any(|e| e.field == "max_attempts") {
                    errors.push(InvalidField::new(
                        "max_attempts",
                        "must be a positive integer",
                    ));
                }
                None
            }
        },
    };
    let payload = match obj.get("payload") {
        Some(p @ Value::Object(_)) => Some(p.clone()),
        None | Some(Value::Null) => {
            errors.push(InvalidField::new("payload", "is required"));
            None
        }
        Some(_) => {
            errors.push(InvalidField::new("payload", "must be an object"));
            None
        }
    };
    let (Some(channel), Some(destination), Some(payload)) = (channel, destination, payload) else {
        return Err((errors, None));
    };
    // A field already refused above stands in as unset (or the default) for the message's own
    // checks, which then name the other fields in the same answer.
    let message = NewMessage {
        event_id: event_id.unwrap_or_else(|| "unnamed".to_owned()),
        channel,
        destination,
        payload,
        scheduled_at,
        expires_at,
        semantics: semantics.unwrap_or(Semantics::AtLeastOnce),
        max_attempts,
        ordering_key,
        ordering_policy,
    };
    if errors.is_empty() {
        Ok(message)
    } else {
        Err((errors, Some(Box::new(message))))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn parses_an_ordering_key_and_policy_and_names_bad_ones() {
        let m = parse_new_message(
            br#"{"event_id":"e1","channel":"webhook","destination":"https://a.example/h",
                "payload":{"body":{}},"ordering_key":"order-42","ordering_policy":"skip"}"#,
            None,
        )
        .unwrap();
        assert_eq!(m.ordering_key.as_deref(), Some("order-42"));
        assert_eq!(m.ordering_policy, Some(crate::domain::OrderingPolicy::Skip));
        let unkeyed = parse_new_message(
            br#"{"event_id":"e1","channel":"webhook","destination":"https://a.example/h","payload":{"body":{}}}"#,
            None,
        )
        .unwrap();
        assert_eq!(
            (unkeyed.ordering_key, unkeyed.ordering_policy),
            (None, None)
        );
        let body = |extra: &str| {
            format!(
                r#"{{"event_id":"e1","channel":"webhook","destination":"https://a.example/h","payload":{{"body":{{}}}},{extra}}}"#
            )
        };
        assert_eq!(
            fields(&body(r#""ordering_key":"a b""#), None),
            ["ordering_key"]
        );
        assert_eq!(fields(&body(r#""ordering_key":7"#), None), ["ordering_key"]);
        assert_eq!(
            fields(&body(r#""ordering_policy":"fifo""#), None),
            ["ordering_policy"]
        );
    }
    use super::*;

    fn fields(body: &str, key: Option<&str>) -> Vec<String> {
        parse_new_message(body.as_bytes(), key)
            .unwrap_err()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    #[test]
    fn parses_a_full_request() {
        let m = parse_new_message(
            br#"{"event_id":"e1","channel":"webhook","destination":"https://a.example/h",
                "payload":{"body":{"x":1}},"scheduled_at":"2026-11-30T12:00:00+01:00",
                "semantics":"at_most_once","max_attempts":3}"#,
            None,
        )
        .unwrap();
        assert_eq!(m.event_id, "e1");
        assert_eq!(m.semantics, Semantics::AtMostOnce);
        assert_eq!(
            m.scheduled_at.unwrap().to_rfc3339(),
            "2026-11-30T11:00:00+00:00"
        );
        assert_eq!(m.max_attempts, Some(3));
    }

    #[test]
    fn the_idempotency_key_can_carry_the_event_id() {
        let body =
            r#"{"channel":"webhook","destination":"https://a.example/h","payload":{"body":1}}"#;
        assert_eq!(
            parse_new_message(body.as_bytes(), Some("k1"))
                .unwrap()
                .event_id,
            "k1"
        );
        assert_eq!(fields(body, None), ["event_id"]);
        let both = r#"{"event_id":"a","channel":"webhook","destination":"https://a.example/h","payload":{"body":1}}"#;
        assert_eq!(fields(both, Some("b")), ["event_id"]);
        assert!(parse_new_message(both.as_bytes(), Some("a")).is_ok());
    }

    #[test]
    fn every_offending_field_is_named() {
        assert_eq!(fields("[1]", None), ["body"]);
        assert_eq!(fields("{", None), ["body"]);
        assert_eq!(
            fields(
                r#"{"event_id":1,"channel":"sms","payload":[],"schedule_at":"x","expires_at":"tomorrow","semantics":"maybe","max_attempts":-1}"#,
                None
            ),
            [
                "schedule_at",
                "event_id",
                "destination",
                "channel",
                "expires_at",
                "semantics",
                "max_attempts",
                "payload"
            ]
        );
    }
}
