//! Integration tests: one binary, real PostgreSQL and SQLite, a real HTTP receiver.
#![allow(clippy::unwrap_used)] // tests and benchmarks fail loudly; src/ may not unwrap

mod support;

mod admin;
mod admin_browser;
mod bench_smoke;
mod binary;
mod classification;
mod concurrency;
mod drills;
mod email_payload;
mod enqueue;
mod fanout;
mod fixtures;
mod foundation;
mod group_commit;
mod hostile;
mod http_api;
mod ingest;
mod lifecycle;
mod limits;
mod metrics;
mod migrations;
mod openapi;
mod ordering;
mod reconcile;
mod retention;
mod slowdown;
mod sms_receipts;
mod smtp;
mod sns;
mod ssrf;
mod support_cli;
mod support_desk;
