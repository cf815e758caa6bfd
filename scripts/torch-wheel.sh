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

# A venv records its own path in its scripts (bin/pip's first line names its python), so it is
# made where it ends up, never moved; a marker written last says the install finished. A folder
# without it (an install that was stopped) is removed and made again.
done_marker="$venv/.starling-complete"
same_version="import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')"
if [[ -f "$done_marker" && -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$same_version" 2>/dev/null; then
  prefix
  exit 0
fi
# Made by an earlier version of this script, in "$venv.partial" and then moved: its scripts' first
# lines still name the .partial folder (bin/pip could not run). Point them here, and keep it.
if [[ ! -f "$done_marker" && -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$same_version" 2>/dev/null; then
  for f in "$venv"/bin/*; do
    if [[ -f "$f" && ! -L "$f" ]] && head -c 2 "$f" | grep -q '^#!'; then
      sed -i "1s|^#!$venv.partial/|#!$venv/|" "$f"
    fi
  done
  touch "$done_marker"
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
rm -rf "$venv" "$venv.partial"  # .partial: where earlier versions of this script installed
"$python" -m venv "$venv"
# pip's progress goes to stderr; stdout is kept for the path.
"$venv/bin/pip" install --quiet --disable-pip-version-check "torch==$version" >&2
touch "$done_marker"
prefix
