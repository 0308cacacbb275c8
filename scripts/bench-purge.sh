#!/usr/bin/env bash
# Takes during a retention purge of N DONE jobs (default 1,000,000): fills
# a data dir by draining N jobs (`jobq bench --workloads b`), then runs the
# latency workload (C: enqueue -> delivered at 1,000/s) twice, once on a
# plain restart and once on a restart with `--retain-done 1s`, whose purge
# starts at startup and runs while C does.
#
#   bash scripts/bench-purge.sh [JOBS]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${1:-1000000}"
port=50098
url="http://127.0.0.1:$port"
cargo build --release -p jobq-cli >/dev/null
bin=target/release/jobq
data="$(mktemp -d /tmp/jobq-purge-XXXXXX)"
log="$data.log"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$data" "$log"' EXIT
serve() {
  : >"$log"
  "$bin" serve --listen "127.0.0.1:$port" --data "$data" --http-listen off "$@" 2>"$log" &
  server=$!
  until grep -q "jobq serving" "$log"; do sleep 0.05; done
}
latency() {
  "$bin" bench --server "$url" --workloads c --latency-jobs 10000 --no-progress |
    grep -E "^latency|enqueue_rpc|enqueue_to"
}
serve
"$bin" bench --server "$url" --workloads b --jobs "$jobs" --no-progress | grep -E "^drain"
kill -TERM "$server"; wait "$server" || true
echo "== latency, no purge running"
serve
latency
kill -TERM "$server"; wait "$server" || true
echo "== latency while the purge of $jobs DONE jobs runs (--retain-done 1s)"
serve --retain-done 1s
latency
"$bin" stats --server "$url" | awk -v q="drain" 'NR == 1 || $1 ~ q'
kill -TERM "$server"; wait "$server" || true
