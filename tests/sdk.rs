//! The official `openai` and `anthropic` Python SDKs (pinned in
//! `tests/sdk/requirements.txt`, installed by `tests/run.sh` into
//! `target/sdk-venv`) against a real gateway and two simulated vLLM
//! backends: `tests/sdk/clients.py` holds the checks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdks_work_through_the_gateway() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var_os("FAIRWAY_SDK_PYTHON")
        .map_or_else(|| root.join("target/sdk-venv/bin/python"), Into::into);
    if !python.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install the SDKs (tests/run.sh makes target/sdk-venv)"
        );
        eprintln!("skipped: no {} (run tests/run.sh)", python.display());
        return;
    }
    let (_b, gw) = two_tenant_gateway().await;
    let url = format!("http://{}", gw.addr());
    let script = root.join("tests/sdk/clients.py");
    let (ok, text) = run_python(python, script, vec![url.into()]).await;
    assert!(ok, "SDK checks failed:\n{text}");
    assert!(text.contains("sdk checks ok"), "{text}");
}

/// The `openai` SDK's Files and Batches calls (`tests/sdk/batches.py`)
/// against a gateway with `[batch]` on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdk_runs_batches_through_the_gateway() {
    batch_sdk("batches.py", "batch sdk checks ok").await;
}

/// The `anthropic` SDK's Message Batches calls
/// (`tests/sdk/message_batches.py`) against the same gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_anthropic_sdk_runs_message_batches_through_the_gateway() {
    batch_sdk("message_batches.py", "message batch sdk checks ok").await;
}

/// Runs `tests/sdk/{script}` against a gateway with `[batch]` on: tenants
/// `api` (`ka`) and `evals` (`ke`), two simulated backends of `m`.
async fn batch_sdk(script: &str, ok_line: &str) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var_os("FAIRWAY_SDK_PYTHON")
        .map_or_else(|| root.join("target/sdk-venv/bin/python"), Into::into);
    if !python.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install the SDKs (tests/run.sh makes target/sdk-venv)"
        );
        eprintln!("skipped: no {} (run tests/run.sh)", python.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (b0, b1) = (sim("m", 16).await, sim("m", 16).await);
    let policy = format!(
        r#"{SERVER}
[batch]
data_dir = "{}"

[[pools]]
model = "m"
backends = [{{ name = "b0", url = "http://{{b0}}" }}, {{ name = "b1", url = "http://{{b1}}" }}]

[[tenants]]
name = "api"
api_keys = ["ka"]

[[tenants]]
name = "evals"
api_keys = ["ke"]
"#,
        dir.path().display()
    );
    let gw = gateway(&policy, &[&b0, &b1]).await;
    let url = format!("http://{}", gw.addr());
    let script = root.join("tests/sdk").join(script);
    let (ok, text) = run_python(python, script, vec![url.into()]).await;
    assert!(ok, "batch SDK checks failed:\n{text}");
    assert!(text.contains(ok_line), "{text}");
}
