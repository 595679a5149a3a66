#!/usr/bin/env bash
# Sets everything up and runs the whole test suite: the fast tests, then the slow
# fault-injection tests (marked `slow`) as a separate step. Any failure, or a run
# that collects no test (pytest exit 5), fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SPARK_HOME="$PWD/.spark_home" PYSPARK_PYTHON="$PWD/.venv/bin/python"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The docs: the HTML site with warnings as errors, and the user guide's examples as doctests.
bash scripts/docs.sh
.venv/bin/python -m pytest -q -m "not slow" --durations=15 "$@"
# The compiled kernels built for a baseline x86-64 CPU (no AVX/FMA): results that GBT and
# the solvers' vector combinations promise bit for bit must not depend on the CPU's features.
NUMBA_CPU_NAME=generic NUMBA_CACHE_DIR="$(mktemp -d)" .venv/bin/python -m pytest -q \
  tests/test_tree_kernels.py tests/test_split_kernel.py tests/test_gbt_fit.py \
  tests/test_linalg_kernel.py "$@"
# The wheel, installed alone into a fresh venv (no Gradle, no checkout), fits and exports.
bash scripts/wheel_check.sh
.venv/bin/python -m pytest -q -m slow --durations=25 "$@"
# what the tests leave for a person to look at (the status page's screenshot, ...)
echo "test.sh: CI artefacts in $PWD/ci-artifacts/: $(ls ci-artifacts 2>/dev/null | tr '\n' ' ')"
