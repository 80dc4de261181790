#!/usr/bin/env bash
# Prefix-aware routing against two REAL vLLM servers (the CPU build of
# vLLM 0.32, a random-weight Llama made locally: hidden 512, 6 layers, so
# that prefill costs measurable time; ../shared/tools/real-vllm.sh), each
# pinned to one core with a capped KV cache (48 blocks of 128 tokens), in
# one run: the same shared-prefix workload played by `fairway load`
# through a gateway routing `least_outstanding`, then `prefix_aware`
# (the model's tokenizer and the engines' KV events: precise mode), the
# engines' prefix caches reset between the two.
#
#   benches/prefix-real-vllm.sh [seed]
set -euo pipefail
cd "$(dirname "$0")/.."
SEED=${1:-1}
TOOL=${REAL_VLLM:-../shared/tools/real-vllm.sh}
PEERS=${PEERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fairway-real-vllm}
export MODEL_DIR=$PEERS/mid-llama MODEL_HIDDEN=512 MODEL_LAYERS=6 MODEL_HEADS=8
export SERVED_NAME=mid MAX_MODEL_LEN=2048 VLLM_SERVER_DEV_MODE=1
WORK=$(mktemp -d)
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  "$TOOL" stop 8111 >/dev/null 2>&1 || true
  "$TOOL" stop 8112 >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
cargo build --release --quiet
BIN=target/release/fairway

for i in 1 2; do
  port=$((8110 + i))
  VLLM_CPU_OMP_THREADS_BIND=$((i - 1)) \
  VLLM_EXTRA_ARGS="--num-gpu-blocks-override 48 --enable-prompt-tokens-details --kv-events-config {\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$((port + 100))\",\"replay_endpoint\":\"tcp://*:$((port + 200))\"}" \
    "$TOOL" start "$port" >&2
done

# 12 system prompts of 150 workload tokens: the workload's text is random
# letters and digits, about one real token per byte with this model's BPE,
# so about 600 real tokens each (7k in all: more than one engine's
# 6,144-token cache beside its running work, less than the two), 5
# requests/s for 48 s.
cat > $WORK/scenario.toml <<'TOML'
duration = "48s"

[[tenants]]
name = "api"
arrivals = { poisson = { rate = 5.0 } }
prompt_tokens = [8, 20]
output_tokens = [8, 16]
max_tokens = 16
stream = true
prefix = { groups = 12, tokens = 150 }
TOML

for routing in least_outstanding prefix_aware; do
  for port in 8111 8112; do curl -sf -X POST "http://127.0.0.1:$port/reset_prefix_cache" >/dev/null; done
  extra=""
  kv1="" kv2=""
  if [[ $routing == prefix_aware ]]; then
    extra="tokenizer = \"$MODEL_DIR/tokenizer.json\"
prefix_block_tokens = 128"
    kv1=", kv_events = { endpoint = \"tcp://127.0.0.1:8211\", replay = \"tcp://127.0.0.1:8311\" }"
    kv2=", kv_events = { endpoint = \"tcp://127.0.0.1:8212\", replay = \"tcp://127.0.0.1:8312\" }"
  fi
  gport=$((18500 + RANDOM % 500)); admin=$((gport + 1))
  cat > $WORK/policy.toml <<TOML
[server]
listen = "127.0.0.1:$gport"
admin_listen = "127.0.0.1:$admin"

[[pools]]
model = "mid"
routing = "$routing"
ttft_p99_threshold = "60s"
$extra
backends = [
  { name = "vllm-0", url = "http://127.0.0.1:8111", max_inflight = 8$kv1 },
  { name = "vllm-1", url = "http://127.0.0.1:8112", max_inflight = 8$kv2 },
]

[[tenants]]
name = "api"
api_keys = ["ka"]
TOML
  $BIN serve --config $WORK/policy.toml > $WORK/serve-$routing.log 2>&1 &
  pid=$!
  for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
  sleep 1
  $BIN load --policy $WORK/policy.toml --scenario $WORK/scenario.toml --seed $SEED \
    --target 127.0.0.1:$gport --key api=ka > $WORK/load-$routing.txt 2>&1
  curl -s "http://127.0.0.1:$admin/metrics" > $WORK/metrics-$routing.txt
  kill $pid; wait $pid 2>/dev/null || true
  q=0 h=0
  for port in 8111 8112; do
    m=$(curl -s "http://127.0.0.1:$port/metrics")
    q=$(awk -v q=$q '/^vllm:prefix_cache_queries_total/ {q+=$2} END {print q}' <<<"$m")
    h=$(awk -v h=$h '/^vllm:prefix_cache_hits_total/ {h+=$2} END {print h}' <<<"$m")
  done
  echo "== $routing (seed $SEED)"
  grep -c 'outcome="served"' $WORK/serve-$routing.log | sed 's/^/served: /'
  grep -v 'outcome="served"' $WORK/serve-$routing.log | grep 'fairway::access' | head -2 || true
  grep -E "^(queue|drf)|\| api " $WORK/load-$routing.txt | cut -c1-150 || cat $WORK/load-$routing.txt
  echo "engines (cumulative since start): prefix cache queries $q, hits $h"
  grep -E "^fairway_(prefix_predicted_cached_tokens_total|backend_cached_prompt_tokens_total|backend_reported_prompt_tokens_total|kv_events_batches_total|kv_events_unanchored_total)" $WORK/metrics-$routing.txt || true
done
