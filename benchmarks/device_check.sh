#!/usr/bin/env bash
# One accelerator check (see benchmarks/device_check.py): bf16 sampling and GRPO-step MFU at the
# Qwen2.5-0.5B and 1.5B shapes, K = 1, 8, 32 candidates batched against a loop, and the
# planner's predicted memory against the measured peak. On one GPU it takes under 8 minutes.
#
#   benchmarks/device_check.sh [OUT.json] [--tiny] [--peak-flops=...]
#
# OUT.json defaults to device_check.json; the remaining arguments go to the Python module.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-device_check.json}"
if [[ $# -gt 0 ]]; then shift; fi
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
exec timeout "${DEVICE_CHECK_TIMEOUT_S:-480}" "${PYTHON:-python}" -m benchmarks.device_check --out="$out" "$@"
