//! Shared by the parameter-signing schemes (vonage, plivo, messagebird): the URL as the provider
//! called it, and a request's parameters — from the query (GET) or the body (POST: a form, or a
//! JSON object) — exactly as they arrived, decoded but never re-ordered or re-encoded.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::ingest::RawRequest;

/// The URL as received: the configured public URL up to its `?`, then the request's own query
/// string verbatim (never re-encoded) when it has one. The public URL's own query, if any, is
/// not used: what the provider called is what arrived.
pub fn received_url(public_url: &str, query: Option<&str>) -> String {
    let base = public_url.split_once('?').map_or(public_url, |(b, _)| b);
    match query.filter(|q| !q.is_empty()) {
        Some(q) => format!("{base}?{q}"),
        None => base.to_owned(),
    }
}

/// `application/x-www-form-urlencoded` pairs (`+` is a space), in arrival order.
pub fn form_pairs(bytes: &[u8]) -> Vec<(String, String)> {
    url::form_urlencoded::parse(bytes)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Whether the request says its body is JSON.
fn is_json(r: &RawRequest<'_>) -> bool {
    r.header("content-type")
        .is_some_and(|c| c.to_ascii_lowercase().contains("json"))
}

/// The request's parameters: the query's for a GET; for any other method the body's — a JSON
/// object's top-level scalars when the body is JSON, else the form fields. `None` when a JSON
/// body is not an object.
pub fn request_params(r: &RawRequest<'_>) -> Option<Vec<(String, String)>> {
    if r.method.eq_ignore_ascii_case("GET") {
        return Some(form_pairs(r.query.unwrap_or("").as_bytes()));
    }
    if is_json(r) {
        let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(r.body) else {
            return None;
        };
        return Some(
            m.into_iter()
                .filter_map(|(k, v)| match v {
                    Value::String(s) => Some((k, s)),
                    Value::Number(n) => Some((k, n.to_string())),
                    Value::Bool(b) => Some((k, b.to_string())),
                    _ => None,
                })
                .collect(),
        );
    }
    Some(form_pairs(r.body))
}

/// The first value of each name, names sorted (byte order).
pub fn first_values(pairs: &[(String, String)]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in pairs {
        out.entry(k.clone()).or_insert_with(|| v.clone());
    }
    out
}

/// Every value of each name, names sorted (byte order), values in arrival order.
pub fn all_values(pairs: &[(String, String)]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in pairs {
        out.entry(k.clone()).or_default().push(v.clone());
    }
    out
}

/// Parameters as the stored event: a name sent once keeps its string.
pub fn as_object(params: &BTreeMap<String, String>) -> Value {
    Value::Object(
        params
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect::<Map<_, _>>(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_received_url_is_the_public_base_and_the_query_as_sent() {
        assert_eq!(
            received_url("https://h.example/in", Some("b=2&a=%5B")),
            "https://h.example/in?b=2&a=%5B"
        );
        assert_eq!(
            received_url("https://h.example/in?x=1", Some("a=1")),
            "https://h.example/in?a=1"
        );
        assert_eq!(
            received_url("https://h.example/", Some("")),
            "https://h.example/"
        );
        assert_eq!(
            received_url("https://h.example/", None),
            "https://h.example/"
        );
    }

    #[test]
    fn parameters_come_from_the_query_or_the_body() {
        let h = vec![("content-type".to_owned(), "application/json".to_owned())];
        let get = RawRequest {
            headers: &[],
            body: b"ignored=1",
            query: Some("a=1+2&b=%26"),
            method: "GET",
        };
        assert_eq!(
            request_params(&get).unwrap(),
            [("a".into(), "1 2".into()), ("b".into(), "&".into())]
        );
        let form = RawRequest {
            query: Some("q=1"),
            body: b"x=y&x=z",
            method: "POST",
            ..get
        };
        assert_eq!(
            first_values(&request_params(&form).unwrap())["x"],
            "y",
            "the first of a repeated name"
        );
        let json = RawRequest {
            headers: &h,
            body: br#"{"n": 5, "s": "t", "o": {"x": 1}}"#,
            ..form
        };
        assert_eq!(
            first_values(&request_params(&json).unwrap()),
            BTreeMap::from([("n".into(), "5".into()), ("s".into(), "t".into())])
        );
        let array = RawRequest {
            body: b"[1]",
            ..json
        };
        assert_eq!(request_params(&array), None);
    }
}
