#!/usr/bin/env bash
# Builds the wheel and shows it stands alone: installed into a fresh virtualenv and run
# from outside the checkout with that venv and the system's tools minus Gradle on PATH
# (no .venv, no source tree), it ships the JVM bridge jar, puts `spark-ps-server` on
# PATH, fits and exports a model, and runs the packaged flights example.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
[ -f spark_ps/jars/spark-ps-bridge.jar ] || { echo "wheel: build the jar first (scripts/setup.sh)"; exit 1; }
.venv/bin/python -m pip wheel --no-deps -q -w "$WORK/dist" .
WHEEL=$(ls "$WORK"/dist/spark_ps-*.whl)
echo "wheel: built $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB)"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q "$WHEEL"
echo "wheel: installed into a fresh venv"
mkdir "$WORK/bin" "$WORK/run"
for dir in /usr/local/bin /usr/bin /bin; do  # the machine's commands, Gradle left out
  for tool in "$dir"/*; do
    name=$(basename "$tool")
    case "$name" in gradle*) continue ;; esac
    [ -e "$WORK/bin/$name" ] || ln -s "$tool" "$WORK/bin/$name"
  done
done
cp scripts/wheel_smoke.py "$WORK/run/"
DATA=${SPARK_PS_DATA:-$ROOT/../shared/data}
cd "$WORK/run"
env -i HOME="$HOME" PATH="$WORK/venv/bin:$WORK/bin" TMPDIR="${TMPDIR:-/tmp}" \
  python wheel_smoke.py "$DATA/flights-3m.parquet"
echo "wheel: ok"
