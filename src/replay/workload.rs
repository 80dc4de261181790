//! Workload files: one request a line, JSON.
//!
//! ```text
//! {"t": 0.125, "tenant": "api", "model": "llama-3.1-8b-sim", "prompt_tokens": 412,
//!  "max_tokens": 256, "output_tokens": 180, "stream": true}
//! ```
//!
//! - `t`: seconds since the start of the workload (≥ 0; lines need not be
//!   sorted, the loader sorts them stably).
//! - `tenant`, `model`: names as in the policy. A tenant the policy does not
//!   declare is replayed as `default` would be served live: refused with
//!   401 when the policy has tenants (counted as refused, limit `auth`).
//! - `prompt_tokens` (≥ 0), `output_tokens` (≥ 1): what the engine processes
//!   and generates; `max_tokens` (optional): what the client asked for, the
//!   gateway's estimate before the response.
//! - `stream` (default `false`): a streamed response's TTFT is its first
//!   token; a non-streamed one's is the whole response, as a client sees it.
//! - `prefix` (optional): where the prompt's first tokens come from, for
//!   prefix caching: a list of `{"stream": 7, "tokens": 900}` segments, in
//!   order. Requests naming the same stream share its tokens from its
//!   start (a system prompt, a few-shot header, a conversation so far);
//!   the prompt's tokens past the segments are the request's own.
//!
//! Blank lines and lines starting with `#` are skipped. Any other line that
//! is not such an object is an error naming its line number.
//!
//! [`from_access_log`] turns Fairway's own JSON access log (`serve
//! --log-json`) into this format, so recorded traffic can be replayed.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// One request of a workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkRequest {
    /// Seconds since the start of the workload.
    pub t: f64,
    pub tenant: String,
    pub model: String,
    pub prompt_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    pub output_tokens: u32,
    #[serde(default)]
    pub stream: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefix: Vec<Segment>,
    /// An item of a batch the gateway runs for its tenant (the Batch API):
    /// it waits in the pools' batch lane, within the batch's 24 hours.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub batch: bool,
    /// A closed-loop client's: sent when the client's previous request in
    /// the workload ended (its `t` is then when it may go at the earliest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<u64>,
}

/// Tokens `0..tokens` of token stream `stream` (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Segment {
    pub stream: u64,
    pub tokens: u32,
}

impl WorkRequest {
    /// Its prompt's token ids: its segments', then its own from stream
    /// `own` (distinct per request), `prompt_tokens` in all.
    pub fn token_ids(&self, own: u64) -> Vec<u32> {
        let n = self.prompt_tokens as usize;
        let mut ids = Vec::with_capacity(n);
        for seg in &self.prefix {
            let take = (seg.tokens as usize).min(n - ids.len());
            ids.extend((0..take as u64).map(|i| stream_token(seg.stream, i)));
        }
        let start = ids.len() as u64;
        ids.extend((start..n as u64).map(|i| stream_token(own ^ OWN, i)));
        ids
    }
}

impl WorkRequest {
    /// Its prompt as text, four ASCII characters a token id, so that its
    /// approximate ids (`crate::tokens::approximate_ids`) run alike where
    /// and only where its token ids do: what `replay --live` sends.
    pub fn prompt_text(&self, own: u64) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+-";
        let ids = self.token_ids(own);
        let mut text = String::with_capacity(ids.len() * 4);
        for id in ids {
            for k in 0..4 {
                text.push(char::from(ALPHABET[(id >> (6 * k)) as usize & 63]));
            }
        }
        text
    }
}

/// Marks a request's own stream apart from the shared ones.
const OWN: u64 = 0x6f77_6e00_0000_0000;

/// Token `i` of stream `s`: a hash, so streams share no run of tokens.
fn stream_token(s: u64, i: u64) -> u32 {
    xxhash_rust::xxh3::xxh3_64_with_seed(&i.to_le_bytes(), s) as u32
}

/// A line of a workload file that could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    /// 1-based.
    pub line: usize,
    pub message: String,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for LineError {}

/// Parses a JSONL workload, sorted by `t` (stable). Stops at the first bad
/// line.
pub fn parse_jsonl(text: &str) -> Result<Vec<WorkRequest>, LineError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |message: String| LineError {
            line: i + 1,
            message,
        };
        let r: WorkRequest = serde_json::from_str(line).map_err(|e| err(e.to_string()))?;
        if !r.t.is_finite() || r.t < 0.0 {
            return Err(err(format!(
                "`t` must be a finite number of seconds ≥ 0, got {}",
                r.t
            )));
        }
        if r.output_tokens == 0 {
            return Err(err("`output_tokens` must be at least 1".into()));
        }
        if r.tenant.is_empty() || r.model.is_empty() {
            return Err(err("`tenant` and `model` must not be empty".into()));
        }
        out.push(r);
    }
    out.sort_by(|a, b| a.t.total_cmp(&b.t));
    Ok(out)
}

