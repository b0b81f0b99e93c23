//! `payload.attachments`: small files sent inline in the payload as base64.
//!
//! `[{"filename", "content_type", "content_base64"}]`, at most [`MAX_COUNT`] of them and at most
//! [`MAX_TOTAL_BYTES`] decoded in total (the payload as a whole stays within `max_payload_bytes`
//! too). The content type must parse as a MIME type and be a leaf type (`multipart/*` and
//! `message/*` are refused: their structure would be Herald's to build). The file name is
//! sanitized ([`sanitize_filename`]), never trusted: a path, control characters or quotes in it
//! could mislead the recipient's mail client.

use base64::Engine;
use lettre::message::header::ContentType;
use serde_json::Value;

use crate::domain::InvalidField;

/// Attachments per message at most.
pub const MAX_COUNT: usize = 10;
/// Decoded bytes of all attachments of a message together at most (1 MiB).
pub const MAX_TOTAL_BYTES: usize = 1024 * 1024;
/// Longest file name kept, in characters.
pub const MAX_FILENAME_CHARS: usize = 150;

/// One attachment, parsed: a safe file name, a checked content type, the decoded bytes.
#[derive(Debug, Clone)]
pub struct Attachment {
    pub filename: String,
    pub content_type: ContentType,
    pub content: Vec<u8>,
}

/// `payload.attachments`, absent or `null` → none.
pub fn parse(value: Option<&Value>) -> Result<Vec<Attachment>, InvalidField> {
    const FIELD: &str = "payload.attachments";
    let items = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(InvalidField::new(
                FIELD,
                "must be a list of {\"filename\", \"content_type\", \"content_base64\"} objects",
            ));
        }
    };
    if items.len() > MAX_COUNT {
        return Err(InvalidField::new(
            FIELD,
            format!(
                "has {} attachments; at most {MAX_COUNT} are accepted",
                items.len()
            ),
        ));
    }
    let mut total = 0usize;
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = |key: &str| format!("{FIELD}[{i}]{key}");
        let obj = item.as_object().ok_or_else(|| {
            InvalidField::new(
                at(""),
                "must be an object with filename, content_type and content_base64",
            )
        })?;
        if let Some(k) = obj
            .keys()
            .find(|k| !["filename", "content_type", "content_base64"].contains(&k.as_str()))
        {
            return Err(InvalidField::new(
                at(&format!(".{k}")),
                "is not a known field",
            ));
        }
        let string = |key: &str| match obj.get(key) {
            Some(Value::String(s)) => Ok(s.as_str()),
            None | Some(Value::Null) => {
                Err(InvalidField::new(at(&format!(".{key}")), "is required"))
            }
            Some(_) => Err(InvalidField::new(
                at(&format!(".{key}")),
                "must be a string",
            )),
        };
        let filename = sanitize_filename(string("filename")?).ok_or_else(|| {
            InvalidField::new(
                at(".filename"),
                "must name a file: nothing is left once paths, control characters and quotes \
                 are removed",
            )
        })?;
        let content_type = parse_content_type(string("content_type")?)
            .map_err(|m| InvalidField::new(at(".content_type"), m))?;
        let encoded = string("content_base64")?;
        // Base64 as mail and JSON tools write it: line breaks and spaces are allowed.
        let compact: String = encoded
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        let content = base64::engine::general_purpose::STANDARD
            .decode(compact.as_bytes())
            .map_err(|_| {
                InvalidField::new(
                    at(".content_base64"),
                    "must be standard base64 (RFC 4648, with padding)",
                )
            })?;
        total += content.len();
        if total > MAX_TOTAL_BYTES {
            return Err(InvalidField::new(
                FIELD,
                format!(
                    "the attachments are more than {MAX_TOTAL_BYTES} bytes decoded together \
                     (the limit is 1 MiB)"
                ),
            ));
        }
        out.push(Attachment {
            filename,
            content_type,
            content,
        });
    }
    Ok(out)
}

/// A MIME type (`type/subtype` with optional parameters) that can be an attachment's own.
fn parse_content_type(raw: &str) -> Result<ContentType, String> {
    if raw.contains(['\r', '\n']) {
        return Err("must be one line".into());
    }
    if !super::folds(raw) {
        return Err("has a run of more than 900 characters without a space".into());
    }
    let parsed: mime::Mime = raw
        .trim()
        .parse()
        .map_err(|_| format!("{raw:?} is not a MIME type such as application/pdf"))?;
    if parsed.type_().as_str().is_empty() || parsed.subtype().as_str().is_empty() {
        return Err(format!(
            "{raw:?} is not a MIME type such as application/pdf"
        ));
    }
    if parsed.type_() == mime::MULTIPART || parsed.type_() == mime::MESSAGE {
        return Err(format!(
            "{} is not accepted for an attachment; send it as application/octet-stream",
            parsed.essence_str()
        ));
    }
    ContentType::parse(parsed.as_ref()).map_err(|_| format!("{raw:?} is not a MIME type"))
}

