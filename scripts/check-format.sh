#!/usr/bin/env bash
# `make check-format`: every C++ and CUDA file git tracks is as clang-format (.clang-format, the
# Debian 12 clang-format 14 that scripts/bootstrap.sh installs) writes it. Lists the files that are
# not, with the command that mends them, and exits 1; exits 0 when every file is clean. .ci/run
# runs it. `scripts/check-format.sh --fix` formats them in place instead.
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=${CLANG_FORMAT:-clang-format}
command -v "$fmt" >/dev/null || { echo "check-format: $fmt not found (scripts/bootstrap.sh installs it)" >&2; exit 2; }
# Another major version writes another style: checking (or --fix) with it would list, or rewrite,
# the whole tree.
version=$("$fmt" --version 2>&1 | head -n 1)
[[ $version =~ version\ 14\. ]] || { echo "check-format: $fmt is '$version'; the tree is written by clang-format 14 (Debian 12's; scripts/bootstrap.sh installs it, CLANG_FORMAT names another binary)" >&2; exit 2; }
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' '*.cpp' '*.hpp')
if [[ ${1:-} == --fix ]]; then
  "$fmt" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$fmt" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check-format: ${#bad[@]} of ${#files[@]} files are not as $fmt writes them:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "mend them with: scripts/check-format.sh --fix" >&2
  exit 1
fi
echo "check-format: all ${#files[@]} files clean ($("$fmt" --version | head -n 1))"
