//! The SSRF guard for webhook destinations: which IP addresses Herald may connect to.
//!
//! Invariant: a webhook request connects only to an address [`check`] passed. IP-literal URLs
//! are checked before the request ([`check_url_literal`]); host names are resolved once, by
//! [`GuardedResolver`], which hands the HTTP client only the addresses that pass — there is no
//! second resolution, so a name that resolves to a public address for a check and to a private
//! one for the connection (DNS rebinding) cannot slip past.
//!
//! What is refused (unless allow-listed, see [`AllowList`]): every IPv4 and IPv6 special-purpose
//! range that is not a public unicast destination — unspecified, "this network", loopback,
//! private (RFC 1918, unique local), shared address space (CGNAT), link-local, site-local,
//! multicast, broadcast, documentation, benchmarking, IETF protocol assignments, reserved, the
//! deprecated 6to4 relay anycast, discard-only, SRv6 SIDs, local-use NAT64, and the well-known
//! cloud metadata addresses. IPv6 outside `2000::/3` (global unicast) is refused as reserved.
//! IPv6 forms that carry an IPv4 address are judged by that address: IPv4-mapped
//! (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`, also refused when its IPv4 is public: the
//! form is deprecated and not routed), NAT64 (`64:ff9b::/96`), 6to4 (`2002::/16`) and Teredo
//! (`2001::/32`, server and client address both).
//!
//! Cloud metadata addresses stay refused under an allow-listed network that merely contains
//! them (`0.0.0.0/0`, `169.254.0.0/16`): only an allow-list entry naming the single address
//! (`169.254.169.254/32`) opens one.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Why an address is not a public destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeKind {
    Unspecified,
    ThisNetwork,
    Loopback,
    Private,
    SharedAddressSpace,
    LinkLocal,
    CloudMetadata,
    IetfProtocol,
    Documentation,
    Benchmarking,
    Multicast,
    Broadcast,
    Reserved,
    Relay6to4,
    UniqueLocal,
    SiteLocal,
    Discard,
    Srv6,
    Nat64Local,
    Ipv4Compatible,
}

impl RangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::ThisNetwork => "this network",
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::SharedAddressSpace => "shared address space (CGNAT)",
            Self::LinkLocal => "link-local",
            Self::CloudMetadata => "cloud metadata service",
            Self::IetfProtocol => "IETF protocol assignments",
            Self::Documentation => "documentation",
            Self::Benchmarking => "benchmarking",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Reserved => "reserved",
            Self::Relay6to4 => "6to4 relay anycast (deprecated)",
            Self::UniqueLocal => "unique local (private)",
            Self::SiteLocal => "site-local (deprecated)",
            Self::Discard => "discard-only",
            Self::Srv6 => "SRv6 segment identifiers",
            Self::Nat64Local => "local-use NAT64",
            Self::Ipv4Compatible => "IPv4-compatible IPv6 (deprecated)",
        }
    }
}

/// An IPv6 form that carries an IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedding {
    Mapped,
    /// `::ffff:0:a.b.c.d` (SIIT's IPv4-translated form, RFC 7915).
    Translated,
    Compatible,
    Nat64,
    SixToFour,
    TeredoServer,
    TeredoClient,
}

impl Embedding {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mapped => "IPv4-mapped",
            Self::Translated => "IPv4-translated",
            Self::Compatible => "IPv4-compatible",
            Self::Nat64 => "NAT64",
            Self::SixToFour => "6to4",
            Self::TeredoServer => "Teredo server",
            Self::TeredoClient => "Teredo client",
        }
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8, kind: RangeKind) -> (Ipv4Net, RangeKind) {
    (Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len), kind)
}

const fn v6(s: [u16; 8], len: u8, kind: RangeKind) -> (Ipv6Net, RangeKind) {
    (
        Ipv6Net::new_assert(
            Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]),
            len,
        ),
        kind,
    )
}

use RangeKind as K;

