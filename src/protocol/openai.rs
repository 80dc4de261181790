//! Just enough of a request body: the model, whether it streams, the
//! output it may produce, and the prompt's size. One reader serves every
//! JSON route a vLLM-style backend offers, since their fields do not clash:
//! chat and completions (`messages`, `prompt`, `max_tokens`, `n`,
//! `best_of`), embeddings and pooling (`input`, rerank's `query` and
//! `documents`, score's `text_1` and `text_2`), the Responses API (`input`
//! items, `instructions`, `max_output_tokens`) and Anthropic's Messages
//! (`system`, `messages` of content blocks). The body itself goes upstream
//! as is, except for one splice (see [`with_usage_requested`]).

use bytes::Bytes;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::protocol::error::ApiError;

/// What Fairway reads of a request body.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestInfo {
    pub model: String,
    pub stream: bool,
    /// The client asked for the final usage chunk itself.
    pub include_usage: bool,
    /// Output tokens asked for at most, per choice: `max_completion_tokens`,
    /// `max_tokens` or `max_output_tokens`.
    pub max_tokens: Option<u32>,
    /// Completions asked for: the larger of `n` and `best_of`, at least 1.
    pub choices: u32,
    /// Estimated prompt tokens.
    pub prompt_tokens: u32,
    /// The client's `cache_salt` (vLLM's: requests with different salts
    /// share no cached block).
    pub cache_salt: Option<String>,
}

#[derive(Deserialize)]
struct Lite {
    model: Option<serde_json::Value>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    max_output_tokens: Option<u32>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    best_of: Option<u32>,
    #[serde(default)]
    cache_salt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    // Each of these is prompt text where the route has it.
    #[serde(default)]
    prompt: Option<Text>,
    #[serde(default)]
    input: Option<Text>,
    #[serde(default)]
    instructions: Option<Text>,
    #[serde(default)]
    system: Option<Text>,
    #[serde(default)]
    query: Option<Text>,
    #[serde(default)]
    documents: Option<Text>,
    #[serde(default)]
    text_1: Option<Text>,
    #[serde(default)]
    text_2: Option<Text>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<Text>,
}

/// Prompt text wherever a route puts it, read as its estimated tokens: a
/// string; a list of strings or content parts; anything else counts 0. A
/// content part is a string, or an object whose `text` (a string), `content`
/// and `output` (text again) count: a content part or block, a Responses API
/// input item, a function call's output. A part of another shape, an object
/// whose `text` is not a string included, counts 0.
///
/// Counted as the parser reads it, with no copy of the text. serde's
/// untagged enums, used before, buffer each value before trying each
/// shape, so every string of the prompt was copied twice: the parse of a
/// short chat took twice as long, and of an 8 KiB one 2.2 times
/// (docs/benchmarks/2026-12-05.md).
struct Text(u32);

impl Text {
    fn tokens(&self) -> u32 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Count::Text).map(|n| Text(n.unwrap_or(0)))
    }
}

/// What a value is read as, and so what it counts: `None` for a content
/// part's `text` that is not a string (the part then counts 0).
#[derive(Clone, Copy)]
enum Count {
    /// [`Text`].
    Text,
    /// One element of a list of text.
    Part,
    /// A part's `text`: a string or null.
    PartText,
}

