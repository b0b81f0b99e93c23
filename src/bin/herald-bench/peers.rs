//! The local peers: an HTTP/1.1 receiver and an SMTP server on 127.0.0.1:0, both lean (they
//! count, remember each request's event id and arrival time, and answer at once) so that they
//! are not what is measured; and a link with latency to put in front of one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Seen {
    /// Event id (the `webhook-id` header, or the email's `X-Herald-Event-Id`) → first arrival.
    first: HashMap<String, Instant>,
    duplicates: usize,
}

/// What a peer has received.
#[derive(Clone, Default)]
pub struct Tally {
    count: Arc<AtomicUsize>,
    seen: Arc<Mutex<Seen>>,
}

impl Tally {
    fn record(&self, id: Option<String>) {
        if let Some(id) = id {
            let mut s = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            match s.first.entry(id) {
                std::collections::hash_map::Entry::Occupied(_) => s.duplicates += 1,
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(Instant::now());
                }
            }
        }
        self.count.fetch_add(1, Ordering::Release);
    }

    pub fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    pub fn duplicates(&self) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .duplicates
    }

    pub fn first_arrival(&self, id: &str) -> Option<Instant> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first
            .get(id)
            .copied()
    }

    /// Waits until `n` requests have arrived; false after `limit`.
    pub async fn wait_for(&self, n: usize, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.count() < n {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }
}

pub struct HttpReceiver {
    pub url: String,
    pub tally: Tally,
}

impl HttpReceiver {
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        let tally = Tally::default();
        let t = tally.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                tokio::spawn(serve_http(sock, t.clone()));
            }
        });
        Ok(HttpReceiver { url, tally })
    }
}

async fn serve_http(sock: TcpStream, tally: Tally) {
    let (r, mut w) = sock.into_split();
    let mut r = BufReader::new(r);
    let mut line = String::new();
    loop {
        // Request line.
        line.clear();
        match r.read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut length = 0usize;
        let mut id = None;
        loop {
            line.clear();
            match r.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((name, value)) = l.split_once(':') {
                let value = value.trim();
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("webhook-id") {
                    id = Some(value.to_owned());
                }
            }
        }
        let mut body = vec![0u8; length];
        if r.read_exact(&mut body).await.is_err() {
            return;
        }
        tally.record(id);
        if w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
    }
}

pub struct SmtpServer {
    pub url: String,
    pub tally: Tally,
}

impl SmtpServer {
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("smtp://{}", listener.local_addr()?);
        let tally = Tally::default();
        let t = tally.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                tokio::spawn(serve_smtp(sock, t.clone()));
            }
        });
        Ok(SmtpServer { url, tally })
    }

    pub fn addr(&self) -> String {
        self.url.trim_start_matches("smtp://").to_owned()
    }

    /// The address a client dials: the server's own, or with `one_way` that of a
    /// [`DelayedLink`] to it (it runs for as long as the runtime does).
    pub async fn reached_over(&self, one_way: Option<Duration>) -> Result<String> {
        Ok(match one_way {
            Some(d) => DelayedLink::start(self.addr(), d).await?.addr,
            None => self.addr(),
        })
    }
}

