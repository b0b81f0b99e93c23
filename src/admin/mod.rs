//! The admin page under `/admin`: server-rendered HTML for a person in a browser.
//!
//! Invariants: every page and action but the sign-in form and the stylesheet needs a valid
//! session ([`session`]); a `GET` without one is sent to sign in, a `POST` without one is a 401.
//! Every `POST` must come from this site (`Sec-Fetch-Site`/`Origin`, [`guard`]) and, once signed
//! in, carry the session's CSRF token. Every answer carries a strict Content-Security-Policy (no
//! script at all, styles from `/admin/static/` only), `nosniff`, `no-referrer`, and pages
//! `no-store`. No page shows a payload, a response excerpt, a provider's raw receipt, a token or
//! an unmasked destination: [`data`] hands the templates redacted facts only.
//!
//! Handlers are thin: parse, one call into [`data`] (the seam to the support module), render.

pub mod chart;
pub mod data;
pub mod guard;
pub mod pages;
pub mod session;

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::DefaultHeaders;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use maud::Markup;

use self::data::{Found, ReplayHook, ReplayRefused, ReplayRequest, SupportReplay};
use self::pages::{Notice, Viewer};
use self::session::{Session, SessionKey};
use crate::domain::{AttemptClass, Channel};
use crate::http::AppState;
use crate::storage::admin::DeadLetterFilter;
use crate::storage::models::UNCONFIRMED_DEADLINE_REASON;
use crate::storage::{Db, StorageError};

/// The Content-Security-Policy of every `/admin` answer.
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self' data:; \
                       form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// How many dead letters one page lists.
pub const PAGE: usize = 50;

const CSS: &str = include_str!("admin.css");
/// The largest form body accepted.
const FORM_LIMIT: usize = 16 * 1024;

/// What the admin routes share besides [`AppState`].
#[derive(Clone)]
pub struct AdminState {
    pub key: SessionKey,
    /// What the replay button calls (the support module's replay).
    pub replay: Arc<dyn ReplayHook>,
}

impl AdminState {
    /// The session key stored in `herald_settings` (generated on first use, so every process on
    /// the database signs alike) and the given replay hook. Blocking.
    pub fn load(db: &Db, clock: Arc<dyn crate::clock::Clock>) -> Result<Self, AdminSetupError> {
        let stored = db.setting_or_insert(session::KEY_SETTING, &SessionKey::generate_hex())?;
        let key = SessionKey::from_hex(&stored).ok_or(AdminSetupError::BadKey)?;
        Ok(Self {
            key,
            replay: Arc::new(SupportReplay { clock }),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AdminSetupError {
    #[error("cannot read or store the admin session key")]
    Storage(#[from] StorageError),
    #[error(
        "the stored admin session key ({}) is not 64 hex digits",
        session::KEY_SETTING
    )]
    BadKey,
}

/// The `/admin` routes.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::scope("/admin")
            .wrap(
                DefaultHeaders::new()
                    .add((header::CONTENT_SECURITY_POLICY, CSP))
                    .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
                    .add((header::REFERRER_POLICY, "no-referrer"))
                    .add((header::X_FRAME_OPTIONS, "DENY"))
                    .add(("cross-origin-opener-policy", "same-origin"))
                    .add(("cross-origin-resource-policy", "same-origin"))
                    .add((header::CACHE_CONTROL, "no-store")),
            )
            .route("", web::get().to(home))
            .route("/", web::get().to(home))
            .route("/sign-in", web::get().to(sign_in_form))
            .route("/sign-in", web::post().to(sign_in))
            .route("/sign-out", web::post().to(sign_out))
            .route("/search", web::get().to(search))
            .route("/message", web::get().to(message))
            .route("/replay", web::post().to(replay))
            .route("/dead-letters", web::get().to(dead_letters))
            .route("/static/admin.css", web::get().to(css))
            .default_service(web::to(not_found)),
    );
}

/// An answer that ends a handler early (boxed: `HttpResponse` is large).
type Halt = Box<HttpResponse>;

fn page(status: StatusCode, markup: Markup) -> HttpResponse {
    // Every page's stored text shown, never obeyed: a right-to-left override in a receipt's
    // type turned the timeline's own words backwards (a walk-through found it). Herald's own
    // markup holds none of these characters, so the whole page can be written out.
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(crate::telemetry::printable(&markup.into_string()).into_owned())
}

fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, location))
        .finish()
}

