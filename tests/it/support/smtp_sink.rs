//! A small SMTP server on 127.0.0.1:0. It answers by recipient: `t451@…` gets 451 after DATA,
//! `t550@…` 550, `stall@…` no answer after DATA, `drop@…` a closed connection after DATA,
//! `bye@…` 250 and then a closed connection (a server ending an idle session);
//! a `MAIL FROM` of `drop-at-mail@…` closes the connection before the envelope; everyone else
//! gets 250. Accepted messages are kept, and [`SmtpSink::wait_for_mail`] waits for them.
//! [`SmtpSink::start_silent`] accepts TCP connections but never sends a greeting.

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

#[derive(Clone)]
pub struct SmtpSink {
    pub url: String,
    accepted: Arc<Mutex<Vec<Mail>>>,
    /// The number of accepted messages, for waiting on arrivals.
    count: watch::Receiver<usize>,
    connections: Arc<AtomicUsize>,
}

impl SmtpSink {
    pub async fn start() -> Self {
        Self::start_mode(false).await
    }

    /// A server that accepts connections and reads what comes, but never greets.
    pub async fn start_silent() -> Self {
        Self::start_mode(true).await
    }

    async fn start_mode(silent: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind smtp");
        let url = format!("smtp://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let (count_tx, count) = watch::channel(0usize);
        let count_tx = Arc::new(count_tx);
        let a = accepted.clone();
        let connections = Arc::new(AtomicUsize::new(0));
        let c = connections.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                if silent {
                    tokio::spawn(silent_session(sock));
                } else {
                    tokio::spawn(session(sock, a.clone(), count_tx.clone()));
                }
            }
        });
        SmtpSink {
            url,
            accepted,
            count,
            connections,
        }
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
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

async fn session(
    sock: TcpStream,
    accepted: Arc<Mutex<Vec<Mail>>>,
    count: Arc<watch::Sender<usize>>,
) {
    let (r, mut w) = sock.into_split();
    let mut r = BufReader::new(r);
    if w.write_all(b"220 sink ESMTP\r\n").await.is_err() {
        return;
    }
    let mut rcpt = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let upper = line.to_ascii_uppercase();
        let reply: &[u8] = if upper.starts_with("EHLO") || upper.starts_with("HELO") {
            b"250-sink\r\n250 8BITMIME\r\n"
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
            rcpt.push(line[8..].trim().trim_start_matches(':').trim().to_owned());
            b"250 ok\r\n"
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
                let mut l = String::new();
                while r.read_line(&mut l).await.unwrap_or(0) > 0 {
                    l.clear();
                }
                return;
            } else if first.contains("drop@") {
                // The content arrived; hang up before the final reply.
                return;
            } else if first.contains("t451@") {
                b"451 4.3.0 try again later\r\n"
            } else if first.contains("t550@") {
                b"550 5.1.1 no such user\r\n"
            } else {
                let bye = first.contains("bye@");
                accepted.lock().unwrap().push(Mail { rcpt: first, data });
                count.send_modify(|c| *c += 1);
                if bye {
                    let _ = w.write_all(b"250 2.0.0 queued as sink-1\r\n").await;
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
