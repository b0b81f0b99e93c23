//! Correlation through an SMTP relay (`smtp_provider`): Herald's event id written where that
//! provider echoes it back in its delivery receipts, under the name `herald_event_id`, so the
//! provider's normalizer (`ingest::schemes`) reads it back.
//!
//! | provider | header written | where its receipt echoes it |
//! |---|---|---|
//! | `sendgrid` | `X-SMTPAPI: {"unique_args": {"herald_event_id": "…"}}` | every Event Webhook event, as a top-level key |
//! | `mailgun` | `X-Mailgun-Variables: {"herald_event_id": "…"}` | `event-data.user-variables` |
//! | `postmark` | `X-PM-Metadata-herald_event_id: …` | the webhook's `Metadata` |
//! | `ses` | `X-SES-MESSAGE-TAGS: herald_event_id=…` ([`ses_tag`] encoding) | `mail.tags` (event publishing through a configuration set) |
//! | `resend` | `Resend-Idempotency-Key: …` (no tag: Resend's SMTP relay has no tag header) | — |
//!
//! A message's own headers with the same names are merged, not replaced: its `X-SMTPAPI` and
//! `X-Mailgun-Variables` must be JSON objects (checked when the payload is parsed) and gain the
//! key; its `X-SES-MESSAGE-TAGS` gains the tag (one of its own named `herald_event_id` is
//! dropped). Every other header a message sets is left alone.

use std::str::FromStr;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::domain::ses_tag;

/// The name the event id travels under with every provider.
pub const KEY: &str = "herald_event_id";

/// The relay `smtp_url` points at, as `smtp_provider` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayProvider {
    SendGrid,
    Mailgun,
    Postmark,
    Ses,
    Resend,
}

impl RelayProvider {
    pub const NAMES: &[&str] = &["sendgrid", "mailgun", "postmark", "ses", "resend"];

    pub fn as_str(self) -> &'static str {
        match self {
            RelayProvider::SendGrid => "sendgrid",
            RelayProvider::Mailgun => "mailgun",
            RelayProvider::Postmark => "postmark",
            RelayProvider::Ses => "ses",
            RelayProvider::Resend => "resend",
        }
    }
}

/// `smtp_provider` is not one of [`RelayProvider::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a known SMTP relay; use one of sendgrid, mailgun, postmark, ses, resend")]
pub struct UnknownProvider(pub String);

impl FromStr for RelayProvider {
    type Err = UnknownProvider;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "sendgrid" => RelayProvider::SendGrid,
            "mailgun" => RelayProvider::Mailgun,
            "postmark" => RelayProvider::Postmark,
            "ses" => RelayProvider::Ses,
            "resend" => RelayProvider::Resend,
            _ => return Err(UnknownProvider(s.to_owned())),
        })
    }
}

/// SendGrid's header.
pub const SENDGRID: &str = "X-SMTPAPI";
/// Mailgun's header.
pub const MAILGUN: &str = "X-Mailgun-Variables";
/// Postmark's header: `X-PM-Metadata-` and the metadata key.
pub const POSTMARK: &str = "X-PM-Metadata-herald_event_id";
/// SES's header.
pub const SES: &str = "X-SES-MESSAGE-TAGS";
/// Resend's header.
pub const RESEND: &str = "Resend-Idempotency-Key";

/// Headers whose value a message may set only as a JSON object (they are merged, see the module
/// documentation).
pub const JSON_OBJECT_HEADERS: &[&str] = &[SENDGRID, MAILGUN];

