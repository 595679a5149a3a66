#!/usr/bin/env bash
# Build the JVM bridge (jvm_bridge/ -> spark_ps/jars/spark-ps-bridge.jar).
#
# Installs Gradle from Debian if it is missing (non-interactive; needs root or sudo), then
# builds offline against the jars of the pyspark that `${PYTHON:-python3}` imports.
# Extra arguments go to gradle, e.g. scripts/build_jar.sh -PsparkJars=/opt/spark/jars
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if ! command -v gradle >/dev/null 2>&1; then
    echo "build_jar.sh: gradle not found; installing it with apt-get" >&2
    SUDO=""
    if [ "$(id -u)" != "0" ]; then
        SUDO="sudo -n"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends gradle >/dev/null
fi

# Gradle 4.4 refuses to run from an unwritable or shared home on some setups; keep its
# cache in the repo's ignored .gradle/ unless the caller chose one.
export GRADLE_USER_HOME="${GRADLE_USER_HOME:-$ROOT/.gradle}"

gradle --offline --no-daemon --quiet jar "$@"

mkdir -p spark_ps/jars
cp jvm_bridge/build/libs/spark-ps-bridge.jar spark_ps/jars/spark-ps-bridge.jar
echo "built $ROOT/spark_ps/jars/spark-ps-bridge.jar"
