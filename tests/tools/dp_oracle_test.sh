#!/usr/bin/env bash
# tools_dp_oracle: the RDP and PLD accountants against a fresh run of Google's dp-accounting
# (tools/dp_oracle.py in the privacy venv, scripts/privacy-venv.sh), not only against the committed
# figures: test_privacy's oracle tests read the fresh files (STARLING_DP_ORACLE,
# STARLING_DP_PLD_ORACLE). Skipped (77) without the venv.
set -euo pipefail
tool=$1 test_privacy=$2
venv=${STARLING_PRIVACY_VENV:-$HOME/.cache/starling/privacy-venv}
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import dp_accounting' 2>/dev/null; then
  echo "dp_oracle: skipped: no privacy venv at $venv (bash scripts/privacy-venv.sh makes it)"
  exit 77
fi
tmp=$(mktemp) pld=$(mktemp)
trap 'rm -f "$tmp" "$pld"' EXIT
"$venv/bin/python" "$tool" > "$tmp"
"$venv/bin/python" "$tool" --pld > "$pld"
echo "dp_oracle: $(grep -vc '^#' "$tmp") RDP and $(grep -vc '^#' "$pld") PLD figures from dp-accounting"
STARLING_DP_ORACLE=$tmp "$test_privacy" "accountant: epsilon within 1% of dp-accounting over a grid"
STARLING_DP_PLD_ORACLE=$pld "$test_privacy" "pld: epsilon within 1% of dp-accounting's PLD accountant over a grid"
