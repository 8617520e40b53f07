#!/usr/bin/env bash
# Execute every notebook of notebooks/ in place on a GPU machine (nbclient, kernel
# python3), print each one's wall time and the total, and strip volatile metadata.
# Exits 1 if any cell raised (the notebook is still written, up to that cell).
# Needs cudalab installed (or on PYTHONPATH) and the `notebooks` extra's nbclient,
# nbformat, ipykernel and matplotlib; no network.
# Usage: scripts/run_notebooks.sh [--quick] [--timeout SECONDS] [NOTEBOOK ...]
#   --quick      quick parameters (CUDALAB_NOTEBOOK_QUICK=1): seconds per lesson, for tests
#   --timeout S  seconds one cell may run (default 1800)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import nbclient, nbformat, ipykernel, matplotlib" 2>/dev/null; then
  echo "run_notebooks.sh: $PYTHON lacks nbclient, nbformat, ipykernel or matplotlib:" \
       "pip install \".[notebooks]\" (or the four by name)" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1
exec "$PYTHON" scripts/build_notebooks.py --execute "$@"
