//! Domain vocabulary: parsed identifiers and the state, class and semantics strings of the
//! interface contract. Everything past the HTTP handler or the library API is one of these types,
//! never a bare string.

pub mod classify;
pub mod event_type;
mod fingerprint;
pub mod policies;
pub mod ses_tag;

pub use fingerprint::{Fingerprint, FingerprintInput};

use chrono::{DateTime, Utc};
use std::fmt;

/// The key of Herald's deterministic email `Message-ID` (`<KEY@message_id_domain>`): the first
/// 16 bytes of SHA-256 over the event id, in lowercase hex. Stored on email messages so that a
/// receipt carrying only the `Message-ID` finds its message.
pub fn email_message_key(event_id: &str) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(event_id.as_bytes())[..16])
}

/// The key of a `Message-ID` that Herald generated for `domain` (angle brackets optional);
/// `None` for any other id.
pub fn parse_email_message_key(message_id: &str, domain: &str) -> Option<String> {
    let id = message_id.trim();
    let id = id.strip_prefix('<').unwrap_or(id);
    let id = id.strip_suffix('>').unwrap_or(id);
    let (key, at) = id.split_once('@')?;
    (at.eq_ignore_ascii_case(domain)
        && key.len() == 32
        && key
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then(|| key.to_owned())
}

/// The name of the configured endpoint a webhook destination `endpoint:NAME` names; `None` for a
/// URL or a `type:` destination. The name is not checked here ([`is_endpoint_name`]).
pub fn endpoint_name(destination: &str) -> Option<&str> {
    destination.strip_prefix("endpoint:")
}

/// Whether `name` can be named by a destination `endpoint:NAME`: 1–64 letters, digits, `-`, `_`.
pub fn is_endpoint_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The webhook destination `endpoint:NAME` of the configured endpoint `name`.
pub fn endpoint_destination(name: &str) -> String {
    format!("endpoint:{name}")
}

/// Why a value was refused; `field` names the offending input field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidField {
    pub field: String,
    pub message: String,
}

impl InvalidField {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// A body serde_json could not read as a value. Where the text is JSON but holds a value it
    /// cannot represent (a number beyond f64's range, `1e400`), the field that holds it
    /// (`max_attempts`, `payload.attachments[0].size`), found by the error's position; otherwise
    /// `body`.
    pub fn of_json(body: &[u8], e: &serde_json::Error) -> Self {
        let well_formed = serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok();
        match json_path_at(body, e.line(), e.column()).filter(|_| well_formed) {
            Some(field) => Self::new(field, format!("cannot be read: {e}")),
            None => Self::new("body", format!("is not valid JSON: {e}")),
        }
    }
}

/// An RFC 3339 time a user gave (`2026-11-30T12:00:00Z`, any offset), in UTC; refused naming
/// `field` when it is not one, or when in UTC it falls outside the years 1–9999 (which both
/// backends store: SQLite's times are four-digit-year text, `9999-12-31T23:59:59-01:00` is year
/// 10000 in UTC).
pub fn parse_time(field: &str, text: &str) -> Result<DateTime<Utc>, InvalidField> {
    let t = DateTime::parse_from_rfc3339(text)
        .map_err(|_| {
            InvalidField::new(
                field,
                "must be an RFC 3339 time such as 2026-11-30T12:00:00Z",
            )
        })?
        .with_timezone(&Utc);
    storable_time(field, t)
}

/// `t`, a leap second (`23:59:60`, which RFC 3339 allows and chrono reads) taken as PostgreSQL
/// takes one on input: the first second of the next minute, its fraction kept. chrono holds it
/// as second 59 with more than a whole second of fraction, which neither backend stores as such
/// (SQLite's text would read `:60`, a 500 for the message that gave it).
pub fn without_leap_second(t: DateTime<Utc>) -> DateTime<Utc> {
    let nanos = chrono::Timelike::nanosecond(&t);
    if nanos < 1_000_000_000 {
        return t;
    }
    chrono::Timelike::with_nanosecond(&t, nanos - 1_000_000_000)
        .map_or(t, |t| t + chrono::TimeDelta::seconds(1))
}

