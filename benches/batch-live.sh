#!/usr/bin/env bash
# The batch lane live, in the shape of llm-d's published batch benchmark:
# a real gateway (`fairway serve` on config/reference.toml: four in-process
# simulated engines of 32 sequences, one slower) under a steady
# interactive load (`api`, 10 requests/s, played by `fairway load` over
# TCP) and an eval suite of ITEMS requests handed over at once (`evals`),
# four ways, one after the other on the same machine:
#
#   alone          api only
#   live           the suite sent as live requests, all at once (today)
#   concurrency=4  the suite sent live, 4 at a time (LiteLLM's runner);
#                  what is not started when api's load ends stays unsent
#   lane           the suite handed over through the Batch API
#
# For each: api's TTFT p50/p99 (client side) and its ratio to alone, the
# suite's items answered and its makespan (from hand-over to its last
# answer), and the share of otherwise idle slots the suite used while it
# ran: every 0.5 s the gateway's /metrics gives each tenant's requests in
# flight on the engines; idle = 128 slots less api's, used = evals' (at
# most idle).
#
#   benches/batch-live.sh [seed] [items] [seconds of api load]
#
# RUNS="alone lane" picks runs (alone first: the ratios are to it);
# lane@T is the lane with [batch] live_latency_target = T; a +prio suffix
# (lane+prio, lane@1.2+prio) adds [batch] engine_priority = 1, which
# only the real engines (started with --scheduling-policy priority) take;
# +pre0 preempts batch items for a waiting live request at once
# ([preemption] min_wait = "0ms" instead of the reference's 250 ms).
#
# ENGINES=real runs the same against two REAL vLLM engines instead
# (../shared/tools/real-vllm.sh: the CPU build, the random 6-layer Llama
# of hidden 512, one engine per core, 16 sequences each: 32 slots), with
# a load scaled to them: api at API_RATE (default 2) requests/s of 100-300
# prompt and 32-96 answer tokens, the suite's items 100-400 and 32-128.
# The engines stay up for the next run with KEEP_ENGINES=1.
set -euo pipefail
cd "$(dirname "$0")/.."
SEED=${1:-1}
ITEMS=${2:-3000}
SECONDS_OF_LOAD=${3:-150}
ENGINES=${ENGINES:-sim}
WORK=$(mktemp -d)
TOOL=${REAL_VLLM:-../shared/tools/real-vllm.sh}
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  if [[ $ENGINES == real && -z ${KEEP_ENGINES:-} ]]; then
    "$TOOL" stop 8121 >/dev/null 2>&1 || true; "$TOOL" stop 8122 >/dev/null 2>&1 || true
  fi
  [ -n "${KEEP:-}" ] && echo "kept in $WORK" || rm -rf $WORK
}
# KEEP=1 keeps the runs' logs, reports and metrics (printed at the end).
trap cleanup EXIT
cargo build --release --quiet
BIN=target/release/fairway

if [[ $ENGINES == real ]]; then
  PEERS=${PEERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fairway-real-vllm}
  export MODEL_DIR=$PEERS/mid-llama MODEL_HIDDEN=512 MODEL_LAYERS=6 MODEL_HEADS=8
  export SERVED_NAME=mid MAX_MODEL_LEN=2048
  for i in 1 2; do
    port=$((8120 + i))
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && continue
    VLLM_CPU_OMP_THREADS_BIND=$((i - 1)) VLLM_EXTRA_ARGS="--max-num-seqs 16 --scheduling-policy priority" "$TOOL" start "$port" >&2
  done
  SLOTS=32
  # The reference policy's tenants and queue, over the two engines.
  python3 - config/reference.toml > $WORK/base.toml <<'PY'
import sys
text = open(sys.argv[1]).read()
head, rest = text.split("[[pools]]", 1)
tenants = rest[rest.index("# An external paying customer"):]
print(head + """[[pools]]
model = "mid"
routing = "least_outstanding"
ttft_p99_threshold = "60s"
backends = [
  { name = "vllm-0", url = "http://127.0.0.1:8121", max_inflight = 16 },
  { name = "vllm-1", url = "http://127.0.0.1:8122", max_inflight = 16 },
]

""" + tenants)
PY
  api_shape="prompt_tokens = [100, 300]
output_tokens = [32, 96]"
  evals_shape="prompt_tokens = [100, 400]
output_tokens = [32, 128]"
  API_RATE=${API_RATE:-2.0}
else
  SLOTS=128
  cp config/reference.toml $WORK/base.toml
  api_shape="prompt_tokens = [200, 600]
output_tokens = [80, 200]
max_tokens = 256"
  evals_shape="prompt_tokens = [300, 1000]
