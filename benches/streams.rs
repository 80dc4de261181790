//! Holds many idle streams open through a gateway, for `benches/e2e.sh`'s
//! memory rows: N streaming chat completions over HTTP/2 (cleartext, prior
//! knowledge), 100 streams per connection so that 10,000 fit in the
//! machine's file-descriptor limit, each held once its response headers
//! have arrived (the backend is slow, so each stream then idles). Streams
//! are opened one connection's worth at a time.
//!
//!   cargo bench --bench streams -- ADDR COUNT KEY MODEL
//!
//! Prints `held COUNT` once every stream is open and keeps them until stdin
//! closes; exits non-zero if any stream fails.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const STREAMS_PER_CONNECTION: usize = 100;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    // `cargo bench` with no bench named runs every bench target with no
    // arguments: this one is a client that benches/e2e.sh starts.
    if args.is_empty() {
        eprintln!("streams: a client for benches/e2e.sh; usage: streams ADDR COUNT KEY MODEL");
        return Ok(());
    }
    let [addr, count, key, model] = args.as_slice() else {
        return Err("usage: streams ADDR COUNT KEY MODEL".into());
    };
    let count: usize = count.parse()?;
    let body = format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"hold"}}],"max_tokens":4000,"stream":true}}"#
    );
    // One client per connection: hyper's HTTP/2 pool would put every
    // stream on one connection, past the server's stream limit.
    let clients: Vec<Client<_, Full<Bytes>>> = (0..count.div_ceil(STREAMS_PER_CONNECTION))
        .map(|_| {
            Client::builder(TokioExecutor::new())
                .http2_only(true)
                .http2_initial_stream_window_size(65_535)
                .build_http()
        })
        .collect();
    // One connection's streams at a time: streams accumulate as they do in
    // service, rather than all their requests being set up at once.
    let mut held = Vec::with_capacity(count);
    for (c, client) in clients.iter().enumerate() {
        let mut pending = tokio::task::JoinSet::new();
        for _ in (c * STREAMS_PER_CONNECTION)..((c + 1) * STREAMS_PER_CONNECTION).min(count) {
            let req = Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("authorization", format!("Bearer {key}"))
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body.clone())))?;
            let client = client.clone();
            pending.spawn(async move {
                tokio::time::timeout(Duration::from_secs(60), client.request(req)).await
            });
        }
        while let Some(r) = pending.join_next().await {
            let resp = r???;
            if !resp.status().is_success() {
                return Err(format!("a stream was answered {}", resp.status()).into());
            }
            held.push(resp);
        }
    }
    println!("held {}", held.len());
    // Hold until the caller closes stdin.
    let mut sink = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await?;
    drop(held);
    Ok(())
}
