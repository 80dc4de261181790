#!/usr/bin/env bash
# End-to-end load bench: simulated backends reached (a) directly,
# (b) through Fairway with the whole policy on (auth, admission, fair queue,
# windows, poller, metrics) and (c) through nginx as a plain reverse proxy
# (least_conn, upstream keepalive, buffering off). Runs alternate, in one
# session, so the ratios share the machine's noise. Needs: wrk, nginx, curl
# (Debian).
#
#   benches/e2e.sh [seconds-per-run] [rounds]
#
# Two configurations, each measured for all three targets, and for a
# fourth, "floor": benches/floor.rs, a proxy with the gateway's runtime
# shape (a current-thread runtime per core on SO_REUSEPORT sockets, hyper,
# the gateway's backend pool) and no policy, no parsing and no log: what
# any proxy built on hyper and tokio costs here, so the gateway's CPU
# above it is what its policy costs.
# - "shipped": as users run it: the text log at its default level (the
#   access log on, one line per request, to a file), the poller on, two
#   backends, a chat body of about 200 bytes and a 20-token JSON answer;
#   nginx with its access log on (buffered).
# - "minimal": logs off on both, one backend, a one-token answer.
# Then: added latency at a fixed load against a 20 ms backend, time to
# first chunk of a stream, and the gateway's RSS holding 1,000 and 10,000
# idle streams (benches/streams.rs, over h2c: 100 streams a connection).
#
# WORKERS=n sets [server] workers on every gateway (default: one per core).
# BASE=path/to/an/older/fairway adds that build as a fourth target
# ("base"), run in the same rounds, for a before/after in one session.
# OFF=on instead adds this build with `routing = "least_outstanding"` and
# the tenant's `prefix_cache = "shared"` as the fourth target ("off"): the
# cost of prefix routing and the cache salt, on by default, side by side.
# CLUSTER=on instead adds this build with a [cluster] section (a local
# redis-server on :18040, started here) as the fourth target ("cluster"):
# the cost of cluster mode, side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
SECS=${1:-5}
ROUNDS=${2:-3}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -f $WORK/nginx.pid ] && kill $(cat $WORK/nginx.pid) 2>/dev/null; rm -rf $WORK' EXIT

cargo build --release --quiet
cargo bench --bench streams --bench floor --no-run --quiet 2>/dev/null
BIN=target/release/fairway
ROWS=$WORK/rows.tsv

# Backends. Zero delay: a and b (the shipped pair), m (the minimal one).
# 20 ms: one 20 ms decode step per token. Slow: streams that idle (a
# 60 s decode step), for the memory rows.
sim() { # port decode-step
  $BIN sim-backend --listen 127.0.0.1:$1 --model bench --max-num-seqs 20000 --kv-tokens 100000000 \
    --prefill-tokens-per-s 1e12 --decode-step-base $2 --decode-step-per-seq 0s >/dev/null 2>&1 &
}
sim 18001 1us; sim 18003 1us; sim 18005 1us
sim 18002 20ms
sim 18006 60s

gateway_conf() { # port admin backend-ports...
  local port=$1 admin=$2; shift 2
  cat <<CONF
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
max_requests = 20000
${WORKERS:+workers = $WORKERS}
[queue]
discipline = "drf"
[[pools]]
model = "bench"
$POOL_CONF
CONF
  for b in "$@"; do
    printf '[[pools.backends]]\nurl = "http://127.0.0.1:%s"\nmax_inflight = 20000\n' $b
  done
  bench_tenant
}
BASE_NAME=base
CLUSTER_CONF=""
POOL_CONF=""
if [ "${OFF:-off}" = on ]; then
  # This build with prefix routing and the tenant's cache salt off, as
  # the fourth target ("off"): what the defaults cost, side by side.
  BASE=$BIN
  BASE_NAME=off
  CLUSTER_CONF=$'prefix_cache = "shared"\n'
fi
if [ "${CLUSTER:-off}" = on ]; then
  redis-server --port 18040 --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
  BASE=$BIN
  BASE_NAME=cluster
  CLUSTER_CONF=$'[cluster]\nstore = "redis://127.0.0.1:18040"\n'
  sleep 0.5
