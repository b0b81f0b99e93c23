//! The admin page over plain HTTP: sign-in and its refusals, the cookie's attributes, session
//! expiry by the injected clock, one session key shared by every process on a database,
//! CSRF and cross-site refusals, the security headers, and pages that show what happened
//! without a body, an address or a secret. (The browser test is `admin_browser`.)

use std::time::Duration;

use crate::both_backends;
use crate::support::admin::{
    DESK, SHOP, assert_reveals_nothing, client, csrf_of, get, post, session, session_cookie,
    sign_in, spawn, story,
};
use crate::support::app::{ADMIN_TOKEN, spawn_on};
use crate::support::{Backend, TestDb};

/// A replay form's fields.
fn fields(csrf: &str) -> Vec<(&str, &str)> {
    vec![
        ("csrf", csrf),
        ("event_id", "order-1842:shipped"),
        ("reason", "receiver fixed"),
    ]
}

fn location(r: &reqwest::Response) -> &str {
    r.headers()["location"].to_str().unwrap()
}

async fn sign_in_takes_support_or_admin_tokens_and_sets_a_strict_cookie(backend: Backend) {
    let app = spawn(backend).await;
    // Nothing without a session: pages send the browser to sign in.
    for path in [
        "/admin",
        "/admin/",
        "/admin/search?q=x",
        "/admin/message?event_id=x",
        "/admin/dead-letters",
        "/admin/nope",
    ] {
        let r = get(&app, path, None).await;
        assert_eq!(r.status(), 303, "{path}");
        assert_eq!(location(&r), "/admin/sign-in", "{path}");
    }
    let r = get(&app, "/admin/sign-in", None).await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("name=\"token\""));

    // A send token: a clear refusal on the page, and no session.
    let r = sign_in(&app, SHOP).await;
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("set-cookie").is_none());
    let html = r.text().await.unwrap();
    assert!(html.contains("has the send scope"), "{html}");
    assert!(!html.contains(SHOP), "the token is not echoed");
    let r = sign_in(&app, "not-a-token-0123456789").await;
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("set-cookie").is_none());
    assert!(r.text().await.unwrap().contains("not known to Herald"));

    // A support token: a session cookie, HttpOnly, SameSite=Strict, for /admin, 8 hours.
    let r = sign_in(&app, DESK).await;
    assert_eq!(r.status(), 303);
    assert_eq!(location(&r), "/admin");
    let (cookie, header) = session_cookie(&r);
    assert!(!header.contains(DESK));
    for attr in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/admin",
        "Max-Age=28800",
    ] {
        assert!(header.contains(attr), "{attr} in {header}");
    }
    assert!(!header.contains("Secure"), "plain HTTP: {header}");
    let r = get(&app, "/admin", Some(&cookie)).await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("desk (support)"));

    // The admin token too; behind a TLS proxy the cookie is Secure.
    let r = client()
        .post(format!("{}/admin/sign-in", app.base))
        .header("origin", &app.base)
        .header("x-forwarded-proto", "https")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={ADMIN_TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert!(session_cookie(&r).1.ends_with("; Secure"));
    app.stop().await;
}

async fn sessions_expire_and_every_process_on_the_database_accepts_them(backend: Backend) {
    let app = spawn(backend).await;
    let cookie = session(&app, DESK).await;
    // A second Herald on the same database (the session key is stored there), with the same
    // tokens: the same session is valid there.
    let other = spawn_on(
        TestDb::attach(&app.test_db.url, backend),
        &crate::support::admin::tokens_toml(),
    )
    .await;
    assert_eq!(get(&other, "/admin", Some(&cookie)).await.status(), 200);
    // A Herald whose configuration no longer has the token: the session is over there.
    let without = spawn_on(TestDb::attach(&app.test_db.url, backend), "").await;
    let r = get(&without, "/admin", Some(&cookie)).await;
    assert_eq!(r.status(), 303);
    assert_eq!(location(&r), "/admin/sign-in");

    // Eight hours later (the injected clock), it has expired.
    app.advance(Duration::from_secs(8 * 3600 - 60));
    assert_eq!(get(&app, "/admin", Some(&cookie)).await.status(), 200);
    app.advance(Duration::from_secs(60));
    let r = get(&app, "/admin", Some(&cookie)).await;
    assert_eq!(r.status(), 303);
    assert_eq!(location(&r), "/admin/sign-in");
    // A forged cookie is no session either.
    let forged = format!("{}x", cookie);
    assert_eq!(get(&other, "/admin", Some(&forged)).await.status(), 303);
    other.stop().await;
    without.stop().await;
    app.stop().await;
}

