#!/usr/bin/env bash
# Installs, only when missing, every Debian package Starling needs to build, test and run.
# Idempotent: a second run with everything present touches nothing and exits at once.
# Works as root, or as a user with sudo. Set STARLING_SKIP_BOOTSTRAP=1 to skip it entirely.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev
  # core / protocol / compression
  libeigen3-dev libflatbuffers-dev flatbuffers-compiler zlib1g-dev
  # deployment
  libzmq3-dev cppzmq-dev libsodium-dev
  # configuration, command lines, logging
  libtomlplusplus-dev libcli11-dev libspdlog-dev libfmt-dev
  # simulator / split (LibTorch 1.13 CPU, a fast BLAS for it, Gloo for c10d)
  libtorch-dev libopenblas0-pthread libgloo-dev
  # tests and benchmarks
  catch2 libbenchmark-dev
  # data
  dataset-fashion-mnist
)

if [[ "${STARLING_SKIP_BOOTSTRAP:-0}" == "1" ]]; then
  exit 0
fi

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
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
# Refresh the package lists only when a package is not known to apt yet.
if ! apt-cache show "${missing[@]}" >/dev/null 2>&1; then
  "${SUDO[@]}" apt-get update -q
fi
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "bootstrap: done"
