//! `herald_retry_policies`: every retry policy version Herald has run with, as it was. An
//! attempt records the version that decided it; this keeps that version's budget and parameters,
//! so an explanation states the budget the attempts were decided by — after the configuration
//! changed, and from `herald explain` run with a configuration other than the server's.

use super::{Db, StorageError, per_backend};

/// One policy version to keep.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyRecord {
    /// `NAME@hash` (the hash covers the parameters: a version never changes).
    pub version: String,
    pub name: String,
    pub max_attempts: i32,
    /// The parameters, for people (JSON text).
    pub parameters: String,
}

per_backend! {
    use diesel::prelude::*;

    use self::schema::herald_retry_policies as p;
    use crate::storage::retry_policies::PolicyRecord;

    /// Keeps each version not kept yet (a version's row is never changed).
    pub fn record_policies(conn: &mut Conn, policies: &[PolicyRecord]) -> QueryResult<()> {
        for r in policies {
            diesel::insert_into(p::table)
                .values((
                    p::version.eq(&r.version),
                    p::name.eq(&r.name),
                    p::max_attempts.eq(r.max_attempts),
                    p::parameters.eq(&r.parameters),
                ))
                .on_conflict_do_nothing()
                .execute(conn)?;
        }
        Ok(())
    }

    /// The budget of `version`, if it was kept.
    pub fn policy_budget(conn: &mut Conn, version: &str) -> QueryResult<Option<i32>> {
        p::table
            .filter(p::version.eq(version))
            .select(p::max_attempts)
            .first(conn)
            .optional()
    }
}

impl Db {
    /// Keeps the policy versions Herald runs with (start-up), in one transaction.
    pub fn record_policies(&self, policies: &[PolicyRecord]) -> Result<(), StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::record_policies(c, policies)?) }
    }

    /// The attempt budget of a kept policy version.
    pub fn policy_budget(&self, version: &str) -> Result<Option<i32>, StorageError> {
        crate::storage::db_run! { self, read |c, q| Ok(q::policy_budget(c, version)?) }
    }
}
