#!/usr/bin/env bash
# jobq bench over PostgreSQL: one spawned server, then three servers over one
# database, next to sled on the same machine. Run it under a cluster:
#
#   scripts/pg-test.sh scripts/bench-pg.sh [extra jobq bench flags]
#
# Uses JOBQ_TEST_PG (any database the user may CREATE DATABASE from) and the
# release binary (cargo build --release -p jobq-cli).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${JOBQ_TEST_PG:?run under scripts/pg-test.sh, or set JOBQ_TEST_PG}"
JOBQ="${JOBQ:-${CARGO_TARGET_DIR:-target}/release/jobq}"
[ -x "$JOBQ" ] || { echo "build it first: cargo build --release -p jobq-cli" >&2; exit 1; }

base="${JOBQ_TEST_PG%/*}"
fresh_db() {
  local name="jobq_bench_$(date +%s%N)"
  psql -q "$JOBQ_TEST_PG" -c "CREATE DATABASE $name" >/dev/null
  echo "$base/$name"
}

echo "== sled (one server)"
"$JOBQ" bench --no-progress "$@"

echo "== PostgreSQL, one server"
url="$(fresh_db)"
"$JOBQ" bench --no-progress --serve-arg=--store --serve-arg="$url" "$@"

echo "== PostgreSQL, one server, --pg-group-commit 1 (no group commit)"
url="$(fresh_db)"
"$JOBQ" bench --no-progress --serve-arg=--store --serve-arg="$url" --serve-arg=--pg-group-commit --serve-arg=1 "$@"

echo "== PostgreSQL, three servers over one database"
url="$(fresh_db)"
"$JOBQ" migrate --store "$url" >/dev/null
pids=()
urls=()
logdir="$(mktemp -d)"
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$logdir"' EXIT
for i in 1 2 3; do
  "$JOBQ" serve --store "$url" --listen 127.0.0.1:0 --http-listen off --data "$logdir/d$i" \
    >"$logdir/s$i.log" 2>&1 &
  pids+=("$!")
done
for i in 1 2 3; do
  for _ in $(seq 100); do
    addr="$(grep -o 'addr=[0-9.:]*' "$logdir/s$i.log" | head -1 | cut -d= -f2 || true)"
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || { cat "$logdir/s$i.log" >&2; exit 1; }
  urls+=("http://$addr")
done
"$JOBQ" bench --no-progress --server "$(IFS=,; echo "${urls[*]}")" "$@"
