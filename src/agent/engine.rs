//! The engine half of a reading: one `GET` of the local engine's metrics
//! per `/reading` request, decoded with the shared [`Decoder`].
//!
//! Owns the HTTP client, the scrape timeout and the decoder (behind one
//! `parking_lot::Mutex`, taken only around the synchronous decode, never
//! across an `.await`). Does not know about GPUs or the agent's endpoints.
//! Every failure is a [`ScrapeError`] naming the engine URL.

use std::time::Duration;

use http::Uri;
use parking_lot::Mutex;

use super::AgentConfig;
use crate::clock::Clock;
use crate::config::policy::MetricsDialect;
use crate::core::reading::Reading;
use crate::net::client::Client;
use crate::net::scrape::{ScrapeError, get};
use crate::poller::dialect::Decoder;

/// Largest engine metrics body the agent reads, in bytes. A vLLM scrape is
/// tens of KiB; a Triton server with many models a few MiB.
pub const MAX_SCRAPE_BYTES: usize = 8 << 20;

/// Path scraped when the engine URL has none.
const DEFAULT_PATH: &str = "/metrics";

/// Why an [`AgentConfig`] cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum AgentConfigError {
    /// The engine metrics URL is not an `http://host:port/path` URL.
    #[error("engine metrics URL `{url}`: {reason}")]
    Url { url: String, reason: &'static str },
    /// The dialect is not one an engine speaks.
    #[error("dialect {dialect:?} is not an engine's; use vllm, triton, sglang or llamacpp")]
    Dialect { dialect: MetricsDialect },
    /// A zero timeout would fail every scrape.
    #[error("the scrape timeout must be above zero")]
    ZeroTimeout,
    /// Placement could not tell this node from another.
    #[error("the node name is empty; pass --node-name or set NODE_NAME")]
    NoNode,
}

/// Checks `cfg` for scraping `url` and returns the URI to scrape.
pub(super) fn check(url: &str, cfg: &AgentConfig) -> Result<Uri, AgentConfigError> {
    if matches!(cfg.dialect, MetricsDialect::Agent | MetricsDialect::None) {
        return Err(AgentConfigError::Dialect {
            dialect: cfg.dialect,
        });
    }
    if cfg.timeout.is_zero() {
        return Err(AgentConfigError::ZeroTimeout);
    }
    parse_url(url)
}

/// Splits `http://host:port/path?query`; no path means [`DEFAULT_PATH`].
fn parse_url(url: &str) -> Result<Uri, AgentConfigError> {
    let bad = |reason| AgentConfigError::Url {
        url: url.to_owned(),
        reason,
    };
    let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(_) => return Err(bad("only http:// is supported")),
        None => return Err(bad("missing http://")),
    }
    let Some(authority) = uri.authority() else {
        return Err(bad("missing host"));
    };
    if authority.host().is_empty() {
        return Err(bad("missing host"));
    }
    if authority.as_str().contains('@') {
        return Err(bad("credentials in the URL are not supported"));
    }
    // `Uri` reads `http://host:port` as having the path `/`; look at the text.
    let after_authority = url.get("http://".len() + authority.as_str().len()..);
    if after_authority.is_some_and(|rest| !rest.is_empty()) {
        return Ok(uri);
    }
    Uri::builder()
        .scheme("http")
        .authority(authority.clone())
        .path_and_query(DEFAULT_PATH)
        .build()
        .map_err(|_| bad("not a URL"))
}

/// Who reads the engine: each reader has its own decoder, so that its
/// latency windows are its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reader {
    /// The gateway's poller, `GET /reading`.
    Gateway,
    /// The placement service, `GET /node`.
    Placement,
}

/// The local engine and the decoders of its scrapes.
#[derive(Debug)]
pub(super) struct Engine {
    /// The URL scraped.
    url: String,
    timeout: Duration,
    client: Client,
    clock: Clock,
    /// One per [`Reader`].
    decoders: [Mutex<Decoder>; 2],
    /// The model its metrics name (`model_name` or `model` label), from
    /// the last scrape that named one.
    model: Mutex<Option<String>>,
}

