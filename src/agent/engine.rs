//! The engine half of a reading: one `GET` of the local engine's metrics
//! per `/reading` request, decoded with the shared [`Decoder`].
//!
//! Owns the HTTP client, the scrape timeout and the decoder (behind one
//! `parking_lot::Mutex`, taken only around the synchronous decode, never
//! across an `.await`). Does not know about GPUs or the agent's endpoints.
//! Every failure is a [`ScrapeError`] naming the engine URL.

use std::time::Duration;

use parking_lot::Mutex;

use super::AgentConfig;
use super::config::{AgentConfigError, check};
use crate::clock::Clock;
use crate::core::reading::Reading;
use crate::net::client::Client;
use crate::net::scrape::{ScrapeError, get};
use crate::poller::dialect::Decoder;

/// Largest engine metrics body the agent reads, in bytes. A vLLM scrape is
/// tens of KiB; a Triton server with many models a few MiB.
pub const MAX_SCRAPE_BYTES: usize = 8 << 20;

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
}
