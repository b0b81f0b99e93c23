//! A small SMTP server on 127.0.0.1:0 whose answers the addresses script.
//!
//! By the `MAIL FROM` address: `drop-at-mail@…` closes the connection before the envelope;
//! `garbled-at-mail@…` answers MAIL FROM with a line that is no SMTP reply and stays open;
//! `mailNNN@…` is answered NNN (a 421 then closes the connection, as a real server does).
//!
//! By each `RCPT TO` address: `rcptNNN@…` (also `rcptNNN-anything@…`) is answered NNN, the
//! session going on with the next recipient (a 421 closes it); `t421@…` gets 421 while the
//! session stays open (a server that should close the channel but does not); `slowrcpt@…` is
//! answered after [`SLOW_RCPT`] (a relay running its RCPT TO checks); `rcptlatin1@…` gets a 550
//! in Latin-1 ([`LATIN1_REFUSED`]). Refused recipients are not
//! part of the envelope the sink records. RCPT TO outside a transaction (before MAIL FROM, or
//! after RSET or DATA) gets 503, as a real server answers.
//!
//! By the first accepted recipient, after the content: `stall@…` no answer, `drop@…` a closed
//! connection, `garbled@…` a line that is no SMTP reply (`hello there`, the session left open),
//! `latin1@…` a 250 in Latin-1 ([`LATIN1_QUEUED`], the message kept, the session left open), `dataNNN@…` NNN (`t451@…` and `t550@…` are 451 and 550; `once451@…` 451 the
//! first time in a sink's life, then 250), `bye@…` 250 and then a
//! closed connection (a server ending an idle session), `slow@…` 250 after [`SLOW_REPLY`] (a busy
//! server), `mute@…` 250 and then silence: the session stays open but never answers again (not
//! even NOOP); `postfix@…`, `exim@…`, `ses@…` and `plain@…` get those servers' 250 lines
//! ([`POSTFIX_QUEUED`], [`EXIM_QUEUED`], [`SES_QUEUED`], [`PLAIN_OK`]); everyone else gets 250 with a queue id of
//! its own (`queued as SINK-n`). Accepted messages are kept, and [`SmtpSink::wait_for_mail`]
//! waits for them.
//!
//! It offers PIPELINING and CHUNKING, as Postfix does ([`Script`] leaves either out), and takes
//! the content by DATA (stored as it came, dots doubled) or by `BDAT n [LAST]` (RFC 3030: the
//! bytes as they are; a refused chunk is read all the same, and the scripts above apply after the
//! last chunk as after DATA's final dot).
//!
//! [`SmtpSink::start_silent`] accepts TCP connections but never sends a greeting;
//! [`SmtpSink::start_scripted`] greets with another code, refuses or checks AUTH, and offers
//! STARTTLS or speaks implicit TLS with a certificate of a CA generated for the test
//! ([`Script`], [`TestCa`]). The sink counts sessions ([`SmtpSink::max_sessions`],
//! [`SmtpSink::open_sessions`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// One message as received.
#[derive(Debug, Clone)]
pub struct Mail {
    /// The first accepted recipient, as sent (`<ada@example.com>`).
    pub rcpt: String,
    /// Every accepted recipient, in order: the envelope the message was delivered to.
    pub rcpts: Vec<String>,
    pub mail_from: String,
    pub data: String,
    /// Whether the message came over TLS (STARTTLS or implicit).
    pub tls: bool,
}

/// How long a `slow@…` recipient waits for its 250.
pub const SLOW_REPLY: Duration = Duration::from_millis(100);
/// How long the answer to a `slower@…` recipient's content takes.
pub const SLOWER_REPLY: Duration = Duration::from_millis(1500);
/// How long a `slowrcpt@…` recipient waits for its answer to RCPT TO.
pub const SLOW_RCPT: Duration = Duration::from_millis(800);
/// The answer to a `postfix@…` message.
pub const POSTFIX_QUEUED: &str = "250 2.0.0 Ok: queued as ABC123";
/// The answer to an `exim@…` message.
pub const EXIM_QUEUED: &str = "250 OK id=1abcde-000123-XY";
/// The answer to an `ses@…` message: Amazon SES's, its message id after `Ok`.
pub const SES_QUEUED: &str = "250 Ok 0100018c9f0e5a3b-6c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f-000000";
/// The answer to a `plain@…` message: no queue id.
pub const PLAIN_OK: &str = "250 OK";

