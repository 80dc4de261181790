//! `fairway placement` as Kubernetes calls it: a real placement process
//! over TLS, fed by real `fairway agent` processes that scrape simulated
//! engines (the GPUs are simulated with `--simulate-gpus`: NVML needs a
//! GPU). The request bodies are the Kubernetes API's shapes: the
//! scheduler extender's `ExtenderArgs` (with a `NodeList` and with node
//! names) and `AdmissionReview` v1 for pod `CREATE` and `pods/binding`.
//!
//! The cluster:
//! - node-a: GPU 0 (80 GB, 10 used) runs llama-3.1-8b; GPU 1 is empty.
//!   Two agents: a node agent with the GPUs, an engine agent without.
//! - node-b: GPU 0 (80 GB, 20 used) runs an engine whose TTFT p99 is over
//!   150 ms (its prefill is slow and it is kept busy).
//! - node-c: GPU 0 (80 GB, 30 used) runs two engines.
//! - node-e: no agent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fairway::sim::backend::{SimBackend, SimHandle};
use http_body_util::{BodyExt, Full};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use serde_json::{Value, json};
use support::{chat, client, eventually, post, send, write_atomically};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// A `fairway` process, killed on drop, with the address of its listen
/// line (the first line it prints).
struct Proc {
    child: Child,
    addr: SocketAddr,
    _stdout: BufReader<ChildStdout>,
}

impl Proc {
    fn start(args: &[&str]) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fairway"))
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("fairway starts");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let addr = line
            .split_once("://")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?} from {args:?}"));
        Proc {
            child,
            addr,
            _stdout: stdout,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tls_data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tls")
        .join(name)
}

/// One HTTPS request, the server's certificate checked against the test CA.
async fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, Value) {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(tls_data("ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake with the placement service");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(format!("https://localhost:{}{path}", addr.port()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

/// A model server pod as a ReplicaSet creates it.
fn pod(name: &str, size: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "models",
            "labels": {"app": "vllm", "fairway.dev/placement": "enabled"},
            "annotations": {"fairway.dev/model": name.trim_end_matches("-0"), "fairway.dev/model-size-gb": size},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "vllm-7d9f", "uid": "5f1c", "controller": true}]
        },
        "spec": {
            "containers": [{
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.8.5",
                "args": ["--model", "meta-llama/Llama-3.1-8B-Instruct"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}
            }],
            "schedulerName": "default-scheduler"
        },
        "status": {"phase": "Pending"}
    })
}

/// `AdmissionReview` v1 for a pod `CREATE`.
fn create_review(uid: &str, pod: &Value, dry_run: bool) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"],
            "namespace": "models",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller", "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": dry_run,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
    .to_string()
}

/// `AdmissionReview` v1 for the scheduler's `pods/binding` of `pod` to `node`.
fn binding_review(uid: &str, pod: &str, node: &str, dry_run: bool) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding",
            "requestKind": {"group": "", "version": "v1", "kind": "Binding"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "requestSubResource": "binding",
            "name": pod,
            "namespace": "models",
            "operation": "CREATE",
            "userInfo": {"username": "system:kube-scheduler", "groups": ["system:authenticated"]},
            "object": {
                "kind": "Binding",
                "apiVersion": "v1",
                "metadata": {"name": pod, "namespace": "models", "uid": "9a1e", "creationTimestamp": null},
                "target": {"kind": "Node", "name": node}
            },
            "oldObject": null,
            "dryRun": dry_run,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
    .to_string()
}

/// `ExtenderArgs` with full `Node` objects.
fn extender_args(pod: &Value, nodes: &[&str]) -> String {
    let items: Vec<Value> = nodes
        .iter()
        .map(|n| {
            json!({
                "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n, "nvidia.com/gpu.present": "true"}},
                "spec": {"podCIDR": "10.244.1.0/24"},
                "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "2"}}
            })
        })
        .collect();
    json!({"pod": pod, "nodes": {"metadata": {"resourceVersion": "1"}, "items": items}}).to_string()
}

