//! Receipt ingest: verify a provider's signature over the raw request, then normalize each event.
//!
//! Nothing here parses a body before its signature is verified, and nothing here touches the
//! database or message state: the HTTP handler stores what [`Source::verify`] returns (one
//! transaction, insert-or-ignore on `(source, provider_event_id)`) and only then acknowledges.

pub mod schemes;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::domain::InvalidField;

/// How often a source's refused receipts are logged: the first refusal at once, then at most
/// one line a minute, saying how many were refused in between.
pub const REFUSAL_LOG_EVERY: chrono::Duration = chrono::Duration::seconds(60);

/// Which refused receipts to log. Refusals are unauthenticated traffic, so each is not a line of
/// its own (junk must not flood the log), yet a provider whose secret is wrong must show: per
/// source (a configured one: the map is bounded), the first refusal is logged, then one a
/// minute with the count of those left out since.
#[derive(Debug, Default)]
pub struct RefusalLog {
    last: std::sync::Mutex<std::collections::HashMap<String, (DateTime<Utc>, u64)>>,
}

impl RefusalLog {
    /// A refusal for `source` at `now`: `Some(n)` to log it, `n` refusals having been left out
    /// since the source's last line; `None` to leave it out.
    pub fn take(&self, source: &str, now: DateTime<Utc>) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match last.get_mut(source) {
            Some((at, left_out)) if now - *at < REFUSAL_LOG_EVERY => {
                *left_out += 1;
                None
            }
            Some((at, left_out)) => {
                let n = *left_out;
                (*at, *left_out) = (now, 0);
                Some(n)
            }
            None => {
                last.insert(source.to_owned(), (now, 0));
                Some(0)
            }
        }
    }
}

/// A request as the verifier sees it: raw bytes, headers with lower-cased names.
#[derive(Debug, Clone, Copy)]
pub struct RawRequest<'a> {
    pub headers: &'a [(String, String)],
    pub body: &'a [u8],
    /// The query string the request arrived with (without `?`), for URL-signing schemes.
    pub query: Option<&'a str>,
    /// The HTTP method (`POST`, or `GET` for schemes whose receipts arrive in the query).
    pub method: &'a str,
}

impl RawRequest<'_> {
    /// The first value of a header (names are case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Herald's normalized receipt vocabulary.
pub const VOCABULARY: &[&str] = &[
    "queued",
    "sent",
    "delivered",
    "deferred",
    "bounced",
    "dropped",
    "failed",
    "opened",
    "clicked",
    "complained",
    "unsubscribed",
    "read",
];

