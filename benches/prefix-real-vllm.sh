#!/usr/bin/env bash
# Prefix-aware routing against two REAL vLLM servers, side by side with
# the peers, in one run (issue 49's acceptance figure).
#
# The engines: vLLM 0.32's CPU build (../shared/tools/real-vllm.sh) serving
# a random-weight Llama made locally (hidden 512, 6 layers: prefill costs
# measurable time), one engine per core, each KV cache capped at
# $BLOCKS blocks of 128 tokens, prefix caching on, KV events published,
# `--enable-scale-out` (vllm-router's `cache_aware` reads token ids from
# it), dev mode (each run starts from reset prefix caches).
#
# The routers, each run in turn, in an order that rotates every round:
#   lo        Fairway, routing = "least_outstanding"
#   approx    Fairway, routing = "prefix_aware", the model's tokenizer
#   precise   Fairway, "prefix_aware", tokenizer and both engines' KV events
#   vrouter   vllm-router 0.1.17 (PyPI), --policy cache_aware
#   oracle    the client pins each system prompt (conversation) to one engine
#   approx3, precise3  three Fairway replicas in front of the same engines,
#             sharing a redis-server as a cluster store, the client
#             sending to each in turn
#   private2, shared2  precise, two tenants sending the same system prompts
#             in turn, with prefix_cache = "private" (each tenant's own
#             cache_salt) or "shared" (no salt)
#
# The loads (benches/prefix_load.py): closed, open, turns, unique; knobs
# are passed through (e.g. PREFIXES=20 PREFIX_TOKENS=500 CLIENTS=6), and
# POOL_EXTRA is added to each gateway's pool (e.g. kv_high_watermark = 1.0).
#
#   benches/prefix-real-vllm.sh [load ...]          (default: closed unique)
#   ROUNDS=3 ROUTERS="lo precise vrouter oracle" benches/prefix-real-vllm.sh closed
#
# Prints one line per run and a table of medians; the raw lines go to
# $OUT (default target/prefix-real-vllm.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
TOOL=${REAL_VLLM:-../shared/tools/real-vllm.sh}
PEERS=${PEERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fairway-real-vllm}
PY=$PEERS/vllm-venv/bin/python
export MODEL_DIR=$PEERS/mid-llama MODEL_HIDDEN=512 MODEL_LAYERS=6 MODEL_HEADS=8
export SERVED_NAME=mid MAX_MODEL_LEN=2048 VLLM_SERVER_DEV_MODE=1
ROUNDS=${ROUNDS:-3}
BLOCKS=${BLOCKS:-48}
ROUTERS=${ROUTERS:-lo approx precise vrouter oracle}
LOADS=${*:-closed unique}
OUT=${OUT:-target/prefix-real-vllm.jsonl}
LOAD_ARGS=(--prefixes "${PREFIXES:-12}" --prefix-tokens "${PREFIX_TOKENS:-900}"
  --clients "${CLIENTS:-4}" --rate "${RATE:-5}" --turns "${TURNS:-4}"
  --requests "${REQUESTS:-240}" --warmup "${WARMUP:-24}" --seed "${SEED:-1}")
E1=http://127.0.0.1:8111 E2=http://127.0.0.1:8112
WORK=$(mktemp -d)
cleanup() {
  kill $(jobs -p) ${STORE_PID:-} 2>/dev/null || true
  [[ -n ${KEEP_ENGINES:-} ]] || { "$TOOL" stop 8111 >/dev/null 2>&1 || true; "$TOOL" stop 8112 >/dev/null 2>&1 || true; }
  rm -rf "$WORK"
}
trap cleanup EXIT
cargo build --release --quiet
BIN=target/release/fairway
"$PY" -m pip show vllm-router >/dev/null 2>&1 || "$PY" -m pip install -q vllm-router==0.1.17

for i in 1 2; do
  port=$((8110 + i))
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && continue
  VLLM_CPU_OMP_THREADS_BIND=$((i - 1)) \
  VLLM_EXTRA_ARGS="--num-gpu-blocks-override $BLOCKS --enable-scale-out --enable-prompt-tokens-details --kv-events-config {\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$((port + 100))\",\"replay_endpoint\":\"tcp://*:$((port + 200))\"}" \
    "$TOOL" start "$port" >&2
done

# The replicas' store.
STORE_PORT=$((19600 + RANDOM % 300))
redis-server --port "$STORE_PORT" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 &
STORE_PID=$!
disown "$STORE_PID" # not one of the runs' jobs, which each run ends

