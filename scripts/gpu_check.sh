#!/usr/bin/env bash
# Build cudalab on a GPU machine, run the whole test suite with
# CUDALAB_REQUIRE_GPU=1 (a skipped GPU test is a failure), and write a JSON
# summary (device, driver/runtime versions, passed/failed counts) to
# benchmarks/results/gpu_check_<device>.json. Also saves `cudalab check` and
# `cudalab ceilings` output there (cli_check_<device>.txt, ceilings_<device>.*).
# Then runs the op, nn and models tests under compute-sanitizer's memcheck
# (scripts/sanitize.sh; more than 5 minutes on an H200; GPU_CHECK_SANITIZE=0
# skips it); the script fails if memcheck reports an error.
# The tier no longer fits one 10-minute call of a lent GPU: CUDALAB_TEST_SHARD=k/n
# runs the k-th of n parts (whole test files; see tests/conftest.py), and
# GPU_CHECK_EARLIER_JUNIT="a.xml b.xml" adds earlier shards' JUnit files to the
# summary, e.g. call 1: CUDALAB_TEST_SHARD=1/2 GPU_CHECK_SANITIZE=0 scripts/gpu_check.sh,
# keep $OUT/junit.xml; call 2: CUDALAB_TEST_SHARD=2/2 GPU_CHECK_EARLIER_JUNIT=shard1.xml ...
#
# Usage: scripts/gpu_check.sh [extra pytest args]
# Needs, in the environment of $PYTHON (checked first, exit 2 when missing):
# scikit-build-core, cmake >= 3.31, numpy, ml_dtypes, the test extra
# (pip install '.[test]' minus the package itself) and the CUDA toolkit.
# Logs go to $OUT when it is set (and to build/gpu_check/ otherwise).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
LOGS=${OUT:-build/gpu_check}
mkdir -p "$LOGS" benchmarks/results
export PYTHONUNBUFFERED=1

echo "== prerequisites"
# The build below runs without build isolation and without dependencies (so
# it uses this environment's packages as they are): say what is missing here
# instead of failing deep inside pip.
"$PYTHON" - <<'PY' || exit 2
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

def version_tuple(text):
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])

def requirements():
    """Build requirements, runtime dependencies and the test extra, from pyproject.toml."""
    if tomllib is None:
        return ["scikit-build-core>=0.10", "numpy>=2", "ml_dtypes>=0.4", "pytest>=7",
                "hypothesis>=6", "psutil>=5"]
    meta = tomllib.loads(Path("pyproject.toml").read_text())
    return (meta["build-system"]["requires"] + meta["project"]["dependencies"]
            + meta["project"]["optional-dependencies"]["test"])

def cmake_version():
    """Version of the cmake scikit-build-core would use (PATH or the cmake wheel)."""
    candidates = [shutil.which("cmake")]
    try:
        import cmake
        candidates.insert(0, os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))
    except ImportError:
        pass
    best = ()
    for exe in filter(None, candidates):
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
        except OSError:
            continue
        best = max(best, version_tuple(out.split("\n")[0]))
    return best

missing = []
for req in dict.fromkeys(requirements()):  # in order, once each
    name, _, minimum = re.match(r"([A-Za-z0-9_.\-]+)\s*(>=\s*([\d.]+))?", req).groups()
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        missing.append(f"{req} (not installed)")
        continue
    if minimum and version_tuple(have) < version_tuple(minimum):
        missing.append(f"{req} (found {have})")
cmake = cmake_version()
if cmake < (3, 31):
    found = ".".join(map(str, cmake)) if cmake else "none"
    missing.append(f"cmake>=3.31 (found {found})")
nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
if not os.access(nvcc, os.X_OK):
    missing.append("the CUDA toolkit (nvcc not on PATH, CUDACXX unset, no /usr/local/cuda)")
if missing:
    print("gpu_check: missing build or test prerequisites:", file=sys.stderr)
    for m in missing:
        print(f"  - {m}", file=sys.stderr)
    pips = [m.split(" ")[0] for m in missing if not m.startswith("the CUDA")]
    if pips:
        print(f"install them with: {sys.executable} -m pip install " +
              " ".join(f"'{p}'" for p in pips), file=sys.stderr)
    sys.exit(1)
print("all present")
PY

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

# Tests that need more GPUs than this machine has skip (CUDALAB_REQUIRE_GPU=1
# alone would fail them); a multi-GPU machine runs them.
export CUDALAB_ALLOW_FEWER_GPUS=${CUDALAB_ALLOW_FEWER_GPUS:-1}
echo "== tests (CUDALAB_REQUIRE_GPU=1, CUDALAB_ALLOW_FEWER_GPUS=$CUDALAB_ALLOW_FEWER_GPUS)"
start=$(date +%s)
# --durations: the slowest tests, for whoever has to make the tier fit a call.
CUDALAB_REQUIRE_GPU=1 "$PYTHON" -m pytest -p no:cacheprovider -q -rfEs --durations=25 \
  --junitxml="$LOGS/junit.xml" "$@" 2>&1 | tee "$LOGS/pytest.log"
test_rc=${PIPESTATUS[0]}
test_s=$(( $(date +%s) - start ))

# With CUDALAB_TEST_SHARD=k/n this call runs one shard; GPU_CHECK_EARLIER_JUNIT names the
# JUnit files of the shards run before (carried over from earlier calls), so the
# last call's summary counts the whole tier.
# shellcheck disable=SC2086
"$PYTHON" scripts/gpu_summary.py --junit "$LOGS/junit.xml" ${GPU_CHECK_EARLIER_JUNIT:-} \
  --build-seconds "$build_s" --test-seconds "$test_s" \
  --command "${CUDALAB_TEST_SHARD:+CUDALAB_TEST_SHARD=$CUDALAB_TEST_SHARD (and the earlier shards) }scripts/gpu_check.sh${*:+ $*}" \
  --outdir benchmarks/results --copy-to "$LOGS"

sanitize_rc=0
if [ "${GPU_CHECK_SANITIZE:-1}" != 0 ]; then
  echo "== memcheck over the op, nn and models tests"
  OUT="$LOGS/sanitize" PYTHON="$PYTHON" scripts/sanitize.sh -t memcheck -p ops,nn,training,models
  sanitize_rc=$?
fi
[ "$test_rc" -ne 0 ] && exit "$test_rc"
exit "$sanitize_rc"
