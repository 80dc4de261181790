//! vLLM's embedding and pooling answers for the simulated backend: a small
//! deterministic vector per input, and the scores, labels and vectors of
//! the pooling routes (rerank, score, classify, pooling).

use bytes::Bytes;
use serde_json::{Value, json};

use super::openai::text_of;

/// Dimensions of the deterministic embedding.
const EMBEDDING_DIMS: usize = 8;

/// The answer of a pooling route (`path`) in vLLM's shape: a score per
/// document (rerank), per pair (score), a label per input (classify) or a
/// vector per input (pooling).
pub(super) fn pooling_response(
    path: &str,
    req: &Value,
    model: &str,
    id: u64,
    tokens: u32,
) -> Value {
    let items = |key: &str| match req.get(key) {
        Some(Value::Array(a)) => a.clone(),
        Some(v) => vec![v.clone()],
        None => Vec::new(),
    };
    let score = |v: &Value| {
        let mut text = String::new();
        text_of(v, &mut text);
        (embed(&text)[0] + 0.5).clamp(0.0, 1.0)
    };
    let usage = json!({"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0});
    match path.trim_start_matches("/v1").trim_start_matches("/v2") {
        "/rerank" => {
            let results: Vec<Value> = items("documents")
                .iter()
                .enumerate()
                .map(|(i, d)| json!({"index": i, "document": {"text": d}, "relevance_score": score(d)}))
                .collect();
            json!({"id": format!("rerank-{id:016x}"), "model": model,
                "usage": {"total_tokens": tokens}, "results": results})
        }
        "/score" => {
            let data: Vec<Value> = items("text_2")
                .iter()
                .enumerate()
                .map(|(i, t)| json!({"index": i, "object": "score", "score": score(t)}))
                .collect();
            json!({"id": format!("score-{id:016x}"), "object": "list", "created": crate::clock::unix_seconds(),
                "model": model, "data": data, "usage": usage})
        }
        "/classify" => {
            let data: Vec<Value> = items("input")
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let p = score(t);
                    let label = if p >= 0.5 { "positive" } else { "negative" };
                    json!({"index": i, "label": label, "probs": [1.0 - p, p], "num_classes": 2})
                })
                .collect();
            json!({"id": format!("classify-{id:016x}"), "object": "list", "created": crate::clock::unix_seconds(),
                "model": model, "data": data, "usage": usage})
        }
        _ => {
            let data: Vec<Value> = items("input")
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let mut text = String::new();
                    text_of(t, &mut text);
                    json!({"index": i, "object": "pooling", "data": embed(&text)})
                })
                .collect();
            json!({"id": format!("pool-{id:016x}"), "object": "list", "created": crate::clock::unix_seconds(),
                "model": model, "data": data, "usage": usage})
        }
    }
}

/// OpenAI's embedding list with a small deterministic vector per input.
pub(super) fn embedding_response(model: &str, inputs: &[String], prompt_tokens: u32) -> Bytes {
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, text)| json!({"object": "embedding", "index": i, "embedding": embed(text)}))
        .collect();
    let v = json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    });
    Bytes::from(v.to_string())
}

/// A unit vector derived from the text by FNV-1a, so equal texts embed equally.
fn embed(text: &str) -> Vec<f64> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut v = Vec::with_capacity(EMBEDDING_DIMS);
    for _ in 0..EMBEDDING_DIMS {
        for b in text.bytes().chain([0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        v.push((h >> 11) as f64 / (1u64 << 53) as f64 - 0.5);
    }
    let norm = v
        .iter()
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
        .max(f64::MIN_POSITIVE);
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeddings_are_deterministic_unit_vectors() {
        let a = embed("hello");
        assert_eq!(a, embed("hello"));
        assert_ne!(a, embed("world"));
        assert!((a.iter().map(|x| x * x).sum::<f64>() - 1.0).abs() < 1e-9);
    }
}
