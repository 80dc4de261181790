//! Resuming a preempted batch item from the tokens it already generated.
//!
//! The batch runner sends a resumable item streamed, asking vLLM for token
//! ids (`return_token_ids`: the prompt's on the first chunk, each chunk's
//! own), whatever the item asked: its client, the batch's output file,
//! wants one JSON answer, which [`Progress::answer`] assembles from the
//! chunks. When live work preempts the item mid-answer, the gateway cuts
//! the stream with a `preempted` event; the runner then sends the
//! continuation ([`Progress::continuation`]): `/v1/completions` with the
//! prompt's token ids and the generated ones as the prompt (the engine
//! finds most of it in its prefix cache), the remaining `max_tokens`,
//! `min_tokens` rebased and the same sampling parameters. The answer is
//! stitched: the texts joined, `usage` as one call counts it (the original
//! prompt, every generated token), the last attempt's finish reason, a
//! stop string that straddles a seam cut there (the engine only matches
//! stop strings in its own output).
//!
//! What cannot resume exactly is refused by [`resumable`] (the item is then
//! sent as asked, and a preemption restarts it from zero): more than one
//! choice, tools, structured output, logprobs, echo, presence or frequency
//! penalties or a logit bias (their state counts the generated tokens,
//! which become prompt), media in the messages, no `max_tokens` on a chat
//! item (the completions route would default to 16), a prompt that is not
//! one text or one list of token ids. A stream that shows reasoning or
//! tool-call deltas, or that carries no token ids (not vLLM, or too old),
//! is restarted rather than resumed as well: the continuation's raw text
//! would not be split by the server's parsers. A resumed seeded item is a
//! valid sample, not the same one (the engine's generator restarts).

use serde_json::{Map, Value, json};

use super::sse::{data_lines, event_end};

/// The route of an item that can resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completions,
}

/// Sampling parameters a continuation keeps, as the item gave them.
const KEPT: &[&str] = &[
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "repetition_penalty",
    "length_penalty",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "cache_salt",
    "priority",
    "user",
];

/// Whether an item to `endpoint` with `body` can resume exactly; `Err`
/// names what it asks that cannot.
pub fn resumable(endpoint: &str, body: &Value) -> Result<Kind, &'static str> {
    let kind = match endpoint {
        "/v1/chat/completions" => Kind::Chat,
        "/v1/completions" => Kind::Completions,
        _ => return Err("endpoint"),
    };
    let Some(o) = body.as_object() else {
        return Err("body");
    };
    let on = |k: &str| {
        o.get(k).is_some_and(|v| match v {
            Value::Null | Value::Bool(false) => false,
            Value::Number(n) => n.as_f64() != Some(0.0),
            Value::Array(a) => !a.is_empty(),
            Value::Object(m) => !m.is_empty(),
            _ => true,
        })
    };
    if o.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) || on("best_of") {
        return Err("n");
    }
    for k in ["tools", "functions", "tool_choice", "function_call"] {
        if on(k) && o.get(k) != Some(&json!("none")) {
            return Err("tools");
        }
    }
    let format = o.get("response_format").and_then(|f| f.get("type"));
    if format.is_some_and(|t| t != "text")
        || [
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
        ]
        .iter()
        .any(|k| on(k))
        || on("structured_outputs")
    {
        return Err("structured output");
    }
    for k in [
        "logprobs",
        "top_logprobs",
        "echo",
        "prompt_logprobs",
        "use_beam_search",
    ] {
        if on(k) {
            return Err("logprobs");
        }
    }
    for k in ["presence_penalty", "frequency_penalty", "logit_bias"] {
        if on(k) {
            return Err("penalties");
        }
    }
    if on("thinking_token_budget") {
        return Err("reasoning");
    }
    match kind {
        Kind::Chat => {
            let media = o
                .get("messages")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|m| m.get("content")?.as_array())
                .flatten()
                .any(|p| p.get("type").is_some_and(|t| t != "text"));
            if media {
                return Err("media");
            }
            if max_tokens(o).is_none() {
                return Err("max_tokens");
            }
        }
        Kind::Completions => {
            let one = match o.get("prompt") {
                Some(Value::String(_)) => true,
                Some(Value::Array(a)) => a.iter().all(Value::is_u64),
                _ => false,
            };
            if !one {
                return Err("prompt");
            }
        }
    }
    Ok(kind)
}

/// The most tokens the item may generate, as it asked.
fn max_tokens(o: &Map<String, Value>) -> Option<u64> {
    o.get("max_completion_tokens")
        .or_else(|| o.get("max_tokens"))
        .and_then(Value::as_u64)
}

/// The item's first request: as it is, streamed with usage and token ids.
pub fn streamed(body: &Value) -> Vec<u8> {
    let mut b = body.clone();
    if let Some(o) = b.as_object_mut() {
        o.insert("stream".into(), Value::Bool(true));
        o.insert("stream_options".into(), json!({"include_usage": true}));
        o.insert("return_token_ids".into(), Value::Bool(true));
    }
    b.to_string().into_bytes()
}

