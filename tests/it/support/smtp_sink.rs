//! A small SMTP server on 127.0.0.1:0. It answers by recipient: `t451@…` gets 451 after DATA,
//! `t550@…` 550, `stall@…` no answer after DATA; everyone else 250. Accepted messages are kept.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

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
}

impl SmtpSink {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind smtp");
        let url = format!("smtp://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let a = accepted.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                tokio::spawn(session(sock, a.clone()));
            }
        });
        SmtpSink { url, accepted }
    }

    pub fn accepted(&self) -> Vec<Mail> {
        self.accepted.lock().unwrap().clone()
    }
}

async fn session(sock: TcpStream, accepted: Arc<Mutex<Vec<Mail>>>) {
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
        } else if upper.starts_with("MAIL FROM") || upper.starts_with("NOOP") {
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
            } else if first.contains("t451@") {
                b"451 4.3.0 try again later\r\n"
            } else if first.contains("t550@") {
                b"550 5.1.1 no such user\r\n"
            } else {
                accepted.lock().unwrap().push(Mail { rcpt: first, data });
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
