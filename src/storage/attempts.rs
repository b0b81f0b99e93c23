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

    /// The same as a query-builder multi-row insert (its SQL text varies with the row count).
    pub fn insert_attempt_rows(
        conn: &mut Conn,
        owner: Option<&str>,
        outcomes: &[OutcomeRecord],
        applied: &[Applied],
    ) -> QueryResult<()> {
        let rows: Vec<_> = outcomes
            .iter()
            .zip(applied)
            .filter_map(|(x, a)| x.attempt.as_ref().map(|t| (x, t, a)))
            .map(|(x, t, applied)| {
                (
                    a::message_id.eq(x.message_id),
                    a::event_id.eq(&x.event_id),
                    a::attempt_number.eq(x.claimed_attempt),
                    a::started_at.eq(t.started_at),
                    a::finished_at.eq(t.finished_at),
                    a::duration_ms.eq(t.duration_ms),
                    a::request_fingerprint.eq(&x.request_fingerprint),
                    a::response_status.eq(t.response_status),
                    a::error_kind.eq(&t.error_kind),
                    a::class.eq(t.class),
                    a::retry_after.eq(&t.retry_after),
                    a::delay_ms.eq(t.delay_ms),
                    a::delay_reason.eq(&t.delay_reason),
                    a::policy_version.eq(&t.policy_version),
                    (
                        a::provider_message_id.eq(&x.provider_message_id),
                        a::response_excerpt.eq(&t.response_excerpt),
                        a::lease_owner.eq(owner),
                        a::next_state.eq(applied.next_state(x.state)),
                    ),
                )
            })
            .collect();
        if !rows.is_empty() {
            diesel::insert_into(a::table)
                .values(rows)
                .on_conflict_do_nothing()
                .execute(conn)?;
        }
        Ok(())
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
