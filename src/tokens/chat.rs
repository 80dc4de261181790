//! A pool's own tokenizer and chat template: a request's prompt as the
//! engine's token ids, in process, from local files only.
//!
//! - The tokenizer is Hugging Face's `tokenizer.json`, run by the
//!   `tokenizers` crate (the same library the engines use, so the ids are
//!   theirs).
//! - The chat template is Jinja, rendered by `minijinja` set up as
//!   `transformers`' `apply_chat_template` sets up Jinja: `trim_blocks`,
//!   `lstrip_blocks`, loop controls, Python's string methods
//!   (`minijinja-contrib`'s pycompat), `raise_exception`, a `tojson` that
//!   writes as Python's `json.dumps` does (`", "`, `": "`, no ASCII
//!   escaping, `indent`), and the special tokens of `tokenizer_config.json`
//!   (`bos_token`, `eos_token`, …) as variables. It comes from its own file,
//!   or from `tokenizer_config.json`'s `chat_template`.
//! - A chat is rendered with `add_generation_prompt` (default true) and
//!   tokenized without adding special tokens (the template writes them),
//!   as vLLM does; a completion's `prompt` is tokenized with them; a
//!   prompt of token ids is taken as it is.
//!
//! **The resent conversation is not tokenized again.** The rendered text
//! is cut at every added token the tokenizer matches on the raw text
//! (`<|im_start|>`, `<|eot_id|>`, … ; not those that strip whitespace or
//! match whole words only): the library tokenizes each piece between them
//! on its own, so the ids of the pieces, in order, are the ids of the
//! whole. Each piece's ids are cached by its hash (two generations of at
//! most [`CACHE_PIECES`] pieces, the older dropped when the newer fills),
//! so a turn that resends the conversation tokenizes only its new
//! messages.
//!
//! **A render has a budget.** The template is the operator's, the number
//! of messages the caller's: a template whose work grows with the square
//! of the messages would let one request hold a thread for minutes. Each
//! render may run [`TEMPLATE_FUEL`] template instructions (`minijinja`'s
//! fuel); past that the request falls back to the byte approximation, as
//! for a template that fails, and is counted
//! ([`ChatTokenizer::fallbacks`]). The gateway renders and tokenizes a
//! large body on the blocking pool, off the request path's threads
//! (`gateway::request`).
//!
//! Not supported (the request falls back to the byte approximation, and
//! is still routed): templates that call `strftime_now` or other
//! functions `transformers` adds, and content given as a list of parts
//! is passed to the template as it is (vLLM may flatten it first).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokenizers::Tokenizer;
use xxhash_rust::xxh3::xxh3_64;

/// Pieces of rendered text whose ids are kept, per generation.
pub const CACHE_PIECES: usize = 8192;

/// Template instructions one render may run: about 20 ms of rendering,
/// some tens of thousands of messages through a template whose work
/// grows with their number (a few hundred instructions for a common one
/// on a short chat).
pub const TEMPLATE_FUEL: u64 = 2_000_000;

/// The template's name in its environment (no extension: no autoescape).
const TEMPLATE: &str = "chat";

/// A pool's tokenizer and chat template. See the module docs.
pub struct ChatTokenizer {
    tokenizer: Tokenizer,
    /// The environment holding the chat template, if there is one.
    env: Option<Environment<'static>>,
    /// `bos_token`, `eos_token`, … from `tokenizer_config.json`.
    specials: Vec<(String, String)>,
    /// The added tokens the rendered text is cut at, and their ids.
    cut: Option<(AhoCorasick, Vec<u32>)>,
    cache: Mutex<Pieces>,
    /// Chats whose template failed, and those past [`TEMPLATE_FUEL`],
    /// since load.
    failed: AtomicU64,
    over_budget: AtomicU64,
}

impl std::fmt::Debug for ChatTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTokenizer")
            .field("template", &self.env.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Pieces {
    new: HashMap<u64, Arc<[u32]>>,
    old: HashMap<u64, Arc<[u32]>>,
}

impl Pieces {
    fn get(&mut self, key: u64) -> Option<Arc<[u32]>> {
        if let Some(ids) = self.new.get(&key) {
            return Some(Arc::clone(ids));
        }
        let ids = self.old.remove(&key)?;
        self.put(key, Arc::clone(&ids));
        Some(ids)
    }

    fn put(&mut self, key: u64, ids: Arc<[u32]>) {
        if self.new.len() >= CACHE_PIECES {
            self.old = std::mem::take(&mut self.new);
        }
        self.new.insert(key, ids);
    }
}

/// What is read of a body to render and tokenize it: the template's
/// inputs straight into the template engine's values, in one pass.
#[derive(Deserialize)]
struct Body<'a> {
    #[serde(default)]
    messages: Option<Value>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
    #[serde(default)]
    chat_template_kwargs: Option<Value>,
    #[serde(default)]
    cache_salt: Option<String>,
}

/// A prompt as the engine's token ids, and its `cache_salt`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptIds {
    pub ids: Vec<u32>,
    pub cache_salt: Option<String>,
}