/// `t` if both backends can store it (years 1–9999 in UTC), else refused naming `field`; a leap
/// second is the next minute's first ([`without_leap_second`]).
pub fn storable_time(field: &str, t: DateTime<Utc>) -> Result<DateTime<Utc>, InvalidField> {
    let t = without_leap_second(t);
    if (1..=9999).contains(&chrono::Datelike::year(&t)) {
        Ok(t)
    } else {
        Err(InvalidField::new(
            field,
            "must fall within the years 1 to 9999 in UTC",
        ))
    }
}

/// Where a scan of a JSON text stands: the containers it is in, outermost first.
enum Frame {
    Object { key: Option<String>, at_key: bool },
    Array(usize),
}

/// The path of the value the scan stands in: object keys joined by `.`, array places as `[i]`.
/// None at the top level, or at an object's key.
fn path_of(stack: &[Frame]) -> Option<String> {
    let mut path = String::new();
    for frame in stack {
        match frame {
            Frame::Object {
                key: Some(k),
                at_key: false,
            } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
            }
            Frame::Array(n) => path.push_str(&format!("[{n}]")),
            Frame::Object { .. } => return None,
        }
    }
    (!path.is_empty()).then_some(path)
}

/// Scans the JSON text `body` up to byte `end`, calling `on_number` with each number's text
/// and where it stands; returns where the scan stands at `end`. (It trusts the text to be JSON:
/// the parser has said so, or is about to.)
fn scan_json(body: &[u8], end: usize, mut on_number: impl FnMut(&[u8], &[Frame])) -> Vec<Frame> {
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    while i < end {
        match body[i] {
            b'{' => stack.push(Frame::Object {
                key: None,
                at_key: true,
            }),
            b'[' => stack.push(Frame::Array(0)),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::Object { key, at_key }) => (*key, *at_key) = (None, true),
                Some(Frame::Array(n)) => *n += 1,
                None => {}
            },
            b':' => {
                if let Some(Frame::Object { at_key, .. }) = stack.last_mut() {
                    *at_key = false;
                }
            }
            b'"' => {
                let start = i;
                i += 1;
                while i < body.len() && body[i] != b'"' {
                    i += if body[i] == b'\\' { 2 } else { 1 };
                }
                if let Some(Frame::Object { key, at_key: true }) = stack.last_mut() {
                    *key = body
                        .get(start..=i)
                        .and_then(|k| serde_json::from_slice::<String>(k).ok());
                }
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i + 1 < body.len()
                    && matches!(body[i + 1], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                on_number(&body[start..=i], &stack);
            }
            _ => {}
        }
        i += 1;
    }
    stack
}

/// The path of the value at `line`:`column` (1-based, in bytes, as serde_json counts) of the
/// JSON text `body`. None at the top level.
fn json_path_at(body: &[u8], line: usize, column: usize) -> Option<String> {
    let line_start = if line <= 1 {
        0
    } else {
        body.iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .nth(line - 2)
            .map(|(i, _)| i + 1)?
    };
    let end = (line_start + column).min(body.len());
    path_of(&scan_json(body, end, |_, _| {}))
}

/// The integers of the JSON text `body` that no 64-bit integer holds
/// (`18446744073709551617`), as the places they stand in (`body` for the top level). The
/// parser keeps such a number only as the nearest double, so it would be stored and sent as
/// another number (`1.8446744073709552e+19`): refused, with where it is.
pub fn integers_beyond_64_bits(body: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    scan_json(body, body.len(), |number, stack| {
        let integer = !number.iter().any(|b| matches!(b, b'.' | b'e' | b'E'));
        let text = std::str::from_utf8(number).unwrap_or("");
        // A double written out in full (JavaScript's and Go's 2^64, `18446744073709552000`)
        // is kept exactly: the parser's double prints as the same text.
        let exact_double = || text.parse::<f64>().is_ok_and(|f| format!("{f}") == text);
        if integer
            && text.parse::<i64>().is_err()
            && text.parse::<u64>().is_err()
            && !exact_double()
        {
            found.push(path_of(stack).unwrap_or_else(|| "body".to_owned()));
        }
    });
    found
}

