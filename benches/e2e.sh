#!/usr/bin/env bash
# End-to-end load bench: the same simulated backend reached (a) directly,
# (b) through Fairway with the whole policy on (auth, admission, fair queue,
# windows) and (c) through nginx as a plain reverse proxy (least_conn,
# upstream keepalive, buffering off). Runs alternate, in one session, so the
# ratios share the machine's noise. Needs: wrk, nginx, curl (Debian).
#
#   benches/e2e.sh [seconds-per-run] [rounds]
#
# BASE=path/to/an/older/fairway adds that build as a fourth target
# ("base"), run in the same rounds, for a before/after in one session.
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
BIN=target/release/fairway
# Gateways run as users run them: the access log on (JSON lines, one per
# request, written to a file). ACCESS_LOG=off measures without it.
export RUST_LOG=warn
if [ "${ACCESS_LOG:-on}" = on ]; then
  GW_LOG="fairway::access=info,warn"
else
  GW_LOG="warn"
fi

# Backends: zero delay (1 token, 1 µs steps) and 20 ms (2 tokens: one 20 ms decode step).
$BIN sim-backend --listen 127.0.0.1:18001 --model bench --max-num-seqs 4096 --prefill-tokens-per-s 1e12 \
  --decode-step-base 1us --decode-step-per-seq 0s >/dev/null &
$BIN sim-backend --listen 127.0.0.1:18002 --model bench --max-num-seqs 4096 --prefill-tokens-per-s 1e12 \
  --decode-step-base 20ms --decode-step-per-seq 0s >/dev/null &

gateway_conf() { # port admin backend
cat <<CONF
[server]
listen = "127.0.0.1:$1"
admin_listen = "127.0.0.1:$2"
[queue]
discipline = "drf"
[[pools]]
model = "bench"
[[pools.backends]]
url = "http://127.0.0.1:$3"
max_inflight = 4096
[[tenants]]
name = "bench"
api_keys = ["sk-bench"]
rate = 1000000
burst = 1000000
gpu_seconds_per_hour = 1000000000
CONF
}
BASE_NAME=base
CLUSTER_CONF=""
if [ "${CLUSTER:-off}" = on ]; then
  redis-server --port 18040 --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
  BASE=$BIN
  BASE_NAME=cluster
  CLUSTER_CONF=$'[cluster]\nstore = "redis://127.0.0.1:18040"\n'
  sleep 0.5
fi
gateway_conf 18011 18021 18001 > $WORK/g0.toml
gateway_conf 18012 18022 18002 > $WORK/g20.toml
RUST_LOG=$GW_LOG $BIN --log-json serve --config $WORK/g0.toml --watch-interval 0s >/dev/null 2>$WORK/g0.log &
G0=$!
RUST_LOG=$GW_LOG $BIN --log-json serve --config $WORK/g20.toml --watch-interval 0s >/dev/null 2>$WORK/g20.log &
G20=$!
if [ -n "${BASE:-}" ]; then
  { gateway_conf 18013 18023 18001; printf '%s' "$CLUSTER_CONF"; } > $WORK/b0.toml
  { gateway_conf 18014 18024 18002; printf '%s' "$CLUSTER_CONF"; } > $WORK/b20.toml
  RUST_LOG=$GW_LOG $BASE --log-json serve --config $WORK/b0.toml --watch-interval 0s >/dev/null 2>$WORK/b0.log &
  B0=$!
  RUST_LOG=$GW_LOG $BASE --log-json serve --config $WORK/b20.toml --watch-interval 0s >/dev/null 2>$WORK/b20.log &
  B20=$!
fi

cat > $WORK/nginx.conf <<CONF
worker_processes 2;
pid $WORK/nginx.pid;
error_log $WORK/nginx.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  upstream b0 { least_conn; server 127.0.0.1:18001; keepalive 256; }
  upstream b20 { least_conn; server 127.0.0.1:18002; keepalive 256; }
  server {
    listen 127.0.0.1:18031;
    location / { proxy_pass http://b0; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; proxy_request_buffering off; }
  }
  server {
    listen 127.0.0.1:18032;
    location / { proxy_pass http://b20; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; proxy_request_buffering off; }
  }
}
CONF
nginx -c $WORK/nginx.conf -p $WORK
sleep 1

cat > $WORK/post.lua <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
LUA
# Two tokens: a prefill step and one 20 ms decode step on the slow backend.
sed 's/"max_tokens":1/"max_tokens":2/' $WORK/post.lua > $WORK/post2.lua

nginx_pids() { echo "$(cat $WORK/nginx.pid)"; }

run() { # name url conns pids...
  local name=$1 url=$2 conns=$3; shift 3
  local script=$WORK/post.lua
  case $url in *18002|*18012|*18014|*18032) script=$WORK/post2.lua ;; esac
  local before=0 after=0
  [ $# -gt 0 ] && before=$(cpu_ticks "$@")
  wrk -t2 -c$conns -d${SECS}s --latency -s $script $url/v1/chat/completions > $WORK/out.txt
  [ $# -gt 0 ] && after=$(cpu_ticks "$@")
  wrk_row "$name" $((after - before)) $WORK/out.txt
}

echo "# max throughput, c=64, zero-delay backend"
echo -e "target\treq/s\tp50_ms\tp99_ms\tproxy_cpu_us/req\tnon2xx"
for r in $(seq $ROUNDS); do
  run direct http://127.0.0.1:18001 64
  run fairway http://127.0.0.1:18011 64 $G0
  [ -n "${BASE:-}" ] && run $BASE_NAME http://127.0.0.1:18013 64 $B0
  run nginx http://127.0.0.1:18031 64 $(nginx_pids)
done
echo
echo "# fixed load, c=10 against a 20 ms backend (about 500 req/s)"
echo -e "target\treq/s\tp50_ms\tp99_ms\tproxy_cpu_us/req\tnon2xx"
for r in $(seq $ROUNDS); do
  run direct http://127.0.0.1:18002 10
  run fairway http://127.0.0.1:18012 10 $G20
  [ -n "${BASE:-}" ] && run $BASE_NAME http://127.0.0.1:18014 10 $B20
  run nginx http://127.0.0.1:18032 10 $(nginx_pids)
done
echo
echo "# time to first chunk of a 64-token stream (20 ms decode steps), median of 20, ms"
for target in direct:18002 fairway:18012 nginx:18032; do
  name=${target%%:*}; port=${target##*:}
  for i in $(seq 20); do
    curl -s -o /dev/null -w '%{time_starttransfer}\n' http://127.0.0.1:$port/v1/chat/completions \
      -H 'Authorization: Bearer sk-bench' -H 'Content-Type: application/json' \
      -d '{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":64,"stream":true}'
  done | sort -n | awk -v n=$name 'NR==10{a=$1} NR==11{printf "%s\t%.2f\n", n, (a+$1)/2*1000}'
done
if [ "${CLUSTER:-off}" = on ]; then
  echo
  echo "# cluster: store round trips per request (both cluster gateways, whole run)"
  for admin in 18023 18024; do
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
