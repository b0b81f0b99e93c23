//! A small SMTP server on 127.0.0.1:0. It answers by recipient: `t451@…` gets 451 after DATA,
//! `t550@…` 550, `stall@…` no answer after DATA, `drop@…` a closed connection after DATA,
//! `bye@…` 250 and then a closed connection (a server ending an idle session), `slow@…` 250
//! after [`SLOW_REPLY`] (a busy server), `mute@…` 250 and then silence: the session stays open
//! but never answers again (not even NOOP); `t421@…` gets 421 at RCPT TO while the session stays
//! open (a server that should close the channel but does not);
//! a `MAIL FROM` of `drop-at-mail@…` closes the connection before the envelope; everyone else
//! gets 250. Accepted messages are kept, and [`SmtpSink::wait_for_mail`] waits for them.
//! [`SmtpSink::start_silent`] accepts TCP connections but never sends a greeting;
//! [`SmtpSink::start_scripted`] greets with another code or refuses AUTH ([`Script`]).
//! The sink counts sessions open at once ([`SmtpSink::max_sessions`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// One message as received.
#[derive(Debug, Clone)]
pub struct Mail {
    pub rcpt: String,
    pub data: String,
}

/// How long a `slow@…` recipient waits for its 250.
pub const SLOW_REPLY: Duration = Duration::from_millis(100);

/// What a scripted sink does differently from [`SmtpSink::start`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Script {
    /// The greeting line instead of `220 sink ESMTP`, e.g. `421 4.3.2 busy`. After a greeting
    /// other than 220 the sink answers 503 to everything but QUIT (RFC 5321 §3.1).
    pub greeting: Option<&'static str>,
    /// Advertise `AUTH PLAIN LOGIN` and answer every AUTH command with this line.
    pub auth_reply: Option<&'static str>,
}

#[derive(Clone)]
pub struct SmtpSink {
    pub url: String,
    accepted: Arc<Mutex<Vec<Mail>>>,
    /// The number of accepted messages, for waiting on arrivals.
    count: watch::Receiver<usize>,
    counters: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    connections: AtomicUsize,
    open: AtomicUsize,
    max_open: AtomicUsize,
    auth_commands: AtomicUsize,
}

/// Counts a session as open from its accept until its task ends.
struct OpenSession(Arc<Counters>);

impl OpenSession {
    fn new(c: Arc<Counters>) -> Self {
        c.connections.fetch_add(1, Ordering::SeqCst);
        let open = c.open.fetch_add(1, Ordering::SeqCst) + 1;
        c.max_open.fetch_max(open, Ordering::SeqCst);
        OpenSession(c)
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SmtpSink {
    pub async fn start() -> Self {
        Self::start_mode(false, Script::default()).await
    }

    /// A server that accepts connections and reads what comes, but never greets.
    pub async fn start_silent() -> Self {
        Self::start_mode(true, Script::default()).await
    }

    /// A server that greets or authenticates as `script` says.
    pub async fn start_scripted(script: Script) -> Self {
        Self::start_mode(false, script).await
    }

    async fn start_mode(silent: bool, script: Script) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind smtp");
        let url = format!("smtp://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let (count_tx, count) = watch::channel(0usize);
        let count_tx = Arc::new(count_tx);
        let a = accepted.clone();
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let open = OpenSession::new(c.clone());
                if silent {
                    tokio::spawn(async move {
                        silent_session(sock).await;
                        drop(open);
                    });
                } else {
                    let (a, count_tx) = (a.clone(), count_tx.clone());
                    tokio::spawn(async move {
                        session(sock, a, count_tx, script, &open.0).await;
                        drop(open);
                    });
                }
            }
        });
        SmtpSink {
            url,
            accepted,
            count,
            counters,
        }
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.counters.connections.load(Ordering::SeqCst)
    }

    /// The most sessions that were open at the same time.
    pub fn max_sessions(&self) -> usize {
        self.counters.max_open.load(Ordering::SeqCst)
    }

    /// AUTH commands received so far.
    pub fn auth_commands(&self) -> usize {
        self.counters.auth_commands.load(Ordering::SeqCst)
    }

    pub fn accepted(&self) -> Vec<Mail> {
        self.accepted.lock().unwrap().clone()
    }

    /// Waits until at least `n` messages were accepted; panics after `within`.
    pub async fn wait_for_mail(&self, n: usize, within: Duration) -> Vec<Mail> {
        let mut count = self.count.clone();
        tokio::time::timeout(within, count.wait_for(|c| *c >= n))
            .await
            .unwrap_or_else(|_| panic!("{n} message(s) did not arrive within {within:?}"))
            .expect("the sink is running");
        self.accepted()
    }
}