fn header_str<'a>(req: &'a HttpRequest, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

fn over_tls(req: &HttpRequest) -> bool {
    // Herald itself listens on plain HTTP; TLS is a reverse proxy's (see guard::over_tls).
    guard::over_tls(
        false,
        header_str(req, "x-forwarded-proto"),
        header_str(req, "forwarded"),
    )
}

/// The most sessions of one request looked at (each cookie's signature is checked).
const SESSIONS_PER_REQUEST: usize = 8;

/// The valid session of a request, if any: of its `herald_admin` cookies, the first whose
/// signature, expiry and token binding hold and whose session was not signed out (asked of the
/// database, so a sign-out in one process counts in every other).
async fn current(
    req: &HttpRequest,
    state: &AppState,
    admin: &AdminState,
    unavailable: &str,
) -> Result<Option<Session>, Halt> {
    let now = state.clock.now();
    let valid: Vec<Session> = req
        .headers()
        .get_all(header::COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(session::from_cookie_header)
        .filter_map(|v| session::verify(&admin.key, &state.tokens, v, now).ok())
        .take(SESSIONS_PER_REQUEST)
        .collect();
    if valid.is_empty() {
        return Ok(None);
    }
    let ids: Vec<String> = valid.iter().map(|s| s.id.clone()).collect();
    let db = state.db.clone();
    let signed_out = blocking_saying(None, unavailable, move || db.signed_out(&ids)).await?;
    Ok(valid.into_iter().find(|s| !signed_out.contains(&s.id)))
}

/// A `GET` page's session, or the redirect to sign in.
async fn for_page(
    req: &HttpRequest,
    state: &AppState,
    admin: &AdminState,
) -> Result<(Session, String), Halt> {
    let s = current(req, state, admin, DATABASE_UNAVAILABLE)
        .await?
        .ok_or_else(|| Box::new(see_other("/admin/sign-in")))?;
    let csrf = session::csrf_token(&admin.key, &s);
    Ok((s, csrf))
}

fn refuse(status: StatusCode, title: &str, detail: &str) -> Halt {
    Box::new(page(status, pages::error(None, title, detail)))
}

/// A `POST`'s checks, in order: from this site (403), a session (401), its CSRF token (403).
async fn for_action(
    req: &HttpRequest,
    state: &AppState,
    admin: &AdminState,
    form: &Form,
) -> Result<(Session, String), Halt> {
    for_action_saying(req, state, admin, form, DATABASE_UNAVAILABLE).await
}

/// [`for_action`], whose 503 (the database could not say whether the session was signed out)
/// says `unavailable`.
async fn for_action_saying(
    req: &HttpRequest,
    state: &AppState,
    admin: &AdminState,
    form: &Form,
    unavailable: &str,
) -> Result<(Session, String), Halt> {
    same_site(req)?;
    let s = current(req, state, admin, unavailable)
        .await?
        .ok_or_else(|| {
            refuse(
                StatusCode::UNAUTHORIZED,
                "Signed out",
                "Your session has ended or was never started; sign in again.",
            )
        })?;
    if !session::csrf_ok(&admin.key, &s, form.get("csrf").unwrap_or("")) {
        tracing::info!(token = %s.principal.name, "admin form refused: CSRF token missing or wrong");
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "Form refused",
            "The form's security token is missing or out of date; reload the page and try again.",
        ));
    }
    let csrf = session::csrf_token(&admin.key, &s);
    Ok((s, csrf))
}

fn same_site(req: &HttpRequest) -> Result<(), Halt> {
    guard::same_origin(
        header_str(req, "sec-fetch-site"),
        header_str(req, "origin"),
        header_str(req, "host"),
    )
    .map_err(|e| {
        tracing::info!(reason = %e, "admin form refused as cross-site");
        refuse(
            StatusCode::FORBIDDEN,
            "Form refused",
            &format!("Refused: {e}."),
        )
    })
}

