//! Hand-written SQL that diesel keeps prepared on each connection.
//!
//! `diesel::sql_query` never enters diesel's prepared-statement cache, so every call of a hot
//! statement written in raw SQL (the claim, the outcome update) was parsed and planned again by
//! PostgreSQL — about 1–1.8 ms of planning per outcome batch, measured with `EXPLAIN ANALYZE`.
//! [`cached`] builds the same kind of statement, but marked safe to cache: diesel prepares it once
//! per connection (keyed by its SQL text and bind types) and then only executes it, and PostgreSQL
//! can keep its plan.
//!
//! diesel never caches a query-builder `UPDATE` (its changeset may skip `None` fields, so the
//! text can vary) nor a multi-row `INSERT` (its text grows with the row count) either, on any
//! backend. On SQLite, where such statements ran once per message, compiling them again was a
//! third of Herald's CPU in `herald-bench email_smtp`; the hot ones are written here instead
//! (`tests/it/concurrency.rs` checks each is compiled once per connection).
//!
//! diesel finds a cached statement by its key: for [`cached`], the statement's text and bind
//! types, which it builds (the whole text, into a new string) and hashes at every call — on
//! SQLite, where the outcome update and the attempt row run once per message, 4 % of Herald's
//! CPU in `herald-bench email_smtp`. [`cached_const!`] gives constant text a type of its own, and
//! diesel keys the statement by that type and the bind types instead, building the text only
//! the first time on each connection.
//!
//! The statement's text refers to its parameters by number (`$1`, `?1`, …) as with `sql_query`;
//! the placeholders diesel writes for the binds, in bind order, go into a leading comment
//! (`/* $1$2 */`, `/* ?? */`), where neither backend's parser looks. The binds are sent in that
//! same order, so `$n` / `?n` is the n-th `bind`. Every bind must be used by the text: PostgreSQL
//! accepts an unused one (its type is sent with it), but SQLite sizes its parameters by the
//! highest `?n` in the text and refuses a bind past it (`SQLITE_RANGE`).

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::{HasSqlType, Untyped};
use diesel::{QueryResult, RunQueryDsl};

/// A raw SQL statement with its binds that diesel may cache prepared; see the module docs.
/// Its rows are read by name (`QueryableByName`) unless [`Cached::typed`] gives their SQL types.
#[must_use = "a statement does nothing until it is run"]
pub struct Cached<B, ST = Untyped, K = ByText> {
    sql: &'static str,
    binds: B,
    _rows: std::marker::PhantomData<(ST, K)>,
}

/// A statement from static SQL text; its parameters are added with [`Cached::bind`], in order.
/// Where the text is a constant, [`cached_const!`] saves building and hashing it at every call.
pub fn cached(sql: &'static str) -> Cached<()> {
    Cached {
        sql,
        binds: (),
        _rows: std::marker::PhantomData,
    }
}

/// A statement's text as a type of its own: what [`cached_const!`] makes.
pub trait StaticSql: 'static {
    const SQL: &'static str;
}

/// The statement [`StaticSql`] `Q` holds; its parameters are added with [`Cached::bind`]. Use
/// [`cached_const!`], which makes `Q`.
pub fn cached_as<Q: StaticSql>() -> Cached<(), Untyped, ByType<Q>> {
    Cached {
        sql: Q::SQL,
        binds: (),
        _rows: std::marker::PhantomData,
    }
}

/// `cached_const!(SQL)`: as [`cached`]`(SQL)` for constant text (a `const`, a literal, a `concat!`),
/// kept in diesel's cache under a type made here for it (and the bind types), so that a call
/// neither builds nor hashes the text. Each use makes its own type: two uses of one text are two
/// prepared statements.
macro_rules! cached_const {
    ($sql:expr $(,)?) => {{
        struct CachedConstSql;
        impl $crate::storage::prepared::StaticSql for CachedConstSql {
            const SQL: &'static str = $sql;
        }
        $crate::storage::prepared::cached_as::<CachedConstSql>()
    }};
}
pub(crate) use cached_const;