/// Refused IPv4 ranges; the first that contains an address decides (most specific first).
/// Sources: the IANA IPv4 Special-Purpose Address Registry, RFC 1112 (multicast), providers'
/// metadata documentation.
pub const REFUSED_V4: &[(Ipv4Net, RangeKind)] = &[
    // AWS, GCP, Azure, OpenStack, DigitalOcean, OCI instance metadata.
    v4(169, 254, 169, 254, 32, K::CloudMetadata),
    // AWS ECS task metadata / credentials, EKS Pod Identity agent.
    v4(169, 254, 170, 2, 32, K::CloudMetadata),
    v4(169, 254, 170, 23, 32, K::CloudMetadata),
    // Alibaba Cloud.
    v4(100, 100, 100, 200, 32, K::CloudMetadata),
    // Oracle Cloud (classic).
    v4(192, 0, 0, 192, 32, K::CloudMetadata),
    // Azure's host endpoint (WireServer: the VM agent's configuration and extensions).
    v4(168, 63, 129, 16, 32, K::CloudMetadata),
    v4(0, 0, 0, 0, 32, K::Unspecified),
    v4(0, 0, 0, 0, 8, K::ThisNetwork),
    v4(10, 0, 0, 0, 8, K::Private),
    v4(100, 64, 0, 0, 10, K::SharedAddressSpace),
    v4(127, 0, 0, 0, 8, K::Loopback),
    v4(169, 254, 0, 0, 16, K::LinkLocal),
    v4(172, 16, 0, 0, 12, K::Private),
    v4(192, 0, 0, 0, 24, K::IetfProtocol),
    v4(192, 0, 2, 0, 24, K::Documentation),
    v4(192, 88, 99, 0, 24, K::Relay6to4),
    v4(192, 168, 0, 0, 16, K::Private),
    v4(198, 18, 0, 0, 15, K::Benchmarking),
    v4(198, 51, 100, 0, 24, K::Documentation),
    v4(203, 0, 113, 0, 24, K::Documentation),
    v4(224, 0, 0, 0, 4, K::Multicast),
    v4(255, 255, 255, 255, 32, K::Broadcast),
    v4(240, 0, 0, 0, 4, K::Reserved),
];

/// Refused IPv6 ranges (after the IPv4-carrying forms, see [`embedded_v4`]); first match decides.
/// Sources: the IANA IPv6 Special-Purpose Address Registry and Address Space (only `2000::/3` is
/// allocated as global unicast), RFC 9637 (`3fff::/20`), RFC 9602 (`5f00::/16`).
pub const REFUSED_V6: &[(Ipv6Net, RangeKind)] = &[
    // AWS instance metadata over IPv6, EKS Pod Identity agent.
    v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128, K::CloudMetadata),
    v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23], 128, K::CloudMetadata),
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128, K::Unspecified),
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, K::Loopback),
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, K::Nat64Local),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, K::Discard),
    v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48, K::Benchmarking),
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, K::Documentation),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, K::IetfProtocol),
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, K::Documentation),
    v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16, K::Srv6),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, K::UniqueLocal),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, K::LinkLocal),
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, K::SiteLocal),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, K::Multicast),
    // Everything outside 2000::/3.
    v6([0, 0, 0, 0, 0, 0, 0, 0], 3, K::Reserved),
    v6([0x4000, 0, 0, 0, 0, 0, 0, 0], 2, K::Reserved),
    v6([0x8000, 0, 0, 0, 0, 0, 0, 0], 1, K::Reserved),
];

/// The networks exempt from the guard (`allow_networks` / `HERALD_ALLOW_NETWORKS`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<IpNet>);

