#!/usr/bin/env bash
# The arm64 edge build (preset arm64, build-arm64/): configures when needed and builds everything
# that tree holds, which is only what an edge device runs (STARLING_EDGE_ONLY: the edge libraries,
# the client binary once apps/ has it, and the tests of those libraries, which ctest runs under
# qemu-aarch64 -L /). `make test` calls it before ctest. docs/edge-arm64.md explains the set-up.
#
# STARLING_SKIP_ARM64=1 skips it (bootstrap then installs no cross packages). JOBS (default 2).
# Set STARLING_ARM64_TEST=1 to run the arm64 tests under qemu afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
DIR=build-arm64

if [[ "${STARLING_SKIP_ARM64:-0}" == "1" ]]; then
  echo "build-arm64: skipped (STARLING_SKIP_ARM64=1)"
  exit 0
fi
for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-arm64: $tool not found: run scripts/bootstrap.sh (or set STARLING_SKIP_ARM64=1)" >&2
    exit 1
  fi
done

# Configure only for a new tree; later runs let ninja re-run CMake when a CMakeLists.txt changed.
[[ -f $DIR/build.ninja ]] || cmake --preset arm64
cmake --build "$DIR" -j "$JOBS"

client=$DIR/bin/starling-client
if [[ -f $client ]]; then
  tmp=$(mktemp)
  trap 'rm -f "$tmp"' EXIT
  aarch64-linux-gnu-strip -o "$tmp" "$client"
  echo "build-arm64: $client: $(stat -c %s "$client") bytes, stripped $(stat -c %s "$tmp") bytes"
fi

if [[ "${STARLING_ARM64_TEST:-0}" == "1" ]]; then
  ctest --test-dir "$DIR" --output-on-failure -j "$JOBS"
fi
