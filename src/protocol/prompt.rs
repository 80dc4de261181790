//! A request's prompt as one byte string, in the order an engine's chat
//! template lays it out, for prefix keys where a pool names no tokenizer
//! (`crate::tokens::approximate_ids`): the tool list, the system text
//! (`system`, `instructions`), then each message's role, content and tool
//! calls, then `prompt` or `input`. Every text is followed by a newline,
//! so that `["ab", "c"]` and `["a", "bc"]` differ. Also the request's
//! `cache_salt` (vLLM's: requests with different salts share no cached
//! block).
//!
//! It is not what the engine's template renders, and need not be: it is a
//! stable function of the request, so two requests that share a
//! conversation prefix share a prefix of these bytes, which is what
//! routing on cached prefixes needs. The simulated engine keys its cache
//! by the same bytes.

use serde::Deserialize;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// What prefix routing reads of a request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Prompt {
    pub text: Vec<u8>,
    pub cache_salt: Option<String>,
}

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(default)]
    cache_salt: Option<String>,
}

/// The prompt of a JSON request body; `None` when it is not a JSON
/// object (the request's own parse refuses it first).
pub fn read(body: &[u8]) -> Option<Prompt> {
    // A struct also deserialises from an array (by position).
    if body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    let b: Body = serde_json::from_slice(body).ok()?;
    let mut text = Vec::with_capacity(body.len());
    if let Some(tools) = b.tools {
        text.extend_from_slice(tools.get().as_bytes());
        text.push(b'\n');
    }
    for v in [b.system, b.instructions].into_iter().flatten() {
        append(v, Shape::Text, &mut text);
    }
    if let Some(m) = b.messages {
        append(m, Shape::Messages, &mut text);
    }
    for v in [b.prompt, b.input].into_iter().flatten() {
        append(v, Shape::Text, &mut text);
    }
    Some(Prompt {
        text,
        cache_salt: b.cache_salt,
    })
}

/// The keys of a JSON request body's prompt blocks, `block_tokens` each
/// (`crate::tokens::text_keys`), rooted in `model` (the model or adapter
/// it names) and its `cache_salt`: how the gateway keys a request, and the
/// simulated engine its cache; `salt`, where given, in place of the
/// body's (the one the gateway sets). Empty when the body is not a JSON
/// object.
pub fn keys(body: &[u8], model: &str, salt: Option<&str>, block_tokens: u32) -> Vec<u64> {
    match read(body) {
        Some(p) => {
            let salt = salt.or(p.cache_salt.as_deref());
            crate::tokens::text_keys(model, salt, &p.text, block_tokens)
        }
        None => Vec::new(),
    }
}

fn append(v: &RawValue, shape: Shape, out: &mut Vec<u8>) {
    let mut de = serde_json::Deserializer::from_str(v.get());
    // A value of an unexpected shape adds what it can; it never fails the
    // request (the body is valid JSON: its own parse checked).
    let _ = Append { out, shape }.deserialize(&mut de);
}

/// What a value is read as.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// Text: a string, or a list of strings and content parts.
    Text,
    /// One element of a list of text: a string, or a part whose `text`,
    /// `content` and `output` are text.
    Part,
    /// A list of messages: each a role, content (text) and tool calls.
    Messages,
    /// One message.
    Message,
}

struct Append<'o> {
    out: &'o mut Vec<u8>,
    shape: Shape,
}

impl Append<'_> {
    fn reborrow(&mut self, shape: Shape) -> Append<'_> {
        Append {
            out: &mut *self.out,
            shape,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Append<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Append<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E>(self, s: &str) -> Result<(), E> {
        if self.shape != Shape::Messages {
            self.out.extend_from_slice(s.as_bytes());
            self.out.push(b'\n');
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let inner = match self.shape {
            Shape::Text => Shape::Part,
            Shape::Messages => Shape::Message,
            Shape::Part | Shape::Message => {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                return Ok(());
            }
        };
        while seq.next_element_seed(self.reborrow(inner))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let inner = match (self.shape, key.as_ref()) {
                (Shape::Part, "text" | "content" | "output") => Some(Shape::Text),
                (Shape::Message, "role" | "content") => Some(Shape::Text),
                (Shape::Message, "tool_calls") => {
                    let raw: &RawValue = map.next_value()?;
                    self.out.extend_from_slice(raw.get().as_bytes());
                    self.out.push(b'\n');
                    continue;
                }
                _ => None,
            };
            match inner {
                Some(s) => map.next_value_seed(self.reborrow(s))?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(body: &str) -> String {
        String::from_utf8(read(body.as_bytes()).unwrap().text).unwrap()
    }

    #[test]
    fn a_chat_reads_as_its_roles_and_contents_in_order() {
        let t = text(
            r#"{"model":"m","messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1"}]}],
            "tools":[{"type":"function"}],"max_tokens":5}"#,
        );
        assert_eq!(
            t,
            "[{\"type\":\"function\"}]\nsystem\nbe brief\nuser\nhi\nassistant\n[{\"id\":\"c1\"}]\n"
        );
    }

    #[test]
    fn a_longer_conversation_extends_the_shorter_ones_bytes() {
        let one = text(r#"{"model":"m","messages":[{"role":"user","content":"a"}]}"#);
        let two = text(
            r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#,
        );
        assert!(two.starts_with(&one));
    }

    #[test]
    fn keys_are_the_prompts_blocks_rooted_in_the_model_and_salt() {
        let body = br#"{"model":"m","prompt":"0123456789abcdef","cache_salt":"s"}"#;
        // 17 bytes with the newline: five tokens (the last padded), a block
        // each.
        let k = keys(body, "m", None, 1);
        assert_eq!(
            k,
            crate::tokens::text_keys("m", Some("s"), b"0123456789abcdef\n", 1)
        );
        assert_eq!(k.len(), 5);
        assert_ne!(k, keys(body, "other", None, 1));
        assert!(keys(b"[1]", "m", None, 1).is_empty());
    }

    #[test]
    fn the_other_routes_and_the_salt() {
        let p = read(br#"{"model":"m","prompt":["ab","c"],"cache_salt":"s1"}"#).unwrap();
        assert_eq!(p.text, b"ab\nc\n");
        assert_eq!(p.cache_salt.as_deref(), Some("s1"));
        assert_eq!(
            text(r#"{"model":"m","instructions":"i","input":"x"}"#),
            "i\nx\n"
        );
        assert_eq!(
            text(
                r#"{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"u"}]}"#
            ),
            "s\nuser\nu\n"
        );
        assert_eq!(read(b"[1]"), None);
        // Odd shapes add nothing and fail nothing.
        assert_eq!(text(r#"{"model":"m","messages":{"a":1},"prompt":7}"#), "");
    }
}