/// How one attempt's stream ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// `[DONE]` (or a finish reason and the body's end).
    Done,
    /// Cut by a preemption: resume (or restart).
    Preempted,
    /// Broken off, or an error event: `message`.
    Broken(String),
}

/// What an item's attempts have produced so far. It is kept in the batch
/// store as the item answers (serialized), so that a gateway that
/// restarts, or another replica, continues the item from it.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct Progress {
    id: Option<Value>,
    created: Option<Value>,
    model: Option<Value>,
    fingerprint: Option<Value>,
    /// The prompt's token ids, from the first attempt.
    prompt_ids: Option<Vec<u64>>,
    /// Generated token ids, every attempt's.
    ids: Vec<u64>,
    text: String,
    /// Byte offsets in `text` where a continuation's text begins.
    seams: Vec<usize>,
    finish: Option<Value>,
    stop_reason: Option<Value>,
    /// The last attempt's own usage: (prompt, completion).
    usage: Option<(u64, u64)>,
    /// Generated tokens before the current attempt.
    before: u64,
    /// Some chunk had no token ids, or reasoning or tool-call deltas.
    not_resumable: bool,
    /// The current attempt is the item's first (its chunks carry the
    /// answer's id and the prompt's token ids).
    #[serde(skip)]
    first: bool,
    /// The current attempt's stream sent `[DONE]`.
    #[serde(skip)]
    done: bool,
}

impl Progress {
    /// Tokens generated so far, every attempt's.
    pub fn generated(&self) -> u64 {
        self.ids.len() as u64
    }

    /// Reads one attempt's whole stream body.
    pub fn read(&mut self, body: &[u8]) -> Ended {
        self.begin();
        match self.feed(body) {
            Ok(n) => self.end(&body[n..]),
            Err(ended) => ended,
        }
    }

    /// Starts reading an attempt's stream ([`Self::feed`], then
    /// [`Self::end`]).
    pub fn begin(&mut self) {
        self.first = self.prompt_ids.is_none() && self.ids.is_empty();
        self.usage = None;
        self.done = false;
    }

    /// Reads the whole events at the start of `buf`, a part of the
    /// stream: how many bytes they took (the rest waits for more), or how
    /// the stream ended (a preemption, an error event).
    pub fn feed(&mut self, buf: &[u8]) -> Result<usize, Ended> {
        let mut at = 0;
        while let Some(end) = event_end(&buf[at..]) {
            self.event(&buf[at..at + end])?;
            at += end;
        }
        Ok(at)
    }

    /// Reads the stream's last bytes (`rest`, what [`Self::feed`] left):
    /// how it ended.
    pub fn end(&mut self, rest: &[u8]) -> Ended {
        if let Err(ended) = self.event(rest) {
            return ended;
        }
        if self.done || self.finish.is_some() {
            Ended::Done
        } else {
            Ended::Broken("the stream ended before its answer did".into())
        }
    }

    /// Whether the answer has finished (a finish reason came): nothing is
    /// left to continue.
    pub fn finished(&self) -> bool {
        self.finish.is_some()
    }

    fn event(&mut self, event: &[u8]) -> Result<(), Ended> {
        for data in data_lines(event) {
            if data == b"[DONE]" {
                self.done = true;
                continue;
            }
            let Ok(v) = serde_json::from_slice::<Value>(data) else {
                return Err(Ended::Broken("an event that is not JSON".into()));
            };
            if let Some(e) = v.get("error") {
                if e.get("code").and_then(Value::as_str) == Some(super::openai::PREEMPTED) {
                    return Err(Ended::Preempted);
                }
                let m = e.get("message").and_then(Value::as_str).unwrap_or("error");
                return Err(Ended::Broken(m.to_owned()));
            }
            self.chunk(&v);
        }
        Ok(())
    }

