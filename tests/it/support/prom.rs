//! A strict reader of the Prometheus text exposition format, enough to check what `/metrics`
//! says: every line is a comment (`# HELP`, `# TYPE`) or a sample `name{k="v",…} value`;
//! anything else fails the test.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// `name{k="v",…}` with the labels sorted: what identifies a series.
    pub fn key(&self) -> String {
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect();
        format!("{}{{{}}}", self.name, labels.join(","))
    }
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Every sample of `text`; panics on a line that is not valid exposition text.
pub fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let kind = parts.next().unwrap_or("");
            let name = parts.next().unwrap_or("");
            assert!(is_name(name), "bad metric name in {line:?}");
            match kind {
                "HELP" => {}
                "TYPE" => {
                    let t = parts.next().unwrap_or("");
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&t),
                        "bad type in {line:?}"
                    );
                    types.insert(name.to_owned(), t.to_owned());
                }
                _ => panic!("unknown comment {line:?}"),
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels in {line:?}"));
                (name, parse_labels(body, line))
            }
        };
        assert!(is_name(name), "bad sample name in {line:?}");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| types.contains_key(*f)))
            .unwrap_or(name);
        assert!(types.contains_key(family), "no # TYPE before {line:?}");
        out.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    out
}

fn parse_labels(body: &str, line: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (k, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("bad label in {line:?}"));
        assert!(is_name(k), "bad label name in {line:?}");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => panic!("bad escape in {line:?}"),
                },
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value in {line:?}"),
            }
        };
        assert!(
            labels.insert(k.to_owned(), value).is_none(),
            "label {k} twice in {line:?}"
        );
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    labels
}

/// The value of the one series `name` whose labels are exactly `labels`.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == name && s.labels == want)
        .collect();
    assert_eq!(found.len(), 1, "{name}{labels:?}: {found:?}");
    found[0].value
}

/// `GET {base}/metrics`, checked for its status and content type, parsed.
pub async fn scrape(http: &reqwest::Client, base: &str) -> (String, Vec<Sample>) {
    let r = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(r.status(), 200);
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    let text = r.text().await.unwrap();
    let samples = parse(&text);
    (text, samples)
}

/// The label names and values every Herald series may carry: finite sets, whatever the traffic.
/// `sources` are the configured source names.
pub fn assert_bounded_labels(samples: &[Sample], sources: &[&str]) {
    use herald::domain::{AttemptClass, Channel, State};
    let channels: Vec<&str> = Channel::ALL.iter().map(|c| c.as_str()).collect();
    let classes: Vec<&str> = AttemptClass::ALL.iter().map(|c| c.as_str()).collect();
    let states: Vec<&str> = State::ALL.iter().map(|s| s.as_str()).collect();
    let mut reasons = classes.clone();
    reasons.push("unconfirmed_deadline");
    reasons.extend_from_slice(herald::metrics::HELD_REASONS);
    let mut source_labels = sources.to_vec();
    source_labels.push(herald::metrics::UNKNOWN_SOURCE);
    let verdicts: Vec<&str> = herald::metrics::IngestVerdict::ALL
        .iter()
        .map(|v| v.as_str())
        .chain(
            herald::metrics::ReceiptVerdict::ALL
                .iter()
                .map(|v| v.as_str()),
        )
        .collect();
    for s in samples {
        assert!(s.name.starts_with("herald_"), "{}", s.key());
        for (k, v) in &s.labels {
            let allowed: &[&str] = match k.as_str() {
                "channel" => &channels,
                "class" => &classes,
                "state" | "next_state" => &states,
                "reason" => &reasons,
                "source" => &source_labels,
                "verdict" => &verdicts,
                "le" => {
                    assert!(v == "+Inf" || v.parse::<f64>().is_ok(), "{}", s.key());
                    continue;
                }
                other => panic!("unexpected label {other} on {}", s.key()),
            };
            assert!(allowed.contains(&v.as_str()), "{k}={v:?} on {}", s.key());
        }
    }
}
