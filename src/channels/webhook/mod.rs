//! The webhook channel: signed POSTs per the Standard Webhooks spec over one pooled reqwest client.
//!
//! Every request carries `webhook-id: <event_id>`, `webhook-timestamp`, `webhook-signature`
//! (one `v1,` entry per key) and `Idempotency-Key: <event_id>`. The body sent is exactly the
//! serialized `payload.body`. Redirects are not followed (a 3xx is classified `permanent`).
//! Every destination passes the SSRF guard ([`ssrf`]) first: an IP-literal URL before the
//! request, a host name in the client's resolver, which connects only to the vetted addresses.
//! A refused destination is `permanent` (`error_kind = refused_destination`), no request made.

mod endpoint;
pub mod ssrf;

pub use self::endpoint::{
    AutoDisable, Endpoint, EndpointAuth, EndpointConfig, EndpointRetryConfig,
};
pub use self::ssrf::AllowList;
use crate::crypto::signing;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, InvalidHeaderName, InvalidHeaderValue};
use serde_json::Value;
use url::Url;

use self::signing::{SigningKey, signature_header};
use super::{Outgoing, SendReport, redact_excerpt, without_a_cut_word};
use crate::clock::Clock;
use crate::domain::classify::{classify_http_status, honours_retry_after, parse_retry_after};
use crate::domain::event_type::EventType;
use crate::domain::{AttemptClass, InvalidField};
use crate::storage::models::text_without_nul;

/// Headers Herald sets itself, or that would change how its request is read; a message or
/// endpoint may not set them. Svix's names too: its verifier prefers `svix-*` to `webhook-*`,
/// so one set by a message made every delivery fail at a Svix-based receiver; and a
/// `Content-Encoding` would claim a body Herald never encodes.
const RESERVED_HEADERS: &[&str] = &[
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
    "idempotency-key",
    "content-type",
    "content-encoding",
    "content-length",
    "host",
    "transfer-encoding",
    "connection",
];

/// Headers that speak to the connection or to a proxy, not to the receiver: refused in what is
/// written now (a message at enqueue, an endpoint at start); a row stored before is sent as it was.
const CONNECTION_HEADERS: &[&str] = &[
    "te",
    "trailer",
    "upgrade",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "expect",
];

/// The most custom headers a request may carry (a message's and its endpoint's together), and
/// the most bytes their lines may take (`Name: value` and its CRLF). Node.js refuses a request
/// whose header block passes 16 KiB and nginx a header line past 8 KiB; Herald's own headers
/// (signatures included) take about 1 KiB.
pub const MAX_CUSTOM_HEADERS: usize = 50;
pub const MAX_CUSTOM_HEADER_BYTES: usize = 8 * 1024;

/// The name a receiver's stack may read a header as: case ignored, and `_` as `-` (CGI, WSGI,
/// PHP and Rack turn `X_Team` and `X-Team` alike into `HTTP_X_TEAM`, joining their values).
pub fn header_key(name: &str) -> String {
    name.to_ascii_lowercase().replace('_', "-")
}

/// What the custom headers written now — a message's at enqueue, an endpoint's at start — must be
/// beyond what a stored row's must ([`check_custom_header`], by which rows written before are
/// still sent): no name that a receiver reads as one of Herald's own or a connection header
/// (`Webhook_Id`), none given twice as a receiver reads names, printable ASCII values (other
/// bytes reach Python's and Node's stacks as Latin-1), and within [`check_header_budget`]. A
/// refusal names `FIELD.NAME` (`payload.headers.X_Team`), or `field` for the budget.
pub fn check_written_headers<'a>(
    field: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
) -> Result<(), InvalidField> {
    let named = |name: &str, m: String| InvalidField::new(format!("{field}.{name}"), m);
    let mut seen = std::collections::HashMap::new();
    for (name, value) in headers.clone() {
        let key = header_key(name);
        if RESERVED_HEADERS.contains(&key.as_str()) {
            return Err(named(
                name,
                format!("is read by receivers as {key:?}, which Herald sets"),
            ));
        }
        if CONNECTION_HEADERS.contains(&key.as_str()) {
            return Err(named(
                name,
                "speaks to the connection or a proxy, not to the receiver".to_owned(),
            ));
        }
        if let Some(first) = seen.insert(key, name) {
            return Err(named(
                name,
                format!(
                    "is the same header as {first:?} to a receiver (names ignore case, and CGI, \
                     WSGI, PHP and Rack read _ as -)"
                ),
            ));
        }
        if !value
            .bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
        {
            return Err(named(
                name,
                "must be printable ASCII (a receiver reads other bytes as Latin-1)".to_owned(),
            ));
        }
    }
    check_header_budget(field, headers, None)
}

/// At most [`MAX_CUSTOM_HEADERS`] headers whose lines take at most [`MAX_CUSTOM_HEADER_BYTES`]:
/// a request's custom headers — a message's, and with `endpoint` named, that endpoint's too.
pub fn check_header_budget<'a>(
    field: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    endpoint: Option<&str>,
) -> Result<(), InvalidField> {
    let (count, bytes) = headers.into_iter().fold((0, 0), |(n, b), (name, value)| {
        (n + 1, b + name.len() + value.len() + 4)
    });
    let with = endpoint
        .map(|e| format!(", endpoint {e:?}'s included"))
        .unwrap_or_default();
    if count > MAX_CUSTOM_HEADERS {
        return Err(InvalidField::new(
            field,
            format!("{count} headers; at most {MAX_CUSTOM_HEADERS}{with}"),
        ));
    }
    if bytes > MAX_CUSTOM_HEADER_BYTES {
        return Err(InvalidField::new(
            field,
            format!(
                "their lines take {bytes} bytes; at most {MAX_CUSTOM_HEADER_BYTES}{with} \
                 (receivers refuse larger header blocks)"
            ),
        ));
    }
    Ok(())
}