impl Engine {
    /// Checks `cfg` for `url` and builds the client; connects on the first
    /// scrape.
    pub(super) fn new(url: &str, cfg: &AgentConfig) -> Result<Self, AgentConfigError> {
        let uri = check(url, cfg)?;
        Ok(Engine {
            url: uri.to_string(),
            timeout: cfg.timeout,
            client: crate::net::client::client(),
            clock: Clock::new(),
            decoders: [
                Mutex::new(Decoder::new(cfg.dialect)),
                Mutex::new(Decoder::new(cfg.dialect)),
            ],
            model: Mutex::new(None),
        })
    }

    /// The scraped URL.
    pub(super) fn url(&self) -> &str {
        &self.url
    }

    /// The model the engine's metrics name, if a scrape has seen one.
    pub(super) fn model(&self) -> Option<String> {
        self.model.lock().clone()
    }

    /// Scrapes the engine once and decodes the body with `reader`'s decoder.
    pub(super) async fn read(&self, reader: Reader) -> Result<Reading, ScrapeError> {
        let body = get(&self.client, &self.url, self.timeout, MAX_SCRAPE_BYTES).await?;
        let at = self.clock.now();
        let text = std::str::from_utf8(&body)
            .map_err(|_| ScrapeError::unusable(&self.url, "the body is not UTF-8"))?;
        if let Some(model) = served_model(text) {
            let mut known = self.model.lock();
            if known.as_deref() != Some(model) {
                *known = Some(model.to_owned());
            }
        }
        let decoded = self.decoders[reader as usize].lock().decode(text, at);
        decoded.map_err(|e| ScrapeError::unusable(&self.url, e))
    }
}

/// The first `model_name="…"` (vLLM, SGLang) or `model="…"` (Triton)
/// label value of a scrape; values with escapes are skipped.
fn served_model(text: &str) -> Option<&str> {
    ["model_name=\"", "model=\""].iter().find_map(|key| {
        text.match_indices(key).find_map(|(at, _)| {
            let start = at + key.len();
            // `model="` inside `model_name="`'s value or another label's
            // name (`engine_model="`) does not count.
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                return None;
            }
            let value = &text[start..start + text[start..].find('"')?];
            (!value.is_empty() && !value.contains('\\')).then_some(value)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_served_model_comes_from_the_metrics_labels() {
        let vllm = "# HELP x\nvllm:num_requests_running{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} 1\n";
        assert_eq!(served_model(vllm), Some("meta-llama/Llama-3.1-8B"));
        let triton = "nv_inference_count{model=\"ensemble\",version=\"1\"} 3\n";
        assert_eq!(served_model(triton), Some("ensemble"));
        assert_eq!(served_model("x{engine_model=\"a\"} 1\n"), None);
        assert_eq!(served_model("x{model_name=\"\"} 1\n"), None);
        assert_eq!(served_model("x 1\n"), None);
    }

    fn cfg(url: &str) -> AgentConfig {
        AgentConfig::for_engine(url)
    }

    fn check(cfg: &AgentConfig) -> Result<Uri, AgentConfigError> {
        super::check(cfg.engine_metrics.as_deref().unwrap_or_default(), cfg)
    }

    #[test]
    fn url_with_path_is_kept() {
        let uri = check(&cfg("http://127.0.0.1:8000/metrics?x=1")).unwrap();
        assert_eq!(uri.to_string(), "http://127.0.0.1:8000/metrics?x=1");
    }

    #[test]
    fn url_without_path_scrapes_metrics() {
        let uri = check(&cfg("http://localhost:8000")).unwrap();
        assert_eq!(uri.to_string(), "http://localhost:8000/metrics");
    }

    #[test]
    fn url_that_is_not_plain_http_is_refused() {
        for url in [
            "",
            "localhost:8000/metrics",
            "https://localhost:8000/metrics",
            "http:///metrics",
            "http://user:pw@localhost:8000/metrics",
            "/metrics",
        ] {
            let err = check(&cfg(url)).unwrap_err();
            assert!(matches!(err, AgentConfigError::Url { .. }), "{url}: {err}");
        }
    }

    #[test]
    fn engine_dialects_only_and_a_timeout() {
        for dialect in [MetricsDialect::Agent, MetricsDialect::None] {
            let c = AgentConfig {
                dialect,
                ..cfg("http://h:1/metrics")
            };
            assert!(matches!(check(&c), Err(AgentConfigError::Dialect { .. })));
        }
        let c = AgentConfig {
            timeout: Duration::ZERO,
            ..cfg("http://h:1/metrics")
        };
        assert!(matches!(check(&c), Err(AgentConfigError::ZeroTimeout)));
    }
}