/// One verified, normalized provider event.
pub use crate::storage::models::NewReceipt as ReceiptEvent;

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// 401: no signature (or credentials, or a signed element such as its timestamp) where one
    /// is required; the element named.
    #[error("missing {0}")]
    Missing(&'static str),
    /// 401: no candidate signature matched any secret.
    #[error("signature does not match")]
    Mismatch,
    /// 401: the signed timestamp is outside the tolerance.
    #[error("timestamp outside the tolerance of {0} s")]
    Stale(u64),
    /// 400: the signature is valid but the body is not what the scheme defines.
    #[error("unparsable body: {0}")]
    Unparsable(String),
    /// 503: something verification needs is unreachable right now (a signing certificate); the
    /// provider should retry — a 4xx would make it give up and lose the receipt.
    #[error("verification temporarily impossible: {0}")]
    Unavailable(&'static str),
    /// 400: a verified event carries an id longer than [`ID_MAX_BYTES`] (the field named).
    #[error("{0} is longer than {ID_MAX_BYTES} bytes")]
    TooLong(String),
    /// 401: the request names or carries something this source does not accept, whatever its
    /// signature: an SNS topic not in `topic_arns`, a certificate URL that is not SNS's for the
    /// topic's region, Basic credentials that match no configured pair (Postmark), a signed
    /// timestamp that is not whole seconds, a signature algorithm Herald does not know.
    #[error("{0}")]
    NotAccepted(&'static str),
    /// 400: a verified event's own id is empty (the field named): duplicates are found by it, so
    /// every such receipt would be taken for the first one.
    #[error("{0} is missing or empty: a receipt is deduplicated by its provider's id")]
    Blank(String),
}

impl VerifyError {
    /// 401 for authentication failures, 400 for a verified but unparsable body, 503 when the
    /// verifier cannot decide now.
    pub fn status(&self) -> u16 {
        match self {
            VerifyError::Unparsable(_) | VerifyError::TooLong(_) | VerifyError::Blank(_) => 400,
            VerifyError::Unavailable(_) => 503,
            _ => 401,
        }
    }
}

/// A configured receipt source: a scheme plus its secrets and options.
pub trait Source: Send + Sync {
    /// The scheme name of the interface contract (`standard-webhooks`, `stripe`, …).
    fn scheme(&self) -> &'static str;
    /// Verifies the raw request at time `now` and returns its normalized events.
    fn verify(
        &self,
        request: &RawRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError>;

    /// Where the provider's request holds an event's own id, as a refusal names it (`webhook-id`,
    /// `sg_event_id`): one that is empty or too long is named so, not by Herald's column.
    fn id_field(&self) -> &str {
        "provider_event_id"
    }

    /// [`Source::verify`], then [`check_storable`]: what ingest stores.
    fn verify_storable(
        &self,
        request: &RawRequest<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<ReceiptEvent>, VerifyError> {
        let events = self.verify(request, now)?;
        check_storable(&events, self.id_field())?;
        Ok(events)
    }
}

pub use crate::secret::constant_time_eq;

/// Whether `t` (unix seconds) is within `tolerance` of `now`: both ways, or only the age.
pub fn within(t: i64, now: DateTime<Utc>, tolerance: u64, future_too: bool) -> bool {
    let age = now.timestamp().saturating_sub(t);
    let tol = i64::try_from(tolerance).unwrap_or(i64::MAX);
    age <= tol && (!future_too || age >= -tol)
}

/// The longest id a stored receipt may carry (its provider event id, Herald's event id, the
/// provider's message id, a replay key): far above any provider's, and well below what one
/// index entry can hold (about 2.7 KB on PostgreSQL, which refuses a longer one — and with it
/// the whole group commit the receipt was in).
pub const ID_MAX_BYTES: usize = 1024;

/// A value a receipt is identified by, if given and not blank: an empty one is no id at all
/// (an empty `MessageSid` made `:delivered` the key of every such receipt).
pub fn nonblank<S: AsRef<str>>(v: Option<S>) -> Option<S> {
    v.filter(|s| !s.as_ref().trim().is_empty())
}

/// Refuses verified events that could not be stored: an id over [`ID_MAX_BYTES`], or an empty
/// provider event id, which the refusal names as `id_field` (the source's); in a request of
/// several events, with the event's place first (`[2].sg_event_id`).
pub fn check_storable(events: &[ReceiptEvent], id_field: &str) -> Result<(), VerifyError> {
    for (i, e) in events.iter().enumerate() {
        let named = |field: &str| match events.len() {
            1 => field.to_owned(),
            _ => format!("[{i}].{field}"),
        };
        if nonblank(Some(&e.provider_event_id)).is_none() {
            return Err(VerifyError::Blank(named(id_field)));
        }
        let ids = [
            (id_field, Some(&e.provider_event_id)),
            ("herald_event_id", e.herald_event_id.as_ref()),
            ("provider_message_id", e.provider_message_id.as_ref()),
            ("replay_key", e.replay_key.as_ref()),
        ];
        // As stored: each NUL becomes U+FFFD, three bytes (`NewReceipt::without_nul`).
        let stored_len = |v: &String| v.len() + 2 * v.bytes().filter(|&b| b == 0).count();
        if let Some((field, _)) = ids
            .into_iter()
            .find(|(_, v)| v.is_some_and(|v| stored_len(v) > ID_MAX_BYTES))
        {
            return Err(VerifyError::TooLong(named(field)));
        }
    }
    Ok(())
}

/// An event time worth keeping: years 1 to 9999. A provider's value outside them (a signed
/// year, a date of some other calendar's making) is no event time at all — PostgreSQL would
/// refuse one before 4713 BC, and with it the whole group commit the receipt was in. A leap
/// second is the next minute's first ([`crate::domain::without_leap_second`]).
pub(crate) fn plausible(t: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let t = crate::domain::without_leap_second(t);
    (1..=9999)
        .contains(&chrono::Datelike::year(&t))
        .then_some(t)
}

/// Unix seconds (integer or fractional, to the microsecond) → time.
pub fn unix_time(v: &Value) -> Option<DateTime<Utc>> {
    let secs = match v {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) => s.trim().parse::<f64>().ok()?,
        _ => return None,
    };
    // At most 9999-12-31T23:59:59Z (NaN is outside too).
    if !(0.0..=253_402_300_799.0).contains(&secs) {
        return None;
    }
    // Rounded as a whole: a fraction that rounds up to a whole second carries into the next.
    DateTime::from_timestamp_micros((secs * 1_000_000.0).round() as i64).and_then(plausible)
}

/// An RFC 3339 / ISO 8601 time string → time.
pub fn iso_time(v: &Value) -> Option<DateTime<Utc>> {
    let s = v.as_str()?;
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
        .or_else(|| {
            // `2024-01-01 12:00:00.000000+00` and similar.
            DateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f%#z")
                .ok()
                .map(|t| t.with_timezone(&Utc))
        })
        .and_then(plausible)
}

/// An RFC 2822 time string (`Tue, 14 Nov 2023 22:13:20 +0000`, as mail headers write one) →
/// time.
pub fn rfc2822_time(v: &Value) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc2822(v.as_str()?)
        .ok()
        .map(|t| t.with_timezone(&Utc))
        .and_then(plausible)
}

/// A string at a JSON pointer.
pub fn str_at(v: &Value, pointer: &str) -> Option<String> {
    match v.pointer(pointer)? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Herald's event id in a custom-data object or a list of `{name, value}` tags.
pub fn herald_event_id_in(v: Option<&Value>) -> Option<String> {
    const KEY: &str = "herald_event_id";
    match v? {
        Value::Object(m) => m.get(KEY).and_then(|x| x.as_str()).map(str::to_owned),
        Value::Array(items) => items.iter().find_map(|t| {
            let name = t.get("name").or_else(|| t.get("Name"))?.as_str()?;
            (name == KEY)
                .then(|| {
                    t.get("value")
                        .or_else(|| t.get("Value"))?
                        .as_str()
                        .map(str::to_owned)
                })
                .flatten()
        }),
        _ => None,
    }
}

/// The verdict of [`verify_offline`], as `herald verify-receipt` prints it.
#[derive(Debug, serde::Serialize)]
pub struct Verdict {
    /// Whether ingest would accept (store) this request.
    pub valid: bool,
    /// Whether the signature (or credentials) checked out, even if the body then did not parse.
    pub signature_valid: bool,
    pub scheme: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The HTTP status ingest would answer (200, 400 or 401).
    pub status: u16,
    pub events: Vec<ReceiptEvent>,
}

/// What `herald verify-receipt` was given, besides the body and the time.
#[derive(Debug, Clone, Default)]
pub struct OfflineRequest<'a> {
    pub scheme: &'a str,
    /// As in `[sources.NAME]` (postmark: `username:password`).
    pub secrets: &'a [String],
    pub headers: &'a [(String, String)],
    /// The URL as the provider called it, query included (URL-signing and GET-signed schemes).
    pub url: Option<&'a str>,
    /// `POST` unless given; GET-signed schemes read their parameters from `url`'s query.
    pub method: Option<&'a str>,
    /// The source's scheme options, as `[sources.NAME]` keys (`signature_method=sha256`).
    pub params: &'a [(String, String)],
}

/// Runs a scheme's verifier and normalizer without a server or database: the support tool for
/// "why was this receipt refused?". `secrets` are as in `[sources.NAME]` (postmark:
/// `username:password`); `url` is the public URL as the provider called it (URL-signing schemes).
pub fn verify_offline(
    scheme: &str,
    secrets: &[String],
    headers: &[(String, String)],
    body: &[u8],
    url: Option<&str>,
    cert_pem: Option<Vec<u8>>,
    at: DateTime<Utc>,
) -> Result<Verdict, InvalidField> {
    verify_request_offline(
        &OfflineRequest {
            scheme,
            secrets,
            headers,
            url,
            ..Default::default()
        },
        body,
        cert_pem,
        at,
    )
}

/// A source's options from `KEY=VALUE` pairs, as they would be written in `[sources.NAME]`
/// (integers and booleans as such), checked by the same parser as the configuration file.
fn options_config(
    scheme: &str,
    params: &[(String, String)],
) -> Result<schemes::SourceConfig, InvalidField> {
    let mut t = toml::Table::new();
    t.insert("scheme".into(), toml::Value::String(scheme.to_owned()));
    for (k, v) in params {
        if matches!(k.as_str(), "scheme" | "secret" | "secrets" | "public_url") {
            return Err(InvalidField::new(
                format!("--param {k}"),
                "is given by its own option (--scheme, --secret, --url)",
            ));
        }
        // A list as TOML writes one: `topic_arns=["arn:…", "arn:…"]`.
        let list = || {
            v.trim_start()
                .starts_with('[')
                .then(|| format!("v = {v}").parse::<toml::Table>().ok())
                .flatten()
                .and_then(|mut t| t.remove("v"))
        };
        let value = if let Some(list) = list() {
            list
        } else if let Ok(n) = v.parse::<i64>() {
            toml::Value::Integer(n)
        } else if let Ok(b) = v.parse::<bool>() {
            toml::Value::Boolean(b)
        } else {
            toml::Value::String(v.clone())
        };
        t.insert(k.clone(), value);
    }
    t.clone().try_into().map_err(|e: toml::de::Error| {
        // Name the option whose value it cannot take: each alone, the first refused.
        let key = params.iter().map(|(k, _)| k).find(|k| {
            let mut one = toml::Table::new();
            one.insert("scheme".into(), t["scheme"].clone());
            one.insert((*k).clone(), t[k.as_str()].clone());
            one.try_into::<schemes::SourceConfig>().is_err()
        });
        let field = key.map_or_else(|| "--param".to_owned(), |k| format!("--param {k}"));
        InvalidField::new(field, e.message().to_owned())
    })
}

/// A source the offline tool could not build, its field named as the tool's options name it
/// (`--scheme`, `--url`, `--secret`, `--param KEY`) rather than as a `[sources.NAME]` key.
fn as_offline_option(mut e: InvalidField) -> InvalidField {
    let key = e.field.strip_prefix("source.").unwrap_or(&e.field);
    e.field = match key {
        "scheme" => "--scheme".into(),
        "public_url" => "--url".into(),
        "secrets" | "username" | "password" => "--secret".into(),
        other => format!("--param {other}"),
    };
    e
}

/// [`verify_offline`] with a method and the source's scheme options.
pub fn verify_request_offline(
    o: &OfflineRequest<'_>,
    body: &[u8],
    cert_pem: Option<Vec<u8>>,
    at: DateTime<Utc>,
) -> Result<Verdict, InvalidField> {
    let (scheme, secrets, headers, url) = (o.scheme, o.secrets, o.headers, o.url);
    let mut c = options_config(scheme, o.params)?;
    c.secrets = secrets
        .iter()
        .map(|s| crate::secret::Secret::new(s.clone()))
        .collect();
    // --url is the URL the provider called, whose query a GET-signed receipt carries: the
    // source's public_url only for the schemes that sign it.
    if schemes::keys_of(scheme).is_some_and(|k| k.contains(&"public_url")) {
        c.public_url = url.map(str::to_owned);
    }
    if scheme == "postmark" {
        // Each --secret is one accepted pair.
        c.credentials = secrets
            .iter()
            .map(|s| {
                let (u, p) = s.split_once(':').ok_or_else(|| {
                    InvalidField::new("--secret", "postmark takes username:password")
                })?;
                Ok(schemes::postmark::Credentials {
                    username: u.to_owned(),
                    password: crate::secret::Secret::new(p),
                })
            })
            .collect::<Result<_, InvalidField>>()?;
        c.secrets.clear();
    }
    let build = |c: &schemes::SourceConfig| -> Result<std::sync::Arc<dyn Source>, InvalidField> {
        if scheme != "ses" {
            return schemes::build("source", c).map_err(as_offline_option);
        }
        // Offline: the certificate comes from --cert-file, for the URL the message names; a
        // subscription is never confirmed. What does not apply is refused, as for a source
        // (a --secret, say: ses signs with a certificate).
        schemes::check_keys("source", c).map_err(as_offline_option)?;
        let cert_url = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| str_at(&v, "/SigningCertURL"))
            .unwrap_or_default();
        let mut store = schemes::ses::StaticCertStore::default();
        if let Some(pem) = &cert_pem {
            store.0.insert(cert_url, pem.clone());
        }
        Ok(std::sync::Arc::new(schemes::ses::Ses::new(
            c.topic_arns.clone(),
            std::sync::Arc::new(store),
            false,
            c.tolerance_seconds.unwrap_or(schemes::DEFAULT_TOLERANCE),
        )))
    };
    let source = build(&c)?;
    let query = url.and_then(|u| u.split_once('?')).map(|(_, q)| q);
    let request = RawRequest {
        headers,
        body,
        query,
        method: o.method.unwrap_or("POST"),
    };
    let verified = source.verify_storable(&request, at);
    Ok(match verified {
        Ok(events) => Verdict {
            valid: true,
            signature_valid: true,
            scheme: scheme.to_owned(),
            error: None,
            status: 200,
            events,
        },
        Err(e) => {
            // Outside the time window, the signature may match all the same: checked again with
            // a window of ten years, so that the verdict points at the clock (or --at), not at
            // the secret.
            // MessageBird's window is its token's own (`nbf`, `exp`): widened by its leeway.
            let widens = scheme == "messagebird"
                || schemes::keys_of(scheme).is_some_and(|k| k.contains(&"tolerance_seconds"));
            let signature_valid = match &e {
                VerifyError::Stale(_) if widens => {
                    let mut wide = c.clone();
                    wide.tolerance_seconds = Some(WIDE_TOLERANCE);
                    let wide = match scheme {
                        "messagebird" => {
                            schemes::build_unchecked("source", &wide).map_err(as_offline_option)?
                        }
                        _ => build(&wide)?,
                    };
                    wide.verify(&request, at)
                        .map_or_else(|e| e.status() == 400, |_| true)
                }
                // Refused for its topic: checked again as if every topic were accepted, so that
                // the verdict points at topic_arns, not at the signature.
                VerifyError::NotAccepted(_) if scheme == "ses" => {
                    let mut any_topic = c.clone();
                    any_topic.topic_arns.clear();
                    // A stale one too: the signature, not the clock, is the question here.
                    any_topic.tolerance_seconds = Some(WIDE_TOLERANCE);
                    build(&any_topic)?
                        .verify(&request, at)
                        .map_or_else(|e| e.status() == 400, |_| true)
                }
                _ => e.status() == 400,
            };
            let error = match (&e, signature_valid) {
                (VerifyError::Stale(_), true) => {
                    format!(
                        "{e} (the signature itself matches: the clock, or --at, is the difference)"
                    )
                }
                (VerifyError::NotAccepted(_), true) => {
                    format!("{e} (the signature itself matches)")
                }
                _ => e.to_string(),
            };
            Verdict {
                valid: false,
                signature_valid,
                scheme: scheme.to_owned(),
                error: Some(error),
                status: e.status(),
                events: Vec::new(),
            }
        }
    })
}

/// The time window [`verify_request_offline`] checks a signature in again when the receipt is
/// only outside its window: ten years.
const WIDE_TOLERANCE: u64 = 10 * 365 * 86_400;

#[cfg(test)]
mod tests {
    #[test]
    fn refusals_are_logged_first_then_once_a_minute_per_source() {
        let log = super::RefusalLog::default();
        let t = |s: i64| chrono::DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap();
        assert_eq!(log.take("a", t(0)), Some(0), "the first at once");
        assert_eq!(log.take("a", t(1)), None);
        assert_eq!(log.take("a", t(59)), None);
        assert_eq!(log.take("b", t(2)), Some(0), "each source its own");
        assert_eq!(
            log.take("a", t(60)),
            Some(2),
            "a minute on, with those left out"
        );
        assert_eq!(log.take("a", t(61)), None);
        assert_eq!(log.take("a", t(200)), Some(1));
    }

    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    #[test]
    fn time_helpers() {
        assert_eq!(
            unix_time(&json!(1_600_000_000)).unwrap().timestamp(),
            1_600_000_000
        );
        assert_eq!(
            unix_time(&json!(1521243339.873676))
                .unwrap()
                .timestamp_subsec_micros(),
            873676
        );
        assert_eq!(unix_time(&json!("12")).unwrap().timestamp(), 12);
        assert_eq!(unix_time(&json!(-1)), None);
        assert_eq!(
            iso_time(&json!("2019-11-26T21:13:35Z"))
                .unwrap()
                .timestamp(),
            1574802815
        );
        assert_eq!(iso_time(&json!("nope")), None);
        // A fraction that rounds up to a whole second carries into the next (it was lost).
        assert_eq!(
            unix_time(&json!(1521243339.9999996)),
            DateTime::from_timestamp(1521243340, 0)
        );
        // Outside years 1 to 9999: no event time (PostgreSQL refuses years before 4713 BC).
        assert_eq!(iso_time(&json!("-5000-01-01 00:00:00+00")), None);
        assert_eq!(iso_time(&json!("0000-12-31 23:59:59+00")), None);
        assert!(iso_time(&json!("0001-01-01 00:00:00+00")).is_some());
        // A leap second is the next minute's first (it was stored as `:60`).
        assert_eq!(
            iso_time(&json!("2016-12-31T23:59:60Z")),
            DateTime::from_timestamp(1483228800, 0)
        );
        assert_eq!(iso_time(&json!("9999-12-31 23:59:60+00")), None);
        assert!(unix_time(&json!(253_402_300_799_i64)).is_some());
        assert_eq!(unix_time(&json!(253_402_300_800_i64)), None);
        assert_eq!(unix_time(&json!(1e300)), None);
    }

    #[test]
    fn ids_too_long_to_store_are_named() {
        let event = |id: &str| ReceiptEvent {
            provider_event_id: id.to_owned(),
            event_type: "delivered".into(),
            provider_type: "delivered".into(),
            event_time: None,
            herald_event_id: None,
            provider_message_id: None,
            raw: json!({}),
            replay_key: None,
        };
        let ok = "x".repeat(ID_MAX_BYTES);
        let check = |events: &[ReceiptEvent]| check_storable(events, "webhook-id");
        assert!(check(&[event(&ok)]).is_ok());
        // Counted as stored: a NUL becomes U+FFFD, three bytes.
        let nuls = "\0".repeat(ID_MAX_BYTES / 3 + 1);
        assert_eq!(
            check(&[event(&nuls)]),
            Err(VerifyError::TooLong("webhook-id".into()))
        );
        assert!(check(&[event(&"\0".repeat(ID_MAX_BYTES / 3))]).is_ok());
        // An empty id would be the key of every receipt without one.
        for blank in ["", " \t"] {
            let e = check(&[event(&ok), event(blank)]).unwrap_err();
            assert_eq!(
                (e.status(), e),
                (400, VerifyError::Blank("[1].webhook-id".into()))
            );
            // Alone, without its place.
            let e = check(&[event(blank)]).unwrap_err();
            assert_eq!(e, VerifyError::Blank("webhook-id".into()));
        }
        let long = "x".repeat(ID_MAX_BYTES + 1);
        let e = check(&[event(&ok), event(&long)]).unwrap_err();
        assert_eq!(
            (e.status(), e.to_string()),
            (400, "[1].webhook-id is longer than 1024 bytes".to_owned())
        );
        for (field, set) in [
            (
                "herald_event_id",
                (|e: &mut ReceiptEvent, v: String| e.herald_event_id = Some(v))
                    as fn(&mut ReceiptEvent, String),
            ),
            ("provider_message_id", |e, v| {
                e.provider_message_id = Some(v)
            }),
            ("replay_key", |e, v| e.replay_key = Some(v)),
        ] {
            let mut x = event("ok");
            set(&mut x, long.clone());
            assert!(
                matches!(check(&[x]), Err(VerifyError::TooLong(f)) if f == field),
                "{field}"
            );
        }
    }

    #[test]
    fn tolerance_both_ways_or_age_only() {
        let now = Utc.timestamp_opt(1000, 0).unwrap();
        assert!(within(700, now, 300, true) && !within(699, now, 300, true));
        assert!(within(1300, now, 300, true) && !within(1301, now, 300, true));
        assert!(within(5000, now, 300, false), "age-only accepts the future");
    }

    #[test]
    fn verify_offline_takes_several_postmark_pairs() {
        let body = br#"{"RecordType":"Delivery","MessageID":"m1","Recipient":"a@b.example"}"#;
        let secrets = ["hook:old".to_owned(), "hook:new".to_owned()];
        let verdict = |auth: &str| {
            let headers = [("authorization".to_owned(), format!("Basic {auth}"))];
            verify_offline("postmark", &secrets, &headers, body, None, None, Utc::now())
                .unwrap()
                .status
        };
        // base64("hook:old"), base64("hook:new"), base64("hook:bad")
        assert_eq!(
            (
                verdict("aG9vazpvbGQ="),
                verdict("aG9vazpuZXc="),
                verdict("aG9vazpiYWQ=")
            ),
            (200, 200, 401)
        );
        assert!(
            verify_offline(
                "postmark",
                &["nocolon".into()],
                &[],
                body,
                None,
                None,
                Utc::now()
            )
            .is_err()
        );
    }

    #[test]
    fn herald_event_id_in_objects_and_tag_lists() {
        assert_eq!(
            herald_event_id_in(Some(&json!({"herald_event_id": "e1"}))).as_deref(),
            Some("e1")
        );
        assert_eq!(
            herald_event_id_in(Some(
                &json!([{"name": "x", "value": "y"}, {"name": "herald_event_id", "value": "e2"}])
            ))
            .as_deref(),
            Some("e2")
        );
        assert_eq!(herald_event_id_in(Some(&json!("e3"))), None);
        assert_eq!(herald_event_id_in(None), None);
    }
}

#[cfg(test)]
mod arbitrary_input {
    //! Property test: the header and envelope parsers take arbitrary input without panicking.
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const PIECES: &[&str] = &[
        "t=",
        "v1=",
        "v0=",
        "v1,",
        "v1a,",
        ",",
        "=",
        " ",
        "  ",
        "\t",
        "1614265330",
        "-1",
        "99999999999999999999",
        "whsec_",
        "é",
        "\u{0}",
        "\"",
        "{",
        "}",
        "[",
        "]",
        ":",
        "https://",
        "sns.us-east-1.amazonaws.com",
        ".pem",
        "?bodySHA256=",
        "&",
        "%",
        "%zz",
        "abc",
        "AAAA",
        "==",
        "msg_1",
        "Type",
        "Notification",
        "null",
    ];

    fn junk(rng: &mut StdRng) -> String {
        let n = rng.random_range(0..12);
        let mut s = String::new();
        for _ in 0..n {
            if rng.random_bool(0.2) {
                s.push(char::from(rng.random_range(0u8..128)));
            } else {
                s.push_str(PIECES[rng.random_range(0..PIECES.len())]);
            }
        }
        s
    }

    #[test]
    fn parsers_never_panic() {
        let mut rng = StdRng::seed_from_u64(0x4e7a1d);
        let now = Utc::now();
        let sw = schemes::standard_webhooks::StandardWebhooks::new(
            &["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()],
            300,
        )
        .unwrap();
        let stripe = schemes::stripe::Stripe::new(vec!["k".into()], 300);
        let twilio = schemes::twilio::Twilio::new(vec!["k".into()], "https://h.example/t").unwrap();
        let mailgun = schemes::mailgun::Mailgun::new(vec!["k".into()], 300);
        let ses = schemes::ses::Ses::new(
            vec![],
            std::sync::Arc::new(schemes::ses::StaticCertStore::default()),
            false,
            schemes::DEFAULT_TOLERANCE,
        );
        let sources: Vec<&dyn Source> = vec![&sw, &stripe, &twilio, &mailgun, &ses];
        for _ in 0..5_000 {
            let h = junk(&mut rng);
            let _ = schemes::stripe::parse_header(&h);
            let _ = schemes::ses::sns_url_allowed(&h, true, "us-east-1");
            let _ = schemes::ses::topic_region(&h);
            if let Ok(u) = url::Url::parse(&h) {
                let _ = schemes::twilio::url_variants(&u);
            }
            let v: Value = serde_json::from_str(&h).unwrap_or(Value::String(h.clone()));
            let _ = schemes::ses::canonical(&v);
            let headers: Vec<(String, String)> = [
                "webhook-id",
                "webhook-timestamp",
                "webhook-signature",
                "svix-id",
                "svix-timestamp",
                "svix-signature",
                "stripe-signature",
                "x-twilio-signature",
            ]
            .iter()
            .fold(Vec::new(), |mut acc, n| {
                if rng.random_bool(0.7) {
                    acc.push((n.to_string(), junk(&mut rng)));
                }
                acc
            });
            let body = junk(&mut rng).into_bytes();
            let query = junk(&mut rng);
            let r = RawRequest {
                headers: &headers,
                body: &body,
                query: Some(&query),
                method: "POST",
            };
            for s in &sources {
                // Random input is never valid; the point is that nothing panics.
                assert!(s.verify(&r, now).is_err());
            }
        }
    }
}