/// At most this much of a response body is read (for the excerpt and the provider message id).
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// A webhook URL or header Herald refuses. The text is what a config or API error shows after the
/// field name.
#[derive(Debug, thiserror::Error)]
pub enum WebhookConfigError {
    #[error("is not a valid URL ({0})")]
    InvalidUrl(#[source] url::ParseError),
    #[error("must be an http:// or https:// URL")]
    UnsupportedScheme,
    #[error("must name a host")]
    NoHost,
    #[error(
        "must not begin or end with a space or a control character, nor hold a tab or a line break"
    )]
    Untrimmed,
    #[error("must not name port 0, which cannot be connected to")]
    PortZero,
    #[error("must not hold a backslash, which the URL parser reads as a slash")]
    Backslash,
    #[error(
        "must name its host and port as the URL parser reads them: no empty port or user part, \
         and no host it reads as another (full-width digits, an ideographic full stop, a soft \
         hyphen)"
    )]
    HostNotAsWritten,
    #[error("must not carry credentials; configure an endpoint with auth instead")]
    Credentials,
    #[error("header {0:?} is set by Herald")]
    ReservedHeader(String),
    #[error("{name:?} is not a valid header name")]
    HeaderName {
        name: String,
        #[source]
        source: InvalidHeaderName,
    },
    #[error("the value of {name:?} is not a valid header value")]
    HeaderValue {
        name: String,
        #[source]
        source: InvalidHeaderValue,
    },
    /// A header of the request being built (message, endpoint or Herald's own) is not sendable.
    #[error("invalid header name {name:?}")]
    RequestHeaderName {
        name: String,
        #[source]
        source: InvalidHeaderName,
    },
    /// The value is never quoted: it may be a credential.
    #[error("invalid header value")]
    RequestHeaderValue(#[source] InvalidHeaderValue),
}

/// Where a webhook goes.
#[derive(Debug, Clone, PartialEq)]
pub enum WebhookTarget {
    Url(Url),
    /// `endpoint:NAME`: a configured endpoint with its own URL, secrets and headers.
    Endpoint(String),
    /// `type:EVENT.TYPE`: fan-out to every endpoint subscribed to the type, one row each, at
    /// enqueue. Never sent as such: a stored row with it is refused at send time.
    Type(EventType),
}

impl WebhookTarget {
    /// A stored destination, as the sender reads it: a URL as the URL parser takes it
    /// ([`parse_webhook_url`]), which is how rows written before [`WebhookTarget::parse_written`]
    /// (or by an application's SQL) have always been sent.
    pub fn parse(destination: &str) -> Result<Self, InvalidField> {
        Self::parse_with(destination, parse_webhook_url)
    }

    /// A destination given to Herald (the API, `outbox::enqueue`): a URL only as written
    /// ([`parse_written_webhook_url`]).
    pub fn parse_written(destination: &str) -> Result<Self, InvalidField> {
        Self::parse_with(destination, parse_written_webhook_url)
    }

    fn parse_with(
        destination: &str,
        url: fn(&str) -> Result<Url, WebhookConfigError>,
    ) -> Result<Self, InvalidField> {
        if let Some(name) = crate::domain::endpoint_name(destination) {
            return if crate::domain::is_endpoint_name(name) {
                Ok(Self::Endpoint(name.to_owned()))
            } else {
                Err(InvalidField::new(
                    "destination",
                    "endpoint names are letters, digits, - and _ (at most 64)",
                ))
            };
        }
        if let Some(t) = destination.strip_prefix("type:") {
            return EventType::parse(t)
                .map(Self::Type)
                .map_err(|e| InvalidField::new("destination", e.to_string()));
        }
        url(destination).map(Self::Url).map_err(|e| match e {
            // A message's destination may also name an endpoint or an event type (an endpoint's
            // own URL may not: its error says only the first).
            WebhookConfigError::UnsupportedScheme => InvalidField::new(
                "destination",
                "must be an http:// or https:// URL, endpoint:NAME or type:EVENT.TYPE",
            ),
            e => InvalidField::new("destination", e.to_string()),
        })
    }
}

/// An absolute `http(s)://` URL with a host and no credentials, as the URL parser takes it.
pub fn parse_webhook_url(raw: &str) -> Result<Url, WebhookConfigError> {
    let url = Url::parse(raw).map_err(WebhookConfigError::InvalidUrl)?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(WebhookConfigError::UnsupportedScheme);
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(WebhookConfigError::NoHost);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(WebhookConfigError::Credentials);
    }
    Ok(url)
}

