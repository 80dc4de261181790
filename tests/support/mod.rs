//! Test support: a gateway on port 0 in front of simulated backends on port
//! 0, and a small HTTP client over real TCP.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::disallowed_methods)] // waits for child processes on the wall clock

pub mod batch;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use fairway::PolicySource;
use fairway::config::parse_policy;
use fairway::edge::server::Server;
use fairway::sim::backend::{SimBackend, SimHandle};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A fast simulated backend: 1 ms decode steps at 1× (tests stay quick but
/// streams still take measurable time).
pub async fn sim(model: &str, max_num_seqs: u32) -> SimHandle {
    SimBackend::builder(model)
        .max_num_seqs(max_num_seqs)
        .decode_step(Duration::from_millis(2), Duration::from_micros(10))
        .start()
        .await
        .expect("sim backend starts")
}

/// A free port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a gateway from a TOML policy; `{b0}`, `{b1}`… in the text are
/// replaced by the given backends' `host:port`.
pub async fn gateway(toml: &str, backends: &[&SimHandle]) -> Server {
    let mut text = toml.to_owned();
    for (i, b) in backends.iter().enumerate() {
        text = text.replace(&format!("{{b{i}}}"), &b.addr().to_string());
    }
    let policy = parse_policy(&text, "test.toml").unwrap_or_else(|e| {
        panic!(
            "test policy invalid: {}",
            e.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        )
    });
    Server::start(policy, PolicySource { path: None, text })
        .await
        .expect("gateway starts")
}

/// The standard server block with port-0 listeners.
pub const SERVER: &str = r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
max_body_bytes = 65536
drain_timeout = "5s"
"#;

/// Two tenants in front of two backends serving `m` and its LoRA adapter
/// `m-lora`: `alpha` (key `ka`, 100 requests/s, burst 50) and `beta` (key
/// `kb`, a burst of one request). `tests/sdk/clients.py` relies on these
/// keys and limits.
pub async fn two_tenant_gateway() -> ((SimHandle, SimHandle), Server) {
    const POLICY: &str = r#"
[[pools]]
model = "m"
adapters = ["m-lora"]
backends = [{ name = "b0", url = "http://{b0}" }, { name = "b1", url = "http://{b1}" }]

[[tenants]]
name = "alpha"
api_keys = ["ka"]
rate = 100.0
burst = 50

[[tenants]]
name = "beta"
api_keys = ["kb"]
rate = 0.01
burst = 1
"#;
    let lora_sim = || {
        SimBackend::builder("m")
            .max_num_seqs(8)
            .decode_step(Duration::from_millis(2), Duration::from_micros(10))
            .lora(&["m-lora"], 2)
            .start()
    };
    let b0 = lora_sim().await.expect("sim backend starts");
    let b1 = lora_sim().await.expect("sim backend starts");
    let gw = gateway(&format!("{SERVER}{POLICY}"), &[&b0, &b1]).await;
    ((b0, b1), gw)
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn post(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
    body: impl Into<Bytes>,
) -> Request<Full<Bytes>> {
    let mut b =
        Request::post(format!("http://{addr}{path}")).header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    b.body(Full::new(body.into())).unwrap()
}

pub async fn send(c: &HttpClient, req: Request<Full<Bytes>>) -> Reply {
    let resp = c.request(req).await.expect("request reaches the gateway");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body completes").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn open(c: &HttpClient, req: Request<Full<Bytes>>) -> http::Response<Incoming> {
    c.request(req).await.expect("request reaches the gateway")
}

/// The gateway's `/metrics`, from its admin listener.
pub async fn scrape(gw: &Server) -> String {
    get(&client(), format!("http://{}/metrics", gw.admin_addr()))
        .await
        .text()
}

pub async fn get(c: &HttpClient, url: String) -> Reply {
    let req = Request::get(url).body(Full::new(Bytes::new())).unwrap();
    send(c, req).await
}

/// `POST /admin/reload` on the gateway's admin listener.
pub async fn reload(gw: &Server) -> Reply {
    let req = Request::post(format!("http://{}/admin/reload", gw.admin_addr()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    send(&client(), req).await
}

pub fn chat(model: &str, max_tokens: u32, stream: bool) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
    .to_string()
}

/// One metric's value from Prometheus text (first series whose name and
/// labels start with `prefix`).
pub fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Sum of every series starting with `prefix`.
pub fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls `f` until it returns true or `timeout` passes.
pub async fn eventually(timeout: Duration, mut f: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Feeds an exposition to the real `promtool check metrics`. Skips (with a
/// note) where promtool is missing, except in CI, which must install it.
pub fn promtool_check(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install promtool (Debian package prometheus)"
        );
        eprintln!("promtool not installed; skipping the exposition check");
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool rejected the scrape:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a [`recorder`] received: each request's headers and body.
pub type Seen = Arc<Mutex<Vec<(http::HeaderMap, Bytes)>>>;

/// A server on port 0 that records every request and answers `reply`.
pub async fn recorder(reply: &'static str) -> (SocketAddr, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let s = s.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let s = s.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        s.lock().unwrap().push((parts.headers, body));
                        let mut resp =
                            Response::new(Full::new(Bytes::from_static(reply.as_bytes())));
                        resp.headers_mut()
                            .insert("content-type", "application/json".parse().unwrap());
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// A real `fairway serve` process on `policy` (a file), started as
/// `prefix... fairway serve --config policy --watch-interval 0s extra...`
/// (a prefix such as `prlimit --nofile=64:64`), with stdout read up to its
/// listen line and kept open: it prints more after that, and a closed pipe
/// would end it.
pub struct ServeProcess {
    pub child: std::process::Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl ServeProcess {
    pub fn start(
        prefix: &[&str],
        global: &[&str],
        policy: &std::path::Path,
        log: &str,
        stderr: std::process::Stdio,
    ) -> ServeProcess {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let bin = env!("CARGO_BIN_EXE_fairway");
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let mut child = cmd
            .args(global)
            .args(["serve", "--config"])
            .arg(policy)
            .args(["--watch-interval", "0s"])
            .env("RUST_LOG", log)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("fairway starts");
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        // "fairway listening on http://ADDR (admin on http://ADMIN)"
        let addrs: Vec<SocketAddr> = line
            .split("http://")
            .skip(1)
            .map(|s| {
                s.split(|c: char| c.is_whitespace() || c == ')')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap_or_else(|e| panic!("listen line {line:?}: {e}"))
            })
            .collect();
        ServeProcess {
            child,
            addr: addrs[0],
            admin: addrs[1],
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `text` to a fresh policy file in a per-test temporary folder.
pub fn temp_policy(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fairway-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policy.toml");
    write_atomically(&path, text);
    path
}

/// Saves like an editor does: write a temp file, then rename over.
pub fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A real `redis-server` on a free port, stopped when dropped.
pub struct RedisServer {
    child: Option<std::process::Child>,
    pub port: u16,
    dir: std::path::PathBuf,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("fairway-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = RedisServer {
            child: None,
            port,
            dir,
        };
        r.restart();
        r
    }

    /// `redis://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (as a crash would: no save, no goodbye).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it (again) on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server runs (tests/run.sh installs it)");
        self.child = Some(child);
        let start = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `python script args...` off the async workers and returns whether
/// it exited 0, with its stdout and stderr together.
pub async fn run_python(
    python: std::path::PathBuf,
    script: std::path::PathBuf,
    args: Vec<std::ffi::OsString>,
) -> (bool, String) {
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .args(args)
            .output()
            .expect("python runs")
    })
    .await
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Writes a word-level tokenizer (`tokenizer.json`: whitespace
/// pre-tokenizer, `<|im_start|>` and `<|im_end|>` special, every other
/// word of `words` an id, the rest `[UNK]`) and a ChatML template
/// (`tokenizer_config.json`) into `dir`: a pool's tokenizer for tests.
pub fn write_test_tokenizer(dir: &std::path::Path, words: &[&str]) {
    let specials = ["[UNK]", "<|im_start|>", "<|im_end|>"];
    let added: Vec<serde_json::Value> = specials
        .iter()
        .enumerate()
        .map(|(id, t)| {
            serde_json::json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let mut vocab = serde_json::Map::new();
    for (id, w) in specials.iter().chain(words).enumerate() {
        vocab.entry(w.to_string()).or_insert(serde_json::json!(id));
    }
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let config = serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}

/// A real S3-compatible server (moto's, from the venv `tests/run.sh`
/// makes in `target/s3-venv`) on a free port, stopped when dropped.
/// `None` (the test skips) where it is not installed, except in CI.
pub struct S3Server {
    child: std::process::Child,
    pub port: u16,
}

impl S3Server {
    pub fn start() -> Option<S3Server> {
        let bin =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/s3-venv/bin/moto_server");
        if !bin.exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must install the S3 server (tests/run.sh makes target/s3-venv)"
            );
            eprintln!("skipped: no {} (run tests/run.sh)", bin.display());
            return None;
        }
        let port = free_port();
        let child = std::process::Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("moto_server starts");
        let start = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the S3 server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(S3Server { child, port })
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates bucket `name` (S3's `PUT /name`).
    pub fn bucket(&self, name: &str) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "PUT /{name} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
