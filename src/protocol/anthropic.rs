//! Anthropic's Messages API (`/v1/messages`): its error shape. What is
//! read of its body is the OpenAI reader's (`openai::parse`, which knows
//! its fields); its usage (`message_start`, `message_delta`) is read by
//! the shared usage reader (`usage.rs`).

use bytes::Bytes;
use http::Response;

use super::error::ApiError;
use crate::net::body::{self, BoxBody};

impl ApiError {
    /// The same response in the shape of Anthropic's errors on
    /// `/v1/messages`: `{"type": "error", "error": {"type", "message"}}`,
    /// its `type` from the status as Anthropic's API gives it, with the
    /// same status and headers (`retry-after` included).
    pub fn into_anthropic_response(self) -> Response<BoxBody> {
        let message = self.to_string();
        let kind = match self.status().as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            504 => "timeout_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        };
        let mut resp = self.into_response();
        *resp.body_mut() = body::full(Bytes::from(
            serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
                .to_string(),
        ));
        resp
    }
}