/// [`parse_webhook_url`], and written as it is meant: the URL parser forgives what a destination
/// should not have — a space or control character at either end, a tab or line break anywhere
/// (`" http://a/"` was stored with its space and sent without), a host not right after `//`
/// (`http:///x` and `http:x` go to host `x`) — so those are refused, as is port 0 (every attempt
/// would fail to connect, for the whole retry budget). For what a user gives Herald: a message's
/// destination and an endpoint's `url`; the sender reads stored rows as they always were.
pub fn parse_written_webhook_url(raw: &str) -> Result<Url, WebhookConfigError> {
    let url = parse_webhook_url(raw)?;
    if raw.trim_matches(|c: char| c <= ' ') != raw || raw.contains(['\t', '\n', '\r']) {
        return Err(WebhookConfigError::Untrimmed);
    }
    // `http://a.example\\@b.example/` goes to a.example, where other tools read b.example; a
    // backslash in the path is sent as a slash.
    if raw.split(['?', '#']).next().unwrap_or(raw).contains('\\') {
        return Err(WebhookConfigError::Backslash);
    }
    // What follows `scheme:` is `//` and then the host: not a third slash.
    let after = raw.get(url.scheme().len() + 1..).unwrap_or("");
    let Some(authority) = after
        .strip_prefix("//")
        .filter(|host| !host.starts_with('/'))
    else {
        return Err(WebhookConfigError::NoHost);
    };
    if url.port() == Some(0) {
        return Err(WebhookConfigError::PortZero);
    }
    // The host and port as written are the ones the parser read (in any ASCII case): `host:`
    // connected to the scheme's port, `@host` was taken, and `１２７.0.0.1` went to 127.0.0.1.
    let authority = authority.split(['/', '?', '#']).next().unwrap_or_default();
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !authority.ends_with(']') => (h, Some(p)),
        _ => (authority, None),
    };
    let read = url.host_str().unwrap_or_default();
    // Another notation of the same address (`2130706433`, `[::ffff:10.0.0.1]`), which the SSRF
    // guard then judges (not percent-encoded: `%EF%BC%91…` is full-width digits); an
    // internationalized name written as the parser's punycode reads back, in any case (its
    // labels, not only one of them: `exa\u{ad}mple.bücher.example` is no name as written).
    let address =
        host.is_ascii() && !host.contains('%') && !matches!(url.host(), Some(url::Host::Domain(_)));
    // Label by label: an ASCII one as read (any case), another only as an internationalized
    // label reads back (`\u{212a}ube`, a Kelvin sign, is read as the ASCII `kube`).
    let idn = !host.is_ascii() && {
        let (written, labels): (Vec<&str>, Vec<&str>) =
            (host.split('.').collect(), read.split('.').collect());
        written.len() == labels.len()
            && written.iter().zip(&labels).all(|(w, r)| {
                if w.is_ascii() {
                    w.eq_ignore_ascii_case(r)
                } else {
                    r.starts_with("xn--") && idna::domain_to_unicode(r).0 == w.to_lowercase()
                }
            })
    };
    let host_as_read = host.eq_ignore_ascii_case(read) || address || idn;
    let port_as_read = port.is_none_or(|p| {
        !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse().ok() == url.port_or_known_default()
    });
    // A user part, even an empty one, is no part of a destination (a filled one is refused
    // above as credentials).
    if !host_as_read || !port_as_read || authority.contains('@') {
        return Err(WebhookConfigError::HostNotAsWritten);
    }
    Ok(url)
}

/// A header a message or endpoint may add.
pub fn check_custom_header(name: &str, value: &str) -> Result<(), WebhookConfigError> {
    let lower = name.to_ascii_lowercase();
    if RESERVED_HEADERS.contains(&lower.as_str()) {
        return Err(WebhookConfigError::ReservedHeader(name.to_owned()));
    }
    HeaderName::from_bytes(name.as_bytes()).map_err(|source| WebhookConfigError::HeaderName {
        name: name.to_owned(),
        source,
    })?;
    HeaderValue::from_str(value).map_err(|source| WebhookConfigError::HeaderValue {
        name: name.to_owned(),
        source,
    })?;
    Ok(())
}

/// `{"body": <any JSON>, "headers"?: {"Name": "value"}}`, borrowed from the stored payload.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookPayload<'a> {
    pub body: &'a Value,
    pub headers: Vec<(String, String)>,
}

impl<'a> WebhookPayload<'a> {
    pub fn parse(payload: &'a Value) -> Result<Self, InvalidField> {
        let obj = payload
            .as_object()
            .ok_or_else(|| InvalidField::new("payload", "must be an object with a body"))?;
        if let Some(k) = obj
            .keys()
            .find(|k| !matches!(k.as_str(), "body" | "headers"))
        {
            return Err(InvalidField::new(
                format!("payload.{k}"),
                "is not a known field (expected body, headers)",
            ));
        }
        let body = obj
            .get("body")
            .ok_or_else(|| InvalidField::new("payload.body", "is required (any JSON)"))?;
        let headers = match obj.get("headers") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(h)) => h
                .iter()
                .map(|(k, v)| {
                    let v = v.as_str().ok_or_else(|| {
                        InvalidField::new(format!("payload.headers.{k}"), "must be a string")
                    })?;
                    check_custom_header(k, v).map_err(|e| {
                        InvalidField::new(format!("payload.headers.{k}"), e.to_string())
                    })?;
                    Ok((k.clone(), v.to_owned()))
                })
                .collect::<Result<_, InvalidField>>()?,
            Some(_) => {
                return Err(InvalidField::new(
                    "payload.headers",
                    "must be an object of strings",
                ));
            }
        };
        Ok(Self { body, headers })
    }

    /// Refused at enqueue (not at send time, where a row written before is sent as it was):
    /// what [`check_written_headers`] refuses. A name given twice in different case, of which
    /// only one would reach the receiver, also made the fingerprint depend on the names' order.
    pub fn check_written(&self) -> Result<(), InvalidField> {
        check_written_headers(
            "payload.headers",
            self.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )
    }

    /// The exact request body: `body` serialized (compact, keys sorted).
    pub fn body_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self.body).unwrap_or_default()
    }
}

/// Sends webhooks. Cheap to clone; one connection pool.
#[derive(Clone)]
pub struct WebhookChannel {
    client: reqwest::Client,
    allow: Arc<AllowList>,
    endpoints: Arc<BTreeMap<String, Endpoint>>,
    /// Destinations as parsed, by their text (see [`Resolved`]).
    resolved: Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<Resolved>>>>,
    default_keys: Arc<Vec<SigningKey>>,
    clock: Arc<dyn Clock>,
    /// The `endpoint:NAME`s this process was asked to send to without having them, each warned
    /// about once.
    unknown_warned: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

/// Where a webhook message goes, for the per-destination pauses and limits.
#[derive(Debug, Clone)]
pub struct Binding<'a> {
    /// The URL's scheme, host and port (`https://api.example.com:443`).
    pub key: String,
    /// The URL's host, lower case.
    pub host: String,
    /// The named endpoint, for `endpoint:NAME`.
    pub endpoint: Option<&'a Endpoint>,
}

