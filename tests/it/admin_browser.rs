//! The admin page in a real headless Chromium (WebDriver): load it, sign in with a support
//! token, search a dead letter's fingerprint, read its timeline, replay it with a reason, look at
//! the dead-letter list and its filter, sign out. The page source never shows a body, the
//! destination's path, an address or a token; the cookie is HttpOnly and SameSite=Strict; the
//! CSP header is the strict one.
//!
//! `HERALD_UPDATE_SCREENSHOTS=1` also writes the README's screenshots to docs/screenshots/.

use fantoccini::Locator;

use crate::both_backends;
use crate::support::Backend;
use crate::support::admin::{DESK, assert_reveals_nothing, spawn, story};
use crate::support::browser::Browser;

async fn screenshot(b: &Browser, name: &str, write: bool) {
    let png = b.client.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    if write {
        let dir = crate::support::repo_path("docs/screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }
}

async fn a_person_signs_in_finds_a_dead_letter_and_replays_it(backend: Backend) {
    let write =
        backend == Backend::Sqlite && std::env::var_os("HERALD_UPDATE_SCREENSHOTS").is_some();
    let app = spawn(backend).await;
    let (story, rx) = story(&app).await;
    let b = Browser::start().await;

    // Load the page: the sign-in form.
    b.client.goto(&format!("{}/admin", app.base)).await.unwrap();
    let token = b.element("#token").await;
    assert_eq!(b.path().await, "/admin/sign-in");
    screenshot(&b, "sign-in", write).await;
    // The strict CSP and the other headers, as a plain client sees them.
    let r = reqwest::get(format!("{}/admin/sign-in", app.base))
        .await
        .unwrap();
    assert_eq!(r.headers()["content-security-policy"], herald::admin::CSP);
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");

    // Sign in with a support token.
    token.send_keys(DESK).await.unwrap();
    b.element("#sign-in").await.click().await.unwrap();
    b.element("#q").await;
    assert_eq!(b.path().await, "/admin");
    assert!(
        b.element("header .who")
            .await
            .text()
            .await
            .unwrap()
            .contains("desk (support)")
    );
    b.element("figure.chart svg rect.k-permanent").await;
    let cookie = b.client.get_named_cookie("herald_admin").await.unwrap();
    assert_eq!(cookie.http_only(), Some(true));
    assert_eq!(format!("{:?}", cookie.same_site()), "Some(Strict)");
    assert_eq!(cookie.path(), Some("/admin"));
    screenshot(&b, "overview", write).await;

    // The dead-letter list and its class filter.
    b.client.set_window_size(1280, 900).await.unwrap();
    b.element("nav a[href='/admin/dead-letters']")
        .await
        .click()
        .await
        .unwrap();
    let link = b
        .element(&format!("table.list a[href*='{}']", "order-1842%3Ashipped"))
        .await;
    assert_eq!(link.text().await.unwrap(), story.dead);
    assert_reveals_nothing(&b.client.source().await.unwrap(), &rx);
    screenshot(&b, "dead-letters", write).await;
    b.element("#class")
        .await
        .select_by_value("transient")
        .await
        .unwrap();
    b.element("#filter").await.click().await.unwrap();
    b.element("#no-dead-letters").await;
    assert!(
        b.client
            .current_url()
            .await
            .unwrap()
            .query()
            .unwrap()
            .contains("class=transient")
    );

    // Search the dead letter's fingerprint (a prefix): its page, with the timeline.
    b.client.goto(&format!("{}/admin", app.base)).await.unwrap();
    let q = b.element("#q").await;
    q.send_keys(&story.dead_fingerprint[..16]).await.unwrap();
    b.element("#search").await.click().await.unwrap();
    let timeline = b.element("#timeline").await.text().await.unwrap();
    assert_eq!(b.path().await, "/admin/message");
    assert!(timeline.contains("Attempt 1"), "{timeline}");
    assert!(timeline.contains("answered 400"), "{timeline}");
    assert!(timeline.contains("classified permanent"), "{timeline}");
    assert_eq!(
        b.element("#state").await.text().await.unwrap(),
        "dead_letter"
    );
    assert_eq!(
        b.element("#event-id").await.text().await.unwrap(),
        story.dead
    );
    let attempts = b.element("#attempts").await.text().await.unwrap();
    assert!(
        attempts.contains("400") && attempts.contains("permanent"),
        "{attempts}"
    );
    assert_eq!(
        b.element("#destination").await.text().await.unwrap(),
        rx.masked()
    );
    assert_reveals_nothing(&b.client.source().await.unwrap(), &rx);
    b.client.set_window_size(1280, 1500).await.unwrap();
    screenshot(&b, "message", write).await;

    // Replay it with a reason: recorded (audited under the session's token name), the new
    // attempt series goes out, and the page shows the new attempt.
    b.element("#reason")
        .await
        .send_keys("receiver fixed their schema (ticket 1842)")
        .await
        .unwrap();
    b.element("#replay-button").await.click().await.unwrap();
    let notice = b.element("#notice").await.text().await.unwrap();
    assert!(notice.contains("Replay recorded"), "{notice}");
    assert_eq!(app.row(&story.dead).state.as_str(), "scheduled");
    app.run_until_idle().await;
    b.client.refresh().await.unwrap();
    let timeline = b.element("#timeline").await.text().await.unwrap();
    assert!(timeline.contains("Attempt 2"), "{timeline}");
    assert_eq!(app.attempts(&story.dead).len(), 2);
    assert_eq!(app.row(&story.dead).state.as_str(), "delivered");

    // Sign out: back to the sign-in form, and the session is gone.
    b.element("form.signout button")
        .await
        .click()
        .await
        .unwrap();
    b.element("#token").await;
    assert_eq!(b.path().await, "/admin/sign-in");
    assert!(
        b.client.find(Locator::Css("form.signout")).await.is_err(),
        "signed out"
    );
    b.client.goto(&format!("{}/admin", app.base)).await.unwrap();
    b.element("#token").await;
    assert_eq!(b.path().await, "/admin/sign-in");
    assert!(b.client.get_named_cookie("herald_admin").await.is_err());
    b.close().await;
    app.stop().await;
}

both_backends!(a_person_signs_in_finds_a_dead_letter_and_replays_it);

/// The page's width against the window's: `[document width, window width]`.
async fn widths(b: &Browser) -> (i64, i64) {
    let v = b
        .client
        .execute(
            "return [document.documentElement.scrollWidth, window.innerWidth];",
            vec![],
        )
        .await
        .unwrap();
    (v[0].as_i64().unwrap(), v[1].as_i64().unwrap())
}

/// A 255-character event id (the longest the API takes) in the dead-letter list made the table
/// 4,335 px wide in a 1,280 px window, every other column off screen; at 800 px the list spilled
/// out of its card, and on a phone the search button out of its (a walk-through). The pages now
/// stay within the window: long values wrap, a table still too wide scrolls inside its card.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_values_and_narrow_windows_stay_within_the_page() {
    let app = spawn(Backend::Sqlite).await;
    let (story, rx) = story(&app).await;
    let long = format!("order-{}", "x".repeat(249));
    rx.script_path("/long", [crate::support::Reply::Status(400)]);
    let r = app
        .post_message(crate::support::app::webhook(
            &long,
            &rx.url_for("/long"),
            serde_json::json!({}),
        ))
        .await;
    assert_eq!(r.status(), 201);
    app.run_until_idle().await;
    let b = Browser::start().await;
    b.client.goto(&format!("{}/admin", app.base)).await.unwrap();
    b.element("#token").await.send_keys(DESK).await.unwrap();
    b.element("#sign-in").await.click().await.unwrap();
    b.element("#q").await;
    for (w, h) in [(1280, 900), (800, 900), (390, 844)] {
        b.client.set_window_size(w, h).await.unwrap();
        for page in [
            "/admin".to_owned(),
            "/admin/dead-letters".to_owned(),
            format!("/admin/search?q={}", &story.dead_fingerprint[..8]),
            herald::admin::pages::message_href(&long),
        ] {
            b.client.goto(&format!("{}{page}", app.base)).await.unwrap();
            b.element("main").await;
            let (page_w, window_w) = widths(&b).await;
            assert!(
                page_w <= window_w,
                "{page} at {w} px: the page is {page_w} px wide in a {window_w} px window"
            );
        }
    }
    b.close().await;
    app.stop().await;
}
