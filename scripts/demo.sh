#!/usr/bin/env bash
# Sets everything up and runs the main job: logistic regression on 3M real US flights
# (label: delayed > 15 min, hashed crossed features) trained on an embedded PS.
# The data comes from $SPARK_PS_DATA, ../shared/data, or else the npm package
# vega-datasets@3.2.1 (fetched once into .data/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SPARK_HOME="$PWD/.spark_home" PYSPARK_PYTHON="$PWD/.venv/bin/python"
if [ -z "${SPARK_PS_DATA:-}" ] && [ ! -f ../shared/data/flights-3m.parquet ]; then
  if [ ! -f .data/flights-3m.parquet ]; then
    mkdir -p .data
    (cd .data && npm pack --silent vega-datasets@3.2.1 >/dev/null \
      && tar -xzf vega-datasets-3.2.1.tgz package/data/flights-3m.parquet \
      && mv package/data/flights-3m.parquet . && rm -rf package vega-datasets-3.2.1.tgz)
  fi
  export SPARK_PS_DATA="$PWD/.data"
fi
exec .venv/bin/python examples/flights_lr.py "$@"
