//! Configuration: one TOML file, then `HERALD_*` environment overrides, then `validate()`.
//!
//! Every environment variable of the interface contract is also a top-level key of the file,
//! named without the prefix in lower case (`HERALD_LEASE_SECONDS` ↔ `lease_seconds`). Secrets are
//! [`Secret`]s: redacted in `Debug`, never logged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::auth::{Scope, Tokens};
use crate::channels::email::dkim::{DkimError, DkimSigner};
use crate::channels::email::relay::RelayProvider;
use crate::channels::email::{self, EmailConfigError};
use crate::channels::webhook::{AllowList, Endpoint, EndpointConfig, EndpointRetryConfig, ssrf};
use crate::crypto::signing::SigningKey;
use crate::ingest::Source;
use crate::ingest::schemes::SourceConfig;
use crate::reconcile::StatusCallbacks;
use crate::secret::Secret;
use crate::sender::policy::RetryPolicy;
use crate::telemetry::LogFormat;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse. The message names the line but never quotes it: the line may
    /// hold a secret.
    #[error("config file {path} is not valid: line {line}{}: {message}", key.as_deref().map(|k| format!(" ({k})")).unwrap_or_default())]
    Parse {
        path: PathBuf,
        line: usize,
        /// The key written on that line, as `table.key` (never its value).
        key: Option<String>,
        message: String,
    },
    #[error("{name}: {message}")]
    Invalid { name: String, message: String },
}

fn parse_error(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let line = e
        .span()
        .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
        .unwrap_or(0);
    // serde's words for the numbers the file takes, in the README's; a string it quotes is the
    // value written, which may be a secret: not shown. Nor is a number or a boolean it shows in
    // backticks where the key may hold a secret (`smtp_password = 73310042` was shown), or where
    // the line names no key of Herald's.
    let key = key_on_line(text, line);
    let mut message = mask_between(e.message(), '"');
    // serde's `unknown field `leese_seconds`, expected one of `lease_seconds`, …` and `missing
    // field `url`` name keys, never a value: shown, they are the fix. `unknown variant `X`,
    // expected `bearer` or `basic`` names the words a setting takes, shown, but `X` may be a
    // value (`auth = "sk_live_…"` is read as a variant's name): masked where a secret may be.
    let names_keys = message.starts_with("unknown field") || message.starts_with("missing field");
    let secret_here = key.as_deref().is_none_or(may_hold_a_secret);
    if message.starts_with("unknown variant") {
        if secret_here && let Some((given, rest)) = message.split_once(", expected") {
            message = format!("{}, expected{rest}", mask_between(given, '`'));
        }
    } else if !names_keys && secret_here {
        message = mask_between(&message, '`');
    }
    for (t, max) in [
        ("u8", u64::from(u8::MAX)),
        ("u16", u64::from(u16::MAX)),
        ("u32", u64::from(u32::MAX)),
        ("u64", u64::MAX),
        ("usize", u64::MAX),
    ] {
        message = message.replace(
            &format!("expected {t}"),
            &format!("expected a whole number from 0 to {max}"),
        );
    }
    message = message.replace("expected f64", "expected a number");
    ConfigError::Parse {
        path: path.to_owned(),
        line,
        key,
        message,
    }
}

/// Whether a file key (`table.key`) holds, or may hold, a secret: its value is never shown.
fn may_hold_a_secret(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    matches!(
        last,
        "database_url"
            | "webhook_secret"
            | "api_token"
            | "smtp_url"
            | "smtp_username"
            | "smtp_password"
            | "secret"
            | "secrets"
            | "password"
            | "username"
            | "bearer"
            | "basic"
            | "auth"
            | "credentials"
            | "sha256"
            // An endpoint's or a destination's headers may carry an API key.
            | "headers"
    )
}

/// The key written on line `line` (1-based) of a TOML text, under the table it is in
/// (`endpoints.a.retry.max_attempts`); `None` where the line holds no plain `key =`. Only the
/// key: the value may be a secret.
fn key_on_line(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let (key, _) = lines.get(line.checked_sub(1)?)?.split_once('=')?;
    let key = key.trim();
    // Only a key Herald's file has: anything else before an `=` (a line of a multi-line array
    // or string, a secret's base64 padding) is not shown.
    if !known_file_keys().contains(&key) {
        return None;
    }
    let name = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    let table = lines[..line - 1].iter().rev().find_map(|l| {
        let t = l.split('#').next().unwrap_or("").trim();
        (t.starts_with('[') && t.ends_with(']') && !t.starts_with("[["))
            .then(|| t.trim_matches(['[', ']']).trim().to_owned())
    });
    Some(match table.filter(|t| name(t)) {
        Some(t) => format!("{t}.{key}"),
        None => key.to_owned(),
    })
}

/// Every key of the file and of its tables (`[tokens.NAME]`, `[sources.NAME]`,
/// `[endpoints.NAME]` and its `retry` and `auth`, …).
fn known_file_keys() -> &'static [&'static str] {
    static KEYS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let mut keys: Vec<&'static str> = [
            field_names::<FileConfig>(),
            field_names::<TokenConfig>(),
            field_names::<DestinationConfig>(),
            field_names::<StatusCallbacksConfig>(),
            field_names::<crate::channels::webhook::EndpointConfig>(),
            field_names::<crate::channels::webhook::EndpointRetryConfig>(),
            field_names::<crate::ingest::schemes::SourceConfig>(),
            field_names::<crate::ingest::schemes::postmark::Credentials>(),
        ]
        .concat();
        keys.extend(["bearer", "basic", "username", "password"]);
        keys
    })
}

/// `text` with every part between two `mark`s replaced by `…`: `"…"` for a string serde
/// quotes, `` `…` `` for a number, a boolean or a word it shows in backticks.
fn mask_between(text: &str, mark: char) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, part) in text.split(mark).enumerate() {
        if i > 0 {
            out.push(mark);
        }
        out.push_str(if i % 2 == 1 { "…" } else { part });
    }
    out
}

/// The field names serde knows for `T` (a struct), read by asking it to deserialize from a
/// probe that records them.
fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> de::Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("probe"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("probe"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

/// `HERALD_…`, in any case.
fn is_herald_variable(name: &str) -> bool {
    name.get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case("HERALD_"))
}

impl ConfigError {
    /// A refused setting's message names the variable that sets it, where it does not already
    /// (`retry_jitter: must be in [0, 1)` said neither `HERALD_RETRY_JITTER` nor what to do):
    /// one of `read`, the variables a setting reads.
    fn naming_its_variable(self, read: &std::collections::BTreeSet<String>) -> Self {
        match self {
            ConfigError::Invalid { name, message } => {
                let var = env_name(&name);
                let message = if message.contains("HERALD_") || !read.contains(&var) {
                    message
                } else {
                    format!(
                        "{message}; set {var} (or {name} in the file) to such a value, or unset it for the default"
                    )
                };
                ConfigError::Invalid { name, message }
            }
            other => other,
        }
    }
}

fn invalid(name: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name: name.into(),
        message: message.into(),
    }
}

/// The file's shape. Unknown keys are refused so a typo is an error, not a silent default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    database_url: Option<Secret>,
    database_pool_size: Option<u32>,
    database_idle_in_transaction_ms: Option<u64>,
    listen: Option<String>,
    webhook_secret: Option<Secret>,
    api_token: Option<Secret>,
    #[serde(default)]
    tokens: BTreeMap<String, TokenConfig>,
    poll_interval_ms: Option<u64>,
    lease_seconds: Option<u64>,
    webhook_timeout_ms: Option<u64>,
    webhook_connect_timeout_ms: Option<u64>,
    retry_policy_name: Option<String>,
    retry_base_seconds: Option<f64>,
    retry_cap_seconds: Option<f64>,
    retry_max_attempts: Option<u32>,
    retry_after_max_seconds: Option<f64>,
    retry_jitter: Option<f64>,
    sender_batch_size: Option<u32>,
    sender_concurrency: Option<u32>,
    sender_enabled: Option<bool>,
    listen_notify: Option<bool>,
    max_payload_bytes: Option<usize>,
    smtp_url: Option<Secret>,
    smtp_timeout_ms: Option<u64>,
    smtp_pool_size: Option<u32>,
    smtp_idle_timeout_seconds: Option<u64>,
    smtp_pipelining: Option<bool>,
    smtp_chunking: Option<bool>,
    smtp_noop_after_idle_ms: Option<u64>,
    smtp_ca_file: Option<PathBuf>,
    smtp_username: Option<Secret>,
    smtp_password: Option<Secret>,
    mail_dir: Option<PathBuf>,
    mail_from: Option<String>,
    message_id_domain: Option<String>,
    smtp_provider: Option<String>,
    dkim_selector: Option<String>,
    dkim_domain: Option<String>,
    dkim_key_file: Option<PathBuf>,
    ingest_max_body_bytes: Option<usize>,
    body_read_timeout_ms: Option<u64>,
    reconcile_interval_ms: Option<u64>,
    reconcile_batch_size: Option<u32>,
    unconfirmed_deadline_seconds: Option<u64>,
    shutdown_timeout_seconds: Option<u64>,
    allow_networks: Option<Networks>,
    log_format: Option<String>,
    retention_delivered_days: Option<u32>,
    retention_dead_letter_days: Option<u32>,
    retention_unmatched_receipt_days: Option<u32>,
    retention_batch_size: Option<u32>,
    retention_interval_seconds: Option<u64>,
    status_callbacks: Option<StatusCallbacksConfig>,
    #[serde(default)]
    endpoints: BTreeMap<String, EndpointConfig>,
    #[serde(default)]
    sources: BTreeMap<String, SourceConfig>,
    destination_max_in_flight: Option<u32>,
    smtp_rate_limit_per_second: Option<f64>,
    smtp_burst: Option<u32>,
    smtp_max_in_flight: Option<u32>,
    #[serde(default)]
    destinations: BTreeMap<String, DestinationConfig>,
}

/// `[destinations."HOST"]`: limits for every webhook to that host (any scheme and port).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DestinationConfig {
    rate_limit_per_second: Option<f64>,
    burst: Option<u32>,
    max_in_flight: Option<u32>,
}

/// `[tokens.NAME]`: a bearer token by its SHA-256, with a scope.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenConfig {
    sha256: String,
    scope: String,
}

/// `allow_networks`: `"10.0.0.0/8, 127.0.0.0/8"` or `["10.0.0.0/8", "127.0.0.0/8"]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Networks {
    One(String),
    List(Vec<String>),
}

/// `[status_callbacks]`: delivery-status changes as webhooks to a named endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusCallbacksConfig {
    destination: String,
    #[serde(default)]
    event_types: Vec<String>,
}

/// The validated settings Herald runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub database_url: Secret,
    pub database_pool_size: u32,
    /// PostgreSQL: how long the server lets a Herald session sit idle inside a transaction
    /// before ending it (zero: the server's setting).
    pub database_idle_in_transaction: Duration,
    pub listen: String,
    /// `None`: generated on first start and stored in the database.
    pub webhook_secret: Option<Vec<SigningKey>>,
    /// Every bearer token accepted: `[tokens.NAME]` and `HERALD_API_TOKEN` (named `default`).
    /// Empty: Herald generates a `default` admin token on first start (see `app::api_token`).
    pub tokens: Tokens,
    pub poll_interval: Duration,
    pub lease: Duration,
    /// The longest a send may take: `webhook_timeout_ms`, or `smtp_timeout_ms` where SMTP is
    /// configured and it is longer. The lease outlasts it by at least 5 s.
    pub longest_send: Duration,
    pub webhook_timeout: Duration,
    pub webhook_connect_timeout: Duration,
    pub retry: RetryPolicy,
    pub sender_batch_size: u32,
    pub sender_concurrency: u32,
    pub sender_enabled: bool,
    pub listen_notify: bool,
    pub max_payload_bytes: usize,
    pub smtp_url: Option<Secret>,
    pub smtp_timeout: Duration,
    /// Open SMTP connections at most (1–100).
    pub smtp_pool_size: usize,
    /// How long a parked SMTP connection stays open unused.
    pub smtp_idle_timeout: Duration,
    /// Pipeline MAIL FROM, RCPT TO and DATA when the relay offers PIPELINING (default on).
    pub smtp_pipelining: bool,
    /// Send an `at_least_once` message's content with `BDAT n LAST` (RFC 3030) in the same write
    /// as its pipelined envelope when the relay offers CHUNKING and PIPELINING (default on).
    pub smtp_chunking: bool,
    /// A parked SMTP connection resting this long or longer is checked with a NOOP of its own
    /// before reuse; one resting less, by an RSET in its pipelined envelope (0: always a NOOP).
    pub smtp_noop_after_idle: Duration,
    /// `smtp_ca_file`: CA certificates trusted for the relay in addition to the webpki roots.
    pub smtp_ca: Option<email::SmtpCa>,
    /// `smtp_username` + `smtp_password`: AUTH credentials kept out of the URL (they win over
    /// credentials in `smtp_url`).
    pub smtp_credentials: Option<(Secret, Secret)>,
    pub mail_dir: PathBuf,
    pub mail_from: String,
    pub message_id_domain: String,
    /// `smtp_provider`: the relay whose receipts echo Herald's event id (relay correlation).
    pub smtp_provider: Option<RelayProvider>,
    /// `dkim_selector` + `dkim_domain` + `dkim_key_file`: sign every email (key read at load).
    pub dkim: Option<Arc<DkimSigner>>,
    pub endpoints: BTreeMap<String, Endpoint>,
    /// `[endpoints.NAME.retry]`, built over the global policy, by endpoint name.
    pub endpoint_retry: BTreeMap<String, RetryPolicy>,
    pub ingest_max_body_bytes: usize,
    /// The longest a request body may take to arrive, from its first read: a client that stalls
    /// in it (holding a connection and a buffer, unauthenticated on ingest) is answered 408.
    pub body_read_timeout: Duration,
    pub sources: BTreeMap<String, ConfiguredSource>,
    /// How often the reconciler looks for pending receipts (it also wakes on ingest).
    pub reconcile_interval: Duration,
    pub reconcile_batch_size: u32,
    /// How long an `unconfirmed` message waits for a receipt before `dead_letter`.
    pub unconfirmed_deadline: Duration,
    /// How long, from SIGTERM/SIGINT, the sender keeps trying to write outcomes that fail to be
    /// written (the database down) before it gives up on them and Herald exits.
    pub shutdown_timeout: Duration,
    pub status_callbacks: Option<StatusCallbacks>,
    /// Per-destination limits (see `sender::limits`).
    pub limits: crate::sender::LimitsConfig,
    /// `allow_networks`: networks exempt from the webhook SSRF guard.
    pub allow_networks: AllowList,
    /// `log_format`: `text` (default) or `json`.
    pub log_format: LogFormat,
    /// `HERALD_*` variables set in the environment that no setting reads (a typo:
    /// `HERALD_LEASE_SECOND`): warned about at start, by name only.
    pub unread_env: Vec<String>,
    /// `HERALD_*` variables set to the empty string: taken as not set, warned about at start.
    pub empty_env: Vec<String>,
    /// What the configuration holds that Herald would refuse in what is written now but keeps
    /// working as before (an endpoint's headers): warned about at start, by key.
    pub warnings: Vec<String>,
    /// `retention_*`: how long finished messages and unmatched receipts are kept.
    pub retention: crate::retention::RetentionConfig,
}

