//! [`Scraper`]: one `GET /metrics` of the gateway's admin listener, read
//! into a [`Snapshot`] stamped with the moment the answer came.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::Snapshot;
use crate::clock::Clock;

/// How long the gateway has to answer a scrape with its headers.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why one scrape gave no [`Snapshot`]. Every variant names the URL.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The admin address does not make an `http://ADDR/metrics` URL.
    #[error("{url} is not a URL")]
    Url {
        url: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    /// No connection, or it broke before the response headers.
    #[error("scraping {url}")]
    Connect {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// No response headers within [`SCRAPE_TIMEOUT`].
    #[error("{url}: no answer in {} s", SCRAPE_TIMEOUT.as_secs())]
    Timeout { url: String },
    /// The server answered, but not with a success.
    #[error("{url} answered {status}")]
    Status { url: String, status: StatusCode },
    /// The body broke off.
    #[error("reading the body of {url}")]
    Body {
        url: String,
        #[source]
        source: hyper::Error,
    },
    /// The body is not a Prometheus exposition with `fairway_` metrics.
    #[error("{url}: {reason}")]
    NotMetrics { url: String, reason: String },
}

/// Scrapes one gateway's admin `/metrics`.
#[derive(Debug)]
pub struct Scraper {
    client: Client<HttpConnector, Full<Bytes>>,
    url: String,
    uri: Uri,
    clock: Clock,
}

impl Scraper {
    /// A scraper of `http://{admin}/metrics`.
    pub fn new(admin: &str) -> Result<Scraper, ScrapeError> {
        let url = format!("http://{admin}/metrics");
        let uri = url.parse().map_err(|source| ScrapeError::Url {
            url: url.clone(),
            source,
        })?;
        Ok(Scraper {
            client: Client::builder(TokioExecutor::new()).build_http(),
            url,
            uri,
            clock: Clock::new(),
        })
    }

    /// One scrape, stamped with this scraper's clock when the body is in.
    pub async fn scrape(&self) -> Result<Snapshot, ScrapeError> {
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.uri_mut() = self.uri.clone();
        let resp = tokio::time::timeout(SCRAPE_TIMEOUT, self.client.request(req))
            .await
            .map_err(|_| ScrapeError::Timeout {
                url: self.url.clone(),
            })?
            .map_err(|source| ScrapeError::Connect {
                url: self.url.clone(),
                source,
            })?;
        let status = resp.status();
        if !status.is_success() {
            return Err(ScrapeError::Status {
                url: self.url.clone(),
                status,
            });
        }
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|source| ScrapeError::Body {
                url: self.url.clone(),
                source,
            })?
            .to_bytes();
        Snapshot::from_text(
            &String::from_utf8_lossy(&body),
            self.clock.now().as_secs_f64(),
        )
        .map_err(|reason| ScrapeError::NotMetrics {
            url: self.url.clone(),
            reason,
        })
    }
}
