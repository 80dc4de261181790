//! Header names Fairway gives a meaning of its own, and the few headers
//! it reads the same way everywhere.

use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName, HeaderValue, header};

/// The request's id, as the backends and most clients name it: set on
/// every request and response by the edge, logged on the access line.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The address of the client connection a request came on, set by the
/// edge in each request's extensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

/// The credentials of an `Authorization: Bearer …` header, the scheme
/// matched without regard to case (RFC 9110 §11.1: `bearer` is the same
/// scheme), trimmed; `None` for another scheme or none.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, credentials) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credentials.trim())
}

/// The `X-Forwarded-For` a backend gets for a request from `peer` whose
/// own header was `given` (every value, in order): the last `trusted_hops`
/// addresses of `given` (those the proxies in front of Fairway added),
/// then `peer`. With no trusted hops, whatever the client wrote is
/// dropped: a client cannot choose the address a backend logs.
pub fn forwarded_for<'a>(
    given: impl Iterator<Item = &'a HeaderValue>,
    peer: IpAddr,
    trusted_hops: u32,
) -> Option<HeaderValue> {
    let mut kept: Vec<&str> = Vec::new();
    if trusted_hops > 0 {
        let all: Vec<&str> = given
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect();
        let from = all.len().saturating_sub(trusted_hops as usize);
        kept.extend_from_slice(&all[from..]);
    }
    let peer = peer.to_string();
    kept.push(&peer);
    HeaderValue::from_str(&kept.join(", ")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_matched_whatever_its_case() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
            bearer(&h).map(str::to_owned)
        };
        assert_eq!(with("Bearer k1").as_deref(), Some("k1"));
        assert_eq!(with("bearer k1").as_deref(), Some("k1"));
        assert_eq!(with("BEARER  k1 ").as_deref(), Some("k1"));
        assert_eq!(with("Basic k1"), None);
        assert_eq!(with("Bearerk1"), None);
    }

    #[test]
    fn forwarded_for_keeps_only_the_trusted_hops_and_adds_the_peer() {
        let v = |s: &str| HeaderValue::from_str(s).unwrap();
        let given = [v("6.6.6.6, 10.0.0.1"), v("10.0.0.2")];
        let peer: IpAddr = "10.0.0.3".parse().unwrap();
        let xff = |hops| forwarded_for(given.iter(), peer, hops).unwrap();
        assert_eq!(xff(0), "10.0.0.3");
        assert_eq!(xff(1), "10.0.0.2, 10.0.0.3");
        assert_eq!(xff(2), "10.0.0.1, 10.0.0.2, 10.0.0.3");
        assert_eq!(xff(9), "6.6.6.6, 10.0.0.1, 10.0.0.2, 10.0.0.3");
    }
}
