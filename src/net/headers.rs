//! Header names Fairway gives a meaning of its own, and the few headers
//! it reads the same way everywhere.

use http::{HeaderMap, HeaderName, HeaderValue, header};

/// The request's id, as the backends and most clients name it: set on
/// every request and response by the edge, logged on the access line.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// `X-Forwarded-For`: the edge appends each request's client address to
/// it, and the backends get it as [`forwarded_for`] makes it.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

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

/// The `X-Forwarded-For` a backend gets for a request whose header, as
/// the edge passes it on, is `given` (every value, in order; the edge
/// appended the client connection's address last): the last
/// `trusted_hops` addresses the client sent (those the proxies in front of
/// Fairway added), then the connection's. With no trusted hops, whatever
/// the client wrote is dropped: a client cannot choose the address a
/// backend logs. `None` for a request the edge did not see (a batch item).
pub fn forwarded_for<'a>(
    mut given: impl DoubleEndedIterator<Item = &'a HeaderValue>,
    trusted_hops: u32,
) -> Option<HeaderValue> {
    let peer = given.next_back()?;
    if trusted_hops == 0 {
        return Some(peer.clone());
    }
    let all: Vec<&str> = given
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    let from = all.len().saturating_sub(trusted_hops as usize);
    let mut kept = all[from..].to_vec();
    kept.push(peer.to_str().ok()?);
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
        // What the client sent, then the address the edge appended.
        let given = [v("6.6.6.6, 10.0.0.1"), v("10.0.0.2"), v("10.0.0.3")];
        let xff = |hops| forwarded_for(given.iter(), hops).unwrap();
        assert_eq!(xff(0), "10.0.0.3");
        assert_eq!(xff(1), "10.0.0.2, 10.0.0.3");
        assert_eq!(xff(2), "10.0.0.1, 10.0.0.2, 10.0.0.3");
        assert_eq!(xff(9), "6.6.6.6, 10.0.0.1, 10.0.0.2, 10.0.0.3");
        assert_eq!(forwarded_for([].iter(), 1), None);
    }
}
