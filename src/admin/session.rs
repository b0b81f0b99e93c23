//! The admin page's session: a stateless cookie, HMAC-signed with a key every Herald process on
//! one database shares (generated once, stored in `herald_settings`).
//!
//! The cookie carries the token's name and scope, a binding to the token (a SHA-256 of its
//! digest, see [`Tokens::session_binding`]), its expiry and a random session id — never the
//! token. Every request re-checks the binding against the tokens configured *now*, so removing
//! or replacing a token (or changing its scope) ends its sessions at once. The CSRF token of a
//! session is an HMAC of its id under the same key: nothing to store, and no other session's
//! token fits. All of it is pure: the caller passes the time. A sign-out is the one thing
//! stored (`herald_admin_signouts`, by session id): the caller asks it after [`verify`].

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::auth::{Principal, Scope, Tokens};

/// The cookie's name.
pub const COOKIE: &str = "herald_admin";
/// How long a session lasts from sign-in.
pub const LIFETIME: chrono::Duration = chrono::Duration::hours(8);
/// The key under which the session key is stored in `herald_settings`.
pub const KEY_SETTING: &str = "admin_session_key";

const VERSION: &str = "1";

/// The key that signs sessions and derives CSRF tokens (32 bytes). `Debug` never shows it.
#[derive(Clone)]
pub struct SessionKey([u8; 32]);

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(…)")
    }
}

impl SessionKey {
    /// A new random key, as hex (what `herald_settings` stores).
    pub fn generate_hex() -> String {
        let mut k = [0u8; 32];
        rand::rng().fill_bytes(&mut k);
        hex::encode(k)
    }

    /// The key from its stored hex.
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut k = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut k).ok()?;
        Some(Self(k))
    }

    fn mac(&self, purpose: &[u8], data: &[u8]) -> Hmac<Sha256> {
        // A 32-byte key is always a valid HMAC key.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        m.update(purpose);
        m.update(b"\0");
        m.update(data);
        m
    }
}

/// A valid session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub principal: Principal,
    /// Random, hex; the CSRF token is derived from it.
    pub id: String,
    pub expires_at: DateTime<Utc>,
}

/// Why a sign-in is refused (shown on the page, in these words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignInRefused {
    #[error("That token is not known to Herald.")]
    UnknownToken,
    /// The token's name (a name, never the token).
    #[error(
        "That token has the send scope; the admin page needs a token with the support or admin scope."
    )]
    SendScope(String),
}

impl SignInRefused {
    /// Why, as the log says it.
    pub fn kind(&self) -> &'static str {
        match self {
            SignInRefused::UnknownToken => "unknown_token",
            SignInRefused::SendScope(_) => "send_scope",
        }
    }

    /// The token's name, where the token is known.
    pub fn token_name(&self) -> Option<&str> {
        match self {
            SignInRefused::UnknownToken => None,
            SignInRefused::SendScope(name) => Some(name),
        }
    }
}

/// Checks a token typed into the sign-in form: known, and of scope `support` or `admin`.
pub fn sign_in(tokens: &Tokens, presented: &str) -> Result<Principal, SignInRefused> {
    let who = tokens
        .authenticate(presented.trim())
        .ok_or(SignInRefused::UnknownToken)?;
    match who.scope {
        Scope::Support | Scope::Admin => Ok(who),
        Scope::Send => Err(SignInRefused::SendScope(who.name)),
    }
}

/// Makes a new session for `who` at `now`: the cookie value and the session. `None` when the
/// token is not configured (it was removed between the check and now).
pub fn issue(
    key: &SessionKey,
    tokens: &Tokens,
    who: &Principal,
    now: DateTime<Utc>,
) -> Option<(String, Session)> {
    let mut id = [0u8; 16];
    rand::rng().fill_bytes(&mut id);
    issue_with_id(key, tokens, who, now, &hex::encode(id))
}

fn issue_with_id(
    key: &SessionKey,
    tokens: &Tokens,
    who: &Principal,
    now: DateTime<Utc>,
    id: &str,
) -> Option<(String, Session)> {
    let (scope, binding) = tokens.session_binding(&who.name)?;
    let expires_at = now + LIFETIME;
    let payload = format!(
        "{VERSION}|{}|{}|{}|{}|{id}",
        who.name,
        scope.as_str(),
        hex::encode(binding),
        expires_at.timestamp()
    );
    let tag = key
        .mac(b"herald-admin-session", payload.as_bytes())
        .finalize();
    let value = format!(
        "{}.{}",
        B64.encode(payload.as_bytes()),
        B64.encode(tag.into_bytes())
    );
    let session = Session {
        principal: Principal {
            name: who.name.clone(),
            scope,
        },
        id: id.to_owned(),
        expires_at: DateTime::from_timestamp(expires_at.timestamp(), 0)?,
    };
    Some((value, session))
}

