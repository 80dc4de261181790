//! Usage, as the backends report it: one reader for every shape the routes
//! give (OpenAI's chunks and bodies, the Responses API's
//! `response.completed`, Anthropic's `message_start` and `message_delta`,
//! a pooling route's `total_tokens`), and how reports within one answer
//! add up.

use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::core::ids::Usage;

/// A `usage` object in any of the shapes the routes give: OpenAI's
/// (`prompt_tokens`, `completion_tokens`), the Responses API's and
/// Anthropic's (`input_tokens`, `output_tokens`), or a pooling route's
/// `total_tokens` alone.
#[derive(Deserialize)]
pub struct UsageLite {
    #[serde(default)]
    pub prompt_tokens: Option<u32>,
    #[serde(default)]
    pub completion_tokens: Option<u32>,
    #[serde(default)]
    pub input_tokens: Option<u32>,
    #[serde(default)]
    pub output_tokens: Option<u32>,
    #[serde(default)]
    pub total_tokens: Option<u32>,
    /// An audio call's duration (vLLM's `{"type": "duration"}` usage).
    #[serde(default)]
    pub seconds: Option<f64>,
    /// Cached prompt tokens: OpenAI's and vLLM's
    /// `prompt_tokens_details.cached_tokens`, the Responses API's
    /// `input_tokens_details.cached_tokens`, Anthropic's
    /// `cache_read_input_tokens`.
    #[serde(default)]
    pub prompt_tokens_details: Option<Details>,
    #[serde(default)]
    pub input_tokens_details: Option<Details>,
    #[serde(default)]
    pub cache_read_input_tokens: Option<u32>,
}

/// A usage's token details (only the cached count is read).
#[derive(Deserialize)]
pub struct Details {
    #[serde(default)]
    pub cached_tokens: Option<u32>,
}

impl UsageLite {
    pub fn usage(&self) -> Usage {
        let prompt = self.prompt_tokens.or(self.input_tokens).unwrap_or(0);
        let completion = self.completion_tokens.or(self.output_tokens).unwrap_or(0);
        let prompt = match (self.total_tokens, self.seconds) {
            (Some(total), _) if prompt == 0 && completion == 0 => total,
            (_, Some(s)) if prompt == 0 => (s * crate::protocol::audio::TOKENS_PER_SECOND)
                .clamp(0.0, f64::from(u32::MAX)) as u32,
            _ => prompt,
        };
        let details = |d: &Option<Details>| d.as_ref().and_then(|d| d.cached_tokens);
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_tokens: details(&self.prompt_tokens_details)
                .or(details(&self.input_tokens_details))
                .or(self.cache_read_input_tokens),
        }
    }
}

/// A usage object nested in an event: the Responses API's
/// `response.completed` (`response.usage`), Anthropic's `message_start`
/// (`message.usage`).
#[derive(Deserialize)]
pub struct NestedLite {
    #[serde(default)]
    pub usage: Option<UsageLite>,
}

#[derive(Deserialize)]
pub struct ChunkLite {
    #[serde(default)]
    pub choices: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    pub usage: Option<UsageLite>,
    #[serde(default)]
    pub response: Option<NestedLite>,
    #[serde(default)]
    pub message: Option<NestedLite>,
}

impl ChunkLite {
    /// The usage this document or event reports, wherever it has it.
    pub fn usage(&self) -> Option<Usage> {
        fn nested(n: &Option<NestedLite>) -> Option<&UsageLite> {
            n.as_ref().and_then(|n| n.usage.as_ref())
        }
        self.usage
            .as_ref()
            .or_else(|| nested(&self.response))
            .or_else(|| nested(&self.message))
            .map(UsageLite::usage)
    }
}

/// Adds a report to what was seen: a count that a later event gives
/// replaces the earlier one (Anthropic's `message_delta` carries the
/// output, its `message_start` the input; cumulative usage chunks grow).
pub fn merge_usage(seen: &mut Option<Usage>, u: Usage) {
    match seen {
        None => *seen = Some(u),
        Some(s) => {
            if u.prompt_tokens > 0 {
                s.prompt_tokens = u.prompt_tokens;
            }
            if u.completion_tokens > 0 {
                s.completion_tokens = u.completion_tokens;
            }
            if u.cached_tokens.is_some() {
                s.cached_tokens = u.cached_tokens;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage_of(json: &str) -> Usage {
        serde_json::from_str::<ChunkLite>(json)
            .unwrap()
            .usage()
            .unwrap()
    }

    #[test]
    fn cached_prompt_tokens_are_read_from_every_shape() {
        // OpenAI and vLLM (`--enable-prompt-tokens-details`).
        let u = usage_of(
            r#"{"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":64}}}"#,
        );
        assert_eq!((u.prompt_tokens, u.cached_tokens), (100, Some(64)));
        // The Responses API.
        let u = usage_of(
            r#"{"response":{"usage":{"input_tokens":80,"output_tokens":3,"input_tokens_details":{"cached_tokens":32}}}}"#,
        );
        assert_eq!((u.prompt_tokens, u.cached_tokens), (80, Some(32)));
        // Anthropic's Messages.
        let u = usage_of(
            r#"{"message":{"usage":{"input_tokens":7,"output_tokens":1,"cache_read_input_tokens":16}}}"#,
        );
        assert_eq!(u.cached_tokens, Some(16));
        // Not reported (vLLM without details, or `null`).
        let u = usage_of(
            r#"{"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":null}}"#,
        );
        assert_eq!(u.cached_tokens, None);
        // A later event without the count keeps the earlier one.
        let mut seen = None;
        merge_usage(
            &mut seen,
            Usage {
                prompt_tokens: 9,
                completion_tokens: 0,
                cached_tokens: Some(4),
            },
        );
        merge_usage(
            &mut seen,
            Usage {
                prompt_tokens: 0,
                completion_tokens: 2,
                cached_tokens: None,
            },
        );
        assert_eq!(seen.unwrap().cached_tokens, Some(4));
    }
}