impl AllowList {
    /// Comma-separated (or listed) CIDRs such as `127.0.0.0/8, fd12::/16`; a bare address is
    /// one host. Host bits are dropped (`10.1.2.3/8` is `10.0.0.0/8`).
    pub fn parse<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut nets = Vec::new();
        for item in items.into_iter().flat_map(|s| s.split(',')) {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let net = item
                .parse::<IpNet>()
                .map(|n| n.trunc())
                .or_else(|_| item.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("{item:?} is not a CIDR network such as 10.0.0.0/8"))?;
            nets.push(net);
        }
        Ok(Self(nets))
    }

    pub fn networks(&self) -> &[IpNet] {
        &self.0
    }

    /// Whether `ip`, refused as `kind`, is exempt: inside an allow-listed network — for a cloud
    /// metadata address, an entry naming that single address.
    fn permits(&self, ip: IpAddr, kind: RangeKind) -> bool {
        self.0.iter().any(|net| {
            net.contains(&ip)
                && (kind != K::CloudMetadata || net.prefix_len() == net.max_prefix_len())
        })
    }
}

/// An address the guard refuses, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub address: IpAddr,
    /// The IPv4 address an IPv6 form carries, when that decided.
    pub embedded: Option<(Embedding, Ipv4Addr)>,
    pub kind: RangeKind,
    pub network: IpNet,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.embedded {
            Some((e, v4)) => write!(
                f,
                "{} carries {v4} ({}), which is in {} ({})",
                self.address,
                e.as_str(),
                self.network,
                self.kind.as_str()
            ),
            None => write!(
                f,
                "{} is in {} ({})",
                self.address,
                self.network,
                self.kind.as_str()
            ),
        }
    }
}

impl std::error::Error for Refusal {}

/// The refused range `ip` is in, ignoring IPv4-carrying forms (see [`check`] for those).
pub fn range_of(ip: IpAddr) -> Option<(IpNet, RangeKind)> {
    match ip {
        IpAddr::V4(a) => REFUSED_V4
            .iter()
            .find(|(n, _)| n.contains(&a))
            .map(|(n, k)| (IpNet::V4(*n), *k)),
        IpAddr::V6(a) => REFUSED_V6
            .iter()
            .find(|(n, _)| n.contains(&a))
            .map(|(n, k)| (IpNet::V6(*n), *k)),
    }
}

/// The IPv4 addresses an IPv6 address carries, with the form (empty for other addresses).
/// `::` and `::1` carry none.
pub fn embedded_v4(a: Ipv6Addr) -> Vec<(Embedding, Ipv4Addr)> {
    let s = a.segments();
    let bits = u128::from(a);
    let low32 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    if s[..5] == [0; 5] && s[5] == 0xffff {
        return vec![(Embedding::Mapped, low32)];
    }
    if s[..6] == [0; 6] && bits > 1 {
        return vec![(Embedding::Compatible, low32)];
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return vec![(Embedding::Nat64, low32)];
    }
    if s[0] == 0x2002 {
        return vec![(
            Embedding::SixToFour,
            Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32),
        )];
    }
    if s[0] == 0x2001 && s[1] == 0 {
        return vec![
            (
                Embedding::TeredoServer,
                Ipv4Addr::from(((bits >> 64) & 0xffff_ffff) as u32),
            ),
            (
                Embedding::TeredoClient,
                Ipv4Addr::from(!((bits & 0xffff_ffff) as u32)),
            ),
        ];
    }
    Vec::new()
}

