#!/usr/bin/env bash
# `make build-torch2` / `make test-torch2`: everything in the project that compiles or links against
# LibTorch or the CUDA module, against a PyTorch wheel's CUDA LibTorch (scripts/torch-wheel.sh), in
# build-torch2/; with `--test` the LibTorch-dependent tests (ctest labels torch and gpu; the GPU ones
# report Skipped without a GPU). The target starling-torch-dependent (CMakeLists.txt) names those
# targets: the libraries and programs that link LibTorch, the CUDA module or one of those
# libraries, and the tests that run such programs (about two thirds of the compiles: 118 of 181).
# The rest never sees LibTorch, and `make test` builds it. `--all` builds every target instead.
# Fails, rather than building against Debian's LibTorch, when the wheel could not be installed or
# its LibTorch has no CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TORCH2_BUILD_DIR:-build-torch2}
jobs=${JOBS:-2}

prefix=$(bash scripts/torch-wheel.sh | tail -1)
if [[ ! -f "$prefix/Torch/TorchConfig.cmake" ]]; then
  echo "build-torch2: scripts/torch-wheel.sh gave no LibTorch ('$prefix')" >&2
  exit 1
fi
# A folder made against another LibTorch starts over (its cache holds that LibTorch's libraries).
if [[ -f "$build/CMakeCache.txt" ]] &&
    ! grep -qxF "Torch_DIR:PATH=$prefix/Torch" "$build/CMakeCache.txt"; then
  echo "build-torch2: $build was configured against another LibTorch; starting it over" >&2
  rm -rf "$build"
fi
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
else
  cmake "$build" > /dev/null  # picks up CMakeLists.txt changes before the cache is read below
fi
if ! grep -qxF "STARLING_TORCH_CUDA_CACHED:INTERNAL=ON" "$build/CMakeCache.txt"; then
  echo "build-torch2: $build was not configured against a CUDA LibTorch" \
    "(see its CMakeCache.txt)" >&2
  exit 1
fi
target=starling-torch-dependent
for a in "$@"; do [[ "$a" == --all ]] && target=all; done
cmake --build "$build" -j "$jobs" --target "$target"
if [[ " $* " == *" --test "* ]]; then
  # The Release run checked the examples on the full data; here they train on small stand-ins
  # (tests/simulator/sim_run_test.cc).
  STARLING_TEST_SMALL_DATA=1 ctest --test-dir "$build" --output-on-failure -j "$jobs" -L 'torch|gpu'
fi
