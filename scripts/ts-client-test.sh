#!/usr/bin/env bash
# The TypeScript client (clients/typescript), against a real `jobq serve`:
# `npm ci` from the committed lock file, the build (which generates the code
# from proto/), `tsc --noEmit` (strict), the `node --test` suite, then
# `npm pack` and the book's example (clients/typescript/examples: a producer
# and a worker) type-checked and run from the tarball installed in a fresh
# temp dir outside the checkout, as a user would.
#
# Needs Node 20 or later with npm, and the npm registry. Without node, it
# installs Debian's nodejs and npm; an older node fails here, loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobq=${JOBQ_BIN:-$root/target/debug/jobq}

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "== installing Debian's nodejs and npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if ((major < 20)); then
  echo "node $(node --version) is too old: the TypeScript client needs Node 20 or later" >&2
  exit 1
fi
echo "== node $(node --version), npm $(npm --version)"
[[ -x "$jobq" ]] || { echo "no server binary at $jobq: run cargo build -p jobq-cli" >&2; exit 1; }

cd clients/typescript
echo "== npm ci"
npm ci --no-audit --no-fund
echo "== npm run build (generates src/gen from proto/)"
npm run build
echo "== tsc --noEmit (strict: the client, the tests, the examples)"
npx tsc --noEmit -p tsconfig.json
echo "== node --test against a real jobq serve"
npx tsc -p tsconfig.json   # the tests, compiled to build/
# The build is done: the test script alone, without its pretest.
JOBQ_BIN="$jobq" npm test --ignore-scripts

echo "== npm pack, installed in a fresh temp dir, runs the book's example"
work=$(mktemp -d)
server_pid=
worker_pid=
cleanup() {
  local pid
  for pid in $worker_pid $server_pid; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
tarball=$(npm pack --silent --pack-destination "$work" | tail -1)
# The example's type-check uses the client's own pinned compiler and Node types.
ts=$(node -p 'require("./package.json").devDependencies.typescript')
types=$(node -p 'require("./package.json").devDependencies["@types/node"]')
cp examples/producer.ts examples/worker.ts "$work/"
cd "$work"
tar -tzf "$tarball" >contents.txt
grep -qx 'package/dist/gen/jobq/v1/jobq_pb.js' contents.txt || { echo "the tarball lacks the generated code:" >&2; cat contents.txt >&2; exit 1; }
cat >package.json <<'JSON'
{ "name": "jobq-example", "private": true, "type": "module" }
JSON
cat >tsconfig.json <<'JSON'
{ "compilerOptions": { "target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext",
    "strict": true, "types": ["node"], "outDir": "out" }, "include": ["*.ts"] }
JSON
npm install --no-audit --no-fund "./$tarball" "typescript@$ts" "@types/node@$types" >/dev/null
npx tsc -p tsconfig.json

"$jobq" serve --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data "$work/data" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 300); do
  grep -q 'jobq serving addr=' "$work/server.log" && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
addr=$(grep -o 'jobq serving addr=[^ ]*' "$work/server.log" | head -1 | cut -d= -f2)
[[ -n "$addr" ]] || { echo "jobq serve did not start:" >&2; cat "$work/server.log" >&2; exit 1; }
export JOBQ_SERVER="http://$addr" MAILBOX="$work/mailbox.txt"

node out/producer.js | tee producer.out
node out/producer.js | tee -a producer.out
grep -q 'created' producer.out && grep -q 'already there' producer.out

node out/worker.js >worker.out 2>&1 &
worker_pid=$!
for _ in $(seq 300); do
  grep -q 'sent order-4711' worker.out && break
  kill -0 "$worker_pid" 2>/dev/null || break
  sleep 0.1
done
grep -q 'sent order-4711 (attempt 1)' worker.out || { echo "the example worker sent nothing:" >&2; cat worker.out >&2; exit 1; }
kill -TERM "$worker_pid"
wait "$worker_pid" || { echo "the example worker did not exit 0 after SIGTERM:" >&2; cat worker.out >&2; exit 1; }
worker_pid=
cat worker.out
[[ "$(cat "$MAILBOX")" == "order-4711" ]] || { echo "mailbox: $(cat "$MAILBOX")" >&2; exit 1; }
echo "== the example from the tarball: one job, one email, drained on SIGTERM"
