//! Stopping a Triton generate call whose client went away: TensorRT-LLM's
//! LLM-API model takes `{"stop": true}` on the same URL with the call's
//! `triton-request-id`.

use std::time::Duration;

use crate::gateway::connections;
use crate::gateway::upstream::{Address, whole};

/// The TensorRT-LLM LLM-API model's cancellation: the same generate URL
/// (`path` at `address`) with `{"stop": true}` and the call's
/// `triton-request-id`.
#[derive(Debug, Clone)]
pub struct StopCall {
    pub address: Address,
    pub path: String,
    pub request_id: http::HeaderValue,
}

impl StopCall {
    /// Sends it in the background (at most 5 s); the outcome is the
    /// cancelled call's, whatever the answer.
    pub fn send(self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(req) = http::Request::post(&self.path)
            .header(http::header::HOST, self.address.host.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("triton-request-id", self.request_id)
            .body(whole(bytes::Bytes::from_static(
                br#"{"text_input": "", "stop": true}"#,
            )))
        else {
            return;
        };
        handle.spawn(async move {
            let call = connections::send(&self.address.authority, req);
            match tokio::time::timeout(Duration::from_secs(5), call).await {
                Ok(Ok(r)) => tracing::debug!(status = r.status().as_u16(), "stop request sent"),
                Ok(Err(e)) => {
                    tracing::debug!(error = %crate::fault::Chain(&e), "stop request failed");
                }
                Err(_) => tracing::debug!("stop request timed out"),
            }
        });
    }
}
