#!/usr/bin/env bash
# `make test-asan`: the whole suite once more, built by the `debug` preset (build-debug/: Debug,
# AddressSanitizer + UBSan, -Werror). It catches what the Release build of `make test` hides:
# out-of-bounds reads and writes, use-after-free, leaks, null pointers passed to memcpy, signed
# overflow, bad casts. The preset compiles with -fno-sanitize-recover=all, so a UBSan finding fails
# its test instead of printing a line that a passing ctest run would bury.
#
# Sanitizer settings, for this run only (not exported anywhere else):
# - LeakSanitizer stays on (ASan's default on Linux); it works on the 2-core development VM.
# - protect_shadow_gap=0: on a machine with a GPU the CUDA driver maps memory inside ASan's
#   protected shadow gap and every cudaMalloc fails (google/sanitizers#629); without a GPU it only
#   gives up the check for wild accesses into that gap.
# - tests/cuda/lsan.supp silences LeakSanitizer reports from inside libcuda (the driver keeps
#   allocations for the life of the process). Neither CUDA setting has run on a GPU yet.
# - print_stacktrace=1: UBSan reports the stack that led to the finding.
# - Test binaries that replace the global operator new (allocation counting, fault injection) do
#   it through tests/counting_new.h, which replaces the nothrow forms too, so ASan's
#   alloc-dealloc-mismatch check stays on for every binary.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
DIR=build-debug

export ASAN_OPTIONS=protect_shadow_gap=0
export LSAN_OPTIONS=suppressions=$PWD/tests/cuda/lsan.supp
export UBSAN_OPTIONS=print_stacktrace=1

[[ -f $DIR/build.ninja ]] || cmake --preset debug
cmake --build $DIR -j "$JOBS"
ctest --test-dir "$DIR" --output-on-failure -j "$JOBS"