fi
# gateway NAME BINARY LOG-FILTER PORT ADMIN BACKENDS... → $PID_<NAME>, with
# $EXTRA_CONF appended to its policy.
EXTRA_CONF=""
gateway() {
  local name=$1 bin=$2 filter=$3 port=$4 admin=$5; shift 5
  { gateway_conf $port $admin "$@"; printf '%s' "$EXTRA_CONF"; } > $WORK/$name.toml
  if [ -n "$filter" ]; then
    RUST_LOG=$filter $bin serve --config $WORK/$name.toml --watch-interval 0s >/dev/null 2>$WORK/$name.log &
  else
    env -u RUST_LOG $bin serve --config $WORK/$name.toml --watch-interval 0s >/dev/null 2>$WORK/$name.log &
  fi
  printf -v "PID_$name" '%s' $!
}
# The shipped log: RUST_LOG unset, i.e. `info` in text with the access log.
gateway ship "$BIN" "" 18011 18021 18001 18003
gateway min "$BIN" warn 18012 18022 18005
gateway slow "$BIN" "" 18013 18023 18002
gateway hold "$BIN" warn 18014 18024 18006
if [ -n "${BASE:-}" ]; then
  EXTRA_CONF=$CLUSTER_CONF
  [ "$BASE_NAME" = off ] && POOL_CONF='routing = "least_outstanding"'
  gateway bship "$BASE" "" 18015 18025 18001 18003
  gateway bmin "$BASE" warn 18016 18026 18005
  gateway bslow "$BASE" "" 18017 18027 18002
fi

