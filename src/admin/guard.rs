//! The admin page's checks on a request, as pure functions over header values: is a `POST` from
//! the page itself (not another site), and did the browser reach Herald over TLS (so the cookie
//! gets `Secure`).

/// Why a `POST` is refused as cross-site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CrossSite {
    #[error("the form was not sent from this site (Sec-Fetch-Site)")]
    FetchSite,
    #[error("the form was not sent from this site (Origin)")]
    Origin,
    #[error("the browser sent neither Origin nor Sec-Fetch-Site")]
    Unknown,
}

/// Whether a `POST` comes from a page of this very site. `Sec-Fetch-Site`, which a browser sets
/// and no page can, decides when present: only `same-origin` passes. Without it, `Origin` must
/// name the host the request was sent to (the `Host` header; a reverse proxy must pass it on).
/// With neither (no browser sends neither on a `POST`), the request is refused.
pub fn same_origin(
    sec_fetch_site: Option<&str>,
    origin: Option<&str>,
    host: Option<&str>,
) -> Result<(), CrossSite> {
    if let Some(site) = sec_fetch_site {
        return if site.trim().eq_ignore_ascii_case("same-origin") {
            Ok(())
        } else {
            Err(CrossSite::FetchSite)
        };
    }
    let Some(origin) = origin else {
        return Err(CrossSite::Unknown);
    };
    let origin_host = url::Url::parse(origin.trim()).ok().and_then(|u| {
        let host = u.host_str()?.to_ascii_lowercase();
        Some(match u.port() {
            Some(p) => format!("{host}:{p}"),
            None => host,
        })
    });
    match (origin_host, host) {
        (Some(o), Some(h)) if o == h.trim().to_ascii_lowercase() => Ok(()),
        _ => Err(CrossSite::Origin),
    }
}

/// Whether the browser reached Herald over TLS: the connection itself, or a reverse proxy that
/// says so (`X-Forwarded-Proto: https`, or `proto=https` in `Forwarded`). These headers are
/// trusted without knowing the proxy because all they can do is *add* `Secure` to the cookie
/// (a forged one makes the browser keep the cookie for https only); a proxy that terminates TLS
/// must set one of them, or the cookie goes out without `Secure`.
pub fn over_tls(tls: bool, x_forwarded_proto: Option<&str>, forwarded: Option<&str>) -> bool {
    let xfp = x_forwarded_proto
        .and_then(|v| v.split(',').next())
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("https"));
    let fwd = forwarded
        .and_then(|v| v.split(',').next())
        .is_some_and(|first| {
            first.split(';').any(|pair| {
                pair.split_once('=').is_some_and(|(k, v)| {
                    k.trim().eq_ignore_ascii_case("proto")
                        && v.trim().trim_matches('"').eq_ignore_ascii_case("https")
                })
            })
        });
    tls || xfp || fwd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_same_origin_posts_pass() {
        let h = Some("herald.example:8080");
        let cases = [
            (Some("same-origin"), None, h, Ok(())),
            (Some("same-origin"), Some("https://evil.example"), h, Ok(())),
            (Some("same-site"), None, h, Err(CrossSite::FetchSite)),
            (Some("cross-site"), None, h, Err(CrossSite::FetchSite)),
            (Some("none"), None, h, Err(CrossSite::FetchSite)),
            (None, Some("http://herald.example:8080"), h, Ok(())),
            (None, Some("https://HERALD.example:8080"), h, Ok(())),
            (
                None,
                Some("http://herald.example"),
                h,
                Err(CrossSite::Origin),
            ),
            (
                None,
                Some("http://herald.example:8080.evil.example"),
                h,
                Err(CrossSite::Origin),
            ),
            (None, Some("null"), h, Err(CrossSite::Origin)),
            (
                None,
                Some("http://herald.example:8080"),
                None,
                Err(CrossSite::Origin),
            ),
            (None, None, h, Err(CrossSite::Unknown)),
        ];
        for (site, origin, host, want) in cases {
            assert_eq!(same_origin(site, origin, host), want, "{site:?} {origin:?}");
        }
    }

    #[test]
    fn tls_from_the_connection_or_the_proxy() {
        assert!(!over_tls(false, None, None));
        assert!(over_tls(true, None, None));
        assert!(over_tls(false, Some("https"), None));
        assert!(over_tls(false, Some("HTTPS, http"), None));
        assert!(!over_tls(false, Some("http, https"), None), "the first hop");
        assert!(over_tls(false, None, Some("for=1.2.3.4;proto=https;by=x")));
        assert!(over_tls(false, None, Some("proto=\"https\"")));
        assert!(!over_tls(false, None, Some("proto=http, proto=https")));
    }
}
