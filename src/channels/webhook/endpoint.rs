//! Named webhook endpoints (`[endpoints.NAME]`): their configuration as written, and the
//! validated [`Endpoint`] the channel sends with. Validation lives here, next to the channel that
//! uses it; `config` only reads the file and calls [`Endpoint::from_config`].

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::crypto::signing::SigningKey;
use crate::domain::InvalidField;
use crate::domain::event_type::TypePattern;
use crate::secret::Secret;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub url: String,
    /// One `whsec_…` secret; `secrets` lists several (rotation: one signature each).
    #[serde(default)]
    pub secret: Option<Secret>,
    #[serde(default)]
    pub secrets: Vec<Secret>,
    /// Static headers added to every request (after the message's own).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub auth: Option<EndpointAuth>,
    /// JSON pointer into a 2xx response body naming the receiver's message id (e.g. `/id`).
    #[serde(default)]
    pub provider_message_id_pointer: Option<String>,
    /// Event types this endpoint subscribes to (`destination = "type:EVENT.TYPE"`).
    #[serde(default)]
    pub event_types: Vec<String>,
    /// Sends a second to this endpoint (token bucket, per Herald process).
    #[serde(default)]
    pub rate_limit_per_second: Option<f64>,
    /// Sends at once after a quiet spell (default: the rate, rounded up).
    #[serde(default)]
    pub burst: Option<u32>,
    /// Sends in flight to this endpoint at once (per Herald process).
    #[serde(default)]
    pub max_in_flight: Option<u32>,
    /// Disable the endpoint after this many failed attempts in a row …
    #[serde(default)]
    pub disable_after_failures: Option<u32>,
    /// … that span at least this long (default 0: the count alone decides).
    #[serde(default)]
    pub disable_after_seconds: Option<u64>,
    /// What a key does when its head ends dead or unconfirmed: `block` (default) or `skip`.
    #[serde(default)]
    pub ordering_policy: Option<String>,
    /// `[endpoints.NAME.retry]`: this endpoint's own retry policy.
    #[serde(default)]
    pub retry: Option<EndpointRetryConfig>,
}

/// `[endpoints.NAME.retry]`: the global policy's keys without their `retry_` prefix; a key left
/// out keeps the global value. Versioned like the global policy (`NAME@hash`), under `name`
/// (default `endpoint-NAME`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointRetryConfig {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub base_seconds: Option<f64>,
    #[serde(default)]
    pub cap_seconds: Option<f64>,
    #[serde(default)]
    pub max_attempts: Option<u32>,
    #[serde(default)]
    pub retry_after_max_seconds: Option<f64>,
    #[serde(default)]
    pub jitter: Option<f64>,
}

/// When a named endpoint is disabled automatically: `failures` failed attempts in a row spanning
/// at least `over`. Re-enabled only by an explicit call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoDisable {
    pub failures: u32,
    pub over: std::time::Duration,
}

/// Authentication sent to an endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum EndpointAuth {
    Bearer(Secret),
    Basic { username: String, password: Secret },
}