impl<'de> serde::de::DeserializeSeed<'de> for Count {
    type Value = Option<u32>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<u32>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Count {
    type Value = Option<u32>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E>(self, s: &str) -> Result<Option<u32>, E> {
        Ok(Some(crate::tokens::estimate(s)))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Option<u32>, A::Error> {
        let mut n = 0u32;
        match self {
            Count::Text => {
                while let Some(t) = seq.next_element_seed(Count::Part)? {
                    n = n.saturating_add(t.unwrap_or(0));
                }
                Ok(Some(n))
            }
            Count::Part | Count::PartText => {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(self.other())
            }
        }
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Option<u32>, A::Error> {
        if !matches!(self, Count::Part) {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(self.other());
        }
        let (mut n, mut valid) = (0u32, true);
        let mut seen = [false; 3];
        while let Some(PartKey(key)) = map.next_key()? {
            let (i, seed) = match key {
                Some(i @ 0) => (i, Count::PartText),
                Some(i) => (i, Count::Text),
                None => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            let t = map.next_value_seed(seed)?;
            // A repeated field is refused by a struct's reader, as a
            // `text` that is not a string is: the part counts 0.
            valid &= !std::mem::replace(&mut seen[i], true) && t.is_some();
            n = n.saturating_add(t.unwrap_or(0));
        }
        Ok(Some(if valid { n } else { 0 }))
    }

    fn visit_unit<E>(self) -> Result<Option<u32>, E> {
        Ok(Some(0))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Option<u32>, E> {
        Ok(self.other())
    }

    fn visit_i64<E>(self, _: i64) -> Result<Option<u32>, E> {
        Ok(self.other())
    }

    fn visit_u64<E>(self, _: u64) -> Result<Option<u32>, E> {
        Ok(self.other())
    }

    fn visit_f64<E>(self, _: f64) -> Result<Option<u32>, E> {
        Ok(self.other())
    }
}

/// A content part's key: `text`, `content` or `output` (0, 1, 2), or
/// another.
struct PartKey(Option<usize>);

impl<'de> Deserialize<'de> for PartKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = PartKey;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, key: &str) -> Result<PartKey, E> {
                Ok(PartKey(
                    ["text", "content", "output"].iter().position(|k| *k == key),
                ))
            }
        }
        d.deserialize_str(V)
    }
}

impl Count {
    /// A value of no text shape: 0, or not a string where one must be.
    fn other(self) -> Option<u32> {
        match self {
            Count::Text | Count::Part => Some(0),
            Count::PartText => None,
        }
    }
}

/// Per-message template overhead, in tokens (same as the simulated engine).
const TOKENS_PER_MESSAGE: u32 = 4;

/// Parses the fields Fairway needs. Malformed JSON or a missing/non-string
/// `model` is a 400.
pub fn parse(body: &[u8]) -> Result<RequestInfo, ApiError> {
    // JSON is UTF-8 (RFC 8259), also in the fields Fairway skips over,
    // which the JSON parser alone would not check.
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::InvalidRequest(format!("Request body is not valid UTF-8: {e}")))?;
    // A struct also deserialises from an array (by position): refuse that.
    if text.trim_start().starts_with('[') {
        return Err(ApiError::InvalidRequest(
            "Request body must be a JSON object.".into(),
        ));
    }
    let lite: Lite = serde_json::from_str(text)
        .map_err(|e| ApiError::InvalidRequest(format!("Request body is not valid JSON: {e}")))?;
    let model = match lite.model {
        Some(serde_json::Value::String(m)) if !m.is_empty() => m,
        Some(_) => {
            return Err(ApiError::InvalidRequest(
                "`model` must be a non-empty string.".into(),
            ));
        }
        None => {
            return Err(ApiError::InvalidRequest(
                "Missing required parameter: `model`.".into(),
            ));
        }
    };
    let mut prompt_tokens = 0u32;
    if let Some(msgs) = &lite.messages {
        for m in msgs {
            let t = m.content.as_ref().map_or(0, Text::tokens);
            prompt_tokens = prompt_tokens.saturating_add(t.saturating_add(TOKENS_PER_MESSAGE));
        }
    }
    let texts = [
        &lite.prompt,
        &lite.input,
        &lite.instructions,
        &lite.system,
        &lite.query,
        &lite.documents,
        &lite.text_1,
        &lite.text_2,
    ];
    for t in texts.into_iter().flatten() {
        prompt_tokens = prompt_tokens.saturating_add(t.tokens());
    }
    Ok(RequestInfo {
        model,
        stream: lite.stream.unwrap_or(false),
        include_usage: lite
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        max_tokens: lite
            .max_completion_tokens
            .or(lite.max_tokens)
            .or(lite.max_output_tokens),
        choices: lite.n.max(lite.best_of).unwrap_or(1).max(1),
        prompt_tokens,
        cache_salt: lite.cache_salt,
    })
}

/// The body with `stream_options.include_usage = true`, so the backend
/// reports usage on a stream whose client did not ask for it (the relay
/// then drops that chunk). When the body has no `stream_options`, the key is
/// spliced in after the opening brace and every other byte is unchanged;
/// otherwise the object is re-serialised.
pub fn with_usage_requested(body: &Bytes) -> Bytes {
    if !memfind(body, b"\"stream_options\"")
        && let Some(out) = spliced(body, &[b"\"stream_options\":{\"include_usage\":true}"])
    {
        return out;
    }
    // Re-serialised field by field: every value but `stream_options` keeps
    // its bytes (the raw text; a parse into values would also refuse what
    // the backend may accept, such as a lone surrogate escape).
    let Ok(mut fields) = serde_json::from_slice::<Fields>(body) else {
        return body.clone();
    };
    let mut options = fields
        .get("stream_options")
        .and_then(|o| serde_json::from_str::<Fields>(o.get()).ok())
        .unwrap_or_default();
    let Ok(yes) = RawValue::from_string("true".to_owned()) else {
        return body.clone();
    };
    options.insert("include_usage".to_owned(), yes);
    let Ok(options) = serde_json::value::to_raw_value(&options) else {
        return body.clone();
    };
    fields.insert("stream_options".to_owned(), options);
    serde_json::to_vec(&fields).map_or_else(|_| body.clone(), Bytes::from)
}

/// A JSON object's fields, each value's raw text kept.
type Fields = std::collections::BTreeMap<String, Box<RawValue>>;

