//! The agent's configuration: the engine it reads, its dialect, timeout and node name.

use http::Uri;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::policy::MetricsDialect;
use crate::poller::dialect::AgentGpu;

/// What one agent scrapes and how.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// The engine's metrics endpoint, a full `http://host:port/path` URL
    /// (a URL without a path means `/metrics`); `None`: a node agent,
    /// serving the GPUs only.
    pub engine_metrics: Option<String>,
    /// How the engine names its metrics; `agent` and `none` are refused.
    pub dialect: MetricsDialect,
    /// The most one engine scrape may take, connect to last body byte;
    /// must be above zero.
    pub timeout: Duration,
    /// The NVML library to load instead of the system's
    /// `libnvidia-ml.so.1`; ignored without the `nvml` feature.
    pub nvml_lib: Option<PathBuf>,
    /// The node's name as Kubernetes knows it (`spec.nodeName`).
    pub node: String,
    /// The model the engine serves, as placement counts it on its GPUs.
    pub model: Option<String>,
    /// The node's indices (NVML's order on the host) of the GPUs the
    /// engine runs on; `None`: not known (placement then holds the
    /// engine's latency against every GPU of the node and counts its model
    /// on none).
    pub engine_gpus: Option<Vec<u32>>,
    /// GPUs reported instead of NVML's.
    pub simulated_gpus: Option<Vec<AgentGpu>>,
}

impl AgentConfig {
    /// An agent beside the engine whose metrics are at `url`, with the
    /// defaults of the command line and this host's name as the node.
    pub fn for_engine(url: impl Into<String>) -> Self {
        AgentConfig {
            engine_metrics: Some(url.into()),
            ..AgentConfig::for_node(super::node::host_name())
        }
    }

    /// A node agent (no engine) on `node`.
    pub fn for_node(node: impl Into<String>) -> Self {
        AgentConfig {
            engine_metrics: None,
            dialect: MetricsDialect::Vllm,
            timeout: Duration::from_secs(1),
            nvml_lib: None,
            node: node.into(),
            model: None,
            engine_gpus: None,
            simulated_gpus: None,
        }
    }

    /// Checks the URL, the dialect and the timeout, as [`serve`] does before
    /// it accepts anything.
    pub fn validate(&self) -> Result<(), AgentConfigError> {
        if self.node.trim().is_empty() {
            return Err(AgentConfigError::NoNode);
        }
        match &self.engine_metrics {
            Some(url) => check(url, self).map(|_| ()),
            None => Ok(()),
        }
    }
}

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::MetricsDialect;

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