/// Why a cookie is not a session (never shown to the caller; they are sent to sign in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    Malformed,
    BadSignature,
    Expired,
    /// The token is no longer configured as it was (removed, replaced or rescoped).
    TokenChanged,
}

/// The session a cookie value stands for at `now`, against the tokens configured now.
pub fn verify(
    key: &SessionKey,
    tokens: &Tokens,
    value: &str,
    now: DateTime<Utc>,
) -> Result<Session, Invalid> {
    let (payload_b64, tag_b64) = value.split_once('.').ok_or(Invalid::Malformed)?;
    let payload = B64.decode(payload_b64).map_err(|_| Invalid::Malformed)?;
    let tag = B64.decode(tag_b64).map_err(|_| Invalid::Malformed)?;
    key.mac(b"herald-admin-session", &payload)
        .verify_slice(&tag)
        .map_err(|_| Invalid::BadSignature)?;
    let payload = String::from_utf8(payload).map_err(|_| Invalid::Malformed)?;
    let parts: Vec<&str> = payload.split('|').collect();
    let [version, name, scope, binding, expires, id] = parts[..] else {
        return Err(Invalid::Malformed);
    };
    if version != VERSION {
        return Err(Invalid::Malformed);
    }
    let scope = Scope::parse(scope).ok_or(Invalid::Malformed)?;
    let expires_at = expires
        .parse::<i64>()
        .ok()
        .and_then(|t| DateTime::from_timestamp(t, 0))
        .ok_or(Invalid::Malformed)?;
    if now >= expires_at {
        return Err(Invalid::Expired);
    }
    let mut presented = [0u8; 32];
    hex::decode_to_slice(binding, &mut presented).map_err(|_| Invalid::Malformed)?;
    match tokens.session_binding(name) {
        Some((now_scope, now_binding))
            if now_scope == scope
                && matches!(scope, Scope::Support | Scope::Admin)
                && bool::from(now_binding.ct_eq(&presented)) => {}
        _ => return Err(Invalid::TokenChanged),
    }
    Ok(Session {
        principal: Principal {
            name: name.to_owned(),
            scope,
        },
        id: id.to_owned(),
        expires_at,
    })
}

/// The CSRF token of a session: what its forms carry in the hidden `csrf` field.
pub fn csrf_token(key: &SessionKey, session: &Session) -> String {
    B64.encode(
        key.mac(b"herald-admin-csrf", session.id.as_bytes())
            .finalize()
            .into_bytes(),
    )
}

/// Whether `presented` is the CSRF token of `session` (constant time).
pub fn csrf_ok(key: &SessionKey, session: &Session, presented: &str) -> bool {
    match B64.decode(presented.trim()) {
        Ok(tag) => key
            .mac(b"herald-admin-csrf", session.id.as_bytes())
            .verify_slice(&tag)
            .is_ok(),
        Err(_) => false,
    }
}

