#!/usr/bin/env bash
# Sets everything up and runs the main job: logistic regression on 3M real US flights
# (label: delayed > 15 min, hashed crossed features) trained on an embedded PS.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SPARK_HOME="$PWD/.spark_home" PYSPARK_PYTHON="$PWD/.venv/bin/python"
exec .venv/bin/python examples/flights_lr.py "$@"
