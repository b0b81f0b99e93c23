//! Event types and the subscription patterns of fan-out (`destination = "type:EVENT.TYPE"`,
//! `[endpoints.NAME] event_types = [...]`). Pure: parsing and matching, no I/O.
//!
//! - An **event type** is one or more segments separated by `.`, each segment one or more ASCII
//!   letters, digits, `_` or `-`; at most [`EventType::MAX_LEN`] bytes. Case-sensitive:
//!   `order.placed`, `Invoice.paid_v2`, `a-b.c`.
//! - A **pattern** is an event type (matches exactly that type), `PREFIX.*` (matches every type
//!   with one or more segments after `PREFIX`: `order.*` matches `order.placed` and
//!   `order.line.added`, not `order` itself and not `orders.placed`), or `*` alone (every type).
//!   `*` anywhere else (`order*`, `*.placed`, `order.*.x`) is refused.
//!
//! The SQL triggers of the plain-SQL way in (see the migration `2026-12-01-000005_fanout_retention`)
//! implement the same rules; the integration tests hold them to this module.

use std::fmt;

/// A parsed event type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventType(String);

/// Why an event type or pattern was refused (the text follows the field name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventTypeError {
    #[error("an event type must not be empty")]
    Empty,
    #[error("an event type is at most {} bytes", EventType::MAX_LEN)]
    TooLong,
    #[error(
        "an event type is segments of letters, digits, _ and - separated by single dots (order.placed)"
    )]
    Syntax,
    #[error("* may only stand alone or as the whole last segment (order.*)")]
    Wildcard,
}

impl EventType {
    pub const MAX_LEN: usize = 200;

    pub fn parse(s: &str) -> Result<Self, EventTypeError> {
        if s.is_empty() {
            return Err(EventTypeError::Empty);
        }
        if s.len() > Self::MAX_LEN {
            return Err(EventTypeError::TooLong);
        }
        if s.contains('*') {
            return Err(EventTypeError::Wildcard);
        }
        let ok = s.split('.').all(|seg| {
            !seg.is_empty()
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        });
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(EventTypeError::Syntax)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A subscription pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TypePattern {
    /// `*`: every event type.
    All,
    /// `order.placed`: exactly this type.
    Exact(EventType),
    /// `order.*`: every type under `order.` (one or more further segments).
    Under(EventType),
}

impl TypePattern {
    pub fn parse(s: &str) -> Result<Self, EventTypeError> {
        if s == "*" {
            return Ok(Self::All);
        }
        if let Some(prefix) = s.strip_suffix(".*") {
            return match EventType::parse(prefix) {
                Ok(p) => Ok(Self::Under(p)),
                Err(EventTypeError::Empty) => Err(EventTypeError::Wildcard),
                Err(e) => Err(e),
            };
        }
        EventType::parse(s).map(Self::Exact)
    }

    pub fn matches(&self, t: &EventType) -> bool {
        match self {
            Self::All => true,
            Self::Exact(e) => e == t,
            Self::Under(prefix) => t
                .as_str()
                .strip_prefix(prefix.as_str())
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|rest| !rest.is_empty()),
        }
    }
}

impl fmt::Display for TypePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("*"),
            Self::Exact(e) => write!(f, "{e}"),
            Self::Under(p) => write!(f, "{p}.*"),
        }
    }
}

/// The endpoints subscribed to `t`, sorted and without repeats, from `(endpoint, pattern)` pairs.
/// A pattern that does not parse matches nothing (the stored ones were validated when written).
pub fn subscribers<'a>(
    subscriptions: impl IntoIterator<Item = (&'a str, &'a str)>,
    t: &EventType,
) -> Vec<String> {
    let mut out: Vec<String> = subscriptions
        .into_iter()
        .filter(|(_, p)| TypePattern::parse(p).is_ok_and(|p| p.matches(t)))
        .map(|(e, _)| e.to_owned())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> EventType {
        EventType::parse(s).unwrap()
    }

    #[test]
    fn event_types_parse_by_the_documented_syntax() {
        for ok in [
            "a",
            "order.placed",
            "order.line.added",
            "Invoice.paid_v2",
            "a-b.c_d.9",
            &"x".repeat(200),
        ] {
            assert!(EventType::parse(ok).is_ok(), "{ok}");
        }
        use EventTypeError::*;
        for (bad, why) in [
            ("", Empty),
            (&"x".repeat(201) as &str, TooLong),
            (".a", Syntax),
            ("a.", Syntax),
            ("a..b", Syntax),
            ("a b", Syntax),
            ("a/b", Syntax),
            ("ü.x", Syntax),
            ("a:b", Syntax),
            ("a\0", Syntax),
            ("*", Wildcard),
            ("order.*", Wildcard),
        ] {
            assert_eq!(EventType::parse(bad), Err(why), "{bad:?}");
        }
    }

    #[test]
    fn patterns_parse_with_a_wildcard_only_alone_or_as_the_last_segment() {
        assert_eq!(TypePattern::parse("*"), Ok(TypePattern::All));
        assert_eq!(
            TypePattern::parse("order.*"),
            Ok(TypePattern::Under(t("order")))
        );
        assert_eq!(
            TypePattern::parse("a.b.*"),
            Ok(TypePattern::Under(t("a.b")))
        );
        assert_eq!(
            TypePattern::parse("order.placed"),
            Ok(TypePattern::Exact(t("order.placed")))
        );
        for bad in [
            "order*",
            "*.placed",
            "order.*.x",
            "**",
            ".*",
            "*.*",
            "a.*.*",
            "a.b*",
        ] {
            assert!(TypePattern::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(TypePattern::parse(""), Err(EventTypeError::Empty));
        assert_eq!(TypePattern::parse("a..*"), Err(EventTypeError::Syntax));
        for p in ["*", "order.*", "order.placed"] {
            assert_eq!(TypePattern::parse(p).unwrap().to_string(), p);
        }
    }

    #[test]
    fn matching_table() {
        let cases: &[(&str, &str, bool)] = &[
            ("*", "a", true),
            ("*", "order.placed", true),
            ("order.placed", "order.placed", true),
            ("order.placed", "order.placed.v2", false),
            ("order.placed", "order", false),
            ("order.placed", "Order.placed", false),
            ("order.*", "order.placed", true),
            ("order.*", "order.line.added", true),
            ("order.*", "order", false),
            ("order.*", "orders.placed", false),
            ("order.*", "order-x.placed", false),
            ("order.*", "xorder.placed", false),
            ("order.*", "Order.placed", false),
            ("order.line.*", "order.line.added", true),
            ("order.line.*", "order.placed", false),
            ("order.line.*", "order.line", false),
        ];
        for (p, ty, want) in cases {
            assert_eq!(
                TypePattern::parse(p).unwrap().matches(&t(ty)),
                *want,
                "{p} vs {ty}"
            );
        }
    }

    #[test]
    fn subscribers_are_sorted_distinct_and_skip_unparsable_patterns() {
        let subs = [
            ("shipping", "order.*"),
            ("audit", "*"),
            ("billing", "order.placed"),
            ("billing", "order.*"),
            ("crm", "customer.*"),
            ("broken", "order*"),
        ];
        assert_eq!(
            subscribers(subs, &t("order.placed")),
            ["audit", "billing", "shipping"]
        );
        assert_eq!(subscribers(subs, &t("customer.new")), ["audit", "crm"]);
        assert_eq!(subscribers(subs, &t("order")), ["audit"]);
        assert!(subscribers([("a", "order.*")], &t("invoice.paid")).is_empty());
    }
}
