#!/usr/bin/env bash
# Gateway memory per held stream the way an operator meets it: HTTP/1.1
# SSE clients (one connection per stream, as curl and the OpenAI SDKs
# open them) through the shipped configuration (text log at info, the
# poller on), in front of a backend whose decode step is 60 s, so that
# every stream idles once its headers and first chunk have arrived.
#
#   benches/sse-http1.sh [streams...]      (default: 1000 2000)
#
# Prints the gateway's RSS with no stream (after a warm-up round), then
# with each count held, and the difference per stream.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf $WORK' EXIT
cargo build --release --quiet
BIN=target/release/fairway
COUNTS=${*:-1000 2000}
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
$BIN sim-backend --listen 127.0.0.1:18301 --model bench --max-num-seqs 20000 --kv-tokens 100000000 \
  --prefill-tokens-per-s 1e12 --decode-step-base 60s --decode-step-per-seq 0s >/dev/null 2>&1 &
cat > $WORK/g.toml <<CONF
[server]
listen = "127.0.0.1:18311"
admin_listen = "127.0.0.1:18321"
max_connections = 20000
max_requests = 20000
[[pools]]
model = "bench"
[[pools.backends]]
url = "http://127.0.0.1:18301"
max_inflight = 20000
[[tenants]]
name = "bench"
api_keys = ["sk-bench"]
CONF
env -u RUST_LOG $BIN serve --config $WORK/g.toml --watch-interval 0s >/dev/null 2>$WORK/g.log &
GW=$!
until curl -sf http://127.0.0.1:18321/readyz >/dev/null; do sleep 0.2; done
rss_kib() { awk '/^VmRSS/{print $2}' /proc/$GW/status; }
hold() { # count → holds that many SSE streams until stdin closes
python3 - "$1" <<'PY'
import socket, sys
n = int(sys.argv[1])
body = b'{"model":"bench","messages":[{"role":"user","content":"hold"}],"max_tokens":4000,"stream":true}'
req = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer sk-bench\r\n"
       b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)) + body
held = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", 18311))
    s.sendall(req)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(4096)
        if not chunk:
            sys.exit("closed before the headers")
        got += chunk
    if not got.startswith(b"HTTP/1.1 200"):
        sys.exit(got[:200].decode(errors="replace"))
    held.append(s)
print("held", n, flush=True)
sys.stdin.read()
PY
}
echo | hold 200 >/dev/null
sleep 1
base=$(rss_kib)
printf 'streams\trss_kib\tper_stream_kib\n0\t%s\t-\n' "$base"
for n in $COUNTS; do
  mkfifo $WORK/in
  hold "$n" < $WORK/in > $WORK/out &
  exec 9> $WORK/in
  until grep -q held $WORK/out 2>/dev/null; do sleep 0.2; done
  sleep 1
  rss=$(rss_kib)
  awk -v n="$n" -v r="$rss" -v b="$base" 'BEGIN { printf "%d\t%d\t%.1f\n", n, r, (r - b) / n }'
  exec 9>&-
  wait $! || true
  rm $WORK/in
  sleep 2
done
