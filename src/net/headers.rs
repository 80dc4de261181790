//! Header names Fairway gives a meaning of its own.

use http::HeaderName;

/// The request's id, as the backends and most clients name it: set on
/// every request and response by the edge, logged on the access line.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
