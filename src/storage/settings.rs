//! `herald_settings`: small key-value facts shared by every Herald process on one database (the
//! generated webhook secret).

use super::{Db, StorageError, per_backend};

per_backend! {
    use diesel::prelude::*;

    use self::schema::herald_settings as s;

    pub fn get_setting(conn: &mut Conn, key: &str) -> QueryResult<Option<String>> {
        s::table
            .filter(s::key.eq(key))
            .select(s::value)
            .first(conn)
            .optional()
    }

    /// Stores `value` unless the key exists; returns the stored value either way.
    pub fn setting_or_insert(
        conn: &mut Conn,
        key: &str,
        value: &str,
    ) -> QueryResult<String> {
        diesel::insert_into(s::table)
            .values((s::key.eq(key), s::value.eq(value)))
            .on_conflict(s::key)
            .do_nothing()
            .execute(conn)?;
        s::table.filter(s::key.eq(key)).select(s::value).first(conn)
    }
}

impl Db {
    pub fn get_setting(&self, key: &str) -> Result<Option<String>, StorageError> {
        crate::storage::db_run! { self, read |c, q| Ok(q::get_setting(c, key)?) }
    }

    pub fn setting_or_insert(&self, key: &str, value: &str) -> Result<String, StorageError> {
        crate::storage::db_run! { self, write |c, q| Ok(q::setting_or_insert(c, key, value)?) }
    }
}