/// A validated `[endpoints.NAME]`. `Debug` shows the URL without its query and header names
/// without values (both may carry credentials).
#[derive(Clone)]
pub struct Endpoint {
    pub name: String,
    pub url: url::Url,
    pub keys: Vec<SigningKey>,
    pub headers: Vec<(String, String)>,
    pub auth: Option<EndpointAuth>,
    pub provider_message_id_pointer: Option<String>,
    pub event_types: Vec<String>,
    pub limit: crate::channels::Limit,
    pub auto_disable: Option<AutoDisable>,
    /// Its head-of-line policy for keyed messages (`None`: `block`).
    pub ordering_policy: Option<crate::domain::OrderingPolicy>,
    /// `[endpoints.NAME.retry]` as written (`config` builds and checks the policy).
    pub retry: Option<EndpointRetryConfig>,
    /// [`Endpoint::secrets`] as the forms to hide in an answer's excerpt, made once.
    pub hidden: crate::channels::Secrets,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut url = self.url.clone();
        url.set_query(None);
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("url", &url.as_str())
            .field("keys", &self.keys.len())
            .field(
                "headers",
                &self.headers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("auth", &self.auth.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

/// The shortest configured value [`Endpoint::secrets`] hides: a shorter one could be any word of
/// an answer.
const SHORTEST_SECRET: usize = 8;

impl Endpoint {
    /// What of this endpoint's configuration its requests carry that only Herald and the receiver
    /// should read: its credentials (a bearer token; a basic pair as sent, base64, and its
    /// password), its headers' values and its URL's query values (as written and decoded), each
    /// of at least [`SHORTEST_SECRET`] characters. A receiver may echo them into its answer (an
    /// error that repeats the request, as httpbin's does), and an attempt's excerpt is stored
    /// (`herald_attempts.response_excerpt`, read by whoever reads the database): they are hidden
    /// there ([`Endpoint::hidden`]).
    pub fn secrets(&self) -> Vec<String> {
        let mut found = Vec::new();
        // The whole header value too: its base64 is not made of its token's.
        match &self.auth {
            Some(EndpointAuth::Bearer(token)) => {
                found.push(token.expose().to_owned());
                found.push(format!("Bearer {}", token.expose()));
            }
            Some(EndpointAuth::Basic { username, password }) => {
                let pair = basic_credentials(username, password.expose());
                found.push(format!("Basic {pair}"));
                found.push(pair);
                found.push(password.expose().to_owned());
            }
            None => {}
        }
        found.extend(self.headers.iter().map(|(_, v)| v.clone()));
        if let Some(query) = self.url.query() {
            for pair in query.split('&') {
                found.extend(pair.split_once('=').map(|(_, v)| v.to_owned()));
            }
        }
        found.extend(self.url.query_pairs().map(|(_, v)| v.into_owned()));
        found.retain(|s| s.chars().count() >= SHORTEST_SECRET);
        found.sort();
        found.dedup();
        found
    }

    /// What [`super::check_written_headers`] would refuse in the endpoint's headers: said at
    /// start, not refused (a configuration that sent them before this rule starts as before).
    pub fn header_warning(&self) -> Option<InvalidField> {
        super::check_written_headers(
            &format!("endpoints.{}.headers", self.name),
            self.headers.iter().map(|(h, v)| (h.as_str(), v.as_str())),
        )
        .err()
    }

    /// Whether the endpoint's configuration sets header `name` on each request (its headers, or
    /// `Authorization` with its auth): a message's own header of that name is not sent.
    /// A name a receiver reads as one of those counts (`X_Team` for `X-Team`: see
    /// [`super::header_key`]).
    pub fn sets_header(&self, name: &str) -> bool {
        let key = super::header_key(name);
        (self.auth.is_some() && key == "authorization")
            || self
                .headers
                .iter()
                .any(|(n, _)| super::header_key(n) == key)
    }

    /// Validates `[endpoints.NAME]`; a refusal names the offending key (`endpoints.NAME.url` …).
    pub fn from_config(name: String, e: EndpointConfig) -> Result<Self, InvalidField> {
        let key = format!("endpoints.{name}");
        // A message names an endpoint as `endpoint:NAME`; a name it cannot write is refused here,
        // not at the first message.
        if !crate::domain::is_endpoint_name(&name) {
            return Err(InvalidField::new(
                key,
                "endpoint names are letters, digits, - and _ (at most 64)",
            ));
        }
        let ordering_policy = match &e.ordering_policy {
            None => None,
            Some(p) => Some(
                crate::domain::OrderingPolicy::parse(p)
                    .map_err(|m| InvalidField::new(format!("{key}.ordering_policy"), m.message))?,
            ),
        };
        let retry = e.retry.clone();
        let url = super::parse_written_webhook_url(&e.url)
            .map_err(|m| InvalidField::new(format!("{key}.url"), m.to_string()))?;
        let mut keys = Vec::new();
        for s in e.secret.iter().chain(e.secrets.iter()) {
            keys.extend(
                SigningKey::parse_list(s.expose())
                    .map_err(|m| InvalidField::new(format!("{key}.secrets"), m.to_string()))?,
            );
        }
        if let Some(p) = &e.provider_message_id_pointer
            && !(p.is_empty() || p.starts_with('/'))
        {
            return Err(InvalidField::new(
                format!("{key}.provider_message_id_pointer"),
                "must be a JSON pointer such as /id",
            ));
        }
        // An empty credential would go out as `Bearer ` (or a user without a password): a
        // configuration slip, not a credential.
        match &e.auth {
            Some(EndpointAuth::Bearer(t)) if t.expose().trim().is_empty() => {
                return Err(InvalidField::new(
                    format!("{key}.auth.bearer"),
                    "must not be empty",
                ));
            }
            Some(EndpointAuth::Basic { username, .. }) if username.trim().is_empty() => {
                return Err(InvalidField::new(
                    format!("{key}.auth.basic.username"),
                    "must not be empty",
                ));
            }
            _ => {}
        }
        // The values too: one that is no valid header value (a newline) would fail every send
        // to the endpoint, each dead-lettered as `invalid_header`.
        for (h, v) in &e.headers {
            super::check_custom_header(h, v)
                .map_err(|m| InvalidField::new(format!("{key}.headers.{h}"), m.to_string()))?;
        }
        let limit =
            crate::channels::Limit::parse(&key, e.rate_limit_per_second, e.burst, e.max_in_flight)?;
        let auto_disable = match (e.disable_after_failures, e.disable_after_seconds) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(InvalidField::new(
                    format!("{key}.disable_after_seconds"),
                    "needs disable_after_failures",
                ));
            }
            (Some(n), seconds) if (1..=1_000_000).contains(&n) => Some(AutoDisable {
                failures: n,
                over: std::time::Duration::from_secs(seconds.unwrap_or(0)),
            }),
            (Some(_), _) => {
                return Err(InvalidField::new(
                    format!("{key}.disable_after_failures"),
                    "must be in 1–1000000",
                ));
            }
        };
        for t in &e.event_types {
            TypePattern::parse(t).map_err(|m| {
                InvalidField::new(format!("{key}.event_types"), format!("{t:?}: {m}"))
            })?;
        }
        let mut endpoint = Endpoint {
            name,
            url,
            keys,
            headers: e.headers.into_iter().collect(),
            auth: e.auth,
            provider_message_id_pointer: e.provider_message_id_pointer,
            event_types: e.event_types,
            limit,
            auto_disable,
            ordering_policy,
            retry,
            hidden: crate::channels::Secrets::default(),
        };
        endpoint.hidden = crate::channels::Secrets::new(&endpoint.secrets());
        Ok(endpoint)
    }
}

/// A basic pair as the `Authorization` header carries it (without `Basic `): base64 of
/// `username:password`.
pub fn basic_credentials(username: &str, password: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
}
