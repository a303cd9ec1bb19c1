#!/bin/bash
# Role-switch time as the scheduler sees it (decision or return order until
# the cell holds its new role), in one process vs across processes: the
# scheduler's "switch done" debug lines of `gyre train --tiny`, median and
# max per direction (the README's "Role-switch time" table).
# Usage: scripts/switch-time.sh [path/to/gyre] [ROUNDS]   (default target/release/gyre 1)
set -euo pipefail
G=${1:-target/release/gyre}
ROUNDS=${2:-1}
run() {
  local label=$1; shift
  RUST_LOG=gyre_actors::sched::scheduler=debug "$G" --log-format json train "$@" 2>&1 >/dev/null | python3 -c "
import json, sys, statistics as st
t = {True: [], False: []}
for line in sys.stdin:
    try:
        f = json.loads(line).get('fields', {})
    except ValueError:
        continue
    if f.get('message') == 'switch done':
        t[f['to_training']].append(f['took_us'] / 1000)
for k, name in ((True, 'to training'), (False, 'to rollout')):
    v = t[k]
    print('$label', name, len(v), 'switches',
          'median %.1f ms max %.1f ms' % (st.median(v), max(v)) if v else '')"
}
for _ in $(seq "$ROUNDS"); do
  run tiny-live --tiny --host live
  run tiny-local --tiny --cluster local
done