/// The `Set-Cookie` value for a new session.
pub fn set_cookie(value: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={value}; Path=/admin; Max-Age={}; HttpOnly; SameSite=Strict{}",
        LIFETIME.num_seconds(),
        if secure { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` value that ends a session in the browser.
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/admin; Max-Age=0; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    )
}

/// The session cookie's value in a `Cookie` header, if any.
pub fn from_cookie_header(header: &str) -> impl Iterator<Item = &str> {
    // Every one of that name, in order: a junk cookie a sibling domain planted before the real
    // one must not sign the operator out (only the first was tried).
    header
        .split(';')
        .filter_map(|c| c.trim().split_once('='))
        .filter(|(n, _)| *n == COOKIE)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::digest_hex;

    fn tokens() -> Tokens {
        let mut t = Tokens::default();
        t.add_digest("desk", &digest_hex("desk-token-0123456789"), "support")
            .unwrap();
        t.add_digest("shop", &digest_hex("shop-token-0123456789"), "send")
            .unwrap();
        t.add_plain("default", "root-token-0123456789", Scope::Admin)
            .unwrap();
        t
    }

    fn key() -> SessionKey {
        SessionKey::from_hex(&SessionKey::generate_hex()).unwrap()
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn sign_in_takes_support_and_admin_tokens_only() {
        let t = tokens();
        assert_eq!(
            sign_in(&t, "desk-token-0123456789").unwrap().scope,
            Scope::Support
        );
        assert_eq!(
            sign_in(&t, " root-token-0123456789\n").unwrap().name,
            "default"
        );
        let refused = sign_in(&t, "shop-token-0123456789").unwrap_err();
        assert_eq!(refused, SignInRefused::SendScope("shop".into()));
        assert_eq!(
            (refused.kind(), refused.token_name()),
            ("send_scope", Some("shop"))
        );
        assert_eq!(SignInRefused::UnknownToken.token_name(), None);
        assert_eq!(sign_in(&t, "nope"), Err(SignInRefused::UnknownToken));
        assert_eq!(sign_in(&t, ""), Err(SignInRefused::UnknownToken));
    }

    #[test]
    fn a_session_lasts_eight_hours_to_the_second() {
        let (t, k) = (tokens(), key());
        let who = sign_in(&t, "desk-token-0123456789").unwrap();
        let now = at("2026-12-01T10:00:00.5Z");
        let (cookie, s) = issue(&k, &t, &who, now).unwrap();
        assert!(!cookie.contains("desk-token"), "the token is never in it");
        assert_eq!(s.expires_at, at("2026-12-01T18:00:00Z"));
        let ok = verify(&k, &t, &cookie, at("2026-12-01T17:59:59Z")).unwrap();
        assert_eq!(ok, s);
        assert_eq!(
            verify(&k, &t, &cookie, at("2026-12-01T18:00:00Z")),
            Err(Invalid::Expired)
        );
    }

    #[test]
    fn a_tampered_or_foreign_cookie_is_refused() {
        let (t, k) = (tokens(), key());
        let now = at("2026-12-01T10:00:00Z");
        let who = sign_in(&t, "desk-token-0123456789").unwrap();
        let (cookie, _) = issue(&k, &t, &who, now).unwrap();
        assert_eq!(
            verify(&key(), &t, &cookie, now),
            Err(Invalid::BadSignature),
            "another database's key"
        );
        // Raise the scope to admin in the payload: the signature no longer fits.
        let (p, tag) = cookie.split_once('.').unwrap();
        let raised = String::from_utf8(B64.decode(p).unwrap())
            .unwrap()
            .replace("|support|", "|admin|");
        let forged = format!("{}.{tag}", B64.encode(raised));
        assert_eq!(verify(&k, &t, &forged, now), Err(Invalid::BadSignature));
        for junk in ["", ".", "abc", "a.b", &format!("{p}.")] {
            assert!(verify(&k, &t, junk, now).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn removing_replacing_or_rescoping_the_token_ends_its_sessions() {
        let (t, k) = (tokens(), key());
        let now = at("2026-12-01T10:00:00Z");
        let who = sign_in(&t, "desk-token-0123456789").unwrap();
        let (cookie, _) = issue(&k, &t, &who, now).unwrap();
        let mut removed = Tokens::default();
        removed
            .add_plain("default", "root-token-0123456789", Scope::Admin)
            .unwrap();
        assert_eq!(
            verify(&k, &removed, &cookie, now),
            Err(Invalid::TokenChanged)
        );
        let mut replaced = removed.clone();
        replaced
            .add_digest("desk", &digest_hex("desk-token-new-0123456789"), "support")
            .unwrap();
        assert_eq!(
            verify(&k, &replaced, &cookie, now),
            Err(Invalid::TokenChanged)
        );
        let mut rescoped = removed.clone();
        rescoped
            .add_digest("desk", &digest_hex("desk-token-0123456789"), "send")
            .unwrap();
        assert_eq!(
            verify(&k, &rescoped, &cookie, now),
            Err(Invalid::TokenChanged)
        );
        assert!(verify(&k, &tokens(), &cookie, now).is_ok());
    }

    #[test]
    fn csrf_tokens_belong_to_one_session() {
        let (t, k) = (tokens(), key());
        let now = at("2026-12-01T10:00:00Z");
        let who = sign_in(&t, "desk-token-0123456789").unwrap();
        let (_, a) = issue_with_id(&k, &t, &who, now, "aa").unwrap();
        let (_, b) = issue_with_id(&k, &t, &who, now, "bb").unwrap();
        let ta = csrf_token(&k, &a);
        assert!(csrf_ok(&k, &a, &ta));
        assert!(!csrf_ok(&k, &b, &ta), "another session's token");
        assert!(!csrf_ok(&key(), &a, &ta), "another key");
        assert!(!csrf_ok(&k, &a, ""));
        assert!(!csrf_ok(&k, &a, "not base64!"));
        assert!(!csrf_ok(&k, &a, &ta[..ta.len() - 2]));
    }

    #[test]
    fn cookies_are_http_only_strict_and_scoped_to_admin() {
        let c = set_cookie("v", false);
        assert_eq!(
            c,
            "herald_admin=v; Path=/admin; Max-Age=28800; HttpOnly; SameSite=Strict"
        );
        assert!(set_cookie("v", true).ends_with("; Secure"));
        assert!(clear_cookie(false).contains("Max-Age=0"));
        assert_eq!(
            from_cookie_header("a=b; herald_admin=xyz.t; c=d").next(),
            Some("xyz.t")
        );
        assert_eq!(from_cookie_header("herald_admin=").next(), None);
        assert_eq!(from_cookie_header("other=1").next(), None);
        assert_eq!(
            from_cookie_header("herald_admin=bogus.x; herald_admin=real.y").collect::<Vec<_>>(),
            ["bogus.x", "real.y"]
        );
    }
}
