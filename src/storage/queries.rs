//! Every query body, per backend: [`pg`] and [`sqlite`] gather what the per-table files
//! ([`super::outbox`], [`super::attempts`], [`super::receipts`], [`super::settings`]) compile for
//! that backend, so a caller (the library's `OutboxConnection`, `db_run!`) names one module.

pub use super::sql::{PG_CLAIM_SQL, PG_UPDATE_OUTCOMES_SQL, SQLITE_CLAIM_SQL};

/// The PostgreSQL bodies.
pub mod pg {
    pub use crate::storage::admin::pg::*;
    pub use crate::storage::attempts::pg::*;
    pub use crate::storage::endpoints::pg::*;
    pub use crate::storage::fanout::pg::*;
    pub use crate::storage::ordering::pg::*;
    pub use crate::storage::outbox::pg::*;
    pub use crate::storage::receipts::pg::*;
    pub use crate::storage::retention::pg::*;
    pub use crate::storage::retry_policies::pg::*;
    pub use crate::storage::settings::pg::*;
    pub use crate::storage::sql::pg::lock_event_id;
    pub use crate::storage::stats::pg::*;
    pub use crate::storage::support::pg::*;
}

/// The SQLite bodies.
pub mod sqlite {
    pub use crate::storage::admin::sqlite::*;
    pub use crate::storage::attempts::sqlite::*;
    pub use crate::storage::endpoints::sqlite::*;
    pub use crate::storage::fanout::sqlite::*;
    pub use crate::storage::ordering::sqlite::*;
    pub use crate::storage::outbox::sqlite::*;
    pub use crate::storage::receipts::sqlite::*;
    pub use crate::storage::retention::sqlite::*;
    pub use crate::storage::retry_policies::sqlite::*;
    pub use crate::storage::settings::sqlite::*;
    pub use crate::storage::sql::sqlite::lock_event_id;
    pub use crate::storage::stats::sqlite::*;
    pub use crate::storage::support::sqlite::*;
}
