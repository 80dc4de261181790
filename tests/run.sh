#!/usr/bin/env bash
# The test command: installs the system tools the tests use when they are
# missing, then runs every test. With the tools present nothing is skipped
# (CI=true makes a missing tool a failure instead of a skip).
#
#   tests/run.sh [cargo test arguments]
#
# With no arguments it also runs each fuzz target for a few seconds under
# libFuzzer (fuzz/run.sh; `cargo test` alone replays the fuzz seeds and
# regressions and a short mutation run, but not the coverage-guided one),
# and validates the Kubernetes manifests (deploy/kubernetes/validate.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# tool → Debian package
declare -A need_pkg=(
  [promtool]=prometheus   # checks our exposition format; a real Prometheus scrapes the gateway
  [prlimit]=util-linux    # runs the gateway at a low fd limit (accept back-off test)
  [c++]=g++               # builds libFuzzer for fuzz/run.sh
  [make]=make             # builds jemalloc, the gateway's allocator
  [redis-server]=redis-server  # the shared store of the cluster tests
  [chromium]=chromium          # the usage page in a real browser (tests/usage.rs)
  [chromedriver]=chromium-driver
  [curl]=curl                  # the README's blocks, run as written (tests/readme.rs)
)
missing=()
for tool in "${!need_pkg[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${need_pkg[$tool]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # Without recommends: Chromium alone would bring a hundred packages
  # (avahi, udev, printer tools) that a headless test never uses.
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The official openai and anthropic Python SDKs (tests/sdk.rs), and the
# reference tokenizer and Jinja (tests/tokenizer.rs), pinned, in a venv of
# their own.
venv=target/sdk-venv
if ! "$venv/bin/python" -c "import openai, anthropic, tokenizers, jinja2" >/dev/null 2>&1; then
  echo "installing the SDKs into $venv"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq python3 python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install -q -r tests/sdk/requirements.txt -r tests/tokenizer/requirements.txt
fi

# Selenium, which drives Chromium through chromedriver (tests/usage.rs).
bvenv=target/browser-venv
if ! "$bvenv/bin/python" -c "import selenium" >/dev/null 2>&1; then
  echo "installing Selenium into $bvenv"
  python3 -m venv "$bvenv"
  "$bvenv/bin/pip" install -q -r tests/browser/requirements.txt
fi

# An S3-compatible server (moto's) for the shared batch store's tests
# (tests/batch_cluster.rs).
svenv=target/s3-venv
if ! "$svenv/bin/python" -c "import moto.server, flask_cors" >/dev/null 2>&1; then
  echo "installing an S3-compatible server into $svenv"
  python3 -m venv "$svenv"
  "$svenv/bin/pip" install -q -r tests/s3/requirements.txt
fi

# A real Triton Inference Server (the tritonserver PyTriton bundles, CPU
# only; about 370 MB) for tests/triton_real.rs.
tvenv=target/triton-venv
if ! "$tvenv/bin/python" -c "import pytriton" >/dev/null 2>&1; then
  echo "installing Triton (PyTriton) into $tvenv"
  python3 -m venv "$tvenv"
  "$tvenv/bin/pip" install -q -r tests/triton/requirements.txt
fi

CI=true cargo test "$@"
if [ $# -eq 0 ]; then
  fuzz/run.sh --seconds "${FAIRWAY_FUZZ_SECONDS:-10}"
  # The Kubernetes manifests against the Kubernetes schemas (installs its
  # validators into target/ on first use).
  deploy/kubernetes/validate.sh
fi
