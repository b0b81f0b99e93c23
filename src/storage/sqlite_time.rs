//! Timestamps bound to Herald's hand-written SQLite statements, written without chrono's
//! formatter.
//!
//! SQLite has no timestamp type: diesel stores a `DateTime<Utc>` of a `TimestamptzSqlite` column
//! as text, `2026-12-05 13:10:00.123456+00:00` (chrono's `%F %T%.f%:z`), and Herald's statements
//! compare those texts (`next_attempt_at <= ?1`), so every timestamp must be written exactly so.
//! diesel writes it with chrono's `format`, which parses the format string again at every call:
//! in `herald-bench email_smtp` that was 2.7 % of Herald's CPU (three timestamps a message: the
//! outcome's and its attempt row's two), all of it inside the SQLite writer lock. [`SqliteTime`]
//! is the same column type, written by [`format`], which gives the same text without parsing
//! anything (checked against diesel's own binding in the tests below), and read by [`parse`],
//! which takes that text directly and leaves any other to diesel. (Only the reconciler's pending
//! receipts are read as `SqliteTime`; the claim's rows are read by diesel: reading them so
//! measured within noise, +0.4 % over twenty pairs of `email_smtp`.)

use chrono::{DateTime, Datelike, NaiveDate, Timelike, Utc};
use diesel::deserialize::{self, FromSql};
use diesel::serialize::{self, IsNull, Output, ToSql};
use diesel::sql_types::TimestamptzSqlite;
use diesel::sqlite::{Sqlite, SqliteValue};

/// The SQL type of a timestamp bound to a hand-written SQLite statement: text, exactly as
/// diesel's `TimestamptzSqlite` writes a `DateTime<Utc>`, see the module docs.
#[derive(diesel::sql_types::SqlType, diesel::query_builder::QueryId, Debug, Clone, Copy)]
#[diesel(sqlite_type(name = "Text"))]
pub struct SqliteTime;

impl ToSql<SqliteTime, Sqlite> for DateTime<Utc> {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Sqlite>) -> serialize::Result {
        out.set_value(format(self));
        Ok(IsNull::No)
    }
}

impl FromSql<SqliteTime, Sqlite> for DateTime<Utc> {
    fn from_sql(mut value: SqliteValue<'_, '_, '_>) -> deserialize::Result<Self> {
        match parse(value.read_text()) {
            Some(t) => Ok(t),
            None => <Self as FromSql<TimestamptzSqlite, Sqlite>>::from_sql(value),
        }
    }
}

/// The moment in `text` if it is spelled as [`format`] writes (a fraction of exactly 3, 6 or 9
/// digits, `+00:00`), whether or not `format` would have written it so (`.000`, `.500000`);
/// `None` for any other text, which diesel reads (the other spellings it accepts, a Julian day
/// number).
pub fn parse(text: &str) -> Option<DateTime<Utc>> {
    let b = text.strip_suffix("+00:00")?.as_bytes();
    // `YYYY-MM-DD HH:MM:SS`, then nothing or a fraction of 3, 6 or 9 digits.
    let (t, fraction) = b.split_at_checked(19)?;
    if [(4, b'-'), (7, b'-'), (10, b' '), (13, b':'), (16, b':')]
        .iter()
        .any(|&(at, c)| t[at] != c)
    {
        return None;
    }
    let nanos = match fraction {
        [] => 0,
        [b'.', digits @ ..] if matches!(digits.len(), 3 | 6 | 9) => {
            number(digits)? * 10u32.pow(9 - digits.len() as u32)
        }
        _ => return None,
    };
    let n = |at: usize, len: usize| number(&t[at..at + len]);
    NaiveDate::from_ymd_opt(i32::try_from(n(0, 4)?).ok()?, n(5, 2)?, n(8, 2)?)?
        .and_hms_nano_opt(n(11, 2)?, n(14, 2)?, n(17, 2)?, nanos)
        .map(|t| t.and_utc())
}

/// The decimal number `digits` spell (at most nine of them); `None` if any is not a digit.
fn number(digits: &[u8]) -> Option<u32> {
    digits.iter().try_fold(0u32, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0'))
    })
}

