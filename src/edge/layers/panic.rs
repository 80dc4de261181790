//! A panic in a handler becomes a 500 with an OpenAI error body, instead of
//! a connection dropped with no answer (tower-http's `CatchPanic` catches
//! it; this is the response it gives). The request's outcome is recorded
//! once, by its ticket, which is dropped while the panic unwinds.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::Response;
use tower_http::catch_panic::ResponseForPanic;

use crate::gateway::state::Gateway;
use crate::net::body::BoxBody;
use crate::protocol::error::ApiError;

/// The response to a handler panic.
#[derive(Clone)]
pub struct PanicResponse {
    gw: Arc<Gateway>,
}

impl PanicResponse {
    pub fn new(gw: Arc<Gateway>) -> Self {
        PanicResponse { gw }
    }
}

impl ResponseForPanic for PanicResponse {
    type ResponseBody = BoxBody;

    fn response_for_panic(&mut self, err: Box<dyn Any + Send + 'static>) -> Response<BoxBody> {
        let message = err
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| err.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_owned());
        static LOG: crate::clock::Throttled =
            crate::clock::Throttled::new(crate::clock::REMOTE_LOG_EVERY);
        if let Some(left_out) = LOG.allow() {
            tracing::error!(panic = %message, left_out, "request handler panicked");
        }
        self.gw
            .metrics()
            .edge
            .panics
            .fetch_add(1, Ordering::Relaxed);
        ApiError::Internal("the request handler failed".into()).into_response()
    }
}