/// `tokenizer_config.json`, the parts used.
#[derive(Deserialize, Default)]
struct TokenizerConfig {
    #[serde(default)]
    chat_template: Option<serde_json::Value>,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

/// Why a pool's tokenizer files could not be loaded. They are the
/// operator's, so it is the policy's fault, and trying again cannot help
/// until the files change.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("{}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The tokenizer file could not be read or is not one.
    #[error("{}", .path.display())]
    Tokenizer {
        path: PathBuf,
        #[source]
        source: tokenizers::Error,
    },
    /// The tokenizer's config is not JSON of its shape.
    #[error("{}", .path.display())]
    Config {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The chat template (in `path`) does not compile.
    #[error("{}: the chat template does not compile", .path.display())]
    Template {
        path: PathBuf,
        #[source]
        source: Error,
    },
}

/// Why a chat could not be rendered or tokenized: messages that are not
/// JSON, or that the template refuses, are the caller's fault; a tokenizer
/// failing on text is ours. The same text fails the same way again.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The messages or tools are not JSON.
    #[error("the messages are not JSON")]
    Json(#[source] serde_json::Error),
    /// The template refused the messages (`raise_exception`), failed on
    /// them, or there is none.
    #[error("the chat template failed")]
    Template(#[source] Error),
    /// The tokenizer failed on the rendered text.
    #[error("tokenizing failed")]
    Tokenize(#[source] tokenizers::Error),
}

/// A read of `path` that failed.
fn unread(path: &Path) -> impl FnOnce(std::io::Error) -> LoadError + '_ {
    move |source| LoadError::Read {
        path: path.to_owned(),
        source,
    }
}

impl ChatTokenizer {
    /// Loads `tokenizer` (a `tokenizer.json`), the special tokens and,
    /// unless `template` names a file, the chat template of `config` (a
    /// `tokenizer_config.json`). Errors name the file and what is wrong.
    pub fn load(
        tokenizer: &Path,
        config: Option<&Path>,
        template: Option<&Path>,
    ) -> Result<Self, LoadError> {
        let tok = Tokenizer::from_file(tokenizer).map_err(|source| LoadError::Tokenizer {
            path: tokenizer.to_owned(),
            source,
        })?;
        let cfg: TokenizerConfig = match config {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(unread(p))?;
                serde_json::from_str(&text).map_err(|source| LoadError::Config {
                    path: p.to_owned(),
                    source,
                })?
            }
            None => TokenizerConfig::default(),
        };
        let source = match (template, &cfg.chat_template) {
            (Some(p), _) => Some(std::fs::read_to_string(p).map_err(unread(p))?),
            (None, Some(serde_json::Value::String(s))) => Some(s.clone()),
            // A list of named templates: the "default" one.
            (None, Some(serde_json::Value::Array(list))) => list
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .map(str::to_owned),
            _ => None,
        };
        let specials = cfg
            .rest
            .iter()
            .filter(|(k, _)| k.ends_with("_token"))
            .filter_map(|(k, v)| {
                let text = v.as_str().or_else(|| v["content"].as_str())?;
                Some((k.clone(), text.to_owned()))
            })
            .collect();
        let env = match source {
            Some(src) => {
                let mut env = environment();
                env.add_template_owned(TEMPLATE, src)
                    .map_err(|source| LoadError::Template {
                        path: template.or(config).unwrap_or(tokenizer).to_owned(),
                        source,
                    })?;
                Some(env)
            }
            None => None,
        };
        let cut = cut_points(&tok);
        Ok(ChatTokenizer {
            tokenizer: tok,
            env,
            specials,
            cut,
            cache: Mutex::new(Pieces::default()),
            failed: AtomicU64::new(0),
            over_budget: AtomicU64::new(0),
        })
    }

    /// Whether it has a chat template (chats are rendered with it).
    pub fn has_template(&self) -> bool {
        self.env.is_some()
    }

    /// Chats that fell back to the byte approximation since load: those
    /// whose template failed, and those past its budget.
    pub fn fallbacks(&self) -> (u64, u64) {
        (
            self.failed.load(Ordering::Relaxed),
            self.over_budget.load(Ordering::Relaxed),
        )
    }

    /// The prompt of a request body as the engine's token ids: a chat
    /// rendered and tokenized, a completion's prompt tokenized (or taken
    /// as ids). `None` when the body has neither, or the template fails
    /// on it: the caller falls back to the byte approximation.
    pub fn prompt_ids(&self, body: &[u8]) -> Option<PromptIds> {
        let b: Body<'_> = serde_json::from_slice(body).ok()?;
        let ids = if b.messages.is_some() {
            let text = match self.render_chat(&b) {
                Ok(t) => t,
                Err(e) => {
                    let counter = if e.kind() == ErrorKind::OutOfFuel {
                        &self.over_budget
                    } else {
                        &self.failed
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            };
            self.encode(&text).ok()?
        } else {
            let prompt = b.prompt?;
            match serde_json::from_str::<String>(prompt.get()) {
                Ok(text) => {
                    let enc = self.tokenizer.encode_fast(text.as_str(), true).ok()?;
                    enc.get_ids().to_vec()
                }
                Err(_) => serde_json::from_str::<Vec<u32>>(prompt.get()).ok()?,
            }
        };
        Some(PromptIds {
            ids,
            cache_salt: b.cache_salt,
        })
    }

    /// Renders `messages` (a JSON array) with the chat template, as the
    /// engine would for a chat request.
    pub fn render(
        &self,
        messages: &str,
        tools: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let json = format!(
            r#"{{"messages":{messages},"tools":{},"add_generation_prompt":{add_generation_prompt}}}"#,
            tools.unwrap_or("null")
        );
        let b: Body<'_> = serde_json::from_str(&json).map_err(ChatError::Json)?;
        self.render_chat(&b).map_err(ChatError::Template)
    }

    fn render_chat(&self, b: &Body<'_>) -> Result<String, Error> {
        let env = self
            .env
            .as_ref()
            .ok_or_else(|| Error::new(ErrorKind::TemplateNotFound, "no chat template"))?;
        let value = |v: &Option<Value>| v.clone().unwrap_or_else(|| Value::from(()));
        let mut ctx: std::collections::BTreeMap<String, Value> = self
            .specials
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        let continue_final = b.continue_final_message.unwrap_or(false);
        ctx.insert("messages".into(), value(&b.messages));
        ctx.insert("tools".into(), value(&b.tools));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(b.add_generation_prompt.unwrap_or(!continue_final)),
        );
        if let Some(kw) = &b.chat_template_kwargs
            && let Ok(keys) = kw.try_iter()
        {
            for k in keys {
                let v = kw.get_item(&k)?;
                ctx.insert(k.to_string(), v);
            }
        }
        env.get_template(TEMPLATE)?.render(Value::from(ctx))
    }

    /// `text`'s ids, no special tokens added, cut and cached as the module
    /// docs say.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ChatError> {
        let mut ids = Vec::new();
        let Some((ac, cut_ids)) = &self.cut else {
            self.piece(text, &mut ids)?;
            return Ok(ids);
        };
        let mut at = 0;
        for m in ac.find_iter(text) {
            self.piece(&text[at..m.start()], &mut ids)?;
            ids.push(cut_ids[m.pattern().as_usize()]);
            at = m.end();
        }
        self.piece(&text[at..], &mut ids)?;
        Ok(ids)
    }

    fn piece(&self, text: &str, ids: &mut Vec<u32>) -> Result<(), ChatError> {
        if text.is_empty() {
            return Ok(());
        }
        let key = xxh3_64(text.as_bytes());
        if let Some(got) = self.cache.lock().get(key) {
            ids.extend_from_slice(&got);
            return Ok(());
        }
        let enc = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(ChatError::Tokenize)?;
        let got: Arc<[u32]> = enc.get_ids().into();
        ids.extend_from_slice(&got);
        self.cache.lock().put(key, got);
        Ok(())
    }
}

/// The added tokens matched on the raw text, as the tokenizer matches
/// them (leftmost, longest), and their ids. Tokens that strip the
/// whitespace beside them, match whole words only, or are matched after
/// normalization are left inside the pieces.
fn cut_points(tok: &Tokenizer) -> Option<(AhoCorasick, Vec<u32>)> {
    let mut tokens: Vec<(String, u32)> = tok
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| !t.lstrip && !t.rstrip && !t.single_word && !t.normalized)
        .filter(|(_, t)| !t.content.is_empty())
        .map(|(id, t)| (t.content, id))
        .collect();
    if tokens.is_empty() {
        return None;
    }
    tokens.sort();
    let ac = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(tokens.iter().map(|(t, _)| t))
        .ok()?;
    Some((ac, tokens.into_iter().map(|(_, id)| id).collect()))
}

