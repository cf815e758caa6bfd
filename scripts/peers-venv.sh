#!/usr/bin/env bash
# The virtual environment of bench/peers/ (docs/peers.md): Flower (flwr[simulation], with Ray), pfl
# and psutil at the versions pinned in bench/peers/requirements.txt, OUTSIDE the source tree, at
# ${STARLING_PEERS_VENV:-$HOME/.cache/starling/peers-venv}.
#
# It is made with Debian's Python 3.11 and --system-site-packages, so the peers train with Debian's
# python3-torch 1.13 (the same LibTorch build that starling-sim links: the comparison measures the
# FL systems, not two PyTorch versions) and Debian's scipy. Debian packages it needs and lacks
# (python3-venv, python3-torch, python3-scipy) are installed first, as scripts/bootstrap.sh does.
#
# Idempotent: when the venv exists, was filled from the same requirements file (a stamp inside it
# holds the file's sha256) and imports every peer, it only says so and exits.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REQ="$ROOT/bench/peers/requirements.txt"
VENV=${STARLING_PEERS_VENV:-$HOME/.cache/starling/peers-venv}
STAMP="$VENV/.starling-peers-requirements.sha256"
PY=/usr/bin/python3

case "$VENV/" in
  "$ROOT/"*) echo "peers-venv: STARLING_PEERS_VENV=$VENV is inside the source tree; put it outside (nothing from PyPI is committed)" >&2; exit 1 ;;
esac

# Debian packages: the interpreter's venv module, PyTorch 1.13 and scipy (pfl imports it).
DEB=(python3-venv python3-torch python3-scipy)
missing=()
for p in "${DEB[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -qx "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "peers-venv: installing missing Debian packages: ${missing[*]}"
  if [[ $(id -u) -eq 0 ]]; then SUDO=(); elif command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else
    echo "peers-venv: need root or sudo to install: ${missing[*]}" >&2; exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-cache show "${missing[@]}" >/dev/null 2>&1; then "${SUDO[@]}" apt-get update -q; fi
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

want=$(sha256sum "$REQ" | cut -d' ' -f1)
check='import flwr, pfl, ray, psutil, torch, flwr.simulation'
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] &&
   "$VENV/bin/python" -c "$check" 2>/dev/null; then
  echo "peers-venv: $VENV is up to date ($(grep -E '^(flwr|pfl|ray)==' "$REQ" | tr '\n' ' '))"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "peers-venv: creating $VENV (Debian's python3, --system-site-packages)"
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv --system-site-packages "$VENV"
fi
echo "peers-venv: installing bench/peers/requirements.txt into $VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
if ! "$VENV/bin/python" -c "$check"; then
  echo "peers-venv: $VENV was filled but cannot import the peers (see the error above)" >&2
  exit 1
fi
echo "$want" > "$STAMP"
"$VENV/bin/python" - <<'EOF'
import flwr, ray, torch, numpy, pfl.version
print(f"peers-venv: ready: flwr {flwr.__version__}, ray {ray.__version__}, pfl {pfl.version.__version__}, "
      f"torch {torch.__version__} ({torch.__file__.split('/torch/')[0]}), numpy {numpy.__version__}")
EOF
