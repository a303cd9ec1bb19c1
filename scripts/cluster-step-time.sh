#!/bin/bash
# Step time of `gyre train` in one process vs across processes, side by side
# (the README's "Step time, across processes vs in one process" table).
# Usage: scripts/cluster-step-time.sh [path/to/gyre]   (default target/debug/gyre)
set -euo pipefail
G=${1:-target/debug/gyre}
run() {
  local label=$1; shift
  "$G" train "$@" --json 2>/dev/null | python3 -c "
import json, sys
r = json.load(sys.stdin)
print('$label', r['steps'], 'steps', '%.2f s' % r['wall_secs'], '%.0f ms/step' % (1000 * r['wall_secs'] / r['steps']),
      'reward %.3f -> %.3f' % (r['early_reward'] or 0, r['late_reward'] or 0), r.get('bytes_moved', ''))"
}
for _ in 1 2; do
  run tiny-live --tiny --host live
  run tiny-local --tiny --cluster local
  run tiny-local2 --tiny --cluster local:2
done
run default-live --host live
run default-local --cluster local
