-- As PostgreSQL's migration of this name, which adds herald_cancel(event_id). SQLite has no
-- functions of this kind: the application cancels in its own transaction with the UPDATE the
-- README gives (or herald::outbox::cancel_in). Nothing to create.
SELECT 1;
