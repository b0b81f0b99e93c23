//! `payload.list_unsubscribe` and `payload.list_unsubscribe_post`: the `List-Unsubscribe`
//! header (RFC 2369) and its one-click companion `List-Unsubscribe-Post: List-Unsubscribe=One-Click`
//! (RFC 8058).
//!
//! `list_unsubscribe` is the header's value: one or more `<URI>` separated by commas, each an
//! `https:`, `http:` or `mailto:` URI (`"<https://example.com/u/42>, <mailto:u@example.com>"`).
//! `list_unsubscribe_post: true` needs an `https:` URI among them (RFC 8058 §3.1); the receiver
//! POSTs `List-Unsubscribe=One-Click` to it. With DKIM on, both headers are signed, as RFC 8058
//! asks.

use serde_json::Value;

use crate::domain::InvalidField;

/// The value RFC 8058 defines for `List-Unsubscribe-Post`.
pub const ONE_CLICK: &str = "List-Unsubscribe=One-Click";
/// Longest URI accepted (a header line must stay below 998 characters).
pub const MAX_URI_CHARS: usize = 900;
/// URIs per header at most.
pub const MAX_URIS: usize = 4;

/// The two headers' values, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListUnsubscribe {
    /// The URIs, without angle brackets, in the order given.
    pub uris: Vec<String>,
    pub one_click: bool,
}

impl ListUnsubscribe {
    /// The `List-Unsubscribe` value: `<a>, <b>`.
    pub fn header_value(&self) -> String {
        self.uris
            .iter()
            .map(|u| format!("<{u}>"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Both fields of the payload; `None` when neither is given.
pub fn parse(
    list_unsubscribe: Option<&Value>,
    post: Option<&Value>,
) -> Result<Option<ListUnsubscribe>, InvalidField> {
    const FIELD: &str = "payload.list_unsubscribe";
    const POST: &str = "payload.list_unsubscribe_post";
    let one_click = match post {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => return Err(InvalidField::new(POST, "must be true or false")),
    };
    let raw = match list_unsubscribe {
        None | Some(Value::Null) => {
            if one_click {
                return Err(InvalidField::new(
                    POST,
                    "needs list_unsubscribe with an https: URI to POST to",
                ));
            }
            return Ok(None);
        }
        Some(Value::String(s)) => s,
        Some(_) => {
            return Err(InvalidField::new(
                FIELD,
                "must be a string such as \"<https://example.com/unsubscribe/42>, <mailto:unsubscribe@example.com>\"",
            ));
        }
    };
    let uris = split(raw).map_err(|m| InvalidField::new(FIELD, m))?;
    if one_click && !uris.iter().any(|u| u.starts_with("https:")) {
        return Err(InvalidField::new(
            POST,
            "one-click unsubscribe (RFC 8058) needs an https: URI in list_unsubscribe",
        ));
    }
    Ok(Some(ListUnsubscribe { uris, one_click }))
}

/// `<uri>, <uri>` → the URIs, each checked.
fn split(raw: &str) -> Result<Vec<String>, String> {
    if raw.contains(['\r', '\n']) {
        return Err("must be one line".into());
    }
    let mut uris = Vec::new();
    let mut rest = raw.trim();
    if rest.is_empty() {
        return Err("must hold at least one <URI>".into());
    }
    while !rest.is_empty() {
        let inner = rest
            .strip_prefix('<')
            .and_then(|r| r.split_once('>'))
            .ok_or("must be <URI> entries separated by commas, e.g. <https://example.com/u/42>")?;
        let (uri, after) = inner;
        uris.push(check_uri(uri.trim())?);
        rest = after.trim_start();
        if let Some(next) = rest.strip_prefix(',') {
            rest = next.trim_start();
            if rest.is_empty() {
                return Err("ends with a comma".into());
            }
        } else if !rest.is_empty() {
            return Err("entries must be separated by commas".into());
        }
    }
    if uris.len() > MAX_URIS {
        return Err(format!("has {} URIs; at most {MAX_URIS}", uris.len()));
    }
    Ok(uris)
}

fn check_uri(uri: &str) -> Result<String, String> {
    if uri.chars().count() > MAX_URI_CHARS {
        return Err(format!("a URI is longer than {MAX_URI_CHARS} characters"));
    }
    let parsed = url::Url::parse(uri).map_err(|_| format!("{uri:?} is not a URI"))?;
    match parsed.scheme() {
        "https" | "http" if parsed.host().is_some() => {}
        "mailto" if parsed.path().contains('@') => {}
        "https" | "http" | "mailto" => return Err(format!("{uri:?} is not a complete URI")),
        other => {
            return Err(format!(
                "{other}: URIs are not accepted; use https:, http: or mailto:"
            ));
        }
    }
    // As the URL parser writes it: ASCII only (percent-encoded, punycode), no spaces.
    Ok(parsed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(l: Value, p: Value) -> Option<ListUnsubscribe> {
        parse(Some(&l), Some(&p)).unwrap()
    }

    fn err(l: Option<Value>, p: Option<Value>) -> String {
        parse(l.as_ref(), p.as_ref()).unwrap_err().field
    }

    #[test]
    fn the_header_values_are_parsed_and_rewritten() {
        let l = ok(
            json!("<https://example.com/u/42?list=a,b>,<mailto:u@example.com?subject=unsubscribe>"),
            json!(true),
        )
        .unwrap();
        assert_eq!(
            l.header_value(),
            "<https://example.com/u/42?list=a,b>, <mailto:u@example.com?subject=unsubscribe>"
        );
        assert!(l.one_click);
        let l = ok(json!(" <mailto:u@example.com> "), json!(false)).unwrap();
        assert_eq!(l.header_value(), "<mailto:u@example.com>");
        assert!(!l.one_click);
        assert_eq!(parse(None, None).unwrap(), None);
        let l = ok(json!("<https://bücher.example/u 1>"), Value::Null).unwrap();
        assert_eq!(l.uris, ["https://xn--bcher-kva.example/u%201"]);
    }

    #[test]
    fn invalid_values_name_their_field() {
        let field = "payload.list_unsubscribe";
        let post = "payload.list_unsubscribe_post";
        for bad in [
            "https://example.com/u",
            "<https://example.com/u",
            "<>",
            "<ftp://example.com/u>",
            "<javascript:alert(1)>",
            "<https://example.com/a> <https://example.com/b>",
            "<https://example.com/a>,",
            "<mailto:nobody>",
            "",
            "<https://example.com/a>\r\nBcc: x@y.example",
        ] {
            assert_eq!(err(Some(json!(bad)), None), field, "{bad:?}");
        }
        assert_eq!(err(Some(json!(["<https://e.example/u>"])), None), field);
        let five = ["<https://e.example/u>"; 5].join(", ");
        assert_eq!(err(Some(json!(five)), None), field);
        let long = format!("<https://e.example/{}>", "a".repeat(MAX_URI_CHARS));
        assert_eq!(err(Some(json!(long)), None), field);
        // One-click needs an https URI to POST to.
        assert_eq!(err(None, Some(json!(true))), post);
        assert_eq!(
            err(Some(json!("<mailto:u@example.com>")), Some(json!(true))),
            post
        );
        assert_eq!(
            err(Some(json!("<http://example.com/u>")), Some(json!(true))),
            post
        );
        assert_eq!(
            err(Some(json!("<https://example.com/u>")), Some(json!("yes"))),
            post
        );
    }
}
