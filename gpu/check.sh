#!/usr/bin/env bash
# The GPU check: builds gyre-gpu with the `cuda` feature and runs its CUDA
# tests (allocation by tag, release/restore, host<->device copies, NCCL
# all-reduce and broadcast) on a machine with an NVIDIA GPU. A missing
# driver or libnccl fails the run here, where the CPU test suite skips.
set -euo pipefail
cd "$(dirname "$0")/.."
export GYRE_REQUIRE_CUDA=1
if command -v nvidia-smi >/dev/null; then nvidia-smi -L; fi
timeout 280 cargo test -p gyre-gpu --features cuda --test cuda -- --nocapture
