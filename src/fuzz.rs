//! Fuzz targets: every parser that reads outside input, each with the
//! properties it must keep on any input (not only "does not panic").
//!
//! They are driven two ways: by libFuzzer through `cargo fuzz` (the
//! `fuzz/` crate, coverage-guided, stable Rust with `--sanitizer none`;
//! `fuzz/run.sh` runs a million inputs per target), and by `tests/fuzz.rs`
//! in every test run, which replays the corpus and every input a fuzzer
//! ever found (`fuzz/regressions/`), then a short seeded mutation run.
//!
//! Each target takes raw bytes and panics when a property breaks.

use bytes::{Bytes, BytesMut};

use crate::config::MetricsDialect;
use crate::core::time::Instant;
use crate::gateway::relay::{self, Mode};
use crate::protocol::openai;

/// A fuzz target: panics when a property breaks on `data`.
pub type Target = fn(&[u8]);

/// The targets, by name (the names of `fuzz/fuzz_targets/*.rs` and of the
/// corpus folders).
pub const TARGETS: &[(&str, Target)] = &[
    ("request_body", request_body),
    ("sse_relay", sse_relay),
    ("metrics", metrics),
    ("policy", policy),
    ("multipart_form", multipart_form),
    ("kv_events", kv_events),
    ("batch_input", batch_input),
];

/// A batch's input file: the reader never panics; what it accepts has
/// unique `custom_id`s on increasing lines, each body a JSON object naming
/// its model, within the line limit; what it refuses says where, on a line
/// of the file.
pub fn batch_input(data: &[u8]) {
    use crate::protocol::batch::{Limits, read_input};
    let known = |m: &str| m.len() < 8;
    let limits = Limits {
        endpoint: "/v1/chat/completions",
        max_lines: 50,
        max_body_bytes: 4096,
        known_model: &known,
    };
    let lines = data.split(|&b| b == b'\n').count();
    match read_input(data, &limits) {
        Ok(items) => {
            assert!(!items.is_empty() && items.len() <= 50);
            let mut seen = std::collections::HashSet::new();
            let mut last = 0;
            for i in &items {
                assert!(i.line > last && (i.line as usize) <= lines, "{i:?}");
                last = i.line;
                assert!(seen.insert(i.custom_id.clone()), "{i:?}");
                let v: serde_json::Value = serde_json::from_slice(&i.body)
                    .unwrap_or_else(|e| panic!("an accepted body does not read: {e}: {i:?}"));
                assert_eq!(v["model"].as_str(), Some(i.model.as_str()));
                assert!(known(&i.model) && i.body.len() <= 4096);
            }
        }
        Err(errors) => {
            assert!(!errors.is_empty() && errors.len() <= 101);
            for e in &errors {
                assert!(
                    e.line.is_none_or(|l| l >= 1 && (l as usize) <= lines),
                    "{e:?}"
                );
                assert!(!e.code.is_empty() && !e.message.is_empty());
            }
        }
    }
}

/// An engine's KV-event batch: the decoder never panics, and a batch it
/// reads, written again as the simulated engine writes it, reads back to
/// the same events.
pub fn kv_events(data: &[u8]) {
    use crate::poller::kv_events::{decode_batch, encode_batch};
    let Ok(batch) = decode_batch(data) else {
        return;
    };
    let again = decode_batch(&encode_batch(&batch))
        .unwrap_or_else(|e| panic!("its own encoding does not decode: {e}: {batch:?}"));
    assert_eq!(again.events, batch.events);
    assert_eq!(again.data_parallel_rank, batch.data_parallel_rank);
    assert_eq!(again.ts.to_bits(), batch.ts.to_bits());
}