cat > $WORK/nginx.conf <<CONF
worker_processes 2;
pid $WORK/nginx.pid;
error_log $WORK/nginx.err warn;
events { worker_connections 4096; }
http {
  upstream ship { least_conn; server 127.0.0.1:18001; server 127.0.0.1:18003; keepalive 256; }
  upstream min { least_conn; server 127.0.0.1:18005; keepalive 256; }
  upstream slow { least_conn; server 127.0.0.1:18002; keepalive 256; }
  proxy_http_version 1.1;
  proxy_set_header Connection "";
  proxy_buffering off;
  proxy_request_buffering off;
  server { listen 127.0.0.1:18031; access_log $WORK/nginx-access.log combined buffer=64k flush=1s;
    location / { proxy_pass http://ship; } }
  server { listen 127.0.0.1:18032; access_log off; location / { proxy_pass http://min; } }
  server { listen 127.0.0.1:18033; access_log $WORK/nginx-access.log combined buffer=64k flush=1s;
    location / { proxy_pass http://slow; } }
}
CONF
nginx -c $WORK/nginx.conf -p $WORK
sleep 1

shipped_request > $WORK/ship.lua
cat > $WORK/min.lua <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
LUA
# Two tokens: a prefill step and one 20 ms decode step on the slow backend.
sed 's/"max_tokens":1/"max_tokens":2/' $WORK/min.lua > $WORK/slow.lua

nginx_pids() { echo "$(cat $WORK/nginx.pid)"; }
FLOOR=$(bench_bin floor)
WORKERS_N=${WORKERS:-$(nproc)}
$FLOOR 127.0.0.1:18041 $WORKERS_N 127.0.0.1:18001 127.0.0.1:18003 & PID_floorship=$!
$FLOOR 127.0.0.1:18042 $WORKERS_N 127.0.0.1:18005 & PID_floormin=$!

run() { # table name url script conns pids...
  local table=$1 name=$2 url=$3 script=$WORK/$4.lua conns=$5; shift 5
  local before=0 after=0
  [ $# -gt 0 ] && before=$(cpu_ticks "$@")
  wrk -t2 -c$conns -d${SECS}s --latency -s $script $url/v1/chat/completions > $WORK/out.txt
  [ $# -gt 0 ] && after=$(cpu_ticks "$@")
  wrk_row "$name" $((after - before)) $WORK/out.txt | tee -a $ROWS.$table
}

# table NAME TITLE CONNS DIRECT-PORT FAIRWAY-PORT BASE-PORT NGINX-PORT
# [FLOOR-PORT]: the targets in turn, ROUNDS times, with wrk script
# NAME.lua; rows also go to $ROWS.NAME for the medians.
table() {
  local name=$1 title=$2 conns=$3 direct=$4 fairway=$5 base=$6 nginx=$7 floor=${8:-}
  local gw_pid=PID_$name base_pid=PID_b$name floor_pid=PID_floor$name
  echo "# $title"
  printf 'target\treq/s\tp50_ms\tp99_ms\tproxy_cpu_us/req\tnon2xx\n'
  for r in $(seq $ROUNDS); do
    run $name direct http://127.0.0.1:$direct $name $conns
    run $name fairway http://127.0.0.1:$fairway $name $conns ${!gw_pid}
    [ -n "${BASE:-}" ] && run $name $BASE_NAME http://127.0.0.1:$base $name $conns ${!base_pid}
    run $name nginx http://127.0.0.1:$nginx $name $conns $(nginx_pids)
    [ -n "$floor" ] && run $name floor http://127.0.0.1:$floor $name $conns ${!floor_pid}
  done
  echo
}
table ship "max throughput, c=64, zero-delay backends: shipped configuration" 64 18001 18011 18015 18031 18041
table min "max throughput, c=64, zero-delay backend: minimal configuration (logs off, one backend, one token)" 64 18005 18012 18016 18032 18042
# Each request is a prefill step and one 20 ms decode step: 20 connections
# make the 500 req/s of issue 16's latency goal.
table slow "fixed load, c=20 against a 20 ms backend (about 500 req/s), shipped logs" 20 18002 18013 18017 18033
echo "# medians over the rounds; ratios to nginx (throughput, CPU) and to direct (added latency, ms)"
python3 - $ROWS <<'PY'
import statistics, sys
rows = sys.argv[1]
for table in ("ship", "min", "slow"):
    by = {}
    for line in open(f"{rows}.{table}"):
        name, rps, p50, p99, cpu, _ = line.split("\t")
        by.setdefault(name, []).append((float(rps), float(p50), float(p99), float(cpu)))
    med = {n: [statistics.median(c) for c in zip(*v)] for n, v in by.items()}
    d, x = med["direct"], med["nginx"]
    for n, (rps, p50, p99, cpu) in med.items():
        if n == "direct":
            continue
        print(f"{table}\t{n}\treq/s {rps:.0f} ({rps / x[0]:.2f}x nginx)\tcpu {cpu:.1f} us/req"
              f" ({cpu / x[3]:.2f}x nginx)\tp50 +{p50 - d[1]:.3f}\tp99 +{p99 - d[2]:.3f}")
PY
echo
echo "# time to first chunk of a 64-token stream (20 ms decode steps), a new connection each, median of 40, ms"
for target in direct:18002 fairway:18013 ${BASE:+$BASE_NAME:18017} nginx:18033; do
  name=${target%%:*}; port=${target##*:}
  for i in $(seq 40); do
    curl -s -o /dev/null -w '%{time_starttransfer}\n' http://127.0.0.1:$port/v1/chat/completions \
      -H 'Authorization: Bearer sk-bench' -H 'Content-Type: application/json' \
      -d '{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":64,"stream":true}'
  done | sort -n | awk -v n=$name 'NR==20{a=$1} NR==21{printf "%s\t%.2f\n", n, (a+$1)/2*1000}'
done
echo
echo "# gateway RSS holding idle streams (h2c, 100 per connection; backend decode step 60 s)"
rss_kib() { awk '/^VmRSS/{print $2}' /proc/$1/status; }
HOLDER=$(bench_bin streams)
# Warm up: one round of streams opened and closed, so the baseline has
# the runtime's and the allocator's steady state.
echo | $HOLDER 127.0.0.1:18014 200 sk-bench bench >/dev/null
sleep 1
base=$(rss_kib $PID_hold)
printf 'streams\trss_kib\tper_stream_kib\n0\t%s\t-\n' $base
for n in 1000 10000 10000; do
  mkfifo $WORK/hold.in
  $HOLDER 127.0.0.1:18014 $n sk-bench bench < $WORK/hold.in > $WORK/hold.out &
  exec 9> $WORK/hold.in
  until grep -q held $WORK/hold.out 2>/dev/null; do
    if ! kill -0 $! 2>/dev/null; then echo "stream holder failed"; exit 1; fi
    sleep 0.2
  done
  sleep 1
  rss=$(rss_kib $PID_hold)
  awk -v n=$n -v r=$rss -v b=$base 'BEGIN { printf "%d\t%d\t%.1f\n", n, r, (r - b) / n }'
  exec 9>&-
  wait $!
  rm $WORK/hold.in
  sleep 2
done
printf 'after\t%s\t-\n' $(rss_kib $PID_hold)
if [ "${CLUSTER:-off}" = on ]; then
  echo
  echo "# cluster: store round trips per request (both cluster gateways, whole run)"
  for admin in 18025 18026; do
    curl -s http://127.0.0.1:$admin/metrics | python3 -c '
import sys
syncs = reqs = 0.0
for line in sys.stdin:
    if line.startswith("fairway_cluster_store_syncs_total{"):
        syncs += float(line.split()[-1])
    elif line.startswith("fairway_requests_total{"):
        reqs += float(line.split()[-1])
print(f"admin :'$admin'\tsyncs {syncs:.0f}\trequests {reqs:.0f}\tper request {syncs / max(reqs, 1):.6f}")'
  done
fi
