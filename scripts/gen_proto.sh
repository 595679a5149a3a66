#!/usr/bin/env bash
# Regenerates the committed gRPC stubs from ps_server/proto/ps.proto.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. ps_server/proto/ps.proto