/// Credentials the sink checks, and the mechanisms it offers for them.
#[derive(Debug, Clone, Copy)]
pub struct Auth {
    /// Advertised in EHLO as `AUTH …`, e.g. `"PLAIN"`, `"LOGIN"`, `"PLAIN LOGIN"`.
    pub mechanisms: &'static str,
    pub username: &'static str,
    pub password: &'static str,
}

/// TLS the sink speaks, with a server configuration from [`TestCa::server_config`].
#[derive(Clone)]
pub enum TlsMode {
    /// Offers STARTTLS in EHLO and upgrades when asked.
    StartTls(Arc<rustls::ServerConfig>),
    /// TLS from the first byte (`smtps://`).
    Implicit(Arc<rustls::ServerConfig>),
}

/// What a scripted sink does differently from [`SmtpSink::start`].
#[derive(Clone, Default)]
pub struct Script {
    /// The greeting line instead of `220 sink ESMTP`, e.g. `421 4.3.2 busy`. After a greeting
    /// other than 220 the sink answers 503 to everything but QUIT (RFC 5321 §3.1).
    pub greeting: Option<&'static str>,
    /// Greet this many connections, the first ones, `220` before `greeting` applies (a relay
    /// that keeps one session and refuses new ones: "421 too many connections").
    pub greet_first: Option<usize>,
    /// Advertise `AUTH PLAIN LOGIN` and answer every AUTH command with this line.
    pub auth_reply: Option<&'static str>,
    /// Offer these mechanisms, check the credentials (235 or 535) and refuse MAIL FROM (530)
    /// until a client authenticated.
    pub auth: Option<Auth>,
    pub tls: Option<TlsMode>,
    /// Leave PIPELINING out of the EHLO reply (offered by default, as Postfix and Exim do).
    pub no_pipelining: bool,
    /// Leave CHUNKING out of the EHLO reply (offered by default, as Postfix does since 3.4;
    /// `BDAT` is answered either way).
    pub no_chunking: bool,
    /// Answer a second EHLO in a session `503 Duplicate HELO/EHLO`, leaving the session as it
    /// was, as Python's `smtpd` does (the README's example server).
    pub refuse_second_ehlo: bool,
    /// Answer DATA with 354 even when no recipient was accepted (a pipelining server may: RFC
    /// 2920 §3.1 tells the client not to assume a refusal).
    pub lax_data: bool,
    /// Answer RSET `421 4.3.2 closing the channel` and go on answering what follows (a server
    /// going away between two messages that should close the channel but does not).
    pub refuse_reset: bool,
    /// Hold the replies to a pipelined group until the group has been read ([`tell`]).
    pub hold_replies: bool,
    /// Answer every AUTH `535` repeating what it got, base64 and decoded (NULs as spaces), as a
    /// relay logging into its reply might ([`AUTH_ECHO`]).
    pub echo_auth: bool,
    /// Answer the MAIL FROM after this many in a session `421 4.7.0 too many messages` and
    /// close (a relay's limit of messages per connection).
    pub mails_per_session: Option<usize>,
    /// Take at most this many recipients in one transaction, answering the rest `452 4.5.3`
    /// (RFC 5321 §4.5.3.1.10), as Gmail's relay does past 100.
    pub max_recipients: Option<usize>,
    /// The answer past `max_recipients` instead of [`TOO_MANY_RECIPIENTS`] (an older server's
    /// `552`).
    pub too_many_reply: Option<&'static str>,
}

/// A certificate authority made for one test, and a server certificate it signed for
/// `127.0.0.1` and `localhost`.
pub struct TestCa {
    pub ca_pem: String,
    server: Arc<rustls::ServerConfig>,
}

impl TestCa {
    pub fn new() -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair, KeyUsagePurpose,
        };
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Herald test CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let mut leaf_params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, "smtp sink");
        leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &*ca).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
            )
            .unwrap();
        TestCa {
            ca_pem: ca.pem(),
            server: Arc::new(server),
        }
    }

    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server.clone()
    }

    /// Writes the CA certificate as `ca.pem` in `dir`.
    pub fn write_ca(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, &self.ca_pem).unwrap();
        path
    }
}

