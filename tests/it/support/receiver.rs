//! A scripted HTTP/1.1 receiver on 127.0.0.1:0. Each request takes the next scripted reply
//! (then the default, 200). Every request is recorded with its headers and raw body.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// How the receiver answers one request.
#[derive(Debug, Clone)]
pub enum Reply {
    Status(u16),
    /// Status, extra headers, body.
    Full(u16, Vec<(String, String)>, String),
    /// Read the request, then never answer (until the client gives up).
    Hang,
    /// Read the request, then close the connection without a word.
    Drop,
    /// Answer with this status after this many milliseconds.
    Delayed(u64, u16),
    /// Answer with this status once the test calls `notify_one` on the handle (before or after
    /// the request arrives).
    Held(std::sync::Arc<tokio::sync::Notify>, u16),
    /// Answer with this status and the request's headers and URL as a JSON body, as
    /// httpbin's `/anything` does (a receiver echoing what it got into its error).
    Echo(u16),
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// Names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When it arrived (its headers and body read).
    pub at: std::time::Instant,
    /// When its answer started to be written (`None`: not answered, or not yet).
    pub answered_at: Option<std::time::Instant>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == &name.to_ascii_lowercase())
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    script: VecDeque<Reply>,
    by_path: std::collections::HashMap<String, VecDeque<Reply>>,
    requests: Vec<Recorded>,
}

#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    state: Arc<Mutex<State>>,
    arrived: Arc<Notify>,
}

impl Receiver {
    /// Its URL as Herald shows it masked: scheme, host and port (`http://127.0.0.1:PORT/…`).
    pub fn masked(&self) -> String {
        let u = url::Url::parse(&self.url).unwrap();
        format!(
            "{}://{}:{}/…",
            u.scheme(),
            u.host_str().unwrap(),
            u.port().unwrap()
        )
    }

    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind receiver");
        Self::start_on(listener)
    }

    /// A receiver on `listener` (one that comes up where connections were refused until now).
    pub fn start_on(listener: TcpListener) -> Self {
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(State::default()));
        let arrived = Arc::new(Notify::new());
        let (s, a) = (state.clone(), arrived.clone());
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                tokio::spawn(serve(sock, s.clone(), a.clone()));
            }
        });
        Receiver {
            url,
            state,
            arrived,
        }
    }

    /// Queues replies for the next requests, in order.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.state.lock().unwrap().script.extend(replies);
    }

    /// Queues replies for requests to `path` only (e.g. `/case-1`).
    pub fn script_path(&self, path: &str, replies: impl IntoIterator<Item = Reply>) {
        self.state
            .lock()
            .unwrap()
            .by_path
            .entry(path.to_owned())
            .or_default()
            .extend(replies);
    }

    /// The receiver's URL for `path`.
    pub fn url_for(&self, path: &str) -> String {
        self.url.replace("/hook", path)
    }

    pub fn requests_to(&self, path: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.path == path)
            .collect()
    }

    /// The `webhook-id` of every request received, in arrival order.
    pub fn event_ids(&self) -> Vec<String> {
        self.requests()
            .iter()
            .map(|r| r.header("webhook-id").unwrap_or_default().to_owned())
            .collect()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Waits until at least `n` requests have arrived (or panics after `secs`).
    pub async fn wait_for(&self, n: usize, secs: u64) -> Vec<Recorded> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let notified = self.arrived.notified();
            let got = self.requests();
            if got.len() >= n {
                return got;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("expected {n} requests, got {}", self.requests().len());
            }
        }
    }
}

async fn serve(sock: TcpStream, state: Arc<Mutex<State>>, arrived: Arc<Notify>) {
    let mut reader = BufReader::new(sock);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_owned();
        let path = parts.next().unwrap_or("").to_owned();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).await.unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((n, v)) = h.split_once(':') {
                headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
        }
        let len: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        let (reply, index) = {
            let mut st = state.lock().unwrap();
            let index = st.requests.len();
            let by_path = st.by_path.get_mut(&path).and_then(VecDeque::pop_front);
            st.requests.push(Recorded {
                method,
                path,
                headers,
                body,
                at: std::time::Instant::now(),
                answered_at: None,
            });
            let reply = by_path
                .or_else(|| st.script.pop_front())
                .unwrap_or(Reply::Status(200));
            (reply, index)
        };
        arrived.notify_waiters();
        let (status, extra, text) = match reply {
            Reply::Status(s) => (s, Vec::new(), String::new()),
            Reply::Echo(s) => {
                let st = state.lock().unwrap();
                let got = &st.requests[index];
                let headers: serde_json::Map<String, serde_json::Value> = got
                    .headers
                    .iter()
                    .map(|(n, v)| (n.clone(), v.clone().into()))
                    .collect();
                let echo = serde_json::json!({"url": got.path, "headers": headers});
                // Indented, and with `/` escaped as PHP's json_encode writes it.
                let text = serde_json::to_string_pretty(&echo).unwrap_or_default();
                (s, Vec::new(), text.replace('/', "\\/"))
            }
            Reply::Full(s, h, b) => (s, h, b),
            Reply::Hang => {
                // Answer nothing; return when the client closes the connection.
                let mut sink = [0u8; 64];
                while reader.read(&mut sink).await.map(|n| n > 0).unwrap_or(false) {}
                return;
            }
            Reply::Drop => return,
            Reply::Delayed(ms, s) => {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                (s, Vec::new(), String::new())
            }
            Reply::Held(release, s) => {
                release.notified().await;
                (s, Vec::new(), String::new())
            }
        };
        // Before the first byte of the answer: the sender cannot have seen it earlier.
        state.lock().unwrap().requests[index].answered_at = Some(std::time::Instant::now());
        let mut out = format!(
            "HTTP/1.1 {status} Scripted\r\ncontent-length: {}\r\n",
            text.len()
        );
        for (n, v) in extra {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.push_str(&text);
        if reader.get_mut().write_all(out.as_bytes()).await.is_err() {
            return;
        }
    }
}
