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
.venv/bin/python -m pytest -q -m "not slow" "$@"
.venv/bin/python -m pytest -q -m slow "$@"