impl WebhookChannel {
    /// The configured named endpoints.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.endpoints.values()
    }

    pub fn endpoint(&self, name: &str) -> Option<&Endpoint> {
        self.endpoints.get(name)
    }

    /// The destination a message is bound to: its URL's scheme, host and port (a named
    /// endpoint's URL for `endpoint:NAME`) and the endpoint; `None` when it has none.
    pub fn binding(&self, destination: &str) -> Option<Binding<'_>> {
        let (bound, endpoint) = match &*self.resolve(destination) {
            Resolved::Url { bound, .. } => (bound.clone()?, None),
            Resolved::Endpoint { name, bound } => (bound.clone()?, Some(self.endpoints.get(name)?)),
            Resolved::Type | Resolved::Invalid(_) => return None,
        };
        Some(Binding {
            key: bound.key,
            host: bound.host,
            endpoint,
        })
    }
}

/// How many parsed destinations [`WebhookChannel::resolve`] keeps.
const RESOLVED_MAX: usize = 4096;
/// The longest destination [`WebhookChannel::resolve`] keeps.
const RESOLVED_MAX_LEN: usize = 2048;

/// A destination parsed once ([`WebhookChannel::resolve`]): what a send and the limits need.
#[derive(Debug)]
enum Resolved {
    Url {
        url: Url,
        /// `None`: no host or port to bind the URL to (a send refuses it, as before).
        bound: Option<Bound>,
    },
    /// A named endpoint, and what its URL is bound to (`None`: no such endpoint).
    Endpoint {
        name: String,
        bound: Option<Bound>,
    },
    Type,
    /// Why it is not a destination (a send's refusal says so).
    Invalid(String),
}

impl Resolved {
    fn parse(destination: &str, endpoints: &BTreeMap<String, Endpoint>) -> Self {
        match WebhookTarget::parse(destination) {
            Ok(WebhookTarget::Url(url)) => Resolved::Url {
                bound: Bound::of(&url),
                url,
            },
            Ok(WebhookTarget::Endpoint(name)) => Resolved::Endpoint {
                bound: endpoints.get(&name).and_then(|e| Bound::of(&e.url)),
                name,
            },
            Ok(WebhookTarget::Type(_)) => Resolved::Type,
            Err(e) => Resolved::Invalid(e.to_string()),
        }
    }
}

/// The scheme, host and port a URL is bound to, and its host (see [`Binding`]).
#[derive(Debug, Clone)]
struct Bound {
    key: String,
    host: String,
}

impl Bound {
    fn of(url: &Url) -> Option<Self> {
        // An IPv4 address written as IPv4-mapped IPv6 (`[::ffff:127.0.0.1]`) is that address,
        // reached at the same socket: one destination for its limits and pauses (an operator's
        // walk-through sent 8 requests in 10 ms past a 2/s limit, and through a 429's pause, so).
        // The SSRF guard judges it by its IPv4 address too. The URL parser writes every other
        // spelling of an address (`2130706433`, `0x7f.1`) as the address already.
        let host = match url.host()? {
            url::Host::Ipv6(a) => a
                .to_ipv4_mapped()
                .map_or_else(|| format!("[{a}]"), |v4| v4.to_string()),
            _ => url.host_str()?.to_ascii_lowercase(),
        };
        Some(Bound {
            key: format!(
                "{}://{}:{}",
                url.scheme(),
                host,
                url.port_or_known_default()?
            ),
            host,
        })
    }
}

/// Timeouts of the webhook client.
#[derive(Debug, Clone, Copy)]
pub struct WebhookTimeouts {
    pub connect: Duration,
    pub total: Duration,
}