/// chrono's [`CHRONO_FORMAT`], the text diesel stores for a `DateTime<Utc>` on SQLite: the
/// date and time, the fraction of a second with 3, 6 or 9 digits (the fewest that hold it; none
/// when it is zero), and `+00:00`. Years outside 0–9999 and leap seconds, which chrono writes
/// otherwise, are left to chrono.
pub fn format(t: &DateTime<Utc>) -> String {
    let (year, nanos) = (t.year(), t.nanosecond());
    let (Ok(year @ 0..=9999), 0..=999_999_999) = (u32::try_from(year), nanos) else {
        return t.format(CHRONO_FORMAT).to_string();
    };
    let mut s = String::with_capacity(35);
    digits(&mut s, year, 4);
    s.push('-');
    digits(&mut s, t.month(), 2);
    s.push('-');
    digits(&mut s, t.day(), 2);
    s.push(' ');
    digits(&mut s, t.hour(), 2);
    s.push(':');
    digits(&mut s, t.minute(), 2);
    s.push(':');
    digits(&mut s, t.second(), 2);
    if nanos != 0 {
        s.push('.');
        if nanos % 1_000_000 == 0 {
            digits(&mut s, nanos / 1_000_000, 3);
        } else if nanos % 1_000 == 0 {
            digits(&mut s, nanos / 1_000, 6);
        } else {
            digits(&mut s, nanos, 9);
        }
    }
    s.push_str("+00:00");
    s
}

/// The format diesel gives chrono for a `DateTime` on SQLite.
pub const CHRONO_FORMAT: &str = "%F %T%.f%:z";

