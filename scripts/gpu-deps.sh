#!/usr/bin/env bash
# Prepares, on a Debian 12 machine with its package index, the build dependencies that
# `make gpu-check` needs on a GPU machine that has no Debian packages and no network (the device
# tool's machines: nvcc, NCCL, PyTorch with its LibTorch, CMake and ninja, nothing else).
#
# Downloads the Debian packages (apt-get download: the .deb files only, nothing is installed) and
# unpacks them with dpkg -x into a prefix inside an ignored folder, never into /:
#
#   .gpu-deps/prefix/usr/{include,lib,share,bin}   headers, libraries, CMake packages, flatc
#
#   .gpu-deps/data/                                Fashion-MNIST's four .gz files (30 MB), for the
#                                                  GPU benchmarks, when the Debian package is here
#
# The folder (about 57 MB; the device tool carries 64 MiB in all) travels with the working tree
# when the device tool is told to carry it (carry: [".gpu-deps"]); scripts/gpu-check.sh points
# CMake, pkg-config, the compiler, the linker and the loader at it. A second run with the prefix
# present does nothing (remove .gpu-deps to redo it).
set -euo pipefail
cd "$(dirname "$0")/.."

dest=${STARLING_GPU_DEPS:-.gpu-deps}
if [[ -f "$dest/prefix/.complete" ]]; then
  echo "gpu-deps: $dest/prefix is ready"
  exit 0
fi

# What the build needs besides LibTorch, CUDA and the compiler, as runtime libraries and -dev
# packages: ZeroMQ (with libsodium for CURVE and its own dependencies: PGM, NORM, GSSAPI),
# FlatBuffers (flatc too), Eigen, toml++, CLI11, spdlog and fmt, LMDB, Catch2, Google Benchmark,
# Gloo (c10d's CPU collectives; its own dependencies hiredis and ibverbs), civetweb (the status
# server), cpp-httplib (its tests' HTTP client; with brotli and OpenSSL, which it was built with).
# zlib is in every Linux.
PACKAGES=(
  libzmq3-dev libzmq5 cppzmq-dev libsodium-dev libsodium23 libpgm-5.3-0 libnorm1 libbsd0 libmd0
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1
  libflatbuffers-dev libflatbuffers2 flatbuffers-compiler
  libeigen3-dev libtomlplusplus-dev libtomlplusplus3 libcli11-dev
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  liblmdb-dev liblmdb0 catch2 libbenchmark-dev libbenchmark1debian
  libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200
  zlib1g-dev
  libcivetweb-dev libcivetweb1 libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libbrotli1
  libssl-dev libssl3
)

if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
  echo "gpu-deps: needs apt-get and dpkg (run it on the Debian development machine," \
    "then carry $dest)" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "gpu-deps: downloading ${#PACKAGES[@]} Debian packages"
# apt-get download writes into the current folder; as root it warns that _apt cannot write there.
(cd "$work" &&
   apt-get download -q "${PACKAGES[@]}" 2>&1 | { grep -v "unsandboxed" || true; } >&2) || {
  echo "gpu-deps: apt-get download failed (package index out of date? run apt-get update)" >&2
  exit 1
}
rm -rf "$dest/prefix"
mkdir -p "$dest/prefix"
for deb in "$work"/*.deb; do
  dpkg -x "$deb" "$dest/prefix"
done
# Documentation is not needed to build; keep the folder small.
rm -rf "$dest/prefix/usr/share/doc" "$dest/prefix/usr/share/man" "$dest/prefix/usr/share/lintian"
# Gloo's CMake package names its library by absolute path (/usr/lib/libgloo.so.0.5.0); make it
# relative to the package's own prefix like the other packages' files are.
gloo_cfg="$dest/prefix/usr/share/cmake/Gloo/GlooTargets-relwithdebinfo.cmake"
if [[ -f "$gloo_cfg" ]]; then
  sed -i 's|"/usr/lib/libgloo|"${_IMPORT_PREFIX}/lib/libgloo|g' "$gloo_cfg"
fi
fmnist=/usr/share/datasets/fashion-mnist
if [[ -f "$fmnist/train-images-idx3-ubyte.gz" ]]; then
  mkdir -p "$dest/data"
  cp "$fmnist"/*.gz "$dest/data/"
else
  echo "gpu-deps: no Fashion-MNIST in $fmnist (apt-get install dataset-fashion-mnist):" \
    "the GPU benchmarks will be skipped" >&2
fi
ls "$work"/*.deb | xargs -n1 basename > "$dest/prefix/packages.txt"
touch "$dest/prefix/.complete"
echo "gpu-deps: $(du -sh "$dest" | cut -f1) in $dest" \
  "($(wc -l < "$dest/prefix/packages.txt") packages, and the data when present)"