impl WebhookChannel {
    /// `allow`: the networks exempt from the SSRF guard.
    pub fn new(
        timeouts: WebhookTimeouts,
        endpoints: BTreeMap<String, Endpoint>,
        default_keys: Vec<SigningKey>,
        allow: AllowList,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, reqwest::Error> {
        super::install_crypto_provider();
        let allow = Arc::new(allow);
        let client = reqwest::Client::builder()
            .connect_timeout(timeouts.connect)
            .timeout(timeouts.total)
            .redirect(reqwest::redirect::Policy::none())
            // Names resolve once, through the guard; the connection goes to a vetted address.
            .dns_resolver(Arc::new(ssrf::GuardedResolver::new(allow.clone())))
            // A proxy would resolve and connect on Herald's behalf, past the guard.
            .no_proxy()
            .pool_idle_timeout(Duration::from_secs(60))
            .user_agent(concat!("Herald/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            client,
            allow,
            endpoints: Arc::new(endpoints),
            resolved: Arc::default(),
            unknown_warned: Arc::default(),
            default_keys: Arc::new(default_keys),
            clock,
        })
    }

    /// `destination` parsed, from the cache when it was parsed before: a sender sends to few
    /// destinations many times, and parsing one (a URL, its host through IDNA) for each send —
    /// three times, for the logs, the limits and the request — was 6 % of Herald's CPU in
    /// `herald-bench dispatch_pg`. The cache holds at most [`RESOLVED_MAX`] destinations of at
    /// most [`RESOLVED_MAX_LEN`] bytes and starts again empty when full.
    fn resolve(&self, destination: &str) -> Arc<Resolved> {
        let mut cache = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = cache.get(destination) {
            return r.clone();
        }
        let r = Arc::new(Resolved::parse(destination, &self.endpoints));
        // Never a destination that is refused anyway, nor a very long one (plain SQL can store
        // any text): the cache holds what is sent, in a bounded amount of memory.
        if matches!(*r, Resolved::Invalid(_)) || destination.len() > RESOLVED_MAX_LEN {
            return r;
        }
        if cache.len() >= RESOLVED_MAX {
            cache.clear();
        }
        cache.insert(destination.to_owned(), r.clone());
        r
    }

    /// Sends one claimed message and classifies the answer. Never fails: every way it can go is
    /// a [`SendReport`].
    pub async fn send(&self, row: &Outgoing<'_>) -> SendReport {
        let now = self.clock.now();
        // The answer's time is `now` plus the time since `now` was read, not since the request
        // left: the work between (resolving, signing) and any wait for the CPU counted, a 429's
        // pause ran from a finish up to several ms earlier than the answer, and the next
        // message went that much before its Retry-After had passed (CI caught one 7 ms early).
        let since_now = std::time::Instant::now();
        // An event id beyond ASCII (written by SQL; the API refuses one) cannot travel in
        // `webhook-id` as itself: Python's and Node's HTTP stacks read header bytes as Latin-1,
        // so the official Standard Webhooks and Svix verifiers refused every such request's
        // signature; and any ASCII spelling of it could also be another event id.
        // Nor one that no header carries as it is (see `event_id_fits_a_header`).
        if !row.event_id.is_ascii() || !super::event_id_fits_a_header(row.event_id) {
            return SendReport::refused(
                AttemptClass::Permanent,
                INVALID_EVENT_ID,
                now,
                "its event id is not printable ASCII without spaces at its ends, which a webhook-id header cannot carry"
                    .to_owned(),
            );
        }
        let payload = match WebhookPayload::parse(row.payload) {
            Ok(p) => p,
            Err(e) => {
                return SendReport::refused(
                    AttemptClass::Permanent,
                    "invalid_payload",
                    now,
                    e.to_string(),
                );
            }
        };
        let (url, keys, endpoint) = match &*self.resolve(row.destination) {
            Resolved::Url { url, .. } => (url.clone(), self.default_keys.as_slice(), None),
            Resolved::Endpoint { name, .. } => match self.endpoints.get(name) {
                Some(e) if e.keys.is_empty() => {
                    (e.url.clone(), self.default_keys.as_slice(), Some(e))
                }
                Some(e) => (e.url.clone(), e.keys.as_slice(), Some(e)),
                // Nothing left: retried like a refused connection, since a process sharing the
                // database may have it (a change of [endpoints] rolling through a fleet: the
                // new processes subscribe it, the old ones claim its fan-out children), and
                // dead-lettered once the retry budget is spent (a walk-through saw 27 of 40
                // dead-lettered at once by the old processes).
                None => {
                    // Once per endpoint and process, at WARN: a typo in an application's SQL
                    // now spends the retry budget before anyone else would hear of it.
                    let first = {
                        let mut warned = self
                            .unknown_warned
                            .lock()
                            .unwrap_or_else(|p| p.into_inner());
                        // Bounded: names come from rows anyone with INSERT may write.
                        warned.len() < 1024 && warned.insert(name.clone())
                    };
                    if first {
                        tracing::warn!(
                            endpoint = %name,
                            "a message names an endpoint this process has not configured: retried \
                             for a process that has it, dead-lettered when its retry budget is \
                             spent; check [endpoints] and the message's destination"
                        );
                    }
                    return SendReport::refused(
                        AttemptClass::NotSent,
                        "unknown_endpoint",
                        now,
                        format!(
                            "no endpoint named {name} is configured in this Herald process; \
                             retried, for one that has it"
                        ),
                    );
                }
            },
            Resolved::Type => {
                // Fan-out rows are expanded at enqueue (by Herald or the insert trigger); one
                // that reached the sender was never expanded.
                return SendReport::refused(
                    AttemptClass::Permanent,
                    "unexpanded_fanout",
                    now,
                    "a type: destination is expanded at enqueue, never sent".to_owned(),
                );
            }
            Resolved::Invalid(why) => {
                return SendReport::refused(
                    AttemptClass::Permanent,
                    "invalid_destination",
                    now,
                    why.clone(),
                );
            }
        };
        if let Err(r) = ssrf::check_url_literal(&url, &self.allow) {
            return refused_destination(now, &r);
        }
        let body = match row.body {
            Some(b) => b.clone(),
            None => bytes::Bytes::from(payload.body_bytes()),
        };
        let headers = match build_headers(
            row.event_id,
            now.timestamp(),
            &body,
            keys,
            &payload,
            endpoint,
        ) {
            Ok(h) => h,
            Err(e) => {
                return SendReport::refused(
                    AttemptClass::Permanent,
                    INVALID_HEADER,
                    now,
                    e.to_string(),
                );
            }
        };
        let result = self
            .client
            .post(url)
            .headers(headers)
            .body(body)
            .send()
            .await;
        let mut report = match result {
            Ok(resp) => self.read_response(resp, endpoint).await,
            Err(e) => error_report(&e),
        };
        report.started_at = now;
        report.finished_at =
            now + chrono::Duration::from_std(since_now.elapsed()).unwrap_or_default();
        report
    }

    async fn read_response(
        &self,
        mut resp: reqwest::Response,
        endpoint: Option<&Endpoint>,
    ) -> SendReport {
        let status = resp.status().as_u16();
        let class = classify_http_status(status);
        let header = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap_or("\u{fffd}").to_owned());
        let retry_after = header
            .as_deref()
            .filter(|_| honours_retry_after(status))
            .and_then(|v| parse_retry_after(v, self.clock.now()));
        let retry_after_raw = header.map(|v| shown_retry_after(&v, self.clock.now()));
        let mut body = Vec::new();
        let mut lost = false;
        while body.len() < MAX_RESPONSE_BYTES {
            match resp.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break,
                // The status decided the class; a body cut short only loses the excerpt.
                Err(_) => {
                    lost = true;
                    break;
                }
            }
        }
        let cut = lost || body.len() >= MAX_RESPONSE_BYTES;
        body.truncate(MAX_RESPONSE_BYTES);
        let provider_message_id = endpoint
            .and_then(|e| e.provider_message_id_pointer.as_deref())
            .filter(|_| class == AttemptClass::Accepted)
            .and_then(|pointer| provider_id(&body, pointer));
        let excerpt = (!body.is_empty()).then(|| {
            let whole = String::from_utf8_lossy(&body);
            let text = if cut {
                without_a_cut_word(&whole)
            } else {
                &whole
            };
            match endpoint {
                Some(e) => redact_excerpt(&e.hidden.hide(text)),
                None => redact_excerpt(text),
            }
        });
        SendReport {
            class,
            started_at: chrono::DateTime::UNIX_EPOCH,
            finished_at: chrono::DateTime::UNIX_EPOCH,
            status: Some(status),
            error_kind: None,
            retry_after_raw,
            retry_after,
            provider_message_id,
            excerpt,
            reused_connection: false,
        }
    }
}

