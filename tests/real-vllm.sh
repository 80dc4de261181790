#!/usr/bin/env bash
# Runs tests/real_vllm.rs against a real vLLM (the CPU build, a model made
# locally; ../shared/tools/real-vllm.sh installs it on first use, about
# 3 minutes and 6 GB): the engine starts with its KV events and prompt
# token details on, the ignored test runs, the engine stops.
#
#   tests/real-vllm.sh [PORT]
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-8101}
tool=${REAL_VLLM:-../shared/tools/real-vllm.sh}
peers=${PEERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fairway-real-vllm}
events=$((port + 100))
replay=$((port + 101))
export VLLM_EXTRA_ARGS="--enable-prompt-tokens-details --kv-events-config {\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$events\",\"replay_endpoint\":\"tcp://*:$replay\"}"
"$tool" start "$port"
trap '"$tool" stop "$port"' EXIT
FAIRWAY_REAL_VLLM_URL="http://127.0.0.1:$port" \
FAIRWAY_REAL_VLLM_EVENTS="tcp://127.0.0.1:$events" \
FAIRWAY_REAL_VLLM_REPLAY="tcp://127.0.0.1:$replay" \
FAIRWAY_REAL_VLLM_MODEL_DIR="${MODEL_DIR:-$peers/tiny-llama}" \
  cargo test --test real_vllm -- --ignored --nocapture