fn verdict(reply: &(u16, Value), uid: &str) -> (bool, String) {
    assert_eq!(reply.0, 200, "{}", reply.1);
    let r = &reply.1["response"];
    assert_eq!(reply.1["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(reply.1["kind"], "AdmissionReview");
    assert_eq!(r["uid"], uid, "{}", reply.1);
    let message = r["status"]["message"].as_str().unwrap_or("").to_owned();
    (r["allowed"].as_bool().unwrap(), message)
}

fn policy(dir: &Path, agents: &[&Proc], on_stale: &str) -> PathBuf {
    std::fs::copy(tls_data("server-a.pem"), dir.join("cert.pem")).unwrap();
    std::fs::copy(tls_data("server-a.key"), dir.join("key.pem")).unwrap();
    let urls: Vec<String> = agents
        .iter()
        .map(|a| format!("\"http://{}\"", a.addr))
        .collect();
    let text = format!(
        r#"[placement]
listen = "127.0.0.1:0"
tls = {{ cert = "cert.pem", key = "key.pem" }}
agents = [{}]
poll_interval = "300ms"
stale_after = "10s"
on_stale = "{on_stale}"

[[pools]]
model = "m"
[[pools.backends]]
url = "http://127.0.0.1:9"

# The gateway's secrets are not in placement's environment.
[[tenants]]
name = "t"
api_key_env = "FAIRWAY_TEST_KEY_ONLY_THE_GATEWAY_HAS"
"#,
        urls.join(", ")
    );
    let path = dir.join("fairway.toml");
    write_atomically(&path, &text);
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extender_and_webhook_judge_nodes_from_agent_readings_over_tls() {
    let fast = SimBackend::builder("fast").start().await.unwrap();
    // About 300 ms of prefill for a chat prompt: its TTFT p99 is far over
    // 150 ms while it has work.
    let slow: SimHandle = SimBackend::builder("slow")
        .prefill_tokens_per_s(60.0)
        .start()
        .await
        .unwrap();
    let busy = tokio::spawn({
        let addr = slow.addr();
        async move {
            let c = client();
            loop {
                let reqs = (0..4).map(|_| {
                    send(
                        &c,
                        post(addr, "/v1/chat/completions", None, chat("slow", 2, false)),
                    )
                });
                futures_util::future::join_all(reqs).await;
            }
        }
    });
    let metrics = |h: &SimHandle| format!("http://{}/metrics", h.addr());
    let (fast_m, slow_m) = (metrics(&fast), metrics(&slow));
    let agent = |args: &[&str]| {
        let mut all = vec!["agent", "--listen", "127.0.0.1:0"];
        all.extend_from_slice(args);
        Proc::start(&all)
    };
    let agents = [
        agent(&["--node-name", "node-a", "--simulate-gpus", "80:10,80:0"]),
        agent(&[
            "--node-name",
            "node-a",
            "--engine-metrics",
            &fast_m,
            "--model",
            "llama-3.1-8b",
            "--engine-gpus",
            "0",
        ]),
        agent(&[
            "--node-name",
            "node-b",
            "--simulate-gpus",
            "80:20",
            "--engine-metrics",
            &slow_m,
            "--model",
            "mistral-7b",
            "--engine-gpus",
            "0",
        ]),
        agent(&[
            "--node-name",
            "node-c",
            "--simulate-gpus",
            "80:30",
            "--engine-metrics",
            &fast_m,
            "--model",
            "qwen-7b",
            "--engine-gpus",
            "0",
        ]),
        agent(&[
            "--node-name",
            "node-c",
            "--engine-metrics",
            &fast_m,
            "--model",
            "phi-3",
            "--engine-gpus",
            "0",
        ]),
    ];
    let dir = std::env::temp_dir().join(format!("fairway-placement-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = policy(&dir, &agents.iter().collect::<Vec<_>>(), "allow");
    let placement = Proc::start(&["placement", "--config", path.to_str().unwrap()]);
    let at = placement.addr;

    // Ready once the agents were read; every node is known.
    assert!(
        eventually(Duration::from_secs(10), async || {
            call(at, "GET", "/readyz", "").await.0 == 200
                && call(at, "GET", "/nodes", "").await.1["nodes"]
                    .as_array()
                    .is_some_and(|n| n.len() == 3)
        })
        .await,
        "placement never read the agents: {}",
        call(at, "GET", "/nodes", "").await.1
    );

    // The extender: node-a fits, node-b is too slow, node-c is full of
    // models, node-e has no reading (allowed: on_stale = "allow").
    let llama = pod("llama-3.1-70b-0", "20");
    let nodes = ["node-a", "node-b", "node-c", "node-e"];
    let mut filtered = Value::Null;
    let slow_seen = eventually(Duration::from_secs(15), async || {
        filtered = call(at, "POST", "/filter", &extender_args(&llama, &nodes))
            .await
            .1;
        filtered["failedNodes"]["node-b"]
            .as_str()
            .is_some_and(|m| m.contains("TTFT p99"))
    })
    .await;
    assert!(slow_seen, "node-b never refused for latency: {filtered}");
    let kept: Vec<&str> = filtered["nodes"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(kept, ["node-a", "node-e"], "{filtered}");
    // The Node objects come back whole.
    assert_eq!(
        filtered["nodes"]["items"][0]["status"]["allocatable"]["nvidia.com/gpu"],
        "2"
    );
    let b = filtered["failedNodes"]["node-b"].as_str().unwrap();
    assert!(
        b.contains("node node-b GPU 0") && b.contains("over the 150 ms threshold"),
        "{b}"
    );
    let c = filtered["failedNodes"]["node-c"].as_str().unwrap();
    assert!(
        c.contains("node node-c GPU 0: 2 models already run there (qwen-7b, phi-3)")
            || c.contains("(phi-3, qwen-7b)"),
        "{c}"
    );

    // By names (a nodeCacheCapable extender), and the scores: node-a's
    // empty GPU scores 9 (spreading), the refused nodes 0.
    let by_name = json!({"pod": llama, "nodenames": nodes}).to_string();
    let (status, names) = call(at, "POST", "/filter", &by_name).await;
    assert_eq!(status, 200);
    assert_eq!(names["nodenames"], json!(["node-a", "node-e"]), "{names}");
    assert!(names.get("nodes").is_none());
    let (status, scores) = call(at, "POST", "/prioritize", &by_name).await;
    assert_eq!(status, 200);
    assert_eq!(
        scores,
        json!([
            {"host": "node-a", "score": 9},
            {"host": "node-b", "score": 0},
            {"host": "node-c", "score": 0},
            {"host": "node-e", "score": 0}
        ])
    );

    // The webhook on pod CREATE: a pod some node can take is allowed; one
    // none can take is refused with every GPU's reason.
    let big = pod("big-0", "50");
    assert_eq!(
        verdict(
            &call(at, "POST", "/validate", &create_review("u1", &llama, false)).await,
            "u1"
        ),
        (true, String::new())
    );
    assert!(
        verdict(
            &call(at, "POST", "/validate", &create_review("u2", &big, false)).await,
            "u2"
        )
        .0
    );
    let (allowed, message) = verdict(
        &call(
            at,
            "POST",
            "/validate",
            &create_review("u3", &pod("huge-0", "120"), false),
        )
        .await,
        "u3",
    );
    assert!(!allowed);
    assert!(
        message.contains("no GPU node can take model huge (120.0 GB) for pod models/huge-0")
            && message.contains("node node-a GPU 1: model huge needs 120.0 GB, over 80 % of the 80.0 GB free (64.0 GB)"),
        "{message}"
    );

    // A dry-run binding decides and reserves nothing.
    assert!(
        verdict(
            &call(
                at,
                "POST",
                "/validate",
                &binding_review("u4", "llama-3.1-70b-0", "node-a", true)
            )
            .await,
            "u4"
        )
        .0
    );
    assert_eq!(
        call(at, "GET", "/nodes", "").await.1["reservations"],
        json!([])
    );
    // The real binding goes on node-a's empty GPU and holds 20 GB there.
    assert!(
        verdict(
            &call(
                at,
                "POST",
                "/validate",
                &binding_review("u5", "llama-3.1-70b-0", "node-a", false)
            )
            .await,
            "u5"
        )
        .0
    );
    let report = call(at, "GET", "/nodes", "").await.1;
    let reservation = &report["reservations"][0];
    assert_eq!(
        (reservation["node"].as_str(), reservation["gpu"].as_u64()),
        (Some("node-a"), Some(1)),
        "{report}"
    );
    // So the 50 GB model that fitted a moment ago no longer does: GPU 0
    // would be shared past 70 %, GPU 1 has 60 GB free.
    let (allowed, message) = verdict(
        &call(
            at,
            "POST",
            "/validate",
            &binding_review("u6", "big-0", "node-a", false),
        )
        .await,
        "u6",
    );
    assert!(!allowed);
    assert!(
        message.contains("pod models/big-0 cannot go on node node-a")
            && message.contains("GPU 0: shared with llama-3.1-8b, together they would use 60.0 GB, over 70 % of its 80.0 GB (56.0 GB)")
            && message.contains("GPU 1: model big needs 50.0 GB, over 80 % of the 60.0 GB free (48.0 GB)"),
        "{message}"
    );
    // The refusal is on record for the operator.
    let decisions = call(at, "GET", "/nodes", "").await.1["decisions"].clone();
    assert!(
        decisions
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["pod"] == "models/big-0" && d["allowed"] == false),
        "{decisions}"
    );

    // A node without a reading: allowed unchecked under on_stale = "allow".
    assert!(
        verdict(
            &call(
                at,
                "POST",
                "/validate",
                &binding_review("u7", "big-0", "node-e", true)
            )
            .await,
            "u7"
        )
        .0
    );
    // A pod placement did not see at CREATE (not a model pod) is allowed;
    // so is a dry-run CREATE's pod, which was judged but not remembered.
    assert!(
        verdict(
            &call(
                at,
                "POST",
                "/validate",
                &binding_review("u8", "nginx-0", "node-c", false)
            )
            .await,
            "u8"
        )
        .0
    );
    let ghost = pod("ghost-0", "500");
    assert!(
        !verdict(
            &call(at, "POST", "/validate", &create_review("u9", &ghost, true)).await,
            "u9"
        )
        .0
    );
    assert!(
        verdict(
            &call(
                at,
                "POST",
                "/validate",
                &binding_review("u10", "ghost-0", "node-c", false)
            )
            .await,
            "u10"
        )
        .0
    );

    // Requests placement cannot read get a clear error.
    let (allowed, message) = verdict(
        &call(
            at,
            "POST",
            "/validate",
            &create_review("u11", &pod("odd-0", "lots"), false),
        )
        .await,
        "u11",
    );
    assert!(
        !allowed
            && message
                .contains("fairway.dev/model-size-gb: \"lots\" is not a positive number of GB"),
        "{message}"
    );
    for (path, body, expect) in [
        ("/validate", "{", "not an AdmissionReview body"),
        (
            "/validate",
            r#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":null}"#,
            "expected apiVersion admission.k8s.io/v1",
        ),
        ("/filter", "[]", "not an ExtenderArgs body"),
        (
            "/prioritize",
            r#"{"nodes":{"items":[]}}"#,
            "not an ExtenderArgs body",
        ),
    ] {
        let (status, body) = call(at, "POST", path, body).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains(expect),
            "{path}: {body}"
        );
    }
    assert_eq!(call(at, "GET", "/validate", "").await.0, 405);
    assert_eq!(call(at, "GET", "/mutate", "").await.0, 404);

    // The operator switches to refusing unread nodes: the policy reloads.
    policy(&dir, &agents.iter().collect::<Vec<_>>(), "refuse");
    let mut last = (false, String::new());
    let refused = eventually(Duration::from_secs(10), async || {
        last = verdict(
            &call(
                at,
                "POST",
                "/validate",
                &binding_review("u12", "big-0", "node-e", true),
            )
            .await,
            "u12",
        );
        !last.0
    })
    .await;
    assert!(refused, "{last:?}");
    assert!(
        last.1.contains("node node-e: no reading")
            && last.1.contains("placement.on_stale is \"refuse\""),
        "{}",
        last.1
    );

    // What happened is counted for Prometheus, in a form promtool accepts.
    let (status, metrics) = call(at, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    let metrics = metrics.as_str().unwrap().to_owned();
    for line in [
        "fairway_placement_decisions_total{kind=\"binding\",result=\"refused\"}",
        "fairway_placement_decisions_total{kind=\"filter\",result=\"allowed\"}",
        "fairway_placement_decisions_total{kind=\"pod\",result=\"refused\"}",
        "fairway_placement_refusals_total{rule=\"latency\"}",
        "fairway_placement_refusals_total{rule=\"shared_memory\"}",
        "fairway_placement_refusals_total{rule=\"stale_reading\"}",
        "fairway_placement_nodes{reading=\"fresh\"} 3",
        "fairway_placement_reservations 1",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    support::promtool_check(&metrics);
    busy.abort();
}

/// Without a certificate, or with one that does not load, the service
/// refuses to start and says why.
/// Issue 37, item 3: two placement replicas share their reservations and
/// the pods they saw through `[cluster]`'s store (a real `redis-server`):
/// a binding judged at one replica counts at the other, a pod created at
/// one is bound at the other, and of two bindings to one GPU at once at
/// the two replicas, only one is allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_replicas_share_reservations_through_the_store() {
    let redis = support::RedisServer::start();
    let agent = |node: &str| {
        Proc::start(&[
            "agent",
            "--listen",
            "127.0.0.1:0",
            "--node-name",
            node,
            "--simulate-gpus",
            "80:0",
        ])
    };
    let agents = [agent("node-a"), agent("node-b")];
    let dir = std::env::temp_dir().join(format!("fairway-placement-shared-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = policy(&dir, &[&agents[0], &agents[1]], "allow");
    let text = std::fs::read_to_string(&path).unwrap();
    write_atomically(
        &path,
        &format!("{text}\n[cluster]\nstore = \"{}\"\n", redis.url()),
    );
    let start = || Proc::start(&["placement", "--config", path.to_str().unwrap()]);
    let (p1, p2) = (start(), start());
    for p in [&p1, &p2] {
        assert!(
            eventually(Duration::from_secs(10), async || {
                call(p.addr, "GET", "/readyz", "").await.0 == 200
            })
            .await
        );
    }
    let review = |uid: &str, pod_name: &str| binding_review(uid, pod_name, "node-a", false);
    let review_b = |uid: &str, pod_name: &str| binding_review(uid, pod_name, "node-b", false);
    let judge = async |at: SocketAddr, body: String, uid: &str| {
        verdict(&call(at, "POST", "/validate", &body).await, uid)
    };
    // Created at p1, bound at p2: p2 knows its size from the store.
    let a = pod("model-a-0", "50");
    assert!(judge(p1.addr, create_review("c1", &a, false), "c1").await.0);
    assert!(judge(p2.addr, review("b1", "model-a-0"), "b1").await.0);
    // p1 refuses a second 50 GB model on the GPU that p2 just filled.
    let b = pod("model-b-0", "50");
    assert!(judge(p2.addr, create_review("c2", &b, false), "c2").await.0);
    let (allowed, message) = judge(p1.addr, review("b2", "model-b-0"), "b2").await;
    assert!(!allowed);
    assert!(
        message.contains("model model-b needs 50.0 GB, over 80 % of the 30.0 GB free"),
        "{message}"
    );
    // Both replicas show the reservation (p1 from its next poll).
    for p in [&p1, &p2] {
        assert!(
            eventually(Duration::from_secs(5), async || {
                call(p.addr, "GET", "/nodes", "").await.1["reservations"]
                    .as_array()
                    .is_some_and(|r| r.len() == 1 && r[0]["pod"] == "models/model-a-0")
            })
            .await,
            "{}",
            call(p.addr, "GET", "/nodes", "").await.1
        );
    }
    // Two 50 GB models at once on node-b's one GPU, one at each
    // replica: exactly one goes.
    for name in ["model-c-0", "model-d-0"] {
        let p = pod(name, "50");
        assert!(judge(p1.addr, create_review("c", &p, false), "c").await.0);
    }
    let (c, d) = tokio::join!(
        judge(p1.addr, review_b("b3", "model-c-0"), "b3"),
        judge(p2.addr, review_b("b4", "model-d-0"), "b4"),
    );
    assert!(c.0 != d.0, "{c:?} {d:?}");
    let m = call(p1.addr, "GET", "/metrics", "").await.1;
    assert!(
        m.as_str().unwrap().contains("fairway_placement_store_up 1"),
        "{m}"
    );
}

/// Issue 38: a body declared over the limit (16 MiB) is refused with 413
/// at its header, over HTTP/1.1 and HTTP/2 alike (real `curl`): no stream
/// reset without a status, no wait for a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_refuses_a_body_over_its_limit_at_the_header_on_both_protocols() {
    let dir = std::env::temp_dir().join(format!("fairway-placement-body-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = policy(&dir, &[], "allow");
    let placement = Proc::start(&["placement", "--config", path.to_str().unwrap()]);
    let big = dir.join("big.json");
    std::fs::write(&big, vec![b' '; 17 << 20]).unwrap();
    let port = placement.addr.port();
    // A declared length over it (HTTP/1.1, HTTP/2), and a body of unknown
    // length (HTTP/2 from a pipe) that passes it.
    for (protocol, from) in [
        ("--http1.1", "file"),
        ("--http2", "file"),
        ("--http2", "pipe"),
    ] {
        let start = tokio::time::Instant::now();
        let source = match from {
            "file" => format!("@{}", big.display()),
            _ => "@-".to_owned(),
        };
        let out = Command::new("curl")
            .args([
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{http_version}",
                protocol,
            ])
            .args(["--cacert", tls_data("ca.pem").to_str().unwrap()])
            .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
            .args([
                "-H",
                "content-type: application/json",
                "--data-binary",
                &source,
            ])
            .arg(format!("https://localhost:{port}/validate"))
            .stdin(std::fs::File::open(&big).unwrap())
            .output()
            .expect("curl runs (tests/run.sh installs it)");
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        let took = start.elapsed();
        assert!(
            said.starts_with("413 "),
            "{protocol} {from}: {said} {out:?}"
        );
        assert!(took < Duration::from_secs(5), "{protocol} {from}: {took:?}");
    }
}

#[test]
fn placement_needs_a_certificate() {
    let dir = std::env::temp_dir().join(format!("fairway-placement-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pool = "[[pools]]\nmodel = \"m\"\n[[pools.backends]]\nurl = \"http://127.0.0.1:9\"\n";
    for (placement, expect) in [
        (
            "[placement]\nlisten = \"127.0.0.1:0\"\n",
            "[placement] tls is not set",
        ),
        (
            "[placement]\nlisten = \"127.0.0.1:0\"\ntls = { cert = \"missing.pem\", key = \"missing.key\" }\n",
            "placement.tls.cert",
        ),
    ] {
        let path = dir.join("fairway.toml");
        write_atomically(&path, &format!("{placement}{pool}"));
        let out = Command::new(env!("CARGO_BIN_EXE_fairway"))
            .args(["placement", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(expect), "{stderr}");
    }
}
