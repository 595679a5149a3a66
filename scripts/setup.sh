#!/usr/bin/env bash
# Sets everything up on a fresh machine: a virtualenv with spark-ps and its test
# dependencies, a SPARK_HOME of symlinks, and the JVM bridge jar (when Gradle can
# be installed). Safe to run again: it only does what is missing. One line per step;
# each step's own output goes to .setup.log, which is printed when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG="$PWD/.setup.log"
: >"$LOG"

step() { # step NAME COMMAND...: run COMMAND quietly; on failure show its output and stop
  local name=$1
  shift
  echo "== $name" >>"$LOG"
  if "$@" >>"$LOG" 2>&1; then
    echo "setup: $name ok"
  else
    echo "setup: $name FAILED; its output (from $LOG):" >&2
    sed -n "/^== $name\$/,\$p" "$LOG" | tail -n 60 >&2
    exit 1
  fi
}

if [ ! -x .venv/bin/python ]; then
  step "virtualenv (.venv)" "$PY" -m venv .venv
fi
step "pip" .venv/bin/python -m pip install -q --upgrade pip
step "spark-ps and its test, bench and docs dependencies" \
  .venv/bin/python -m pip install -q -e '.[test,bench,docs]'

spark_home() { # local-cluster executors write work dirs under SPARK_HOME: a home of its own
  local pyspark_dir
  pyspark_dir=$(.venv/bin/python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))') \
    || return 1
  mkdir -p .spark_home || return 1
  for d in bin jars sbin python; do
    [ -e ".spark_home/$d" ] || ln -s "$pyspark_dir/$d" ".spark_home/$d" || return 1
  done
}
step "SPARK_HOME (.spark_home)" spark_home

# Headless Chromium for the status page's browser test (tests/test_status_page_browser.py,
# which is skipped without /usr/bin/chromium): from Debian when apt-get can be used.
chromium() {
  local sudo=""
  [ "$(id -u)" = "0" ] || sudo="sudo -n"
  command -v apt-get >/dev/null 2>&1 && { [ -z "$sudo" ] || $sudo true; } \
    && DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium fonts-dejavu-core
}
if [ ! -x /usr/bin/chromium ]; then
  if chromium >>"$LOG" 2>&1; then
    echo "setup: chromium ok (apt-get)"
  else
    echo "setup: chromium not installed (no apt-get or no root): the browser test will skip"
  fi
fi

# The bridge is built against the venv's pyspark (the system python has none on a fresh
# machine); a failed build fails the set-up rather than leaving the jar silently missing.
step "JVM bridge jar" env PYTHON="$PWD/.venv/bin/python" bash scripts/build_jar.sh
echo "setup: ready (.venv, .spark_home; the steps' output is in .setup.log)"
