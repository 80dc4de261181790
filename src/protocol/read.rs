//! Reading a client's request body: whole within a timeout, and what a
//! failed read means (too large, the client gone, or a bad request).

use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;

use super::error::ApiError;
use crate::net::body::{BodyError, RequestBody};

/// Reads the whole body within `timeout` (408 after it); the edge's body
/// limit caps it at `limit`. A client that hangs up mid-body is
/// `cancelled`, not a bad request.
pub async fn read_body(
    req: Request<RequestBody>,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<(http::request::Parts, Bytes), ApiError> {
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(timeout, body.collect()).await {
        Err(_) => Err(ApiError::BodyTimeout(timeout)),
        Ok(Ok(c)) => Ok((parts, c.to_bytes())),
        Ok(Err(e)) => Err(read_error(&e, limit)),
    }
}

/// A failed read of a client's body under the edge's `limit`: too large,
/// the client gone, or a bad request.
pub fn read_error(e: &BodyError, limit: usize) -> ApiError {
    if e.is::<http_body_util::LengthLimitError>() {
        ApiError::BodyTooLarge(limit)
    } else if client_went_away(&**e) {
        ApiError::ClientGone
    } else {
        ApiError::InvalidRequest(format!("Could not read request body: {e}"))
    }
}

/// True when a body read failed because the client's side of the
/// connection ended (hyper reports an unexpected EOF inside a body error).
pub fn client_went_away(e: &(dyn std::error::Error + 'static)) -> bool {
    let Some(h) = e.downcast_ref::<hyper::Error>() else {
        return false;
    };
    let eof = std::error::Error::source(h)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
            )
        });
    eof || h.is_incomplete_message() || h.is_canceled() || h.is_closed()
}