/// Whether Herald may connect to `ip`. Pure; the whole policy of this module.
pub fn check(ip: IpAddr, allow: &AllowList) -> Result<(), Refusal> {
    let refuse = |kind, network, embedded| Refusal {
        address: ip,
        embedded,
        kind,
        network,
    };
    let v6 = match ip {
        IpAddr::V4(_) => {
            return match range_of(ip) {
                Some((net, kind)) if !allow.permits(ip, kind) => Err(refuse(kind, net, None)),
                _ => Ok(()),
            };
        }
        IpAddr::V6(a) => a,
    };
    let carried = embedded_v4(v6);
    let Some(&(form, _)) = carried.first() else {
        if let Some((net, kind)) = range_of(ip)
            && !allow.permits(ip, kind)
        {
            return Err(refuse(kind, net, None));
        }
        // Local-use NAT64 (RFC 8215, `64:ff9b:1::/48`) and SIIT's IPv4-translated form
        // (`::ffff:0:a.b.c.d`), refused unless an entry lets them through: then judged by the
        // IPv4 address in their last 32 bits too, as a translator reads it (a metadata address
        // stays refused under `::/0`).
        let s = v6.segments();
        let form = if s[..3] == [0x64, 0xff9b, 1] {
            Some(Embedding::Nat64)
        } else if s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0 {
            Some(Embedding::Translated)
        } else {
            None
        };
        if let Some(form) = form {
            let inner = Ipv4Addr::from((u128::from(v6) & 0xffff_ffff) as u32);
            if let Err(r) = check(IpAddr::V4(inner), allow) {
                return Err(refuse(r.kind, r.network, Some((form, inner))));
            }
        }
        return Ok(());
    };
    // Judged by the IPv4 inside alone: only an IPv4 entry opens it. An IPv6 entry that covers
    // the outer address (`::/0`, `64:ff9b::/96`) does not, or allowing "all of IPv6" would
    // open IPv4 loopback and private networks through `::ffff:127.0.0.1`.
    for (form, inner) in carried {
        if let Err(r) = check(IpAddr::V4(inner), allow) {
            return Err(refuse(r.kind, r.network, Some((form, inner))));
        }
    }
    // The IPv4 inside is public. IPv4-compatible addresses are still refused: deprecated
    // (RFC 4291 §2.5.5.1) and not routed.
    if form == Embedding::Compatible && !allow.permits(ip, K::Ipv4Compatible) {
        let net = IpNet::V6(Ipv6Net::new_assert(Ipv6Addr::UNSPECIFIED, 96));
        return Err(refuse(K::Ipv4Compatible, net, None));
    }
    Ok(())
}

/// A URL whose host is an IP literal, checked now (the resolver never sees those); `Ok` for a
/// host name, which the resolver checks when it connects.
pub fn check_url_literal(url: &url::Url, allow: &AllowList) -> Result<(), Refusal> {
    match url.host() {
        Some(url::Host::Ipv4(a)) => check(IpAddr::V4(a), allow),
        Some(url::Host::Ipv6(a)) => check(IpAddr::V6(a), allow),
        _ => Ok(()),
    }
}

/// A host name that resolved only to refused addresses: the connection was never attempted.
#[derive(Debug, Clone)]
pub struct NameRefused {
    /// The first refused address, with why.
    pub refusal: Refusal,
    /// How many addresses the name resolved to (all refused).
    pub resolved: usize,
}

impl fmt::Display for NameRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "every address the host resolves to is refused ({} in all), e.g. {}",
            self.resolved, self.refusal
        )
    }
}

impl std::error::Error for NameRefused {}

/// The webhook client's DNS resolver: resolves a name once and returns only the addresses that
/// pass [`check`]; none left → [`NameRefused`], and no connection is attempted.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    allow: Arc<AllowList>,
}

impl GuardedResolver {
    pub fn new(allow: Arc<AllowList>) -> Self {
        Self { allow }
    }
}

/// The addresses of `resolved` that pass, or why none does.
pub fn vet(resolved: Vec<SocketAddr>, allow: &AllowList) -> Result<Vec<SocketAddr>, NameRefused> {
    let total = resolved.len();
    let mut first_refusal = None;
    let mut passed = Vec::new();
    for addr in resolved {
        match check(addr.ip(), allow) {
            Ok(()) => passed.push(addr),
            Err(r) => {
                first_refusal.get_or_insert(r);
            }
        }
    }
    match (passed.is_empty(), first_refusal) {
        (true, Some(refusal)) => Err(NameRefused {
            refusal,
            resolved: total,
        }),
        _ => Ok(passed),
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow = self.allow.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // Port 0: reqwest puts the URL's port (or the scheme's) in.
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let passed = vet(resolved, &allow)?;
            let addrs: reqwest::dns::Addrs = Box::new(passed.into_iter());
            Ok(addrs)
        })
    }
}