/// The session id a cookie carries (the last field of its signed payload).
fn session_id(cookie: &str) -> String {
    use base64::Engine;
    let value = cookie.split_once('=').unwrap().1;
    let payload = value.split('.').next().unwrap();
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    let payload = String::from_utf8(payload).unwrap();
    payload.rsplit('|').next().unwrap().to_owned()
}

/// Signs out the session of `cookie` from the page's own form.
async fn sign_out(app: &crate::support::app::TestApp, cookie: &str) -> reqwest::Response {
    let page = get(app, "/admin", Some(cookie)).await.text().await.unwrap();
    post(
        app,
        "/admin/sign-out",
        Some(cookie),
        &[("csrf", &csrf_of(&page))],
    )
    .await
}

/// "Sign out" ends the session for good, in every process on the database: a copy of the cookie
/// taken before is refused (it was valid for the rest of its 8 hours: the cookie is stateless),
/// other sessions of the same token go on, and stored sign-outs go when their session would
/// have expired. If the sign-out cannot be stored, the session stays and the page says so.
async fn a_sign_out_ends_the_session_everywhere(backend: Backend) {
    let app = spawn(backend).await;
    let other = spawn_on(
        TestDb::attach(&app.test_db.url, backend),
        &crate::support::admin::tokens_toml(),
    )
    .await;
    let (first, second) = (session(&app, DESK).await, session(&app, DESK).await);
    assert_eq!(get(&other, "/admin", Some(&first)).await.status(), 200);
    let r = sign_out(&app, &first).await;
    assert_eq!(r.status(), 303);
    assert!(session_cookie(&r).1.contains("Max-Age=0"));
    for h in [&app, &other] {
        let r = get(h, "/admin", Some(&first)).await;
        assert_eq!(r.status(), 303, "a copy of the signed-out cookie");
        assert_eq!(location(&r), "/admin/sign-in");
        let r = post(h, "/admin/sign-out", Some(&first), &[("csrf", "x")]).await;
        assert_eq!(r.status(), 401);
        assert_eq!(get(h, "/admin", Some(&second)).await.status(), 200);
        // Of two cookies, the signed-out one does not hide the other.
        let both = format!("{first}; {second}");
        assert_eq!(get(h, "/admin", Some(&both)).await.status(), 200);
    }
    // An hour after its 8 hours (a process whose clock is behind still refuses it meanwhile),
    // the first session's sign-out is removed by the next sign-out.
    app.advance(Duration::from_secs(9 * 3600 + 60));
    let third = session(&app, DESK).await;
    assert_eq!(sign_out(&app, &third).await.status(), 303);
    let ids = vec![session_id(&first), session_id(&second), session_id(&third)];
    assert_eq!(app.db.signed_out(&ids).unwrap(), vec![ids[2].clone()]);
    assert_eq!(get(&app, "/admin", Some(&third)).await.status(), 303);

    // A sign-out the database cannot store: 503, the cookie is kept and still signs in.
    let fourth = session(&app, DESK).await;
    let page = get(&app, "/admin", Some(&fourth))
        .await
        .text()
        .await
        .unwrap();
    // Only the insert fails (the session check reads the table as ever).
    let (refuse, allow) = match backend {
        Backend::Postgres => (
            "CREATE FUNCTION refuse_signouts() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'refused'; END $$; \
             CREATE TRIGGER refuse_signouts BEFORE INSERT ON herald_admin_signouts \
             FOR EACH ROW EXECUTE FUNCTION refuse_signouts();",
            "DROP TRIGGER refuse_signouts ON herald_admin_signouts",
        ),
        Backend::Sqlite => (
            "CREATE TRIGGER refuse_signouts BEFORE INSERT ON herald_admin_signouts \
             BEGIN SELECT RAISE(ABORT, 'refused'); END;",
            "DROP TRIGGER refuse_signouts",
        ),
    };
    // It cannot store the sign-out; nor can it read the sign-outs, so the session's own check
    // fails first (a re-check walk-through, the database stopped): either way 503, the cookie
    // kept, and the page says the session goes on (it said only "try again"; a walk-through
    // took it for signed out).
    for (fail, mend) in [
        (refuse, allow),
        (
            "ALTER TABLE herald_admin_signouts RENAME TO herald_admin_signouts_away",
            "ALTER TABLE herald_admin_signouts_away RENAME TO herald_admin_signouts",
        ),
    ] {
        app.raw_sql(fail);
        let r = post(
            &app,
            "/admin/sign-out",
            Some(&fourth),
            &[("csrf", &csrf_of(&page))],
        )
        .await;
        assert_eq!(r.status(), 503, "{fail}");
        assert!(r.headers().get("set-cookie").is_none());
        let html = r.text().await.unwrap();
        assert!(html.contains("Database unavailable"), "says why");
        assert!(html.contains("you are still signed in"), "{html}");
        app.raw_sql(mend);
    }
    assert_eq!(get(&app, "/admin", Some(&fourth)).await.status(), 200);
    assert_eq!(sign_out(&app, &fourth).await.status(), 303);
    assert_eq!(get(&app, "/admin", Some(&fourth)).await.status(), 303);
    other.stop().await;
    app.stop().await;
}

