#!/usr/bin/env bash
# Where each proxy's CPU goes, per request: user and system time, context
# switches, under the shipped load (the gateway as benches/profile.sh runs
# it, nginx as benches/e2e.sh configures it, the same two zero-delay
# backends, `wrk -t2 -c64`). Needs perf, wrk, nginx.
#
#   benches/split.sh [rounds]          # BIN=path/to/fairway to measure another build
#
# Each line: requests per second, then per request over the middle 5 s of
# an 8 s run: CPU (perf's task-clock), user and system time (/proc/PID/stat),
# context switches.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
export PATH=$PATH:/usr/sbin
ROUNDS=${1:-2}
W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -f $W/nginx.pid ] && kill $(cat $W/nginx.pid) 2>/dev/null; rm -rf $W' EXIT
cargo build --release --quiet
BIN=${BIN:-target/release/fairway}
shipped_gateway "$BIN" $W
cat > $W/nginx.conf <<CONF
worker_processes 2;
pid $W/nginx.pid;
error_log $W/nginx.err warn;
events { worker_connections 4096; }
http {
  upstream ship { least_conn; server 127.0.0.1:18201; server 127.0.0.1:18202; keepalive 256; }
  proxy_http_version 1.1;
  proxy_set_header Connection "";
  proxy_buffering off;
  proxy_request_buffering off;
  server { listen 127.0.0.1:18231; access_log $W/nginx-access.log combined buffer=64k flush=1s;
    location / { proxy_pass http://ship; } }
}
CONF
nginx -c $W/nginx.conf -p $W
sleep 1
shipped_request > $W/ship.lua
# utime and stime of the processes, in clock ticks (1/100 s).
ticks() { for p in ${1//,/ }; do awk '{print $14, $15}' /proc/$p/stat; done | awk '{u+=$1; s+=$2} END {print u, s}'; }
for _ in $(seq "$ROUNDS"); do
  for t in fairway:18211 nginx:18231; do
    name=${t%%:*}; port=${t##*:}
    if [ $name = fairway ]; then pids=$GW; else pids=$(pgrep -P "$(cat $W/nginx.pid)" | paste -sd,); fi
    wrk -t2 -c64 -d2s -s $W/ship.lua http://127.0.0.1:$port/v1/chat/completions >/dev/null
    wrk -t2 -c64 -d8s -s $W/ship.lua http://127.0.0.1:$port/v1/chat/completions > $W/wrk.txt &
    sleep 1
    before=$(ticks $pids)
    perf stat -x, -e task-clock,context-switches -p $pids -o $W/stat.txt -- sleep 5
    after=$(ticks $pids)
    wait %%
    python3 - "$name" "$(awk '/Requests\/sec/{print $2}' $W/wrk.txt)" $W/stat.txt $before $after <<'PY'
import sys
name, rps, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
u0, s0, u1, s1 = map(float, sys.argv[4:8])
stat = {}
for line in open(path):
    p = line.strip().split(',')
    if len(p) > 3 and p[0][:1].isdigit():
        stat[p[2]] = float(p[0])
n = rps * 5  # requests in the 5 s measured (wrk's rate over its whole run)
print(f"{name}\treq/s {rps:.0f}\tcpu {stat['task-clock'] * 1e3 / n:.1f} us/req"
      f"\tuser {(u1 - u0) * 1e4 / n:.1f}\tsystem {(s1 - s0) * 1e4 / n:.1f}"
      f"\tcontext switches {stat['context-switches'] / n:.2f}/req")
PY
  done
done