/// The request body peek: never panics, and the splice that asks the
/// backend for usage keeps every field Fairway read and leaves a body the
/// peek (and so a backend) still accepts.
pub fn request_body(data: &[u8]) {
    let Ok(info) = openai::parse(data) else {
        return;
    };
    let spliced = openai::with_usage_requested(&Bytes::copy_from_slice(data));
    let again = openai::parse(&spliced).unwrap_or_else(|e| {
        panic!(
            "the usage splice broke a valid body: {e:?}\n  in:  {:?}\n  out: {:?}",
            String::from_utf8_lossy(data),
            String::from_utf8_lossy(&spliced)
        )
    });
    assert!(again.include_usage, "usage not requested: {spliced:?}");
    assert_eq!(
        (
            again.model,
            again.stream,
            again.max_tokens,
            again.prompt_tokens
        ),
        (info.model, info.stream, info.max_tokens, info.prompt_tokens),
        "the splice changed what was read: {spliced:?}"
    );
}

/// The SSE relay and its usage peek: the first two bytes pick where the
/// rest is cut into frames. Whatever the cuts, a plain relay passes the
/// stream on byte for byte, a JSON relay and the Triton relays too (the
/// Triton stream's token count the same as uncut), and a stripping relay passes
/// exactly the stream less its usage-only events and finds the same usage.
pub fn sse_relay(data: &[u8]) {
    let (cuts, stream) = match data {
        [a, b, rest @ ..] => (u16::from_le_bytes([*a, *b]), rest),
        _ => return,
    };
    let frames = split(stream, cuts);
    let (plain, plain_usage) = relay::relay_frames(Mode::Sse, &frames);
    assert_eq!(plain, stream, "plain relay changed the stream");
    for mode in [Mode::Json, Mode::ResponsesJson] {
        let (json, _) = relay::relay_frames(mode, &frames);
        assert_eq!(json, stream, "JSON relay changed the body");
    }
    let (responses, responses_seen) = relay::relay_frames(Mode::ResponsesSse, &frames);
    assert_eq!(responses, stream, "Responses relay changed the stream");
    let (_, whole_responses) =
        relay::relay_frames(Mode::ResponsesSse, &[Bytes::copy_from_slice(stream)]);
    assert_eq!(
        responses_seen, whole_responses,
        "what the Responses relay read depends on the cuts"
    );
    let (triton, triton_usage) = relay::relay_frames(Mode::TritonSse, &frames);
    assert_eq!(triton, stream, "Triton relay changed the stream");
    let (_, whole_triton) = relay::relay_frames(Mode::TritonSse, &[Bytes::copy_from_slice(stream)]);
    assert_eq!(
        triton_usage, whole_triton,
        "Triton token count depends on the cuts"
    );
    let (triton_json, _) = relay::relay_frames(Mode::TritonJson, &frames);
    assert_eq!(triton_json, stream, "Triton JSON relay changed the body");
    let (stripped, usage) = relay::relay_frames(Mode::SseStripUsage, &frames);
    let whole = [Bytes::copy_from_slice(stream)];
    let (expected, whole_usage) = relay::relay_frames(Mode::SseStripUsage, &whole);
    assert_eq!(
        stripped, expected,
        "stripping depends on where the frames were cut"
    );
    assert_eq!(usage, whole_usage, "usage depends on the cuts");
    assert_eq!(
        plain_usage, usage,
        "plain and stripping relays read different usage"
    );
    assert!(stripped.len() <= stream.len());
}

/// Cuts `data` into frames: each bit of `cuts` says whether to cut after
/// the next 1, 2, 3… bytes (a cheap way to try many shapes).
fn split(data: &[u8], cuts: u16) -> Vec<Bytes> {
    let mut frames = Vec::new();
    let mut at = 0;
    let mut step = 1;
    let mut bit = 0;
    let mut frame = BytesMut::new();
    while at < data.len() {
        let end = (at + step).min(data.len());
        frame.extend_from_slice(&data[at..end]);
        if cuts & (1 << (bit % 16)) != 0 {
            frames.push(frame.split().freeze());
        }
        at = end;
        step = step % 7 + 1;
        bit += 1;
    }
    if !frame.is_empty() {
        frames.push(frame.freeze());
    }
    frames
}