async fn actions_need_this_site_a_session_and_its_csrf_token(backend: Backend) {
    let app = spawn(backend).await;
    let (story, _rx) = story(&app).await;
    let cookie = session(&app, DESK).await;
    let page = get(
        &app,
        &format!("/admin/message?event_id={}", story.dead),
        Some(&cookie),
    )
    .await
    .text()
    .await
    .unwrap();
    let csrf = csrf_of(&page);
    let csrf = csrf.as_str();

    // No session: 401, whatever the form holds.
    let r = post(&app, "/admin/replay", None, &fields(csrf)).await;
    assert_eq!(r.status(), 401);
    // Missing or wrong CSRF token: 403.
    let r = post(&app, "/admin/replay", Some(&cookie), &fields("")[1..]).await;
    assert_eq!(r.status(), 403);
    let r = post(&app, "/admin/replay", Some(&cookie), &fields("AAAA")).await;
    assert_eq!(r.status(), 403);
    // Another session's token does not fit this one.
    let other = session(&app, DESK).await;
    let r = post(&app, "/admin/replay", Some(&other), &fields(csrf)).await;
    assert_eq!(r.status(), 403);
    // From another site (Origin, or the browser's Sec-Fetch-Site), or saying neither: 403.
    let send = |origin: Option<&str>, site: Option<&str>| {
        let mut rq = client()
            .post(format!("{}/admin/replay", app.base))
            .header("cookie", &cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(crate::support::admin::form(&fields(csrf)));
        if let Some(o) = origin {
            rq = rq.header("origin", o);
        }
        if let Some(s) = site {
            rq = rq.header("sec-fetch-site", s);
        }
        rq.send()
    };
    for (origin, site) in [
        (Some("https://evil.example"), None),
        (Some("null"), None),
        (None, Some("cross-site")),
        (None, Some("same-site")),
        (None, None),
    ] {
        let r = send(origin, site).await.unwrap();
        assert_eq!(r.status(), 403, "{origin:?} {site:?}");
    }
    // A cross-site sign-in (login CSRF) is refused too, and sets nothing.
    let r = client()
        .post(format!("{}/admin/sign-in", app.base))
        .header("sec-fetch-site", "cross-site")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={DESK}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("set-cookie").is_none());

    // A refused replay's form comes back with the reason typed in it.
    let r = post(
        &app,
        "/admin/replay",
        Some(&cookie),
        &[
            ("csrf", csrf),
            ("event_id", &story.dead),
            ("reason", "receiver fixed (ticket 77)"),
            ("expires", "set"),
            ("expires_at", "not a time"),
        ],
    )
    .await;
    assert_eq!(r.status(), 422);
    let html = r.text().await.unwrap();
    assert!(
        html.contains("value=\"receiver fixed (ticket 77)\""),
        "{html}"
    );
    assert_eq!(app.row(&story.dead).state.as_str(), "dead_letter");
    // The right token from this site: replayed, and sent back to the message's page.
    let r = send(None, Some("same-origin")).await.unwrap();
    assert_eq!(r.status(), 303);
    assert!(
        r.headers()["location"]
            .to_str()
            .unwrap()
            .contains("replayed=1")
    );
    assert_eq!(app.row(&story.dead).state.as_str(), "scheduled");
    // The banner follows the replay this viewer made; the same link for a message nobody
    // replayed shows none (a crafted `replayed=1` showed it).
    let to = location(&r).to_owned();
    let html = get(&app, &to, Some(&cookie)).await.text().await.unwrap();
    assert!(html.contains("Replay recorded"), "{html}");
    let html = get(
        &app,
        &format!("/admin/message?event_id={}&replayed=1", story.retried),
        Some(&cookie),
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(!html.contains("Replay recorded"), "{html}");
    // A reason is required.
    let r = post(
        &app,
        "/admin/replay",
        Some(&cookie),
        &[("csrf", csrf), ("event_id", &story.dead), ("reason", "  ")],
    )
    .await;
    assert_eq!(r.status(), 422);
    assert!(r.text().await.unwrap().contains("needs a reason"));
    assert_eq!(
        app.row(&story.dead).state.as_str(),
        "scheduled",
        "nothing more happened"
    );

    // Sign-out is an action too; then the cookie is cleared.
    let r = post(&app, "/admin/sign-out", Some(&cookie), &[]).await;
    assert_eq!(r.status(), 403, "without the CSRF token");
    let r = post(&app, "/admin/sign-out", Some(&cookie), &[("csrf", csrf)]).await;
    assert_eq!(r.status(), 303);
    assert_eq!(location(&r), "/admin/sign-in");
    assert!(session_cookie(&r).1.contains("Max-Age=0"));
    app.stop().await;
}

async fn every_answer_carries_the_security_headers(backend: Backend) {
    let app = spawn(backend).await;
    let cookie = session(&app, DESK).await;
    for (path, c) in [
        ("/admin/sign-in", None),
        ("/admin", Some(cookie.as_str())),
        ("/admin/dead-letters", Some(cookie.as_str())),
        ("/admin/nope", Some(cookie.as_str())),
        ("/admin/message", None),
    ] {
        let r = get(&app, path, c).await;
        let h = r.headers();
        assert_eq!(h["content-security-policy"], herald::admin::CSP, "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["referrer-policy"], "no-referrer", "{path}");
        assert_eq!(h["cache-control"], "no-store", "{path}");
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
    }
    let r = get(&app, "/admin/nope", Some(&cookie)).await;
    assert_eq!(r.status(), 404);
    let css = get(&app, "/admin/static/admin.css", None).await;
    assert_eq!(css.status(), 200);
    assert_eq!(css.headers()["content-type"], "text/css; charset=utf-8");
    assert_eq!(css.headers()["x-content-type-options"], "nosniff");
    let html = get(&app, "/admin", Some(&cookie))
        .await
        .text()
        .await
        .unwrap();
    assert!(!html.contains("<script"), "no script at all");
    assert!(
        !html.contains("style="),
        "no inline style (the CSP refuses it)"
    );
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no external asset"
    );
    app.stop().await;
}

async fn pages_show_what_happened_and_nothing_secret(backend: Backend) {
    let app = spawn(backend).await;
    let (story, rx) = story(&app).await;
    let cookie = session(&app, DESK).await;
    let c = Some(cookie.as_str());

    // Search by event id, then by a fingerprint prefix (any case): straight to the message.
    let r = get(&app, &format!("/admin/search?q={}", story.dead), c).await;
    assert_eq!(r.status(), 303);
    assert_eq!(location(&r), "/admin/message?event_id=order-1842%3Ashipped");
    let prefix = story.dead_fingerprint[..12].to_uppercase();
    let r = get(&app, &format!("/admin/search?q={prefix}"), c).await;
    assert_eq!(r.status(), 303);
    assert_eq!(location(&r), "/admin/message?event_id=order-1842%3Ashipped");
    let r = get(&app, "/admin/search?q=0000000000ffffff", c).await;
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("nothing-found"));

    // The message page: the timeline with the 400 and its class, masked destination.
    let html = get(&app, "/admin/message?event_id=order-1842%3Ashipped", c)
        .await
        .text()
        .await
        .unwrap();
    assert!(html.contains("answered 400"), "{html}");
    assert!(html.contains("classified permanent"));
    assert!(html.contains(">dead_letter<"));
    assert!(html.contains(&story.dead_fingerprint));
    assert!(html.contains(&rx.masked()), "scheme, host and port only");
    assert!(
        html.contains("id=\"replay\""),
        "a dead letter can be replayed"
    );
    assert_reveals_nothing(&html, &rx);
    // The retried one: 503 then 200, with the delay and its reason.
    let html = get(
        &app,
        &format!("/admin/message?event_id={}", story.retried),
        c,
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(html.contains("answered 503"), "{html}");
    assert!(html.contains("classified transient; retry in"));
    assert!(html.contains("answered 200"));
    assert!(
        html.contains("name=\"force\""),
        "delivered: only with force"
    );
    assert_reveals_nothing(&html, &rx);
    // The email: the address masked, the subject and text nowhere.
    let html = get(&app, &format!("/admin/message?event_id={}", story.email), c)
        .await
        .text()
        .await
        .unwrap();
    assert!(html.contains("a***@e***.com"), "{html}");
    assert!(!html.contains("Your order"));
    assert_reveals_nothing(&html, &rx);

    // Dead letters, with filters.
    let html = get(&app, "/admin/dead-letters", c)
        .await
        .text()
        .await
        .unwrap();
    assert!(html.contains("order-1842:shipped"));
    assert!(!html.contains(&story.retried));
    assert_reveals_nothing(&html, &rx);
    for (q, listed) in [
        ("class=permanent", true),
        ("class=transient", false),
        ("channel=webhook&class=permanent", true),
        ("channel=email", false),
        ("class=unconfirmed", false),
    ] {
        let r = get(&app, &format!("/admin/dead-letters?{q}"), c).await;
        assert_eq!(r.status(), 200, "{q}");
        let html = r.text().await.unwrap();
        assert_eq!(html.contains("order-1842:shipped"), listed, "{q}");
    }
    // An unknown class, and a page cursor no page gave (about 7500 BC: PostgreSQL refuses the
    // time, which once answered 503): a bad filter, 400.
    for q in ["class=bogus", "before=-300000000000000000.1"] {
        let r = get(&app, &format!("/admin/dead-letters?{q}"), c).await;
        assert_eq!(r.status(), 400, "{q}");
    }

    // The chart counts the attempts by class: 1 permanent, 1 transient, 1 accepted.
    let html = get(&app, "/admin", c).await.text().await.unwrap();
    for class in ["permanent 1", "transient 1", "accepted 1", "conflict 0"] {
        assert!(html.contains(class), "{class} in the legend");
    }
    assert_eq!(html.matches("<rect").count(), 3, "{html}");

    // A URL not spelled with `://` (the URL parser takes `http:/host/path`) is masked as any
    // other (the page once showed it whole; a walk-through found it). The API refuses it now;
    // an application's SQL insert may still write one.
    let port = url::Url::parse(&rx.url).unwrap().port().unwrap();
    let odd = format!("http:/127.0.0.1:{port}/bad/ODDSECRET?token=ODDQ");
    app.raw_sql(&format!(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload) \
         VALUES ('odd-url', 'webhook', '{odd}', '{{\"body\": {{}}}}')"
    ));
    let html = get(&app, "/admin/message?event_id=odd-url", c)
        .await
        .text()
        .await
        .unwrap();
    assert!(
        !html.contains("ODDSECRET") && !html.contains("ODDQ"),
        "{html}"
    );
    assert!(html.contains(&rx.masked()), "{html}");

    // A prefix more than 20 messages share: the newest 20, and that there are more.
    let rows: Vec<String> = (0..22)
        .map(|i| {
            format!(
                "('same-prefix-{i:02}', 'webhook', 'https://x.example/h', '{{\"body\": {{}}}}', \
                 'deadbeef{i:056x}')"
            )
        })
        .collect();
    app.raw_sql(&format!(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload, \
         request_fingerprint) VALUES {}",
        rows.join(", ")
    ));
    let html = get(&app, "/admin/search?q=DEADBEEF", c)
        .await
        .text()
        .await
        .unwrap();
    assert!(html.contains("More than 20 messages match"), "{html}");
    assert!(html.contains("same-prefix-21") && html.contains("same-prefix-02"));
    assert!(!html.contains("same-prefix-01") && !html.contains("same-prefix-00"));

    // Stored text is shown, never obeyed: a right-to-left override in a state reason an
    // application wrote is written out, and Herald's words around it keep their direction.
    app.raw_sql(
        "INSERT INTO herald_outbox (event_id, channel, destination, payload, state, state_reason) \
         VALUES ('rtl-1', 'webhook', 'https://x.example/h', '{\"body\": {}}', 'dead_letter', \
         'fixed \u{202e}gnp.exe')",
    );
    // A replay's reason may not carry one at all.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/messages/rtl-1/replay", app.base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&serde_json::json!({"reason": "fixed \u{202e}gnp.exe"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let html = get(&app, "/admin/message?event_id=rtl-1", c)
        .await
        .text()
        .await
        .unwrap();
    assert!(!html.contains('\u{202e}'), "{html}");
    assert!(html.contains("fixed \\u{202e}gnp.exe"), "{html}");
    // The API's JSON says the same text, escaped where `curl` on a terminal would obey it.
    let r = reqwest::Client::new()
        .get(format!("{}/v1/messages/rtl-1", app.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let raw = r.text().await.unwrap();
    assert!(
        !raw.contains('\u{202e}') && raw.contains("fixed \\u202egnp.exe"),
        "{raw}"
    );
    let v: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(v["state_reason"], "fixed \u{202e}gnp.exe");
    app.stop().await;
}

async fn dead_letters_page_newest_first_by_keyset(backend: Backend) {
    use herald::admin::data::dead_letters;
    use herald::storage::admin::DeadLetterFilter;
    let app = spawn(backend).await;
    let rx = crate::support::Receiver::start().await;
    rx.script((0..3).map(|_| crate::support::Reply::Status(422)));
    for i in 0..3 {
        app.post_message(crate::support::app::webhook(
            &format!("dl-{i}"),
            &rx.url,
            serde_json::json!({}),
        ))
        .await;
        app.run_until_idle().await;
        app.advance(Duration::from_secs(1));
    }
    let db = app.db.clone();
    let pages = tokio::task::spawn_blocking(move || {
        let mut filter = DeadLetterFilter::default();
        let mut seen = Vec::new();
        loop {
            let (rows, next) = dead_letters(&db, &filter, 2).unwrap();
            seen.push(rows.iter().map(|r| r.event_id.clone()).collect::<Vec<_>>());
            match next {
                Some(c) => filter.before = Some(c),
                None => break seen,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(pages, [vec!["dl-2", "dl-1"], vec!["dl-0"]]);
    // The page's links: only "Older" on the first page, "Newest" (with the filter) on a later
    // one; and no `accepted` in the class filter (an accepted send is never a dead letter).
    let cookie = session(&app, DESK).await;
    let html = get(&app, "/admin/dead-letters?channel=webhook", Some(&cookie))
        .await
        .text()
        .await
        .unwrap();
    assert!(!html.contains("id=\"first-page\""), "{html}");
    assert!(!html.contains("option value=\"accepted\""), "{html}");
    assert!(html.contains("option value=\"permanent\""), "{html}");
    let t = app.row("dl-1").updated_at.timestamp_micros();
    let id = app.row("dl-1").id;
    let html = get(
        &app,
        &format!("/admin/dead-letters?channel=webhook&before={t}.{id}"),
        Some(&cookie),
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(
        html.contains("id=\"first-page\" href=\"/admin/dead-letters?channel=webhook\""),
        "{html}"
    );
    assert!(
        html.contains(">dl-0<") && !html.contains(">dl-1<"),
        "{html}"
    );
    app.stop().await;
}

/// A fan-out's own event id names no row: the search lists its children, each a message.
async fn search_by_a_fan_outs_event_id_lists_its_children(backend: Backend) {
    let app = crate::support::app::spawn_app_with(
        backend,
        &format!(
            "{}[endpoints.a]\nurl = \"https://a.example/h\"\nevent_types = [\"order.*\"]\n\
             [endpoints.b]\nurl = \"https://b.example/h\"\nevent_types = [\"order.*\"]\n",
            crate::support::admin::tokens_toml()
        ),
    )
    .await;
    let r = app
        .post_message(crate::support::app::webhook(
            "fan-9",
            "type:order.placed",
            serde_json::json!({}),
        ))
        .await;
    assert_eq!(r.status(), 201);
    let cookie = session(&app, DESK).await;
    // An empty search goes back to the search box.
    let r = get(&app, "/admin/search?q=+", Some(&cookie)).await;
    assert_eq!((r.status().as_u16(), location(&r)), (303, "/admin"));
    // Its own event id on the message page: the messages it fanned out to.
    let r = get(&app, "/admin/message?event_id=fan-9", Some(&cookie)).await;
    assert_eq!(
        (r.status().as_u16(), location(&r)),
        (303, "/admin/search?q=fan-9")
    );
    let r = get(&app, "/admin/message?event_id=nope", Some(&cookie)).await;
    assert_eq!(
        get(&app, location(&r), Some(&cookie)).await.status(),
        404,
        "an unknown one is not found there"
    );
    let r = get(&app, "/admin/search?q=fan-9", Some(&cookie)).await;
    assert_eq!(r.status(), 200);
    let html = r.text().await.unwrap();
    assert!(
        html.contains("fan-9:a") && html.contains("fan-9:b"),
        "{html}"
    );
    app.stop().await;
}

/// An expired message is replayed from its page: the form offers its expires_at, cleared by
/// default once it has passed (it was kept, and every such replay was refused), or set to a
/// time a person gives; a time that is not one is a 422 that changes nothing.
async fn an_expired_message_is_replayed_from_its_page(backend: Backend) {
    let app = spawn(backend).await;
    let rx = crate::support::Receiver::start().await;
    for id in ["gone-1", "gone-2"] {
        let mut m = crate::support::app::webhook(id, &rx.url, serde_json::json!({}));
        m["expires_at"] =
            serde_json::json!((app.clock_now() + chrono::Duration::seconds(1)).to_rfc3339());
        assert_eq!(app.post_message(m).await.status(), 201);
    }
    app.advance(Duration::from_secs(2));
    assert_eq!(app.run_until_idle().await, 0);
    assert_eq!(app.row("gone-1").state.as_str(), "expired");
    let cookie = session(&app, DESK).await;
    let page = get(&app, "/admin/message?event_id=gone-1", Some(&cookie))
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("name=\"expires\""), "{page}");
    assert!(page.contains("<option value=\"clear\" selected"), "{page}");
    let csrf = csrf_of(&page);
    let replay = |id: &'static str, expires: &'static str, at: &'static str| {
        let (cookie, csrf, app) = (cookie.clone(), csrf.clone(), &app);
        async move {
            post(
                app,
                "/admin/replay",
                Some(&cookie),
                &[
                    ("csrf", csrf.as_str()),
                    ("event_id", id),
                    ("reason", "customer asked again"),
                    ("expires", expires),
                    ("expires_at", at),
                ],
            )
            .await
        }
    };
    let r = replay("gone-1", "set", "tomorrow").await;
    assert_eq!(r.status(), 422);
    let html = r.text().await.unwrap();
    assert!(html.contains("RFC 3339"));
    // The form comes back as sent: "set", and the time typed (it came back "clear" and empty,
    // and a person who fixed the time and sent it again cleared the deadline instead).
    assert!(
        html.contains("<option value=\"set\" selected")
            && !html.contains("<option value=\"clear\" selected")
            && html.contains("value=\"tomorrow\""),
        "{html}"
    );
    // A reason the API refuses is a 422 naming the reason, as the API's (it was a 409).
    let r = post(
        &app,
        "/admin/replay",
        Some(&cookie),
        &[
            ("csrf", csrf.as_str()),
            ("event_id", "gone-1"),
            ("reason", "a\u{1b}[31mred"),
            ("expires", "clear"),
        ],
    )
    .await;
    assert_eq!(r.status(), 422);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("The reason must not contain control"),
    );
    assert_eq!(
        app.row("gone-1").state.as_str(),
        "expired",
        "nothing changed"
    );
    // Kept, it would expire again at once: refused, as the API refuses it (422).
    assert_eq!(replay("gone-1", "keep", "").await.status(), 422);
    // A time typed while clearing is not dropped unseen.
    assert_eq!(
        replay("gone-1", "clear", "2099-01-01T00:00:00Z")
            .await
            .status(),
        422
    );
    assert_eq!(
        app.row("gone-1").state.as_str(),
        "expired",
        "nothing changed"
    );
    assert_eq!(replay("gone-1", "clear", "").await.status(), 303);
    assert_eq!(app.row("gone-1").expires_at, None);
    assert_eq!(app.row("gone-1").state.as_str(), "scheduled");
    // The timeline has the replay: who, why, from what.
    let page = get(&app, "/admin/message?event_id=gone-1", Some(&cookie))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("Replayed by")
            && page.contains("from expired: \u{201c}customer asked again\u{201d}"),
        "{page}"
    );
    let later = "2099-01-01T00:00:00Z";
    assert_eq!(replay("gone-2", "set", later).await.status(), 303);
    assert_eq!(
        app.row("gone-2").expires_at.map(|t| t.to_rfc3339()),
        Some("2099-01-01T00:00:00+00:00".to_owned())
    );
    assert_eq!(app.run_until_idle().await, 2);
    assert_eq!(rx.event_ids().len(), 2);
    app.stop().await;
}

/// A skip of a dead head is on its page's timeline: who, why (an address in it masked), and
/// that the key's later messages went on (found by a walk-through: only the paragraph said so).
async fn a_skip_is_on_the_timeline(backend: Backend) {
    let app = spawn(backend).await;
    let rx = crate::support::Receiver::start().await;
    rx.script([crate::support::Reply::Status(400)]);
    let m = serde_json::json!({"event_id": "k-1", "channel": "webhook", "destination": rx.url,
        "payload": {"body": {}}, "ordering_key": "k"});
    assert_eq!(app.post_message(m).await.status(), 201);
    app.run_until_idle().await;
    let r = app
        .http
        .post(format!("{}/v1/messages/k-1/skip", app.base))
        .json(&serde_json::json!({"reason": "voided, asked by ada@example.com"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let cookie = session(&app, DESK).await;
    let html = get(&app, "/admin/message?event_id=k-1", Some(&cookie))
        .await
        .text()
        .await
        .unwrap();
    assert!(html.contains("class=\"t-skip\""), "{html}");
    assert!(html.contains("Skipped by default"), "{html}");
    assert!(
        html.contains("from dead_letter: \u{201c}voided, asked by a***@e***.com\u{201d}"),
        "{html}"
    );
    assert!(!html.contains("ada@example.com"), "{html}");
    app.stop().await;
}

both_backends!(
    a_skip_is_on_the_timeline,
    a_sign_out_ends_the_session_everywhere,
    an_expired_message_is_replayed_from_its_page,
    search_by_a_fan_outs_event_id_lists_its_children,
    sign_in_takes_support_or_admin_tokens_and_sets_a_strict_cookie,
    sessions_expire_and_every_process_on_the_database_accepts_them,
    actions_need_this_site_a_session_and_its_csrf_token,
    every_answer_carries_the_security_headers,
    pages_show_what_happened_and_nothing_secret,
    dead_letters_page_newest_first_by_keyset,
);
