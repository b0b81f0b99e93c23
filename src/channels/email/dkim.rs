//! An optional DKIM signature (RFC 6376) for sending directly, without a relay that signs for
//! Herald: `dkim_selector`, `dkim_domain` and `dkim_key_file` (all three or none).
//!
//! The key file is PEM: an RSA key as PKCS#1 (`BEGIN RSA PRIVATE KEY`, `openssl genrsa
//! -traditional`) or PKCS#8 (`BEGIN PRIVATE KEY`, `openssl genpkey -algorithm RSA`), or an
//! Ed25519 key as PKCS#8 (`openssl genpkey -algorithm ed25519`, RFC 8463). Encrypted keys are
//! refused. Signing is lettre's (`rsa-sha256` or `ed25519-sha256`), relaxed/relaxed
//! canonicalization, over [`SIGNED_HEADERS`], each listed twice — those a message does not carry
//! are signed as absent, and those it carries once cannot gain a second copy, so nothing can add
//! them on the way. The key is read once at start-up and never shown:
//! `Debug` prints the selector, the domain and the algorithm only.

use std::path::Path;

use base64::Engine;
use lettre::Message;
use lettre::message::dkim::{
    DkimCanonicalization, DkimCanonicalizationType, DkimConfig, DkimSigningAlgorithm,
    DkimSigningKey,
};
use lettre::message::header::HeaderName;
use rsa::pkcs8::der::Decode;
use rsa::pkcs8::der::asn1::OctetStringRef;
use rsa::pkcs8::{ObjectIdentifier, PrivateKeyInfo};

/// The header fields every signature covers (RFC 6376 §5.4.1's recommendations, the one-click
/// unsubscribe headers RFC 8058 §4 asks to sign, and Herald's event id). Not `Content-Type`:
/// lettre writes a MIME body's own headers after signing, so it would be signed as absent and
/// every signature would fail; the body hash covers the MIME structure below it all the same.
pub const SIGNED_HEADERS: &[&str] = &[
    "From",
    "Reply-To",
    "To",
    "Cc",
    "Subject",
    "Date",
    "Message-ID",
    "MIME-Version",
    "List-Unsubscribe",
    "List-Unsubscribe-Post",
    "X-Herald-Event-Id",
];

const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
const ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");

/// Why the DKIM settings cannot be used. Nothing here quotes the key.
#[derive(Debug, thiserror::Error)]
pub enum DkimError {
    #[error("cannot read the key file")]
    Read(#[source] std::io::Error),
    #[error("the key file is not PEM (-----BEGIN … PRIVATE KEY-----)")]
    NotPem,
    #[error(
        "a {0:?} PEM block is not supported; use an unencrypted RSA (PKCS#1 or PKCS#8) or \
         Ed25519 (PKCS#8) private key"
    )]
    UnsupportedPem(String),
    #[error("the PKCS#8 key is neither RSA nor Ed25519")]
    UnsupportedAlgorithm,
    #[error("the key does not decode")]
    Malformed,
    #[error("the key is not valid for DKIM signing")]
    Key(#[source] lettre::message::dkim::DkimSigningKeyError),
    #[error("{0} must be a domain name such as example.com")]
    Name(&'static str),
}

/// Signs messages for one selector and domain.
pub struct DkimSigner {
    selector: String,
    domain: String,
    algorithm: DkimSigningAlgorithm,
    config: DkimConfig,
}

impl std::fmt::Debug for DkimSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DkimSigner({}._domainkey.{}, {}, key redacted)",
            self.selector, self.domain, self.algorithm
        )
    }
}

impl DkimSigner {
    /// Reads and checks the key file.
    pub fn load(selector: &str, domain: &str, key_file: &Path) -> Result<Self, DkimError> {
        let pem = std::fs::read_to_string(key_file).map_err(DkimError::Read)?;
        Self::from_pem(selector, domain, &pem)
    }

    /// As [`DkimSigner::load`] with the file's text.
    pub fn from_pem(selector: &str, domain: &str, pem: &str) -> Result<Self, DkimError> {
        let selector = dns_name(selector).ok_or(DkimError::Name("dkim_selector"))?;
        let domain = dns_name(domain).ok_or(DkimError::Name("dkim_domain"))?;
        let (label, der) = pem_block(pem).ok_or(DkimError::NotPem)?;
        let (key, algorithm) = match label.as_str() {
            "RSA PRIVATE KEY" => (pem_text("RSA PRIVATE KEY", &der), DkimSigningAlgorithm::Rsa),
            "PRIVATE KEY" => {
                let info = PrivateKeyInfo::from_der(&der).map_err(|_| DkimError::Malformed)?;
                if info.algorithm.oid == RSA_ENCRYPTION {
                    // PKCS#8 wraps the PKCS#1 key that lettre reads.
                    (
                        pem_text("RSA PRIVATE KEY", info.private_key),
                        DkimSigningAlgorithm::Rsa,
                    )
                } else if info.algorithm.oid == ED25519 {
                    // RFC 8410: the private key is an OCTET STRING holding the 32-byte seed.
                    let seed = OctetStringRef::from_der(info.private_key)
                        .map_err(|_| DkimError::Malformed)?;
                    (
                        base64::engine::general_purpose::STANDARD.encode(seed.as_bytes()),
                        DkimSigningAlgorithm::Ed25519,
                    )
                } else {
                    return Err(DkimError::UnsupportedAlgorithm);
                }
            }
            other => return Err(DkimError::UnsupportedPem(other.to_owned())),
        };
        let signing_key = DkimSigningKey::new(&key, algorithm).map_err(DkimError::Key)?;
        let config = DkimConfig::new(
            selector.clone(),
            domain.clone(),
            signing_key,
            // Each listed once more than it occurs (Herald writes each at most once): a copy
            // added above it — a second Subject a client would show — breaks the signature
            // (RFC 6376 §8.15). The extra name stands for no field, so it signs nothing more.
            SIGNED_HEADERS
                .iter()
                .chain(SIGNED_HEADERS)
                .map(|h| HeaderName::new_from_ascii_str(h))
                .collect(),
            DkimCanonicalization {
                header: DkimCanonicalizationType::Relaxed,
                body: DkimCanonicalizationType::Relaxed,
            },
        );
        Ok(Self {
            selector,
            domain,
            algorithm,
            config,
        })
    }

