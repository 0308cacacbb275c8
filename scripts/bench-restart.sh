#!/usr/bin/env bash
# Restart time and memory with N pending jobs (default 1,000,000), and
# the first page of ListJobs by each status over them:
# fills a fresh data dir with `jobq bench --workloads a-batch`, stops the
# server, then times `jobq serve` from exec to its "jobq serving" log line
# (the in-memory indexes are rebuilt from sled before it listens).
#
#   bash scripts/bench-restart.sh [JOBS]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${1:-1000000}"
port=50099
cargo build --release -p jobq-cli >/dev/null
bin=target/release/jobq
data="$(mktemp -d /tmp/jobq-restart-XXXXXX)"
log="$data.log"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$data" "$log"' EXIT

RUST_LOG=info "$bin" serve --listen "127.0.0.1:$port" --data "$data" 2>"$log" &
server=$!
until grep -q "jobq serving" "$log"; do sleep 0.05; done
"$bin" bench --server "http://127.0.0.1:$port" --workloads a-batch --jobs "$jobs" --no-progress | grep -E "^enqueue-batch"
echo "server RSS with $jobs pending, after enqueueing them: $(grep VmRSS /proc/$server/status | awk '{print $2/1024 " MiB"}')"
kill -TERM "$server"; wait "$server" || true

: >"$log"
start=$(date +%s%N)
RUST_LOG=info "$bin" serve --listen "127.0.0.1:$port" --data "$data" 2>"$log" &
server=$!
until grep -q "jobq serving" "$log"; do sleep 0.01; done
end=$(date +%s%N)
echo "restart with $jobs pending: serving after $(( (end - start) / 1000000 )) ms"
echo "server RSS right after the restart: $(grep VmRSS /proc/$server/status | awk '{print $2/1024 " MiB"}')"
# ListJobs by status, first page of 50, over the pending jobs (the time
# includes starting the CLI, a few ms).
for status in pending running failed done; do
  t0=$(date +%s%N)
  "$bin" list --server "http://127.0.0.1:$port" --status "$status" --limit 50 --json >/dev/null
  t1=$(date +%s%N)
  echo "jobq list --status $status --limit 50: $(( (t1 - t0) / 1000000 )) ms"
done
kill -TERM "$server"; wait "$server" || true
