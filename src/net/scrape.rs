//! The one scrape helper: a `GET` with a deadline over the whole exchange,
//! a cap on the body and a 2xx required, for the pollers' health probes,
//! scrapes and model lists, the agent's engine scrape, placement's reads
//! of the node agents and `fairway top`. One error type, naming the URL.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};

use super::client::{Client, cause};

/// Why a `GET` gave no usable answer. Every variant names the URL.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The URL does not parse.
    #[error("{url} is not a URL")]
    Url { url: String },
    /// No HTTP answer: the connection failed or broke before the response
    /// head, or no head came within the timeout.
    #[error("{url}: {cause}")]
    Unreachable { url: String, cause: String },
    /// The server answered, but not with a success.
    #[error("{url} answered {status}")]
    Status { url: String, status: StatusCode },
    /// The server answered, but its body was larger than the cap, broke
    /// off, or did not arrive within the timeout.
    #[error("{url} answered {status} but {cause}")]
    Body {
        url: String,
        status: StatusCode,
        cause: String,
    },
    /// The body is not what its reader takes (not UTF-8, not the metrics
    /// it decodes, not the JSON it expects).
    #[error("{url}: {cause}")]
    Unusable { url: String, cause: String },
}

impl ScrapeError {
    /// Whether no HTTP answer came at all (the poller ejects such a
    /// backend; an answer it cannot use only lets its reading go stale).
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            ScrapeError::Url { .. } | ScrapeError::Unreachable { .. }
        )
    }

    /// `url`'s body, which its reader could not use because of `cause`.
    pub fn unusable(url: &str, cause: impl std::fmt::Display) -> Self {
        ScrapeError::Unusable {
            url: url.to_owned(),
            cause: cause.to_string(),
        }
    }
}

/// One `GET url` within `timeout` (response head and body together), its
/// body capped at `limit` bytes; anything but a 2xx answer is an error.
pub async fn get(
    client: &Client,
    url: &str,
    timeout: Duration,
    limit: usize,
) -> Result<Bytes, ScrapeError> {
    let uri: Uri = url.parse().map_err(|_| ScrapeError::Url {
        url: url.to_owned(),
    })?;
    let mut req = Request::new(Full::new(Bytes::new()));
    *req.uri_mut() = uri;
    let headers = req.headers_mut();
    headers.insert(
        header::ACCEPT,
        HeaderValue::from_static("text/plain, application/json"),
    );
    headers.insert(header::USER_AGENT, HeaderValue::from_static("fairway"));
    let deadline = tokio::time::Instant::now() + timeout;
    let late = || format!("no answer within {}", humantime::format_duration(timeout));
    let unreachable = |cause: String| ScrapeError::Unreachable {
        url: url.to_owned(),
        cause,
    };
    let resp = match tokio::time::timeout_at(deadline, client.request(req)).await {
        Err(_) => return Err(unreachable(late())),
        Ok(Err(e)) => return Err(unreachable(cause(&e))),
        Ok(Ok(resp)) => resp,
    };
    let status = resp.status();
    if !status.is_success() {
        return Err(ScrapeError::Status {
            url: url.to_owned(),
            status,
        });
    }
    let body_error = |cause: String| ScrapeError::Body {
        url: url.to_owned(),
        status,
        cause,
    };
    let body = Limited::new(resp.into_body(), limit).collect();
    match tokio::time::timeout_at(deadline, body).await {
        Err(_) => Err(body_error(format!(
            "the body did not arrive within {}",
            humantime::format_duration(timeout)
        ))),
        Ok(Err(e)) if e.is::<LengthLimitError>() => {
            Err(body_error(format!("the body is over {limit} bytes")))
        }
        Ok(Err(e)) => Err(body_error(format!("reading the body failed: {e}"))),
        Ok(Ok(b)) => Ok(b.to_bytes()),
    }
}
