//! Why a call to a backend failed before its answer could be relayed: the
//! cause inside [`ApiError::Upstream`](super::error::ApiError::Upstream).
//! Every cause is the backend's fault; whether sending the request again
//! can help depends on whether any of it reached the backend.

use std::time::Duration;

use http::uri::Authority;

use crate::fault::Blame;

/// Why a backend call failed; the underlying error is its `source`.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be opened: refused, reset, or the name has no
    /// address. Nothing was sent.
    #[error("connecting to {authority}")]
    Connect {
        authority: Authority,
        #[source]
        source: std::io::Error,
    },
    /// No connection within the connect timeout. Nothing was sent.
    #[error("connecting to {authority}: no connection within {after:?}")]
    ConnectTimeout {
        authority: Authority,
        after: Duration,
    },
    /// The backend's HTTP could not be read: a malformed or oversized
    /// response head.
    #[error(transparent)]
    BadAnswer(hyper::Error),
    /// The exchange broke after the request was handed to a connection
    /// (closed, reset, cut short).
    #[error(transparent)]
    Broke(hyper::Error),
    /// A call through the shared client failed (connecting or the
    /// exchange).
    #[error(transparent)]
    Client(hyper_util::client::legacy::Error),
    /// No response head within the call's own limit.
    #[error("no answer in time")]
    NoAnswer,
    /// The response body did not arrive in time.
    #[error("body not in time")]
    BodyTimeout,
    /// The response body broke off or was over its limit.
    #[error(transparent)]
    Body(Box<dyn std::error::Error + Send + Sync>),
}

impl From<hyper::Error> for UpstreamError {
    fn from(e: hyper::Error) -> Self {
        if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
            UpstreamError::BadAnswer(e)
        } else {
            UpstreamError::Broke(e)
        }
    }
}

impl UpstreamError {
    /// Whether the backend could not be reached at all: the request never
    /// left, so another backend may take it.
    pub fn is_connect(&self) -> bool {
        matches!(
            self,
            UpstreamError::Connect { .. } | UpstreamError::ConnectTimeout { .. }
        )
    }

    /// Whose fault it is: always the backend's (or the network's to it).
    pub fn blame(&self) -> Blame {
        Blame::Backend
    }

    /// Whether sending the request again, to this backend or another, can
    /// help and is safe: only when nothing of it reached the backend.
    pub fn retryable(&self) -> bool {
        self.is_connect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::Chain;

    #[test]
    fn a_refused_connection_reads_as_before_and_may_go_elsewhere() {
        let e = UpstreamError::Connect {
            authority: Authority::from_static("10.0.0.5:8000"),
            source: std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused"),
        };
        assert_eq!(
            Chain(&e).to_string(),
            "connecting to 10.0.0.5:8000: refused"
        );
        assert!(e.retryable());
        assert_eq!(e.blame(), Blame::Backend);
        assert!(!UpstreamError::NoAnswer.retryable());
    }
}
