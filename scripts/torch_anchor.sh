#!/usr/bin/env bash
# Gyre vs PyTorch on CPU, in the same run, on the same checkpoint (issue 13's
# Measure): generation tokens/s with 1 and 32 concurrent requests, training
# tokens/s of one step (forward+backward, then AdamW), for the tiny Qwen3 shape of
# gpu/benches/policy.rs (in transformers) and Gyre's own default model (in
# the script's PyTorch module of it). Rounds alternate Gyre and PyTorch so
# both see the same machine load; the tables give medians over rounds and
# Gyre/PyTorch ratios (above 1: Gyre is faster). Both run on the same
# number of threads (GYRE_THREADS, default the physical cores, which is
# both libraries' default), and the summary checks they
# compute the same function: the largest difference between Gyre's and
# PyTorch's log-probs of one row's targets (must be within 1e-4).
#
#   TORCH_VENV=/tmp/torch-venv scripts/torch_anchor.sh [ROUNDS] [REPS]
#
# With GYRE_BEFORE=PATH (a `torch_anchor` binary of an earlier commit, e.g.
# copied from target/release/examples before a change), each round runs it
# too, and the table gains a "before" column and the now/before ratio.
#
# Needs a venv (default /tmp/torch-venv, outside the repo) with torch and
# transformers; PyPI's torch brings its nvidia-* wheels (about 6 GB):
#   python3 -m venv /tmp/torch-venv
#   /tmp/torch-venv/bin/pip install --no-cache-dir torch transformers
# Not run in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
reps=${2:-5}
py=${TORCH_VENV:-/tmp/torch-venv}/bin/python
dir=target/torch-anchor
[ -x "$py" ] || { echo "no $py: see the comment at the top of $0" >&2; exit 1; }
export CARGO_INCREMENTAL=0
export GYRE_THREADS=${GYRE_THREADS:-$(lscpu -p=core,socket | grep -v '^#' | sort -u | wc -l)}
export RAYON_NUM_THREADS=$GYRE_THREADS
cargo build --release -q -p gyre-gpu --example torch_anchor
gyre=target/release/examples/torch_anchor
rm -rf "$dir" && "$gyre" write "$dir/ckpt"
: > "$dir/results.jsonl"
for r in $(seq "$rounds"); do
  for m in ckpt/qwen3 ckpt/gyre.safetensors; do
    if [ -n "${GYRE_BEFORE:-}" ]; then
      "$GYRE_BEFORE" bench "$dir/$m" "$reps" | sed 's/"impl":"gyre"/"impl":"before"/' | tee -a "$dir/results.jsonl"
    fi
    "$gyre" bench "$dir/$m" "$reps" | tee -a "$dir/results.jsonl"
    "$py" scripts/torch_anchor.py "$dir/$m" "$reps" | tee -a "$dir/results.jsonl"
  done
done
"$py" - "$dir/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(impl, model, key):
    return statistics.median(r[key] for r in rows if r["impl"] == impl and r["model"] == model)
torch_row = next(r for r in rows if r["impl"] == "torch")
print(f"\n{sum(r['impl'] == 'torch' for r in rows) // 2} rounds; torch {torch_row['torch']}, {torch_row['threads']} torch threads, "
      f"{rows[0]['threads']} cores")
bad = False
for model in ["qwen3", "gyre"]:
    g = next(r for r in rows if r["impl"] == "gyre" and r["model"] == model)["logprobs"]
    t = next(r for r in rows if r["impl"] == "torch" and r["model"] == model)["logprobs"]
    diff = max(abs(a - b) for a, b in zip(g, t)) if len(g) == len(t) else float("inf")
    print(f"{model}: {len(g)} target log-probs, max |Gyre - PyTorch| = {diff:.2e}")
    bad |= not diff <= 1e-4
before = any(r["impl"] == "before" for r in rows)
if before:
    print("| model | what | Gyre before | Gyre now | PyTorch | now / before | now / PyTorch (before / PyTorch) |")
    print("|---|---|---:|---:|---:|---:|---:|")
else:
    print("| model | what | Gyre tokens/s | PyTorch tokens/s | Gyre / PyTorch |")
    print("|---|---|---:|---:|---:|")
for model in ["qwen3", "gyre"]:
    for what, key in [("generation, 1 request x 64 tokens", "generate_1"),
                      ("generation, 32 concurrent x 64 tokens", "generate_32"),
                      ("training fwd+bwd+AdamW, 8 rows x 128 tokens", "train")]:
        toks = rows[0][key + "_tokens"]
        g, t = toks / med("gyre", model, key + "_s"), toks / med("torch", model, key + "_s")
        if before:
            b = toks / med("before", model, key + "_s")
            print(f"| {model} | {what} | {b:,.0f} | {g:,.0f} | {t:,.0f} | {g / b:.2f} | {g / t:.2f} ({b / t:.2f}) |")
        else:
            print(f"| {model} | {what} | {g:,.0f} | {t:,.0f} | {g / t:.2f} |")
# On a noisy machine the rounds' levels drift together: the ratio within
# each round (Gyre and PyTorch a few seconds apart) is the steadier figure.
print("\nper round, Gyre / PyTorch (median):")
for model in ["qwen3", "gyre"]:
    for key in ["generate_1", "generate_32", "train"]:
        g = [r[key + "_s"] for r in rows if r["impl"] == "gyre" and r["model"] == model]
        t = [r[key + "_s"] for r in rows if r["impl"] == "torch" and r["model"] == model]
        ratios = [b / a for a, b in zip(g, t)]
        print(f"  {model} {key}: {' '.join(f'{x:.2f}' for x in ratios)} ({statistics.median(ratios):.2f})")
sys.exit("log-probs differ by more than 1e-4" if bad else 0)
PY
