#!/usr/bin/env bash
# Prefix-aware routing live, on the simulated engines: a real gateway
# (`fairway serve`, two in-process sims with a 32k-token KV cache each)
# played a shared-prefix workload by `fairway load` over TCP, once with
# `routing = "least_outstanding"` and once with `"prefix_aware"`, one after
# the other on the same machine. Prints the client-side report's api and
# chat TTFTs and the engines' prefix-cache hit rate and prefilled tokens
# (scraped from the gateway's /metrics and the sims' counters).
#
#   benches/prefix-live.sh [seed]
set -euo pipefail
cd "$(dirname "$0")/.."
SEED=${1:-1}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf $WORK' EXIT
cargo build --release --quiet
BIN=target/release/fairway

# 24 system prompts of 1,500 tokens (36k tokens: more than one engine's
# KV cache, about half of the two), 6 api requests/s, and chat
# conversations of six turns; 45 s of arrivals.
cat > $WORK/scenario.toml <<'TOML'
duration = "45s"

[[tenants]]
name = "api"
arrivals = { poisson = { rate = 6.0 } }
prompt_tokens = [50, 200]
output_tokens = [20, 60]
max_tokens = 64
stream = true
prefix = { groups = 24, tokens = 1500 }

[[tenants]]
name = "chat"
arrivals = { poisson = { rate = 0.4 } }
prompt_tokens = [100, 300]
output_tokens = [50, 150]
max_tokens = 256
stream = true
conversation = { turns = 6, gap = "6s" }
TOML

for routing in least_outstanding prefix_aware; do
  port=$((18500 + RANDOM % 500)); admin=$((port + 1))
  cat > $WORK/policy.toml <<TOML
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"

[[pools]]
model = "m"
routing = "$routing"
ttft_p99_threshold = "60s"
[[pools.backends]]
sim = { max_num_seqs = 32, kv_tokens = 32768, max_num_batched_tokens = 4096 }
max_inflight = 32
[[pools.backends]]
sim = { max_num_seqs = 32, kv_tokens = 32768, max_num_batched_tokens = 4096 }
max_inflight = 32

[[tenants]]
name = "api"
api_keys = ["ka"]
[[tenants]]
name = "chat"
api_keys = ["kc"]
TOML
  $BIN serve --config $WORK/policy.toml > $WORK/serve-$routing.log 2>&1 &
  pid=$!
  for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
  $BIN load --policy $WORK/policy.toml --scenario $WORK/scenario.toml --seed $SEED \
    --target 127.0.0.1:$port --key api=ka --key chat=kc > $WORK/load-$routing.txt 2>&1
  curl -s "http://127.0.0.1:$admin/metrics" > $WORK/metrics-$routing.txt
  kill $pid; wait $pid 2>/dev/null || true
  cached=$(awk '/^fairway_backend_cached_prompt_tokens_total/ {s+=$2} END {print s+0}' $WORK/metrics-$routing.txt)
  prompt=$(awk '/^fairway_backend_reported_prompt_tokens_total/ {s+=$2} END {print s+0}' $WORK/metrics-$routing.txt)
  echo "== $routing (seed $SEED)"
  grep -E "^(queue|drf)|\| (api|chat) " $WORK/load-$routing.txt | cut -c1-150 || cat $WORK/load-$routing.txt
  awk -v c="$cached" -v p="$prompt" 'BEGIN { printf "engines: %d of %d prompt tokens found cached (%.1f%%), %d prefilled\n", c, p, (p > 0 ? 100 * c / p : 0), p - c }'
done
