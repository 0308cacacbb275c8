#!/usr/bin/env bash
# Restart time and memory with N pending jobs (default 1,000,000), and
# the first page of ListJobs by each status over them:
# fills a fresh data dir with `jobq bench --workloads a-batch`, stops the
# server, then times `jobq serve` from exec to its "jobq serving" log line
# (the in-memory indexes are ready before it listens), twice:
# - after a clean stop (SIGTERM), which saves the indexes (`index.saved`);
# - after a crash (SIGKILL), which leaves none: every record is read.
# RSS is printed right after "jobq serving" and 5 s later (settled).
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

rss() { awk '/VmRSS/ { printf "%d MiB", $2 / 1024 }' "/proc/$1/status"; }

RUST_LOG=info "$bin" serve --listen "127.0.0.1:$port" --data "$data" 2>"$log" &
server=$!
until grep -q "jobq serving" "$log"; do sleep 0.05; done
"$bin" bench --server "http://127.0.0.1:$port" --workloads a-batch --jobs "$jobs" --no-progress | grep -E "^enqueue-batch"
echo "server RSS with $jobs pending, after enqueueing them: $(rss $server)"

# Starts the server, prints how long it took to serve and its RSS.
restart() {
  : >"$log"
  local start end
  start=$(date +%s%N)
  RUST_LOG=info "$bin" serve --listen "127.0.0.1:$port" --data "$data" 2>"$log" &
  server=$!
  until grep -q "jobq serving" "$log"; do sleep 0.01; done
  end=$(date +%s%N)
  local now
  now=$(rss $server)
  sleep 5
  echo "restart after $1 with $jobs pending: serving after $(( (end - start) / 1000000 )) ms" \
    "($(grep -o 'from=[A-Za-z]*' "$log")); RSS $now at once, $(rss $server) 5 s later"
}

kill -TERM "$server"; wait "$server" || true
restart "a clean stop"
# ListJobs by status, by queue, by both and by key, first page of 50, over
# the pending jobs (the time includes starting the CLI, a few ms). The
# `idle` queue and the key have no jobs: a listing that scanned records
# would read all of them to find that out.
list() {
  local t0 t1
  t0=$(date +%s%N)
  "$bin" list --server "http://127.0.0.1:$port" "$@" --limit 50 --json >/dev/null
  t1=$(date +%s%N)
  echo "jobq list $* --limit 50: $(( (t1 - t0) / 1000000 )) ms"
}
for status in pending running failed done; do
  list --status "$status"
done
list --queue idle
list --queue idle --status pending
list --key order-4711
kill -KILL "$server"; wait "$server" || true
restart "a crash"
kill -TERM "$server"; wait "$server" || true