/// A backend's metrics scrape in every dialect, twice (the second decode
/// reads the histograms' change since the first): never panics, and a
/// reading's KV usage is a fraction in 0..=1 (out-of-range values are
/// clamped or dropped, never passed to routing).
pub fn metrics(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for dialect in [
        MetricsDialect::Vllm,
        MetricsDialect::Triton,
        MetricsDialect::Trtllm,
        MetricsDialect::Sglang,
        MetricsDialect::Llamacpp,
        MetricsDialect::Agent,
    ] {
        let mut d = crate::poller::dialect::Decoder::new(dialect);
        let t0 = Instant::ZERO;
        for at in [t0, t0 + std::time::Duration::from_secs(1)] {
            if let Ok(r) = d.decode(text, at)
                && let Some(kv) = r.kv_usage
            {
                assert!((0.0..=1.0).contains(&kv), "{dialect:?}: kv_usage {kv}");
            }
        }
    }
}

/// The policy file: never panics; a file that validates serialises (as
/// `GET /admin/policy` shows it) with no API key in it.
pub fn policy(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env = |_: &str| Some("sk-fuzz-secret-from-env".to_owned());
    match crate::config::parse_policy_with_env(text, "fuzz.toml", &env) {
        Ok(p) => {
            let shown = serde_json::to_string(&p);
            assert!(
                shown.is_ok(),
                "a valid policy does not serialise: {shown:?}"
            );
            let shown = shown.unwrap_or_default();
            assert!(
                !shown.contains("sk-fuzz-secret-from-env"),
                "a key from the environment is shown"
            );
            for key in inline_keys(text) {
                assert!(!shown.contains(&key), "API key {key:?} is shown");
            }
        }
        Err(errors) => {
            assert!(!errors.is_empty(), "refused without a reason");
            for e in errors {
                let _ = e.to_string();
            }
        }
    }
}

/// The `api_keys` written in a policy file's tenants (long enough not to
/// occur in it by chance).
fn inline_keys(text: &str) -> Vec<String> {
    let Ok(doc) = toml::from_str::<toml::Table>(text) else {
        return Vec::new();
    };
    let tenants = doc.get("tenants").and_then(toml::Value::as_array);
    tenants
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("api_keys")?.as_array())
        .flatten()
        .filter_map(toml::Value::as_str)
        .filter(|k| k.len() >= 8)
        .map(str::to_owned)
        .collect()
}

/// The audio routes' multipart reader (boundary `fuzz`): whatever the
/// cuts (picked by the first byte), it reads the same model, `stream`
/// flag and duration as in one piece, or fails on both, and it holds no
/// more than a delimiter and a part's headers.
pub fn multipart_form(data: &[u8]) {
    use crate::protocol::audio::Form;
    let Some((&cut, body)) = data.split_first() else {
        return;
    };
    let read = |step: usize| {
        let mut f = Form::new("fuzz");
        for piece in body.chunks(step) {
            f.feed(piece)?;
            assert!(f.held() <= 16 << 10, "held {} bytes", f.held());
        }
        Ok::<_, crate::protocol::audio::FormError>(f)
    };
    let whole = read(body.len().max(1));
    let cut = read(usize::from(cut % 16) + 1);
    match (whole, cut) {
        (Ok(a), Ok(b)) => {
            let len = Some(body.len() as u64);
            assert_eq!(
                (
                    &a.model,
                    a.stream,
                    a.seconds(None),
                    a.seconds(len),
                    a.has_enough()
                ),
                (
                    &b.model,
                    b.stream,
                    b.seconds(None),
                    b.seconds(len),
                    b.has_enough()
                ),
                "the cuts changed what was read"
            );
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!("one reading failed: {:?} / {:?}", a.err(), b.err()),
    }
}