/// `headers` (a message's own, validated) with the provider's correlation for `event_id` added
/// or merged in.
pub fn correlate(
    provider: RelayProvider,
    event_id: &str,
    mut headers: Vec<(String, String)>,
) -> Vec<(String, String)> {
    let position = |headers: &[(String, String)], name: &str| {
        headers
            .iter()
            .position(|(n, _)| n.eq_ignore_ascii_case(name))
    };
    let take = |headers: &mut Vec<(String, String)>, name: &str| {
        position(headers, name).map(|i| headers.remove(i).1)
    };
    let object = |existing: Option<String>| -> Map<String, Value> {
        match existing.map(|v| serde_json::from_str::<Value>(&v)) {
            Some(Ok(Value::Object(m))) => m,
            _ => Map::new(),
        }
    };
    match provider {
        RelayProvider::SendGrid => {
            let mut smtpapi = object(take(&mut headers, SENDGRID));
            let args = smtpapi
                .entry("unique_args")
                .or_insert_with(|| Value::Object(Map::new()));
            if !args.is_object() {
                *args = Value::Object(Map::new());
            }
            if let Value::Object(args) = args {
                args.insert(KEY.into(), Value::String(event_id.into()));
            }
            headers.push((SENDGRID.into(), spaced_json(&Value::Object(smtpapi))));
        }
        RelayProvider::Mailgun => {
            let mut vars = object(take(&mut headers, MAILGUN));
            vars.insert(KEY.into(), Value::String(event_id.into()));
            headers.push((MAILGUN.into(), spaced_json(&Value::Object(vars))));
        }
        RelayProvider::Postmark => {
            take(&mut headers, POSTMARK);
            headers.push((POSTMARK.into(), event_id.into()));
        }
        RelayProvider::Ses => {
            let mut tags: Vec<String> = take(&mut headers, SES)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|t| !t.is_empty())
                        .filter(|t| t.split('=').next().map(str::trim) != Some(KEY))
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            // Too long once encoded: no tag (the X-Herald-Event-Id header and the Message-ID
            // still carry the id).
            if let Some(value) = ses_tag::encode(event_id) {
                tags.push(format!("{KEY}={value}"));
            }
            if !tags.is_empty() {
                headers.push((SES.into(), tags.join(", ")));
            }
        }
        RelayProvider::Resend => {
            take(&mut headers, RESEND);
            headers.push((RESEND.into(), event_id.into()));
        }
    }
    headers
}