/// The last path component of `raw`, with control characters, quotes and characters that file
/// systems refuse (`<>:"/\|?*`) replaced by `_`, without leading dots or spaces (no hidden files,
/// no `..`) nor trailing ones, at most [`MAX_FILENAME_CHARS`] characters (the extension kept).
/// `None` when nothing is left.
pub fn sanitize_filename(raw: &str) -> Option<String> {
    let base = raw.rsplit(['/', '\\']).next().unwrap_or("");
    let replaced: String = base
        .chars()
        .map(|c| {
            if c.is_control() || matches!(c, '<' | '>' | ':' | '"' | '|' | '?' | '*') {
                '_'
            } else {
                c
            }
        })
        .collect();
    let trimmed = replaced
        .trim_start_matches(|c: char| c == '.' || c.is_whitespace())
        .trim_end_matches(|c: char| c == '.' || c.is_whitespace());
    if trimmed.is_empty() || trimmed.chars().all(|c| c == '_') {
        return None;
    }
    let count = trimmed.chars().count();
    if count <= MAX_FILENAME_CHARS {
        return Some(trimmed.to_owned());
    }
    // Keep a short extension (`.pdf`) and cut the stem.
    let ext: String = match trimmed.rsplit_once('.') {
        Some((_, ext)) if !ext.is_empty() && ext.chars().count() <= 10 => format!(".{ext}"),
        _ => String::new(),
    };
    let stem: String = trimmed
        .chars()
        .take(MAX_FILENAME_CHARS - ext.chars().count())
        .collect();
    Some(format!("{}{ext}", stem.trim_end()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(v: Value) -> String {
        parse(Some(&v)).unwrap_err().field
    }

    #[test]
    fn attachments_parse_and_decode() {
        let a = parse(Some(&json!([
            {"filename": "invoice.pdf", "content_type": "application/pdf", "content_base64": "JVBERi0x"},
            {"filename": "a.csv", "content_type": "text/csv; charset=utf-8", "content_base64": "YSxi\nLGM="},
            {"filename": "empty.bin", "content_type": "application/octet-stream", "content_base64": ""},
        ])))
        .unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(a[0].content, b"%PDF-1");
        assert_eq!(a[1].content, b"a,b,c");
        assert!(a[2].content.is_empty());
        assert_eq!(parse(None).unwrap().len(), 0);
        assert_eq!(parse(Some(&Value::Null)).unwrap().len(), 0);
    }

    #[test]
    fn every_invalid_field_is_named() {
        let ok =
            json!({"filename": "a.txt", "content_type": "text/plain", "content_base64": "YQ=="});
        let with = |k: &str, v: Value| {
            let mut a = ok.clone();
            a[k] = v;
            json!([ok.clone(), a])
        };
        assert_eq!(field(json!({"filename": "x"})), "payload.attachments");
        assert_eq!(field(json!(["x"])), "payload.attachments[0]");
        assert_eq!(
            field(
                json!([{"filename": "a", "content_type": "text/plain", "content_base64": "", "inline": true}])
            ),
            "payload.attachments[0].inline"
        );
        assert_eq!(
            field(with("content_base64", json!("not base64!"))),
            "payload.attachments[1].content_base64"
        );
        assert_eq!(
            field(with("content_base64", json!("YQ"))),
            "payload.attachments[1].content_base64",
            "padding is required"
        );
        assert_eq!(
            field(with("content_base64", json!(12))),
            "payload.attachments[1].content_base64"
        );
        for bad in [
            "pdf",
            "text/",
            "multipart/mixed",
            "message/rfc822",
            "text/plain\r\nX: y",
        ] {
            assert_eq!(
                field(with("content_type", json!(bad))),
                "payload.attachments[1].content_type",
                "{bad}"
            );
        }
        for bad in ["", "../..", "dir/", " .. ", "\u{0}\u{7}", "???"] {
            assert_eq!(
                field(with("filename", json!(bad))),
                "payload.attachments[1].filename",
                "{bad:?}"
            );
        }
        let mut a = ok.clone();
        a.as_object_mut().unwrap().remove("filename");
        assert_eq!(field(json!([a])), "payload.attachments[0].filename");
        assert_eq!(
            field(json!(vec![ok.clone(); MAX_COUNT + 1])),
            "payload.attachments"
        );
    }

    #[test]
    fn the_total_is_limited_to_one_mebibyte_decoded() {
        let b64 = |n: usize| base64::engine::general_purpose::STANDARD.encode(vec![7u8; n]);
        let one = |n: usize| json!({"filename": "x.bin", "content_type": "application/octet-stream", "content_base64": b64(n)});
        assert!(parse(Some(&json!([one(MAX_TOTAL_BYTES - 10), one(10)]))).is_ok());
        let err = parse(Some(&json!([one(MAX_TOTAL_BYTES - 10), one(11)]))).unwrap_err();
        assert_eq!(err.field, "payload.attachments");
        assert!(err.message.contains("1 MiB"), "{}", err.message);
    }

    #[test]
    fn filenames_are_sanitized() {
        let s = |raw: &str| sanitize_filename(raw);
        assert_eq!(s("report.pdf").as_deref(), Some("report.pdf"));
        assert_eq!(s("../../etc/passwd").as_deref(), Some("passwd"));
        assert_eq!(s("C:\\Users\\ada\\a.txt").as_deref(), Some("a.txt"));
        assert_eq!(s(".bashrc").as_deref(), Some("bashrc"));
        assert_eq!(s("a\r\nb\"c\".txt").as_deref(), Some("a__b_c_.txt"));
        assert_eq!(
            s("  résumé final.pdf. ").as_deref(),
            Some("résumé final.pdf")
        );
        assert_eq!(s("what?.txt").as_deref(), Some("what_.txt"));
        let long = format!("{}.pdf", "x".repeat(300));
        let cut = s(&long).unwrap();
        assert_eq!(cut.chars().count(), MAX_FILENAME_CHARS);
        assert!(cut.ends_with(".pdf"));
        for empty in ["", "/", "..", "\u{1}", "**"] {
            assert_eq!(s(empty), None, "{empty:?}");
        }
    }
}
