//! Integration tests: one binary, real PostgreSQL and SQLite, a real HTTP receiver.
#![allow(clippy::unwrap_used)] // tests and benchmarks fail loudly; src/ may not unwrap

mod support;

mod admin;
mod admin_browser;
mod binary;
mod classification;
mod concurrency;
mod email_payload;
mod enqueue;
mod fixtures;
mod foundation;
mod http_api;
mod ingest;
mod lifecycle;
mod migrations;
mod reconcile;
mod slowdown;
mod smtp;
mod sns;
