//! A network link of a test's own, which the test can cut without a word: a network namespace
//! joined to this one by a veth pair, with an address on each end (a /30 of 198.18.0.0/15, the
//! range set aside for network tests, so it clashes with no real network; reachable from this
//! machine only). A server started inside the namespace (`ip netns exec`) is reached over it.
//!
//! [`Link::cut`] takes the namespace's end down. Nothing answers on the link from then on: no
//! reset, no "unreachable" — this end keeps a permanent neighbour entry for the far address, so
//! even new connections are not refused but wait, as across a partition beyond a router. A
//! connection then fails only by its own timeouts (TCP's retransmissions, `TCP_USER_TIMEOUT`,
//! keepalives). [`Link::mend`] brings it back up; connections that had not given up carry on.
//!
//! Needs root (namespaces, links, neighbour entries) and `ip` from iproute2
//! (`scripts/install-deps`). Removed when dropped (deleting the namespace deletes both ends).

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

pub struct Link {
    ns: String,
    near_end: String,
    ns_end: String,
    /// This end's address.
    pub near: String,
    /// The namespace end's address, where a server inside listens.
    pub far: String,
}

fn ip(args: &str) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args.split_whitespace())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {args}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Link {
    /// A fresh namespace and link, named after this test process and a count of the links it
    /// made, on a /30 of 198.18.0.0/16 that no address of this machine is in. Namespaces left
    /// by test processes that are gone (killed) are removed first.
    pub fn new() -> Self {
        static MADE: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let n = MADE.fetch_add(1, Ordering::Relaxed) % 100;
        let ns = format!("herald-drill-{pid}-{n}");
        // Interface names are at most 15 bytes: `hd` + a pid (at most 7 digits) + `-NNh`.
        let near_end = format!("hd{pid}-{n}h");
        let ns_end = format!("hd{pid}-{n}n");
        // One process at a time picks and takes a block (two could pick the same otherwise:
        // Linux lets two interfaces have the same address).
        let lock = std::fs::File::create(std::env::temp_dir().join("herald-drill-links.lock"))
            .expect("the links' lock file");
        {
            use std::os::fd::AsRawFd;
            // SAFETY: flock on a descriptor this File owns; released when it is closed.
            let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
            assert_eq!(locked, 0, "lock the links' lock file");
        }
        forget_the_gone();
        let shown = Command::new("ip")
            .args(["-o", "-4", "addr", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let used: std::collections::HashSet<u32> = shown
            .split_whitespace()
            .filter_map(|w| w.split('/').next()?.parse::<std::net::Ipv4Addr>().ok())
            .map(u32::from)
            .filter(|a| a >> 16 == (198 << 8) | 18)
            .map(|a| (a >> 2) & 16_383)
            .collect();
        let mut block = pid.wrapping_mul(8).wrapping_add(n) % 16_384;
        while used.contains(&block) {
            block = (block + 1) % 16_384;
        }
        let base = (198u32 << 24) | (18 << 16) | (block * 4);
        let addr = |i: u32| std::net::Ipv4Addr::from(base + i).to_string();
        let (near, far) = (addr(1), addr(2));
        let link = Link {
            ns,
            near_end,
            ns_end,
            near,
            far,
        };
        let near_end = &link.near_end;
        let inside = |cmd: &str| format!("netns exec {} ip {cmd}", link.ns);
        let steps = [
            format!("netns add {}", link.ns),
            format!("link add {near_end} type veth peer name {}", link.ns_end),
            format!("link set {} netns {}", link.ns_end, link.ns),
            format!("addr add {}/30 dev {near_end}", link.near),
            format!("link set {near_end} up"),
            inside(&format!("addr add {}/30 dev {}", link.far, link.ns_end)),
            inside(&format!("link set {} up", link.ns_end)),
            inside("link set lo up"),
        ];
        for step in &steps {
            if let Err(e) = ip(step) {
                panic!(
                    "cannot make the drill's network link ({e}); it needs root and iproute2 \
                     (scripts/install-deps)"
                );
            }
        }
        // The far end's hardware address, pinned: with the link cut, packets for it are
        // dropped on the wire instead of failing address resolution at once.
        let mac = Command::new("ip")
            .args(["netns", "exec", &link.ns, "cat"])
            .arg(format!("/sys/class/net/{}/address", link.ns_end))
            .output()
            .expect("read the far end's address");
        let mac = String::from_utf8_lossy(&mac.stdout).trim().to_owned();
        ip(&format!(
            "neigh replace {} lladdr {mac} dev {near_end} nud permanent",
            link.far
        ))
        .expect("pin the far end's neighbour entry");
        drop(lock);
        link
    }

    /// `sh -c script` inside the namespace, as the `postgres` user when `as_postgres`.
    pub fn sh(&self, script: &str, as_postgres: bool) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns]);
        if as_postgres {
            c.args(["runuser", "-u", "postgres", "--"]);
        }
        c.args(["sh", "-c", script]).stdin(Stdio::null());
        c
    }

    /// Cuts the link: from now on nothing crosses it, and nobody is told.
    pub fn cut(&self) {
        ip(&format!(
            "netns exec {} ip link set {} down",
            self.ns, self.ns_end
        ))
        .expect("cut the link");
    }

    /// Mends the link.
    pub fn mend(&self) {
        ip(&format!(
            "netns exec {} ip link set {} up",
            self.ns, self.ns_end
        ))
        .expect("mend the link");
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = ip(&format!("netns del {}", self.ns));
        // Gone with the namespace once its end was moved there; not if making it failed before.
        let _ = ip(&format!("link del {}", self.near_end));
    }
}

/// Removes the namespaces (and with them their links) of test processes that are gone: a
/// process killed before its links were dropped. (A server it started inside one runs on until
/// stopped; its namespace is only unnamed.)
fn forget_the_gone() {
    let listed = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for name in listed.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name
            .strip_prefix("herald-drill-")
            .and_then(|r| r.split('-').next())
        else {
            continue;
        };
        if !std::path::Path::new("/proc").join(pid).exists() {
            let _ = ip(&format!("netns del {name}"));
        }
    }
}
