#!/usr/bin/env bash
# The test-only virtual environment of the privacy accountant's oracle (docs/privacy.md):
# Google's dp-accounting from PyPI, OUTSIDE the source tree, at
# ${STARLING_PRIVACY_VENV:-$HOME/.cache/starling/privacy-venv}, made with Debian's Python 3.11 and
# --system-site-packages (Debian's numpy and scipy). Idempotent: a venv that imports the pinned
# version is left as it is.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${STARLING_PRIVACY_VENV:-$HOME/.cache/starling/privacy-venv}
PIN="dp-accounting==0.6.0"
case "$VENV/" in
  "$ROOT/"*) echo "privacy-venv: $VENV is inside the source tree; put it outside" >&2; exit 1 ;;
esac
check="import importlib.metadata as m, sys; sys.exit(m.version('dp-accounting') != '${PIN#*==}')"
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import dp_accounting; $check" 2>/dev/null; then
  echo "privacy-venv: $VENV is up to date ($PIN)"
  exit 0
fi
if ! /usr/bin/python3 -c 'import scipy, numpy' 2>/dev/null; then
  echo "privacy-venv: installing Debian's python3-scipy and python3-venv" >&2
  if [[ $(id -u) -eq 0 ]]; then SUDO=(); else SUDO=(sudo); fi
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends python3-scipy python3-venv
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  mkdir -p "$(dirname "$VENV")"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$PIN"
"$VENV/bin/python" -c "import dp_accounting; $check"
echo "privacy-venv: $VENV has $PIN"