/// `body` with a field (`"key":value`, in `parts`) spliced in after its
/// opening brace, every other byte unchanged; `None` when it is not an
/// object.
fn spliced(body: &[u8], parts: &[&[u8]]) -> Option<Bytes> {
    let pos = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body[pos] != b'{' {
        return None;
    }
    let rest = &body[pos + 1..];
    let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let len = parts.iter().map(|p| p.len()).sum::<usize>();
    let mut out = Vec::with_capacity(body.len() + len + 1);
    out.extend_from_slice(&body[..=pos]);
    for p in parts {
        out.extend_from_slice(p);
    }
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    Some(Bytes::from(out))
}

/// The body with `cache_salt` set to `salt`. The request's parse refuses
/// a body naming a field twice, so a body without one (`had` false) gets
/// the key spliced after its opening brace, every other byte unchanged;
/// a body with one is re-serialised with it replaced.
pub fn with_cache_salt(body: &Bytes, salt: &str, had: bool) -> Bytes {
    let Ok(value) = serde_json::value::to_raw_value(salt) else {
        return body.clone();
    };
    if !had && let Some(out) = spliced(body, &[b"\"cache_salt\":", value.get().as_bytes()]) {
        return out;
    }
    let Ok(mut fields) = serde_json::from_slice::<Fields>(body) else {
        return body.clone();
    };
    fields.insert("cache_salt".to_owned(), value);
    serde_json::to_vec(&fields).map_or_else(|_| body.clone(), Bytes::from)
}

/// Whether `needle` occurs in `hay`.
pub fn memfind(hay: &[u8], needle: &[u8]) -> bool {
    find(hay, needle).is_some()
}

/// Position of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    let first = needle[0];
    let mut i = 0;
    while i + needle.len() <= hay.len() {
        match hay[i..hay.len() - needle.len() + 1]
            .iter()
            .position(|b| *b == first)
        {
            Some(p) => {
                let at = i + p;
                if &hay[at..at + needle.len()] == needle {
                    return Some(at);
                }
                i = at + 1;
            }
            None => return None,
        }
    }
    None
}

/// The SSE event that ends a stream the backend cut, in OpenAI's shape
/// (the `openai` SDKs raise an `APIError` with this message; vLLM reports
/// its own errors mid-stream the same way).
pub fn error_event(cause: &str) -> Bytes {
    Bytes::from(format!("data: {}\n\n", stream_broken(cause)))
}

/// The error of a stream the backend cut, as [`error_event`] carries it
/// (and a batch item's error line, whose answer broke off).
pub fn stream_broken(cause: &str) -> serde_json::Value {
    serde_json::json!({
        "error": {
            "message": format!("The backend's stream broke before it ended: {cause}"),
            "type": "upstream_error",
            "param": null,
            "code": "upstream_stream_broken",
        }
    })
}

/// The event that ends a resumable batch item's stream cut by a
/// preemption (see `gateway::relay`); the batch runner resumes the item.
pub fn preempted_event() -> Bytes {
    let body = serde_json::json!({
        "error": {
            "message": "Preempted by live work; the batch runner resumes it.",
            "type": "preempted",
            "param": null,
            "code": PREEMPTED,
        }
    });
    Bytes::from(format!("data: {body}\n\n"))
}