/// What of a `Retry-After` header is kept and shown (the attempt's `retry_after`): the value as
/// sent when it is one (seconds, or an HTTP-date), else only that it was not — the receiver's
/// own text (3,000 characters, an address in it; a walk-through sent both) is no attempt's to
/// keep, and support never shows a receiver's words.
fn shown_retry_after(value: &str, now: chrono::DateTime<chrono::Utc>) -> String {
    const LONGEST: usize = 64;
    let value = value.trim();
    if value.len() <= LONGEST && parse_retry_after(value, now).is_some() {
        value.to_owned()
    } else {
        format!("not seconds or an HTTP-date ({} bytes)", value.len())
    }
}

fn build_headers(
    event_id: &str,
    timestamp: i64,
    body: &[u8],
    keys: &[SigningKey],
    payload: &WebhookPayload,
    endpoint: Option<&Endpoint>,
) -> Result<HeaderMap, WebhookConfigError> {
    let mut h = HeaderMap::new();
    let value = |v: &str| HeaderValue::from_str(v).map_err(WebhookConfigError::RequestHeaderValue);
    let mut extra: Vec<&(String, String)> = payload.headers.iter().collect();
    if let Some(e) = endpoint {
        extra.extend(e.headers.iter());
    }
    for (name, v) in extra {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|source| {
            WebhookConfigError::RequestHeaderName {
                name: name.clone(),
                source,
            }
        })?;
        h.insert(name, value(v)?);
    }
    if let Some(auth) = endpoint.and_then(|e| e.auth.as_ref()) {
        let mut v = match auth {
            EndpointAuth::Bearer(token) => value(&format!("Bearer {}", token.expose()))?,
            EndpointAuth::Basic { username, password } => value(&format!(
                "Basic {}",
                endpoint::basic_credentials(username, password.expose())
            ))?,
        };
        v.set_sensitive(true);
        h.insert(reqwest::header::AUTHORIZATION, v);
    }
    h.insert(
        reqwest::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert("webhook-id", value(event_id)?);
    h.insert("webhook-timestamp", value(&timestamp.to_string())?);
    h.insert(
        "webhook-signature",
        value(&signature_header(keys, event_id, timestamp, body))?,
    );
    h.insert("idempotency-key", value(event_id)?);
    Ok(h)
}

