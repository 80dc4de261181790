//! A pool's prefix-routing keys (`prefix_block_tokens`,
//! `prefix_index_blocks`, `prefix_ttl`), its tokenizer (`tokenizer`,
//! `tokenizer_config`, `chat_template`: local files, relative to the
//! policy file, loaded here so that a bad one is an error at its key), and
//! a backend's `kv_events`:
//! where its engine publishes its KV-cache events
//! (vLLM's `--kv-events-config`), for routing on what it really caches.
//!
//! `kv_events = "tcp://10.0.0.5:5557"`, or a table `{ endpoint = …,
//! replay = "tcp://10.0.0.5:5558", topic = "kv@pod-a@llama" }`. Fairway
//! connects to both (so vLLM must bind them: `tcp://*:5557` in its
//! config); `replay` is the engine's `replay_endpoint`, asked for the
//! batches missed after a gap.

use super::reader::{Reader, Table, Value, Zero};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::policy::{BackendPolicy, KvEventsSource, PoolTokenizer, PrefixSpec, Strategy};
use crate::fault::Chain;
use crate::tokens::ChatTokenizer;

const KEYS: &[&str] = &["endpoint", "replay", "topic"];

pub(super) fn read_kv_events(
    r: &mut Reader<'_>,
    v: &Value<'_>,
    path: &str,
) -> Option<KvEventsSource> {
    if matches!(v.get_ref(), toml::de::DeValue::Boolean(_)) {
        // `true`: an in-process simulated backend publishes its own
        // (checked against the target by the caller).
        return r.boolean(v, path)?.then(|| KvEventsSource {
            endpoint: String::new(),
            replay: None,
            topic: String::new(),
        });
    }
    if matches!(v.get_ref(), toml::de::DeValue::String(_)) {
        let endpoint = read_tcp(r, v, path)?;
        return Some(KvEventsSource {
            endpoint,
            replay: None,
            topic: String::new(),
        });
    }
    let t = r.table(v, path)?;
    r.check_keys(&t, KEYS);
    let endpoint = r.req(
        &t,
        "endpoint",
        "the engine's KV-events PUB address",
        read_tcp,
    );
    let replay = r.opt(&t, "replay", read_tcp);
    let topic = r.opt(&t, "topic", Reader::string).unwrap_or_default();
    Some(KvEventsSource {
        endpoint: endpoint?,
        replay,
        topic,
    })
}

/// `tcp://host:port`, a host Fairway can connect to.
fn read_tcp(r: &mut Reader<'_>, v: &Value<'_>, path: &str) -> Option<String> {
    let s = r.string(v, path)?;
    let why = match s.strip_prefix("tcp://").and_then(|a| a.rsplit_once(':')) {
        None => Some("it must be `tcp://host:port`"),
        Some((host, _)) if host.is_empty() || host == "*" || host == "0.0.0.0" => {
            Some("Fairway connects to the engine: name its host (the engine binds `tcp://*:port`)")
        }
        Some((_, port)) if port.parse::<u16>().map_or(true, |p| p == 0) => {
            Some("the port must be a number from 1 to 65535")
        }
        Some(_) => None,
    };
    match why {
        None => Some(s),
        Some(why) => {
            r.error(
                v.span(),
                path,
                format!("invalid KV-events endpoint \"{s}\": {why}"),
            );
            None
        }
    }
}

/// A pool's prefix-routing keys, over the defaults.
pub(super) fn read_prefix(r: &mut Reader<'_>, t: &Table<'_, '_>) -> PrefixSpec {
    let default = PrefixSpec::default();
    PrefixSpec {
        block_tokens: r
            .opt(t, "prefix_block_tokens", |r, v, p| {
                read_at_most(r, v, p, MAX_PREFIX_BLOCK_TOKENS)
            })
            .unwrap_or(default.block_tokens),
        index_blocks: r
            .opt(t, "prefix_index_blocks", |r, v, p| {
                read_at_most(r, v, p, MAX_PREFIX_INDEX_BLOCKS)
            })
            .unwrap_or(default.index_blocks),
        ttl: r
            .opt(t, "prefix_ttl", |r, v, p| r.duration(v, p, Zero::Refused))
            .unwrap_or(default.ttl),
    }
}

/// The largest `prefix_block_tokens`: a block longer than most prompts
/// matches nothing.
const MAX_PREFIX_BLOCK_TOKENS: u64 = 4096;
/// The largest `prefix_index_blocks` (about 5 GiB of index).
const MAX_PREFIX_INDEX_BLOCKS: u64 = 64 << 20;

/// A positive integer of at most `max`.
fn read_at_most<T: TryFrom<u64>>(
    r: &mut Reader<'_>,
    v: &Value<'_>,
    path: &str,
    max: u64,
) -> Option<T> {
    let n: u64 = r.positive_int(v, path)?;
    if n > max {
        r.error(v.span(), path, format!("must be at most {max}"));
        return None;
    }
    T::try_from(n).ok()
}

/// `kv_events` only serves the prefix strategy: say so where it is set
/// for a pool that routes otherwise.
pub(super) fn check_kv_events(
    r: &mut Reader<'_>,
    t: &Table<'_, '_>,
    routing: Strategy,
    backends: &[BackendPolicy],
) {
    if routing != Strategy::PrefixAware
        && let Some(b) = backends.iter().find(|b| b.kv_events.is_some())
    {
        r.error(
            t.span.clone(),
            &t.child("routing"),
            format!(
                "backend \"{}\" has `kv_events`, which only `routing = \"prefix_aware\"` uses",
                b.name
            ),
        );
    }
}

/// A pool's `tokenizer` (a `tokenizer.json`), with `tokenizer_config`
/// (default: `tokenizer_config.json` beside it, if there is one) and
/// `chat_template` (default: `chat_template.jinja` beside it, else the
/// config's), loaded.
pub(super) fn read_tokenizer(r: &mut Reader<'_>, t: &Table<'_, '_>) -> Option<PoolTokenizer> {
    let base = Path::new(r.file())
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let path =
        |r: &mut Reader<'_>, v: &Value<'_>, p: &str| -> Option<(PathBuf, std::ops::Range<usize>)> {
            let s = r.non_empty(v, p)?;
            Some((base.join(s), v.span()))
        };
    let config = r.opt(t, "tokenizer_config", path);
    let template = r.opt(t, "chat_template", path);
    let Some((tokenizer, span)) = r.opt(t, "tokenizer", path) else {
        if config.is_some() || template.is_some() {
            r.error(
                t.span.clone(),
                &t.child("tokenizer"),
                "`tokenizer_config` and `chat_template` need `tokenizer` (the model's tokenizer.json)",
            );
        }
        return None;
    };
    let config = config.map(|(p, _)| p).or_else(|| {
        let beside = tokenizer.with_file_name("tokenizer_config.json");
        beside.is_file().then_some(beside)
    });
    // `transformers` saves a model's template beside its tokenizer as
    // `chat_template.jinja` (and reads it before the config's).
    let template = template.map(|(p, _)| p).or_else(|| {
        let beside = tokenizer.with_file_name("chat_template.jinja");
        beside.is_file().then_some(beside)
    });
    match ChatTokenizer::load(&tokenizer, config.as_deref(), template.as_deref()) {
        Ok(loaded) => Some(PoolTokenizer {
            tokenizer,
            config,
            template,
            loaded: Arc::new(loaded),
        }),
        Err(why) => {
            r.error(
                span,
                &t.child("tokenizer"),
                format!("cannot load the tokenizer: {}", Chain(&why)),
            );
            None
        }
    }
}
