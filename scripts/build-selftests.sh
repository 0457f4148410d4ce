#!/usr/bin/env bash
# Builds the Linux kernel's own UDP GSO benchmark sender, udpgso_bench_tx
# (tools/testing/selftests/net), from Debian's linux-source package, so the lab can
# measure netlane's sender against it on the same path. Nothing of it is committed:
# the source comes from the package at build time.
#
#   scripts/build-selftests.sh [OUTDIR]     (default: target/kselftest)
set -euo pipefail
out=${1:-target/kselftest}
src=$(ls /usr/src/linux-source-*.tar.xz 2>/dev/null | sort -V | tail -n 1 || true)
if [[ -z "$src" ]]; then
  echo "build-selftests: no /usr/src/linux-source-*.tar.xz; install it with scripts/setup.sh --lab" >&2
  exit 1
fi
bin="$out/udpgso_bench_tx"
if [[ -x "$bin" && "$bin" -nt "$src" ]]; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
top=$(basename "$src" .tar.xz)
echo "build-selftests: extracting udpgso_bench_tx.c from $src"
tar -xJf "$src" -C "$tmp" \
  "$top/tools/testing/selftests/net/udpgso_bench_tx.c" \
  "$top/tools/testing/selftests/kselftest.h"
mkdir -p "$out"
# -O2 as the selftests' own Makefile builds it.
gcc -O2 -Wall -o "$bin" "$tmp/$top/tools/testing/selftests/net/udpgso_bench_tx.c"
echo "build-selftests: built $bin"
