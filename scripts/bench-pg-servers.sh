#!/usr/bin/env bash
# One server against three over one PostgreSQL database, in alternating
# rounds (docs/src/benchmarks.md): A (enqueue, 32 own connections) and B
# (drain, 8 workers of capacity 1), the bench's connections spread
# round-robin over the servers. Run it under a cluster:
#
#   scripts/pg-test.sh scripts/bench-pg-servers.sh [ROUNDS] [JOBQ]
set -euo pipefail
cd "$(dirname "$0")/.."
: "${JOBQ_TEST_PG:?run under scripts/pg-test.sh, or set JOBQ_TEST_PG}"
ROUNDS="${1:-2}"
JOBQ="${2:-${CARGO_TARGET_DIR:-target}/release/jobq}"
base="${JOBQ_TEST_PG%/*}"
logdir="$(mktemp -d)"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$logdir"' EXIT

run() {
  local n="$1" round="$2" name url urls=()
  name="jobq_servers_$(date +%s%N)"
  psql -q "$JOBQ_TEST_PG" -c "CREATE DATABASE $name" >/dev/null
  url="$base/$name"
  "$JOBQ" migrate --store "$url" >/dev/null
  pids=()
  for i in $(seq "$n"); do
    "$JOBQ" serve --store "$url" --listen 127.0.0.1:0 --http-listen off --data "$logdir/d$round-$n-$i" \
      >"$logdir/s$i.log" 2>&1 &
    pids+=("$!")
  done
  for i in $(seq "$n"); do
    local addr=""
    for _ in $(seq 100); do
      addr="$(grep -o 'addr=[0-9.:]*' "$logdir/s$i.log" | head -1 | cut -d= -f2 || true)"
      [ -n "$addr" ] && break
      sleep 0.1
    done
    [ -n "$addr" ] || { cat "$logdir/s$i.log" >&2; exit 1; }
    urls+=("http://$addr")
  done
  "$JOBQ" bench --no-progress --json --server "$(IFS=,; echo "${urls[*]}")" \
    --workloads a-own,b-own-cap1 | sed -e "s/^{/{\"servers\":$n,\"round\":$round,/"
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
  echo "== round $round ($(uptime | sed 's/.*load/load/'))" >&2
  run 1 "$round"
  run 3 "$round"
done
