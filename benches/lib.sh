# Shared by the end-to-end benches (sourced): the shipped configuration's
# gateway and request, CPU accounting of the proxy processes and one table
# row from a wrk run.

bench_tenant() { # → the policy's tenant "bench" (key sk-bench), with limits no bench reaches
cat <<CONF
[[tenants]]
name = "bench"
api_keys = ["sk-bench"]
rate = 1000000
burst = 1000000
gpu_seconds_per_hour = 1000000000
CONF
}

shipped_gateway() { # binary workdir → $GW: the gateway as shipped (text log at info, poller on)
  # on 127.0.0.1:18211 (admin :18221), in front of two zero-delay backends
  # on :18201 and :18202; its policy and log in workdir.
  local bin=$1 dir=$2
  for port in 18201 18202; do
    $bin sim-backend --listen 127.0.0.1:$port --model bench --max-num-seqs 4096 --prefill-tokens-per-s 1e12 \
      --decode-step-base 1us --decode-step-per-seq 0s >/dev/null 2>&1 &
  done
  cat > $dir/g.toml <<CONF
[server]
listen = "127.0.0.1:18211"
admin_listen = "127.0.0.1:18221"
[[pools]]
model = "bench"
[[pools.backends]]
url = "http://127.0.0.1:18201"
max_inflight = 4096
[[pools.backends]]
url = "http://127.0.0.1:18202"
max_inflight = 4096
$(bench_tenant)
CONF
  env -u RUST_LOG $bin serve --config $dir/g.toml --watch-interval 0s >/dev/null 2>$dir/g.log &
  GW=$!
}

shipped_request() { # → a wrk script: a chat of about 200 bytes asking for 20 tokens, as tenant "bench"
cat <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"bench","messages":[{"role":"system","content":"You are a concise assistant."},{"role":"user","content":"Summarise the main causes of the 1929 stock market crash in two sentences."}],"max_tokens":20,"temperature":0.2}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
LUA
}

bench_bin() { # name → the newest build of benches/NAME.rs (cargo bench --no-run)
  ls -t target/release/deps/$1-* | grep -v '\.d$' | head -1
}

cpu_ticks() { # pids... → utime+stime summed over them and their children, in clock ticks
  local t=0
  for p in "$@"; do
    for q in $p $(pgrep -P $p 2>/dev/null || true); do
      t=$((t + $(awk '{print $14+$15}' /proc/$q/stat)))
    done
  done
  echo $t
}

wrk_row() { # name cpu_ticks wrk_output_file → "name req/s p50_ms p99_ms cpu_us/req non2xx"
  python3 - "$1" "$2" "$(getconf CLK_TCK)" "$3" <<'PY'
import re, sys
name, ticks, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = open(sys.argv[4]).read()
def lat(p):
    m = re.search(r"^\s+%s%%\s+([\d.]+)(us|ms|s)" % p, t, re.M)
    v, u = float(m.group(1)), m.group(2)
    return v / 1000 if u == "us" else v * 1000 if u == "s" else v
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
total = int(re.search(r"(\d+) requests in", t).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
cpu_us = ticks / hz * 1e6 / max(total, 1) if ticks else 0
print(f"{name}\t{rps:.0f}\t{lat(50):.3f}\t{lat(99):.3f}\t{cpu_us:.1f}\t{non2xx.group(1) if non2xx else 0}")
PY
}
