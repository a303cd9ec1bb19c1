#!/bin/bash
# All-reduce time of the training prefix inside `gyre train --cluster local`
# runs (every cell its own process): the core logs each reduction over more
# than one process (gyre::cluster::prefix, debug); this prints, per
# (ranks, values), the calls and the median and max in ms, the first call of
# each ring (which builds it) left out; GYRE_DEFAULT_MODEL=1 adds 4 steps of
# the default model with 2 cells. Usage:
#   scripts/cluster-allreduce.sh [target/debug/gyre] [steps]
set -euo pipefail
GYRE=${1:-target/debug/gyre}
STEPS=${2:-20}
TMP=$(mktemp -d)
run() { # name, steps, extra args...
  local name=$1 steps=$2; shift 2
  RUST_LOG=warn,gyre::cluster::prefix=debug "$GYRE" train --cluster local --steps "$steps" "$@" --json \
    > "$TMP/$name.json" 2> "$TMP/$name.err"
  sed 's/\x1b\[[0-9;]*m//g' "$TMP/$name.err" | grep 'prefix all-reduce' |
    sed 's/.*ranks=\([0-9]*\) values=\([0-9]*\) micros=\([0-9]*\).*/\1 \2 \3/'
}
for cells in 2 3 4; do
  printf '[sched]\ncells = %s\n' "$cells" > "$TMP/c$cells.toml"
  run "tiny-c$cells" "$STEPS" --tiny --config "$TMP/c$cells.toml"
done > "$TMP/all.txt"
if [ "${GYRE_DEFAULT_MODEL:-0}" = 1 ]; then
  run default-c2 4 >> "$TMP/all.txt"
fi
python3 - "$TMP/all.txt" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    r, v, us = map(int, line.split())
    rows.setdefault((r, v), []).append(us / 1000)
print("| ranks | values | MiB | calls | median ms | max ms |")
print("|---|---|---|---|---|---|")
for (r, v), ms in sorted(rows.items()):
    steady = ms[1:] or ms
    print(f"| {r} | {v:,} | {v*4/2**20:.2f} | {len(steady)} | {statistics.median(steady):.2f} | {max(steady):.2f} |")
PY
rm -rf "$TMP"
