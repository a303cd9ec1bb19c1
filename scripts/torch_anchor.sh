#!/usr/bin/env bash
# Gyre vs PyTorch on CPU, in the same run, on the same checkpoint (issue 13's
# Measure): generation tokens/s with 1 and 32 concurrent requests, training
# tokens/s of one forward+backward, for the tiny Qwen3 shape of
# gpu/benches/policy.rs. Rounds alternate Gyre and PyTorch so both see the
# same machine load; the table gives medians over rounds and Gyre/PyTorch
# ratios (above 1: Gyre is faster).
#
#   scripts/torch_anchor.sh [ROUNDS] [REPS]
#
# Needs target/torch-venv with torch and transformers:
#   python3 -m venv target/torch-venv
#   target/torch-venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
#   target/torch-venv/bin/pip install filelock sympy networkx jinja2 fsspec \
#       typing-extensions mpmath transformers
# Not run in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
reps=${2:-5}
py=target/torch-venv/bin/python
dir=target/torch-anchor
[ -x "$py" ] || { echo "no $py: see the comment at the top of $0" >&2; exit 1; }
export CARGO_INCREMENTAL=0
cargo build --release -q -p gyre-gpu --example torch_anchor
gyre=target/release/examples/torch_anchor
rm -rf "$dir" && "$gyre" write "$dir/ckpt"
: > "$dir/results.jsonl"
for r in $(seq "$rounds"); do
  "$gyre" bench "$dir/ckpt" "$reps" | tee -a "$dir/results.jsonl"
  "$py" scripts/torch_anchor.py "$dir/ckpt" "$reps" 2>/dev/null | tee -a "$dir/results.jsonl"
done
"$py" - "$dir/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(impl, key):
    return statistics.median(r[key] for r in rows if r["impl"] == impl)
print(f"\n{len(rows)//2} rounds; torch {next(r['torch'] for r in rows if r['impl']=='torch')}, "
      f"{rows[0]['threads']} threads")
print("| what | Gyre tokens/s | PyTorch tokens/s | Gyre / PyTorch |")
print("|---|---:|---:|---:|")
for what, key in [("generation, 1 request x 64 tokens", "generate_1"),
                  ("generation, 32 concurrent x 64 tokens", "generate_32"),
                  ("training fwd+bwd, 8 rows x 128 tokens", "train")]:
    toks = rows[0][key + "_tokens"]
    g, t = toks / med("gyre", key + "_s"), toks / med("torch", key + "_s")
    print(f"| {what} | {g:,.0f} | {t:,.0f} | {g / t:.2f} |")
PY