/// A form body's fields (`application/x-www-form-urlencoded`).
struct Form(Vec<(String, String)>);

impl Form {
    fn parse(body: &[u8]) -> Self {
        Self(url::form_urlencoded::parse(body).into_owned().collect())
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn read_form(
    req: &HttpRequest,
    state: &AppState,
    payload: web::Payload,
) -> Result<Form, Halt> {
    use crate::http::BodyError;
    let body = crate::http::read_limited(req, payload, FORM_LIMIT, state.body_read_timeout)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge => refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Bad form",
                "The form is too large.",
            ),
            BodyError::Unreadable => refuse(
                StatusCode::BAD_REQUEST,
                "Bad form",
                "The form could not be read.",
            ),
            BodyError::TimedOut => {
                let mut page = refuse(
                    StatusCode::REQUEST_TIMEOUT,
                    "Bad form",
                    "The form did not arrive in time.",
                );
                // The rest may still come, or never: the connection is not reused.
                page.head_mut()
                    .set_connection_type(actix_web::http::ConnectionType::Close);
                page
            }
        })?;
    Ok(Form::parse(&body))
}

fn query(req: &HttpRequest) -> Form {
    Form::parse(req.query_string().as_bytes())
}

/// Runs a blocking storage call off the executor; a failure is a page (503 when the database is
/// unavailable, with `Retry-After`).
async fn blocking<T: Send + 'static>(
    viewer: Option<&Viewer<'_>>,
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, Halt> {
    blocking_saying(viewer, DATABASE_UNAVAILABLE, f).await
}

/// [`blocking`], whose 503 page says `unavailable`.
async fn blocking_saying<T: Send + 'static>(
    viewer: Option<&Viewer<'_>>,
    unavailable: &str,
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, Halt> {
    match web::block(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            tracing::warn!(error = %e.log_safe(), "admin page: storage failed");
            let mut r = page(
                StatusCode::SERVICE_UNAVAILABLE,
                pages::error(viewer, "Database unavailable", unavailable),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
            Err(Box::new(r))
        }
        Err(_) => Err(Box::new(page(
            StatusCode::INTERNAL_SERVER_ERROR,
            pages::error(
                viewer,
                "Internal error",
                "The request could not be handled.",
            ),
        ))),
    }
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(response) => return *response,
        }
    };
}

async fn css() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/css; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "max-age=300"))
        .body(CSS)
}

async fn not_found(
    req: HttpRequest,
    state: web::Data<AppState>,
    admin: web::Data<AdminState>,
) -> HttpResponse {
    let (s, csrf) = tri!(for_page(&req, &state, &admin).await);
    let viewer = Viewer::new(&s.principal, &csrf);
    page(
        StatusCode::NOT_FOUND,
        pages::error(Some(&viewer), "Not found", "There is no such admin page."),
    )
}

async fn sign_in_form() -> HttpResponse {
    page(StatusCode::OK, pages::sign_in(None))
}

async fn sign_in(
    req: HttpRequest,
    state: web::Data<AppState>,
    admin: web::Data<AdminState>,
    payload: web::Payload,
) -> HttpResponse {
    // Login CSRF: another site must not sign a browser in with a token of its choosing.
    tri!(same_site(&req));
    let form = tri!(read_form(&req, &state, payload).await);
    let refused = |status, why: &str| page(status, pages::sign_in(Some(why)));
    let who = match session::sign_in(&state.tokens, form.get("token").unwrap_or("")) {
        Ok(who) => who,
        Err(e) => {
            tracing::info!(
                reason = e.kind(),
                token = e.token_name(),
                "admin sign-in refused"
            );
            let status = match e {
                session::SignInRefused::UnknownToken => StatusCode::UNAUTHORIZED,
                session::SignInRefused::SendScope(_) => StatusCode::FORBIDDEN,
            };
            return refused(status, &e.to_string());
        }
    };
    let Some((cookie, s)) = session::issue(&admin.key, &state.tokens, &who, state.clock.now())
    else {
        return refused(
            StatusCode::UNAUTHORIZED,
            "That token is not known to Herald.",
        );
    };
    tracing::info!(token = %s.principal.name, scope = %s.principal.scope, "admin sign-in");
    let mut r = see_other("/admin");
    if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&cookie, over_tls(&req))) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// The 503 of a page or form the database did not answer.