/// `value` in decimal, zero-padded to `width` digits (`value` has at most `width`).
fn digits(s: &mut String, value: u32, width: u32) {
    let mut unit = 10u32.pow(width - 1);
    while unit > 0 {
        s.push(char::from(b'0' + (value / unit % 10) as u8));
        unit /= 10;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use diesel::sql_types::Text;
    use diesel::{Connection, QueryableByName, RunQueryDsl};
    use proptest::prelude::*;

    #[derive(QueryableByName)]
    struct Both {
        #[diesel(sql_type = Text)]
        diesels: String,
        #[diesel(sql_type = Text)]
        ours: String,
    }

    /// Both bindings of `t` as a real SQLite receives them, and the text compared.
    fn bound_both_ways(c: &mut diesel::SqliteConnection, t: DateTime<Utc>) -> Both {
        let both: Both = crate::storage::prepared::cached("SELECT ?1 AS diesels, ?2 AS ours")
            .bind::<TimestamptzSqlite, _>(t)
            .bind::<SqliteTime, _>(t)
            .get_result(c)
            .unwrap();
        assert_eq!(both.ours, both.diesels, "{t:?}");
        assert_eq!(both.ours, format(&t));
        assert_eq!(read_both_ways(c, &format!("'{}'", both.ours)), Some(t));
        // What `format` writes itself, `parse` reads itself (diesel reads the rest).
        if (0..=9999).contains(&t.year()) && t.nanosecond() < 1_000_000_000 {
            assert_eq!(parse(&both.ours), Some(t), "{}", both.ours);
        }
        both
    }

    #[derive(QueryableByName)]
    struct ByDiesel {
        #[diesel(sql_type = TimestamptzSqlite)]
        t: DateTime<Utc>,
    }

    #[derive(QueryableByName)]
    struct ByUs {
        #[diesel(sql_type = SqliteTime)]
        t: DateTime<Utc>,
    }

    /// `value` (an SQL expression) as a real SQLite hands it back, read by diesel and by
    /// [`SqliteTime`]: the same moment, or an error both ways.
    fn read_both_ways(c: &mut diesel::SqliteConnection, value: &str) -> Option<DateTime<Utc>> {
        let sql = format!("SELECT {value} AS t");
        let diesels = diesel::sql_query(&sql)
            .get_result::<ByDiesel>(c)
            .map(|r| r.t);
        let ours = diesel::sql_query(&sql).get_result::<ByUs>(c).map(|r| r.t);
        assert_eq!(
            ours.is_ok(),
            diesels.is_ok(),
            "{value}: {ours:?} {diesels:?}"
        );
        let ours = ours.ok();
        assert_eq!(ours, diesels.ok(), "{value}");
        ours
    }

    /// A moment with `nanos` of each kind the format tells apart: none, whole milliseconds,
    /// whole microseconds, any.
    fn moment() -> impl Strategy<Value = DateTime<Utc>> {
        let nanos = prop_oneof![
            Just(0u32),
            (1u32..1_000).prop_map(|ms| ms * 1_000_000),
            (1u32..1_000_000).prop_map(|us| us * 1_000),
            1u32..1_000_000_000,
        ];
        // From the year -300 to 12000: both sides of the years the fast path writes.
        (-71_644_000_000i64..316_500_000_000, nanos)
            .prop_map(|(secs, nanos)| DateTime::from_timestamp(secs, nanos).unwrap())
    }

    #[test]
    fn a_timestamp_is_bound_as_diesel_binds_it_at_the_edges() {
        let mut c = diesel::SqliteConnection::establish(":memory:").unwrap();
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        for (t, text) in [
            (at("2026-12-05T13:10:00Z"), "2026-12-05 13:10:00+00:00"),
            (
                at("2026-12-05T13:10:00.5Z"),
                "2026-12-05 13:10:00.500+00:00",
            ),
            (
                at("2026-01-02T03:04:05.000007Z"),
                "2026-01-02 03:04:05.000007+00:00",
            ),
            (
                at("0999-12-31T23:59:59.999999999Z"),
                "0999-12-31 23:59:59.999999999+00:00",
            ),
            (at("0000-01-01T00:00:00Z"), "0000-01-01 00:00:00+00:00"),
            (
                at("9999-12-31T23:59:59.001Z"),
                "9999-12-31 23:59:59.001+00:00",
            ),
            // Left to chrono: a year of five digits, one before year 0, a leap second.
            (
                at("9999-12-31T23:59:59Z") + chrono::Duration::seconds(1),
                "+10000-01-01 00:00:00+00:00",
            ),
            (
                at("0000-01-01T00:00:00Z") - chrono::Duration::days(1),
                "-0001-12-31 00:00:00+00:00",
            ),
            (
                chrono::NaiveDate::from_ymd_opt(2016, 12, 31)
                    .unwrap()
                    .and_hms_nano_opt(23, 59, 59, 1_500_000_000)
                    .unwrap()
                    .and_utc(),
                "2016-12-31 23:59:60.500+00:00",
            ),
        ] {
            assert_eq!(bound_both_ways(&mut c, t).ours, text);
        }
        // Texts not written by `format`, read as diesel reads them (`parse` leaves them), and a
        // Julian day number.
        for (text, read) in [
            ("2026-12-05 13:10:00.5+00:00", true),
            ("2026-12-05 13:10:00.1234+00:00", true),
            ("2026-12-05T13:10:00Z", true),
            ("2026-12-05 13:10:00+02:00", true),
            ("2026-12-05 13:10", true),
            ("2026-12-05 13:10:00", true),
            ("2026-12-05 13:10:60+00:00", true),
            ("2026-02-30 13:10:00+00:00", false),
            ("yesterday", false),
        ] {
            assert_eq!(parse(text), None, "{text}");
            assert_eq!(
                read_both_ways(&mut c, &format!("'{text}'")).is_some(),
                read,
                "{text}"
            );
        }
        assert!(read_both_ways(&mut c, "2461015.0").is_some());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]
        #[test]
        fn a_timestamp_is_bound_as_diesel_binds_it(t in moment()) {
            thread_local! {
                static CONN: std::cell::RefCell<diesel::SqliteConnection> = std::cell::RefCell::new(
                    diesel::SqliteConnection::establish(":memory:").unwrap(),
                );
            }
            CONN.with(|c| bound_both_ways(&mut c.borrow_mut(), t));
        }
    }
}
