//! [`Scraper`]: one `GET /metrics` of the gateway's admin listener, read
//! into a [`Snapshot`] stamped with the moment the answer came.

use std::time::Duration;

use super::Snapshot;
use crate::clock::Clock;
use crate::net::client::Client;
use crate::net::scrape::{ScrapeError, get};

/// How long the gateway has to answer a scrape, body included.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest `/metrics` body read.
const MAX_BODY: usize = 64 << 20;

/// Scrapes one gateway's admin `/metrics`.
#[derive(Debug)]
pub struct Scraper {
    client: Client,
    url: String,
    clock: Clock,
}

impl Scraper {
    /// A scraper of `http://{admin}/metrics`.
    pub fn new(admin: &str) -> Result<Scraper, ScrapeError> {
        let url = format!("http://{admin}/metrics");
        if url.parse::<http::Uri>().is_err() {
            return Err(ScrapeError::Url { url });
        }
        Ok(Scraper {
            client: crate::net::client::client(),
            url,
            clock: Clock::new(),
        })
    }

    /// One scrape, stamped with this scraper's clock when the body is in.
    pub async fn scrape(&self) -> Result<Snapshot, ScrapeError> {
        let body = get(&self.client, &self.url, SCRAPE_TIMEOUT, MAX_BODY).await?;
        Snapshot::from_text(
            &String::from_utf8_lossy(&body),
            self.clock.now().as_secs_f64(),
        )
        .map_err(|e| ScrapeError::unusable(&self.url, crate::fault::Chain(&e)))
    }
}