async fn serve_smtp(sock: TcpStream, tally: Tally) {
    let (r, w) = sock.into_split();
    let mut r = BufReader::new(r);
    let mut w = tokio::io::BufWriter::new(w);
    if w.write_all(b"220 bench.localhost ESMTP\r\n").await.is_err() {
        return;
    }
    let mut line = String::new();
    let (mut chunk, mut chunk_id) = (Vec::new(), None);
    loop {
        line.clear();
        match read_line_after_replies(&mut r, &mut w, &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let verb = line.get(..4).unwrap_or("").to_ascii_uppercase();
        let reply: &[u8] = match verb.as_str() {
            "EHLO" => b"250-bench.localhost\r\n250-PIPELINING\r\n250-CHUNKING\r\n250 8BITMIME\r\n",
            "HELO" | "MAIL" | "RCPT" | "RSET" | "NOOP" => b"250 OK\r\n",
            "QUIT" => {
                let _ = w.write_all(b"221 bye\r\n").await;
                let _ = w.flush().await;
                return;
            }
            "DATA" => {
                if w.write_all(b"354 go on\r\n").await.is_err() {
                    return;
                }
                let mut id = None;
                loop {
                    line.clear();
                    match read_line_after_replies(&mut r, &mut w, &mut line).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                    if line == ".\r\n" || line == ".\n" {
                        break;
                    }
                    if id.is_none() {
                        id = id_header(line.trim_end());
                    }
                }
                tally.record(id);
                b"250 queued\r\n"
            }
            // RFC 3030: `BDAT <size> [LAST]`, then exactly <size> bytes of the message, no
            // dot-stuffing. The message's id is looked for in the chunk that holds its headers.
            "BDAT" => {
                let mut words = line.split_whitespace().skip(1);
                let size = words.next().and_then(|n| n.parse::<usize>().ok());
                let last = words.next().is_some_and(|w| w.eq_ignore_ascii_case("LAST"));
                let Some(size) = size else {
                    return;
                };
                chunk.resize(size, 0);
                if r.read_exact(&mut chunk).await.is_err() {
                    return;
                }
                if chunk_id.is_none() {
                    chunk_id = message_id(&chunk);
                }
                if last {
                    tally.record(chunk_id.take());
                    b"250 queued\r\n"
                } else {
                    b"250 chunk\r\n"
                }
            }
            _ => b"502 unknown\r\n",
        };
        if w.write_all(reply).await.is_err() {
            return;
        }
    }
}

/// The value of a line that is an `X-Herald-Event-Id` or `Message-ID` header: what the server
/// counts a message by.
fn id_header(line: &str) -> Option<String> {
    let (n, v) = line.split_once(':')?;
    (n.eq_ignore_ascii_case("x-herald-event-id") || n.eq_ignore_ascii_case("message-id"))
        .then(|| v.trim().to_owned())
}

/// The first such header in a message's head (a BDAT chunk), as DATA's loop finds it line by
/// line.
fn message_id(message: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(message);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    head.lines().find_map(id_header)
}

/// Reads a line into `line`, first sending the replies written so far when no more input is
/// buffered: the replies to a pipelined group that arrived together go out as one unit (RFC 2920
/// §3.2; Postfix flushes when it reads for more input), and a lone command's reply at once.
/// 0 at the end of the stream.
async fn read_line_after_replies(
    r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    w: &mut tokio::io::BufWriter<tokio::net::tcp::OwnedWriteHalf>,
    line: &mut String,
) -> std::io::Result<usize> {
    if r.buffer().is_empty() {
        w.flush().await?;
    }
    r.read_line(line).await
}

/// A TCP relay on 127.0.0.1:0 in front of `upstream` that holds every chunk for `one_way` in
/// each direction, in order: a round trip through it takes `2 × one_way` longer, as over a link
/// with that latency (a relay in another data centre), while staying on loopback.
pub struct DelayedLink {
    pub addr: String,
}

impl DelayedLink {
    pub async fn start(upstream: String, one_way: Duration) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(up) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ = (down.set_nodelay(true), up.set_nodelay(true));
                    let ((dr, dw), (ur, uw)) = (down.into_split(), up.into_split());
                    tokio::join!(delayed(dr, uw, one_way), delayed(ur, dw, one_way));
                });
            }
        });
        Ok(DelayedLink { addr })
    }
}

/// Copies `from` to `to`, each chunk written `one_way` after it was read; the end of `from`
/// reaches `to` after the chunks before it.
async fn delayed(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, one_way: Duration) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let due = tokio::time::Instant::now() + one_way;
            if tx.send((due, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    let write = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}