output_tokens = [50, 200]
max_tokens = 256"
  API_RATE=${API_RATE:-10.0}
fi

api="[[tenants]]
name = \"api\"
arrivals = { poisson = { rate = $API_RATE } }
$api_shape
stream = true"
printf 'duration = "%ss"\n\n%s\n' "$SECONDS_OF_LOAD" "$api" > $WORK/alone.toml
cat > $WORK/suite.toml <<TOML
duration = "${SECONDS_OF_LOAD}s"

$api

[[tenants]]
name = "evals"
arrivals = { batch = { at = "10s", count = $ITEMS } }
$evals_shape
batch_api = true
TOML

printf '%-14s %-22s %-8s %-10s %-14s %-10s %s\n' run "api TTFT p50 / p99" "vs alone" "api SLO" "suite answered" "makespan" "idle used"
base=""
for run in ${RUNS:-alone live concurrency=4 lane}; do
  port=$((18600 + RANDOM % 500)); admin=$((port + 1))
  { if [[ $run == *+pre0* ]]; then sed 's/^min_wait = .*/min_wait = "0ms"/' $WORK/base.toml; else cat $WORK/base.toml; fi
    printf '\n[server]\nlisten = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n' $port $admin
    printf '\n[batch]\ndata_dir = "%s/data-%s"\n' $WORK "${run/=/}"
    # lane@T: the lane with its loop on live latency at target T.
    [[ $run == lane@* ]] && { t=${run#lane@}; printf 'live_latency_target = %s\n' "${t%%+*}"; }
    [[ $run == *+prio* ]] && printf 'engine_priority = 1\n'
  } > $WORK/policy.toml
  $BIN serve --config $WORK/policy.toml > $WORK/serve.log 2>&1 &
  pid=$!
  for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
  ( while true; do
      curl -s "http://127.0.0.1:$admin/metrics" | awk -v t="$(date +%s.%N)" '
        /^fairway_tenant_in_flight\{tenant="api"/ { a = $2 }
        /^fairway_tenant_in_flight\{tenant="evals"/ { e = $2 }
        END { print t, a + 0, e + 0 }'
      sleep 0.5
    done ) > $WORK/samples.txt &
  sampler=$!
  scenario=$WORK/suite.toml; as=${run%%[@+]*}
  [ $run = alone ] && { scenario=$WORK/alone.toml; as=live; }
  $BIN load --policy $WORK/policy.toml --scenario $scenario --seed $SEED \
    --target 127.0.0.1:$port --key api=sk-ref-api --key evals=sk-ref-evals \
    --batch-as $as --json $WORK/load.json > $WORK/load.txt 2>&1
  curl -s "http://127.0.0.1:$admin/metrics" > $WORK/metrics-${run/=/}.txt
  ps -o cputime= -p $pid > $WORK/cpu-${run/=/}.txt
  cp $WORK/load.json $WORK/load-${run/=/}.json
  kill $sampler; kill $pid; wait $pid 2>/dev/null || true
  line=$(python3 - $WORK/load.json $WORK/samples.txt $SLOTS "$base" $run <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))["runs"][0]
api, evals = doc["tenants"]["api"], doc["tenants"].get("evals")
samples = [tuple(map(float, l.split())) for l in open(sys.argv[2]) if len(l.split()) == 3]
slots, base = float(sys.argv[3]), sys.argv[4]
p50, p99 = api["ttft_p50_s"] * 1000, api["ttft_p99_s"] * 1000
ratio = f"{p99 / float(base):.2f}x" if base else "1.00x"
if evals:
    answered = f"{evals['served']} of {evals['requests']}"
    makespan = f"{evals['e2e_p99_s']:.0f} s" if evals["served"] == evals["requests"] else "-"
    # While the suite ran: from its first request in flight to its last.
    on = [i for i, s in enumerate(samples) if s[2] > 0]
    run = samples[on[0]:on[-1] + 1] if on else []
    idle = sum(max(slots - a, 0) for _, a, _ in run)
    used = sum(min(e, max(slots - a, 0)) for _, a, e in run)
    share = f"{100 * used / idle:.0f} %" if idle else "-"
else:
    answered, makespan, share = "-", "-", "-"
print(f"{p99:.1f}|{sys.argv[5]:<14} {p50:.0f} / {p99:.0f} ms{'':<9} {ratio:<8} "
      f"{100 * api['slo_attainment']:.1f} %{'':<3} {answered:<14} {makespan:<10} {share}")
PY
)
  [ $run = alone ] && base=${line%%|*}
  echo "${line#*|}"
done