/// The keys given more than once in one object of the JSON text `body`, as the places they
/// stand in (`event_id`, `payload.body.a[0].b`), at most `limit`. A parser keeps the last of
/// them and another may keep the first (a proxy reading `event_id`, say), and a body sent on
/// would lose one without a word: refused, naming it. Empty for a text that is not JSON (the
/// parser names that).
pub fn duplicate_keys(body: &[u8], limit: usize) -> Vec<String> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

    struct Walk<'a> {
        path: &'a mut String,
        found: &'a mut Vec<String>,
        limit: usize,
    }

    impl Walk<'_> {
        fn under(&mut self, segment: std::fmt::Arguments<'_>) -> (Walk<'_>, usize) {
            let at = self.path.len();
            use std::fmt::Write;
            let _ = self.path.write_fmt(segment);
            (
                Walk {
                    path: self.path,
                    found: self.found,
                    limit: self.limit,
                },
                at,
            )
        }
    }

    impl<'de> DeserializeSeed<'de> for Walk<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Walk<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            let mut n = 0usize;
            loop {
                let (walk, at) = self.under(format_args!("[{n}]"));
                let more = seq.next_element_seed(walk)?.is_some();
                self.path.truncate(at);
                if !more {
                    return Ok(());
                }
                n += 1;
            }
        }
        fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                let dot = if self.path.is_empty() { "" } else { "." };
                let (walk, at) = self.under(format_args!("{dot}{key}"));
                if !seen.insert(key)
                    && walk.found.len() < walk.limit
                    && !walk.found.contains(walk.path)
                {
                    walk.found.push(walk.path.clone());
                }
                map.next_value_seed(walk)?;
                self.path.truncate(at);
            }
            Ok(())
        }
    }

    let (mut path, mut found) = (String::new(), Vec::new());
    let mut d = serde_json::Deserializer::from_slice(body);
    let walk = Walk {
        path: &mut path,
        found: &mut found,
        limit,
    };
    if walk.deserialize(&mut d).is_err() {
        return Vec::new();
    }
    found
}

/// [`duplicate_keys`] (at most 10) as refusals naming each.
pub fn keys_given_twice(body: &[u8]) -> Vec<InvalidField> {
    duplicate_keys(body, 10)
        .into_iter()
        .map(|field| {
            InvalidField::new(field, "is given more than once in its object; give it once")
        })
        .collect()
}

/// The stable operation key of a message: unique in the outbox, sent with every request.
///
/// 1 to 255 visible ASCII characters, so it can travel in an HTTP header and an email header.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(String);

impl EventId {
    pub const MAX_LEN: usize = 255;

