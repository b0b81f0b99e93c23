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
pub struct Cached<B, ST = Untyped> {
    sql: &'static str,
    binds: B,
    _rows: std::marker::PhantomData<ST>,
}

/// A statement from static SQL text; its parameters are added with [`Cached::bind`], in order.
pub fn cached(sql: &'static str) -> Cached<()> {
    Cached {
        sql,
        binds: (),
        _rows: std::marker::PhantomData,
    }
}

/// One bound value of SQL type `ST`.
pub struct Bound<ST, T> {
    value: T,
    _type: std::marker::PhantomData<ST>,
}

impl<B, Rows> Cached<B, Rows> {
    /// Adds the next parameter (`$n` on PostgreSQL, `?n` on SQLite, n counted from 1).
    pub fn bind<ST, T>(self, value: T) -> Cached<(B, Bound<ST, T>), Rows> {
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
    pub fn typed<ST>(self) -> Cached<B, ST> {
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

impl<DB: Backend, B: Binds<DB>, Rows> QueryFragment<DB> for Cached<B, Rows> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("/* ");
        self.binds.push(&mut out)?;
        out.push_sql(" */ ");
        out.push_sql(self.sql);
        Ok(())
    }
}

impl<B, Rows> QueryId for Cached<B, Rows> {
    type QueryId = ();
    // Not a static type: diesel keys the cache by the SQL text (and bind types) instead.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<B, Rows> Query for Cached<B, Rows> {
    type SqlType = Rows;
}

impl<Conn, B, Rows> RunQueryDsl<Conn> for Cached<B, Rows> {}

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
}
