//! The one scrape helper: a `GET` with a deadline over the whole exchange
//! and a cap on the body, for the pollers' health probes and scrapes and
//! placement's reads of the node agents.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full, Limited};

use super::client::{Client, cause};

/// Why a `GET` (a health probe or a scrape) gave no usable answer.
#[derive(Debug)]
pub enum ScrapeError {
    /// No HTTP answer: connection failed, reset, or no response head
    /// within the timeout.
    Unreachable(String),
    /// Answered, but not with a usable reading (an error status, a body
    /// that is too large, broken or late, or one that does not decode).
    Unusable(String),
}

impl std::fmt::Display for ScrapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScrapeError::Unreachable(c) | ScrapeError::Unusable(c) => f.write_str(c),
        }
    }
}

/// One `GET` with a deadline over the whole exchange, body included. No
/// response head in time is `Unreachable`; a head followed by a body that
/// is too large, broken or not complete in time is `Unusable`.
pub async fn get(
    client: &Client,
    url: &str,
    timeout: Duration,
    limit: usize,
) -> Result<(http::StatusCode, Bytes), ScrapeError> {
    let req = Request::get(url)
        .header(header::ACCEPT, "text/plain, application/json")
        .body(Full::new(Bytes::new()))
        .map_err(|e| ScrapeError::Unreachable(e.to_string()))?;
    let deadline = tokio::time::Instant::now() + timeout;
    let late = || format!("no answer within {}", humantime::format_duration(timeout));
    let resp = match tokio::time::timeout_at(deadline, client.request(req)).await {
        Err(_) => return Err(ScrapeError::Unreachable(late())),
        Ok(Err(e)) => return Err(ScrapeError::Unreachable(cause(&e))),
        Ok(Ok(resp)) => resp,
    };
    let status = resp.status();
    let body = Limited::new(resp.into_body(), limit).collect();
    match tokio::time::timeout_at(deadline, body).await {
        Err(_) => Err(ScrapeError::Unusable(format!(
            "answered {status} but the body did not arrive within {}",
            humantime::format_duration(timeout)
        ))),
        Ok(Err(e)) => Err(ScrapeError::Unusable(format!(
            "answered {status} but reading the body failed: {e}"
        ))),
        Ok(Ok(b)) => Ok((status, b.to_bytes())),
    }
}