/// Jinja as `transformers` sets it up for chat templates.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_filter("tojson", tojson);
    env
}

/// `tojson` as `transformers` defines it: Python's `json.dumps` with
/// `ensure_ascii=False` (and `indent`, `sort_keys` when given).
fn tojson(v: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, v, indent, sort.unwrap_or(false), 0)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(
    out: &mut String,
    v: &Value,
    indent: Option<usize>,
    sort: bool,
    depth: usize,
) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let (item_sep, key_sep) = if indent.is_some() {
        (",", ": ")
    } else {
        (", ", ": ")
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(i) = v.as_i64() {
                out.push_str(&i.to_string());
            } else {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 {
                    out.push_str(&format!("{f:.1}"));
                } else if f.is_finite() {
                    out.push_str(&f.to_string());
                } else {
                    out.push_str(if f.is_nan() {
                        "NaN"
                    } else if f > 0.0 {
                        "Infinity"
                    } else {
                        "-Infinity"
                    });
                }
            }
        }
        ValueKind::String => quote(out, v.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(out, item, indent, sort, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if sort {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                match k.as_str() {
                    Some(s) => quote(out, s),
                    None => quote(out, &k.to_string()),
                }
                out.push_str(key_sep);
                write_json(out, &v.get_item(k)?, indent, sort, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => quote(out, &v.to_string()),
    }
    Ok(())
}

/// A JSON string as Python writes it with `ensure_ascii=False`.
fn quote(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}
