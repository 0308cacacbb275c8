#!/usr/bin/env bash
# Stats over PostgreSQL with 1M retained jobs (docs/src/benchmarks.md): a
# server on a fresh database, 1,000,000 DONE jobs and 1,000 PENDING ones in
# 10 queues written straight into jobq_jobs, then Stats (all queues, and
# one queue) and a /metrics scrape, each timed from a client, 20 times.
#
#   scripts/pg-test.sh scripts/bench-pg-stats.sh [JOBQ]
set -euo pipefail
cd "$(dirname "$0")/.."
: "${JOBQ_TEST_PG:?run under scripts/pg-test.sh, or set JOBQ_TEST_PG}"
JOBQ="${1:-${CARGO_TARGET_DIR:-target}/release/jobq}"
base="${JOBQ_TEST_PG%/*}"
name="jobq_stats_$(date +%s%N)"
psql -q "$JOBQ_TEST_PG" -c "CREATE DATABASE $name" >/dev/null
url="$base/$name"
dir="$(mktemp -d)"
"$JOBQ" serve --store "$url" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --stats-cache 0s \
  --data "$dir/d" >"$dir/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  addr="$(grep -o 'addr=[0-9.:]*' "$dir/log" | head -1 | cut -d= -f2 || true)"
  [ -n "$addr" ] && break
  sleep 0.1
done
http="$(grep -o 'http=[0-9.:]*' "$dir/log" | head -1 | cut -d= -f2 || true)"
psql -q "$url" <<'SQL'
INSERT INTO jobq_jobs (id, queue, kind, payload, status, attempts, max_attempts, enqueued_at, run_at, finished_at)
SELECT nextval('jobq_job_ids'), 'q' || (i % 10), 'k', '\x00', 'done', 0, 3, now(), now(), now()
FROM generate_series(1, 1000000) AS i;
INSERT INTO jobq_jobs (id, queue, kind, payload, status, attempts, max_attempts, enqueued_at, run_at)
SELECT nextval('jobq_job_ids'), 'q' || (i % 10), 'k', '\x00', 'pending', 0, 3, now(), now()
FROM generate_series(1, 1000) AS i;
ANALYZE jobq_jobs;
SQL
# The fill's million count deltas are folded within a fraction of a second;
# the vacuum that autovacuum would run next leaves the steady state.
sleep 2
psql -q "$url" -c "VACUUM ANALYZE jobq_count_deltas" 2>/dev/null || true
ms() { local a b; a=$(date +%s%N); "$@" >/dev/null; b=$(date +%s%N); echo $(( (b - a) / 1000 )); }
echo "server $addr, http $http; 1,000,000 DONE + 1,000 PENDING jobs"
for what in all one; do
  times=()
  for _ in $(seq 20); do
    if [ "$what" = all ]; then
      times+=("$(ms "$JOBQ" --server "http://$addr" stats)")
    else
      times+=("$(ms "$JOBQ" --server "http://$addr" stats --queue q3)")
    fi
  done
  echo "jobq stats ($what queues), µs incl. the CLI's start: $(printf '%s\n' "${times[@]}" | sort -n | tr '\n' ' ')"
done
if [ -n "$http" ]; then
  times=()
  for _ in $(seq 20); do times+=("$(ms curl -s "http://$http/metrics")"); done
  echo "GET /metrics, µs incl. curl's start: $(printf '%s\n' "${times[@]}" | sort -n | tr '\n' ' ')"
fi
times=()
for _ in $(seq 20); do times+=("$(ms "$JOBQ" --server "http://$addr" stats --help)"); done
echo "the CLI alone (stats --help), µs: $(printf '%s\n' "${times[@]}" | sort -n | tr '\n' ' ')"
# The server's own time per Stats call (jobq_rpc_duration_seconds), without
# the client's start.
if [ -n "$http" ]; then
  curl -s "http://$http/metrics" | awk '/^jobq_rpc_duration_seconds_(sum|count)\{.*method="Stats"/ {
      if ($1 ~ /_sum/) s += $2; else c += $2 }
    END { if (c) printf "server-side Stats: %d calls, mean %.2f ms\n", c, 1000 * s / c }'
fi
# The database's part, old and new statements side by side on this data.
if psql -qAt "$url" -c "SELECT to_regclass('jobq_counts')" | grep -q jobq_counts; then
  for i in 1 2 3 4 5; do
    psql -qAt "$url" -c '\timing on' \
      -c "SELECT queue, status, count(*), min(run_at) FILTER (WHERE status = 'pending' AND run_at <= now()) FROM jobq_jobs GROUP BY queue, status ORDER BY queue" \
      -c "SELECT queue, status, sum(n)::bigint FROM (SELECT queue, status, n FROM jobq_counts UNION ALL SELECT queue, status, delta FROM jobq_count_deltas) c GROUP BY queue, status HAVING sum(n) <> 0 ORDER BY queue" \
      | grep '^Time' | tr '\n' ' '
    echo "(old GROUP BY, new counts)"
  done
fi
