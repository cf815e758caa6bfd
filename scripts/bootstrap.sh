#!/usr/bin/env bash
# Installs, only when missing, every Debian package Starling needs to build, test and run.
# Idempotent: a second run with everything present touches nothing and exits at once.
# Works as root, or as a user with sudo. Set STARLING_SKIP_BOOTSTRAP=1 to skip it entirely.
# The arm64 edge build (docs/edge-arm64.md) adds the arm64 architecture to dpkg and installs the
# cross toolchain, qemu-user and the `:arm64` -dev packages; set STARLING_SKIP_ARM64=1 to leave
# that part out (`make test` then skips the arm64 build too).
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev clang-format
  # core / protocol / compression
  libeigen3-dev libflatbuffers-dev flatbuffers-compiler zlib1g-dev
  # deployment
  libzmq3-dev cppzmq-dev libsodium-dev
  # operations: the status server's HTTP (civetweb, ops/status_server.h); the HTTP client of its
  # tests and benchmarks (cpp-httplib); its tests read /metrics with Prometheus's own parser and
  # a real Prometheus server, and the status page in a real browser (headless Chromium)
  libcivetweb-dev libcpp-httplib-dev python3-prometheus-client prometheus chromium-headless-shell
  # configuration, command lines, logging
  libtomlplusplus-dev libcli11-dev libspdlog-dev libfmt-dev
  # simulator / split (LibTorch 1.13 CPU, a fast BLAS for it, Gloo for c10d)
  libtorch-dev libopenblas0-pthread libgloo-dev
  # simulator: the client-state store's spill (an embedded key-value store; docs/architecture.md)
  liblmdb-dev
  # tests and benchmarks
  catch2 libbenchmark-dev
  # data
  dataset-fashion-mnist
  # tools/plot_runs.py
  python3-matplotlib
  python3-dev python3-numpy pybind11-dev python3-torch
)

# The arm64 edge build: the cross toolchain, qemu-user to run its programs here, and the arm64 copy
# of every -dev package whose headers, libraries or CMake config differ per architecture (they are
# Multi-Arch: same and install beside the amd64 ones, at the same version). Eigen, CLI11, Catch2
# and flatc are shared with the native build (Multi-Arch: foreign or all; the host flatc runs in a
# cross build; Catch2 2.x is used as headers only, its amd64 libCatch2WithMain.a is never linked).
ARM64_PACKAGES=(
  crossbuild-essential-arm64 qemu-user
  zlib1g-dev:arm64 libflatbuffers-dev:arm64
  libzmq3-dev:arm64 cppzmq-dev:arm64 libsodium-dev:arm64
  libtomlplusplus-dev:arm64 libspdlog-dev:arm64 libfmt-dev:arm64
)

if [[ "${STARLING_SKIP_BOOTSTRAP:-0}" == "1" ]]; then
  exit 0
fi

wanted=("${PACKAGES[@]}")
add_arm64=0
if [[ "${STARLING_SKIP_ARM64:-0}" != "1" ]]; then
  wanted+=("${ARM64_PACKAGES[@]}")
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    add_arm64=1
  fi
fi

# Installed for the right architecture: a plain name means the native one (or an `all` package),
# name:arm64 the arm64 one. With arm64 added, a plain `dpkg-query -W name` lists both copies of a
# Multi-Arch: same package, so the architecture is matched line by line.
native_arch=$(dpkg --print-architecture)
installed() {
  local name=${1%%:*} arch=$native_arch
  [[ "$1" == *:* ]] && arch=${1##*:}
  local lines
  lines=$(dpkg-query -W -f='${Status} ${Architecture}\n' "$name" 2>/dev/null || true)
  grep -qE "^install ok installed ($arch|all)\$" <<<"$lines"
}

missing=()
for p in "${wanted[@]}"; do
  installed "$p" || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 && $add_arm64 -eq 0 ]]; then
  exit 0
fi

echo "bootstrap: installing missing Debian packages: ${missing[*]}"
if [[ $(id -u) -eq 0 ]]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1; then
  SUDO=(sudo)
else
  echo "bootstrap: need root or sudo to install: ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
if [[ $add_arm64 -eq 1 ]]; then
  # A new architecture has no package lists yet: always refresh after adding it.
  echo "bootstrap: adding the arm64 architecture to dpkg (multiarch, for the edge cross build)"
  "${SUDO[@]}" dpkg --add-architecture arm64
  "${SUDO[@]}" apt-get update -q
elif ! apt-cache show "${missing[@]}" >/dev/null 2>&1; then
  # Refresh the package lists only when a package is not known to apt yet.
  "${SUDO[@]}" apt-get update -q
fi
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "bootstrap: done"
