#!/usr/bin/env bash
# Build cudalab on a GPU machine, run the whole test suite with
# CUDALAB_REQUIRE_GPU=1 (a skipped GPU test is a failure), and write a JSON
# summary (device, driver/runtime versions, passed/failed counts) to
# benchmarks/results/gpu_check_<device>.json. Also saves `cudalab check` and
# `cudalab ceilings` output there (cli_check_<device>.txt, ceilings_<device>.*).
#
# Usage: scripts/gpu_check.sh [extra pytest args]
# Logs go to $OUT when it is set (and to build/gpu_check/ otherwise).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
LOGS=${OUT:-build/gpu_check}
mkdir -p "$LOGS" benchmarks/results
export PYTHONUNBUFFERED=1

echo "== build"
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  "$PYTHON" -m pip install --no-build-isolation --no-deps -v . >"$LOGS/build.log" 2>&1
build_rc=$?
build_s=$(( $(date +%s) - start ))
tail -n 5 "$LOGS/build.log"
if [ $build_rc -ne 0 ]; then
  echo "build failed (rc=$build_rc); see $LOGS/build.log"
  tail -n 60 "$LOGS/build.log"
  exit $build_rc
fi
echo "built in ${build_s}s"

echo "== device report"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv
  "$PYTHON" - <<'PY'
import cudalab as cl

print(cl.get_device_properties(0))
cl.set_per_process_memory_fraction(0.1)
try:
    cl.empty(cl.mem_get_info()[1] // 2, dtype="uint8")
except cl.OutOfMemoryError as e:
    print(f"OutOfMemoryError: {e}")
finally:
    cl.set_per_process_memory_fraction(1.0)
print(cl.memory_summary())
PY
} 2>&1 | tee "$LOGS/device_report.txt"

echo "== CLI: check and ceilings"
device_tag=$("$PYTHON" -c "import cudalab; print(cudalab.get_device_properties(0).name.replace(' ', '_'))")
"$PYTHON" -m cudalab check 2>&1 | tee "benchmarks/results/cli_check_${device_tag}.txt" "$LOGS/cli_check.txt"
"$PYTHON" -m cudalab ceilings --no-progress --json "benchmarks/results/ceilings_${device_tag}.json" 2>&1 \
  | tee "benchmarks/results/ceilings_${device_tag}.txt" "$LOGS/ceilings.txt"
cp "benchmarks/results/ceilings_${device_tag}.json" "$LOGS/" 2>/dev/null

echo "== tests (CUDALAB_REQUIRE_GPU=1)"
start=$(date +%s)
CUDALAB_REQUIRE_GPU=1 "$PYTHON" -m pytest -p no:cacheprovider -q -rfEs \
  --junitxml="$LOGS/junit.xml" "$@" 2>&1 | tee "$LOGS/pytest.log"
test_rc=${PIPESTATUS[0]}
test_s=$(( $(date +%s) - start ))

"$PYTHON" scripts/gpu_summary.py --junit "$LOGS/junit.xml" --build-seconds "$build_s" \
  --test-seconds "$test_s" --command "scripts/gpu_check.sh${*:+ $*}" --outdir benchmarks/results \
  --copy-to "$LOGS"
exit $test_rc