/// The receiver's id for what it accepted, at a JSON pointer into its answer. A NUL in it is
/// replaced as in receipts ([`text_without_nul`]): PostgreSQL refuses NUL in text, and one such
/// id would fail the write of its whole batch of outcomes.
fn provider_id(body: &[u8], pointer: &str) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    match v.pointer(pointer)? {
        Value::String(s) if !s.is_empty() && s.len() <= 255 => Some(text_without_nul(s)),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A destination the SSRF guard refused: `permanent`, no request made. The excerpt is Herald's
/// own words (the address and the range), not masked like a receiver's answer.
fn refused_destination(
    at: chrono::DateTime<chrono::Utc>,
    why: &dyn std::fmt::Display,
) -> SendReport {
    let mut report = SendReport::refused(AttemptClass::Permanent, REFUSED_DESTINATION, at, "");
    report.excerpt = Some(
        format!("refused by the SSRF guard: {why}")
            .chars()
            .take(300)
            .collect(),
    );
    report
}

/// `error_kind` of a destination the SSRF guard refused.
pub const REFUSED_DESTINATION: &str = "refused_destination";

/// `error_kind` of a webhook whose event id is not ASCII: no request is made.
pub const INVALID_EVENT_ID: &str = "invalid_event_id";
/// A header Herald cannot build from what is stored or configured; no request is made.
pub const INVALID_HEADER: &str = "invalid_header";

/// A request that got no HTTP answer: did it leave Herald?
fn error_report(e: &reqwest::Error) -> SendReport {
    if let Some(r) = ssrf::refusal_in(e) {
        return refused_destination(chrono::DateTime::UNIX_EPOCH, r);
    }
    let (class, kind) = if e.is_connect() {
        // Refused, DNS, TLS handshake, connect timeout: the request never left.
        (AttemptClass::NotSent, "connect")
    } else if e.is_timeout() {
        (AttemptClass::Ambiguous, "timeout")
    } else if e.is_builder() {
        (AttemptClass::Permanent, "invalid_request")
    } else {
        // Connection closed or reset after the request was written: it may have been received.
        (AttemptClass::Ambiguous, "connection_lost")
    };
    SendReport {
        class,
        started_at: chrono::DateTime::UNIX_EPOCH,
        finished_at: chrono::DateTime::UNIX_EPOCH,
        status: None,
        error_kind: Some(kind.to_owned()),
        retry_after_raw: None,
        retry_after: None,
        provider_message_id: None,
        excerpt: None,
        reused_connection: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn targets() {
        assert!(matches!(
            WebhookTarget::parse("https://a.example/h?x=1"),
            Ok(WebhookTarget::Url(_))
        ));
        assert_eq!(
            WebhookTarget::parse("endpoint:billing-1"),
            Ok(WebhookTarget::Endpoint("billing-1".into()))
        );
        assert_eq!(
            WebhookTarget::parse("type:order.placed"),
            Ok(WebhookTarget::Type(
                EventType::parse("order.placed").unwrap()
            ))
        );
        for bad in [
            "endpoint:",
            "endpoint:a b",
            "ftp://a/b",
            "not a url",
            "https://u:p@a.example/",
            "type:",
            "type:order.*",
            "type:order..placed",
        ] {
            assert_eq!(
                WebhookTarget::parse(bad).unwrap_err().field,
                "destination",
                "{bad}"
            );
        }
    }

    /// A destination is parsed once and then taken from the cache; the cache never holds more
    /// than its bound; every kind of destination resolves as `WebhookTarget::parse` says.
    #[test]
    fn destinations_are_parsed_once_and_the_cache_is_bounded() {
        let channel = WebhookChannel::new(
            WebhookTimeouts {
                connect: Duration::from_secs(1),
                total: Duration::from_secs(2),
            },
            BTreeMap::new(),
            Vec::new(),
            AllowList::parse([]).unwrap(),
            Arc::new(crate::clock::SystemClock),
        )
        .unwrap();
        let first = channel.resolve("https://A.example:8443/h");
        assert!(Arc::ptr_eq(
            &first,
            &channel.resolve("https://A.example:8443/h")
        ));
        let binding = channel.binding("https://A.example:8443/h").unwrap();
        assert_eq!(
            (binding.key.as_str(), binding.host.as_str()),
            ("https://a.example:8443", "a.example")
        );
        // Every spelling of one address is one destination; IPv6 stays as the parser writes it.
        for (url, key, host) in [
            (
                "http://[::ffff:127.0.0.1]:9/h",
                "http://127.0.0.1:9",
                "127.0.0.1",
            ),
            (
                "http://[::FFFF:7f00:1]:9/h",
                "http://127.0.0.1:9",
                "127.0.0.1",
            ),
            ("http://2130706433:9/h", "http://127.0.0.1:9", "127.0.0.1"),
            ("http://[::1]:9/h", "http://[::1]:9", "[::1]"),
            (
                "http://[2001:DB8::1]/h",
                "http://[2001:db8::1]:80",
                "[2001:db8::1]",
            ),
        ] {
            let b = channel.binding(url).unwrap();
            assert_eq!((b.key.as_str(), b.host.as_str()), (key, host), "{url}");
        }
        assert!(matches!(
            *channel.resolve("endpoint:billing"),
            Resolved::Endpoint { ref name, bound: None } if name == "billing"
        ));
        // Refused destinations are not kept.
        assert!(!Arc::ptr_eq(
            &channel.resolve("ftp://a/b"),
            &channel.resolve("ftp://a/b")
        ));
        assert!(matches!(
            *channel.resolve("type:order.placed"),
            Resolved::Type
        ));
        assert!(matches!(
            *channel.resolve("ftp://a/b"),
            Resolved::Invalid(_)
        ));
        assert!(
            channel.binding("endpoint:billing").is_none(),
            "no such endpoint"
        );
        for i in 0..RESOLVED_MAX + 10 {
            channel.resolve(&format!("https://h{i}.example/"));
        }
        let held = channel.resolved.lock().unwrap().len();
        assert!(held <= RESOLVED_MAX, "{held}");
        assert!(
            !Arc::ptr_eq(&first, &channel.resolve("https://A.example:8443/h")),
            "started again"
        );
    }

    #[test]
    fn payload_shapes() {
        let stored = json!({"body": {"b": 1, "a": 2}, "headers": {"X-Team": "t"}});
        let p = WebhookPayload::parse(&stored).unwrap();
        assert_eq!(p.body_bytes(), br#"{"a":2,"b":1}"#);
        assert_eq!(p.headers, [("X-Team".to_owned(), "t".to_owned())]);
        let field = |v| WebhookPayload::parse(&v).unwrap_err().field;
        assert_eq!(field(json!([])), "payload");
        assert_eq!(field(json!({"body": 1, "extra": 2})), "payload.extra");
        assert_eq!(field(json!({"headers": {}})), "payload.body");
        for name in [
            "webhook-id",
            "Svix-Signature",
            "svix-id",
            "svix-timestamp",
            "Content-Encoding",
        ] {
            assert_eq!(
                field(json!({"body": 1, "headers": {name: "x"}})),
                format!("payload.headers.{name}")
            );
        }
        assert_eq!(
            field(json!({"body": 1, "headers": {"X": "a\nb"}})),
            "payload.headers.X"
        );
        assert_eq!(
            field(json!({"body": 1, "headers": {"X": 1}})),
            "payload.headers.X"
        );
        // A name twice in different case: parsed (a row written before is sent as it was), but
        // refused at enqueue.
        let twice = json!({"body": 1, "headers": {"X-Tenant": "a", "x-tenant": "b"}});
        let p = WebhookPayload::parse(&twice).unwrap();
        assert_eq!(
            p.check_written().unwrap_err().field,
            "payload.headers.x-tenant"
        );
        assert!(
            WebhookPayload::parse(&stored)
                .unwrap()
                .check_written()
                .is_ok()
        );
        assert_eq!(
            WebhookPayload::parse(&json!({"body": null}))
                .unwrap()
                .body_bytes(),
            b"null"
        );
    }

    /// What a message (or an endpoint) writes now: refused where a receiver would read it as
    /// another header, a connection's, or mangled text, or could not take it all; a stored row
    /// with such a header is still parsed, and sent as it was.
    #[test]
    fn written_headers_are_what_a_receiver_reads_as_written() {
        let refusal = |headers: &[(&str, &str)]| {
            check_written_headers("payload.headers", headers.iter().copied())
                .err()
                .map(|e| format!("{}: {}", e.field, e.message))
        };
        assert_eq!(
            refusal(&[("X-Team", "billing"), ("Authorization", "Bearer t")]),
            None
        );
        for (headers, field) in [
            (&[("Webhook_Id", "e-1")][..], "payload.headers.Webhook_Id"),
            (
                &[("IDEMPOTENCY_KEY", "k")],
                "payload.headers.IDEMPOTENCY_KEY",
            ),
            (&[("TE", "trailers")], "payload.headers.TE"),
            (&[("Upgrade", "h2c")], "payload.headers.Upgrade"),
            (&[("Keep-Alive", "5")], "payload.headers.Keep-Alive"),
            (&[("Trailer", "x")], "payload.headers.Trailer"),
            (
                &[("Proxy_Connection", "x")],
                "payload.headers.Proxy_Connection",
            ),
            (
                &[("Proxy-Authorization", "x")],
                "payload.headers.Proxy-Authorization",
            ),
            (&[("Expect", "100-continue")], "payload.headers.Expect"),
            (
                &[("X-Team", "a"), ("x_team", "b")],
                "payload.headers.x_team",
            ),
            (&[("X-T", "é")], "payload.headers.X-T"),
            (&[("X-T", "a\u{7f}")], "payload.headers.X-T"),
        ] {
            let m = refusal(headers).unwrap_or_default();
            assert!(m.starts_with(&format!("{field}: ")), "{headers:?}: {m}");
        }
        let many: Vec<(String, String)> = (0..=MAX_CUSTOM_HEADERS)
            .map(|i| (format!("X-H{i}"), "v".to_owned()))
            .collect();
        let refused = |h: &[(String, String)]| {
            check_written_headers(
                "payload.headers",
                h.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            )
            .err()
            .map(|e| (e.field, e.message))
        };
        assert_eq!(
            refused(&many),
            Some(("payload.headers".into(), "51 headers; at most 50".into()))
        );
        assert_eq!(refused(&many[..MAX_CUSTOM_HEADERS]), None);
        // Each line as sent: `X-Big: …` and its CRLF.
        let big = |n: usize| vec![("X-Big".to_owned(), "a".repeat(n))];
        assert_eq!(refused(&big(MAX_CUSTOM_HEADER_BYTES - 9)), None);
        assert_eq!(
            refused(&big(MAX_CUSTOM_HEADER_BYTES - 8)).map(|r| r.0),
            Some("payload.headers".into())
        );
        // Stored before these rules: still parsed, so sent as it was.
        let stored = json!({"body": 1, "headers": {"X_Team": "é", "Upgrade": "h2c"}});
        let p = WebhookPayload::parse(&stored).unwrap();
        assert_eq!(p.headers.len(), 2);
        assert!(p.check_written().is_err());
    }

    #[test]
    fn provider_ids_at_a_pointer() {
        assert_eq!(
            provider_id(br#"{"id":"msg_1"}"#, "/id").as_deref(),
            Some("msg_1")
        );
        assert_eq!(
            provider_id(br#"{"data":{"id":7}}"#, "/data/id").as_deref(),
            Some("7")
        );
        assert_eq!(provider_id(br#"{"id":null}"#, "/id"), None);
        assert_eq!(provider_id(b"not json", "/id"), None);
    }

    #[test]
    fn refusals_read_as_they_always_have() {
        let url = |raw| parse_webhook_url(raw).unwrap_err().to_string();
        assert_eq!(
            url("not a url"),
            "is not a valid URL (relative URL without a base)"
        );
        assert_eq!(url("ftp://a/b"), "must be an http:// or https:// URL");
        // What the URL parser forgives, and a destination given to Herald should not have
        // (a stored one is sent as the parser takes it).
        let url = |raw| parse_written_webhook_url(raw).unwrap_err().to_string();
        assert!(parse_webhook_url("http:///x").is_ok());
        for untrimmed in [
            " http://a.example/",
            "http://a.example/\t",
            "http://a.example/\n",
            "http://exa\nmple.com/",
        ] {
            assert_eq!(
                url(untrimmed),
                "must not begin or end with a space or a control character, nor hold a tab or a line break",
                "{untrimmed:?}"
            );
        }
        for hostless in ["http:///x", "http:x", "https:/x"] {
            assert_eq!(url(hostless), "must name a host", "{hostless}");
        }
        for backslashed in [
            "http://\\x",
            "http:\\\\x",
            "http://evil.example\\@127.0.0.1:19364/a",
            "http://127.0.0.1:19364\\@evil.example/b",
            "https://a.example/p\\q",
        ] {
            assert_eq!(
                url(backslashed),
                "must not hold a backslash, which the URL parser reads as a slash",
                "{backslashed}"
            );
        }
        assert_eq!(
            url("http://127.0.0.1:0/x"),
            "must not name port 0, which cannot be connected to"
        );
        for odd in [
            "http://127.0.0.1:/x",
            "http://@127.0.0.1:19250/x",
            "http://\u{ff11}\u{ff12}\u{ff17}.0.0.1:19250/x",
            "http://127\u{3002}0.0.1/x",
            "http://127.0.0.1\u{ad}:19250/x",
            "http://exa\u{ad}mple.com/",
            "http://exa\u{ad}mple.b\u{fc}cher.example/",
            "http://\u{ff45}\u{ff58}.b\u{fc}cher.example/",
            "http://%31%32%37.0.0.1/",
            "http://\u{212a}ube.example/",
            "http://\u{ff42}\u{fc}cher.example/",
        ] {
            assert!(
                url(odd).starts_with("must name its host and port as the URL parser reads them"),
                "{odd}: {}",
                url(odd)
            );
        }
        for fine in [
            "HTTP://a.example/",
            "https://A.Example:443/",
            "https://b\u{fc}cher.example/",
            "https://B\u{dc}CHER.example/",
            "http://127.1/",
            "http://2130706433/",
            "http://[::ffff:10.0.0.1]/",
            "https://a.example/s?q=a\\b#x\\y",
            "http://[::1]/",
            "https://a.example:8443/x?y=1",
            "http://[::1]:9/",
        ] {
            assert!(parse_written_webhook_url(fine).is_ok(), "{fine}");
        }
        assert_eq!(
            url("https://u:p@a.example/"),
            "must not carry credentials; configure an endpoint with auth instead"
        );
        let header = |n, v| check_custom_header(n, v).unwrap_err().to_string();
        assert_eq!(
            header("Webhook-Id", "x"),
            r#"header "Webhook-Id" is set by Herald"#
        );
        assert_eq!(header("a b", "x"), r#""a b" is not a valid header name"#);
        assert_eq!(
            header("X-A", "a\nb"),
            r#"the value of "X-A" is not a valid header value"#
        );
        let request = |name: &str, value: &str| {
            let payload = WebhookPayload {
                body: &json!({}),
                headers: vec![(name.to_owned(), value.to_owned())],
            };
            build_headers("e-1", 1, b"{}", &[], &payload, None)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(request("a b", "x"), r#"invalid header name "a b""#);
        assert_eq!(request("X-A", "a\nb"), "invalid header value");
    }
}