    /// Adds the `DKIM-Signature` header; call last, once every header is in place.
    pub fn sign(&self, message: &mut Message) {
        message.sign(&self.config);
    }

    /// `rsa` or `ed25519`.
    pub fn algorithm(&self) -> &'static str {
        match self.algorithm {
            DkimSigningAlgorithm::Rsa => "rsa",
            DkimSigningAlgorithm::Ed25519 => "ed25519",
        }
    }
}

/// A lower-cased DNS name of letters, digits, `-` and `_` labels, or `None`.
fn dns_name(raw: &str) -> Option<String> {
    let name = raw.trim().trim_end_matches('.').to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    ok.then_some(name)
}

/// The first PEM block: its label and its decoded content.
fn pem_block(text: &str) -> Option<(String, Vec<u8>)> {
    let start = text.find("-----BEGIN ")?;
    let rest = &text[start + "-----BEGIN ".len()..];
    let (label, rest) = rest.split_once("-----")?;
    let end = format!("-----END {label}-----");
    let (body, _) = rest.split_once(&end)?;
    let compact: String = body.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(compact)
        .ok()?;
    Some((label.to_owned(), der))
}

/// A PEM text block, 64 base64 characters a line.
fn pem_text(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ed25519 key in PKCS#8 (RFC 8410 §10.3's example).
    const ED25519_PEM: &str = "-----BEGIN PRIVATE KEY-----\n\
        MC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n\
        -----END PRIVATE KEY-----\n";

    #[test]
    fn keys_load_and_never_show() {
        let s = DkimSigner::from_pem("Herald", "Example.COM.", ED25519_PEM).unwrap();
        assert_eq!(s.algorithm(), "ed25519");
        let shown = format!("{s:?}");
        assert_eq!(
            shown,
            "DkimSigner(herald._domainkey.example.com, ed25519, key redacted)"
        );
        assert!(!shown.contains("MC4CAQAw"));
    }

    #[test]
    fn what_cannot_sign_is_refused() {
        let err = |sel: &str, dom: &str, pem: &str| {
            DkimSigner::from_pem(sel, dom, pem).unwrap_err().to_string()
        };
        assert_eq!(
            err("s", "example.com", "not a key"),
            DkimError::NotPem.to_string()
        );
        assert!(
            err("s", "example.com", &pem_text("EC PRIVATE KEY", b"x")).contains("EC PRIVATE KEY")
        );
        assert!(
            err("s", "example.com", &pem_text("ENCRYPTED PRIVATE KEY", b"x"))
                .contains("not supported")
        );
        assert_eq!(
            err("s", "example.com", &pem_text("PRIVATE KEY", b"garbage")),
            DkimError::Malformed.to_string()
        );
        assert!(
            err("s", "example.com", &pem_text("RSA PRIVATE KEY", b"garbage")).contains("not valid")
        );
        assert!(err("s p", "example.com", ED25519_PEM).starts_with("dkim_selector"));
        assert!(err("s", "exa mple.com", ED25519_PEM).starts_with("dkim_domain"));
        assert!(err("s", "", ED25519_PEM).starts_with("dkim_domain"));
    }

    #[test]
    fn signatures_name_selector_domain_and_algorithm() {
        let s = DkimSigner::from_pem("herald", "example.com", ED25519_PEM).unwrap();
        let mut m = Message::builder()
            .from("Ada <ada@example.com>".parse().unwrap())
            .to("bob@example.org".parse().unwrap())
            .subject("Hi")
            .body(String::from("Hello"))
            .unwrap();
        s.sign(&mut m);
        let text = String::from_utf8(m.formatted()).unwrap();
        let sig = text
            .split("\r\n")
            .skip_while(|l| !l.starts_with("DKIM-Signature:"))
            .take_while(|l| l.starts_with("DKIM-Signature:") || l.starts_with([' ', '\t']))
            .collect::<String>();
        for tag in [
            "v=1;",
            "a=ed25519-sha256;",
            "d=example.com;",
            "s=herald;",
            "c=relaxed/relaxed;",
            "bh=",
            "b=",
        ] {
            assert!(sig.contains(tag), "{tag} in {sig}");
        }
        assert!(
            sig.contains("h=from:reply-to:to:cc:subject:date:message-id"),
            "{sig}"
        );
    }
}