const DATABASE_UNAVAILABLE: &str = "The database did not answer; try again in a moment.";

/// The 503 of a sign-out the database did not store: the cookie is kept, and the page says the
/// session goes on (it said only "try again", and a person took it for signed out).
pub(crate) const SIGN_OUT_NOT_STORED: &str = "The database did not answer, so the sign-out could not \
     be stored: you are still signed in. Sign out again in a moment.";

async fn sign_out(
    req: HttpRequest,
    state: web::Data<AppState>,
    admin: web::Data<AdminState>,
    payload: web::Payload,
) -> HttpResponse {
    let form = tri!(read_form(&req, &state, payload).await);
    // The session's own check asks the database first: down, it says the session goes on too
    // (the re-check found the generic page there, the sign-out never reached).
    let (s, csrf) = tri!(for_action_saying(&req, &state, &admin, &form, SIGN_OUT_NOT_STORED).await);
    // Stored before the cookie is cleared: a copy of the cookie taken before is refused by every
    // process from now on. If the database does not answer, the session stays (and says so).
    let viewer = Viewer::new(&s.principal, &csrf);
    let db = state.db.clone();
    let (id, expires_at, now) = (s.id.clone(), s.expires_at, state.clock.now());
    tri!(
        blocking_saying(Some(&viewer), SIGN_OUT_NOT_STORED, move || db
            .record_sign_out(&id, expires_at, now))
        .await
    );
    tracing::info!(token = %s.principal.name, "admin sign-out");
    let mut r = see_other("/admin/sign-in");
    if let Ok(v) = HeaderValue::from_str(&session::clear_cookie(over_tls(&req))) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

async fn home(
    req: HttpRequest,
    state: web::Data<AppState>,
    admin: web::Data<AdminState>,
) -> HttpResponse {
    let (s, csrf) = tri!(for_page(&req, &state, &admin).await);
    let viewer = Viewer::new(&s.principal, &csrf);
    let now = state.clock.now();
    let db = state.db.clone();
    let counts = tri!(
        blocking(Some(&viewer), move || data::attempt_counts(
            &db,
            chart::since(now)
        ))
        .await
    );
    let svg = chart::render(&chart::columns(now, &counts));
    page(StatusCode::OK, pages::home(&viewer, svg))
}

async fn search(
    req: HttpRequest,
    state: web::Data<AppState>,
    admin: web::Data<AdminState>,
) -> HttpResponse {
    let (s, csrf) = tri!(for_page(&req, &state, &admin).await);
    let viewer = Viewer::new(&s.principal, &csrf);
    let q = query(&req).get("q").unwrap_or("").to_owned();
    let parsed = data::parse_query(&q);
    if parsed == data::Query::Empty {
        // Nothing asked: back to the search box, not "no message has that event id".
        return see_other("/admin");
    }
    let db = state.db.clone();
    let found = tri!(blocking(Some(&viewer), move || data::search(&db, &parsed)).await);
    match found {
        Found::One(event_id) => see_other(&pages::message_href(&event_id)),
        Found::Many(rows, more) => page(StatusCode::OK, pages::results(&viewer, &q, &rows, more)),
        Found::Nothing => page(
            StatusCode::NOT_FOUND,
            pages::results(&viewer, &q, &[], false),
        ),
    }
}

/// Renders a message's page (also after a refused replay, with the refusal).
const REPLAY_RECORDED: &str =
    "Replay recorded: the message is due again; its next attempt appears below once made.";

async fn message_page(
    state: &AppState,
    viewer: &Viewer<'_>,
    event_id: String,
    status: StatusCode,
    notice: Option<Notice<'_>>,
) -> HttpResponse {
    let db = state.db.clone();
    let policies = state.policies.clone();
    let event_id_of_missing = event_id.clone();
    let detail = tri!(
        blocking(Some(viewer), move || data::message_detail(
            &db, &event_id, &policies
        ))
        .await
    );
    match detail {
        Some(d) => {
            // The "replay recorded" banner only when this viewer did replay it a moment ago: a
            // crafted link with `replayed=1` showed it without any replay.
            let notice = match notice {
                Some(Notice::Info(t)) if t == REPLAY_RECORDED => {
                    let now = state.clock.now();
                    d.replays
                        .last()
                        .filter(|r| r.who == viewer.who.name)
                        .and_then(|r| chrono::DateTime::parse_from_rfc3339(&r.replayed_at).ok())
                        .filter(|at| {
                            now - at.with_timezone(&chrono::Utc) < chrono::Duration::minutes(10)
                        })
                        .map(|_| Notice::Info(REPLAY_RECORDED))
                }
                other => other,
            };
            page(
                status,
                pages::message(viewer, &d, notice, state.clock.now()),
            )
        }
        // Looked at (no refusal to show): a fan-out's own event id lists its messages in the
        // search, as does any id the search knows.
        None if notice.is_none() => see_other(&format!(
            "/admin/search?q={}",
            url::form_urlencoded::byte_serialize(event_id_of_missing.as_bytes())
                .collect::<String>()
        )),
        None => page(
            StatusCode::NOT_FOUND,
            pages::error(Some(viewer), "Not found", "No message has that event id."),
        ),
    }
}

async fn message(
    req: HttpRequest,
    state: web::Data<AppState>,
    admin: web::Data<AdminState>,
) -> HttpResponse {
    let (s, csrf) = tri!(for_page(&req, &state, &admin).await);
    let viewer = Viewer::new(&s.principal, &csrf);
    let q = query(&req);
    let event_id = q.get("event_id").unwrap_or("").to_owned();
    let notice = (q.get("replayed") == Some("1")).then_some(Notice::Info(REPLAY_RECORDED));
    message_page(&state, &viewer, event_id, StatusCode::OK, notice).await
}

async fn replay(
    req: HttpRequest,
    state: web::Data<AppState>,
    admin: web::Data<AdminState>,
    payload: web::Payload,
) -> HttpResponse {
    let form = tri!(read_form(&req, &state, payload).await);
    let (s, csrf) = tri!(for_action(&req, &state, &admin, &form).await);
    let viewer = Viewer::new(&s.principal, &csrf);
    // The hex copy first: the plain one is written out on the page where it holds a control
    // character, and would name another message (or none) if posted back as shown.
    let event_id = form
        .get("event_id_hex")
        .and_then(|h| hex::decode(h).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_else(|| form.get("event_id").unwrap_or("").to_owned());
    let reason = form.get("reason").unwrap_or("").trim().to_owned();
    // A refused replay's form comes back with what was typed and chosen in it (the expires_at
    // choice came back as its default, so fixing the time and sending again cleared it).
    let typed = pages::TypedReplay {
        reason: reason.clone(),
        expires: form.get("expires").map(str::to_owned),
        expires_at: form.get("expires_at").unwrap_or("").to_owned(),
    };
    let viewer = Viewer {
        typed: Some(&typed),
        ..viewer
    };
    if reason.is_empty() || reason.chars().count() > data::MAX_REASON {
        let why = format!(
            "A replay needs a reason (1–{} characters).",
            data::MAX_REASON
        );
        return message_page(
            &state,
            &viewer,
            event_id,
            StatusCode::UNPROCESSABLE_ENTITY,
            Some(Notice::Error(&why)),
        )
        .await;
    }
    // The message's expires_at: kept (absent), cleared, or set to a given time.
    let expires_at = match (form.get("expires"), form.get("expires_at").map(str::trim)) {
        // A time typed while keeping or clearing it was meant for "set": said, not dropped.
        (Some("keep" | "clear"), Some(t)) if !t.is_empty() => {
            Err("A time was given: choose \"set it\" to use it, or leave the time empty.")
        }
        (None | Some("keep"), _) => Ok(None),
        (Some("clear"), _) => Ok(Some(None)),
        (Some("set"), Some(t)) => crate::domain::parse_time("expires_at", t)
            .map(|t| Some(Some(t)))
            .map_err(|_| {
                "The new expires_at must be an RFC 3339 time within the years 1 to 9999, such as 2026-12-31T09:00:00Z."
            }),
        _ => Err("Choose to keep, clear or set its expires_at."),
    };
    let expires_at = match expires_at {
        Ok(e) => e,
        Err(why) => {
            return message_page(
                &state,
                &viewer,
                event_id,
                StatusCode::UNPROCESSABLE_ENTITY,
                Some(Notice::Error(why)),
            )
            .await;
        }
    };
    let request = ReplayRequest {
        event_id: event_id.clone(),
        reason,
        force: form.get("force") == Some("1"),
        expires_at,
        by: s.principal.clone(),
        at: state.clock.now(),
    };
    let (db, hook) = (state.db.clone(), admin.replay.clone());
    let outcome = match web::block(move || hook.replay(&db, &request)).await {
        Ok(r) => r,
        Err(_) => {
            return page(
                StatusCode::INTERNAL_SERVER_ERROR,
                pages::error(
                    Some(&viewer),
                    "Internal error",
                    "The replay could not be handled.",
                ),
            );
        }
    };
    match outcome {
        Ok(()) => {
            tracing::info!(event_id = %crate::telemetry::LogEventId(&event_id), token = %s.principal.name, "replay asked on the admin page");
            state.wake.notify_one();
            see_other(&format!("{}&replayed=1", pages::message_href(&event_id)))
        }
        Err(e) => {
            let status = match &e {
                ReplayRefused::NotFound => StatusCode::NOT_FOUND,
                ReplayRefused::Refused(_) => StatusCode::CONFLICT,
                ReplayRefused::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
                ReplayRefused::Storage(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            let why = e.to_string();
            message_page(&state, &viewer, event_id, status, Some(Notice::Error(&why))).await
        }
    }
}

/// `before` as the next page's link carries it: `MICROS.ID`.
fn parse_cursor(s: &str) -> Option<(DateTime<Utc>, i64)> {
    let (t, id) = s.split_once('.')?;
    Some((
        crate::support::cursor_time(t.parse().ok()?)?,
        id.parse().ok()?,
    ))
}

/// The dead-letter filter from the query string; an unknown value is a 400 naming it.
fn parse_filter(q: &Form) -> Result<DeadLetterFilter, String> {
    // Given twice, which one counts would be a guess (the API refuses it too).
    if let Some(k) = ["channel", "class", "before"]
        .into_iter()
        .find(|k| q.0.iter().filter(|(name, _)| name == k).count() > 1)
    {
        return Err(format!("{k}: given more than once"));
    }
    let nonempty = |k| q.get(k).filter(|v| !v.is_empty());
    Ok(DeadLetterFilter {
        channel: nonempty("channel")
            .map(|v| Channel::parse(v).map_err(|e| e.to_string()))
            .transpose()?,
        class: nonempty("class")
            .filter(|v| *v != UNCONFIRMED_DEADLINE_REASON)
            .map(|v| AttemptClass::parse(v).map_err(|e| format!("{e}, or unconfirmed")))
            .transpose()?,
        unconfirmed: q.get("class") == Some(UNCONFIRMED_DEADLINE_REASON),
        before: nonempty("before")
            .map(|v| parse_cursor(v).ok_or("before: not a page cursor".to_owned()))
            .transpose()?,
    })
}

/// The dead-letters page with `filter`'s channel and class, from `cursor` (`None`: the first page,
/// the newest).
fn list_href(filter: &DeadLetterFilter, cursor: Option<(DateTime<Utc>, i64)>) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    if let Some(c) = filter.channel {
        q.append_pair("channel", c.as_str());
    }
    if let Some(c) = filter.class {
        q.append_pair("class", c.as_str());
    }
    if filter.unconfirmed {
        q.append_pair("class", UNCONFIRMED_DEADLINE_REASON);
    }
    if let Some((t, id)) = cursor {
        q.append_pair("before", &format!("{}.{id}", t.timestamp_micros()));
    }
    match q.finish() {
        q if q.is_empty() => "/admin/dead-letters".to_owned(),
        q => format!("/admin/dead-letters?{q}"),
    }
}

async fn dead_letters(
    req: HttpRequest,
    state: web::Data<AppState>,
    admin: web::Data<AdminState>,
) -> HttpResponse {
    let (s, csrf) = tri!(for_page(&req, &state, &admin).await);
    let viewer = Viewer::new(&s.principal, &csrf);
    let filter = match parse_filter(&query(&req)) {
        Ok(f) => f,
        Err(why) => {
            return page(
                StatusCode::BAD_REQUEST,
                pages::error(Some(&viewer), "Bad filter", &why),
            );
        }
    };
    let (db, f) = (state.db.clone(), filter.clone());
    let (rows, next) =
        tri!(blocking(Some(&viewer), move || data::dead_letters(&db, &f, PAGE)).await);
    let pages = pages::Pages {
        // Back to the newest from a later page (there was only "Older →").
        first: filter.before.map(|_| list_href(&filter, None)),
        next: next.map(|c| list_href(&filter, Some(c))),
    };
    page(
        StatusCode::OK,
        pages::dead_letters(&viewer, &filter, &rows, pages),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_and_cursors_round_trip() {
        let f = parse_filter(&Form::parse(b"channel=webhook&class=permanent&before=")).unwrap();
        assert_eq!(f.channel, Some(Channel::Webhook));
        assert_eq!(f.class, Some(AttemptClass::Permanent));
        assert_eq!(f.before, None);
        let t = DateTime::from_timestamp_micros(1_764_583_200_123_456).unwrap();
        assert_eq!(
            list_href(&f, None),
            "/admin/dead-letters?channel=webhook&class=permanent"
        );
        assert_eq!(
            list_href(&DeadLetterFilter::default(), None),
            "/admin/dead-letters"
        );
        let href = list_href(&f, Some((t, 42)));
        assert_eq!(
            href,
            "/admin/dead-letters?channel=webhook&class=permanent&before=1764583200123456.42"
        );
        let again = parse_filter(&Form::parse(href.split_once('?').unwrap().1.as_bytes())).unwrap();
        assert_eq!(again.before, Some((t, 42)));
        for (q, k) in [
            (&b"class=permanent&class=exhausted"[..], "class"),
            (b"channel=email&channel=email", "channel"),
            (b"before=1.1&class=permanent&before=2.2", "before"),
        ] {
            assert_eq!(
                parse_filter(&Form::parse(q)),
                Err(format!("{k}: given more than once"))
            );
        }
        assert!(
            parse_filter(&Form::parse(b"class=bogus"))
                .unwrap_err()
                .contains("class")
        );
        assert!(parse_filter(&Form::parse(b"before=x")).is_err());
        // The unconfirmed deadline's dead letters, as `GET /v1/dead-letters` names them.
        let f = parse_filter(&Form::parse(b"class=unconfirmed")).unwrap();
        assert_eq!((f.class, f.unconfirmed), (None, true));
        assert_eq!(
            list_href(&f, Some((t, 7))),
            "/admin/dead-letters?class=unconfirmed&before=1764583200123456.7"
        );
        assert_eq!(
            parse_filter(&Form::parse(b"channel=&class=")).unwrap(),
            DeadLetterFilter::default()
        );
    }

    #[test]
    fn the_csp_is_strict() {
        for d in [
            "default-src 'none'",
            "style-src 'self'",
            "form-action 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
        ] {
            assert!(CSP.contains(d), "{d}");
        }
        assert!(!CSP.contains("unsafe"));
        assert!(
            !CSP.contains("script-src"),
            "no script at all (default-src 'none')"
        );
    }
}