/// The `code` of [`preempted_event`].
pub const PREEMPTED: &str = "preempted";

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_chat_fields() {
        let info = parse(br#"{"model":"m","stream":true,"max_tokens":7,"messages":[{"role":"user","content":"abcdefgh"}]}"#).unwrap();
        assert_eq!(
            info,
            RequestInfo {
                model: "m".into(),
                stream: true,
                include_usage: false,
                max_tokens: Some(7),
                choices: 1,
                prompt_tokens: 6,
                cache_salt: None
            }
        );
        let info = parse(
            br#"{"model":"m","prompt":["abcd","efgh"],"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(
            (info.prompt_tokens, info.include_usage, info.stream),
            (2, true, false)
        );
        let info = parse(br#"{"model":"m","messages":[{"content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{}}]}]}"#).unwrap();
        assert_eq!(info.prompt_tokens, 5);
        let info = parse(br#"{"model":"m","prompt":"abcd","n":2,"best_of":3}"#).unwrap();
        assert_eq!(info.choices, 3);
    }

    #[test]
    fn reads_the_other_routes_prompts() {
        // The Responses API: input items with text or content parts, plus
        // instructions; `max_output_tokens`.
        let info = parse(br#"{"model":"m","instructions":"abcdefgh","max_output_tokens":9,
            "input":[{"role":"user","content":"abcd"},
                     {"type":"message","role":"user","content":[{"type":"input_text","text":"abcd"}]},
                     {"type":"function_call_output","call_id":"c","output":"abcd"}]}"#)
        .unwrap();
        assert_eq!((info.prompt_tokens, info.max_tokens), (5, Some(9)));
        // Anthropic's Messages: `system` and content blocks.
        let info = parse(
            br#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"abcd"}],
            "messages":[{"role":"user","content":[{"type":"text","text":"abcd"}]}]}"#,
        )
        .unwrap();
        assert_eq!((info.prompt_tokens, info.max_tokens), (6, Some(5)));
        // Rerank and score.
        let info = parse(br#"{"model":"m","query":"abcd","documents":["abcd","abcd"]}"#).unwrap();
        assert_eq!(info.prompt_tokens, 3);
        let info = parse(br#"{"model":"m","text_1":"abcd","text_2":["abcd"]}"#).unwrap();
        assert_eq!(info.prompt_tokens, 2);
    }

    #[test]
    fn only_a_utf8_json_object_is_a_request() {
        // Found by fuzzing: a struct also deserialises from an array, and
        // skipped fields are not checked for UTF-8 by the JSON parser.
        assert!(parse(br#"["m"]"#).is_err());
        assert!(parse(b"{\"model\":\"m\",\"x\":\"\x9e\"}").is_err());
        // A lone surrogate escape in a skipped field is the backend's to
        // judge; the usage splice keeps it as it is.
        let body = Bytes::from_static(br#"{"model":"m","x":"\udddd","stream_options":{"a":1}}"#);
        assert!(parse(&body).is_ok());
        let spliced = with_usage_requested(&body);
        assert!(parse(&spliced).unwrap().include_usage);
        assert!(memfind(&spliced, br#""x":"\udddd""#), "{spliced:?}");
    }

    #[test]
    fn rejects_bad_bodies() {
        for body in [
            &b"{"[..],
            b"[]",
            b"{}",
            br#"{"model":3}"#,
            br#"{"model":""}"#,
            b"",
            br#"{"model":"m","max_tokens":-1}"#,
        ] {
            assert!(
                matches!(parse(body), Err(ApiError::InvalidRequest(_))),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn usage_splice_changes_nothing_else() {
        let body = Bytes::from_static(br#" {"model":"m","stream":true}"#);
        assert_eq!(
            &with_usage_requested(&body)[..],
            br#" {"stream_options":{"include_usage":true},"model":"m","stream":true}"#
        );
        let body = Bytes::from_static(br#"{"model":"m","stream_options":{"include_usage":false}}"#);
        let v: serde_json::Value = serde_json::from_slice(&with_usage_requested(&body)).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
    }

    #[test]
    fn the_cache_salt_is_spliced_in_or_replaced() {
        let body = Bytes::from_static(br#" {"model":"m"}"#);
        assert_eq!(
            &with_cache_salt(&body, "s1", false)[..],
            br#" {"cache_salt":"s1","model":"m"}"#
        );
        assert_eq!(
            &with_cache_salt(&Bytes::from_static(b"{ }"), "s1", false)[..],
            br#"{"cache_salt":"s1" }"#
        );
        let body = Bytes::from_static(br#"{"model":"m","cache_salt":"mine"}"#);
        let out = with_cache_salt(&body, "s1", true);
        assert_eq!(parse(&out).unwrap().cache_salt.as_deref(), Some("s1"));
    }

    /// The prompt count as [`Text`]'s doc states it, over a parsed value.
    fn reference(v: &serde_json::Value, part: bool) -> u32 {
        use serde_json::Value;
        match v {
            Value::String(s) => crate::tokens::estimate(s),
            Value::Array(items) if !part => items.iter().map(|i| reference(i, true)).sum(),
            Value::Object(o) if part => {
                let text = match o.get("text") {
                    None | Some(Value::Null) => 0,
                    Some(Value::String(s)) => crate::tokens::estimate(s),
                    Some(_) => return 0,
                };
                text + ["content", "output"]
                    .iter()
                    .filter_map(|k| o.get(*k))
                    .map(|t| reference(t, false))
                    .sum::<u32>()
            }
            _ => 0,
        }
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(Value::from),
            "[a-z\\\\\"é]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![Just("text"), Just("content"), Just("output"), Just("type")]
                        .prop_map(String::from),
                    inner,
                    0..4
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn prompt_counts_follow_the_text_shapes(v in json_value()) {
            // `v` as text (`prompt`, a message's `content`) and as a part
            // (in `input`'s list).
            let body = serde_json::json!({"model": "m", "prompt": v, "messages": [{"content": v}], "input": [v]});
            let info = parse(body.to_string().as_bytes()).unwrap();
            let expected = 2 * reference(&v, false) + reference(&v, true) + TOKENS_PER_MESSAGE;
            prop_assert_eq!(info.prompt_tokens, expected);
        }
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse(&bytes);
            let _ = with_usage_requested(&Bytes::from(bytes));
        }
    }
}
