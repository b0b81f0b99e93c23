//! The real `herald` binary's support commands as a child process on a SQLite file an
//! application wrote into: `herald explain`, `herald replay`, `herald dlq list|redrive` — tables
//! and `--json`, the documented exit statuses, the audit's `cli:USER`, and nothing private shown.

use std::path::Path;
use std::process::{Command, Output};

use diesel::Connection;
use diesel::connection::SimpleConnection;
use serde_json::Value;

/// `herald ARGS` in `dir` with only the database, `USER=tester` and `env`.
fn herald(dir: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HERALD_") || k == "RUST_LOG" || k == "USER" || k == "LOGNAME" {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(dir)
        .env(
            "HERALD_DATABASE_URL",
            format!("sqlite://{}", dir.join("herald.db").display()),
        )
        .env("USER", "tester")
        .args(args)
        .output()
        .expect("run herald")
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

const FP: &str = "c0ffee0011223344556677889900aabbccddeeff00112233445566778899aabb";

const PRIVATE: &[&str] = &[
    "4242-private",
    "secret/path",
    "k=v",
    "receiver-body-text",
    "ada@example.com",
];

fn assert_private(what: &str, text: &str) {
    for p in PRIVATE {
        assert!(!text.contains(p), "{what} shows {p:?}:\n{text}");
    }
}

/// A database in `dir` migrated by `herald migrate`, as `herald serve` leaves it, with `rows`
/// (SQL) written into it.
fn migrated_with(dir: &Path, rows: &str) {
    let m = herald(dir, &["migrate"]);
    assert_eq!(code(&m), 0, "{}", stderr(&m));
    diesel::sqlite::SqliteConnection::establish(dir.join("herald.db").to_str().unwrap())
        .unwrap()
        .batch_execute(rows)
        .unwrap();
}

#[test]
fn support_commands_on_the_database_the_server_uses() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // What the sender would have left (times as Herald writes them: no fraction when it is
    // zero): a permanent dead letter with its attempt, an email dead
    // letter, two messages sharing a prefix.
    migrated_with(
        d,
        &format!(
            "INSERT INTO herald_outbox (id, event_id, channel, destination, payload, state, attempts, \
             request_fingerprint, last_error_class, updated_at) VALUES \
         (1, 'cli-perm', 'webhook', 'https://hooks.example.com/secret/path?k=v', \
             '{{\"body\":{{\"card\":\"4242-private\"}}}}', 'dead_letter', 1, '{FP}', 'permanent', \
             '2026-12-01 10:00:00+00:00'), \
         (2, 'cli-mail', 'email', 'ada@example.com', '{{\"subject\":\"4242-private\"}}', \
             'dead_letter', 4, NULL, 'exhausted', '2026-12-01 10:00:01+00:00'), \
         (3, 'cli-amb-1', 'webhook', 'https://x.example/h', '{{\"body\":{{}}}}', 'dead_letter', 0, \
             'abcdabcd0{z}', 'permanent', '2026-12-01 10:00:02+00:00'), \
         (4, 'cli-amb-2', 'webhook', 'https://x.example/h', '{{\"body\":{{}}}}', 'dead_letter', 0, \
             'abcdabcd1{z}', 'permanent', '2026-12-01 10:00:03+00:00'), \
         (5, 'cli-rtl', 'webhook', 'https://x.example/h', '{{\"body\":{{}}}}', 'canceled', 0, \
             NULL, NULL, '2026-12-01 10:00:04+00:00'); \
         UPDATE herald_outbox SET state_reason = 'fixed \u{202e}gnp.exe\u{7f}' WHERE id = 5; \
         INSERT INTO herald_attempts (message_id, event_id, attempt_number, started_at, finished_at, \
             duration_ms, response_status, class, delay_reason, policy_version, response_excerpt, \
             next_state) VALUES (1, 'cli-perm', 1, '2026-12-01 09:59:59.500000+00:00', \
             '2026-12-01 10:00:00+00:00', 500, 404, 'permanent', \
             'permanent refusal: dead-lettered at once', 'default@12345678', 'receiver-body-text', \
             'dead_letter');",
            z = "0".repeat(55)
        ),
    );

    // explain: a table and the paragraph; --json the same document as the API.
    let o = herald(d, &["explain", "C0FFEE00"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = stdout(&o);
    assert_private("herald explain", &text);
    for want in [
        "event id         cli-perm",
        "destination      https://hooks.example.com/…",
        "state            dead_letter (permanent)",
        "STATUS",
        "404",
        "permanent refusal: dead-lettered at once",
        "Replays\n  none",
        "It is dead-lettered because the receiver refused it permanently",
    ] {
        assert!(text.contains(want), "missing {want:?}:\n{text}");
    }
    let o = herald(d, &["explain", "--event-id", "cli-mail", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_private("herald explain --json", &stdout(&o));
    let e = json(&o);
    assert_eq!(e["destination"], "a***@e***.com");
    assert_eq!(e["state"], "dead_letter");
    assert_eq!(
        e["fingerprint"],
        Value::Null,
        "none before a first attempt: found by event id"
    );

    // Stored text a terminal would obey is escaped in --json too, and reads back the same.
    let o = herald(d, &["explain", "--event-id", "cli-rtl", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let raw = stdout(&o);
    assert!(
        !raw.contains(['\u{202e}', '\u{7f}']) && raw.contains("fixed \\u202egnp.exe\\u007f"),
        "{raw}"
    );
    assert_eq!(json(&o)["state_reason"], "fixed \u{202e}gnp.exe\u{7f}");

    // Exit statuses: not found 1, bad input 2, ambiguous 3 (candidates on stderr).
    assert_eq!(code(&herald(d, &["explain", "99999999"])), 1);
    assert_eq!(code(&herald(d, &["explain", "xyz"])), 2);
    let o = herald(d, &["explain", "abcdabcd"]);
    assert_eq!(code(&o), 3);
    assert!(
        stderr(&o).contains("cli-amb-1") && stderr(&o).contains("cli-amb-2"),
        "{}",
        stderr(&o)
    );
    let o = herald(d, &["explain", "abcdabcd", "--json"]);
    assert_eq!(code(&o), 3);
    assert_eq!(json(&o)["candidates"].as_array().unwrap().len(), 2);

    // dlq list: oldest first, filters, keyset pages.
    let o = herald(d, &["dlq", "list", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_private("herald dlq list --json", &stdout(&o));
    let ids: Vec<_> = json(&o)["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["event_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["cli-perm", "cli-mail", "cli-amb-1", "cli-amb-2"]);
    let o = herald(d, &["dlq", "list", "--class", "exhausted"]);
    let text = stdout(&o);
    assert!(
        text.starts_with("DEAD-LETTERED")
            && text.contains("cli-mail")
            && !text.contains("cli-perm"),
        "{text}"
    );
    assert_private("herald dlq list", &text);
    let o = herald(d, &["dlq", "list", "--limit", "3"]);
    let text = stdout(&o);
    let after = text
        .lines()
        .find_map(|l| l.strip_prefix("more: --after "))
        .unwrap_or_else(|| panic!("{text}"));
    let o = herald(d, &["dlq", "list", "--json", "--after", after]);
    assert_eq!(json(&o)["dead_letters"][0]["event_id"], "cli-amb-2");
    assert_eq!(json(&o)["next"], Value::Null);
    let only = |args: &[&str]| {
        let mut all = vec!["dlq", "list", "--json"];
        all.extend_from_slice(args);
        json(&herald(d, &all))["dead_letters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["event_id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        only(&["--destination", "example.com"]),
        ["cli-mail"],
        "the email domain"
    );
    assert_eq!(
        only(&["--destination", "HOOKS.example.com"]),
        ["cli-perm"],
        "the URL host"
    );
    assert_eq!(only(&["--channel", "email"]), ["cli-mail"]);
    assert_eq!(
        only(&["--since", "2026-12-01T10:00:02Z"]),
        ["cli-amb-1", "cli-amb-2"]
    );
    assert_eq!(only(&["--until", "2026-12-01T10:00:01Z"]), ["cli-perm"]);
    assert_eq!(code(&herald(d, &["dlq", "list", "--class", "late"])), 2);
    assert_eq!(code(&herald(d, &["dlq", "list", "--limit", "1001"])), 2);

    // replay: audited as cli:tester; a second replay of a scheduled message is refused.
    assert_eq!(
        code(&herald(d, &["replay", "c0ffee00", "--reason", " "])),
        2
    );
    let o = herald(
        d,
        &["replay", "c0ffee00", "--reason", "customer asked, ticket 9"],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("replayed cli-perm") && stdout(&o).contains("from dead_letter"),
        "{}",
        stdout(&o)
    );
    let e = json(&herald(d, &["explain", "c0ffee00", "--json"]));
    assert_eq!(e["state"], "scheduled");
    assert_eq!(e["replays"][0]["who"], "cli:tester");
    assert_eq!(e["replays"][0]["reason"], "customer asked, ticket 9");
    assert_eq!(e["replays"][0]["series_start"], 2);
    assert_eq!(e["event_id"], "cli-perm");
    let o = herald(d, &["replay", "c0ffee00", "--reason", "again"]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("scheduled"), "{}", stderr(&o));

    // dlq redrive: bounded, audited.
    assert_eq!(
        code(&herald(
            d,
            &["dlq", "redrive", "--reason", "r", "--limit", "1001"]
        )),
        2
    );
    assert_eq!(code(&herald(d, &["dlq", "redrive", "--reason", ""])), 2);
    let o = herald(
        d,
        &[
            "dlq", "redrive", "--reason", "bulk", "--limit", "1", "--json",
        ],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let r = json(&o);
    assert_eq!(r["redriven"][0]["event_id"], "cli-mail");
    assert_eq!(r["more"], true);
    assert!(r["next"].is_string(), "{r}");
    assert_eq!(
        code(&herald(
            d,
            &["dlq", "redrive", "--reason", "r", "--after", "zz"]
        )),
        2
    );
    let o = herald(
        d,
        &["dlq", "redrive", "--reason", "bulk", "--class", "permanent"],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("2 redriven, 0 skipped (limit 100)"),
        "{}",
        stdout(&o)
    );
    let e = json(&herald(
        d,
        &["explain", "--event-id", "cli-amb-1", "--json"],
    ));
    assert_eq!(e["replays"][0]["who"], "cli:tester");
    let o = herald(d, &["dlq", "list", "--json"]);
    assert_eq!(json(&o)["dead_letters"], Value::Array(vec![]));
}

/// `herald replay` refusals that one of its flags answers say which flag: a delivered message
/// needs `--force`, one whose `expires_at` has passed `--expires-at` or `--clear-expires-at`;
/// with the flag the same command replays it.
#[test]
fn replay_refusals_name_the_flag_that_answers_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    migrated_with(
        d,
        &format!(
            "INSERT INTO herald_outbox (id, event_id, channel, destination, payload, state, attempts, \
             request_fingerprint, expires_at, updated_at) VALUES \
         (1, 'cli-done', 'webhook', 'https://x.example/h', '{{\"body\":{{}}}}', 'delivered', 1, \
             'deadbeef{z}', NULL, '2026-12-01 10:00:00+00:00'), \
         (2, 'cli-late', 'webhook', 'https://x.example/h', '{{\"body\":{{}}}}', 'dead_letter', 1, \
             'feedface{z}', '2026-12-01 11:00:00+00:00', '2026-12-01 10:00:00+00:00');",
            z = "0".repeat(56)
        ),
    );

    let o = herald(d, &["replay", "deadbeef", "--reason", "lost it"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("it is delivered") && stderr(&o).contains("add --force"),
        "{}",
        stderr(&o)
    );
    let o = herald(d, &["replay", "deadbeef", "--reason", "lost it", "--force"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("replayed cli-done"), "{}", stdout(&o));

    let o = herald(d, &["replay", "feedface", "--reason", "receiver fixed"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is not in the future")
            && stderr(&o).contains("add --expires-at TIME")
            && stderr(&o).contains("--clear-expires-at"),
        "{}",
        stderr(&o)
    );
    // A time given that has passed is bad input: exit 2, naming it.
    let o = herald(
        d,
        &[
            "replay",
            "feedface",
            "--reason",
            "receiver fixed",
            "--expires-at",
            "2020-01-01T00:00:00Z",
        ],
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("expires_at") && stderr(&o).contains("2020-01-01"),
        "{}",
        stderr(&o)
    );
    let o = herald(
        d,
        &[
            "replay",
            "feedface",
            "--reason",
            "receiver fixed",
            "--clear-expires-at",
        ],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("replayed cli-late"), "{}", stdout(&o));
    // A refusal no flag answers gets no hint: the message just replayed is scheduled now.
    let o = herald(d, &["replay", "feedface", "--reason", "again"]);
    assert_eq!(code(&o), 1);
    assert!(!stderr(&o).contains("add --"), "{}", stderr(&o));
}

/// Pointed at a database Herald never set up, the support commands (and `herald serve
/// --no-migrate`) say so and how to set it up, exit 1, and create nothing: a SQLite path with no
/// file, and a file without Herald's tables.
#[test]
fn commands_on_a_database_never_migrated_say_to_run_herald_migrate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let commands: [&[&str]; 4] = [
        &["explain", "--event-id", "x"],
        &["dlq", "list"],
        &["replay", "--event-id", "x", "--reason", "r"],
        &["serve", "--no-migrate"],
    ];
    for args in commands {
        let o = herald(d, args);
        assert_eq!(code(&o), 1, "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("no database at") && stderr(&o).contains("herald migrate"),
            "{args:?}: {}",
            stderr(&o)
        );
        assert!(!d.join("herald.db").exists(), "{args:?} created the file");
    }
    // With --json, the error is a document on standard output too (it printed nothing).
    for args in [
        &["explain", "--event-id", "x", "--json"][..],
        &["dlq", "list", "--json"],
        &["dlq", "redrive", "--reason", "r", "--json"],
        &["skip", "x", "--reason", "r", "--json"],
    ] {
        let o = herald(d, args);
        assert_eq!(code(&o), 1, "{args:?}: {}", stderr(&o));
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {:?}", String::from_utf8_lossy(&o.stdout)));
        assert_eq!(doc["error"], "storage", "{args:?}: {doc}");
        assert!(
            doc["detail"].as_str().unwrap().contains("herald migrate"),
            "{args:?}: {doc}"
        );
    }
    // A directory that is not there, for a command that would create the database: said at
    // once, naming it.
    // The same for a command that would not (it said to run `herald migrate`, which refused).
    let missing = d.join("no-such-dir").join("h.db");
    for args in [&["migrate"][..], &["dlq", "list"]] {
        let o = Command::new(env!("CARGO_BIN_EXE_herald"))
            .env(
                "HERALD_DATABASE_URL",
                format!("sqlite://{}", missing.display()),
            )
            .env_remove("HERALD_API_TOKEN")
            .args(args)
            .output()
            .unwrap();
        assert_eq!(code(&o), 1, "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!(
                "no directory {} for the SQLite database",
                d.join("no-such-dir").display()
            )),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    diesel::sqlite::SqliteConnection::establish(d.join("herald.db").to_str().unwrap())
        .unwrap()
        .batch_execute("CREATE TABLE unrelated (x INTEGER)")
        .unwrap();
    for args in commands {
        let o = herald(d, args);
        assert_eq!(code(&o), 1, "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("no Herald tables") && stderr(&o).contains("`herald migrate`"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
}

/// A PostgreSQL role that may not read diesel's bookkeeping table is told so, not that the
/// database has no Herald tables (the permission error named the table, and was taken for its
/// absence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_cannot_read_the_migrations_is_told_so() {
    let app = crate::support::spawn_app(crate::support::Backend::Postgres).await;
    let db_name = app.test_db.url.rsplit('/').next().unwrap().to_owned();
    let role = format!("nomig_{db_name}");
    app.raw_sql(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN; \
         GRANT SELECT ON herald_outbox TO {role}"
    ));
    let url = app
        .test_db
        .url
        .replacen("://herald@", &format!("://{role}@"), 1);
    assert_ne!(url, app.test_db.url, "the role's own URL");
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_herald"))
        .current_dir(dir.path())
        .env("HERALD_DATABASE_URL", &url)
        .env_remove("HERALD_API_TOKEN")
        .args(["explain", "--event-id", "x"])
        .output()
        .unwrap();
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot read the database's migrations")
            && stderr(&o).contains("permission denied"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("no Herald tables"), "{}", stderr(&o));
    app.raw_sql(&format!(
        "REVOKE ALL ON herald_outbox FROM {role}; DROP ROLE {role}"
    ));
    app.stop().await;
}