/// How diesel finds a [`Cached`] statement in its cache: by its text ([`ByText`]) or by the type
/// its text was given ([`ByType`]); and by its bind types either way.
pub trait CacheKey: 'static {
    const BY_TYPE: bool;
}

/// See [`CacheKey`].
pub struct ByText;

impl CacheKey for ByText {
    const BY_TYPE: bool = false;
}

/// See [`CacheKey`].
pub struct ByType<Q>(std::marker::PhantomData<Q>);

impl<Q: StaticSql> CacheKey for ByType<Q> {
    const BY_TYPE: bool = true;
}

/// The SQL types of a [`Cached`] statement's binds, as one type (part of its cache key).
pub trait BindTypes {
    type Types: 'static;
}

impl BindTypes for () {
    type Types = ();
}

impl<Rest: BindTypes, ST: 'static, T> BindTypes for (Rest, Bound<ST, T>) {
    type Types = (Rest::Types, ST);
}

/// One bound value of SQL type `ST`.
pub struct Bound<ST, T> {
    value: T,
    _type: std::marker::PhantomData<ST>,
}

impl<B, Rows, K> Cached<B, Rows, K> {
    /// Adds the next parameter (`$n` on PostgreSQL, `?n` on SQLite, n counted from 1).
    pub fn bind<ST, T>(self, value: T) -> Cached<(B, Bound<ST, T>), Rows, K> {
        Cached {
            sql: self.sql,
            binds: (
                self.binds,
                Bound {
                    value,
                    _type: std::marker::PhantomData,
                },
            ),
            _rows: std::marker::PhantomData,
        }
    }

    /// Its rows have the SQL types `ST`, column by column (read with `Queryable`): for
    /// `RETURNING t.*` into a table's row struct, the table's `all_columns` type — the schema
    /// check keeps `schema_*.rs` in the database's column order.
    pub fn typed<ST>(self) -> Cached<B, ST, K> {
        Cached {
            sql: self.sql,
            binds: self.binds,
            _rows: std::marker::PhantomData,
        }
    }
}

/// The binds of a [`Cached`] statement, pushed in the order they were added.
pub trait Binds<DB: Backend> {
    fn push<'b>(&'b self, out: &mut AstPass<'_, 'b, DB>) -> QueryResult<()>;
}

impl<DB: Backend> Binds<DB> for () {
    fn push<'b>(&'b self, _out: &mut AstPass<'_, 'b, DB>) -> QueryResult<()> {
        Ok(())
    }
}

impl<DB, Rest, ST, T> Binds<DB> for (Rest, Bound<ST, T>)
where
    DB: Backend + HasSqlType<ST>,
    Rest: Binds<DB>,
    T: ToSql<ST, DB>,
{
    fn push<'b>(&'b self, out: &mut AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.0.push(out)?;
        out.push_bind_param::<ST, T>(&self.1.value)
    }
}

impl<DB: Backend, B: Binds<DB>, Rows, K> QueryFragment<DB> for Cached<B, Rows, K> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("/* ");
        self.binds.push(&mut out)?;
        out.push_sql(" */ ");
        out.push_sql(self.sql);
        Ok(())
    }
}

impl<B: BindTypes, Rows, K: CacheKey> QueryId for Cached<B, Rows, K> {
    type QueryId = (K, B::Types);
    // By type: the key is this type (the text's own, and the binds'). By text: diesel keys the
    // cache by the SQL text and bind types instead.
    const HAS_STATIC_QUERY_ID: bool = K::BY_TYPE;
}

impl<B, Rows, K> Query for Cached<B, Rows, K> {
    type SqlType = Rows;
}

impl<Conn, B, Rows, K> RunQueryDsl<Conn> for Cached<B, Rows, K> {}