/// The guard's refusal inside a client error, if that is what stopped the request.
pub fn refusal_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a NameRefused> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(r) = c.downcast_ref::<NameRefused>() {
            return Some(r);
        }
        cause = c.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> AllowList {
        AllowList::default()
    }

    fn kind_of(ip: &str, allow: &AllowList) -> Option<RangeKind> {
        check(ip.parse().unwrap(), allow).err().map(|r| r.kind)
    }

    /// Written out by hand, independent of the tables: one or more addresses of every class.
    #[test]
    fn every_class_is_refused_v4() {
        let cases = [
            ("0.0.0.0", K::Unspecified),
            ("0.1.2.3", K::ThisNetwork),
            ("0.255.255.255", K::ThisNetwork),
            ("10.0.0.0", K::Private),
            ("10.255.255.255", K::Private),
            ("172.16.0.1", K::Private),
            ("172.31.255.255", K::Private),
            ("192.168.0.1", K::Private),
            ("192.168.255.255", K::Private),
            ("100.64.0.0", K::SharedAddressSpace),
            ("100.127.255.255", K::SharedAddressSpace),
            ("127.0.0.1", K::Loopback),
            ("127.255.255.254", K::Loopback),
            ("169.254.0.1", K::LinkLocal),
            ("169.254.255.255", K::LinkLocal),
            ("169.254.169.254", K::CloudMetadata),
            ("169.254.170.2", K::CloudMetadata),
            ("169.254.170.23", K::CloudMetadata),
            ("100.100.100.200", K::CloudMetadata),
            ("192.0.0.192", K::CloudMetadata),
            ("168.63.129.16", K::CloudMetadata),
            ("192.0.0.1", K::IetfProtocol),
            ("192.0.0.255", K::IetfProtocol),
            ("192.0.2.1", K::Documentation),
            ("198.51.100.7", K::Documentation),
            ("203.0.113.255", K::Documentation),
            ("198.18.0.0", K::Benchmarking),
            ("198.19.255.255", K::Benchmarking),
            ("192.88.99.1", K::Relay6to4),
            ("224.0.0.1", K::Multicast),
            ("239.255.255.255", K::Multicast),
            ("240.0.0.1", K::Reserved),
            ("255.255.255.254", K::Reserved),
            ("255.255.255.255", K::Broadcast),
        ];
        for (ip, kind) in cases {
            assert_eq!(kind_of(ip, &none()), Some(kind), "{ip}");
        }
    }

    #[test]
    fn public_v4_passes_including_the_neighbours_of_refused_ranges() {
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "191.255.255.255",
            "192.0.1.0",
            "192.0.3.0",
            "192.88.98.255",
            "192.88.100.0",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "198.51.99.255",
            "198.51.101.0",
            "203.0.112.255",
            "203.0.114.0",
            "223.255.255.255",
        ] {
            assert_eq!(kind_of(ip, &none()), None, "{ip}");
        }
    }

    #[test]
    fn every_class_is_refused_v6() {
        let cases = [
            ("::", K::Unspecified),
            ("::1", K::Loopback),
            ("fc00::1", K::UniqueLocal),
            ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", K::UniqueLocal),
            ("fd00:ec2::254", K::CloudMetadata),
            ("fd00:ec2::23", K::CloudMetadata),
            ("fe80::1", K::LinkLocal),
            ("febf:ffff::1", K::LinkLocal),
            ("fec0::1", K::SiteLocal),
            ("ff02::1", K::Multicast),
            ("ff0e::1", K::Multicast),
            ("2001:db8::1", K::Documentation),
            ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", K::Documentation),
            ("3fff::1", K::Documentation),
            ("3fff:0fff:ffff::1", K::Documentation),
            ("2001:2::1", K::Benchmarking),
            ("2001:2:0:ffff::1", K::Benchmarking),
            ("2001:10::1", K::IetfProtocol),
            ("2001:1ff::1", K::IetfProtocol),
            ("100::1", K::Discard),
            ("100::ffff:ffff:ffff:ffff", K::Discard),
            ("5f00::1", K::Srv6),
            ("64:ff9b:1::1", K::Nat64Local),
            // Outside 2000::/3.
            ("100:0:0:1::1", K::Reserved),
            ("1fff:ffff::1", K::Reserved),
            ("4000::1", K::Reserved),
            ("8000::1", K::Reserved),
            ("e000::1", K::Reserved),
            ("::ffff:0:7f00:1", K::Reserved), // SIIT "IPv4-translated": not routed here
        ];
        for (ip, kind) in cases {
            assert_eq!(kind_of(ip, &none()), Some(kind), "{ip}");
        }
    }

    #[test]
    fn public_v6_passes() {
        for ip in [
            "2606:4700:4700::1111",
            "2a00:1450:4001:82a::200e",
            "2000::1",
            "2001:200::1",
            "2001:db7:ffff::1",
            "2001:db9::1",
            "3ffe:ffff::1",
            "3fff:1000::1",
            "2001:4860:4860::8888",
        ] {
            assert_eq!(kind_of(ip, &none()), None, "{ip}");
        }
    }

    #[test]
    fn ipv4_carried_in_ipv6_is_judged_by_the_ipv4() {
        let cases = [
            ("::ffff:127.0.0.1", K::Loopback, Embedding::Mapped),
            ("::ffff:10.1.2.3", K::Private, Embedding::Mapped),
            (
                "::ffff:169.254.169.254",
                K::CloudMetadata,
                Embedding::Mapped,
            ),
            ("::ffff:0.0.0.0", K::Unspecified, Embedding::Mapped),
            ("::ffff:255.255.255.255", K::Broadcast, Embedding::Mapped),
            ("::127.0.0.1", K::Loopback, Embedding::Compatible),
            ("::192.168.1.1", K::Private, Embedding::Compatible),
            ("::0.0.0.2", K::ThisNetwork, Embedding::Compatible),
            ("64:ff9b::10.0.0.1", K::Private, Embedding::Nat64),
            (
                "64:ff9b::169.254.169.254",
                K::CloudMetadata,
                Embedding::Nat64,
            ),
            ("2002:7f00:1::", K::Loopback, Embedding::SixToFour),
            ("2002:a9fe:a9fe::1", K::CloudMetadata, Embedding::SixToFour),
            ("2002:c0a8:101:1::1", K::Private, Embedding::SixToFour),
            // Teredo: server 10.0.0.1; client 8.8.8.8 (stored inverted).
            (
                "2001:0:a00:1::f7f7:f7f7",
                K::Private,
                Embedding::TeredoServer,
            ),
            // Teredo: server 8.8.8.8; client 127.0.0.1 = !0x7f000001 = 0x80fffffe.
            (
                "2001:0:808:808::80ff:fffe",
                K::Loopback,
                Embedding::TeredoClient,
            ),
        ];
        for (ip, kind, form) in cases {
            let r = check(ip.parse().unwrap(), &none()).unwrap_err();
            assert_eq!(
                (r.kind, r.embedded.map(|e| e.0)),
                (kind, Some(form)),
                "{ip}"
            );
            assert!(r.to_string().contains(form.as_str()), "{r}");
        }
        // Public IPv4 inside: mapped, NAT64, 6to4 and Teredo pass ...
        for ip in [
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
            "2001:0:808:808::f7f7:f7f7",
        ] {
            assert_eq!(kind_of(ip, &none()), None, "{ip}");
        }
        // ... IPv4-compatible does not: deprecated, never routed.
        assert_eq!(kind_of("::8.8.8.8", &none()), Some(K::Ipv4Compatible));
    }

    #[test]
    fn every_table_boundary_is_refused() {
        for (net, _) in REFUSED_V4 {
            for ip in [net.network(), net.broadcast()] {
                assert!(check(IpAddr::V4(ip), &none()).is_err(), "{ip} in {net}");
            }
        }
        for (net, _) in REFUSED_V6 {
            for ip in [net.network(), net.broadcast()] {
                assert!(check(IpAddr::V6(ip), &none()).is_err(), "{ip} in {net}");
            }
        }
    }

    /// First match decides, so a range listed after a wider one would never be reported.
    #[test]
    fn no_table_entry_is_shadowed_by_an_earlier_one() {
        for (i, (net, _)) in REFUSED_V4.iter().enumerate() {
            for (wider, _) in &REFUSED_V4[..i] {
                assert!(!wider.contains(net), "{net} is shadowed by {wider}");
            }
        }
        for (i, (net, _)) in REFUSED_V6.iter().enumerate() {
            for (wider, _) in &REFUSED_V6[..i] {
                assert!(!wider.contains(net), "{net} is shadowed by {wider}");
            }
        }
    }

    #[test]
    fn allow_listed_networks_pass_also_in_carried_forms() {
        let allow = AllowList::parse(["127.0.0.0/8, 10.1.0.0/16", " fd12::/16 "]).unwrap();
        for ip in [
            "127.0.0.1",
            "127.9.9.9",
            "10.1.255.1",
            "::ffff:127.0.0.1",
            "64:ff9b::10.1.0.5",
            "fd12::1",
        ] {
            assert_eq!(kind_of(ip, &allow), None, "{ip}");
        }
        for (ip, kind) in [
            ("10.2.0.1", K::Private),
            ("::1", K::Loopback),
            ("fd13::1", K::UniqueLocal),
            ("192.168.1.1", K::Private),
            // Compatible is refused even when its IPv4 is allow-listed.
            ("::127.0.0.1", K::Ipv4Compatible),
        ] {
            assert_eq!(kind_of(ip, &allow), Some(kind), "{ip}");
        }
    }

    #[test]
    fn translated_and_local_use_nat64_forms_are_judged_by_the_ipv4_inside() {
        let wide = AllowList::parse(["0.0.0.0/0,::/0"]).unwrap();
        for ip in ["::ffff:0:169.254.169.254", "64:ff9b:1::a9fe:a9fe"] {
            assert_eq!(kind_of(ip, &wide), Some(K::CloudMetadata), "{ip}");
        }
        // Let through by an entry naming the range, the IPv4 inside is still judged.
        let local = AllowList::parse(["64:ff9b:1::/48"]).unwrap();
        assert_eq!(kind_of("64:ff9b:1::7f00:1", &local), Some(K::Loopback));
        assert_eq!(kind_of("64:ff9b:1::a00:1", &local), Some(K::Private));
        assert_eq!(kind_of("64:ff9b:1::808:808", &local), None);
        let wide = AllowList::parse(["0.0.0.0/0,::/0"]).unwrap();
        assert_eq!(kind_of("::ffff:0:8.8.8.8", &wide), None);
    }

    #[test]
    fn an_ipv6_entry_never_opens_the_ipv4_inside() {
        for entries in [
            "::/0",
            "::ffff:0:0/96",
            "64:ff9b::/96",
            "2002::/16",
            "2001::/32",
        ] {
            let allow = AllowList::parse([entries]).unwrap();
            for (ip, kind) in [
                ("::ffff:127.0.0.1", K::Loopback),
                ("64:ff9b::7f00:1", K::Loopback),
                ("2002:7f00:1::", K::Loopback),
                ("64:ff9b::10.0.0.1", K::Private),
            ] {
                assert_eq!(kind_of(ip, &allow), Some(kind), "{entries}: {ip}");
            }
            // A public IPv4 inside passes, as without the entry.
            assert_eq!(kind_of("64:ff9b::8.8.8.8", &allow), None, "{entries}");
        }
    }

    #[test]
    fn metadata_needs_its_own_host_entry() {
        let wide = AllowList::parse(["0.0.0.0/0,::/0"]).unwrap();
        assert_eq!(kind_of("10.0.0.1", &wide), None);
        assert_eq!(kind_of("fd00::1", &wide), None);
        for ip in ["169.254.169.254", "::ffff:169.254.169.254", "fd00:ec2::254"] {
            assert_eq!(kind_of(ip, &wide), Some(K::CloudMetadata), "{ip}");
        }
        let link = AllowList::parse(["169.254.0.0/16"]).unwrap();
        assert_eq!(kind_of("169.254.1.1", &link), None);
        assert_eq!(kind_of("169.254.169.254", &link), Some(K::CloudMetadata));
        let exact = AllowList::parse(["169.254.169.254"]).unwrap();
        assert_eq!(kind_of("169.254.169.254", &exact), None);
        assert_eq!(kind_of("::ffff:169.254.169.254", &exact), None);
    }

    #[test]
    fn allow_list_parsing() {
        assert_eq!(AllowList::parse([""]).unwrap(), AllowList::default());
        assert_eq!(AllowList::parse([" , "]).unwrap(), AllowList::default());
        let a = AllowList::parse(["10.1.2.3/8", "::1"]).unwrap();
        assert_eq!(
            a.networks(),
            ["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()]
        );
        for bad in ["10.0.0.0/33", "localhost", "10.0.0/8", "fe80::/129"] {
            let m = AllowList::parse([bad]).unwrap_err();
            assert!(m.contains(bad) && m.contains("CIDR"), "{m}");
        }
    }

    #[test]
    fn refusals_read_clearly() {
        let r = check("10.0.0.1".parse().unwrap(), &none()).unwrap_err();
        assert_eq!(r.to_string(), "10.0.0.1 is in 10.0.0.0/8 (private)");
        let r = check("::ffff:169.254.169.254".parse().unwrap(), &none()).unwrap_err();
        assert_eq!(
            r.to_string(),
            "::ffff:169.254.169.254 carries 169.254.169.254 (IPv4-mapped), which is in \
             169.254.169.254/32 (cloud metadata service)"
        );
    }

    #[test]
    fn url_literals_including_the_odd_spellings() {
        let literal = |u: &str| check_url_literal(&url::Url::parse(u).unwrap(), &none());
        for u in [
            "http://127.0.0.1:8080/h",
            "http://2130706433/h",   // 127.0.0.1 as one number
            "http://0x7f.1/h",       // hex and short forms
            "http://017700000001/h", // octal
            "http://[::ffff:7f00:1]/h",
            "http://[::1]/h",
            "http://0/h",
        ] {
            assert!(literal(u).is_err(), "{u}");
        }
        assert!(literal("https://93.184.215.14/h").is_ok());
        assert!(
            literal("https://localhost/h").is_ok(),
            "names: checked at resolution"
        );
    }

    #[test]
    fn resolution_keeps_only_vetted_addresses() {
        let allow = AllowList::parse(["127.0.0.0/8"]).unwrap();
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            vet(vec![sa("[::1]:0"), sa("127.0.0.1:0")], &allow).unwrap(),
            [sa("127.0.0.1:0")]
        );
        assert_eq!(
            vet(vec![sa("10.0.0.1:0"), sa("93.184.215.14:0")], &none()).unwrap(),
            [sa("93.184.215.14:0")]
        );
        let e = vet(vec![sa("[::1]:0"), sa("127.0.0.1:0")], &none()).unwrap_err();
        assert_eq!(e.refusal.address, "::1".parse::<IpAddr>().unwrap());
        assert!(e.to_string().contains("(2 in all)"), "{e}");
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_by_the_resolver() {
        use reqwest::dns::Resolve;
        let r = GuardedResolver::new(Arc::new(none()));
        let err = r
            .resolve("localhost".parse().unwrap())
            .await
            .err()
            .expect("refused");
        let refused = refusal_in(&*err).expect("a guard refusal");
        assert_eq!(refused.refusal.kind, K::Loopback);
        let allowed = GuardedResolver::new(Arc::new(AllowList::parse(["127.0.0.0/8"]).unwrap()));
        let addrs: Vec<_> = allowed
            .resolve("localhost".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert!(!addrs.is_empty());
        assert!(
            addrs.iter().all(|a| a.ip().is_loopback() && a.is_ipv4()),
            "{addrs:?}"
        );
    }
}
