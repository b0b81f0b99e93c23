//! One file per provider scheme, each a [`Source`](super::Source) built from `[sources.NAME]`.

pub mod hmac_generic;
pub mod jwt;
pub mod mailgun;
pub mod messagebird;
pub mod params;
pub mod plivo;
pub mod postmark;
pub mod sendgrid;
pub mod ses;
pub mod standard_webhooks;
pub mod stripe;
pub mod telnyx;
pub mod twilio;
pub mod vonage;

use std::sync::Arc;

use serde::Deserialize;

use super::Source;
use crate::crypto::signing::KeyError;
use crate::domain::InvalidField;
use crate::secret::Secret;

/// The scheme names of the interface contract that this version implements.
pub const SCHEMES: &[&str] = &[
    "standard-webhooks",
    "mailgun",
    "sendgrid",
    "twilio",
    "postmark",
    "ses",
    "stripe",
    "hmac",
    "vonage",
    "telnyx",
    "plivo",
    "messagebird",
];

/// Why a scheme refuses its `[sources.NAME]` settings; [`build`] names the field.
#[derive(Debug, thiserror::Error)]
pub enum SchemeConfigError {
    /// twilio: `public_url`.
    #[error("is not a valid URL ({0})")]
    InvalidUrl(#[source] url::ParseError),
    /// hmac: `encoding`.
    #[error("encoding {0:?} must be hex or base64")]
    Encoding(String),
    /// hmac: `signed`.
    #[error("signed {0:?} must be body or timestamp.body")]
    Signed(String),
    /// standard-webhooks: a secret.
    #[error(transparent)]
    SigningKey(#[from] KeyError),
    /// sendgrid: a verification key (public, so base64's cause is kept).
    #[error("must be base64 (the verification key SendGrid shows)")]
    NotBase64(#[source] base64::DecodeError),
    #[error("is not a P-256 public key")]
    NotP256(#[source] p256::pkcs8::spki::Error),
    /// vonage: `signature_method`.
    #[error("{0:?} is not one of {names}", names = vonage::SignatureMethod::NAMES)]
    SignatureMethod(String),
    /// telnyx, standard-webhooks `whpk_`: a public key (public, so base64's cause is kept).
    #[error("must be the base64 of an Ed25519 public key")]
    NotBase64Key(#[source] base64::DecodeError),
    #[error("is not an Ed25519 public key (32 bytes)")]
    NotEd25519,
    /// standard-webhooks: a `whsk_` secret key where the public key belongs.
    #[error("is a whsk_ secret key: give its whpk_ public key")]
    SecretKeyGiven,
}

/// Default timestamp tolerance, seconds.
pub const DEFAULT_TOLERANCE: u64 = 300;

/// `[sources.NAME]` as written in the file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    pub scheme: String,
    /// The messages this source's receipts may speak for, on every scheme: `"endpoint:NAME"`
    /// (messages sent to that endpoint) or `"email"` (every email message). Empty: every
    /// message. Checked against the endpoints when the configuration is built.
    #[serde(default)]
    pub matches: Vec<String>,
    /// Several at once, for rotation; each is tried.
    #[serde(default)]
    pub secrets: Vec<Secret>,
    #[serde(default)]
    pub secret: Option<Secret>,
    /// URL-signing schemes (twilio, plivo, messagebird): the public URL exactly as the provider
    /// calls it (plivo, messagebird: without the query, which is taken as received).
    #[serde(default)]
    pub public_url: Option<String>,
    /// Timestamp window, seconds, for every scheme that has a timestamp (default 300).
    #[serde(default)]
    pub tolerance_seconds: Option<u64>,
    /// postmark: basic-auth credentials in the webhook URL.
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<Secret>,
    /// postmark: several accepted pairs (rotation), with or instead of `username` + `password`.
    #[serde(default)]
    pub credentials: Vec<postmark::Credentials>,
    /// ses: allowed TopicArns.
    #[serde(default)]
    pub topic_arns: Vec<String>,
    /// ses: confirm SubscriptionConfirmations by GETting their SubscribeURL (default true).
    #[serde(default)]
    pub confirm_subscriptions: Option<bool>,
    /// ses: pinned signing certificates, `"https://sns…pem" = "/path/cert.pem"` (else fetched).
    #[serde(default)]
    pub certificates: std::collections::BTreeMap<String, std::path::PathBuf>,
    /// hmac: the signature header (default `x-signature`).
    #[serde(default)]
    pub header: Option<String>,
    /// hmac: `hex` (default) or `base64`.
    #[serde(default)]
    pub encoding: Option<String>,
    /// hmac: `body` (default) or `timestamp.body`.
    #[serde(default)]
    pub signed: Option<String>,
    /// hmac with `timestamp.body`: the timestamp header (default `x-timestamp`).
    #[serde(default)]
    pub timestamp_header: Option<String>,
    /// hmac: a prefix before the signature value, e.g. `sha256=`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// hmac: JSON pointers to the event id, type and time (unix seconds or RFC 3339).
    #[serde(default)]
    pub event_id_pointer: Option<String>,
    #[serde(default)]
    pub event_type_pointer: Option<String>,
    #[serde(default)]
    pub event_time_pointer: Option<String>,
    /// vonage: the SMS API's signature method (`md5hash`, `md5`, `sha1`, `sha256`, `sha512`), as
    /// chosen in the dashboard; unset, only Messages API JWTs are accepted.
    #[serde(default)]
    pub signature_method: Option<String>,
}

impl SourceConfig {
    /// `secret` and `secrets` together, in order.
    pub fn all_secrets(&self) -> Vec<String> {
        self.secret
            .iter()
            .chain(self.secrets.iter())
            .map(|s| s.expose().to_owned())
            .collect()
    }

    pub(crate) fn tolerance(&self) -> u64 {
        self.tolerance_seconds.unwrap_or(DEFAULT_TOLERANCE)
    }
}

/// Whether a scheme's Herald event id is only a reference the application put in the send and
/// the provider echoes (Vonage `client-ref`/`client_ref`, MessageBird `reference`), not an id
/// Herald wrote: its receipts are matched by the provider's message id first.
pub fn echoes_reference(scheme: &str) -> bool {
    matches!(scheme, "vonage" | "messagebird")
}

/// The keys of `[sources.NAME]` a scheme reads, beside `scheme`; `None` for an unknown scheme.
pub fn keys_of(scheme: &str) -> Option<&'static [&'static str]> {
    Some(match scheme {
        "standard-webhooks" | "stripe" | "mailgun" | "sendgrid" | "telnyx" => {
            &["secret", "secrets", "tolerance_seconds"]
        }
        "twilio" | "plivo" | "messagebird" => &["secret", "secrets", "public_url"],
        "postmark" => &["username", "password", "credentials"],
        "hmac" => &[
            "secret",
            "secrets",
            "tolerance_seconds",
            "header",
            "encoding",
            "signed",
            "timestamp_header",
            "prefix",
            "event_id_pointer",
            "event_type_pointer",
            "event_time_pointer",
        ],
        "ses" => &[
            "topic_arns",
            "confirm_subscriptions",
            "certificates",
            "tolerance_seconds",
        ],
        "vonage" => &["secret", "secrets", "signature_method", "tolerance_seconds"],
        _ => return None,
    })
}

impl SourceConfig {
    /// The keys set here, beside `scheme`, in the file's vocabulary.
    fn keys_set(&self) -> Vec<&'static str> {
        [
            ("secret", self.secret.is_some()),
            ("secrets", !self.secrets.is_empty()),
            ("public_url", self.public_url.is_some()),
            ("tolerance_seconds", self.tolerance_seconds.is_some()),
            ("username", self.username.is_some()),
            ("password", self.password.is_some()),
            ("credentials", !self.credentials.is_empty()),
            ("topic_arns", !self.topic_arns.is_empty()),
            (
                "confirm_subscriptions",
                self.confirm_subscriptions.is_some(),
            ),
            ("certificates", !self.certificates.is_empty()),
            ("header", self.header.is_some()),
            ("encoding", self.encoding.is_some()),
            ("signed", self.signed.is_some()),
            ("timestamp_header", self.timestamp_header.is_some()),
            ("prefix", self.prefix.is_some()),
            ("event_id_pointer", self.event_id_pointer.is_some()),
            ("event_type_pointer", self.event_type_pointer.is_some()),
            ("event_time_pointer", self.event_time_pointer.is_some()),
            ("signature_method", self.signature_method.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect()
    }
}

/// A key set for a scheme that does not read it is refused, as an unknown key is: it would be
/// ignored without a word (`public_url` on a stripe source, a pointer on anything but hmac).
pub fn check_keys(field: &str, c: &SourceConfig) -> Result<(), InvalidField> {
    let Some(takes) = keys_of(&c.scheme) else {
        return Ok(()); // `build` names the unknown scheme
    };
    match c.keys_set().into_iter().find(|k| !takes.contains(k)) {
        Some(k) => Err(InvalidField::new(
            format!("{field}.{k}"),
            format!(
                "does not apply to scheme {} (it takes: {})",
                c.scheme,
                takes.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

/// hmac's pointers are JSON pointers (RFC 6901): empty, or starting with `/`. `id` (no slash)
/// would find nothing in any receipt, and every receipt would fall back to its body's hash as
/// its id, silently.
fn check_pointers(field: &str, c: &SourceConfig) -> Result<(), InvalidField> {
    for (key, v) in [
        ("event_id_pointer", &c.event_id_pointer),
        ("event_type_pointer", &c.event_type_pointer),
        ("event_time_pointer", &c.event_time_pointer),
    ] {
        if let Some(p) = v
            && !p.is_empty()
            && !p.starts_with('/')
        {
            return Err(InvalidField::new(
                format!("{field}.{key}"),
                format!("{p:?} is not a JSON pointer: write \"/{p}\" (RFC 6901)"),
            ));
        }
        // `~` escapes only `~0` (`~`) and `~1` (`/`); any other never matches a key.
        if let Some(p) = v
            && p.split('~')
                .skip(1)
                .any(|rest| !rest.starts_with(['0', '1']))
        {
            return Err(InvalidField::new(
                format!("{field}.{key}"),
                format!(
                    "{p:?}: in a JSON pointer `~` is written ~0 and `/` in a key ~1 (RFC 6901)"
                ),
            ));
        }
    }
    Ok(())
}

/// Builds the verifier for a configured source; `field` prefixes error names (`sources.NAME`).
pub fn build(field: &str, c: &SourceConfig) -> Result<Arc<dyn Source>, InvalidField> {
    check_keys(field, c)?;
    build_unchecked(field, c)
}

/// [`build`] without refusing the keys its scheme does not read: for the offline tool's wide
/// window, which also gives MessageBird (no `tolerance_seconds` of its own: its token's `nbf`
/// and `exp` are the window) a leeway of `tolerance_seconds`.
pub(crate) fn build_unchecked(
    field: &str,
    c: &SourceConfig,
) -> Result<Arc<dyn Source>, InvalidField> {
    let need_secrets = |secrets: Vec<String>| {
        if secrets.is_empty() {
            Err(InvalidField::new(
                format!("{field}.secrets"),
                "at least one secret is required",
            ))
        } else {
            Ok(secrets)
        }
    };
    let source: Arc<dyn Source> = match c.scheme.as_str() {
        "standard-webhooks" => Arc::new(
            standard_webhooks::StandardWebhooks::new(
                &need_secrets(c.all_secrets())?,
                c.tolerance(),
            )
            .map_err(|e| InvalidField::new(format!("{field}.secrets"), e.to_string()))?,
        ),
        "stripe" => Arc::new(stripe::Stripe::new(
            need_secrets(c.all_secrets())?,
            c.tolerance(),
        )),
        "mailgun" => Arc::new(mailgun::Mailgun::new(
            need_secrets(c.all_secrets())?,
            c.tolerance(),
        )),
        "twilio" => {
            let url = c.public_url.clone().ok_or_else(|| {
                InvalidField::new(format!("{field}.public_url"), "is required for twilio")
            })?;
            Arc::new(
                twilio::Twilio::new(need_secrets(c.all_secrets())?, &url)
                    .map_err(|e| InvalidField::new(format!("{field}.public_url"), e.to_string()))?,
            )
        }
        "postmark" => Arc::new(postmark_source(field, c)?),
        "hmac" => {
            check_pointers(field, c)?;
            Arc::new(
                hmac_generic::GenericHmac::new(need_secrets(c.all_secrets())?, c)
                    .map_err(|e| InvalidField::new(field.to_owned(), e.to_string()))?,
            )
        }
        "sendgrid" => Arc::new(
            sendgrid::SendGrid::new(&need_secrets(c.all_secrets())?, c.tolerance())
                .map_err(|e| InvalidField::new(format!("{field}.secrets"), e.to_string()))?,
        ),
        "ses" => {
            if c.topic_arns.is_empty() {
                // Any AWS account can point its own topic at Herald: pinning is not optional.
                return Err(InvalidField::new(
                    format!("{field}.topic_arns"),
                    "is required for ses: the SNS topic ARN(s) that publish your SES events",
                ));
            }
            if let Some(bad) = c.topic_arns.iter().find(|a| ses::topic_region(a).is_none()) {
                return Err(InvalidField::new(
                    format!("{field}.topic_arns"),
                    format!("{bad:?} is not an SNS topic ARN"),
                ));
            }
            let mut pinned = ses::StaticCertStore::default();
            for (url, path) in &c.certificates {
                let pem = std::fs::read(path).map_err(|e| {
                    InvalidField::new(
                        format!("{field}.certificates"),
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                pinned.0.insert(url.clone(), pem);
            }
            Arc::new(ses::Ses::new(
                c.topic_arns.clone(),
                Arc::new(ses::HttpsCertStore::new(pinned)),
                c.confirm_subscriptions.unwrap_or(true),
                c.tolerance(),
            ))
        }
        "vonage" => {
            let method = c
                .signature_method
                .as_deref()
                .map(vonage::SignatureMethod::parse)
                .transpose()
                .map_err(|e| {
                    InvalidField::new(format!("{field}.signature_method"), e.to_string())
                })?;
            Arc::new(vonage::Vonage::new(
                need_secrets(c.all_secrets())?,
                method,
                c.tolerance(),
            ))
        }
        "telnyx" => Arc::new(
            telnyx::Telnyx::new(&need_secrets(c.all_secrets())?, c.tolerance())
                .map_err(|e| InvalidField::new(format!("{field}.secrets"), e.to_string()))?,
        ),
        "plivo" => {
            let url = required_url(field, c, "plivo")?;
            Arc::new(
                plivo::Plivo::new(need_secrets(c.all_secrets())?, &url)
                    .map_err(|e| InvalidField::new(format!("{field}.public_url"), e.to_string()))?,
            )
        }
        "messagebird" => {
            let url = required_url(field, c, "messagebird")?;
            Arc::new(
                messagebird::MessageBird::new(need_secrets(c.all_secrets())?, &url)
                    .map_err(|e| InvalidField::new(format!("{field}.public_url"), e.to_string()))?
                    .with_leeway(c.tolerance_seconds),
            )
        }
        other => {
            return Err(InvalidField::new(
                format!("{field}.scheme"),
                format!("unknown scheme {other:?}; one of: {}", SCHEMES.join(", ")),
            ));
        }
    };
    Ok(source)
}

/// `public_url`, which a URL-signing scheme cannot do without.
fn required_url(field: &str, c: &SourceConfig, scheme: &str) -> Result<String, InvalidField> {
    c.public_url.clone().ok_or_else(|| {
        InvalidField::new(
            format!("{field}.public_url"),
            format!("is required for {scheme}: the URL exactly as the provider calls it"),
        )
    })
}

/// Postmark's accepted basic-auth pairs: `username` + `password`, then each of `credentials`.
fn postmark_source(field: &str, c: &SourceConfig) -> Result<postmark::Postmark, InvalidField> {
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    match (&c.username, &c.password) {
        (Some(user), Some(pass)) => pairs.push((user, pass.expose())),
        (None, None) => {}
        (Some(_), None) => {
            return Err(InvalidField::new(
                format!("{field}.password"),
                "is required with username",
            ));
        }
        (None, Some(_)) => {
            return Err(InvalidField::new(
                format!("{field}.username"),
                "is required with password",
            ));
        }
    }
    pairs.extend(
        c.credentials
            .iter()
            .map(|p| (p.username.as_str(), p.password.expose())),
    );
    if pairs.is_empty() {
        return Err(InvalidField::new(
            format!("{field}.username"),
            "postmark needs username and password, or credentials = [{ username, password }, …] \
             (the basic-auth credentials in its webhook URL)",
        ));
    }
    if pairs.iter().any(|(_, p)| p.is_empty()) {
        return Err(InvalidField::new(
            format!("{field}.password"),
            "must not be empty",
        ));
    }
    Ok(postmark::Postmark::with_credentials(&pairs))
}

/// HMAC-SHA256 of `parts` under `key`.
/// A recipient (phone number, address) as it may appear in a provider event id: the first 16
/// hex digits of its SHA-256. Event ids are shown in listings, explain and the admin page, which
/// never show a recipient; the hash keeps ids distinct and stable.
pub fn recipient_tag(recipient: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(recipient.as_bytes())[..8])
}

pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    use hmac::{Hmac, Mac};
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// A provider fixture, `fixtures/providers/REL` in this checkout ([`crate::repo_path`]).
#[cfg(test)]
pub(crate) fn fixture_path(rel: &str) -> std::path::PathBuf {
    crate::repo_path("fixtures/providers").join(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_read_as_they_always_have() {
        let refusal = |c: SourceConfig| build("sources.s", &c).err().unwrap().to_string();
        let with = |scheme: &str, secret: &str| SourceConfig {
            scheme: scheme.into(),
            secrets: vec![Secret::new(secret)],
            ..Default::default()
        };
        assert_eq!(
            refusal(SourceConfig {
                public_url: Some("not a url".into()),
                ..with("twilio", "t")
            }),
            "sources.s.public_url: is not a valid URL (relative URL without a base)"
        );
        assert_eq!(
            refusal(SourceConfig {
                encoding: Some("b32".into()),
                ..with("hmac", "k")
            }),
            r#"sources.s: encoding "b32" must be hex or base64"#
        );
        assert_eq!(
            refusal(SourceConfig {
                signed: Some("all".into()),
                ..with("hmac", "k")
            }),
            r#"sources.s: signed "all" must be body or timestamp.body"#
        );
        assert_eq!(
            refusal(with("standard-webhooks", "whsec_!!!")),
            "sources.s.secrets: must be whsec_ followed by base64"
        );
        assert_eq!(
            refusal(with("sendgrid", "!!!")),
            "sources.s.secrets: must be base64 (the verification key SendGrid shows)"
        );
        assert_eq!(
            refusal(with("sendgrid", "c2hvcnQ=")),
            "sources.s.secrets: is not a P-256 public key"
        );
    }

    #[test]
    fn sms_sources_name_what_they_refuse() {
        let refusal = |c: SourceConfig| build("sources.s", &c).err().unwrap().to_string();
        let with = |scheme: &str, secret: &str| SourceConfig {
            scheme: scheme.into(),
            secrets: vec![Secret::new(secret)],
            ..Default::default()
        };
        assert_eq!(
            refusal(SourceConfig {
                signature_method: Some("crc32".into()),
                ..with("vonage", "k")
            }),
            r#"sources.s.signature_method: "crc32" is not one of md5hash, md5, sha1, sha256 or sha512"#
        );
        assert_eq!(
            refusal(with("telnyx", "c2hvcnQ=")),
            "sources.s.secrets: is not an Ed25519 public key (32 bytes)"
        );
        assert_eq!(
            refusal(with("telnyx", "not base64!")),
            "sources.s.secrets: must be the base64 of an Ed25519 public key"
        );
        for scheme in ["plivo", "messagebird"] {
            assert_eq!(
                refusal(with(scheme, "k")),
                format!(
                    "sources.s.public_url: is required for {scheme}: the URL exactly as the \
                     provider calls it"
                )
            );
            assert!(
                refusal(SourceConfig {
                    public_url: Some("/relative".into()),
                    ..with(scheme, "k")
                })
                .starts_with("sources.s.public_url: is not a valid URL")
            );
        }
        assert_eq!(
            refusal(with("standard-webhooks", "whsk_AAAA")),
            "sources.s.secrets: is a whsk_ secret key: give its whpk_ public key"
        );
        assert_eq!(
            refusal(with("standard-webhooks", "whpk_c2hvcnQ=")),
            "sources.s.secrets: is not an Ed25519 public key (32 bytes)"
        );
        assert_eq!(
            refusal(SourceConfig {
                scheme: "vonage".into(),
                ..Default::default()
            }),
            "sources.s.secrets: at least one secret is required"
        );
        // Every method parses; Messages-API-only sources need none.
        for m in ["md5hash", "md5", "sha1", "sha256", "sha512"] {
            assert!(
                build(
                    "s",
                    &SourceConfig {
                        signature_method: Some(m.into()),
                        ..with("vonage", "k")
                    }
                )
                .is_ok()
            );
        }
        assert!(build("s", &with("vonage", "k")).is_ok());
    }
}

#[cfg(test)]
mod hostile_input {
    //! Property tests: hostile input to the SMS schemes' parsers (and Standard Webhooks `v1a`)
    //! never panics and is never accepted. A bounded number of cases, so the suite stays fast.
    use chrono::{TimeZone, Utc};
    use proptest::prelude::*;

    use super::*;
    use crate::ingest::RawRequest;

    /// Pieces that reach the parsers' corners: separators, encodings, JWT and base64 shapes.
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("&".to_owned()),
            Just("=".to_owned()),
            Just("?".to_owned()),
            Just("#".to_owned()),
            Just("%".to_owned()),
            Just("%zz".to_owned()),
            Just("%5B".to_owned()),
            Just("+".to_owned()),
            Just(".".to_owned()),
            Just(",".to_owned()),
            Just("|".to_owned()),
            Just("sig=".to_owned()),
            Just("timestamp=1385047698".to_owned()),
            Just("status=delivered".to_owned()),
            Just("messageId=x".to_owned()),
            Just("MessageUUID=u&Status=sent".to_owned()),
            Just("id=1&status=sent".to_owned()),
            Just("Bearer ".to_owned()),
            Just("eyJhbGciOiJIUzI1NiJ9".to_owned()),
            Just("eyJhbGciOiJub25lIn0".to_owned()),
            Just("eyJ9".to_owned()),
            Just("v1a,".to_owned()),
            Just("v1,".to_owned()),
            Just("whpk_".to_owned()),
            Just("AAAA".to_owned()),
            Just("==".to_owned()),
            Just("{\"data\":{\"id\":\"e\",\"payload\":{\"to\":[{}]}}}".to_owned()),
            Just("9999999999999999999999".to_owned()),
            Just("-1".to_owned()),
            Just("é".to_owned()),
            Just("\u{0}".to_owned()),
            "[ -~]{0,8}",
            any::<String>(),
        ]
    }

    fn junk() -> impl Strategy<Value = String> {
        prop::collection::vec(piece(), 0..10).prop_map(|v| v.concat())
    }

    fn sources() -> Vec<Arc<dyn Source>> {
        let c = |scheme: &str, secret: &str, extra: fn(&mut SourceConfig)| {
            let mut c = SourceConfig {
                scheme: scheme.into(),
                secrets: vec![Secret::new(secret)],
                public_url: keys_of(scheme)
                    .is_some_and(|k| k.contains(&"public_url"))
                    .then(|| "https://h.example/in".into()),
                ..Default::default()
            };
            extra(&mut c);
            build("s", &c).unwrap()
        };
        vec![
            c("vonage", "k", |c| {
                c.signature_method = Some("md5hash".into())
            }),
            c("vonage", "k", |c| {
                c.signature_method = Some("sha512".into())
            }),
            c(
                "telnyx",
                "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=",
                |_| {},
            ),
            c("plivo", "k", |_| {}),
            c("messagebird", "k", |_| {}),
            c(
                "standard-webhooks",
                "whpk_ZlN4eg7dSSqi0moX9hQUk3orrOouK3QVQSlJa248c/g=",
                |_| {},
            ),
        ]
    }

    const HEADERS: &[&str] = &[
        "authorization",
        "content-type",
        "telnyx-signature-ed25519",
        "telnyx-timestamp",
        "x-plivo-signature-v3",
        "x-plivo-signature-ma-v3",
        "x-plivo-signature-v3-nonce",
        "messagebird-signature-jwt",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    ];

    proptest! {
        // Bounded, and no regression files written into the source tree.
        #![proptest_config(ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn hostile_requests_are_refused_without_panicking(
            values in prop::collection::vec(prop::option::of(junk()), HEADERS.len()),
            body in junk(),
            query in prop::option::of(junk()),
            get in any::<bool>(),
            now in 0i64..4_000_000_000,
        ) {
            let headers: Vec<(String, String)> = HEADERS
                .iter()
                .zip(values)
                .filter_map(|(n, v)| Some((n.to_string(), v?)))
                .collect();
            let r = RawRequest {
                headers: &headers,
                body: body.as_bytes(),
                query: query.as_deref(),
                method: if get { "GET" } else { "POST" },
            };
            let now = Utc.timestamp_opt(now, 0).unwrap();
            for s in sources() {
                prop_assert!(s.verify(&r, now).is_err(), "{} accepted junk", s.scheme());
            }
        }

        #[test]
        fn canonical_strings_take_any_input(
            url in junk(),
            pairs in prop::collection::vec((junk(), junk()), 0..6),
            s in junk(),
        ) {
            let _ = plivo::signed_strings(&url, "GET", &pairs);
            let _ = plivo::signed_strings(&url, "POST", &pairs);
            let mut map: std::collections::BTreeMap<String, String> = pairs.iter().cloned().collect();
            map.remove("sig");
            let mut with_sig = map.clone();
            with_sig.insert("sig".into(), s.clone());
            prop_assert_eq!(
                vonage::sms_signed_string(&with_sig),
                vonage::sms_signed_string(&map),
                "sig is never signed"
            );
            let _ = vonage::scts_time(&s);
            let _ = params::received_url(&url, Some(&s));
            let _ = jwt::verify_hmac(&s, &["k".into()], &[jsonwebtoken::Algorithm::HS256]);
            let _ = telnyx::parse_public_key(&s);
        }
    }
}