    pub fn parse(raw: &str) -> Result<Self, InvalidField> {
        if raw.is_empty() {
            return Err(InvalidField::new("event_id", "must not be empty"));
        }
        if raw.len() > Self::MAX_LEN {
            return Err(InvalidField::new(
                "event_id",
                format!("must be at most {} characters", Self::MAX_LEN),
            ));
        }
        if !raw.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(InvalidField::new(
                "event_id",
                "must be visible ASCII characters without spaces",
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Declares a closed set of contract strings with `as_str`, `parse` and `ALL`.
macro_rules! contract_enum {
    ($(#[$meta:meta])* $name:ident, $field:literal { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        ///
        /// Stored as its contract string (a `TEXT` column) on both backends; a stored value
        /// outside the set is a read error, never a silent default.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, diesel::expression::AsExpression, diesel::deserialize::FromSqlRow)]
        #[diesel(sql_type = diesel::sql_types::Text)]
        pub enum $name { $($variant),+ }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        /// A string with one of the contract values (`/openapi.json`).
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::Type::String)
                    .enum_values(Some([$($text),+]))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}

        impl<DB> diesel::deserialize::FromSql<diesel::sql_types::Text, DB> for $name
        where
            DB: diesel::backend::Backend,
            String: diesel::deserialize::FromSql<diesel::sql_types::Text, DB>,
        {
            fn from_sql(bytes: DB::RawValue<'_>) -> diesel::deserialize::Result<Self> {
                let raw = String::from_sql(bytes)?;
                Ok(Self::parse(&raw)?)
            }
        }

        impl diesel::serialize::ToSql<diesel::sql_types::Text, diesel::pg::Pg> for $name {
            fn to_sql<'b>(
                &'b self,
                out: &mut diesel::serialize::Output<'b, '_, diesel::pg::Pg>,
            ) -> diesel::serialize::Result {
                <str as diesel::serialize::ToSql<diesel::sql_types::Text, diesel::pg::Pg>>::to_sql(
                    self.as_str(),
                    out,
                )
            }
        }

        impl diesel::serialize::ToSql<diesel::sql_types::Text, diesel::sqlite::Sqlite> for $name {
            fn to_sql<'b>(
                &'b self,
                out: &mut diesel::serialize::Output<'b, '_, diesel::sqlite::Sqlite>,
            ) -> diesel::serialize::Result {
                out.set_value(self.as_str());
                Ok(diesel::serialize::IsNull::No)
            }
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            pub fn parse(raw: &str) -> Result<Self, InvalidField> {
                match raw {
                    $($text => Ok($name::$variant),)+
                    _ => Err(InvalidField::new(
                        $field,
                        format!("must be one of: {}", [$($text),+].join(", ")),
                    )),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

contract_enum!(
    /// What a key does when its head message ends `dead_letter` or `unconfirmed`: `block` (the
    /// key halts until the head is replayed, canceled or skipped) or `skip` (the rest proceed).
    OrderingPolicy, "ordering_policy" { Block => "block", Skip => "skip" }
);

impl OrderingPolicy {
    /// A keyed message's head-of-line policy: its own, else its endpoint's, else `block`; `None`
    /// for an unkeyed message.
    pub fn effective(keyed: bool, own: Option<Self>, endpoint: Option<Self>) -> Option<Self> {
        keyed.then(|| own.or(endpoint).unwrap_or(Self::Block))
    }
}

/// A message's ordering key: messages with the same key and destination are attempted one at a
/// time, in their order. 1 to 255 visible ASCII characters (as an event id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OrderingKey(String);

impl OrderingKey {
    pub const MAX_LEN: usize = 255;

    pub fn parse(raw: &str) -> Result<Self, InvalidField> {
        if raw.is_empty() {
            return Err(InvalidField::new("ordering_key", "must not be empty"));
        }
        if raw.len() > Self::MAX_LEN {
            return Err(InvalidField::new(
                "ordering_key",
                format!("must be at most {} characters", Self::MAX_LEN),
            ));
        }
        if !raw.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(InvalidField::new(
                "ordering_key",
                "must be visible ASCII characters without spaces",
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

contract_enum!(
    /// How a message travels.
    Channel, "channel" { Email => "email", Webhook => "webhook" }
);

contract_enum!(
    /// Where a message is in its life; see DESIGN.md "Outbox row and state machine".
    State, "state" {
        Scheduled => "scheduled",
        Sending => "sending",
        Retryable => "retryable",
        Delivered => "delivered",
        DeadLetter => "dead_letter",
        Unconfirmed => "unconfirmed",
        Canceled => "canceled",
        Expired => "expired",
    }
);

impl State {
    /// States the sender never leaves on its own.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            State::Delivered
                | State::DeadLetter
                | State::Unconfirmed
                | State::Canceled
                | State::Expired
        )
    }

    /// States an application may still cancel.
    pub fn is_cancelable(self) -> bool {
        matches!(self, State::Scheduled | State::Retryable)
    }
}

contract_enum!(
    /// How one attempt's outcome was classified (the control plane).
    AttemptClass, "class" {
        Accepted => "accepted",
        Conflict => "conflict",
        RateLimited => "rate_limited",
        Transient => "transient",
        NotSent => "not_sent",
        Ambiguous => "ambiguous",
        Permanent => "permanent",
        Exhausted => "exhausted",
    }
);

contract_enum!(
    /// Whether an ambiguous attempt may be repeated automatically.
    Semantics, "semantics" { AtLeastOnce => "at_least_once", AtMostOnce => "at_most_once" }
);

#[cfg(test)]
mod tests {
    #[test]
    fn keys_given_twice_are_named_where_they_stand() {
        let dup = |body: &str| super::duplicate_keys(body.as_bytes(), 10);
        assert_eq!(dup(r#"{"event_id":"a","event_id":"b"}"#), ["event_id"]);
        assert_eq!(
            dup(r#"{"payload":{"body":{"a":[{"b":1,"c":2,"b":3}]}},"x":{"y":1}}"#),
            ["payload.body.a[0].b"]
        );
        // Thrice is named once; the same key in two objects is no repeat.
        assert_eq!(dup(r#"{"a":1,"a":2,"a":3}"#), ["a"]);
        assert!(dup(r#"[{"a":1},{"a":2}]"#).is_empty());
        assert!(dup(r#"{"a":{"a":1}}"#).is_empty());
        // Keys compare as decoded: an escape is the same key.
        assert_eq!(dup(r#"{"ab":1,"a\u0062":2}"#), ["ab"]);
        assert!(dup("not json").is_empty());
        assert_eq!(
            super::duplicate_keys(br#"{"a":1,"a":2,"b":1,"b":2}"#, 1),
            ["a"]
        );
    }

    #[test]
    fn a_value_json_cannot_hold_is_named_by_its_field() {
        let field = |body: &str| {
            let e = serde_json::from_str::<serde_json::Value>(body).unwrap_err();
            InvalidField::of_json(body.as_bytes(), &e).field
        };
        assert_eq!(
            field(r#"{"event_id":"a","max_attempts":1e400}"#),
            "max_attempts"
        );
        assert_eq!(
            field("{\"a\": 1,\n \"payload\": {\"x\\\"y\": \"}\", \"list\": [1, {\"n\": -1e999}]}}"),
            "payload.list[1].n"
        );
        assert_eq!(field("[0, 1e400]"), "[1]");
        // Integers no 64 bits hold, where they stand; those that fit, and doubles, are fine.
        assert_eq!(
            integers_beyond_64_bits(
                br#"{"a": 18446744073709551615, "b": -9223372036854775808, "c": [1, 18446744073709551616],
                    "d": {"e": -9223372036854775809, "s": "99999999999999999999"}, "f": 1.5e300}"#
            ),
            ["c[1]", "d.e"]
        );
        assert_eq!(integers_beyond_64_bits(b"123456789012345678901"), ["body"]);
        // Doubles written out in full are kept exactly: 2^64 and 1e20 as JavaScript writes them.
        assert!(
            integers_beyond_64_bits(b"[18446744073709552000, -100000000000000000000]").is_empty()
        );
        // Not JSON at all: the body.
        assert_eq!(field(r#"{"max_attempts": 1e400"#), "body");
        assert_eq!(field(r#"{"a": tru}"#), "body");
        assert_eq!(field(""), "body");
        let e = serde_json::from_str::<serde_json::Value>("[1e400]").unwrap_err();
        assert!(
            InvalidField::of_json(b"[1e400]", &e)
                .message
                .contains("number out of range")
        );
    }

    #[test]
    fn an_ordering_key_is_visible_ascii_up_to_255() {
        assert!(OrderingKey::parse("order-42").is_ok());
        assert!(OrderingKey::parse(&"k".repeat(255)).is_ok());
        for bad in ["", "has space", "tab\t", "é", &"k".repeat(256)] {
            let e = OrderingKey::parse(bad).unwrap_err();
            assert_eq!(e.field, "ordering_key", "{bad:?}");
        }
        assert_eq!(OrderingPolicy::parse("skip"), Ok(OrderingPolicy::Skip));
        assert_eq!(OrderingPolicy::Block.as_str(), "block");
        assert_eq!(
            OrderingPolicy::parse("Block").unwrap_err().field,
            "ordering_policy"
        );
    }

    #[test]
    fn a_keyed_message_takes_its_own_policy_else_its_endpoints_else_block() {
        use OrderingPolicy::{Block, Skip};
        let all = [None, Some(Block), Some(Skip)];
        for own in all {
            for endpoint in all {
                assert_eq!(OrderingPolicy::effective(false, own, endpoint), None);
                let expected = own.or(endpoint).unwrap_or(Block);
                assert_eq!(
                    OrderingPolicy::effective(true, own, endpoint),
                    Some(expected),
                    "{own:?} {endpoint:?}"
                );
            }
        }
        assert_eq!(
            OrderingPolicy::effective(true, None, Some(Skip)),
            Some(Skip)
        );
        assert_eq!(
            OrderingPolicy::effective(true, Some(Block), Some(Skip)),
            Some(Block)
        );
    }
    use super::*;

    #[test]
    fn times_are_read_in_utc_within_the_years_both_backends_store() {
        let t = parse_time("f", "2026-11-30T12:00:00+01:00").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-11-30T11:00:00+00:00");
        for (text, why) in [
            ("9999-12-31T23:59:59-01:00", "years 1 to 9999"),
            ("0001-01-01T00:30:00+01:00", "years 1 to 9999"),
            ("0000-06-01T00:00:00Z", "years 1 to 9999"),
            ("tomorrow", "RFC 3339"),
            ("2026-02-30T00:00:00Z", "RFC 3339"),
        ] {
            let e = parse_time("scheduled_at", text).unwrap_err();
            assert_eq!(e.field, "scheduled_at");
            assert!(e.message.contains(why), "{text}: {e}");
        }
        assert!(parse_time("f", "9999-12-31T23:59:59.999Z").is_ok());
        assert!(parse_time("f", "0001-01-01T00:00:00Z").is_ok());
        // A leap second is the next minute's first, its fraction kept, at any offset.
        for (leap, then) in [
            ("2016-12-31T23:59:60Z", "2017-01-01T00:00:00+00:00"),
            ("2016-12-31T23:59:60.5Z", "2017-01-01T00:00:00.500+00:00"),
            ("2017-01-01T00:59:60+01:00", "2017-01-01T00:00:00+00:00"),
        ] {
            assert_eq!(parse_time("f", leap).unwrap().to_rfc3339(), then, "{leap}");
        }
        let e = parse_time("f", "9999-12-31T23:59:60Z").unwrap_err();
        assert!(e.message.contains("years 1 to 9999"), "{e}");
        let plain = parse_time("f", "2016-12-31T23:59:59.5Z").unwrap();
        assert_eq!(without_leap_second(plain), plain);
    }

    #[test]
    fn event_id_accepts_operation_keys_and_refuses_the_rest() {
        assert!(EventId::parse("reservation-42:reminder:2026-11-30T10:00:00Z").is_ok());
        for bad in ["", "has space", "tab\there", "ümlaut", &"x".repeat(256)] {
            let err = EventId::parse(bad).unwrap_err();
            assert_eq!(err.field, "event_id", "{bad:?}");
        }
        assert!(EventId::parse(&"x".repeat(255)).is_ok());
    }

    #[test]
    fn contract_strings_round_trip() {
        for s in State::ALL {
            assert_eq!(State::parse(s.as_str()), Ok(*s));
        }
        for c in AttemptClass::ALL {
            assert_eq!(AttemptClass::parse(c.as_str()), Ok(*c));
        }
        let names: Vec<_> = State::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "scheduled",
                "sending",
                "retryable",
                "delivered",
                "dead_letter",
                "unconfirmed",
                "canceled",
                "expired"
            ]
        );
        let classes: Vec<_> = AttemptClass::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            classes,
            [
                "accepted",
                "conflict",
                "rate_limited",
                "transient",
                "not_sent",
                "ambiguous",
                "permanent",
                "exhausted"
            ]
        );
        assert_eq!(Channel::parse("sms").unwrap_err().field, "channel");
    }

    #[test]
    fn herald_message_ids_parse_back_to_their_key() {
        let key = email_message_key("order-1");
        assert_eq!(key.len(), 32);
        for id in [
            format!("<{key}@herald.localhost>"),
            format!("{key}@herald.localhost"),
            format!("<{key}@HERALD.localhost>"),
        ] {
            assert_eq!(
                parse_email_message_key(&id, "herald.localhost"),
                Some(key.clone()),
                "{id}"
            );
        }
        for other in [
            format!("<{key}@elsewhere.example>"),
            "<20130503182626.18666.16540@example.com>".to_owned(),
            format!("<{}@herald.localhost>", &key[..31]),
            format!("<{}@herald.localhost>", key.to_uppercase()),
            "0100015dad".to_owned(),
        ] {
            assert_eq!(
                parse_email_message_key(&other, "herald.localhost"),
                None,
                "{other}"
            );
        }
    }

    #[test]
    fn terminal_and_cancelable_states() {
        let terminal: Vec<_> = State::ALL.iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal.len(), 5);
        assert!(State::Scheduled.is_cancelable() && State::Retryable.is_cancelable());
        assert!(!State::Sending.is_cancelable() && !State::Delivered.is_cancelable());
    }
}