# A gateway for router $1 on port $2 (admin on $2+1); with $3, a replica
# of a cluster whose keys start with $3.
gateway() {
  local routing=least_outstanding extra="" kv1="" kv2="" cache=private
  if [[ $1 != lo ]]; then
    routing=prefix_aware
    extra="tokenizer = \"$MODEL_DIR/tokenizer.json\"
prefix_block_tokens = 128"
  fi
  if [[ $1 == precise* || $1 == *2 ]]; then
    kv1=", kv_events = { endpoint = \"tcp://127.0.0.1:8211\", replay = \"tcp://127.0.0.1:8311\" }"
    kv2=", kv_events = { endpoint = \"tcp://127.0.0.1:8212\", replay = \"tcp://127.0.0.1:8312\" }"
  fi
  [[ $1 == shared2 ]] && cache=shared
  local cluster=""
  # Replicas share the policy's state, and where each prefix lives,
  # through a store (docs/cluster.md).
  [[ -n ${3:-} ]] && cluster="[cluster]
store = \"redis://127.0.0.1:$STORE_PORT\"
replica = \"r$2\"
key_prefix = \"$3\""
  cat > "$WORK/policy-$2.toml" <<TOML
[server]
listen = "127.0.0.1:$2"
admin_listen = "127.0.0.1:$(($2 + 1))"

$cluster

[[pools]]
model = "mid"
routing = "$routing"
ttft_p99_threshold = "60s"
$extra
${POOL_EXTRA:-}
backends = [
  { name = "vllm-0", url = "$E1", max_inflight = 8$kv1 },
  { name = "vllm-1", url = "$E2", max_inflight = 8$kv2 },
]

[[tenants]]
name = "api"
api_keys = ["ka"]
prefix_cache = "$cache"

[[tenants]]
name = "team"
api_keys = ["kb"]
prefix_cache = "$cache"
TOML
  "$BIN" serve --config "$WORK/policy-$2.toml" > "$WORK/serve-$2.log" 2>&1 &
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$(($2 + 1))/readyz" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "gateway did not start" >&2; cat "$WORK/serve-$2.log" >&2; exit 1
}

mkdir -p "$(dirname "$OUT")"
: > "$OUT"
for load in $LOADS; do
  for round in $(seq 1 "$ROUNDS"); do
    read -ra order <<<"$ROUTERS"
    # Rotate the order each round: no router always runs first.
    shift_by=$(( (round - 1) % ${#order[@]} ))
    order=("${order[@]:$shift_by}" "${order[@]:0:$shift_by}")
    for r in "${order[@]}"; do
      curl -sf -X POST "$E1/reset_prefix_cache" >/dev/null
      curl -sf -X POST "$E2/reset_prefix_cache" >/dev/null
      port=$((18500 + RANDOM % 500))
      case $r in
        oracle) target="oracle:$E1,$E2" ;;
        vrouter)
          "$PEERS/vllm-venv/bin/vllm-router" --host 127.0.0.1 --port "$port" --worker-urls "$E1" "$E2" \
            --policy cache_aware --prometheus-port $((port + 1)) > "$WORK/router.log" 2>&1 &
          for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1 && break; sleep 0.2; done
          target=http://127.0.0.1:$port ;;
        *3)
          # Three replicas, each following the engines (precise) or its
          # own history (approx), sharing a store (a key prefix of their
          # own each run); the client sends to them in turn.
          target=spread:
          for k in 0 2 4; do
            gateway "${r%3}" $((port + k)) "fw$r$round"
            target+=http://127.0.0.1:$((port + k)),
          done
          target=${target%,} ;;
        *) gateway "$r" "$port"; target=http://127.0.0.1:$port ;;
      esac
      keys=ka
      [[ $r == *2 ]] && keys=ka,kb
      line=$("$PY" benches/prefix_load.py --target "$target" --engines "$E1,$E2" --load "$load" \
        --round "$round" --keys "$keys" "${LOAD_ARGS[@]}")
      # How Fairway placed the requests (its first replica's).
      if [[ $r != vrouter && $r != oracle ]]; then
        placed=$(curl -sf "http://127.0.0.1:$((port + 1))/metrics" | "$PY" -c '
import json, re, sys
print(json.dumps({m[1]: int(float(m[2])) for m in re.finditer(r"^fairway_prefix_placements_total\{.*placement=\"(\w+)\"\} (\S+)", sys.stdin.read(), re.M)}))')
        line="${line%\}},\"placements\":$placed}"
      fi
      kill $(jobs -p) 2>/dev/null || true
      wait 2>/dev/null || true
      echo "{\"load\":\"$load\",\"round\":$round,\"router\":\"$r\",${line#\{}" | tee -a "$OUT"
    done
  done
done

"$PY" - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = ["hit_rate", "computed_tokens", "rps", "ttft_p50_ms", "ttft_p99_ms", "failed"]
# The p99 of every round's requests pooled, and the spread of the
# rounds' own p99s: one round's p99 is its third slowest request.
for load in dict.fromkeys(r["load"] for r in rows):
    print(f"\n{load}: medians of {max(r['round'] for r in rows if r['load'] == load)} rounds")
    print("| router | " + " | ".join(keys) + " | pooled ttft_p99_ms | rounds' p99 |")
    print("|---" * (len(keys) + 3) + "|")
    for router in dict.fromkeys(r["router"] for r in rows if r["load"] == load):
        mine = [r for r in rows if r["load"] == load and r["router"] == router]
        med = [statistics.median(r[k] for r in mine if r[k] is not None) for k in keys]
        pooled = sorted(t for r in mine for t in r.get("ttfts_ms", []))
        p99 = pooled[min(len(pooled) - 1, int(0.99 * len(pooled)))] if pooled else "-"
        p99s = sorted(r["ttft_p99_ms"] for r in mine if r["ttft_p99_ms"] is not None)
        spread = f"{p99s[0]}–{p99s[-1]}" if p99s else "-"
        print(f"| {router} | " + " | ".join(f"{m:g}" for m in med) + f" | {p99} | {spread} |")
EOF
