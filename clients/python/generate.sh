#!/usr/bin/env bash
# Generates the Python gRPC stubs for jobq from proto/jobq/v1/jobq.proto.
#
# Output: clients/python/jobq/v1/jobq_pb2.py, jobq_pb2.pyi, jobq_pb2_grpc.py
# (git-ignored; run this after every proto change). Needs grpcio-tools in the
# Python it runs with: set PYTHON=/path/to/venv/bin/python, or have `python3`
# be one that has it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"

rm -rf "$here/jobq/v1"
# `python -m grpc_tools.protoc` adds the bundled google/protobuf/*.proto
# (Timestamp, Duration) to the include path by itself.
"$python" -m grpc_tools.protoc \
  -I "$root/proto" \
  --python_out="$here" \
  --pyi_out="$here" \
  --grpc_python_out="$here" \
  "$root/proto/jobq/v1/jobq.proto"
touch "$here/jobq/v1/__init__.py"
echo "generated: $(cd "$here" && ls jobq/v1/*.py* | tr '\n' ' ')"
