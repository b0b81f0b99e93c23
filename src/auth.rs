//! Who is calling: bearer tokens with a name and a scope.
//!
//! Tokens live in the config file as SHA-256 digests (`[tokens.NAME] sha256 = "…", scope =
//! "…"`); `HERALD_API_TOKEN` is one plain token named `default` with scope `admin`; without
//! either, Herald generates a `default` admin token on first start and stores it (shown by
//! `herald api-token`). A presented token is hashed and compared with every configured digest in
//! constant time, so neither the time taken nor an early exit tells which digest came close.
//! The token's *name* is what logs and audits record; the token itself never is.

use std::fmt;

use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a token may do. `admin` may do everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Enqueue messages; read and cancel the messages it enqueued.
    Send,
    /// Read any message and receipt; explain, replay, dead letters, cancel; the admin page.
    Support,
    /// Everything.
    Admin,
}

impl Scope {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "send" => Some(Self::Send),
            "support" => Some(Self::Support),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Send => "send",
            Self::Support => "support",
            Self::Admin => "admin",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a route needs of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Enqueue: `send` or `admin`.
    Enqueue,
    /// One message: any scope, but a `send` token only the messages it enqueued.
    OwnMessage,
    /// Support work (explain, replay, dead letters, unmatched receipts): `support` or `admin`.
    Support,
    /// Operating Herald itself: `admin` only.
    Admin,
}

/// The outcome of [`Principal::may`] for one route and (for [`Access::OwnMessage`]) one
/// message's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// The token lacks the scope: 403.
    Forbidden,
    /// A `send` token asking for a message it did not enqueue: answered as if it did not exist
    /// (404), so one client cannot probe another's event ids.
    NotOwn,
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub scope: Scope,
}

impl Principal {
    /// The one decision every route makes. `owner` is the name of the token that enqueued the
    /// message (`None`: enqueued by SQL or the library, or before tokens had names).
    pub fn may(&self, access: Access, owner: Option<&str>) -> Verdict {
        use {Access as A, Scope as S};
        match (self.scope, access) {
            (S::Admin, _) => Verdict::Allowed,
            (S::Support, A::OwnMessage | A::Support) => Verdict::Allowed,
            (S::Send, A::Enqueue) => Verdict::Allowed,
            (S::Send, A::OwnMessage) if owner == Some(self.name.as_str()) => Verdict::Allowed,
            (S::Send, A::OwnMessage) => Verdict::NotOwn,
            (S::Support, A::Enqueue | A::Admin) | (S::Send, A::Support | A::Admin) => {
                Verdict::Forbidden
            }
        }
    }
}

/// One configured token: its name, scope and the SHA-256 of the token text.
#[derive(Clone)]
struct Entry {
    name: String,
    scope: Scope,
    digest: [u8; 32],
}

/// Every token Herald accepts. `Debug` shows names and scopes only.
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Vec<Entry>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| (&e.name, e.scope)))
            .finish()
    }
}

/// Why a token entry was refused at start-up; the message never quotes a digest or token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenConfigError {
    #[error("a token name must be 1–64 characters of A–Z, a–z, 0–9, '-', '_' or '.'")]
    BadName,
    #[error(
        "sha256 must be the 64 hex digits of the token's SHA-256 (`herald token NAME --scope S` prints it)"
    )]
    BadDigest,
    #[error("scope must be one of send, support, admin")]
    BadScope,
    #[error("the name is used twice (HERALD_API_TOKEN is the token named default)")]
    Duplicate,
    #[error("the same token is configured under two names")]
    SameDigest,
    #[error("a plain token must be at least 16 characters")]
    TooShort,
}

pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The hex SHA-256 of a token, as `[tokens.NAME] sha256` holds it.
pub fn digest_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A new random token: 32 bytes, URL-safe base64 without padding, prefixed `hrld_`.
pub fn generate() -> String {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "hrld_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

impl Tokens {
    /// Adds a token given by its digest (`[tokens.NAME]`).
    pub fn add_digest(
        &mut self,
        name: &str,
        hex_digest: &str,
        scope: &str,
    ) -> Result<(), TokenConfigError> {
        if !valid_name(name) {
            return Err(TokenConfigError::BadName);
        }
        let scope = Scope::parse(scope).ok_or(TokenConfigError::BadScope)?;
        let mut digest = [0u8; 32];
        hex::decode_to_slice(hex_digest.trim(), &mut digest)
            .map_err(|_| TokenConfigError::BadDigest)?;
        self.push(Entry {
            name: name.to_owned(),
            scope,
            digest,
        })
    }

    /// Adds a plain token (`HERALD_API_TOKEN`, or the generated one), without the whitespace
    /// around it (a secret mounted from a file ends with a newline): a presented token is
    /// trimmed too, so an untrimmed one could never match.
    pub fn add_plain(
        &mut self,
        name: &str,
        token: &str,
        scope: Scope,
    ) -> Result<(), TokenConfigError> {
        let token = token.trim();
        if token.len() < 16 {
            return Err(TokenConfigError::TooShort);
        }
        self.push(Entry {
            name: name.to_owned(),
            scope,
            digest: Sha256::digest(token.as_bytes()).into(),
        })
    }

    fn push(&mut self, entry: Entry) -> Result<(), TokenConfigError> {
        if self.entries.iter().any(|e| e.name == entry.name) {
            return Err(TokenConfigError::Duplicate);
        }
        if self.entries.iter().any(|e| e.digest == entry.digest) {
            return Err(TokenConfigError::SameDigest);
        }
        self.entries.push(entry);
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = (&str, Scope)> {
        self.entries.iter().map(|e| (e.name.as_str(), e.scope))
    }

    /// The caller a presented token belongs to, if any. Every entry is compared, whatever
    /// matched earlier.
    pub fn authenticate(&self, presented: &str) -> Option<Principal> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for e in &self.entries {
            if bool::from(e.digest.ct_eq(&digest)) {
                found = Some(e);
            }
        }
        found.map(|e| Principal {
            name: e.name.clone(),
            scope: e.scope,
        })
    }

    /// What a browser session made with the token named `name` is bound to: its scope and a
    /// SHA-256 of its digest (never the digest itself). A session whose binding no longer matches
    /// (the token was removed, replaced under the same name or given another scope) has ended.
    pub fn session_binding(&self, name: &str) -> Option<(Scope, [u8; 32])> {
        self.entries.iter().find(|e| e.name == name).map(|e| {
            let mut h = Sha256::new();
            h.update(b"herald-session-binding\0");
            h.update(e.digest);
            (e.scope, h.finalize().into())
        })
    }

    /// The token of an `Authorization` header value: `Bearer <token>` (the scheme's case is
    /// ignored, as RFC 9110 says).
    pub fn bearer(header: &str) -> Option<&str> {
        let (scheme, token) = header.split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim())
            .filter(|t| !t.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        let mut t = Tokens::default();
        t.add_digest("shop", &digest_hex("shop-token-0123456789"), "send")
            .unwrap();
        t.add_digest("desk", &digest_hex("desk-token-0123456789"), "support")
            .unwrap();
        t.add_plain("default", "root-token-0123456789", Scope::Admin)
            .unwrap();
        t
    }

    #[test]
    fn a_token_is_known_by_its_digest() {
        let t = tokens();
        let p = t.authenticate("shop-token-0123456789").unwrap();
        assert_eq!((p.name.as_str(), p.scope), ("shop", Scope::Send));
        let p = t.authenticate("root-token-0123456789").unwrap();
        assert_eq!((p.name.as_str(), p.scope), ("default", Scope::Admin));
        assert_eq!(t.authenticate("shop-token-012345678"), None, "a prefix");
        assert_eq!(t.authenticate(""), None);
        assert_eq!(
            t.authenticate(&digest_hex("shop-token-0123456789")),
            None,
            "the digest itself"
        );
    }

    #[test]
    fn a_plain_token_with_a_trailing_newline_still_matches_the_presented_one() {
        let mut t = Tokens::default();
        // As a secret mounted from a file gives it.
        t.add_plain("default", "root-token-0123456789\n", Scope::Admin)
            .unwrap();
        let presented = Tokens::bearer("Bearer root-token-0123456789").unwrap();
        assert!(t.authenticate(presented).is_some());
        assert_eq!(
            Tokens::default().add_plain("x", "  short-token  \n", Scope::Admin),
            Err(TokenConfigError::TooShort),
            "the length is the trimmed one's"
        );
    }

    #[test]
    fn every_scope_against_every_access() {
        use {Access as A, Scope as S, Verdict as V};
        let who = |scope| Principal {
            name: "shop".into(),
            scope,
        };
        let cases = [
            (S::Send, A::Enqueue, None, V::Allowed),
            (S::Send, A::OwnMessage, Some("shop"), V::Allowed),
            (S::Send, A::OwnMessage, Some("other"), V::NotOwn),
            (S::Send, A::OwnMessage, None, V::NotOwn),
            (S::Send, A::Support, None, V::Forbidden),
            (S::Send, A::Admin, None, V::Forbidden),
            (S::Support, A::Enqueue, None, V::Forbidden),
            (S::Support, A::OwnMessage, Some("other"), V::Allowed),
            (S::Support, A::OwnMessage, None, V::Allowed),
            (S::Support, A::Support, None, V::Allowed),
            (S::Support, A::Admin, None, V::Forbidden),
            (S::Admin, A::Enqueue, None, V::Allowed),
            (S::Admin, A::OwnMessage, Some("other"), V::Allowed),
            (S::Admin, A::Support, None, V::Allowed),
            (S::Admin, A::Admin, None, V::Allowed),
        ];
        for (scope, access, owner, want) in cases {
            assert_eq!(
                who(scope).may(access, owner),
                want,
                "{scope} {access:?} {owner:?}"
            );
        }
    }

    #[test]
    fn bad_entries_are_refused() {
        let mut t = tokens();
        let d = digest_hex("another-token-0123456789");
        assert_eq!(
            t.add_digest("a b", &d, "send"),
            Err(TokenConfigError::BadName)
        );
        assert_eq!(t.add_digest("", &d, "send"), Err(TokenConfigError::BadName));
        assert_eq!(
            t.add_digest("x", &d[1..], "send"),
            Err(TokenConfigError::BadDigest)
        );
        assert_eq!(
            t.add_digest("x", &d, "root"),
            Err(TokenConfigError::BadScope)
        );
        assert_eq!(
            t.add_digest("shop", &d, "send"),
            Err(TokenConfigError::Duplicate)
        );
        assert_eq!(
            t.add_digest("x", &digest_hex("desk-token-0123456789"), "send"),
            Err(TokenConfigError::SameDigest)
        );
        assert_eq!(
            t.add_plain("y", "short", Scope::Admin),
            Err(TokenConfigError::TooShort)
        );
        t.add_digest("x", &d.to_uppercase(), "send").unwrap();
        assert!(t.authenticate("another-token-0123456789").is_some());
    }

    #[test]
    fn session_bindings_follow_the_token_not_its_name() {
        let t = tokens();
        let (scope, a) = t.session_binding("desk").unwrap();
        assert_eq!(scope, Scope::Support);
        assert_ne!(
            a,
            Sha256::digest(b"desk-token-0123456789").as_slice(),
            "not the digest"
        );
        assert_eq!(t.session_binding("nobody"), None);
        let mut other = Tokens::default();
        other
            .add_digest("desk", &digest_hex("desk-token-9876543210"), "support")
            .unwrap();
        assert_ne!(
            other.session_binding("desk").unwrap().1,
            a,
            "replaced token"
        );
    }

    #[test]
    fn bearer_header() {
        assert_eq!(Tokens::bearer("Bearer abc"), Some("abc"));
        assert_eq!(Tokens::bearer("bearer abc "), Some("abc"));
        assert_eq!(Tokens::bearer("Basic abc"), None);
        assert_eq!(Tokens::bearer("Bearer "), None);
        assert_eq!(Tokens::bearer("Bearerabc"), None);
    }

    #[test]
    fn generated_tokens_are_random_and_long() {
        let (a, b) = (generate(), generate());
        assert_ne!(a, b);
        assert!(a.starts_with("hrld_") && a.len() == 5 + 43, "{a}");
        let debug = format!("{:?}", tokens());
        assert!(
            !debug.contains(&digest_hex("shop-token-0123456789")[..16]),
            "{debug}"
        );
    }
}