/// JSON with a space after every `,` and `:` (outside strings), as SendGrid's examples write
/// it: the header encoder folds long lines at spaces, and an SMTP line must stay under 1000
/// characters. ASCII only: a character past it is written `\u00eb` (as SendGrid's own
/// libraries do), so the header needs no RFC 2047 encoding, which put encoded words inside
/// the JSON and left the relay a header it cannot read (`{"customer": =?utf-8?b?…?=`).
pub(crate) fn spaced_json(v: &Value) -> String {
    struct Spaced;
    impl serde_json::ser::Formatter for Spaced {
        fn write_string_fragment<W: ?Sized + std::io::Write>(
            &mut self,
            w: &mut W,
            fragment: &str,
        ) -> std::io::Result<()> {
            for c in fragment.chars() {
                if c.is_ascii() {
                    w.write_all(&[c as u8])?;
                } else {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        write!(w, "\\u{unit:04x}")?;
                    }
                }
            }
            Ok(())
        }
        fn begin_array_value<W: ?Sized + std::io::Write>(
            &mut self,
            w: &mut W,
            first: bool,
        ) -> std::io::Result<()> {
            if first { Ok(()) } else { w.write_all(b", ") }
        }
        fn begin_object_key<W: ?Sized + std::io::Write>(
            &mut self,
            w: &mut W,
            first: bool,
        ) -> std::io::Result<()> {
            if first { Ok(()) } else { w.write_all(b", ") }
        }
        fn begin_object_value<W: ?Sized + std::io::Write>(
            &mut self,
            w: &mut W,
        ) -> std::io::Result<()> {
            w.write_all(b": ")
        }
    }
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Spaced);
    match v.serialize(&mut ser) {
        Ok(()) => String::from_utf8(out).unwrap_or_else(|_| v.to_string()),
        Err(_) => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(provider: RelayProvider, existing: &[(&str, &str)]) -> Vec<(String, String)> {
        correlate(
            provider,
            "order-42:placed",
            existing
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn value<'a>(h: &'a [(String, String)], name: &str) -> &'a str {
        let found: Vec<_> = h
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .collect();
        assert_eq!(found.len(), 1, "{name} once in {h:?}");
        &found[0].1
    }

    #[test]
    fn each_provider_gets_its_documented_header() {
        let json = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        let h = one(RelayProvider::SendGrid, &[]);
        assert_eq!(
            json(value(&h, SENDGRID)),
            json!({"unique_args": {"herald_event_id": "order-42:placed"}})
        );
        let h = one(RelayProvider::Mailgun, &[]);
        assert_eq!(
            json(value(&h, MAILGUN)),
            json!({"herald_event_id": "order-42:placed"})
        );
        let h = one(RelayProvider::Postmark, &[]);
        assert_eq!(value(&h, POSTMARK), "order-42:placed");
        let h = one(RelayProvider::Ses, &[]);
        assert_eq!(value(&h, SES), "herald_event_id=order-42_3Aplaced");
        let h = one(RelayProvider::Resend, &[]);
        assert_eq!(value(&h, RESEND), "order-42:placed");
        assert_eq!(h.len(), 1, "no invented tag header for Resend");
    }

    #[test]
    fn a_messages_own_provider_headers_are_merged() {
        let json = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        let h = one(
            RelayProvider::SendGrid,
            &[
                ("X-Tag", "t"),
                (
                    "x-smtpapi",
                    r#"{"category": ["welcome"], "unique_args": {"tenant": "acme"}}"#,
                ),
            ],
        );
        assert_eq!(value(&h, "X-Tag"), "t");
        assert_eq!(
            json(value(&h, SENDGRID)),
            json!({"category": ["welcome"], "unique_args": {"tenant": "acme", "herald_event_id": "order-42:placed"}})
        );
        let h = one(
            RelayProvider::Mailgun,
            &[(
                MAILGUN,
                r#"{"tenant": "acme", "herald_event_id": "forged"}"#,
            )],
        );
        assert_eq!(
            json(value(&h, MAILGUN)),
            json!({"tenant": "acme", "herald_event_id": "order-42:placed"})
        );
        let h = one(
            RelayProvider::Ses,
            &[(SES, "campaign=spring, herald_event_id=forged")],
        );
        assert_eq!(
            value(&h, SES),
            "campaign=spring, herald_event_id=order-42_3Aplaced"
        );
        let h = one(RelayProvider::Postmark, &[(POSTMARK, "forged")]);
        assert_eq!(value(&h, POSTMARK), "order-42:placed");
    }

    #[test]
    fn an_id_too_long_for_an_ses_tag_gets_none() {
        let long = ":".repeat(100);
        let h = correlate(RelayProvider::Ses, &long, vec![]);
        assert!(h.is_empty(), "{h:?}");
        let h = correlate(
            RelayProvider::Ses,
            &long,
            vec![(SES.into(), "campaign=spring".into())],
        );
        assert_eq!(value(&h, SES), "campaign=spring");
    }

    #[test]
    fn json_headers_have_spaces_to_fold_at() {
        let v = json!({"category": ["a", "b"], "unique_args": {"k": "v, w: x"}});
        assert_eq!(
            spaced_json(&v),
            r#"{"category": ["a", "b"], "unique_args": {"k": "v, w: x"}}"#
        );
        // Past ASCII, escaped (keys too): read back as what was given.
        let v = json!({"unique_args": {"customer": "Zoë Ürban 😀"}, "cätegory": ["wélcome"]});
        let sent = spaced_json(&v);
        assert_eq!(
            sent,
            r#"{"cätegory": ["w\u00e9lcome"], "unique_args": {"customer": "Zo\u00eb \u00dcrban \ud83d\ude00"}}"#
                .replace("ä", "\\u00e4")
        );
        assert!(sent.is_ascii());
        assert_eq!(serde_json::from_str::<Value>(&sent).unwrap(), v);
    }

    #[test]
    fn provider_names_parse() {
        for name in RelayProvider::NAMES {
            assert_eq!(name.parse::<RelayProvider>().unwrap().as_str(), *name);
        }
        assert_eq!(
            " SendGrid ".parse::<RelayProvider>(),
            Ok(RelayProvider::SendGrid)
        );
        assert!("sparkpost".parse::<RelayProvider>().is_err());
    }
}
