#!/usr/bin/env bash
# Coverage-guided fuzzing of every target in fairway::fuzz with libFuzzer,
# on stable Rust (cargo-fuzz with --sanitizer none: coverage from sancov,
# no AddressSanitizer, which safe Rust does not need to find panics).
#
#   fuzz/run.sh                 1,000,000 inputs per target
#   fuzz/run.sh --runs N        N inputs per target
#   fuzz/run.sh --seconds S     S seconds per target (the CI run)
#   fuzz/run.sh --runs N sse_relay metrics    only these targets
#
# New corpus entries go to fuzz/corpus/<target>/ (not committed); a failing
# input goes to fuzz/artifacts/<target>/ and the run stops with an error.
# Once it is fixed, copy it to fuzz/regressions/<target>/ so that every
# `cargo test` replays it.
set -euo pipefail
cd "$(dirname "$0")"

limit=(-runs=1000000)
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) limit=("-runs=$2"); shift 2 ;;
        --seconds) limit=("-max_total_time=$2"); shift 2 ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
if [ ${#targets[@]} -eq 0 ]; then
    targets=(request_body sse_relay metrics policy multipart_form kv_events batch_input)
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
cargo fuzz build --sanitizer none

for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    log=$(mktemp)
    echo "fuzz: $t (${limit[*]})"
    if ! cargo fuzz run --sanitizer none "$t" "corpus/$t" "seeds/$t" -- \
        -dict="dict/$t.dict" "${limit[@]}" -print_final_stats=1 >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz: $t FAILED; the input is in fuzz/artifacts/$t/" >&2
        exit 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log")
    echo "fuzz: $t ok: ${runs} inputs in ${secs:-?} s, corpus $(ls "corpus/$t" | wc -l) files"
    rm -f "$log"
done