#[derive(Clone)]
pub struct SmtpSink {
    /// `smtp://127.0.0.1:PORT`.
    pub url: String,
    pub addr: SocketAddr,
    accepted: Arc<Mutex<Vec<Mail>>>,
    /// The number of accepted messages, for waiting on arrivals.
    count: watch::Receiver<usize>,
    counters: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    connections: AtomicUsize,
    open: AtomicUsize,
    /// Signalled each time a session ends ([`SmtpSink::wait_until_no_session`]).
    ended: tokio::sync::Notify,
    max_open: AtomicUsize,
    auth_commands: AtomicUsize,
    tls_sessions: AtomicUsize,
    queued: AtomicUsize,
    /// `once451@…` has been refused once already.
    once_refused: std::sync::atomic::AtomicBool,
    /// Every message content that reached the end of DATA, answered 250 or not.
    received: Mutex<Vec<String>>,
    /// The mechanism of every successful AUTH.
    authenticated: Mutex<Vec<String>>,
    /// MAIL FROM lines that arrived with the rest of their envelope behind them, up to its DATA
    /// or BDAT (the client did not wait for the replies: pipelined), and those that arrived
    /// alone. One with some but not all of it behind is neither.
    pipelined: AtomicUsize,
    /// BDAT commands received.
    chunks: AtomicUsize,
    lockstep: AtomicUsize,
    /// NOOP and RSET lines, by verb: (arrived with more commands behind them, arrived alone).
    checks: Mutex<std::collections::HashMap<&'static str, (usize, usize)>>,
    /// Commands that may only end a pipelined group (RFC 2920 §3.1: EHLO, DATA, VRFY, EXPN,
    /// TURN, QUIT, NOOP; STARTTLS and AUTH by their own RFCs) that arrived with more behind them.
    out_of_place: Mutex<Vec<String>>,
    /// EHLO (and HELO) commands received.
    ehlos: AtomicUsize,
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
        self.0.ended.notify_waiters();
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

    /// A server that greets, authenticates or speaks TLS as `script` says.
    pub async fn start_scripted(script: Script) -> Self {
        Self::start_mode(false, script).await
    }

    /// A sink on `listener` (one that comes up where connections were refused until now).
    pub fn start_on(listener: TcpListener) -> Self {
        Self::serve(listener, false, Script::default())
    }