/// Writes a workload as JSONL.
pub fn to_jsonl(reqs: &[WorkRequest]) -> String {
    let mut s = String::with_capacity(reqs.len() * 120);
    for r in reqs {
        // A WorkRequest always serialises.
        if let Ok(line) = serde_json::to_string(r) {
            s.push_str(&line);
            s.push('\n');
        }
    }
    s
}

/// Turns a JSON access log (one `tracing` JSON event a line, as `fairway
/// serve --log-json` writes) into a workload. Only `fairway::access` events
/// of requests that reached a pool are used; a served one replays with its
/// real token counts, any other with its prompt estimate and `max_tokens`
/// (or 256) as output. Arrival is the event's timestamp less its `e2e_ms`;
/// `t` counts from the earliest arrival. Returns the workload and how many
/// access events were skipped (no tenant or model, or unparsable fields).
pub fn from_access_log(text: &str) -> Result<(Vec<WorkRequest>, usize), LineError> {
    let mut arrivals: Vec<(SystemTime, WorkRequest)> = Vec::new();
    let mut skipped = 0;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if !line.starts_with('{') {
            continue;
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue; // not a log event (a stray line of other output)
        };
        if v["target"] != "fairway::access" {
            continue;
        }
        let f = &v["fields"];
        let ts = v["timestamp"]
            .as_str()
            .and_then(|s| humantime::parse_rfc3339_weak(s).ok());
        let (Some(ts), Some(tenant), Some(model)) = (ts, f["tenant"].as_str(), f["model"].as_str())
        else {
            skipped += 1;
            continue;
        };
        if model == "unknown" || tenant == "unknown" {
            skipped += 1;
            continue;
        }
        let num = |k: &str| f[k].as_f64();
        let e2e = num("e2e_ms").unwrap_or(0.0).max(0.0);
        let arrived = ts
            .checked_sub(std::time::Duration::from_secs_f64(e2e / 1e3))
            .ok_or(LineError {
                line: i + 1,
                message: "timestamp before the epoch".into(),
            })?;
        let max_tokens = num("max_tokens").map(|m| m as u32);
        let served = f["outcome"] == "served";
        let prompt = match num("prompt_tokens") {
            Some(p) if served && p > 0.0 => p as u32,
            _ => num("prompt_tokens_estimate").unwrap_or(0.0) as u32,
        };
        let output = match num("completion_tokens") {
            Some(c) if served && c > 0.0 => c as u32,
            _ => max_tokens.unwrap_or(256),
        };
        arrivals.push((
            arrived,
            WorkRequest {
                t: 0.0,
                tenant: tenant.to_owned(),
                model: model.to_owned(),
                prompt_tokens: prompt,
                max_tokens,
                output_tokens: output.max(1),
                stream: f["stream"].as_bool().unwrap_or(false),
                prefix: Vec::new(),
                batch: false,
                client: None,
            },
        ));
    }
    arrivals.sort_by_key(|(at, _)| *at);
    let Some(start) = arrivals.first().map(|(at, _)| *at) else {
        return Ok((Vec::new(), skipped));
    };
    Ok((
        arrivals
            .into_iter()
            .map(|(at, mut r)| {
                r.t = at.duration_since(start).unwrap_or_default().as_secs_f64();
                r
            })
            .collect(),
        skipped,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_share_the_tokens_and_text_of_their_segments_only() {
        let req = |prompt_tokens, prefix: Vec<Segment>| WorkRequest {
            t: 0.0,
            tenant: "a".into(),
            model: "m".into(),
            prompt_tokens,
            max_tokens: None,
            output_tokens: 1,
            stream: false,
            prefix,
            batch: false,
            client: None,
        };
        let seg = |stream, tokens| Segment { stream, tokens };
        let a = req(100, vec![seg(7, 60)]);
        let b = req(80, vec![seg(7, 60)]);
        let (ia, ib) = (a.token_ids(1), b.token_ids(2));
        assert_eq!((ia.len(), ib.len()), (100, 80));
        assert_eq!(ia[..60], ib[..60]);
        assert!(ia[60..80].iter().zip(&ib[60..]).all(|(x, y)| x != y));
        // A conversation's next turn extends the last.
        let turn = req(150, vec![seg(7, 60), seg(9, 90)]);
        let next = req(200, vec![seg(7, 60), seg(9, 140)]);
        assert_eq!(turn.token_ids(3)[..], next.token_ids(4)[..150]);
        // As text: four characters a token, shared exactly as the ids are.
        let (ta, tb) = (a.prompt_text(1), b.prompt_text(2));
        assert_eq!(ta.len(), 400);
        assert_eq!(ta[..240], tb[..240]);
        assert_ne!(ta[240..244], tb[240..244]);
        assert_eq!(crate::tokens::estimate(&ta), 100);
    }

    #[test]
    fn parses_sorts_and_skips_comments() {
        let text = "# a workload\n\
            {\"t\": 1.5, \"tenant\": \"a\", \"model\": \"m\", \"prompt_tokens\": 10, \"output_tokens\": 5}\n\
            \n\
            {\"t\": 0.5, \"tenant\": \"b\", \"model\": \"m\", \"prompt_tokens\": 1, \"max_tokens\": 9, \"output_tokens\": 2, \"stream\": true}\n";
        let w = parse_jsonl(text).unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].tenant, "b");
        assert!(w[0].stream);
        assert_eq!(w[0].max_tokens, Some(9));
        assert!(!w[1].stream);
        assert_eq!(parse_jsonl(&to_jsonl(&w)).unwrap(), w);
    }

    #[test]
    fn malformed_lines_are_rejected_with_their_line_number() {
        let ok = r#"{"t": 0, "tenant": "a", "model": "m", "prompt_tokens": 1, "output_tokens": 1}"#;
        let cases = [
            ("{\"t\": 0, \"tenant\": \"a\"", "EOF"),
            (
                r#"{"t": -1, "tenant": "a", "model": "m", "prompt_tokens": 1, "output_tokens": 1}"#,
                "`t` must be",
            ),
            (
                r#"{"t": 0, "tenant": "a", "model": "m", "prompt_tokens": 1, "output_tokens": 0}"#,
                "at least 1",
            ),
            (
                r#"{"t": 0, "tenant": "a", "model": "m", "prompt_tokens": 1}"#,
                "missing field `output_tokens`",
            ),
            (
                r#"{"t": 0, "tenant": "a", "model": "m", "prompt_tokens": 1, "output_tokens": 1, "colour": 3}"#,
                "unknown field `colour`",
            ),
            ("not json", "expected"),
        ];
        for (bad, why) in cases {
            let text = format!("{ok}\n\n{bad}\n{ok}\n");
            let e = parse_jsonl(&text).unwrap_err();
            assert_eq!(e.line, 3, "{bad}");
            assert!(e.message.contains(why), "{bad}: {e}");
            assert!(e.to_string().starts_with("line 3: "));
        }
    }

    #[test]
    fn access_log_becomes_a_workload() {
        let log = r#"{"timestamp":"2026-12-03T08:00:01.000000Z","level":"INFO","fields":{"message":"request","tenant":"api","model":"m","outcome":"served","e2e_ms":500.0,"prompt_tokens":40,"completion_tokens":12,"prompt_tokens_estimate":38,"max_tokens":64,"stream":true},"target":"fairway::access"}
{"timestamp":"2026-12-03T08:00:00.750000Z","level":"INFO","fields":{"message":"request","tenant":"evals","model":"m","outcome":"shed","e2e_ms":0.0,"prompt_tokens":0,"completion_tokens":0,"prompt_tokens_estimate":100,"max_tokens":30,"stream":false},"target":"fairway::access"}
{"timestamp":"2026-12-03T08:00:00.800000Z","level":"INFO","fields":{"message":"backend ejected"},"target":"fairway::poller"}
{"timestamp":"2026-12-03T08:00:02.000000Z","level":"INFO","fields":{"message":"request","tenant":"unknown","model":"unknown","outcome":"refused"},"target":"fairway::access"}
plain text line
"#;
        let (w, skipped) = from_access_log(log).unwrap();
        assert_eq!(skipped, 1);
        assert_eq!(w.len(), 2);
        // api arrived at 00.500 (its event at 01.000 less 500 ms), evals at 00.750.
        assert_eq!((w[0].tenant.as_str(), w[0].t), ("api", 0.0));
        assert_eq!(w[1].tenant, "evals");
        assert!((w[1].t - 0.25).abs() < 1e-9, "{}", w[1].t);
        assert_eq!((w[0].prompt_tokens, w[0].output_tokens), (40, 12));
        assert_eq!((w[1].prompt_tokens, w[1].output_tokens), (100, 30));
        assert!(w[0].stream && !w[1].stream);
    }
}
