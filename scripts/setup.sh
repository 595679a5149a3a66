#!/usr/bin/env bash
# Sets everything up on a fresh machine: a virtualenv with spark-ps and its test
# dependencies, a SPARK_HOME of symlinks, and the JVM bridge jar (when Gradle can
# be installed). Safe to run again: it only does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test,bench,docs]'
# local-cluster executors write work dirs under SPARK_HOME: give Spark a home of its own
PYSPARK_DIR=$(.venv/bin/python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
mkdir -p .spark_home
for d in bin jars sbin python; do
  [ -e ".spark_home/$d" ] || ln -s "$PYSPARK_DIR/$d" ".spark_home/$d"
done
# Headless Chromium for the status page's browser test (tests/test_status_page_browser.py,
# which is skipped without /usr/bin/chromium): from Debian when apt-get can be used.
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""
  [ "$(id -u)" = "0" ] || SUDO="sudo -n"
  if command -v apt-get >/dev/null 2>&1 && { [ -z "$SUDO" ] || $SUDO true 2>/dev/null; } \
    && DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium fonts-dejavu-core \
      >/dev/null; then
    echo "setup: chromium installed (apt-get)"
  else
    echo "setup: chromium not installed (no apt-get or no root): the browser test will skip"
  fi
fi
# The bridge is built against the venv's pyspark (the system python has none on a fresh
# machine); a failed build fails the set-up rather than leaving the jar silently missing.
PYTHON="$PWD/.venv/bin/python" bash scripts/build_jar.sh
echo "setup: ready (.venv, .spark_home)"
