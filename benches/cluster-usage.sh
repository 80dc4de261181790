#!/usr/bin/env bash
# The cost of the cluster-wide usage windows (docs/usage.md, "Several
# replicas"): three gateway replicas sharing a local redis-server, TENANTS
# tenants each sending requests round-robin over the replicas (wrk, one
# connection per replica and tenant), for SECS seconds. Reports, from the
# store's own counters: the bytes the replicas wrote to it per second and
# per sync, split into the usage windows and the rest (the leases, the
# demand), the size of the usage hashes; then the time to answer
# /fairway/usage for one tenant with the cluster's numbers against one
# replica's own (?scope=replica, operator), medians of 50.
#
#   benches/cluster-usage.sh [tenants] [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
TENANTS=${1:-4}
SECS=${2:-10}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf $WORK' EXIT
cargo build --release --quiet
BIN=target/release/fairway
RPORT=18090
redis-server --port $RPORT --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
for i in $(seq 50); do redis-cli -p $RPORT ping >/dev/null 2>&1 && break; sleep 0.1; done
$BIN sim-backend --listen 127.0.0.1:18091 --model bench --max-num-seqs 4096 --prefill-tokens-per-s 1e12 \
  --decode-step-base 1ms --decode-step-per-seq 0s >/dev/null 2>&1 &
echo -n "operator-token" > $WORK/admin
for r in 0 1 2; do
  {
    cat <<CONF
[server]
listen = "127.0.0.1:1810$r"
admin_listen = "127.0.0.1:1811$r"
admin_token_file = "$WORK/admin"
[cluster]
store = "redis://127.0.0.1:$RPORT"
replica = "r$r"
sync_interval = "1s"
[[pools]]
model = "bench"
[[pools.backends]]
url = "http://127.0.0.1:18091"
max_inflight = 4096
CONF
    for t in $(seq $TENANTS); do
      printf '[[tenants]]\nname = "t%s"\napi_keys = ["sk-t%s"]\nrate = 1000000\nburst = 1000000\n' $t $t
    done
  } > $WORK/r$r.toml
  env -u RUST_LOG $BIN serve --config $WORK/r$r.toml --watch-interval 0s >/dev/null 2>$WORK/r$r.log &
done
for r in 0 1 2; do
  for i in $(seq 100); do curl -sf http://127.0.0.1:1811$r/healthz >/dev/null 2>&1 && break; sleep 0.1; done
done
sleep 2
stat() { redis-cli -p $RPORT info stats | awk -F: -v k=$1 '$1==k {print $2+0}'; }
usage_calls() { redis-cli -p $RPORT info commandstats | awk -F'[:=,]' '/^cmdstat_(hset|hdel|expire|hgetall):/ {n+=$3} END {print n+0}'; }
in0=$(stat total_net_input_bytes); cmd0=$(stat total_commands_processed)
for t in $(seq $TENANTS); do
  cat > $WORK/t$t.lua <<LUA
wrk.method = "POST"
wrk.body = '{"model":"bench","messages":[{"role":"user","content":"hello"}],"max_tokens":5}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-t$t"
LUA
  for r in 0 1 2; do
    wrk -t1 -c1 -d${SECS}s -s $WORK/t$t.lua http://127.0.0.1:1810$r/v1/chat/completions > $WORK/wrk-$t-$r.txt &
  done
done
wait $(jobs -p | tail -n $((TENANTS * 3))) 2>/dev/null || sleep $((SECS + 1))
in1=$(stat total_net_input_bytes); cmd1=$(stat total_commands_processed)
requests=$(cat $WORK/wrk-*.txt | awk '/requests in/ {n+=$1} END {print n}')
bytes_usage=0
for t in $(seq $TENANTS); do
  bytes_usage=$((bytes_usage + $(redis-cli -p $RPORT memory usage "{fairway}:usage:t$t") ))
done
echo "tenants $TENANTS, replicas 3, sync_interval 1s, ${SECS}s: $requests requests"
awk -v b=$((in1 - in0)) -v c=$((cmd1 - cmd0)) -v s=$SECS -v n=$requests -v t=$TENANTS 'BEGIN {
  printf "written to the store: %.1f KB/s in all (%.1f KB per replica per sync, %.2f KB per tenant), %.1f commands/s\n", b/s/1024, b/s/3/1024, b/s/3/t/1024, c/s;
  printf "store round trips per request: %.4f\n", 2*3*s/n }'
echo "usage hashes: $((bytes_usage / 1024)) KB for $TENANTS tenants"
time_usage() { # url auth → median seconds of 50
  for i in $(seq 50); do
    curl -s -o /dev/null -w '%{time_total}\n' -H "authorization: Bearer $2" "$1"
  done | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
cluster=$(time_usage http://127.0.0.1:18100/fairway/usage/t1 operator-token)
replica=$(time_usage "http://127.0.0.1:18100/fairway/usage/t1?scope=replica" operator-token)
all=$(time_usage http://127.0.0.1:18100/fairway/usage operator-token)
echo "a /fairway/usage answer, median of 50: one tenant, the cluster's ${cluster}s, one replica's ${replica}s; every tenant, the cluster's ${all}s"
for r in 0 1 2; do
  curl -s -H "authorization: Bearer operator-token" http://127.0.0.1:1810$r/fairway/usage/t1 \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print("replica", d.get("replica"), "scope", d["scope"], "replicas", d["replicas"], "1h requests", d["windows"]["1h"]["requests"])'
done
