#!/usr/bin/env bash
# Builds the docs into docs/_build: the HTML site with warnings as errors (-W --keep-going
# reports them all, -n also fails on a cross-reference with no target), then the doctest
# builder, which runs the user guide's examples on a local Spark and an embedded PS.
# Needs the 'docs' extra (scripts/setup.sh installs it) and SPARK_HOME.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
export SPARK_HOME="${SPARK_HOME:-$PWD/.spark_home}" PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PY}"
start=$SECONDS
# -E reads every page afresh; the doctest builder then reuses the doctrees just read
"$PY" -m sphinx -E -q -W --keep-going -n -d docs/_build/doctrees -b html docs docs/_build/html
"$PY" -m sphinx -q -W --keep-going -n -d docs/_build/doctrees -b doctest docs docs/_build/doctest
echo "docs: html and doctests built in $((SECONDS - start)) s (docs/_build/html)"
