//! The admin page from a test: tokens of each scope, a dead letter made for real, and a plain
//! HTTP client that carries the session cookie by hand (so every header can be looked at).

use serde_json::json;

use super::app::{TestApp, spawn_app_with, webhook};
use super::{Backend, Receiver, Reply};

/// A `support` token.
pub const DESK: &str = "desk-token-0123456789";
/// A `send` token.
pub const SHOP: &str = "shop-token-0123456789";
/// Text only the payload holds: no page may show it.
pub const BODY_TEXT: &str = "PRIVATE-BODY-do-not-show";
/// A path only the destination URL holds: no page may show it.
pub const SECRET_PATH: &str = "/orders/s3cr3t-path";
/// An address only the email's destination holds.
pub const ADDRESS: &str = "ada.lovelace@example.com";

pub fn tokens_toml() -> String {
    format!(
        "[tokens.desk]\nsha256 = \"{}\"\nscope = \"support\"\n\
         [tokens.shop]\nsha256 = \"{}\"\nscope = \"send\"\n",
        herald::auth::digest_hex(DESK),
        herald::auth::digest_hex(SHOP),
    )
}

pub async fn spawn(backend: Backend) -> TestApp {
    spawn_app_with(backend, &tokens_toml()).await
}

/// A client that follows no redirect (each 303 is looked at).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// What the sender produced for a page to show.
pub struct Story {
    pub dead: String,
    pub dead_fingerprint: String,
    pub retried: String,
    pub email: String,
}

/// A webhook dead-lettered by a 400 (its body and URL path are secrets to the page), one that
/// failed once with a 503 and then went through, and an email scheduled for tomorrow.
pub async fn story(app: &TestApp) -> (Story, Receiver) {
    let rx = Receiver::start().await;
    rx.script_path(SECRET_PATH, [Reply::Status(400)]);
    rx.script_path("/retry", [Reply::Status(503), Reply::Status(200)]);
    let dead = "order-1842:shipped";
    let r = app
        .post_message(webhook(
            dead,
            &rx.url_for(SECRET_PATH),
            json!({"note": BODY_TEXT}),
        ))
        .await;
    assert_eq!(r.status(), 201);
    let retried = "order-1843:shipped";
    let r = app
        .post_message(webhook(retried, &rx.url_for("/retry"), json!({"n": 1})))
        .await;
    assert_eq!(r.status(), 201);
    let email = "order-1842:mail";
    let tomorrow = app.clock_now() + chrono::Duration::days(1);
    let r = app
        .post_message(json!({
            "event_id": email,
            "channel": "email",
            "destination": ADDRESS,
            "payload": {"subject": "Your order", "text": BODY_TEXT},
            "scheduled_at": tomorrow.to_rfc3339(),
        }))
        .await;
    assert_eq!(r.status(), 201);
    app.run_until_idle().await;
    app.advance(std::time::Duration::from_secs(5));
    app.run_until_idle().await;
    let row = app.row(dead);
    assert_eq!(row.state.as_str(), "dead_letter");
    assert_eq!(app.row(retried).state.as_str(), "delivered");
    let story = Story {
        dead: dead.into(),
        dead_fingerprint: row.request_fingerprint.unwrap(),
        retried: retried.into(),
        email: email.into(),
    };
    (story, rx)
}

/// Every secret a page must not show.
pub fn assert_reveals_nothing(html: &str, rx: &Receiver) {
    for secret in [
        BODY_TEXT,
        SECRET_PATH,
        "s3cr3t",
        ADDRESS,
        "ada.lovelace",
        DESK,
        SHOP,
        super::app::ADMIN_TOKEN,
        super::app::SECRET,
        &rx.url_for(SECRET_PATH),
    ] {
        assert!(!html.contains(secret), "the page shows {secret:?}");
    }
}

/// The value of the first `name="csrf"` field of a page.
pub fn csrf_of(html: &str) -> String {
    let at =
        html.find("name=\"csrf\" value=\"").expect("a csrf field") + "name=\"csrf\" value=\"".len();
    html[at..].split('"').next().unwrap().to_owned()
}

/// The `herald_admin=…` pair of a response's `Set-Cookie`, and the whole header.
pub fn session_cookie(r: &reqwest::Response) -> (String, String) {
    let header = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with("herald_admin="))
        .expect("a session cookie");
    let pair = header.split(';').next().unwrap().to_owned();
    (pair, header)
}

/// Signs in through the form as a browser on the page would.
pub async fn sign_in(app: &TestApp, token: &str) -> reqwest::Response {
    client()
        .post(format!("{}/admin/sign-in", app.base))
        .header("origin", &app.base)
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", token)]))
        .send()
        .await
        .unwrap()
}

/// A session cookie for `token` (support or admin).
pub async fn session(app: &TestApp, token: &str) -> String {
    let r = sign_in(app, token).await;
    assert_eq!(r.status(), 303);
    session_cookie(&r).0
}

/// `application/x-www-form-urlencoded` of `fields`.
pub fn form(fields: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields)
        .finish()
}

pub async fn get(app: &TestApp, path: &str, cookie: Option<&str>) -> reqwest::Response {
    let mut rq = client().get(format!("{}{path}", app.base));
    if let Some(c) = cookie {
        rq = rq.header("cookie", c);
    }
    rq.send().await.unwrap()
}

/// A same-origin form `POST` with the session cookie.
pub async fn post(
    app: &TestApp,
    path: &str,
    cookie: Option<&str>,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    let mut rq = client()
        .post(format!("{}{path}", app.base))
        .header("origin", &app.base)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(fields));
    if let Some(c) = cookie {
        rq = rq.header("cookie", c);
    }
    rq.send().await.unwrap()
}
