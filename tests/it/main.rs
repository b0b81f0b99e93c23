//! Integration tests: one binary, real PostgreSQL and SQLite, a real HTTP receiver.

mod support;

mod binary;
mod classification;
mod concurrency;
mod enqueue;
mod fixtures;
mod foundation;
mod http_api;
mod ingest;
mod lifecycle;
mod migrations;
mod smtp;
mod sns;
