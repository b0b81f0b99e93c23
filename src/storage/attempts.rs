//! `herald_attempts`: one row per request made (and per expired lease), never updated.

use super::{Db, StorageError, per_backend};

per_backend! {
    use diesel::prelude::*;

    use crate::storage::models::*;
    use self::schema::herald_attempts as a;

    pub fn attempts_of(conn: &mut Conn, message_id: i64) -> QueryResult<Vec<AttemptRow>> {
        a::table
            .filter(a::message_id.eq(message_id))
            .order((a::attempt_number, a::id))
            .load(conn)
    }

    /// One attempt row per outcome that made a request, saying what became of it; one
    /// statement (on PostgreSQL a prepared `unnest` insert, see `sql::insert_attempts`).
    pub fn insert_attempts(
        conn: &mut Conn,
        owner: Option<&str>,
        outcomes: &[OutcomeRecord],
        applied: &[Applied],
    ) -> QueryResult<()> {
        sql::insert_attempts(conn, owner, outcomes, applied)
    }

}

impl Db {
    pub fn attempts_of(
        &self,
        message_id: i64,
    ) -> Result<Vec<super::models::AttemptRow>, StorageError> {
        crate::storage::db_run! { self, read |c, q| Ok(q::attempts_of(c, message_id)?) }
    }
}