/// `smtp://127.0.0.1:PORT` with nothing listening on PORT (connection refused).
pub fn refused_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("smtp://{addr}")
}

async fn silent_session(mut sock: TcpStream) {
    let mut buf = [0u8; 1024];
    while sock.read(&mut buf).await.unwrap_or(0) > 0 {}
}

/// Reads and drops everything until the client hangs up.
async fn ignore_the_rest(r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) {
    let mut l = String::new();
    while r.read_line(&mut l).await.unwrap_or(0) > 0 {
        l.clear();
    }
}

async fn session(
    sock: TcpStream,
    accepted: Arc<Mutex<Vec<Mail>>>,
    count: Arc<watch::Sender<usize>>,
    script: Script,
    counters: &Counters,
) {
    let (r, mut w) = sock.into_split();
    let mut r = BufReader::new(r);
    let greeting = script.greeting.unwrap_or("220 sink ESMTP");
    if w.write_all(format!("{greeting}\r\n").as_bytes())
        .await
        .is_err()
    {
        return;
    }
    let refused = !greeting.starts_with("220");
    let mut rcpt = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let upper = line.to_ascii_uppercase();
        let reply: &[u8] = if refused && !upper.starts_with("QUIT") {
            b"503 5.5.1 no service here\r\n"
        } else if upper.starts_with("EHLO") || upper.starts_with("HELO") {
            if script.auth_reply.is_some() {
                b"250-sink\r\n250-AUTH PLAIN LOGIN\r\n250 8BITMIME\r\n"
            } else {
                b"250-sink\r\n250 8BITMIME\r\n"
            }
        } else if upper.starts_with("AUTH") {
            counters.auth_commands.fetch_add(1, Ordering::SeqCst);
            let reply = script.auth_reply.unwrap_or("502 not implemented");
            if w.write_all(format!("{reply}\r\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
            continue;
        } else if upper.starts_with("MAIL FROM") {
            if line.contains("drop-at-mail@") {
                return;
            }
            b"250 ok\r\n"
        } else if upper.starts_with("NOOP") {
            b"250 ok\r\n"
        } else if upper.starts_with("RSET") {
            rcpt.clear();
            b"250 ok\r\n"
        } else if upper.starts_with("RCPT TO") {
            if line.contains("t421@") {
                b"421 4.4.2 closing the channel\r\n"
            } else {
                rcpt.push(line[8..].trim().trim_start_matches(':').trim().to_owned());
                b"250 ok\r\n"
            }
        } else if upper.starts_with("DATA") {
            if w.write_all(b"354 go ahead\r\n").await.is_err() {
                return;
            }
            let mut data = String::new();
            loop {
                let mut l = String::new();
                if r.read_line(&mut l).await.unwrap_or(0) == 0 {
                    return;
                }
                if l == ".\r\n" {
                    break;
                }
                data.push_str(&l);
            }
            let first = rcpt.first().cloned().unwrap_or_default();
            rcpt.clear();
            if first.contains("stall@") {
                // Never answer; wait for the client to hang up.
                ignore_the_rest(&mut r).await;
                return;
            } else if first.contains("drop@") {
                // The content arrived; hang up before the final reply.
                return;
            } else if first.contains("t451@") {
                b"451 4.3.0 try again later\r\n"
            } else if first.contains("t550@") {
                b"550 5.1.1 no such user\r\n"
            } else {
                let (bye, mute) = (first.contains("bye@"), first.contains("mute@"));
                if first.contains("slow@") {
                    // A busy server: the answer takes a while.
                    tokio::time::sleep(SLOW_REPLY).await;
                }
                accepted.lock().unwrap().push(Mail { rcpt: first, data });
                count.send_modify(|c| *c += 1);
                if bye || mute {
                    let _ = w.write_all(b"250 2.0.0 queued as sink-1\r\n").await;
                    if mute {
                        ignore_the_rest(&mut r).await;
                    }
                    return;
                }
                b"250 2.0.0 queued as sink-1\r\n"
            }
        } else if upper.starts_with("QUIT") {
            let _ = w.write_all(b"221 bye\r\n").await;
            return;
        } else {
            b"502 not implemented\r\n"
        };
        if w.write_all(reply).await.is_err() {
            return;
        }
    }
}
