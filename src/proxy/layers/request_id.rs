//! `x-request-id`: the client's when it is usable, else one we make.
//!
//! tower-http's `SetRequestId` keeps any id the client sent and
//! `PropagateRequestId` copies it to the response; this file adds what they
//! leave to us: which client ids to trust, and how ours are made.

use http::{HeaderValue, Request};
use tower_http::request_id::{MakeRequestId, RequestId};

/// The header, as tower-http and the backends name it.
pub const X_REQUEST_ID: &str = "x-request-id";

/// Longest client id kept; longer ones are replaced.
const MAX_LEN: usize = 128;

/// Removes a client `x-request-id` that is empty, too long or not visible
/// ASCII (it would be logged, sent to the backend and echoed back), or sent
/// twice, so that `SetRequestId` replaces it with one of ours.
pub fn drop_invalid_request_id<B>(mut req: Request<B>) -> Request<B> {
    let h = req.headers_mut();
    let mut values = h.get_all(X_REQUEST_ID).iter();
    let valid = match (values.next(), values.next()) {
        (Some(v), None) => is_valid(v),
        (None, _) => true,
        (Some(_), Some(_)) => false,
    };
    if !valid {
        h.remove(X_REQUEST_ID);
    }
    req
}

fn is_valid(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty() && b.len() <= MAX_LEN && b.iter().all(|c| c.is_ascii_graphic())
}

/// Makes a request id: 128 random bits as 32 lowercase hex digits.
#[derive(Clone, Copy, Debug, Default)]
pub struct MakeId;

impl MakeRequestId for MakeId {
    fn make_request_id<B>(&mut self, _: &Request<B>) -> Option<RequestId> {
        let id = format!("{:032x}", rand::random::<u128>());
        HeaderValue::from_str(&id).ok().map(RequestId::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(values: &[&[u8]]) -> Request<()> {
        let mut r = Request::new(());
        for v in values {
            if let Ok(v) = HeaderValue::from_bytes(v) {
                r.headers_mut().append(X_REQUEST_ID, v);
            }
        }
        drop_invalid_request_id(r)
    }

    #[test]
    fn keeps_a_usable_client_id_and_drops_the_rest() {
        assert_eq!(with(&[b"abc-123"]).headers()[X_REQUEST_ID], "abc-123");
        assert!(with(&[]).headers().get(X_REQUEST_ID).is_none());
        assert!(with(&[b""]).headers().get(X_REQUEST_ID).is_none());
        assert!(with(&[b"a b"]).headers().get(X_REQUEST_ID).is_none());
        assert!(with(&[&[b'x'; 129]]).headers().get(X_REQUEST_ID).is_none());
        assert!(with(&[b"a", b"b"]).headers().get(X_REQUEST_ID).is_none());
        assert!(
            with(&[b"caf\xc3\xa9"])
                .headers()
                .get(X_REQUEST_ID)
                .is_none()
        );
    }

    #[test]
    fn made_ids_are_32_hex_digits_and_differ() {
        let r = Request::new(());
        let a = MakeId.make_request_id(&r).map(RequestId::into_header_value);
        let b = MakeId.make_request_id(&r).map(RequestId::into_header_value);
        let a = a.unwrap_or_else(|| HeaderValue::from_static(""));
        assert_eq!(a.len(), 32);
        assert!(a.as_bytes().iter().all(u8::is_ascii_hexdigit));
        assert_ne!(Some(a), b);
    }
}