#[cfg(test)]
mod tests {
    use super::*;
    use diesel::connection::{Connection, SimpleConnection};
    use diesel::sql_types::{BigInt, Text};
    use diesel::sqlite::SqliteConnection;

    #[derive(diesel::QueryableByName, Debug, PartialEq)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        n: i64,
        #[diesel(sql_type = Text)]
        s: String,
    }

    /// Numbered parameters, one used twice and out of order, reach the statement as bound; the
    /// same statement runs again with other values (from diesel's cache).
    #[test]
    fn numbered_parameters_are_bound_in_order_and_the_statement_is_reused() {
        let mut c = SqliteConnection::establish(":memory:").unwrap();
        c.batch_execute("CREATE TABLE t (n INTEGER, s TEXT)")
            .unwrap();
        let prepared = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = prepared.clone();
        c.set_instrumentation(move |e: diesel::connection::InstrumentationEvent<'_>| {
            if let diesel::connection::InstrumentationEvent::CacheQuery { sql, .. } = e {
                seen.lock().unwrap().push(sql.to_owned());
            }
        });
        for (n, s) in [(1i64, "a"), (2, "b"), (3, "c")] {
            let inserted = cached("INSERT INTO t (s, n) VALUES (?2, ?1 * 10 + ?1)")
                .bind::<BigInt, _>(n)
                .bind::<Text, _>(s)
                .execute(&mut c)
                .unwrap();
            assert_eq!(inserted, 1);
        }
        // Prepared and cached once, then executed from the cache.
        assert_eq!(
            *prepared.lock().unwrap(),
            ["/* ?? */ INSERT INTO t (s, n) VALUES (?2, ?1 * 10 + ?1)"]
        );
        let rows: Vec<Row> = cached("SELECT n, s FROM t WHERE n > ?1 ORDER BY n")
            .bind::<BigInt, _>(15)
            .load(&mut c)
            .unwrap();
        assert_eq!(
            rows,
            [
                Row {
                    n: 22,
                    s: "b".into()
                },
                Row {
                    n: 33,
                    s: "c".into()
                }
            ]
        );
    }

    /// Statements keyed by type ([`cached_const!`]): two texts with the same bind types are two
    /// statements (a key that ignored the text would run the first for both), each compiled once
    /// over repeated calls; a text keyed by type and the same text keyed by text do not mix.
    #[test]
    fn constant_statements_are_keyed_by_their_own_type() {
        let mut c = SqliteConnection::establish(":memory:").unwrap();
        let prepared = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = prepared.clone();
        c.set_instrumentation(move |e: diesel::connection::InstrumentationEvent<'_>| {
            if let diesel::connection::InstrumentationEvent::CacheQuery { sql, .. } = e {
                seen.lock().unwrap().push(sql.to_owned());
            }
        });
        const PLUS: &str = "SELECT ?1 + 1 AS n, 'plus' AS s";
        for i in 0..3i64 {
            let plus: Row = cached_const!(PLUS)
                .bind::<BigInt, _>(i)
                .get_result(&mut c)
                .unwrap();
            let times: Row = cached_const!("SELECT ?1 * 10 AS n, 'times' AS s")
                .bind::<BigInt, _>(i)
                .get_result(&mut c)
                .unwrap();
            let by_text: Row = cached(PLUS)
                .bind::<BigInt, _>(i)
                .get_result(&mut c)
                .unwrap();
            assert_eq!((plus.n, plus.s.as_str()), (i + 1, "plus"));
            assert_eq!((times.n, times.s.as_str()), (i * 10, "times"));
            assert_eq!((by_text.n, by_text.s.as_str()), (i + 1, "plus"));
        }
        assert_eq!(
            *prepared.lock().unwrap(),
            [
                "/* ? */ SELECT ?1 + 1 AS n, 'plus' AS s",
                "/* ? */ SELECT ?1 * 10 AS n, 'times' AS s",
                "/* ? */ SELECT ?1 + 1 AS n, 'plus' AS s",
            ],
            "each compiled once"
        );
    }
}