    fn chunk(&mut self, v: &Value) {
        let first = self.first;
        let choice = v.get("choices").and_then(|c| c.get(0));
        if first {
            for (slot, key) in [
                (&mut self.id, "id"),
                (&mut self.created, "created"),
                (&mut self.model, "model"),
            ] {
                if slot.is_none() {
                    *slot = v.get(key).filter(|x| !x.is_null()).cloned();
                }
            }
            // Chat: on the chunk; completions: on its choice.
            let prompt = v
                .get("prompt_token_ids")
                .or_else(|| choice?.get("prompt_token_ids"))
                .and_then(ids);
            if prompt.is_some() {
                self.prompt_ids = prompt;
            }
        }
        if self.fingerprint.is_none() {
            self.fingerprint = v
                .get("system_fingerprint")
                .filter(|x| !x.is_null())
                .cloned();
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            let n = |k| u.get(k).and_then(Value::as_u64).unwrap_or(0);
            self.usage = Some((n("prompt_tokens"), n("completion_tokens")));
        }
        let Some(c) = choice else {
            return;
        };
        let delta = c.get("delta");
        let text = delta
            .and_then(|d| d.get("content"))
            .or_else(|| c.get("text"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let reasoning = delta.is_some_and(|d| {
            ["reasoning_content", "reasoning", "tool_calls"]
                .iter()
                .any(|k| d.get(*k).is_some_and(|x| !x.is_null()))
        });
        match c.get("token_ids").and_then(ids) {
            Some(t) => self.ids.extend(t),
            None if !text.is_empty() => self.not_resumable = true,
            None => {}
        }
        self.not_resumable |= reasoning;
        self.text.push_str(text);
        if let Some(f) = c.get("finish_reason").filter(|f| !f.is_null()) {
            self.finish = Some(f.clone());
            self.stop_reason = c.get("stop_reason").cloned();
        }
    }

    /// The continuation's request body after a preemption: `None` when the
    /// item cannot resume (no token ids, reasoning): it starts again.
    pub fn continuation(&mut self, item: &Value) -> Option<Vec<u8>> {
        let o = item.as_object()?;
        let prompt = self.prompt_ids.as_ref()?;
        if self.not_resumable || self.ids.is_empty() {
            return None;
        }
        let k = self.generated();
        let mut c = Map::new();
        for key in KEPT {
            if let Some(v) = o.get(*key) {
                c.insert((*key).into(), v.clone());
            }
        }
        let mut all = prompt.clone();
        all.extend(&self.ids);
        c.insert("prompt".into(), json!(all));
        if let Some(m) = max_tokens(o) {
            c.insert("max_tokens".into(), json!(m.saturating_sub(k).max(1)));
        }
        if let Some(m) = o.get("min_tokens").and_then(Value::as_u64) {
            c.insert("min_tokens".into(), json!(m.saturating_sub(k)));
        }
        c.insert("add_special_tokens".into(), Value::Bool(false));
        c.insert("stream".into(), Value::Bool(true));
        c.insert("stream_options".into(), json!({"include_usage": true}));
        c.insert("return_token_ids".into(), Value::Bool(true));
        self.seams.push(self.text.len());
        self.before = k;
        Some(Value::Object(c).to_string().into_bytes())
    }

    /// Whether a preempted item had generated all it may: its answer is
    /// then whole (finish `length`) and nothing is sent again.
    pub fn at_limit(&self, item: &Value) -> bool {
        item.as_object()
            .and_then(max_tokens)
            .is_some_and(|m| self.generated() >= m)
    }

    /// Starts over (a preemption that cannot resume): what was generated
    /// is dropped.
    pub fn restart(&mut self) {
        *self = Progress::default();
    }

    /// The one JSON answer of the item, as one uninterrupted call of
    /// `kind` returns it.
    pub fn answer(&self, kind: Kind, item: &Value) -> Vec<u8> {
        let (text, finish, stop_reason) = self.stitched(item);
        // The engine's count, but for a continuation's: the generated
        // tokens are its prompt.
        let prompt = match (self.seams.is_empty(), self.usage, &self.prompt_ids) {
            (true, Some((p, _)), _) => p,
            (_, _, Some(p)) => p.len() as u64,
            _ => 0,
        };
        let completion = match self.usage {
            Some((_, c)) => self.before + c,
            None => self.generated(),
        };
        let choice = match kind {
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": null},
                "logprobs": null,
                "finish_reason": finish,
                "stop_reason": stop_reason,
            }),
            Kind::Completions => json!({
                "index": 0, "text": text, "logprobs": null,
                "finish_reason": finish, "stop_reason": stop_reason,
            }),
        };
        let mut a = json!({
            "id": self.id,
            "object": if kind == Kind::Chat { "chat.completion" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion},
        });
        if let Some(f) = &self.fingerprint {
            a["system_fingerprint"] = f.clone();
        }
        a.to_string().into_bytes()
    }

    /// The joined text, finish reason and stop reason, with a stop string
    /// that straddles a seam applied there.
    fn stitched(&self, item: &Value) -> (String, Value, Value) {
        let finish = self.finish.clone().unwrap_or_else(|| json!("length"));
        let stop_reason = self.stop_reason.clone().unwrap_or(Value::Null);
        let stops: Vec<&str> = match item.get("stop") {
            Some(Value::String(s)) => vec![s.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let keep = item
            .get("include_stop_str_in_output")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let cut = stops
            .iter()
            .filter(|s| !s.is_empty())
            .flat_map(|s| self.text.match_indices(s))
            .filter(|(at, s)| self.seams.iter().any(|&m| *at < m && m < at + s.len()))
            .min_by_key(|(at, _)| *at);
        match cut {
            Some((at, s)) => {
                let end = if keep { at + s.len() } else { at };
                (self.text[..end].to_owned(), json!("stop"), json!(s))
            }
            None => (self.text.clone(), finish, stop_reason),
        }
    }
}

fn ids(v: &Value) -> Option<Vec<u64>> {
    v.as_array()?.iter().map(Value::as_u64).collect()
}

#[cfg(test)]
mod tests;
