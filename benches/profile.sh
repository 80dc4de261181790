#!/usr/bin/env bash
# Profile of the gateway in its shipped configuration (the text log at its
# default level with the access log, the poller, two zero-delay backends, a
# chat body of about 200 bytes and a 20-token answer, 64 keep-alive
# connections), as benches/e2e.sh's "shipped" rows run it.
#
#   benches/profile.sh OUT-PREFIX [seconds]
#
# Writes OUT-PREFIX.txt (perf report: the hottest symbols, self and with
# children) and OUT-PREFIX.svg (a flame graph; needs `cargo install
# inferno`; FOLDED=path also keeps the folded stacks there). Needs perf,
# wrk.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
OUT=$1
SECS=${2:-10}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf $WORK' EXIT
cargo build --release --quiet
BIN=${BIN:-target/release/fairway}
shipped_gateway "$BIN" $WORK
shipped_request > $WORK/ship.lua
sleep 1
wrk -t2 -c64 -d2s -s $WORK/ship.lua http://127.0.0.1:18211/v1/chat/completions >/dev/null
wrk -t2 -c64 -d$((SECS + 2))s -s $WORK/ship.lua http://127.0.0.1:18211/v1/chat/completions > $WORK/wrk.txt &
sleep 1
perf record -F 999 -g --call-graph dwarf,16384 -p $GW -o $WORK/perf.data -- sleep $SECS 2>/dev/null
wait %%  2>/dev/null || true
{
  echo "# $(grep 'Requests/sec' $WORK/wrk.txt)"
  echo "# self"
  perf report -i $WORK/perf.data --no-children --stdio --percent-limit 0.7 -g none 2>/dev/null | grep -v '^#' | grep -v '^$'
  echo "# with children"
  perf report -i $WORK/perf.data --children --stdio --percent-limit 3 -g none 2>/dev/null | grep -v '^#' | grep -v '^$'
} | cut -c1-200 > $OUT.txt
if command -v inferno-collapse-perf >/dev/null; then
  perf script -i $WORK/perf.data 2>/dev/null | inferno-collapse-perf > $WORK/folded
  inferno-flamegraph --minwidth 1 < $WORK/folded > $OUT.svg
  [ -z "${FOLDED:-}" ] || cp $WORK/folded "$FOLDED"
fi
echo "wrote $OUT.txt${OUT:+ and $OUT.svg}"
