#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster, exports JOBQ_TEST_PG for it, runs
# the given command, and stops the cluster (and removes it) at the end.
#
#   scripts/pg-test.sh cargo test --workspace
#   scripts/pg-test.sh bash          # a shell with JOBQ_TEST_PG set
#
# initdb refuses to run as root: as root, the cluster runs as the user
# `jobq-pg` (created if missing). Installs Debian's `postgresql` package
# when no PostgreSQL binaries are found and we are root. Set PG_PORT to
# choose the port (default: a free one).
set -euo pipefail

find_bin() {
  local dir
  if command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
    dirname "$(command -v pg_ctl)"; return
  fi
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$dir/pg_ctl" ] && [ -x "$dir/initdb" ]; then echo "$dir"; return; fi
  done
}

PGBIN="$(find_bin || true)"
if [ -z "$PGBIN" ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "== installing PostgreSQL (apt-get install postgresql)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq postgresql >/dev/null
    PGBIN="$(find_bin)"
  else
    echo "no PostgreSQL binaries found: install Debian's 'postgresql' package (or put pg_ctl/initdb on PATH)" >&2
    exit 1
  fi
fi

RUN_AS=()
OWNER="$(id -un)"
if [ "$(id -u)" = 0 ]; then
  OWNER=jobq-pg
  id "$OWNER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$OWNER"
  RUN_AS=(runuser -u "$OWNER" --)
fi

PGDIR="$(mktemp -d /tmp/jobq-pg.XXXXXX)"
chmod 755 "$PGDIR"
[ "$OWNER" != "$(id -un)" ] && chown "$OWNER" "$PGDIR"
PORT="${PG_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 55432)}"

# The cluster's user may not be able to read the caller's directory.
as_owner() { (cd "$PGDIR" && "${RUN_AS[@]}" "$@"); }

stop() {
  as_owner "$PGBIN/pg_ctl" -D "$PGDIR/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$PGDIR"
}
trap stop EXIT

as_owner "$PGBIN/initdb" -D "$PGDIR/data" -U jobq --auth=trust --no-sync -E UTF8 >"$PGDIR/initdb.log" 2>&1 \
  || { cat "$PGDIR/initdb.log" >&2; exit 1; }
# Many test databases and three servers per e2e test: room for connections.
# fsync stays on: durability is part of what the tests check.
as_owner "$PGBIN/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/server.log" -w -t 60 \
  -o "-p $PORT -k $PGDIR -c listen_addresses=127.0.0.1 -c max_connections=400 -c shared_buffers=128MB" start >/dev/null \
  || { cat "$PGDIR/server.log" >&2; exit 1; }

export JOBQ_TEST_PG="postgres://jobq@127.0.0.1:$PORT/postgres"
# For tests that run a cluster of their own (the fault suite restarts its
# PostgreSQL, which must not cut off the other tests): where the binaries
# are, and which user runs a cluster.
export JOBQ_TEST_PG_BIN="$PGBIN" JOBQ_TEST_PG_OWNER="$OWNER"
echo "== PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') at $JOBQ_TEST_PG (data in $PGDIR)" >&2
if [ "$#" -eq 0 ]; then
  set -- bash
fi
"$@"
