#!/usr/bin/env bash
# The vendored sled, kept honestly: vendor/sled must be pristine sled 0.34.7
# from crates.io plus the patch series in vendor/sled-patches (and JOBQ.md,
# which explains each patch), and sled's own tests must pass on the patched
# tree. CI runs this; so can anyone changing the fork:
#
#   bash scripts/sled-fork.sh            # check, then run sled's tests
#   bash scripts/sled-fork.sh --no-tests # the check alone (seconds)
#
# To change the fork: make the change in vendor/sled, then turn it into a
# patch (apply the series to a pristine copy in a git repository, commit
# the change there, `git format-patch`), and describe it in JOBQ.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
run_tests=1
[[ ${1:-} == --no-tests ]] && run_tests=0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== pristine sled 0.34.7, through cargo's own registry"
# A throwaway package that depends on exactly 0.34.7 makes cargo download
# (and checksum, against the registry index) the published crate.
mkdir -p "$work/fetch/src"
cat >"$work/fetch/Cargo.toml" <<'TOML'
[package]
name = "sled-fetch"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
sled = "=0.34.7"

[workspace]
TOML
: >"$work/fetch/src/lib.rs"
export CARGO_HOME=${CARGO_HOME:-$HOME/.cargo}
(cd "$work/fetch" && cargo fetch --quiet)
# The downloaded archive, not cargo's unpacked copy (which anything may have
# edited since): its SHA-256 must be the registry index's, as the lock file
# cargo just wrote records it.
crate=$(ls "$CARGO_HOME"/registry/cache/*/sled-0.34.7.crate 2>/dev/null | head -n 1)
[[ -n $crate ]] || { echo "no sled-0.34.7.crate under $CARGO_HOME/registry/cache" >&2; exit 1; }
want=$(grep -A3 '^name = "sled"$' "$work/fetch/Cargo.lock" | sed -n 's/^checksum = "\(.*\)"$/\1/p')
got=$(sha256sum "$crate" | cut -d' ' -f1)
[[ -n $want && $got == "$want" ]] || { echo "$crate: SHA-256 $got, the registry says ${want:-nothing}" >&2; exit 1; }
tar -xzf "$crate" -C "$work"
pristine=$work/sled-0.34.7

tree=$work/sled
cp -r "$pristine" "$tree"
chmod -R u+w "$tree"
patches=("$root"/vendor/sled-patches/*.patch)
echo "== applying ${#patches[@]} patches"
for p in "${patches[@]}"; do
  # The last patch trims Cargo.toml for use as a path dependency; sled's
  # tests need the untrimmed one, so they run on the tree before it.
  if [[ $p == "${patches[-1]}" ]]; then
    cp -r "$tree" "$work/sled-tests"
  fi
  patch -d "$tree" -p1 --quiet --forward --no-backup-if-mismatch <"$p" || {
    echo "$(basename "$p") does not apply" >&2
    exit 1
  }
done

echo "== vendor/sled is pristine plus the patches"
extra=$(cd vendor/sled && ls -A | grep -vxE '.rustfmt.toml|Cargo.toml|JOBQ.md|LICENSE-APACHE|LICENSE-MIT|README.md|src' || true)
if [[ -n $extra ]]; then
  echo "vendor/sled holds files the check does not cover: $extra" >&2
  exit 1
fi
for f in .rustfmt.toml Cargo.toml LICENSE-APACHE LICENSE-MIT README.md src; do
  diff -r "$tree/$f" "vendor/sled/$f" >&2 || {
    echo "vendor/sled/$f differs from pristine sled 0.34.7 plus vendor/sled-patches" >&2
    exit 1
  }
done
echo "vendor/sled = sled 0.34.7 + ${#patches[@]} patches"

if ((run_tests)); then
  echo "== sled's own tests of the patched modules (the tree, the log)"
  # `testing` is the feature sled's tests ask for (extra runtime checks,
  # delays that shake out races). test_tree covers node splits and merges
  # (patches 5 and 6), test_log the log buffers and segments (1 and 3); the
  # library's unit tests cover the LRU (4) and the thread pool (2). Two
  # tests take minutes in a debug build and are left to a manual run:
  # the 100-case quickcheck against a BTreeMap (the tree_bug_* cases it
  # once found do run) and a reverse scan of 1 MiB keys.
  (cd "$work/sled-tests" && CARGO_TARGET_DIR="$work/target" \
    cargo test --quiet --features testing --lib --test test_tree --test test_log -- \
    --skip quickcheck_tree_matches_btreemap --skip very_large_reverse_tree_iterator)
fi
