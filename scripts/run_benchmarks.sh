#!/usr/bin/env bash
# Run the compute benchmarks on a GPU machine (cudalab must be installed, e.g.
# by scripts/gpu_check.sh) and write benchmarks/results/compute_<device>.json.
# Usage: scripts/run_benchmarks.sh [--quick] [--only elementwise,reduce,...]
set -euo pipefail
cd "$(dirname "$0")/.."
LOGS=${OUT:-build/benchmarks}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
python3 benchmarks/run.py "$@" 2>&1 | tee "$LOGS/benchmarks.log"
cp benchmarks/results/compute_*.json "$LOGS/" 2>/dev/null || true