/// `message_id_domain` when none is set: the same for every deployment (see
/// [`Settings::message_id_domain`]).
pub const DEFAULT_MESSAGE_ID_DOMAIN: &str = "herald.localhost";

/// A validated `[sources.NAME]`: its verifier.
#[derive(Clone)]
pub struct ConfiguredSource {
    pub name: String,
    pub source: std::sync::Arc<dyn Source>,
    /// `matches`: the messages its receipts may speak for (empty: every one).
    pub matches: Vec<String>,
}

impl std::fmt::Debug for ConfiguredSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Source({}: {}, secrets redacted)",
            self.name,
            self.source.scheme()
        )
    }
}

impl Settings {
    /// The retry policies messages come under, by destination (the global one, and each
    /// endpoint's own).
    pub fn policies(&self) -> crate::domain::policies::Policies {
        crate::sender::policy::policies(&self.retry, &self.endpoint_retry).with_orderings(
            self.endpoints
                .values()
                .filter_map(|e| Some((e.name.clone(), e.ordering_policy?))),
        )
    }

    /// Defaults, then `path` (or `herald.toml` when it exists), then the environment.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        // In any case, so that a `herald_lease_seconds` is named as a variable nothing reads.
        let env: BTreeMap<String, String> = std::env::vars()
            .filter(|(k, _)| is_herald_variable(k))
            .collect();
        Self::load_from(path, &env)
    }

    /// As [`Settings::load`] with an explicit environment (tests).
    pub fn load_from(
        path: Option<&Path>,
        env: &BTreeMap<String, String>,
    ) -> Result<Self, ConfigError> {
        let default_path = Path::new("herald.toml");
        let path = match path {
            Some(p) => Some(p),
            // Any entry by that name, a dangling symbolic link too (`exists` says false for
            // one): reading it then fails, naming it, rather than Herald running on defaults (a
            // generated token, the default destination rules) under a broken deployment.
            None if default_path.symlink_metadata().is_ok() => Some(default_path),
            None => None,
        };
        let file = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                Self::parse_file(&text).map_err(|e| parse_error(path, &text, &e))?
            }
            None => FileConfig::default(),
        };
        Self::build(file, env)
    }

    /// Settings from TOML text alone (tests, examples).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let file =
            Self::parse_file(text).map_err(|e| parse_error(Path::new("<inline>"), text, &e))?;
        Self::build(file, &BTreeMap::new())
    }

    fn parse_file(text: &str) -> Result<FileConfig, toml::de::Error> {
        toml::from_str(text)
    }

    fn build(mut f: FileConfig, env: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        // The variables read, to name those set but never read (a typo) once logging is up.
        let read = std::cell::RefCell::new(std::collections::BTreeSet::<String>::new());
        let get = |name: &str| {
            read.borrow_mut().insert(name.to_owned());
            env.get(name).filter(|v| !v.trim().is_empty()).cloned()
        };
        // Set but empty: taken as not set (as shells and Compose leave a variable that had no
        // value), and named at start. Not the database URL where the file gives none: a secret
        // that failed to arrive would start Herald on a new, empty SQLite file in the working
        // directory.
        if f.database_url.is_none()
            && env
                .get("HERALD_DATABASE_URL")
                .is_some_and(|v| v.trim().is_empty())
        {
            return Err(invalid(
                "HERALD_DATABASE_URL",
                "is set but empty; give the database URL, or unset it for the default \
                 sqlite://herald.db",
            ));
        }

        fn num<T: std::str::FromStr>(name: &str, v: String) -> Result<T, ConfigError> {
            v.trim().parse().map_err(|_| {
                // A number all the same (`-1`, `0.5`): the settings read here that do not take
                // it are counts and sizes.
                let why = match v.trim().parse::<f64>() {
                    Ok(f) if f >= 0.0 && f.fract() == 0.0 => "is too large for this setting",
                    Ok(_) => "is not a whole number of 0 or more",
                    Err(_) => "is not a number",
                };
                invalid(name, format!("{v:?} {why}"))
            })
        }
        fn flag(name: &str, v: String) -> Result<bool, ConfigError> {
            match v.trim() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" => Ok(false),
                _ => Err(invalid(name, format!("{v:?} is not true or false"))),
            }
        }
        macro_rules! over {
            ($field:ident, $var:literal, secret) => {
                if let Some(v) = get($var) {
                    f.$field = Some(Secret::new(v));
                }
            };
            ($field:ident, $var:literal, string) => {
                if let Some(v) = get($var) {
                    f.$field = Some(v.into());
                }
            };
            ($field:ident, $var:literal, num) => {
                if let Some(v) = get($var) {
                    f.$field = Some(num($var, v)?);
                }
            };
            ($field:ident, $var:literal, flag) => {
                if let Some(v) = get($var) {
                    f.$field = Some(flag($var, v)?);
                }
            };
        }
        over!(database_url, "HERALD_DATABASE_URL", secret);
        over!(database_pool_size, "HERALD_DATABASE_POOL_SIZE", num);
        over!(
            database_idle_in_transaction_ms,
            "HERALD_DATABASE_IDLE_IN_TRANSACTION_MS",
            num
        );
        over!(listen, "HERALD_LISTEN", string);
        over!(webhook_secret, "HERALD_WEBHOOK_SECRET", secret);
        over!(api_token, "HERALD_API_TOKEN", secret);
        over!(poll_interval_ms, "HERALD_POLL_INTERVAL_MS", num);
        over!(lease_seconds, "HERALD_LEASE_SECONDS", num);
        over!(webhook_timeout_ms, "HERALD_WEBHOOK_TIMEOUT_MS", num);
        over!(
            webhook_connect_timeout_ms,
            "HERALD_WEBHOOK_CONNECT_TIMEOUT_MS",
            num
        );
        over!(retry_policy_name, "HERALD_RETRY_POLICY_NAME", string);
        over!(retry_base_seconds, "HERALD_RETRY_BASE_SECONDS", num);
        over!(retry_cap_seconds, "HERALD_RETRY_CAP_SECONDS", num);
        over!(retry_max_attempts, "HERALD_RETRY_MAX_ATTEMPTS", num);
        over!(
            retry_after_max_seconds,
            "HERALD_RETRY_AFTER_MAX_SECONDS",
            num
        );
        over!(retry_jitter, "HERALD_RETRY_JITTER", num);
        over!(sender_batch_size, "HERALD_SENDER_BATCH_SIZE", num);
        over!(sender_concurrency, "HERALD_SENDER_CONCURRENCY", num);
        over!(sender_enabled, "HERALD_SENDER_ENABLED", flag);
        over!(listen_notify, "HERALD_LISTEN_NOTIFY", flag);
        over!(max_payload_bytes, "HERALD_MAX_PAYLOAD_BYTES", num);
        over!(smtp_url, "HERALD_SMTP_URL", secret);
        over!(smtp_timeout_ms, "HERALD_SMTP_TIMEOUT_MS", num);
        over!(smtp_pool_size, "HERALD_SMTP_POOL_SIZE", num);
        over!(
            smtp_idle_timeout_seconds,
            "HERALD_SMTP_IDLE_TIMEOUT_SECONDS",
            num
        );
        over!(smtp_pipelining, "HERALD_SMTP_PIPELINING", flag);
        over!(smtp_chunking, "HERALD_SMTP_CHUNKING", flag);
        over!(
            smtp_noop_after_idle_ms,
            "HERALD_SMTP_NOOP_AFTER_IDLE_MS",
            num
        );
        over!(smtp_ca_file, "HERALD_SMTP_CA_FILE", string);
        over!(smtp_username, "HERALD_SMTP_USERNAME", secret);
        over!(smtp_password, "HERALD_SMTP_PASSWORD", secret);
        over!(mail_dir, "HERALD_MAIL_DIR", string);
        over!(mail_from, "HERALD_MAIL_FROM", string);
        over!(message_id_domain, "HERALD_MESSAGE_ID_DOMAIN", string);
        over!(smtp_provider, "HERALD_SMTP_PROVIDER", string);
        over!(dkim_selector, "HERALD_DKIM_SELECTOR", string);
        over!(dkim_domain, "HERALD_DKIM_DOMAIN", string);
        over!(dkim_key_file, "HERALD_DKIM_KEY_FILE", string);
        over!(ingest_max_body_bytes, "HERALD_INGEST_MAX_BODY_BYTES", num);
        over!(body_read_timeout_ms, "HERALD_BODY_READ_TIMEOUT_MS", num);
        over!(reconcile_interval_ms, "HERALD_RECONCILE_INTERVAL_MS", num);
        over!(
            destination_max_in_flight,
            "HERALD_DESTINATION_MAX_IN_FLIGHT",
            num
        );
        over!(
            smtp_rate_limit_per_second,
            "HERALD_SMTP_RATE_LIMIT_PER_SECOND",
            num
        );
        over!(smtp_burst, "HERALD_SMTP_BURST", num);
        over!(smtp_max_in_flight, "HERALD_SMTP_MAX_IN_FLIGHT", num);
        over!(reconcile_batch_size, "HERALD_RECONCILE_BATCH_SIZE", num);
        over!(
            shutdown_timeout_seconds,
            "HERALD_SHUTDOWN_TIMEOUT_SECONDS",
            num
        );
        over!(
            unconfirmed_deadline_seconds,
            "HERALD_UNCONFIRMED_DEADLINE_SECONDS",
            num
        );
        if let Some(v) = get("HERALD_ALLOW_NETWORKS") {
            f.allow_networks = Some(Networks::One(v));
        }
        over!(log_format, "HERALD_LOG_FORMAT", string);
        over!(
            retention_delivered_days,
            "HERALD_RETENTION_DELIVERED_DAYS",
            num
        );
        over!(
            retention_dead_letter_days,
            "HERALD_RETENTION_DEAD_LETTER_DAYS",
            num
        );
        over!(
            retention_unmatched_receipt_days,
            "HERALD_RETENTION_UNMATCHED_RECEIPT_DAYS",
            num
        );
        over!(retention_batch_size, "HERALD_RETENTION_BATCH_SIZE", num);
        over!(
            retention_interval_seconds,
            "HERALD_RETENTION_INTERVAL_SECONDS",
            num
        );
        let read = read.into_inner();
        Self::checked(f, env, &read).map_err(|e| e.naming_its_variable(&read))
    }

    /// The settings `f` (the file's, each variable set over it) gives, checked. `read`: the
    /// `HERALD_*` variables a setting reads.
    fn checked(
        f: FileConfig,
        env: &BTreeMap<String, String>,
        read: &std::collections::BTreeSet<String>,
    ) -> Result<Self, ConfigError> {
        // Written in the file as "" (the variable's empty value is taken as not set, above).
        if f.database_url
            .as_ref()
            .is_some_and(|u| u.expose().trim().is_empty())
        {
            return Err(invalid(
                "database_url",
                "is empty; give the database URL, or leave it out for the default \
                 sqlite://herald.db",
            ));
        }
        let log_format = match f.log_format.as_deref() {
            None => LogFormat::Text,
            Some(v) => v.parse::<LogFormat>().map_err(|e| {
                invalid(
                    "log_format",
                    format!("{e}; set HERALD_LOG_FORMAT (or log_format in the file) to text or json, or unset it"),
                )
            })?,
        };
        let allow_networks = match &f.allow_networks {
            None => Ok(AllowList::default()),
            Some(Networks::One(s)) => AllowList::parse([s.as_str()]),
            Some(Networks::List(l)) => AllowList::parse(l.iter().map(String::as_str)),
        }
        .map_err(|m| {
            invalid(
                "allow_networks",
                format!(
                    "{m}; set HERALD_ALLOW_NETWORKS (or allow_networks in the file) to \
                     comma-separated CIDRs such as 127.0.0.0/8,10.1.0.0/16, or unset it"
                ),
            )
        })?;

        let limits = limits_config(&f, f.sender_concurrency.unwrap_or(64).clamp(1, 1024))?;

        let retention = retention_config(&f)?;
        let timings = Timings::resolve(
            f.lease_seconds,
            f.webhook_timeout_ms,
            f.webhook_connect_timeout_ms,
            f.smtp_timeout_ms,
            f.smtp_url.is_some(),
        )?;
        let poll_interval = Duration::from_millis(positive(
            "poll_interval_ms",
            f.poll_interval_ms.unwrap_or(1000),
        )?);

        let (retry_base, retry_cap) = retry_defaults(f.retry_base_seconds, f.retry_cap_seconds);
        let retry = RetryPolicy::new(
            f.retry_policy_name.unwrap_or_else(|| "default".into()),
            retry_base,
            retry_cap,
            f.retry_max_attempts.unwrap_or(15),
            f.retry_after_max_seconds.unwrap_or(3_600.0),
            f.retry_jitter.unwrap_or(0.2),
        )
        .map_err(|e| invalid(e.field, e.message))?;

        let webhook_secret = match f.webhook_secret {
            Some(s) => Some(
                SigningKey::parse_list(s.expose())
                    .map_err(|m| invalid("webhook_secret", m.to_string()))?,
            ),
            None => None,
        };

        let mut tokens = Tokens::default();
        if let Some(t) = &f.api_token {
            tokens
                .add_plain("default", t.expose(), Scope::Admin)
                .map_err(|e| invalid("api_token", e.to_string()))?;
        }
        for (name, t) in &f.tokens {
            tokens
                .add_digest(name, &t.sha256, &t.scope)
                .map_err(|e| invalid(format!("tokens.{name}"), e.to_string()))?;
        }

        let mut endpoints = BTreeMap::new();
        let mut endpoint_retry = BTreeMap::new();
        for (name, e) in f.endpoints {
            let endpoint =
                Endpoint::from_config(name.clone(), e).map_err(|e| invalid(e.field, e.message))?;
            // Literal addresses are refused now; names when they resolve, at send time.
            if let Err(r) = ssrf::check_url_literal(&endpoint.url, &allow_networks) {
                let callbacks = f
                    .status_callbacks
                    .as_ref()
                    .is_some_and(|c| crate::domain::endpoint_name(&c.destination) == Some(&name));
                return Err(invalid(
                    format!("endpoints.{name}.url"),
                    format!(
                        "refused by the SSRF guard: {r}{}; if Herald may send there, add the \
                         network to HERALD_ALLOW_NETWORKS (or allow_networks in the file)",
                        if callbacks {
                            " (the status_callbacks.destination endpoint)"
                        } else {
                            ""
                        }
                    ),
                ));
            }
            if let Some(r) = &endpoint.retry {
                let policy = endpoint_retry_policy(r, &name, &retry)
                    .map_err(|e| invalid(e.field, e.message))?;
                endpoint_retry.insert(name.clone(), policy);
            }
            endpoints.insert(name, endpoint);
        }

        let mut sources = BTreeMap::new();
        for (name, c) in f.sources {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(invalid(
                    format!("sources.{name}"),
                    "source names are letters, digits, - and _",
                ));
            }
            let source = crate::ingest::schemes::build(&format!("sources.{name}"), &c)
                .map_err(|e| invalid(e.field, e.message))?;
            // A Mailgun signature's token is kept (`herald_replay_keys`) for the unmatched
            // receipts' age: a signature still within its tolerance after that could be used
            // again for another event.
            // Twice the tolerance: a timestamp is taken that far ahead of this clock too.
            let kept = u64::from(retention.unmatched_receipt_days).saturating_mul(86_400);
            if c.scheme == "mailgun" && kept > 0 && c.tolerance().saturating_mul(2) >= kept {
                return Err(invalid(
                    format!("sources.{name}.tolerance_seconds"),
                    format!(
                        "{} s is not less than half of retention_unmatched_receipt_days ({} \
                         day{}), how long replay keys are kept (a timestamp is taken that far \
                         ahead too); lower it or keep receipts longer",
                        c.tolerance(),
                        retention.unmatched_receipt_days,
                        if retention.unmatched_receipt_days == 1 {
                            ""
                        } else {
                            "s"
                        }
                    ),
                ));
            }
            for m in &c.matches {
                let known = m == "email"
                    || crate::domain::endpoint_name(m).is_some_and(|e| endpoints.contains_key(e));
                if !known {
                    return Err(invalid(
                        format!("sources.{name}.matches"),
                        format!(
                            "{m:?} is neither \"email\" nor \"endpoint:NAME\" of a configured \
                             endpoint ({})",
                            endpoints.keys().cloned().collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
            }
            let matches = c.matches.clone();
            sources.insert(
                name.clone(),
                ConfiguredSource {
                    name,
                    source,
                    matches,
                },
            );
        }

        let smtp_pool_size = match f.smtp_pool_size {
            None => email::DEFAULT_POOL_SIZE,
            Some(n @ 1..=100) => n as usize,
            Some(n) => {
                return Err(invalid(
                    "smtp_pool_size",
                    format!(
                        "{n} is not in 1–100; set HERALD_SMTP_POOL_SIZE to the most SMTP \
                         connections the relay may see at once, or unset it (default {})",
                        email::DEFAULT_POOL_SIZE
                    ),
                ));
            }
        };
        let smtp_idle_timeout = match f.smtp_idle_timeout_seconds {
            None => email::DEFAULT_IDLE_TIMEOUT,
            Some(s @ 1..=3600) => Duration::from_secs(s),
            Some(s) => {
                return Err(invalid(
                    "smtp_idle_timeout_seconds",
                    format!(
                        "{s} is not in 1–3600; set HERALD_SMTP_IDLE_TIMEOUT_SECONDS to how long an \
                         unused SMTP connection may stay open, or unset it (default {})",
                        email::DEFAULT_IDLE_TIMEOUT.as_secs()
                    ),
                ));
            }
        };
        let smtp_noop_after_idle = match f.smtp_noop_after_idle_ms {
            None => email::DEFAULT_NOOP_AFTER_IDLE,
            Some(ms @ 0..=3_600_000) => Duration::from_millis(ms),
            Some(ms) => {
                return Err(invalid(
                    "smtp_noop_after_idle_ms",
                    format!(
                        "{ms} is not in 0–3600000; set HERALD_SMTP_NOOP_AFTER_IDLE_MS to how long a \
                         parked SMTP connection may rest and still be checked by the RSET in its \
                         pipelined envelope (0: a NOOP before every reuse), or unset it (default {})",
                        email::DEFAULT_NOOP_AFTER_IDLE.as_millis()
                    ),
                ));
            }
        };
        let smtp_credentials = match (f.smtp_username, f.smtp_password) {
            (None, None) => None,
            (Some(u), Some(p))
                if !u.expose().trim().is_empty() && !p.expose().trim().is_empty() =>
            {
                Some((u, p))
            }
            _ => {
                return Err(invalid(
                    "smtp_username",
                    "smtp_username and smtp_password go together and must not be empty; set both \
                     (HERALD_SMTP_USERNAME and HERALD_SMTP_PASSWORD) or neither",
                ));
            }
        };
        // The part after the @ of every Message-ID, which receivers deduplicate by.
        let message_id_domain = f
            .message_id_domain
            .unwrap_or_else(|| DEFAULT_MESSAGE_ID_DOMAIN.into());
        if !email::is_mail_domain(&message_id_domain) {
            return Err(invalid(
                "message_id_domain",
                "must be a domain name (dot-separated labels of letters, digits and inner \
                 hyphens, none empty) or an address literal ([192.0.2.1]): set \
                 HERALD_MESSAGE_ID_DOMAIN to your sending domain, e.g. mail.example.com",
            ));
        }
        if smtp_credentials.is_some() && f.smtp_url.is_none() {
            return Err(invalid(
                "smtp_username",
                "smtp_username and smtp_password are set but smtp_url is not: mail would be \
                 written to .eml files, not sent; set HERALD_SMTP_URL, or unset them",
            ));
        }
        let smtp_ca = match &f.smtp_ca_file {
            None => None,
            Some(path) => Some(email::SmtpCa::load(path).map_err(|e| {
                let cause = std::error::Error::source(&e)
                    .map(|c| format!(" ({c})"))
                    .unwrap_or_default();
                invalid(
                    "smtp_ca_file",
                    format!(
                        "{}: {e}{cause}; set HERALD_SMTP_CA_FILE to a PEM file of the CA \
                         certificates that sign the relay's certificate, or unset it",
                        path.display()
                    ),
                )
            })?),
        };
        // Checked here, before any database is opened, never quoted: the URL may hold a password.
        if let Some(url) = &f.smtp_url {
            email::check_smtp_url(url.expose(), smtp_credentials.is_some())
                .map_err(|e| invalid("smtp_url", smtp_url_refusal(&e)))?;
        }
        let mail_from = f
            .mail_from
            .unwrap_or_else(|| "Herald <herald@localhost>".into());
        if let Err(e) = email::parse_mail_from(&mail_from) {
            let cause = std::error::Error::source(&e)
                .map(|c| format!(" ({c})"))
                .unwrap_or_default();
            return Err(invalid(
                "mail_from",
                format!(
                    "not an email address{cause}; set HERALD_MAIL_FROM (or mail_from in the file) \
                     to an address such as \"Herald <herald@localhost>\", or unset it"
                ),
            ));
        }
        let smtp_provider = match &f.smtp_provider {
            None => None,
            // It names the relay smtp_url points at: without one it would be ignored silently.
            Some(_) if f.smtp_url.is_none() => {
                return Err(invalid(
                    "smtp_provider",
                    "names the relay smtp_url points at, and no smtp_url is set; set \
                     HERALD_SMTP_URL (or smtp_url in the file), or unset HERALD_SMTP_PROVIDER",
                ));
            }
            Some(p) => Some(p.parse::<RelayProvider>().map_err(|e| {
                invalid(
                    "smtp_provider",
                    format!("{e}; set HERALD_SMTP_PROVIDER (or smtp_provider in the file) to the relay smtp_url points at, or unset it"),
                )
            })?),
        };
        let dkim = dkim_signer(f.dkim_selector, f.dkim_domain, f.dkim_key_file)?;
        let status_callbacks = match f.status_callbacks {
            None => None,
            Some(c) => {
                let name = crate::domain::endpoint_name(&c.destination).unwrap_or("");
                if !endpoints.contains_key(name) {
                    return Err(invalid(
                        "status_callbacks.destination",
                        "must be endpoint:NAME of an endpoint configured under [endpoints.NAME]",
                    ));
                }
                if let Some(t) = c
                    .event_types
                    .iter()
                    .find(|t| crate::reconcile::precedence(t).is_none())
                {
                    return Err(invalid(
                        "status_callbacks.event_types",
                        format!(
                            "{t:?} is not a delivery status; use some of: {}",
                            crate::reconcile::PRECEDENCE.join(", ")
                        ),
                    ));
                }
                Some(StatusCallbacks {
                    destination: c.destination,
                    event_types: c.event_types,
                })
            }
        };
        // At most ten years: far larger values overflowed the deadline's arithmetic (a panic in
        // every deadline pass); "never" is not a deadline.
        let unconfirmed_deadline = Duration::from_secs(at_most(
            "unconfirmed_deadline_seconds",
            positive(
                "unconfirmed_deadline_seconds",
                f.unconfirmed_deadline_seconds.unwrap_or(3 * 86_400),
            )?,
            10 * 365 * 86_400,
        )?);
        let body_read_timeout = Duration::from_millis(at_most(
            "body_read_timeout_ms",
            positive(
                "body_read_timeout_ms",
                f.body_read_timeout_ms.unwrap_or(30_000),
            )?,
            3_600_000,
        )?);
        let shutdown_timeout = Duration::from_secs(positive(
            "shutdown_timeout_seconds",
            f.shutdown_timeout_seconds.unwrap_or(20),
        )?);
        let reconcile_interval = Duration::from_millis(positive(
            "reconcile_interval_ms",
            f.reconcile_interval_ms.unwrap_or(1000),
        )?);
        let sender_batch_size = f.sender_batch_size.unwrap_or(100).clamp(1, 1000);
        let sender_concurrency = f.sender_concurrency.unwrap_or(64).clamp(1, 1024);
        let warnings: Vec<String> = endpoints
            .values()
            .filter_map(Endpoint::header_warning)
            .map(|w| {
                format!(
                    "{}: {} (sent as configured; a message may not)",
                    w.field, w.message
                )
            })
            .collect();
        let empty_env: Vec<String> = env
            .iter()
            .filter(|(k, v)| is_herald_variable(k) && read.contains(*k) && v.trim().is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        let unread_env: Vec<String> = env
            .keys()
            .filter(|k| is_herald_variable(k) && !read.contains(*k))
            // Read by the test harness, the benchmark and the scripts, not by Herald.
            .filter(|k| {
                ![
                    "HERALD_TEST_",
                    "HERALD_BENCH_",
                    "HERALD_FUZZ_",
                    "HERALD_TOOLS",
                    "HERALD_DRILL_",
                    "HERALD_PROPTEST_",
                    "HERALD_UPDATE_SCREENSHOTS",
                ]
                .iter()
                .any(|p| k.starts_with(p))
            })
            .cloned()
            .collect();
        let database_idle_in_transaction = match f.database_idle_in_transaction_ms {
            None => crate::storage::IDLE_IN_TRANSACTION,
            // Below a second it would end Herald's own transactions between two statements.
            Some(ms @ 1..=999) => {
                return Err(invalid(
                    "database_idle_in_transaction_ms",
                    format!(
                        "{ms} ms would end Herald's own transactions; set \
                         HERALD_DATABASE_IDLE_IN_TRANSACTION_MS to 0 (the server's setting) or \
                         1000 or more"
                    ),
                ));
            }
            Some(ms) => Duration::from_millis(at_most(
                "database_idle_in_transaction_ms",
                ms,
                i32::MAX as u64,
            )?),
        };
        // Checked with the rest of the configuration (it was found only at bind time, after the
        // database was opened and migrated, and named no setting).
        let listen = f
            .listen
            .map(|l| l.trim().to_owned())
            .unwrap_or_else(|| "127.0.0.1:8080".into());
        // Its shape only (a host and a port): resolving a name here would make every command
        // depend on the resolver, `explain` and `healthcheck` included, which bind nothing.
        {
            let shaped = listen.parse::<std::net::SocketAddr>().is_ok()
                || listen.rsplit_once(':').is_some_and(|(host, port)| {
                    !host.is_empty()
                        && !host.contains(['/', ':', '[', ']', ' '])
                        && port.parse::<u16>().is_ok()
                });
            if !shaped {
                return Err(invalid(
                    "listen",
                    format!(
                        "{listen:?} is not an address to listen on: HOST:PORT, as 127.0.0.1:8080, \
                         0.0.0.0:8080 or [::1]:8080"
                    ),
                ));
            }
        }
        Ok(Settings {
            unread_env,
            empty_env,
            warnings,
            database_url: f
                .database_url
                .unwrap_or_else(|| Secret::new("sqlite://herald.db")),
            database_pool_size: f.database_pool_size.unwrap_or(10).max(2),
            database_idle_in_transaction,
            listen,
            webhook_secret,
            tokens,
            poll_interval,
            lease: timings.lease,
            longest_send: timings.longest_send,
            webhook_timeout: timings.webhook_timeout,
            webhook_connect_timeout: timings.webhook_connect_timeout,
            retry,
            sender_batch_size,
            sender_concurrency,
            sender_enabled: f.sender_enabled.unwrap_or(true),
            listen_notify: f.listen_notify.unwrap_or(true),
            max_payload_bytes: positive(
                "max_payload_bytes",
                f.max_payload_bytes.unwrap_or(256 * 1024) as u64,
            )? as usize,
            smtp_url: f.smtp_url,
            smtp_timeout: timings.smtp_timeout,
            smtp_pool_size,
            smtp_idle_timeout,
            smtp_pipelining: f.smtp_pipelining.unwrap_or(true),
            smtp_chunking: f.smtp_chunking.unwrap_or(true),
            smtp_noop_after_idle,
            smtp_ca,
            smtp_credentials,
            mail_dir: f.mail_dir.unwrap_or_else(|| PathBuf::from("mail")),
            mail_from,
            message_id_domain,
            smtp_provider,
            dkim,
            endpoints,
            endpoint_retry,
            ingest_max_body_bytes: positive(
                "ingest_max_body_bytes",
                f.ingest_max_body_bytes.unwrap_or(1024 * 1024) as u64,
            )? as usize,
            body_read_timeout,
            sources,
            reconcile_interval,
            reconcile_batch_size: f.reconcile_batch_size.unwrap_or(500).clamp(1, 10_000),
            unconfirmed_deadline,
            shutdown_timeout,
            status_callbacks,
            limits,
            allow_networks,
            log_format,
            retention,
        })
    }

    /// `(endpoint, pattern)` for every `event_types` entry of every endpoint: what Herald stores
    /// in `herald_subscriptions` at start-up.
    pub fn subscriptions(&self) -> Vec<(String, String)> {
        self.endpoints
            .values()
            .flat_map(|e| e.event_types.iter().map(|t| (e.name.clone(), t.clone())))
            .collect()
    }

    /// With two or more receipt sources, those without `matches`: each may settle any message,
    /// another provider's too (warned about at start). One source alone speaks for everything
    /// it is sent anyway.
    pub fn sources_speaking_for_every_message(&self) -> Vec<&str> {
        if self.sources.len() < 2 {
            return Vec::new();
        }
        self.sources
            .values()
            .filter(|s| s.matches.is_empty())
            .map(|s| s.name.as_str())
            .collect()
    }
}

/// The `retention_*` keys, checked: a batch of 1–10,000 rows, an interval of at least a second.
fn retention_config(f: &FileConfig) -> Result<crate::retention::RetentionConfig, ConfigError> {
    let d = crate::retention::RetentionConfig::default();
    let batch_size = match f.retention_batch_size {
        None => d.batch_size,
        Some(n @ 1..=10_000) => n,
        Some(n) => {
            return Err(invalid(
                "retention_batch_size",
                format!(
                    "{n} is not in 1–10000; set HERALD_RETENTION_BATCH_SIZE to the rows one \
                     retention transaction may delete, or unset it (default {})",
                    d.batch_size
                ),
            ));
        }
    };
    let interval = Duration::from_secs(positive(
        "retention_interval_seconds",
        f.retention_interval_seconds.unwrap_or(d.interval.as_secs()),
    )?);
    Ok(crate::retention::RetentionConfig {
        delivered_days: f.retention_delivered_days.unwrap_or(d.delivered_days),
        dead_letter_days: f.retention_dead_letter_days.unwrap_or(d.dead_letter_days),
        unmatched_receipt_days: f
            .retention_unmatched_receipt_days
            .unwrap_or(d.unmatched_receipt_days),
        batch_size,
        interval,
    })
}

/// The per-destination limits: the default cap on sends in flight to one destination (half the
/// sender's slots, so that one slow destination never takes them all), the SMTP relay's, and
/// `[destinations."HOST"]`.
fn limits_config(
    f: &FileConfig,
    sender_concurrency: u32,
) -> Result<crate::sender::LimitsConfig, ConfigError> {
    use crate::channels::Limit;
    let field = |e: crate::domain::InvalidField| invalid(e.field, e.message);
    let default_max_in_flight = match f.destination_max_in_flight {
        Some(n) if n >= 1 => n,
        Some(_) => {
            return Err(invalid(
                "destination_max_in_flight",
                "must be at least 1; set HERALD_DESTINATION_MAX_IN_FLIGHT to the most sends in \
                 flight to one destination, or unset it (default: half of sender_concurrency)",
            ));
        }
        None => (sender_concurrency / 2).max(1),
    };
    let smtp = Limit::parse(
        "smtp",
        f.smtp_rate_limit_per_second,
        f.smtp_burst,
        f.smtp_max_in_flight,
    )
    .map_err(|e| invalid(e.field.replacen("smtp.", "smtp_", 1), e.message))?;
    let mut hosts = BTreeMap::new();
    for (host, d) in &f.destinations {
        let key = format!("destinations.{host}");
        if host.is_empty() || host.contains(['/', '@', ' ']) {
            return Err(invalid(
                key,
                "must be a host (any port) or host:port, without a scheme or path",
            ));
        }
        let limit =
            Limit::parse(&key, d.rate_limit_per_second, d.burst, d.max_in_flight).map_err(field)?;
        // Two keys for one destination (`127.0.0.1:9` and `[::ffff:127.0.0.1]:9`): which one
        // counted would be a guess (the looser did; a re-check walk-through).
        let matched = destination_host(&key, host)?;
        if hosts.insert(matched.clone(), limit).is_some() {
            return Err(invalid(
                key,
                format!("names the same destination as another [destinations] key ({matched})"),
            ));
        }
    }
    Ok(crate::sender::LimitsConfig {
        default_max_in_flight,
        hosts,
        smtp,
    })
}

/// A `[destinations."HOST[:PORT]"]` key as destinations are matched: lower case, an IPv4-mapped
/// IPv6 address as its IPv4 address (as a URL's is, `webhook::Bound`); a port must be one that
/// can be connected to (`127.0.0.1:99999` was taken and never matched anything; an operator's
/// walk-through).
fn destination_host(key: &str, host: &str) -> Result<String, ConfigError> {
    let host = host.to_ascii_lowercase();
    let (name, port) = match host.rsplit_once(':') {
        // `host:port`, `[v6]:port`; not a bare IPv6 address's colons.
        Some((name, port)) if name.ends_with(']') || !name.contains(':') => (name, Some(port)),
        _ => (host.as_str(), None),
    };
    let port = match port.map(|p| (p, p.parse::<u16>())) {
        Some((_, Ok(n @ 1..))) => Some(n),
        Some((p, _)) => {
            return Err(invalid(key, format!("{p:?} is not a port (1 to 65535)")));
        }
        None => None,
    };
    let name = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .and_then(|n| n.parse::<std::net::Ipv6Addr>().ok())
        .and_then(|a| a.to_ipv4_mapped())
        .map_or_else(|| name.to_owned(), |v4| v4.to_string());
    Ok(match port {
        Some(port) => format!("{name}:{port}"),
        None => name,
    })
}

/// `dkim_selector`, `dkim_domain` and `dkim_key_file` together, the key read and checked now;
/// none of them: no signature. The key is never quoted.
fn dkim_signer(
    selector: Option<String>,
    domain: Option<String>,
    key_file: Option<PathBuf>,
) -> Result<Option<Arc<DkimSigner>>, ConfigError> {
    let (selector, domain, key_file) = match (selector, domain, key_file) {
        (None, None, None) => return Ok(None),
        (Some(s), Some(d), Some(k)) => (s, d, k),
        (s, d, k) => {
            let missing: Vec<&str> = [
                ("dkim_selector", s.is_none()),
                ("dkim_domain", d.is_none()),
                ("dkim_key_file", k.is_none()),
            ]
            .into_iter()
            .filter_map(|(name, absent)| absent.then_some(name))
            .collect();
            return Err(invalid(
                missing[0],
                format!(
                    "DKIM needs dkim_selector, dkim_domain and dkim_key_file together; set {} too, or unset the others",
                    missing
                        .iter()
                        .map(|m| env_name(m))
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            ));
        }
    };
    DkimSigner::load(&selector, &domain, &key_file)
        .map(|s| Some(Arc::new(s)))
        .map_err(|e| match &e {
            DkimError::Name(name) => invalid(
                *name,
                format!(
                    "must be a DNS name (letters, digits, - and _ labels); set {} to the \
                     selector and domain whose SELECTOR._domainkey.DOMAIN record holds the \
                     public key",
                    env_name(name)
                ),
            ),
            other => invalid(
                "dkim_key_file",
                format!(
                    "{}: {other}{}; set HERALD_DKIM_KEY_FILE to an unencrypted RSA or Ed25519 \
                     private key in PEM (e.g. openssl genpkey -algorithm ed25519), or unset the \
                     dkim_* settings",
                    key_file.display(),
                    std::error::Error::source(other)
                        .map(|c| format!(" ({c})"))
                        .unwrap_or_default()
                ),
            ),
        })
}

/// Why `smtp_url` is refused, without its value (it may carry a password).
fn smtp_url_refusal(e: &EmailConfigError) -> String {
    let why = match e {
        EmailConfigError::SmtpUrl(Some(cause)) => format!("not a valid URL ({cause})"),
        EmailConfigError::SmtpUrl(None) => {
            "not one of the accepted smtp:// or smtps:// forms".into()
        }
        EmailConfigError::SmtpUrlPart(part) => (*part).to_owned(),
        EmailConfigError::TlsHost(_) => "its host is not a valid name for TLS".into(),
        EmailConfigError::MailFrom(_) => "not valid".into(),
        EmailConfigError::CleartextCredentials => {
            return "it carries credentials (or smtp_username is set) but would send them in clear: \
                    use smtps://… or smtp://…?tls=required for a relay on another host; the value \
                    is not shown"
                .into();
        }
    };
    format!(
        "{why}; the value is not shown, it may hold a password; set HERALD_SMTP_URL (or smtp_url \
         in the file) to smtp://host[:port], smtp://host[:port]?tls=required (or opportunistic) \
         or smtps://[user:pass@]host[:port], credentials percent-encoded"
    )
}

/// The environment variable of a file key: `lease_seconds` → `HERALD_LEASE_SECONDS`.
fn env_name(key: &str) -> String {
    format!("HERALD_{}", key.to_ascii_uppercase())
}

/// `v` unless it is over `max`.
fn at_most(name: &str, v: u64, max: u64) -> Result<u64, ConfigError> {
    if v > max {
        Err(invalid(
            name,
            format!(
                "{v} is more than the {max} this setting takes; set {} to at most {max}",
                env_name(name)
            ),
        ))
    } else {
        Ok(v)
    }
}

fn positive(name: &str, v: u64) -> Result<u64, ConfigError> {
    if v == 0 {
        Err(invalid(
            name,
            format!(
                "must be greater than 0; set {} to a positive value",
                env_name(name)
            ),
        ))
    } else {
        Ok(v)
    }
}

/// The longest lease accepted (a day).
const MAX_LEASE_SECONDS: u64 = 86_400;

/// Defaults of the send and lease timings.
const DEFAULT_WEBHOOK_TIMEOUT_MS: u64 = 15_000;
const DEFAULT_CONNECT_TIMEOUT_MS_MAX: u64 = 5_000;
const DEFAULT_SMTP_TIMEOUT_MS: u64 = 30_000;
const DEFAULT_LEASE_SECONDS: u64 = 60;
/// How much longer than the longest send a lease lasts at least.
const LEASE_MARGIN_MS: u64 = 5_000;

/// The send timeouts and the lease, resolved together: a default that depends on another setting
/// follows it, and only values set explicitly are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Timings {
    lease: Duration,
    longest_send: Duration,
    webhook_timeout: Duration,
    webhook_connect_timeout: Duration,
    smtp_timeout: Duration,
}

impl Timings {
    /// - connect timeout: default `min(5000, webhook_timeout_ms / 2)`; an explicit value must be
    ///   below `webhook_timeout_ms` (a request still connecting when the total fires would count
    ///   as ambiguous although it never left).
    /// - lease: default `max(60 s, longest send timeout + 5 s)`, where the longest send timeout
    ///   counts `smtp_timeout_ms` only when SMTP is configured (`.eml` files have none); an
    ///   explicit lease must exceed it by 5 s, or a slow send would be claimed twice.
    fn resolve(
        lease_seconds: Option<u64>,
        webhook_timeout_ms: Option<u64>,
        connect_timeout_ms: Option<u64>,
        smtp_timeout_ms: Option<u64>,
        smtp_configured: bool,
    ) -> Result<Self, ConfigError> {
        let total_ms = positive(
            "webhook_timeout_ms",
            webhook_timeout_ms.unwrap_or(DEFAULT_WEBHOOK_TIMEOUT_MS),
        )?;
        let default_connect_ms = (total_ms / 2).clamp(1, DEFAULT_CONNECT_TIMEOUT_MS_MAX);
        let connect_ms = match connect_timeout_ms {
            None => default_connect_ms,
            Some(ms) => {
                let ms = positive("webhook_connect_timeout_ms", ms)?;
                if ms >= total_ms {
                    return Err(invalid(
                        "webhook_connect_timeout_ms",
                        format!(
                            "{ms} ms must be shorter than webhook_timeout_ms ({total_ms} ms); \
                             set HERALD_WEBHOOK_CONNECT_TIMEOUT_MS below {total_ms} or unset it \
                             (default min(5000, webhook_timeout_ms / 2) = {default_connect_ms})"
                        ),
                    ));
                }
                ms
            }
        };
        let smtp_ms = positive(
            "smtp_timeout_ms",
            smtp_timeout_ms.unwrap_or(DEFAULT_SMTP_TIMEOUT_MS),
        )?;
        let (longest_key, longest_ms) = if smtp_configured && smtp_ms > total_ms {
            ("smtp_timeout_ms", smtp_ms)
        } else {
            ("webhook_timeout_ms", total_ms)
        };
        // Saturating: a timeout near u64::MAX wrapped to a few seconds and let any lease pass.
        let needed_ms = longest_ms.saturating_add(LEASE_MARGIN_MS);
        let needed_s = needed_ms.div_ceil(1000);
        let lease_s = match lease_seconds {
            None => DEFAULT_LEASE_SECONDS.max(needed_s),
            Some(s) => {
                let s = positive("lease_seconds", s)?;
                if s.saturating_mul(1000) < needed_ms {
                    return Err(invalid(
                        "lease_seconds",
                        format!(
                            "{s} s must exceed the longest send timeout ({longest_key} = \
                             {longest_ms} ms) by at least 5 s; set HERALD_LEASE_SECONDS to \
                             {needed_s} or more, lower {}, or unset it (default \
                             max(60, longest send timeout + 5 s))",
                            env_name(longest_key)
                        ),
                    ));
                }
                s
            }
        };
        // A lease of more than a day: a crash would hold its rows for that long, and far larger
        // values overflowed the lease's arithmetic (SQLite) or PostgreSQL's interval. Send
        // timeouts that need one are refused with it, naming the timeout when the lease was
        // left to follow it.
        if lease_seconds.is_none() && lease_s > MAX_LEASE_SECONDS {
            return Err(invalid(
                longest_key,
                format!(
                    "{longest_ms} ms needs a lease of {lease_s} s, more than the {MAX_LEASE_SECONDS} s \
                     a lease may be; set {} to at most {} ms",
                    env_name(longest_key),
                    MAX_LEASE_SECONDS * 1000 - LEASE_MARGIN_MS
                ),
            ));
        }
        let lease_s = at_most("lease_seconds", lease_s, MAX_LEASE_SECONDS)?;
        Ok(Self {
            lease: Duration::from_secs(lease_s),
            longest_send: Duration::from_millis(longest_ms),
            webhook_timeout: Duration::from_millis(total_ms),
            webhook_connect_timeout: Duration::from_millis(connect_ms),
            smtp_timeout: Duration::from_millis(smtp_ms),
        })
    }
}

/// The endpoint's policy over the global one; a refusal names `endpoints.NAME.retry.KEY`.
pub fn endpoint_retry_policy(
    r: &EndpointRetryConfig,
    endpoint: &str,
    global: &RetryPolicy,
) -> Result<RetryPolicy, crate::domain::InvalidField> {
    let key = format!("endpoints.{endpoint}.retry");
    // Each default follows the other key where that one is set, as the global pair's does
    // ([`retry_defaults`]): setting only one never makes the cap fall below the base.
    let usable = |v: f64| v.is_finite() && v > 0.0;
    let base = r.base_seconds.unwrap_or_else(|| match r.cap_seconds {
        Some(c) if usable(c) => global.base.as_secs_f64().min(c),
        _ => global.base.as_secs_f64(),
    });
    let cap = r
        .cap_seconds
        .unwrap_or_else(|| global.cap.as_secs_f64().max(base));
    RetryPolicy::new(
        r.name
            .clone()
            .unwrap_or_else(|| format!("endpoint-{endpoint}")),
        base,
        cap,
        r.max_attempts.unwrap_or(global.max_attempts),
        r.retry_after_max_seconds
            .unwrap_or(global.retry_after_max.as_secs_f64()),
        r.jitter.unwrap_or(global.jitter),
    )
    .map_err(|e| {
        let field = match e.field.as_str() {
            "retry_base_seconds" => "base_seconds",
            "retry_cap_seconds" => "cap_seconds",
            "retry_max_attempts" => "max_attempts",
            "retry_jitter" => "jitter",
            "retry_policy_name" => "name",
            other => other,
        };
        // The refusal's words name the endpoint's keys too (`must not be below base_seconds`).
        let message = e.message.replace("retry_base_seconds", "base_seconds");
        crate::domain::InvalidField::new(format!("{key}.{field}"), message)
    })
}

/// Backoff base and cap: each default follows the other setting when that one is set, so
/// setting only one never makes `cap < base` (an explicit pair is still checked).
fn retry_defaults(base: Option<f64>, cap: Option<f64>) -> (f64, f64) {
    const BASE: f64 = 5.0;
    const CAP: f64 = 21_600.0;
    let usable = |v: f64| v.is_finite() && v > 0.0;
    match (base, cap) {
        (Some(b), Some(c)) => (b, c),
        (Some(b), None) => (b, if usable(b) { CAP.max(b) } else { CAP }),
        (None, Some(c)) => (if usable(c) { BASE.min(c) } else { BASE }, c),
        (None, None) => (BASE, CAP),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn destination_keys_are_matched_as_destinations_are() {
        let build = |key: &str| {
            Settings::from_toml(&format!(
                "[destinations.\"{key}\"]\nrate_limit_per_second = 2\n"
            ))
        };
        for (key, as_matched) in [
            ("API.example.com", "api.example.com"),
            ("api.example.com:0443", "api.example.com:443"),
            ("[::ffff:127.0.0.1]:9000", "127.0.0.1:9000"),
            ("[::1]:8080", "[::1]:8080"),
        ] {
            let s = build(key).unwrap();
            let hosts: Vec<&String> = s.limits.hosts.keys().collect();
            assert_eq!(hosts, [as_matched], "{key}");
        }
        for bad in ["127.0.0.1:99999", "127.0.0.1:0", "h:x"] {
            let e = build(bad).unwrap_err().to_string();
            assert!(e.contains("is not a port (1 to 65535)"), "{bad}: {e}");
        }
        let e = Settings::from_toml(
            "[destinations.\"127.0.0.1:9\"]\nrate_limit_per_second = 1\n\
             [destinations.\"[::ffff:127.0.0.1]:9\"]\nrate_limit_per_second = 5\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("names the same destination as another"), "{e}");
    }

    #[test]
    fn body_limits_of_zero_are_refused() {
        for key in ["max_payload_bytes", "ingest_max_body_bytes"] {
            let e = Settings::from_toml(&format!("{key} = 0\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains("greater than 0"), "{e}");
        }
    }

    #[test]
    fn mail_settings_that_would_be_ignored_or_malformed_are_refused() {
        let build = |toml: &str| Settings::from_toml(toml);
        // Credentials without a relay: mail would go to files, the credentials unused.
        let e = build("smtp_username = \"u\"\nsmtp_password = \"pw-123\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("smtp_url is not") && !e.contains("pw-123"),
            "{e}"
        );
        // The Message-ID's domain: a domain or an address literal, nothing else.
        for bad in ["my company", "a\\r\\nBcc: x", "", "ex@mple.com"] {
            let e = build(&format!("message_id_domain = \"{bad}\"\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("message_id_domain"), "{bad}: {e}");
        }
        for good in ["mail.example.com", "herald.localhost", "[192.0.2.1]"] {
            let s = build(&format!("message_id_domain = \"{good}\"\n")).unwrap();
            assert_eq!(s.message_id_domain, good);
        }
    }

    #[test]
    fn smtp_credentials_never_cross_the_network_in_clear() {
        let build = |toml: &str| Settings::from_toml(toml);
        for refused in [
            "smtp_url = \"smtp://u:p@mail.example\"\n",
            "smtp_url = \"smtp://u:p@mail.example?tls=opportunistic\"\n",
            "smtp_url = \"smtp://mail.example\"\nsmtp_username = \"u\"\nsmtp_password = \"p\"\n",
        ] {
            let e = build(refused).unwrap_err().to_string();
            assert!(
                e.contains("smtp_url") && e.contains("in clear"),
                "{refused}: {e}"
            );
            assert!(!e.contains("u:p"), "{e}");
        }
        for accepted in [
            "smtp_url = \"smtp://u:p@mail.example?tls=required\"\n",
            "smtp_url = \"smtps://u:p@mail.example\"\n",
            "smtp_url = \"smtp://u:p@127.0.0.1:2525\"\n",
            "smtp_url = \"smtp://u:p@localhost\"\n",
            "smtp_url = \"smtp://mail.example\"\n",
        ] {
            assert!(build(accepted).is_ok(), "{accepted}");
        }
        let s = build("smtp_url = \"smtps://mail.example\"\nsmtp_username = \"AKIAEXAMPLEUSER\"\nsmtp_password = \"pw-123\"\n").unwrap();
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("AKIAEXAMPLEUSER") && !shown.contains("pw-123"),
            "{shown}"
        );
    }

    #[test]
    fn retention_keys_from_the_file_and_the_environment() {
        let s = Settings::build(FileConfig::default(), &BTreeMap::new()).unwrap();
        assert_eq!(s.retention, crate::retention::RetentionConfig::default());
        let s = Settings::from_toml("retention_delivered_days = 0\nretention_batch_size = 7\n")
            .unwrap();
        assert_eq!((s.retention.delivered_days, s.retention.batch_size), (0, 7));
        let s = Settings::load_from(
            None,
            &env(&[
                ("HERALD_RETENTION_DEAD_LETTER_DAYS", "365"),
                ("HERALD_RETENTION_UNMATCHED_RECEIPT_DAYS", "5"),
                ("HERALD_RETENTION_INTERVAL_SECONDS", "60"),
            ]),
        )
        .unwrap();
        assert_eq!(s.retention.dead_letter_days, 365);
        assert_eq!(s.retention.unmatched_receipt_days, 5);
        assert_eq!(s.retention.interval, Duration::from_secs(60));
        for (bad, key) in [
            ("retention_batch_size = 0", "retention_batch_size"),
            ("retention_batch_size = 10001", "retention_batch_size"),
            (
                "retention_interval_seconds = 0",
                "retention_interval_seconds",
            ),
        ] {
            let err = Settings::from_toml(bad).unwrap_err();
            assert!(err.to_string().starts_with(key), "{err}");
        }
    }

    #[test]
    fn an_endpoint_retry_policy_inherits_the_global_keys_and_is_versioned() {
        let s = Settings::from_toml(
            "retry_max_attempts = 6\nretry_jitter = 0.1\n\
             [endpoints.a]\nurl = \"https://a.example/h\"\nordering_policy = \"skip\"\n\
             [endpoints.a.retry]\nbase_seconds = 2\nmax_attempts = 3\n\
             [endpoints.b]\nurl = \"https://b.example/h\"\n",
        )
        .unwrap();
        let a = &s.endpoint_retry["a"];
        assert_eq!((a.base, a.max_attempts), (Duration::from_secs(2), 3));
        assert_eq!(
            (a.cap, a.jitter),
            (s.retry.cap, 0.1),
            "left out: the global value"
        );
        assert!(a.version.starts_with("endpoint-a@"), "{}", a.version);
        assert_ne!(a.version, s.retry.version);
        assert!(!s.endpoint_retry.contains_key("b"));
        assert_eq!(
            s.endpoints["a"].ordering_policy,
            Some(crate::domain::OrderingPolicy::Skip)
        );
        assert_eq!(s.endpoints["b"].ordering_policy, None);
        // Same parameters, same version; another parameter, another version.
        let again = |extra: &str| {
            Settings::from_toml(&format!(
                "[endpoints.a]\nurl = \"https://a.example/h\"\n[endpoints.a.retry]\nname = \"x\"\n{extra}"
            ))
            .unwrap()
            .endpoint_retry["a"]
            .version
            .clone()
        };
        assert_eq!(again("base_seconds = 1\n"), again("base_seconds = 1\n"));
        assert_ne!(again("base_seconds = 1\n"), again("base_seconds = 3\n"));
        assert!(again("").starts_with("x@"));
        // Only the cap, below the global base: the base follows it down, as the global pair's.
        let s = Settings::from_toml(
            "retry_base_seconds = 5\n[endpoints.a]\nurl = \"https://a.example/h\"\n\
             [endpoints.a.retry]\ncap_seconds = 2\n",
        )
        .unwrap();
        let a = &s.endpoint_retry["a"];
        assert_eq!(
            (a.base, a.cap),
            (Duration::from_secs(2), Duration::from_secs(2))
        );
        for (bad, field) in [
            ("jitter = 2", "endpoints.a.retry.jitter"),
            ("max_attempts = 0", "endpoints.a.retry.max_attempts"),
            (
                "base_seconds = 10\ncap_seconds = 5",
                "endpoints.a.retry.cap_seconds",
            ),
            ("name = \"a b\"", "endpoints.a.retry.name"),
        ] {
            let err = Settings::from_toml(&format!(
                "[endpoints.a]\nurl = \"https://a.example/h\"\n[endpoints.a.retry]\n{bad}\n"
            ))
            .unwrap_err();
            assert!(err.to_string().starts_with(field), "{bad}: {err}");
            assert!(
                !err.to_string().contains("retry_"),
                "the endpoint's keys: {err}"
            );
        }
        let err = Settings::from_toml(
            "[endpoints.a]\nurl = \"https://a.example/h\"\nordering_policy = \"later\"\n",
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with("endpoints.a.ordering_policy"),
            "{err}"
        );
    }

    #[test]
    fn endpoint_subscriptions_are_checked_and_listed() {
        let s = Settings::from_toml(
            "[endpoints.a]\nurl = \"https://a.example/h\"\nevent_types = [\"order.*\", \"*\"]\n\
             [endpoints.b]\nurl = \"https://b.example/h\"\nevent_types = [\"x.y\"]\n\
             [endpoints.c]\nurl = \"https://c.example/h\"\n",
        )
        .unwrap();
        assert_eq!(
            s.subscriptions(),
            [
                ("a".to_owned(), "order.*".to_owned()),
                ("a".to_owned(), "*".to_owned()),
                ("b".to_owned(), "x.y".to_owned())
            ]
        );
        for bad in [
            "[endpoints.a]\nurl = \"https://a.example/h\"\nevent_types = [\"order*\"]\n",
            "[endpoints.a]\nurl = \"https://a.example/h\"\nevent_types = [\"\"]\n",
        ] {
            let err = Settings::from_toml(bad).unwrap_err();
            assert!(err.to_string().contains(".event_types"), "{err}");
        }
    }

    #[test]
    fn the_example_config_is_valid() {
        let example = include_str!("../herald.example.toml");
        let s = Settings::from_toml(example).expect("herald.example.toml parses and validates");
        assert_eq!(
            s.webhook_connect_timeout,
            std::time::Duration::from_millis(5000)
        );
        // Its top-level keys uncommented (those naming files aside) are valid too: each one is a
        // real key, with a value Herald accepts.
        let top: String = example
            .lines()
            .take_while(|l| !l.starts_with("# [") && !l.starts_with('['))
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| {
                let key = l.split('=').next().unwrap_or("").trim();
                l.contains(" = ")
                    && !key.is_empty()
                    && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                    && !matches!(
                        key,
                        "smtp_ca_file" | "dkim_key_file" | "dkim_selector" | "dkim_domain"
                    )
            })
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(top.lines().count() > 30, "{top}");
        Settings::from_toml(&top).unwrap_or_else(|e| panic!("{e}\n{top}"));
    }

    /// Every key of the file is in herald.example.toml and, with its HERALD_* variable, in the
    /// README's Configuration: adding a key without documenting it fails here.
    #[test]
    fn every_key_is_documented() {
        let example = include_str!("../herald.example.toml");
        let readme = include_str!("../README.md");
        let keys = field_names::<FileConfig>();
        assert!(
            keys.contains(&"allow_networks") && keys.len() > 40,
            "{keys:?}"
        );
        for key in keys {
            if matches!(
                *key,
                "endpoints" | "sources" | "status_callbacks" | "tokens" | "destinations"
            ) {
                assert!(
                    example.contains(&format!("# [{key}")),
                    "{key} not in the example"
                );
                assert!(
                    readme.contains(&format!("[{key}")),
                    "{key} not in the README"
                );
                continue;
            }
            assert!(
                example.contains(&format!("\n# {key} = ")),
                "{key} is not in herald.example.toml as `# {key} = DEFAULT`"
            );
            let var = format!("`{}`", env_name(key));
            assert!(readme.contains(&var), "{var} is not in the README");
        }
    }

    #[test]
    fn defaults_match_the_interface_contract() {
        let s = Settings::build(FileConfig::default(), &BTreeMap::new()).unwrap();
        assert_eq!(s.database_url.expose(), "sqlite://herald.db");
        assert_eq!(s.listen, "127.0.0.1:8080");
        assert_eq!(s.poll_interval, Duration::from_millis(1000));
        assert_eq!(s.lease, Duration::from_secs(60));
        assert_eq!(s.webhook_timeout, Duration::from_millis(15_000));
        assert_eq!(s.mail_dir, PathBuf::from("mail"));
        assert!(s.webhook_secret.is_none() && s.tokens.is_empty());
    }

    #[test]
    fn environment_overrides_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.toml");
        std::fs::write(
            &path,
            "lease_seconds = 120\npoll_interval_ms = 50\nlisten = \"127.0.0.1:9\"\n",
        )
        .unwrap();
        let s = Settings::load_from(
            Some(&path),
            &env(&[
                ("HERALD_POLL_INTERVAL_MS", "250"),
                ("HERALD_RETRY_BASE_SECONDS", "0.5"),
                ("HERALD_RETRY_MAX_ATTEMPTS", "3"),
            ]),
        )
        .unwrap();
        assert_eq!(s.lease, Duration::from_secs(120));
        assert_eq!(s.poll_interval, Duration::from_millis(250));
        assert_eq!(s.listen, "127.0.0.1:9");
        assert_eq!(s.retry.max_attempts, 3);
        assert_eq!(s.retry.base, Duration::from_millis(500));
    }

    #[test]
    fn a_mailgun_tolerance_outlasting_its_replay_keys_is_refused() {
        let toml = |tolerance: u64, days: u32| {
            format!(
                "retention_unmatched_receipt_days = {days}\n\
                 [sources.mg]\nscheme = \"mailgun\"\nsecrets = [\"k\"]\n\
                 tolerance_seconds = {tolerance}\n"
            )
        };
        let err = Settings::from_toml(&toml(43_200, 1)).unwrap_err();
        assert!(
            err.to_string().starts_with("sources.mg.tolerance_seconds"),
            "{err}"
        );
        assert!(Settings::from_toml(&toml(43_199, 1)).is_ok());
        // Kept forever (0): any tolerance.
        assert!(Settings::from_toml(&toml(10_000_000, 0)).is_ok());
    }

    #[test]
    fn a_listen_address_is_checked_with_the_configuration() {
        for bad in [
            "127.0.0.1",
            ":18752",
            "http://127.0.0.1:8080",
            "127.0.0.1:99999",
            "",
        ] {
            let err = Settings::build(FileConfig::default(), &env(&[("HERALD_LISTEN", bad)]));
            // An empty variable is unset: the default.
            if bad.is_empty() {
                assert_eq!(err.unwrap().listen, "127.0.0.1:8080");
                continue;
            }
            let err = err.unwrap_err().to_string();
            assert!(err.starts_with("listen:"), "{bad}: {err}");
        }
        for good in [
            " 127.0.0.1:0",
            "[::1]:8080",
            "0.0.0.0:8080",
            "localhost:8080",
        ] {
            let s =
                Settings::build(FileConfig::default(), &env(&[("HERALD_LISTEN", good)])).unwrap();
            assert_eq!(s.listen, good.trim());
        }
    }

    #[test]
    fn variables_no_setting_reads_are_named() {
        let s = Settings::build(
            FileConfig::default(),
            &env(&[
                ("HERALD_LEASE_SECOND", "30"),
                ("HERALD_LEASE_SECONDS", "30"),
                ("HERALD_ALLOW_NETWORKS", "10.0.0.0/8"),
                ("HERALD_TEST_DATABASE_URL", "postgres://x@y/z"),
                ("HERALD_BENCH_HERALD", "/bin/x"),
                ("herald_lease_seconds", "30"),
            ]),
        )
        .unwrap();
        assert_eq!(
            s.unread_env,
            ["HERALD_LEASE_SECOND", "herald_lease_seconds"]
        );
        let s = Settings::build(
            FileConfig::default(),
            &env(&[("HERALD_API_TOKEN", ""), ("HERALD_LEASE_SECONDS", "")]),
        )
        .unwrap();
        assert_eq!(s.empty_env, ["HERALD_API_TOKEN", "HERALD_LEASE_SECONDS"]);
        assert_eq!(s.lease, Settings::from_toml("").unwrap().lease);
        let err = Settings::build(FileConfig::default(), &env(&[("HERALD_DATABASE_URL", "")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("HERALD_DATABASE_URL: is set but empty"),
            "{err}"
        );
        // The file's URL stands (Compose's `${DATABASE_URL:-}` beside a herald.toml that has it).
        let file = Settings::parse_file("database_url = \"sqlite:///tmp/h.db\"").unwrap();
        let s = Settings::build(file, &env(&[("HERALD_DATABASE_URL", "")])).unwrap();
        assert_eq!(s.empty_env, ["HERALD_DATABASE_URL"]);
        // Empty in the file: refused as a setting (it was a failure to open "(not a URL)").
        let err = Settings::from_toml("database_url = \"\"")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("database_url: is empty"), "{err}");
    }

    #[test]
    fn a_sources_matches_name_configured_endpoints_or_email() {
        let toml = |matches: &str| {
            format!(
                "[endpoints.sms]\nurl = \"https://sms.example/send\"\n\
                 [sources.s]\nscheme = \"stripe\"\nsecret = \"whsec_x\"\nmatches = {matches}\n"
            )
        };
        let s = Settings::from_toml(&toml(r#"["endpoint:sms", "email"]"#)).unwrap();
        assert_eq!(s.sources["s"].matches, ["endpoint:sms", "email"]);
        for bad in [r#"["endpoint:nope"]"#, r#"["sms"]"#, r#"["webhook"]"#] {
            let err = Settings::from_toml(&toml(bad)).unwrap_err().to_string();
            assert!(err.starts_with("sources.s.matches:"), "{bad}: {err}");
        }
    }

    #[test]
    fn sources_without_matches_are_named_only_beside_another_source() {
        let source = |name: &str, matches: &str| {
            format!("[sources.{name}]\nscheme = \"stripe\"\nsecret = \"whsec_x\"\n{matches}")
        };
        let one = Settings::from_toml(&source("a", "")).unwrap();
        assert!(one.sources_speaking_for_every_message().is_empty());
        let three = format!(
            "{}{}{}",
            source("a", ""),
            source("b", "matches = [\"email\"]\n"),
            source("c", "")
        );
        let three = Settings::from_toml(&three).unwrap();
        assert_eq!(three.sources_speaking_for_every_message(), ["a", "c"]);
        let bounded = format!(
            "{}{}",
            source("a", "matches = [\"email\"]\n"),
            source("b", "matches = [\"email\"]\n")
        );
        let bounded = Settings::from_toml(&bounded).unwrap();
        assert!(bounded.sources_speaking_for_every_message().is_empty());
    }

    #[test]
    fn bad_values_name_the_key() {
        let none = || FileConfig::default();
        let err = Settings::build(none(), &env(&[("HERALD_LEASE_SECONDS", "soon")])).unwrap_err();
        assert!(err.to_string().starts_with("HERALD_LEASE_SECONDS"), "{err}");
        let err = Settings::build(none(), &env(&[("HERALD_LEASE_SECONDS", "10")])).unwrap_err();
        assert!(err.to_string().starts_with("lease_seconds"), "{err}");
        // Values past what the arithmetic takes (a panic, an overflowed interval) are refused.
        for (var, key) in [
            ("HERALD_LEASE_SECONDS", "lease_seconds"),
            (
                "HERALD_UNCONFIRMED_DEADLINE_SECONDS",
                "unconfirmed_deadline_seconds",
            ),
        ] {
            let err = Settings::build(none(), &env(&[(var, "18446744073709551615")])).unwrap_err();
            assert!(err.to_string().starts_with(key), "{err}");
        }
        let s = Settings::build(none(), &env(&[("HERALD_LEASE_SECONDS", "86400")])).unwrap();
        assert_eq!(s.lease, Duration::from_secs(86_400));
        // A send timeout near u64::MAX needs a lease past any: refused, with the lease set or
        // not (its margin wrapped to 4,999 ms and let every lease pass; a walk-through found it).
        let huge = "18446744073709551615";
        for vars in [
            vec![("HERALD_WEBHOOK_TIMEOUT_MS", huge)],
            vec![
                ("HERALD_WEBHOOK_TIMEOUT_MS", huge),
                ("HERALD_LEASE_SECONDS", "10"),
            ],
            vec![
                ("HERALD_SMTP_URL", "smtp://127.0.0.1:2525"),
                ("HERALD_SMTP_TIMEOUT_MS", huge),
            ],
        ] {
            let err = Settings::build(none(), &env(&vars))
                .unwrap_err()
                .to_string();
            assert!(
                ["webhook_timeout_ms:", "smtp_timeout_ms:", "lease_seconds:"]
                    .iter()
                    .any(|k| err.starts_with(k)),
                "{vars:?}: {err}"
            );
        }
        let err = Settings::from_toml("leese_seconds = 1").unwrap_err();
        assert!(matches!(err, ConfigError::Parse { line: 1, .. }), "{err}");
        // A key misspelled is named, and the keys it could be: they are the fix.
        let err = err.to_string();
        assert!(
            err.contains("unknown field `leese_seconds`, expected one of"),
            "{err}"
        );
        assert!(err.contains("`lease_seconds`"), "{err}");
        let err = Settings::from_toml("[endpoints.e]\nretry = {}\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing field `url`"), "{err}");
        let err = Settings::from_toml(
            "[endpoints.e]\nurl = \"https://a.example/h\"\nauth = { beaer = \"x\" }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("unknown variant `…`, expected `bearer` or `basic`"),
            "{err}"
        );
        // A token written where a table goes is read as a variant's name: never shown.
        let err = Settings::from_toml(
            "[endpoints.e]\nurl = \"https://a.example/h\"\nauth = \"sk_live_abc123\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(!err.contains("sk_live_abc123"), "{err}");
        assert!(err.contains("expected `bearer` or `basic`"), "{err}");

        // A value of the wrong kind names its key (under its table), never the value, in words.
        let err = Settings::from_toml("listen = \"127.0.0.1:1\"\nretention_delivered_days = -1\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with(
                "line 2 (retention_delivered_days): invalid value: integer `-1`, expected a whole number from 0 to 4294967295"
            ),
            "{err}"
        );
        // Never a value: a string serde quotes is masked, and a line that is no key of Herald's
        // (here a secret's base64 padding in a multi-line array) names no key.
        let err = Settings::from_toml("retry_max_attempts = \"s3cret\"\n")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
        assert!(
            err.contains("line 1 (retry_max_attempts): invalid type: string \"…\""),
            "{err}"
        );
        // Nor a number or a boolean written as a secret (a PIN as a password was shown), in a
        // table, an inline table or an array; a number elsewhere is shown, as above.
        for (toml, secret) in [
            ("smtp_password = 73310042\n", "73310042"),
            ("api_token = 1234567890123456789.5\n", "123456789"),
            ("webhook_secret = true\n", "true"),
            (
                "[sources.pm]\nscheme = \"postmark\"\nusername = \"u\"\npassword = 55501234\n",
                "55501234",
            ),
            (
                "[endpoints.e]\nurl = \"https://a.example/h\"\nauth = { bearer = 86753091 }\n",
                "86753091",
            ),
            (
                "[sources.x]\nscheme = \"hmac\"\nsecrets = [\n  24681357\n]\n",
                "24681357",
            ),
            (
                "[endpoints.e]\nurl = \"https://a.example/h\"\nheaders = { X-Api-Key = 12345678 }\n",
                "12345678",
            ),
        ] {
            let err = Settings::from_toml(toml).unwrap_err().to_string();
            assert!(!err.contains(secret), "{toml}: {err}");
            assert!(err.contains("`…`"), "{toml}: {err}");
        }
        let err = Settings::from_toml(
            "[sources.x]\nscheme = \"hmac\"\nsecrets = [\n  \"c2VjcmV0LWtleQ==\" \"next\"\n]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(!err.contains("c2VjcmV0LWtleQ"), "{err}");
        assert!(err.contains("line 4: "), "{err}");
        // A table header with a comment after it still names the table.
        let err = Settings::from_toml(
            "[endpoints.a]\nurl = \"https://a.example/h\"\n[endpoints.a.retry]  # billing\nmax_attempts = \"x\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("(endpoints.a.retry.max_attempts)"), "{err}");
        let err = Settings::from_toml(
            "[endpoints.a]\nurl = \"https://a.example/h\"\n[endpoints.a.retry]\nmax_attempts = \"x\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("line 4 (endpoints.a.retry.max_attempts): invalid type"),
            "{err}"
        );
        let err = Settings::from_toml("api_token = 5\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1 (api_token)"), "{err}");
        // A parse error never quotes the line: it may hold a secret.
        let err =
            Settings::from_toml("listen = \"x\"\ndatabse_url = \"postgres://u:hunter2@db/h\"")
                .unwrap_err();
        assert!(matches!(err, ConfigError::Parse { line: 2, .. }), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
        let err = Settings::build(
            none(),
            &env(&[("HERALD_WEBHOOK_CONNECT_TIMEOUT_MS", "20000")]),
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with("webhook_connect_timeout_ms"),
            "{err}"
        );
        let err = Settings::from_toml("[endpoints.a]\nurl = \"ftp://x\"").unwrap_err();
        assert!(err.to_string().starts_with("endpoints.a.url"), "{err}");
        // A name no message could write as `endpoint:NAME` is refused at load, not at the first
        // message (quoted: TOML would read `a.b` as a table in a table).
        for bad in ["my.hooks", "a b", &"x".repeat(65)] {
            let toml = format!("[endpoints.\"{bad}\"]\nurl = \"https://h.example/\"");
            let err = Settings::from_toml(&toml).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("endpoints.{bad}: endpoint names are letters")),
                "{err}"
            );
        }
        assert!(Settings::from_toml("[endpoints.a-B_9]\nurl = \"https://h.example/\"").is_ok());
        let err =
            Settings::load_from(None, &env(&[("HERALD_WEBHOOK_SECRET", "whsec_!!")])).unwrap_err();
        assert!(err.to_string().starts_with("webhook_secret"), "{err}");
    }

    #[test]
    fn dependent_defaults_follow_the_settings_they_depend_on() {
        let build = |pairs: &[(&str, &str)]| Settings::build(FileConfig::default(), &env(pairs));
        let ms = Duration::from_millis;
        // The connect timeout default is min(5 s, total / 2).
        let s = build(&[("HERALD_WEBHOOK_TIMEOUT_MS", "1500")]).unwrap();
        assert_eq!(
            (s.webhook_timeout, s.webhook_connect_timeout),
            (ms(1500), ms(750))
        );
        let s = build(&[]).unwrap();
        assert_eq!(s.webhook_connect_timeout, ms(5000));
        let s = build(&[("HERALD_WEBHOOK_TIMEOUT_MS", "1")]).unwrap();
        assert_eq!(s.webhook_connect_timeout, ms(1));
        // An explicit connect timeout below the total is kept.
        let s = build(&[
            ("HERALD_WEBHOOK_TIMEOUT_MS", "1500"),
            ("HERALD_WEBHOOK_CONNECT_TIMEOUT_MS", "1400"),
        ])
        .unwrap();
        assert_eq!(s.webhook_connect_timeout, ms(1400));
        // The lease default is max(60 s, longest send + 5 s) ...
        let s = build(&[("HERALD_WEBHOOK_TIMEOUT_MS", "120000")]).unwrap();
        assert_eq!(s.lease, Duration::from_secs(125));
        let s = build(&[("HERALD_WEBHOOK_TIMEOUT_MS", "55500")]).unwrap();
        assert_eq!(s.lease, Duration::from_secs(61));
        // ... where the SMTP timeout counts only when SMTP is configured.
        let s = build(&[("HERALD_SMTP_TIMEOUT_MS", "90000")]).unwrap();
        assert_eq!(s.lease, Duration::from_secs(60));
        let s = build(&[("HERALD_LEASE_SECONDS", "25")]).unwrap();
        assert_eq!(
            s.lease,
            Duration::from_secs(25),
            "no SMTP: 15 s + 5 s is enough"
        );
        let smtp = ("HERALD_SMTP_URL", "smtp://127.0.0.1:2525");
        let s = build(&[smtp, ("HERALD_SMTP_TIMEOUT_MS", "90000")]).unwrap();
        assert_eq!(s.lease, Duration::from_secs(95));
        let s = build(&[smtp]).unwrap();
        assert_eq!(s.lease, Duration::from_secs(60));
        // Backoff base and cap follow each other when only one is set.
        let s = build(&[("HERALD_RETRY_CAP_SECONDS", "2")]).unwrap();
        assert_eq!((s.retry.base, s.retry.cap), (ms(2000), ms(2000)));
        let s = build(&[("HERALD_RETRY_BASE_SECONDS", "30000")]).unwrap();
        assert_eq!(s.retry.cap, Duration::from_secs(30_000));
        let s = build(&[]).unwrap();
        assert_eq!(
            (s.retry.base, s.retry.cap),
            (Duration::from_secs(5), Duration::from_secs(21_600))
        );
    }

    #[test]
    fn explicit_values_that_cannot_work_are_refused_in_one_line() {
        let build = |pairs: &[(&str, &str)]| Settings::build(FileConfig::default(), &env(pairs));
        let one_line = |e: &ConfigError, starts: &str, names: &[&str]| {
            let m = e.to_string();
            assert!(m.starts_with(starts), "{m}");
            assert!(!m.contains('\n'), "{m}");
            for n in names {
                assert!(m.contains(n), "{m} does not name {n}");
            }
        };
        let err = build(&[
            ("HERALD_WEBHOOK_TIMEOUT_MS", "1000"),
            ("HERALD_WEBHOOK_CONNECT_TIMEOUT_MS", "2000"),
        ])
        .unwrap_err();
        one_line(
            &err,
            "webhook_connect_timeout_ms",
            &["HERALD_WEBHOOK_CONNECT_TIMEOUT_MS", "1000"],
        );
        let err = build(&[
            ("HERALD_WEBHOOK_TIMEOUT_MS", "1000"),
            ("HERALD_WEBHOOK_CONNECT_TIMEOUT_MS", "1000"),
        ])
        .unwrap_err();
        one_line(&err, "webhook_connect_timeout_ms", &[]);
        let smtp = ("HERALD_SMTP_URL", "smtp://127.0.0.1:2525");
        let err = build(&[smtp, ("HERALD_LEASE_SECONDS", "30")]).unwrap_err();
        one_line(
            &err,
            "lease_seconds",
            &["smtp_timeout_ms", "HERALD_LEASE_SECONDS", "35"],
        );
        let err = build(&[("HERALD_LEASE_SECONDS", "19")]).unwrap_err();
        one_line(&err, "lease_seconds", &["webhook_timeout_ms", "20"]);
        // A number, but not one a count or size takes; and not a number at all.
        let err = build(&[("HERALD_RETENTION_DELIVERED_DAYS", "5000000000")]).unwrap_err();
        one_line(
            &err,
            "HERALD_RETENTION_DELIVERED_DAYS",
            &["is too large for this setting"],
        );
        for v in ["-1", "0.5"] {
            let err = build(&[("HERALD_RETENTION_DELIVERED_DAYS", v)]).unwrap_err();
            one_line(
                &err,
                "HERALD_RETENTION_DELIVERED_DAYS",
                &["is not a whole number of 0 or more"],
            );
        }
        let err = build(&[("HERALD_RETENTION_DELIVERED_DAYS", "ten")]).unwrap_err();
        one_line(
            &err,
            "HERALD_RETENTION_DELIVERED_DAYS",
            &["\"ten\" is not a number"],
        );
        // A timeout that would need a lease over a day, the lease left to follow it: the
        // timeout is what to change.
        let err = build(&[("HERALD_WEBHOOK_TIMEOUT_MS", "90000000")]).unwrap_err();
        one_line(
            &err,
            "webhook_timeout_ms",
            &["HERALD_WEBHOOK_TIMEOUT_MS", "86395000"],
        );
        let err = build(&[
            ("HERALD_RETRY_BASE_SECONDS", "10"),
            ("HERALD_RETRY_CAP_SECONDS", "5"),
        ])
        .unwrap_err();
        one_line(&err, "retry_cap_seconds", &["HERALD_RETRY_CAP_SECONDS"]);
        let err = build(&[("HERALD_WEBHOOK_TIMEOUT_MS", "0")]).unwrap_err();
        one_line(&err, "webhook_timeout_ms", &["HERALD_WEBHOOK_TIMEOUT_MS"]);
        // Each refusal names the variable to set (an operator walk-through: these two said
        // only the setting's file name and the rule).
        for (var, value, name) in [
            ("HERALD_RETRY_JITTER", "1.5", "retry_jitter"),
            ("HERALD_RETRY_MAX_ATTEMPTS", "0", "retry_max_attempts"),
        ] {
            let err = build(&[(var, value)]).unwrap_err();
            one_line(&err, name, &[var, "or unset it"]);
            assert_eq!(err.to_string().matches("HERALD_").count(), 1, "{err}");
        }
    }

    #[test]
    fn smtp_pool_size_is_1_to_100() {
        let build = |pairs: &[(&str, &str)]| Settings::build(FileConfig::default(), &env(pairs));
        assert_eq!(build(&[]).unwrap().smtp_pool_size, 10);
        assert_eq!(
            build(&[("HERALD_SMTP_POOL_SIZE", "2")])
                .unwrap()
                .smtp_pool_size,
            2
        );
        assert_eq!(
            Settings::from_toml("smtp_pool_size = 100\n")
                .unwrap()
                .smtp_pool_size,
            100
        );
        for bad in ["0", "101"] {
            let m = build(&[("HERALD_SMTP_POOL_SIZE", bad)])
                .unwrap_err()
                .to_string();
            assert!(m.starts_with("smtp_pool_size: "), "{m}");
            assert!(
                m.contains("HERALD_SMTP_POOL_SIZE") && !m.contains('\n'),
                "{m}"
            );
        }
    }

    #[test]
    fn smtp_pipelining_and_chunking_are_on_unless_switched_off() {
        let build = |pairs: &[(&str, &str)]| Settings::build(FileConfig::default(), &env(pairs));
        type Flag = fn(&Settings) -> bool;
        let pipelining: Flag = |s| s.smtp_pipelining;
        let chunking: Flag = |s| s.smtp_chunking;
        for (key, var, flag) in [
            ("smtp_pipelining", "HERALD_SMTP_PIPELINING", pipelining),
            ("smtp_chunking", "HERALD_SMTP_CHUNKING", chunking),
        ] {
            assert!(flag(&build(&[]).unwrap()), "{key}");
            assert!(!flag(&build(&[(var, "false")]).unwrap()), "{var}");
            let toml = format!("{key} = false\n");
            assert!(!flag(&Settings::from_toml(&toml).unwrap()), "{key}");
            let m = build(&[(var, "sometimes")]).unwrap_err().to_string();
            assert!(m.contains(var), "{m}");
        }
    }

    #[test]
    fn smtp_noop_after_idle_defaults_to_a_second_and_is_0_to_an_hour() {
        let build = |pairs: &[(&str, &str)]| Settings::build(FileConfig::default(), &env(pairs));
        assert_eq!(
            build(&[]).unwrap().smtp_noop_after_idle,
            Duration::from_secs(1)
        );
        assert_eq!(
            build(&[("HERALD_SMTP_NOOP_AFTER_IDLE_MS", "0")])
                .unwrap()
                .smtp_noop_after_idle,
            Duration::ZERO
        );
        assert_eq!(
            Settings::from_toml("smtp_noop_after_idle_ms = 3600000\n")
                .unwrap()
                .smtp_noop_after_idle,
            Duration::from_secs(3600)
        );
        for bad in ["3600001", "-1", "soon"] {
            let m = build(&[("HERALD_SMTP_NOOP_AFTER_IDLE_MS", bad)])
                .unwrap_err()
                .to_string();
            assert!(m.contains("HERALD_SMTP_NOOP_AFTER_IDLE_MS"), "{bad}: {m}");
            assert!(!m.contains('\n'), "{bad}: {m}");
        }
    }

    #[test]
    fn smtp_idle_timeout_defaults_to_a_minute_and_is_1_to_3600_seconds() {
        let build = |pairs: &[(&str, &str)]| Settings::build(FileConfig::default(), &env(pairs));
        assert_eq!(
            build(&[]).unwrap().smtp_idle_timeout,
            Duration::from_secs(60)
        );
        assert_eq!(
            build(&[("HERALD_SMTP_IDLE_TIMEOUT_SECONDS", "5")])
                .unwrap()
                .smtp_idle_timeout,
            Duration::from_secs(5)
        );
        assert_eq!(
            Settings::from_toml("smtp_idle_timeout_seconds = 3600\n")
                .unwrap()
                .smtp_idle_timeout,
            Duration::from_secs(3600)
        );
        for bad in ["0", "3601"] {
            let m = build(&[("HERALD_SMTP_IDLE_TIMEOUT_SECONDS", bad)])
                .unwrap_err()
                .to_string();
            assert!(m.starts_with("smtp_idle_timeout_seconds: "), "{m}");
            assert!(
                m.contains("HERALD_SMTP_IDLE_TIMEOUT_SECONDS") && !m.contains('\n'),
                "{m}"
            );
        }
    }

    #[test]
    fn smtp_ca_file_is_read_and_checked_at_load() {
        let build = |pairs: &[(&str, &str)]| Settings::build(FileConfig::default(), &env(pairs));
        assert!(build(&[]).unwrap().smtp_ca.is_none());
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["relay.example".to_owned()]).unwrap();
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, ca.cert.pem()).unwrap();
        let s = build(&[("HERALD_SMTP_CA_FILE", good.to_str().unwrap())]).unwrap();
        assert_eq!(
            format!("{:?}", s.smtp_ca.unwrap()),
            "SmtpCa(1 certificates)"
        );
        let s = Settings::from_toml(&format!("smtp_ca_file = {:?}\n", good.to_str().unwrap()));
        assert!(s.unwrap().smtp_ca.is_some());
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        for (path, says) in [
            (dir.path().join("missing.pem"), "cannot read the file"),
            (empty, "no CERTIFICATE block"),
        ] {
            let m = build(&[("HERALD_SMTP_CA_FILE", path.to_str().unwrap())])
                .unwrap_err()
                .to_string();
            assert!(m.starts_with("smtp_ca_file: "), "{m}");
            assert!(m.contains(says) && m.contains("HERALD_SMTP_CA_FILE"), "{m}");
            assert!(!m.contains('\n'), "{m}");
        }
    }

    #[test]
    fn smtp_url_and_mail_from_are_checked_at_load_without_quoting_them() {
        let build = |pairs: &[(&str, &str)]| Settings::build(FileConfig::default(), &env(pairs));
        for url in [
            "smtp://herald:hunter2@mail.example:99999",
            "ftp://herald:hunter2@mail.example",
            "smtp://herald:hunter2@mail.example?tls=maybe",
            "herald:hunter2",
        ] {
            let m = build(&[("HERALD_SMTP_URL", url)]).unwrap_err().to_string();
            assert!(m.starts_with("smtp_url: "), "{m}");
            assert!(m.contains("HERALD_SMTP_URL") && !m.contains('\n'), "{m}");
            assert!(!m.contains("hunter2") && !m.contains("mail.example"), "{m}");
        }
        let err = Settings::from_toml("smtp_url = \"smtp://u:hunter2@[::1\"\n").unwrap_err();
        assert!(err.to_string().starts_with("smtp_url: "), "{err}");
        for from in ["ada at example.com", "Ada <ada@>", ""] {
            let err = Settings::from_toml(&format!("mail_from = {from:?}\n")).unwrap_err();
            let m = err.to_string();
            assert!(m.starts_with("mail_from: "), "{m}");
            assert!(m.contains("HERALD_MAIL_FROM") && !m.contains('\n'), "{m}");
            assert!(from.is_empty() || !m.contains(from), "{m}");
        }
        let s = build(&[
            (
                "HERALD_SMTP_URL",
                "smtps://u%40x:p%2Fw@mail.example/herald.example",
            ),
            ("HERALD_MAIL_FROM", "Billing <billing@example.com>"),
        ])
        .unwrap();
        assert_eq!(s.mail_from, "Billing <billing@example.com>");
    }

    #[test]
    fn smtp_provider_is_one_of_the_known_relays() {
        let build = |pairs: &[(&str, &str)]| {
            let mut pairs = pairs.to_vec();
            pairs.push(("HERALD_SMTP_URL", "smtp://127.0.0.1:2525"));
            Settings::build(FileConfig::default(), &env(&pairs))
        };
        assert_eq!(build(&[]).unwrap().smtp_provider, None);
        assert_eq!(
            build(&[("HERALD_SMTP_PROVIDER", "ses")])
                .unwrap()
                .smtp_provider,
            Some(RelayProvider::Ses)
        );
        assert_eq!(
            Settings::from_toml(
                "smtp_url = \"smtp://127.0.0.1:2525\"\nsmtp_provider = \"sendgrid\"\n"
            )
            .unwrap()
            .smtp_provider,
            Some(RelayProvider::SendGrid)
        );
        // Without a relay it would be ignored: refused, naming what is missing.
        let m = Settings::from_toml("smtp_provider = \"sendgrid\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            m.starts_with("smtp_provider: ") && m.contains("HERALD_SMTP_URL"),
            "{m}"
        );
        let m = build(&[("HERALD_SMTP_PROVIDER", "sparkpost")])
            .unwrap_err()
            .to_string();
        assert!(m.starts_with("smtp_provider: "), "{m}");
        assert!(
            m.contains("HERALD_SMTP_PROVIDER") && m.contains("mailgun") && !m.contains('\n'),
            "{m}"
        );
    }

    /// RFC 8410's example Ed25519 key.
    const ED25519_PEM: &str = "-----BEGIN PRIVATE KEY-----\n\
        MC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n\
        -----END PRIVATE KEY-----\n";

    #[test]
    fn dkim_needs_all_three_keys_and_a_readable_key() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("dkim.pem");
        std::fs::write(&key, ED25519_PEM).unwrap();
        let key = key.display().to_string();
        let build = |pairs: &[(&str, &str)]| Settings::build(FileConfig::default(), &env(pairs));
        assert!(build(&[]).unwrap().dkim.is_none());
        let s = build(&[
            ("HERALD_DKIM_SELECTOR", "herald"),
            ("HERALD_DKIM_DOMAIN", "example.com"),
            ("HERALD_DKIM_KEY_FILE", &key),
        ])
        .unwrap();
        let shown = format!("{s:?}");
        assert!(shown.contains("herald._domainkey.example.com"), "{shown}");
        assert!(!shown.contains("MC4CAQAw"), "{shown}");
        assert_eq!(s.dkim.unwrap().algorithm(), "ed25519");
        let one_line = |m: String, starts: &str, names: &[&str]| {
            assert!(m.starts_with(starts), "{m}");
            assert!(!m.contains('\n'), "{m}");
            for n in names {
                assert!(m.contains(n), "{m} does not name {n}");
            }
        };
        one_line(
            build(&[("HERALD_DKIM_SELECTOR", "herald")])
                .unwrap_err()
                .to_string(),
            "dkim_domain: ",
            &["HERALD_DKIM_DOMAIN", "HERALD_DKIM_KEY_FILE"],
        );
        one_line(
            build(&[
                ("HERALD_DKIM_SELECTOR", "herald"),
                ("HERALD_DKIM_DOMAIN", "example.com"),
                ("HERALD_DKIM_KEY_FILE", "/nonexistent/dkim.pem"),
            ])
            .unwrap_err()
            .to_string(),
            "dkim_key_file: /nonexistent/dkim.pem: cannot read",
            &["HERALD_DKIM_KEY_FILE"],
        );
        let secretish = dir.path().join("not-a-key.pem");
        std::fs::write(&secretish, "hunter2 hunter2").unwrap();
        let m = build(&[
            ("HERALD_DKIM_SELECTOR", "herald"),
            ("HERALD_DKIM_DOMAIN", "example.com"),
            ("HERALD_DKIM_KEY_FILE", &secretish.display().to_string()),
        ])
        .unwrap_err()
        .to_string();
        one_line(m.clone(), "dkim_key_file: ", &["not PEM"]);
        assert!(!m.contains("hunter2"), "{m}");
        one_line(
            build(&[
                ("HERALD_DKIM_SELECTOR", "her ald"),
                ("HERALD_DKIM_DOMAIN", "example.com"),
                ("HERALD_DKIM_KEY_FILE", &key),
            ])
            .unwrap_err()
            .to_string(),
            "dkim_selector: ",
            &["HERALD_DKIM_SELECTOR"],
        );
    }

    #[test]
    fn tokens_from_the_file_and_the_environment() {
        let digest = crate::auth::digest_hex("shop-token-0123456789");
        let s = Settings::from_toml(&format!(
            "[tokens.shop]\nsha256 = \"{digest}\"\nscope = \"send\"\n"
        ))
        .unwrap();
        let p = s.tokens.authenticate("shop-token-0123456789").unwrap();
        assert_eq!((p.name.as_str(), p.scope), ("shop", Scope::Send));

        let file = toml::from_str(&format!(
            "[tokens.shop]\nsha256 = \"{digest}\"\nscope = \"send\"\n"
        ))
        .unwrap();
        let s =
            Settings::build(file, &env(&[("HERALD_API_TOKEN", "root-token-0123456789")])).unwrap();
        let p = s.tokens.authenticate("root-token-0123456789").unwrap();
        assert_eq!((p.name.as_str(), p.scope), ("default", Scope::Admin));
        assert!(s.tokens.authenticate("shop-token-0123456789").is_some());

        for (text, name, says) in [
            (
                "[tokens.shop]\nsha256 = \"abc\"\nscope = \"send\"\n",
                "tokens.shop",
                "64 hex",
            ),
            (
                &*format!("[tokens.shop]\nsha256 = \"{digest}\"\nscope = \"root\"\n"),
                "tokens.shop",
                "send, support, admin",
            ),
            (
                &*format!(
                    "api_token = \"root-token-0123456789\"\n[tokens.default]\nsha256 = \"{digest}\"\nscope = \"send\"\n"
                ),
                "tokens.default",
                "",
            ),
            ("api_token = \"short\"\n", "api_token", "at least 16"),
        ] {
            match Settings::from_toml(text) {
                Err(ConfigError::Invalid { name: n, message }) => {
                    assert_eq!(n, name, "{text}");
                    assert!(
                        message.contains(says) && !message.contains(&digest),
                        "{message}"
                    );
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn allow_networks_from_the_file_or_the_environment() {
        let build = |pairs: &[(&str, &str)]| Settings::build(FileConfig::default(), &env(pairs));
        assert!(build(&[]).unwrap().allow_networks.networks().is_empty());
        let s = build(&[("HERALD_ALLOW_NETWORKS", "127.0.0.0/8, 10.1.0.0/16")]).unwrap();
        assert_eq!(s.allow_networks.networks().len(), 2);
        let s = Settings::from_toml("allow_networks = [\"127.0.0.0/8\", \"fd00::/8\"]\n").unwrap();
        assert_eq!(s.allow_networks.networks().len(), 2);
        let s = Settings::from_toml("allow_networks = \"127.0.0.0/8\"\n").unwrap();
        assert_eq!(s.allow_networks.networks().len(), 1);
        let m = build(&[("HERALD_ALLOW_NETWORKS", "127.0.0.0/8,intranet")])
            .unwrap_err()
            .to_string();
        assert!(m.starts_with("allow_networks: "), "{m}");
        assert!(
            m.contains("\"intranet\"") && m.contains("HERALD_ALLOW_NETWORKS"),
            "{m}"
        );
        assert!(!m.contains('\n'), "{m}");
    }

    #[test]
    fn an_endpoints_header_values_are_checked_at_load() {
        let with = |value: &str| {
            Settings::from_toml(&format!(
                "[endpoints.billing]\nurl = \"https://b.example/h\"\n\
                 [endpoints.billing.headers]\n\"X-Token\" = {value}\n"
            ))
        };
        assert!(with("\"abc\"").is_ok());
        // A control character (here a newline) is no header value: every send would fail.
        for bad in ["\"abc\\n\"", "\"a\\u0001b\""] {
            let m = with(bad).unwrap_err().to_string();
            assert!(
                m.starts_with("endpoints.billing.headers.X-Token: "),
                "{bad}: {m}"
            );
            assert!(
                !m.contains("abc") && !m.contains("a\u{1}b"),
                "the value is not echoed: {m}"
            );
        }
        // What a message may not write (here a name a receiver reads as another, and a value
        // past ASCII) is said, not refused: a configuration that sent them starts as before.
        let s = Settings::from_toml(
            "[endpoints.billing]\nurl = \"https://b.example/h\"\n\
             [endpoints.billing.headers]\n\"X-Team\" = \"a\"\n\"X_Team\" = \"b\"\n",
        )
        .unwrap();
        assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
        assert!(
            s.warnings[0].starts_with("endpoints.billing.headers.X_Team: is the same header as"),
            "{:?}",
            s.warnings
        );
        assert!(with("\"Équipe\"").unwrap().warnings[0].contains("printable ASCII"));
        assert!(with("\"abc\"").unwrap().warnings.is_empty());
    }

    #[test]
    fn an_endpoint_at_a_refused_literal_address_is_refused_at_load_naming_its_key() {
        let toml = "[endpoints.app]\nurl = \"http://169.254.169.254/latest\"\n\
                    [status_callbacks]\ndestination = \"endpoint:app\"\n";
        let m = Settings::from_toml(toml).unwrap_err().to_string();
        assert!(
            m.starts_with("endpoints.app.url: refused by the SSRF guard"),
            "{m}"
        );
        assert!(
            m.contains("cloud metadata") && m.contains("status_callbacks"),
            "{m}"
        );
        assert!(
            m.contains("HERALD_ALLOW_NETWORKS") && !m.contains('\n'),
            "{m}"
        );
        let m = Settings::from_toml("[endpoints.b]\nurl = \"http://[fd00::5]/h\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            m.starts_with("endpoints.b.url: ") && m.contains("unique local"),
            "{m}"
        );
        assert!(!m.contains("status_callbacks"), "{m}");
        // Allow-listed, or a name (checked when it resolves): accepted.
        let ok = "allow_networks = \"10.0.0.0/8\"\n[endpoints.c]\nurl = \"http://10.2.3.4/h\"\n\
                  [endpoints.d]\nurl = \"http://internal.example/h\"\n";
        assert!(Settings::from_toml(ok).is_ok());
    }

    #[test]
    fn log_format_is_text_or_json() {
        let build = |pairs: &[(&str, &str)]| Settings::build(FileConfig::default(), &env(pairs));
        assert_eq!(build(&[]).unwrap().log_format, LogFormat::Text);
        assert_eq!(
            build(&[("HERALD_LOG_FORMAT", "json")]).unwrap().log_format,
            LogFormat::Json
        );
        assert_eq!(
            Settings::from_toml("log_format = \"json\"\n")
                .unwrap()
                .log_format,
            LogFormat::Json
        );
        let m = build(&[("HERALD_LOG_FORMAT", "logfmt")])
            .unwrap_err()
            .to_string();
        assert!(m.starts_with("log_format: "), "{m}");
        assert!(
            m.contains("HERALD_LOG_FORMAT") && m.contains("json") && !m.contains('\n'),
            "{m}"
        );
    }

    #[test]
    fn sources_are_built_and_checked() {
        let s = Settings::from_toml(
            "[sources.resend]\nscheme = \"standard-webhooks\"\nsecrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n\
             [sources.pm]\nscheme = \"postmark\"\nusername = \"u\"\npassword = \"hunter2\"\n",
        )
        .unwrap();
        assert_eq!(s.sources["resend"].source.scheme(), "standard-webhooks");
        assert!(!format!("{s:?}").contains("hunter2"));
        let err = Settings::from_toml("[sources.x]\nscheme = \"carrier-pigeon\"\n").unwrap_err();
        assert!(err.to_string().starts_with("sources.x.scheme"), "{err}");
        let err = Settings::from_toml("[sources.x]\nscheme = \"stripe\"\n").unwrap_err();
        assert!(err.to_string().starts_with("sources.x.secrets"), "{err}");
        let err = Settings::from_toml("[sources.x]\nscheme = \"twilio\"\nsecrets = [\"t\"]\n")
            .unwrap_err();
        assert!(err.to_string().starts_with("sources.x.public_url"), "{err}");
        // A key the scheme does not read is refused, as an unknown key is; hmac's pointers are
        // JSON pointers.
        for (toml, refused) in [
            (
                "scheme = \"stripe\"\nsecrets = [\"s\"]\npublic_url = \"https://x.example/\"",
                "sources.x.public_url: does not apply to scheme stripe (it takes: secret, secrets, tolerance_seconds)",
            ),
            (
                "scheme = \"postmark\"\nusername = \"u\"\npassword = \"p\"\nsecrets = [\"s\"]",
                "sources.x.secrets: does not apply to scheme postmark",
            ),
            (
                "scheme = \"hmac\"\nsecrets = [\"s\"]\nevent_id_pointer = \"id\"",
                "sources.x.event_id_pointer: \"id\" is not a JSON pointer: write \"/id\"",
            ),
        ] {
            let err = Settings::from_toml(&format!("[sources.x]\n{toml}\n")).unwrap_err();
            assert!(err.to_string().starts_with(refused), "{err}");
        }
        let err = Settings::from_toml(
            "[sources.x]\nscheme = \"hmac\"\nsecrets = [\"s\"]\nevent_id_pointer = \"/a~2\"\n",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("sources.x.event_id_pointer: \"/a~2\": in a JSON pointer"),
            "{err}"
        );
        let ok = Settings::from_toml(
            "[sources.x]\nscheme = \"hmac\"\nsecrets = [\"s\"]\nevent_id_pointer = \"/data/a~1b~0c\"\n",
        );
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let s = Settings::from_toml(
            "database_url = \"postgres://u:hunter2@db/herald\"\napi_token = \"tok-hunter2-0123456789\"\n\
             [endpoints.a]\nurl = \"https://a.example/hook\"\nsecret = \"whsec_aHVudGVyMmh1bnRlcjJodW50ZXIy\"\n\
             auth = { bearer = \"hunter2\" }\n",
        )
        .unwrap();
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("aHVudGVy"),
            "{shown}"
        );
        // An empty credential is a slip, refused at start rather than sent as `Bearer `.
        for (auth, key) in [
            ("{ bearer = \"\" }", "endpoints.a.auth.bearer"),
            (
                "{ basic = { username = \" \", password = \"p\" } }",
                "endpoints.a.auth.basic.username",
            ),
        ] {
            let err = Settings::from_toml(&format!(
                "[endpoints.a]\nurl = \"https://a.example/hook\"\nauth = {auth}\n"
            ))
            .unwrap_err();
            assert!(err.to_string().starts_with(key), "{err}");
        }
    }
}
