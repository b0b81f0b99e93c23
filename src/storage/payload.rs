//! A stored payload as read. `payload` is checked at the insert only as JSON the database takes
//! (`jsonb` on PostgreSQL, `json_valid` on SQLite), and some of that JSON serde_json does not
//! read: a number beyond a double (`1e400`, which `jsonb` keeps as a numeric), a lone surrogate
//! (`"\ud800"`, taken by SQLite), nesting deeper than 128. Read as a `serde_json::Value`, one
//! such row failed the whole statement that read it, and with it every claim: nothing was sent
//! until the row was deleted (found by a walk-through). Read as [`ReadPayload`], such a payload
//! becomes `{"herald_unreadable_payload": "<why>"}` ([`unreadable`]), which the sender
//! dead-letters as `invalid_payload` on its own, the attempt saying why. So does a
//! payload holding an integer beyond 64 bits, which would be read only as the nearest double and
//! sent as another number (the API refuses it for that reason).

use diesel::deserialize::{self, FromSql};
use diesel::pg::{Pg, PgValue};
use diesel::sql_types::{Json, Jsonb, Text};
use diesel::sqlite::{Sqlite, SqliteValue};
use serde_json::Value;

/// The key of the object standing in for a payload that cannot be read.
pub const UNREADABLE: &str = "herald_unreadable_payload";

/// `payload` as stored, or the stand-in naming why it cannot be read.
#[derive(Debug, diesel::deserialize::FromSqlRow)]
pub struct ReadPayload(pub Value);

impl From<ReadPayload> for Value {
    fn from(p: ReadPayload) -> Self {
        p.0
    }
}

fn read(text: &[u8]) -> ReadPayload {
    let why = match serde_json::from_slice(text) {
        // An integer no 64 bits hold would be sent as the nearest double, another number (the
        // API refuses it for that): only looked for where a run of 19 digits could be one.
        Ok(v) if !long_digit_run(text) => return ReadPayload(v),
        Ok(v) => match crate::domain::integers_beyond_64_bits(text).first() {
            None => return ReadPayload(v),
            Some(at) => {
                format!("an integer beyond 64 bits at {at}, which would be sent as another number")
            }
        },
        // serde_json's words name the kind and the place, never the text itself.
        Err(e) => e.to_string(),
    };
    let mut o = serde_json::Map::new();
    o.insert(UNREADABLE.to_owned(), Value::String(why));
    ReadPayload(Value::Object(o))
}

/// Whether `text` holds 19 digits in a row, the shortest an integer beyond 64 bits can be.
fn long_digit_run(text: &[u8]) -> bool {
    let mut run = 0;
    text.iter().any(|b| {
        run = if b.is_ascii_digit() { run + 1 } else { 0 };
        run >= 19
    })
}

impl FromSql<Jsonb, Pg> for ReadPayload {
    fn from_sql(value: PgValue<'_>) -> deserialize::Result<Self> {
        // jsonb's binary form: a version byte (1), then the JSON text.
        match value.as_bytes().split_first() {
            Some((1, text)) => Ok(read(text)),
            _ => Err("unsupported JSONB encoding version".into()),
        }
    }
}

impl FromSql<Json, Sqlite> for ReadPayload {
    fn from_sql(value: SqliteValue<'_, '_, '_>) -> deserialize::Result<Self> {
        let text = <String as FromSql<Text, Sqlite>>::from_sql(value)?;
        Ok(read(text.as_bytes()))
    }
}

/// Why a payload read as [`ReadPayload`] could not be read, if it could not.
pub fn unreadable(payload: &Value) -> Option<&str> {
    match payload {
        Value::Object(o) if o.len() == 1 => o.get(UNREADABLE)?.as_str(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_serde_cannot_read_stands_in_naming_why() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        for (text, why) in [
            (r#"{"body": {"m": 1e400}}"#, "number out of range"),
            (r#"{"body": {"s": "\ud800"}}"#, "escape"),
            (deep.as_str(), "recursion limit"),
        ] {
            let v = read(text.as_bytes()).0;
            let said = unreadable(&v).unwrap_or_else(|| panic!("{text}: {v}"));
            assert!(said.contains(why), "{said}");
        }
        let big = read(br#"{"body": {"n": 123456789012345678901234567890}}"#).0;
        assert_eq!(
            unreadable(&big),
            Some("an integer beyond 64 bits at body.n, which would be sent as another number")
        );
        // 19 digits that fit, a long string of digits, a long fraction: read as they are.
        let fits = read(br#"{"body": {"n": -9223372036854775808, "s": "12345678901234567890123", "f": 0.12345678901234567890}}"#).0;
        assert_eq!(unreadable(&fits), None, "{fits}");
        let fine = read(br#"{"body": {"n": 1}}"#).0;
        assert_eq!(unreadable(&fine), None);
        assert_eq!(fine["body"]["n"], 1);
        // An application's own payload of that one key is not taken for the stand-in unless
        // its value is a string, as the stand-in's is.
        assert_eq!(unreadable(&serde_json::json!({UNREADABLE: 1})), None);
    }
}