    async fn start_mode(silent: bool, script: Script) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind smtp");
        Self::serve(listener, silent, script)
    }

    fn serve(listener: TcpListener, silent: bool, script: Script) -> Self {
        let addr = listener.local_addr().unwrap();
        let url = format!("smtp://{addr}");
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let (count_tx, count) = watch::channel(0usize);
        let count_tx = Arc::new(count_tx);
        let a = accepted.clone();
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                // Replies are single short lines: without this, delayed ACKs hold each one back
                // ~40 ms and the sink, not its client, sets the pace.
                let _ = sock.set_nodelay(true);
                let open = OpenSession::new(c.clone());
                if silent {
                    tokio::spawn(async move {
                        silent_session(sock).await;
                        drop(open);
                    });
                } else {
                    let (a, count_tx, mut script) = (a.clone(), count_tx.clone(), script.clone());
                    // Counted in this loop, in the order connections came.
                    let nth = c.connections.load(Ordering::SeqCst);
                    if script.greet_first.is_some_and(|first| nth <= first) {
                        script.greeting = None;
                    }
                    tokio::spawn(async move {
                        session(sock, a, count_tx, script, &open.0).await;
                        drop(open);
                    });
                }
            }
        });
        SmtpSink {
            url,
            addr,
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

    /// Sessions open now.
    pub fn open_sessions(&self) -> usize {
        self.counters.open.load(Ordering::SeqCst)
    }

    /// Waits until no session is open (each one's socket closed); panics after `within`.
    pub async fn wait_until_no_session(&self, within: Duration) {
        let ended = async {
            loop {
                // Registered before looking, so a session ending after the look wakes it.
                let next = self.counters.ended.notified();
                tokio::pin!(next);
                next.as_mut().enable();
                if self.open_sessions() == 0 {
                    return;
                }
                next.await;
            }
        };
        tokio::time::timeout(within, ended)
            .await
            .unwrap_or_else(|_| panic!("a session stayed open for {within:?}"));
    }

    /// AUTH commands received so far.
    pub fn auth_commands(&self) -> usize {
        self.counters.auth_commands.load(Ordering::SeqCst)
    }

    /// The mechanism of every successful AUTH so far.
    pub fn authenticated(&self) -> Vec<String> {
        self.counters.authenticated.lock().unwrap().clone()
    }

    /// Envelopes whose MAIL FROM arrived with the next commands behind it (pipelined), and
    /// those whose MAIL FROM arrived alone: (pipelined, lockstep).
    pub fn envelopes(&self) -> (usize, usize) {
        (
            self.counters.pipelined.load(Ordering::SeqCst),
            self.counters.lockstep.load(Ordering::SeqCst),
        )
    }

    /// BDAT commands received so far (RFC 3030: the content by its size, no final dot).
    pub fn chunks(&self) -> usize {
        self.counters.chunks.load(Ordering::SeqCst)
    }

    /// NOOPs that arrived with the envelope behind them, and NOOPs that arrived alone:
    /// (pipelined, alone).
    pub fn noops(&self) -> (usize, usize) {
        self.checks("NOOP")
    }

    /// RSETs likewise: (pipelined, alone).
    pub fn resets(&self) -> (usize, usize) {
        self.checks("RSET")
    }

    fn checks(&self, verb: &str) -> (usize, usize) {
        let checks = self.counters.checks.lock().unwrap();
        checks.get(verb).copied().unwrap_or_default()
    }

    /// Commands that arrived with more commands behind them although RFC 2920 lets them only
    /// end a group (a client pipelining wrongly), each as its verb.
    pub fn out_of_place(&self) -> Vec<String> {
        self.counters.out_of_place.lock().unwrap().clone()
    }

    /// EHLO (and HELO) commands received so far, over every session.
    pub fn ehlos(&self) -> usize {
        self.counters.ehlos.load(Ordering::SeqCst)
    }

    /// Sessions that completed a TLS handshake.
    pub fn tls_sessions(&self) -> usize {
        self.counters.tls_sessions.load(Ordering::SeqCst)
    }

    pub fn accepted(&self) -> Vec<Mail> {
        self.accepted.lock().unwrap().clone()
    }

    /// Every message content received to the end of DATA, accepted or refused, in order.
    pub fn received(&self) -> Vec<String> {
        self.counters.received.lock().unwrap().clone()
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
    format!("smtp://{}", super::closed_addr())
}

async fn silent_session(mut sock: TcpStream) {
    let mut buf = [0u8; 1024];
    while sock.read(&mut buf).await.unwrap_or(0) > 0 {}
}

/// A byte stream the session speaks over: TCP, or TLS over TCP.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

type Conn = BufReader<Box<dyn Io>>;

/// Writes one reply (CRLF added); false once the client is gone.
async fn say(conn: &mut Conn, line: &str) -> bool {
    let w = conn.get_mut();
    w.write_all(format!("{line}\r\n").as_bytes()).await.is_ok() && w.flush().await.is_ok()
}

/// [`say`], but with `hold` (and more of the client's input already read) the reply waits in
/// `held` until the input runs dry: Postfix and Exim answer a pipelined group so, the replies
/// leaving together once the server needs more input. A reply that ends the session (or hands
/// it to TLS) goes with `hold` false: it leaves at once, after what was held.
async fn tell(conn: &mut Conn, held: &mut String, hold: bool, line: &str) -> bool {
    held.push_str(line);
    held.push_str("\r\n");
    if hold && !conn.buffer().is_empty() {
        return true;
    }
    let out = std::mem::take(held);
    let w = conn.get_mut();
    w.write_all(out.as_bytes()).await.is_ok() && w.flush().await.is_ok()
}

/// [`tell`] of a reply that is not UTF-8 (a relay writing Latin-1), with what was held before it.
async fn tell_bytes(conn: &mut Conn, held: &mut String, line: &[u8]) -> bool {
    let mut out = std::mem::take(held).into_bytes();
    out.extend_from_slice(line);
    out.extend_from_slice(b"\r\n");
    let w = conn.get_mut();
    w.write_all(&out).await.is_ok() && w.flush().await.is_ok()
}

/// The answer to a `latin1@…` message: a 250 in Latin-1 (`ü` as the one byte 0xFC).
pub const LATIN1_QUEUED: &[u8] =
    b"250 2.0.0 Nachricht angenommen f\xfcr Zustellung: queued as LAT1";
/// The beginning of the answer to AUTH with [`Script::echo_auth`].
pub const AUTH_ECHO: &str = "535 5.7.8 Error: authentication failed:";

/// The answer to a recipient past [`Script::max_recipients`].
pub const TOO_MANY_RECIPIENTS: &str = "452 4.5.3 Error: too many recipients";

/// The answer to RCPT TO of a `rcptlatin1@…` recipient: a 550 in Latin-1.
pub const LATIN1_REFUSED: &[u8] = b"550 5.1.1 Empf\xe4nger unbekannt";

/// The next line, or `None` once the client hung up.
async fn read_line(conn: &mut Conn) -> Option<String> {
    let mut line = String::new();
    match conn.read_line(&mut line).await {
        Ok(n) if n > 0 => Some(line),
        _ => None,
    }
}

/// Reads and drops everything until the client hangs up.
async fn ignore_the_rest(conn: &mut Conn) {
    while read_line(conn).await.is_some() {}
}

/// `<rcpt550-b@example.com>` with `prefix` `rcpt` → 550.
fn scripted_code(address: &str, prefix: &str) -> Option<u16> {
    let address = address.trim().trim_start_matches('<');
    let local = address.split('@').next()?.to_ascii_lowercase();
    let digits = local.strip_prefix(prefix)?.get(..3)?;
    let rest = &local[prefix.len() + 3..];
    if !(rest.is_empty() || rest.starts_with('-')) {
        return None;
    }
    digits.parse().ok().filter(|c| (200..600).contains(c))
}

/// `550 5.0.0 scripted reply`.
fn scripted_reply(code: u16) -> String {
    format!("{code} {}.0.0 scripted reply", code / 100)
}

/// The address of `MAIL FROM:<a@b> SIZE=…` or `RCPT TO:<a@b>`.
fn path_of(line: &str) -> String {
    let after = line.split_once(':').map(|(_, a)| a).unwrap_or("").trim();
    after.split_whitespace().next().unwrap_or("").to_owned()
}

fn decode(b64: &str) -> Option<String> {
    B64.decode(b64.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
}

/// One AUTH exchange after its first line; `Some(true)` when the credentials match, `None` if
/// the client hung up.
async fn authenticate(conn: &mut Conn, first: &str, auth: &Auth) -> Option<(bool, String)> {
    let mut words = first.split_whitespace().skip(1);
    let mechanism = words.next().unwrap_or("").to_ascii_uppercase();
    let initial = words.next().map(str::to_owned);
    let offered = auth
        .mechanisms
        .split_whitespace()
        .any(|m| m.eq_ignore_ascii_case(&mechanism));
    if !offered {
        say(conn, "504 5.5.4 mechanism not supported").await;
        return Some((false, mechanism));
    }
    let ok = match mechanism.as_str() {
        "PLAIN" => {
            let response = match initial {
                Some(r) => r,
                None => {
                    say(conn, "334 ").await;
                    read_line(conn).await?
                }
            };
            let decoded = decode(&response).unwrap_or_default();
            let parts: Vec<&str> = decoded.split('\0').collect();
            parts.len() == 3 && parts[1] == auth.username && parts[2] == auth.password
        }
        "LOGIN" => {
            let user = match initial {
                Some(u) => u,
                None => {
                    say(conn, &format!("334 {}", B64.encode("Username:"))).await;
                    read_line(conn).await?
                }
            };
            say(conn, &format!("334 {}", B64.encode("Password:"))).await;
            let pass = read_line(conn).await?;
            decode(&user).as_deref() == Some(auth.username)
                && decode(&pass).as_deref() == Some(auth.password)
        }
        _ => false,
    };
    Some((ok, mechanism))
}

async fn session(
    sock: TcpStream,
    accepted: Arc<Mutex<Vec<Mail>>>,
    count: Arc<watch::Sender<usize>>,
    script: Script,
    counters: &Counters,
) {
    let mut tls = false;
    let mut conn: Conn = match &script.tls {
        Some(TlsMode::Implicit(config)) => {
            match tokio_rustls::TlsAcceptor::from(config.clone())
                .accept(sock)
                .await
            {
                Ok(s) => {
                    counters.tls_sessions.fetch_add(1, Ordering::SeqCst);
                    tls = true;
                    BufReader::new(Box::new(s))
                }
                // The client refused the certificate (or spoke no TLS).
                Err(_) => return,
            }
        }
        _ => BufReader::new(Box::new(sock)),
    };
    let (hold, mut held) = (script.hold_replies, String::new());
    let greeting = script.greeting.unwrap_or("220 sink ESMTP");
    if !tell(&mut conn, &mut held, hold, greeting).await {
        return;
    }
    let refused = !greeting.starts_with("220");
    let mut authenticated = false;
    let mut greeted = false;
    let mut mail_from = String::new();
    // Between an accepted MAIL FROM and the end of its DATA (or an RSET).
    let mut in_mail = false;
    // MAIL FROM commands this session has answered.
    let mut mails = 0usize;
    let mut rcpt: Vec<String> = Vec::new();
    // The chunks of a BDAT transfer so far.
    let mut chunked: Vec<u8> = Vec::new();
    loop {
        let Some(line) = read_line(&mut conn).await else {
            return;
        };
        let upper = line.to_ascii_uppercase();
        let verb = upper.split_whitespace().next().unwrap_or_default();
        let last_only = [
            "EHLO", "HELO", "DATA", "VRFY", "EXPN", "TURN", "QUIT", "NOOP", "STARTTLS", "AUTH",
        ];
        if last_only.contains(&verb) && !conn.buffer().is_empty() {
            counters.out_of_place.lock().unwrap().push(verb.to_owned());
        }
        let reply: String = if refused && !upper.starts_with("QUIT") {
            "503 5.5.1 no service here".into()
        } else if (upper.starts_with("EHLO") || upper.starts_with("HELO"))
            && script.refuse_second_ehlo
            && std::mem::replace(&mut greeted, true)
        {
            counters.ehlos.fetch_add(1, Ordering::SeqCst);
            "503 Duplicate HELO/EHLO".into()
        } else if upper.starts_with("EHLO") || upper.starts_with("HELO") {
            counters.ehlos.fetch_add(1, Ordering::SeqCst);
            let mut lines = vec!["250-sink".to_owned()];
            if matches!(script.tls, Some(TlsMode::StartTls(_))) && !tls {
                lines.push("250-STARTTLS".into());
            }
            if let Some(auth) = &script.auth {
                lines.push(format!("250-AUTH {}", auth.mechanisms));
            } else if script.auth_reply.is_some() || script.echo_auth {
                lines.push("250-AUTH PLAIN LOGIN".into());
            }
            if !script.no_pipelining {
                lines.push("250-PIPELINING".into());
            }
            if !script.no_chunking {
                lines.push("250-CHUNKING".into());
            }
            lines.push("250 8BITMIME".into());
            lines.join("\r\n")
        } else if upper.starts_with("STARTTLS") {
            let Some(TlsMode::StartTls(config)) = &script.tls else {
                if !tell(&mut conn, &mut held, hold, "502 5.5.1 not offered").await {
                    return;
                }
                continue;
            };
            if tls {
                "503 5.5.1 already in TLS".into()
            } else {
                if !tell(&mut conn, &mut held, false, "220 2.0.0 ready to start TLS").await {
                    return;
                }
                let plain = conn.into_inner();
                match tokio_rustls::TlsAcceptor::from(config.clone())
                    .accept(plain)
                    .await
                {
                    Ok(s) => {
                        counters.tls_sessions.fetch_add(1, Ordering::SeqCst);
                        tls = true;
                        conn = BufReader::new(Box::new(s));
                        // RFC 3207: everything before the handshake is forgotten.
                        authenticated = false;
                        mail_from.clear();
                        rcpt.clear();
                        in_mail = false;
                        continue;
                    }
                    Err(_) => return,
                }
            }
        } else if upper.starts_with("AUTH") {
            counters.auth_commands.fetch_add(1, Ordering::SeqCst);
            if let Some(auth) = &script.auth {
                let Some((ok, mechanism)) = authenticate(&mut conn, &line, auth).await else {
                    return;
                };
                if ok {
                    authenticated = true;
                    counters.authenticated.lock().unwrap().push(mechanism);
                    "235 2.7.0 authentication successful".into()
                } else {
                    "535 5.7.8 authentication credentials invalid".into()
                }
            } else if script.echo_auth {
                use base64::Engine;
                let got = line.trim_end().rsplit(' ').next().unwrap_or("").to_owned();
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(&got)
                    .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                    .unwrap_or_default();
                format!("{AUTH_ECHO} {got} ({decoded})")
            } else {
                script
                    .auth_reply
                    .unwrap_or("502 5.5.1 not implemented")
                    .into()
            }
        } else if upper.starts_with("MAIL FROM") {
            let behind = conn.buffer();
            if behind.is_empty() {
                counters.lockstep.fetch_add(1, Ordering::SeqCst);
            } else {
                let behind = behind.to_ascii_uppercase();
                if behind.ends_with(b"DATA\r\n") || behind.windows(5).any(|w| w == b"BDAT ") {
                    counters.pipelined.fetch_add(1, Ordering::SeqCst);
                }
            }
            let from = path_of(&line);
            if from.contains("drop-at-mail@") {
                return;
            }
            if from.contains("garbled-at-mail@") {
                tell(&mut conn, &mut held, false, "hello there").await;
                ignore_the_rest(&mut conn).await;
                return;
            }
            rcpt.clear();
            in_mail = false;
            mails += 1;
            if script.mails_per_session.is_some_and(|max| mails > max) {
                tell(&mut conn, &mut held, false, "421 4.7.0 too many messages").await;
                return;
            }
            if script.auth.is_some() && !authenticated {
                "530 5.7.0 authentication required".into()
            } else if let Some(code) = scripted_code(&from, "mail") {
                in_mail = code < 300;
                if code == 421 {
                    tell(&mut conn, &mut held, false, &scripted_reply(code)).await;
                    return;
                }
                scripted_reply(code)
            } else {
                mail_from = from;
                in_mail = true;
                "250 2.1.0 ok".into()
            }
        } else if let Some(check) = ["NOOP", "RSET"].into_iter().find(|v| *v == verb) {
            let alone = conn.buffer().is_empty();
            {
                let mut checks = counters.checks.lock().unwrap();
                let (pipelined, lone) = checks.entry(check).or_default();
                *if alone { lone } else { pipelined } += 1;
            }
            if check == "RSET" {
                rcpt.clear();
                in_mail = false;
                if script.refuse_reset {
                    if !tell(&mut conn, &mut held, hold, "421 4.3.2 closing the channel").await {
                        return;
                    }
                    continue;
                }
            }
            "250 2.0.0 ok".into()
        } else if upper.starts_with("RCPT TO") {
            let to = path_of(&line);
            if to.contains("slowrcpt@") {
                tokio::time::sleep(SLOW_RCPT).await;
            }
            if !in_mail {
                "503 5.5.1 need MAIL before RCPT".into()
            } else if script.max_recipients.is_some_and(|max| rcpt.len() >= max) {
                script.too_many_reply.unwrap_or(TOO_MANY_RECIPIENTS).into()
            } else if to.contains("t421@") {
                "421 4.4.2 closing the channel".into()
            } else if to.contains("rcptlatin1@") {
                if !tell_bytes(&mut conn, &mut held, LATIN1_REFUSED).await {
                    return;
                }
                continue;
            } else if let Some(code) = scripted_code(&to, "rcpt") {
                if code == 421 {
                    tell(&mut conn, &mut held, false, &scripted_reply(code)).await;
                    return;
                }
                if code < 300 {
                    rcpt.push(to);
                }
                scripted_reply(code)
            } else {
                rcpt.push(to);
                "250 2.1.5 ok".into()
            }
        } else if upper.starts_with("DATA") {
            in_mail = false;
            if rcpt.is_empty() && !script.lax_data {
                if !tell(&mut conn, &mut held, hold, "554 5.5.1 no valid recipients").await {
                    return;
                }
                continue;
            }
            if !tell(&mut conn, &mut held, hold, "354 go ahead").await {
                return;
            }
            let mut data = String::new();
            loop {
                let Some(l) = read_line(&mut conn).await else {
                    return;
                };
                if l == ".\r\n" {
                    break;
                }
                data.push_str(&l);
            }
            let done = Content {
                data,
                rcpts: std::mem::take(&mut rcpt),
                mail_from: mail_from.clone(),
                tls,
            };
            match after_content(&mut conn, &mut held, done, counters, &accepted, &count).await {
                Some(reply) => reply,
                None => return,
            }
        } else if verb == "BDAT" {
            // RFC 3030: `BDAT <size> [LAST]`, then exactly <size> bytes, read whatever the answer
            // (§2: a server that refuses a chunk still reads it, to stay in step).
            let mut words = line.split_whitespace().skip(1);
            let size = words.next().and_then(|n| n.parse::<usize>().ok());
            let last = words.next().is_some_and(|w| w.eq_ignore_ascii_case("LAST"));
            counters.chunks.fetch_add(1, Ordering::SeqCst);
            let Some(size) = size else {
                if !tell(&mut conn, &mut held, false, "501 5.5.4 BDAT needs a size").await {
                    return;
                }
                continue;
            };
            let mut bytes = vec![0u8; size];
            if conn.read_exact(&mut bytes).await.is_err() {
                return;
            }
            if !in_mail {
                chunked.clear();
                "503 5.5.1 need MAIL before BDAT".into()
            } else if rcpt.is_empty() && !script.lax_data {
                in_mail = false;
                chunked.clear();
                "554 5.5.1 no valid recipients".into()
            } else {
                chunked.extend_from_slice(&bytes);
                if !last {
                    "250 2.0.0 chunk received".into()
                } else {
                    in_mail = false;
                    let done = Content {
                        data: String::from_utf8_lossy(&std::mem::take(&mut chunked)).into_owned(),
                        rcpts: std::mem::take(&mut rcpt),
                        mail_from: mail_from.clone(),
                        tls,
                    };
                    match after_content(&mut conn, &mut held, done, counters, &accepted, &count)
                        .await
                    {
                        Some(reply) => reply,
                        None => return,
                    }
                }
            }
        } else if upper.starts_with("QUIT") {
            tell(&mut conn, &mut held, false, "221 2.0.0 bye").await;
            return;
        } else {
            "502 5.5.1 not implemented".into()
        };
        if !tell(&mut conn, &mut held, hold, &reply).await {
            return;
        }
    }
}

/// A message whose content is in (DATA's final dot, or the last BDAT chunk).
struct Content {
    data: String,
    rcpts: Vec<String>,
    mail_from: String,
    tls: bool,
}

/// The scripted answer to a message whose content is in, by its first recipient; `None` when
/// the session ends instead (a stall, a drop, `bye@`, `mute@`).
async fn after_content(
    conn: &mut Conn,
    held: &mut String,
    done: Content,
    counters: &Counters,
    accepted: &Mutex<Vec<Mail>>,
    count: &watch::Sender<usize>,
) -> Option<String> {
    let Content {
        data,
        rcpts,
        mail_from,
        tls,
    } = done;
    let first = rcpts.first().cloned().unwrap_or_default();
    counters.received.lock().unwrap().push(data.clone());
    // What is kept of it, where the script takes it.
    let mail = Mail {
        rcpt: first.clone(),
        rcpts,
        mail_from,
        data,
        tls,
    };
    let refuse_once =
        first.contains("once451@") && !counters.once_refused.swap(true, Ordering::SeqCst);
    let at_data = scripted_code(&first, "data").or(if first.contains("t451@") || refuse_once {
        Some(451)
    } else if first.contains("t550@") {
        Some(550)
    } else {
        None
    });
    if first.contains("stall@") {
        // Never answer; wait for the client to hang up.
        ignore_the_rest(conn).await;
        None
    } else if first.contains("drop@") {
        // The content arrived; hang up before the final reply.
        None
    } else if first.contains("latin1@") {
        // Taken, and said so in Latin-1; the session left open.
        keep(accepted, count, mail);
        tell_bytes(conn, held, LATIN1_QUEUED).await;
        ignore_the_rest(conn).await;
        None
    } else if first.contains("garbled@") {
        // A broken relay: no SMTP reply at all, the session left open.
        tell(conn, held, false, "hello there").await;
        ignore_the_rest(conn).await;
        None
    } else if let Some(code) = at_data.filter(|c| *c >= 300) {
        Some(scripted_reply(code))
    } else {
        let (bye, mute) = (first.contains("bye@"), first.contains("mute@"));
        if first.contains("slow@") {
            // A busy server: the answer takes a while.
            tokio::time::sleep(SLOW_REPLY).await;
        } else if first.contains("slower@") {
            // Long enough for another send to begin meanwhile, however slow a debug build.
            tokio::time::sleep(SLOWER_REPLY).await;
        }
        let reply = if first.contains("postfix@") {
            POSTFIX_QUEUED.to_owned()
        } else if first.contains("exim@") {
            EXIM_QUEUED.to_owned()
        } else if first.contains("ses@") {
            SES_QUEUED.to_owned()
        } else if first.contains("plain@") {
            PLAIN_OK.to_owned()
        } else {
            let n = counters.queued.fetch_add(1, Ordering::SeqCst) + 1;
            format!("250 2.0.0 Ok: queued as SINK-{n}")
        };
        keep(accepted, count, mail);
        if bye || mute {
            tell(conn, held, false, &reply).await;
            if mute {
                ignore_the_rest(conn).await;
            }
            return None;
        }
        Some(reply)
    }
}

/// Keeps an accepted message and counts it (what [`SmtpSink::wait_for_mail`] waits for).
fn keep(accepted: &Mutex<Vec<Mail>>, count: &watch::Sender<usize>, mail: Mail) {
    accepted.lock().unwrap().push(mail);
    count.send_modify(|c| *c += 1);
}

#[test]
fn scripted_codes_are_read_from_the_local_part() {
    assert_eq!(scripted_code("<rcpt550@example.com>", "rcpt"), Some(550));
    assert_eq!(scripted_code("<rcpt452-b@example.com>", "rcpt"), Some(452));
    assert_eq!(scripted_code("<rcpt55@example.com>", "rcpt"), None);
    assert_eq!(scripted_code("<rcpt550x@example.com>", "rcpt"), None);
    assert_eq!(scripted_code("<ada@example.com>", "rcpt"), None);
    assert_eq!(scripted_code("<data554@example.com>", "data"), Some(554));
    assert_eq!(
        path_of("MAIL FROM:<a@b.example> BODY=8BITMIME\r\n"),
        "<a@b.example>"
    );
}
