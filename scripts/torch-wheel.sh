#!/usr/bin/env bash
# Installs a current CUDA-enabled PyTorch from PyPI into a virtual environment in a cache folder
# outside the source tree, and prints the folder CMake finds its LibTorch in (the wheel's
# torch.utils.cmake_prefix_path). Nothing is vendored: the wheel comes from PyPI, once; a second
# run finds it installed and only prints the path.
#
#   scripts/torch-wheel.sh            install if needed, print the CMake prefix path (last line)
#   cmake -S . -B build-torch2 -DCMAKE_PREFIX_PATH="$(scripts/torch-wheel.sh | tail -1)"
#
# STARLING_TORCH_VERSION  the PyTorch release (default below: a CUDA 13 build, the toolkit this
#                         machine's nvcc is, so its headers and NCCL match the wheel's)
# STARLING_CACHE          the cache folder (default ${XDG_CACHE_HOME:-$HOME/.cache}/starling)
# STARLING_PYTHON         the interpreter the environment is made from (default: python3 on PATH)
#
# The wheel's LibTorch is built with the C++11 ABI (PyTorch >= 2.7), like Debian's libraries, so
# the whole project links against it. It runs without a GPU: torch::cuda::is_available() is false.
set -euo pipefail

version=${STARLING_TORCH_VERSION:-2.15.0}
cache=${STARLING_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/starling}
python=${STARLING_PYTHON:-python3}
venv="$cache/torch-$version"

prefix() {
  "$venv/bin/python" -W ignore -c 'import torch.utils; print(torch.utils.cmake_prefix_path)'
}

same_version="import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')"
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$same_version" 2>/dev/null; then
  prefix
  exit 0
fi

if ! command -v "$python" >/dev/null 2>&1; then
  echo "torch-wheel: no $python on PATH (set STARLING_PYTHON to a Python >= 3.10 with venv)" >&2
  exit 1
fi
mkdir -p "$cache"
echo "torch-wheel: installing torch==$version from PyPI into $venv" \
  "(about 5 GB with its CUDA libraries)" >&2
rm -rf "$venv.partial"
"$python" -m venv "$venv.partial"
# pip's progress goes to stderr; stdout is kept for the path.
"$venv.partial/bin/pip" install --quiet --disable-pip-version-check "torch==$version" >&2
# A venv records its own path in its scripts, so it is created where it ends up: recreate the
# scripts after the move (the site-packages, where torch lives, moves as it is).
mv "$venv.partial" "$venv"
"$python" -m venv --upgrade "$venv" >&2
prefix
