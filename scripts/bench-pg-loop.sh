#!/usr/bin/env bash
# jobq on PostgreSQL beside a plain SKIP LOCKED loop, in the same run and
# on the same cluster (docs/src/benchmarks.md, "PostgreSQL beside a plain
# SKIP LOCKED loop"). Run it under a cluster:
#
#   scripts/pg-test.sh scripts/bench-pg-loop.sh [ROUNDS] [OLD_JOBQ]
#
# Each round runs, each on a fresh database: the new binary's loop and
# jobq workloads (A: enqueue on 32 own connections, B: drain with 8
# workers of capacity 1, before and after ANALYZE, C: one producer at
# 1,000/s to one waiting worker), then, with OLD_JOBQ (an older release
# binary), the same jobq workloads through it, so old and new alternate.
# One JSON line per workload on stdout, each with "binary" and "round".
set -euo pipefail
cd "$(dirname "$0")/.."
: "${JOBQ_TEST_PG:?run under scripts/pg-test.sh, or set JOBQ_TEST_PG}"
JOBQ="${JOBQ:-${CARGO_TARGET_DIR:-target}/release/jobq}"
ROUNDS="${1:-3}"
OLD="${2:-}"
[ -x "$JOBQ" ] || { echo "build it first: cargo build --release -p jobq-cli" >&2; exit 1; }

base="${JOBQ_TEST_PG%/*}"
fresh_db() {
  local name="jobq_bench_$(date +%s%N)"
  psql -q "$JOBQ_TEST_PG" -c "CREATE DATABASE $name" >/dev/null
  echo "$base/$name"
}
common=(--no-progress --json --latency-workers 1)
tag() { sed -e "s/^{/{\"binary\":\"$1\",\"round\":$2,/"; }

for round in $(seq "$ROUNDS"); do
  echo "== round $round ($(uptime | sed 's/.*load/load/'))" >&2
  url="$(fresh_db)"
  "$JOBQ" bench "${common[@]}" --pg "$url" \
    --workloads loop-a,a-own,loop-b,b-own-cap1,loop-b-analyzed,b-own-cap1-analyzed,loop-c,c-own \
    | tag new "$round"
  if [ -n "$OLD" ]; then
    url="$(fresh_db)"
    "$OLD" bench "${common[@]}" --serve-arg=--store --serve-arg="$url" \
      --workloads a-own,b-own-cap1,c-own | tag old "$round"
  fi
done
