#!/usr/bin/env bash
# Triton generate through Fairway, side by side with direct and nginx, in
# one run: `benches/triton.sh [SECS] [ROUNDS]`.
#
# A simulated Triton (TensorRT-LLM flavour, zero-delay engine) behind a
# gateway with a `protocol = "triton"` backend and the access log on, as
# users run it; wrk posts `/v2/models/bench/generate` (non-streaming) at
# c=64 and reports req/s, p50/p99 and the proxy's CPU per request; then the
# time to the first event of a 64-token `generate_stream` (20 ms decode
# steps), median of 20. BASE=path/to/an/older/fairway adds that build as
# a row beside this one's, in the same rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
SECS=${1:-5}
ROUNDS=${2:-3}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -f $WORK/nginx.pid ] && kill $(cat $WORK/nginx.pid) 2>/dev/null; rm -rf $WORK' EXIT

cargo build --release --quiet
BIN=target/release/fairway
export RUST_LOG=warn
$BIN sim-backend --flavour triton-trtllm --listen 127.0.0.1:18101 --model bench --max-num-seqs 4096 \
  --prefill-tokens-per-s 1e12 --decode-step-base 1us --decode-step-per-seq 0s >/dev/null &
$BIN sim-backend --flavour triton-trtllm --listen 127.0.0.1:18102 --model bench --max-num-seqs 4096 \
  --prefill-tokens-per-s 1e12 --decode-step-base 20ms --decode-step-per-seq 0s >/dev/null &

gateway_conf() { # port admin backend
cat <<CONF
[server]
listen = "127.0.0.1:$1"
admin_listen = "127.0.0.1:$2"
[[pools]]
model = "bench"
[[pools.backends]]
url = "http://127.0.0.1:$3"
protocol = "triton"
max_inflight = 4096
[[tenants]]
name = "bench"
api_keys = ["sk-bench"]
rate = 1000000
burst = 1000000
CONF
}
gateway_conf 18111 18121 18101 > $WORK/g0.toml
gateway_conf 18112 18122 18102 > $WORK/g20.toml
RUST_LOG="fairway::access=info,warn" $BIN --log-json serve --config $WORK/g0.toml --watch-interval 0s >/dev/null 2>$WORK/g0.log &
G0=$!
RUST_LOG="fairway::access=info,warn" $BIN --log-json serve --config $WORK/g20.toml --watch-interval 0s >/dev/null 2>$WORK/g20.log &
if [ -n "${BASE:-}" ]; then
  gateway_conf 18113 18123 18101 > $WORK/gb.toml
  RUST_LOG="fairway::access=info,warn" $BASE --log-json serve --config $WORK/gb.toml --watch-interval 0s >/dev/null 2>$WORK/gb.log &
  GB=$!
fi

cat > $WORK/nginx.conf <<CONF
worker_processes 2;
pid $WORK/nginx.pid;
error_log $WORK/nginx.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  upstream b0 { server 127.0.0.1:18101; keepalive 256; }
  upstream b20 { server 127.0.0.1:18102; keepalive 256; }
  server { listen 127.0.0.1:18131; location / { proxy_pass http://b0; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; } }
  server { listen 127.0.0.1:18132; location / { proxy_pass http://b20; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; } }
}
CONF
nginx -c $WORK/nginx.conf -p $WORK
sleep 1

cat > $WORK/post.lua <<'LUA'
wrk.method = "POST"
wrk.body = '{"text_input":"What is machine learning?","max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
LUA
run() { # name url pids...
  local name=$1 url=$2; shift 2
  local before=0 after=0
  [ $# -gt 0 ] && before=$(cpu_ticks "$@")
  wrk -t2 -c64 -d${SECS}s --latency -s $WORK/post.lua $url > $WORK/out.txt
  [ $# -gt 0 ] && after=$(cpu_ticks "$@")
  wrk_row "$name" $((after - before)) $WORK/out.txt
}

echo "# Triton generate, c=64, zero-delay backend"
echo -e "target\treq/s\tp50_ms\tp99_ms\tproxy_cpu_us/req\tnon2xx"
for r in $(seq $ROUNDS); do
  run direct http://127.0.0.1:18101/v2/models/bench/generate
  run fairway http://127.0.0.1:18111/v2/models/bench/generate $G0
  [ -n "${BASE:-}" ] && run base http://127.0.0.1:18113/v2/models/bench/generate $GB
  run nginx http://127.0.0.1:18131/v2/models/bench/generate $(cat $WORK/nginx.pid)
done
echo
echo "# time to first event of a 64-token generate_stream (20 ms decode steps), median of 20, ms"
for target in direct:18102 fairway:18112 nginx:18132; do
  name=${target%%:*}; port=${target##*:}
  for i in $(seq 20); do
    curl -s -o /dev/null -w '%{time_starttransfer}\n' http://127.0.0.1:$port/v2/models/bench/generate_stream \
      -H 'Authorization: Bearer sk-bench' -H 'Content-Type: application/json' \
      -d '{"text_input":"What is machine learning?","max_tokens":64}'
  done | sort -n | awk -v n=$name 'NR==10{a=$1} NR==11{printf "%s\t%.2f\n", n, (a+$1)/2*1000}'
done
