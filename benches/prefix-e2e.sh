#!/usr/bin/env bash
# The data path's cost of routing on cached prefixes: an 8 KiB multi-turn
# chat (eight turns of about 1 KiB) played by wrk through three gateways
# in front of the same two zero-delay simulated backends, rounds
# alternating in one session:
# - "off": `routing = "least_outstanding"` (the prompt is never read for
#   its keys);
# - "bytes": `routing = "prefix_aware"`, keys from the prompt's bytes;
# - "tokenizer": `prefix_aware` with the pool's tokenizer and chat
#   template (a byte-level BPE of 4,000 ids trained here with the
#   `tokenizers` Python package of target/sdk-venv, made by tests/run.sh),
#   the chat rendered and tokenized, its pieces cached.
# Reports medians of throughput and the gateway's CPU per request (the
# whole policy on: auth, admission, fair queue, poller, access log).
#
#   benches/prefix-e2e.sh [seconds-per-run] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
SECS=${1:-5}
ROUNDS=${2:-3}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf $WORK' EXIT
PY=${PYTHON:-target/sdk-venv/bin/python}
"$PY" -c "import tokenizers" 2>/dev/null || { echo "needs $PY with tokenizers (tests/run.sh makes it)" >&2; exit 1; }
cargo build --release --quiet
BIN=target/release/fairway
ROWS=$WORK/rows.tsv

for port in 18301 18302; do
  $BIN sim-backend --listen 127.0.0.1:$port --model bench --max-num-seqs 20000 --kv-tokens 100000000 \
    --prefill-tokens-per-s 1e12 --decode-step-base 1us --decode-step-per-seq 0s >/dev/null 2>&1 &
done

# The conversation, and a tokenizer trained on its text.
TURN=$(printf 'The quick brown fox jumps over the lazy dog, said the assistant. %.0s' $(seq 16))
python3 - "$TURN" > $WORK/chat.lua <<'PY'
import json, sys
turn = sys.argv[1]
messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}. {turn}"} for i in range(8)]
body = json.dumps({"model": "bench", "messages": messages, "max_tokens": 20})
print("wrk.method = \"POST\"")
print("wrk.body = " + json.dumps(body))
print("wrk.headers[\"Content-Type\"] = \"application/json\"")
print("wrk.headers[\"Authorization\"] = \"Bearer sk-bench\"")
PY
"$PY" - "$WORK" "$TURN" <<'PY'
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
out, turn = sys.argv[1], sys.argv[2]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=4000, special_tokens=["<|im_start|>", "<|im_end|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator([turn] * 50 + ["You are a concise assistant."], trainer)
tok.save(f"{out}/tokenizer.json")
template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
json.dump({"chat_template": template}, open(f"{out}/tokenizer_config.json", "w"))
PY

gateway() { # name port admin routing extra
  cat > $WORK/$1.toml <<CONF
[server]
listen = "127.0.0.1:$2"
admin_listen = "127.0.0.1:$3"
max_body_bytes = 1048576
[[pools]]
model = "bench"
routing = "$4"
$5
[[pools.backends]]
url = "http://127.0.0.1:18301"
max_inflight = 20000
[[pools.backends]]
url = "http://127.0.0.1:18302"
max_inflight = 20000
$(bench_tenant)
CONF
  env -u RUST_LOG $BIN serve --config $WORK/$1.toml --watch-interval 0s >/dev/null 2>$WORK/$1.log &
  printf -v "PID_$1" '%s' $!
}
gateway off 18311 18321 least_outstanding ""
gateway bytes 18312 18322 prefix_aware ""
gateway tokenizer 18313 18323 prefix_aware "tokenizer = \"$WORK/tokenizer.json\""
sleep 1.5

echo "# 8 KiB chat, c=64, two zero-delay backends, shipped logs"
printf 'target\treq/s\tp50_ms\tp99_ms\tgateway_cpu_us/req\tnon2xx\n'
for r in $(seq $ROUNDS); do
  for t in off:18311 bytes:18312 tokenizer:18313; do
    name=${t%%:*}; port=${t##*:}; pid=PID_$name
    before=$(cpu_ticks ${!pid})
    wrk -t2 -c64 -d${SECS}s --latency -s $WORK/chat.lua http://127.0.0.1:$port/v1/chat/completions > $WORK/out.txt
    after=$(cpu_ticks ${!pid})
    wrk_row "$name" $((after - before)) $WORK/out.txt | tee -a $ROWS
  done
done
echo "# medians over the rounds"
python3 - $ROWS <<'PY'
import statistics, sys
by = {}
for line in open(sys.argv[1]):
    name, rps, p50, p99, cpu, _ = line.split("\t")
    by.setdefault(name, []).append((float(rps), float(p50), float(p99), float(cpu)))
med = {n: [statistics.median(c) for c in zip(*v)] for n, v in by.items()}
off = med["off"]
for n, (rps, p50, p99, cpu) in med.items():
    print(f"{n}\treq/s {rps:.0f} ({rps / off[0]:.2f}x off)\tcpu {cpu:.1f} us/req (+{cpu - off[3]:.1f})\tp50 {p50:.3f} ms\tp99 {p99:.3f} ms")
PY
