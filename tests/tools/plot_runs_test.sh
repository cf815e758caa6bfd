#!/usr/bin/env bash
# tools/plot_runs.py: two metrics files in, one PNG out; a missing file and a file without any
# evaluated round are clear errors (exit 1), not a traceback.
set -euo pipefail
script=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf '%s\n' '{"round":1,"uplink_bytes":1000,"test_accuracy":0.5}' '{"round":2,"uplink_bytes":1000}' \
  '{"round":3,"uplink_bytes":1000,"test_accuracy":0.7}' > "$dir/a.jsonl"
printf '%s\n' '{"round":1,"uplink_bytes":50000,"test_accuracy":0.6}' '{"round":2,"uplink_bytes":50000,"test_accuracy":0.8}' > "$dir/b.jsonl"
/usr/bin/python3 "$script" --out "$dir/runs.png" sparse="$dir/a.jsonl" dense="$dir/b.jsonl"
[[ $(head -c 8 "$dir/runs.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || { echo "not a PNG"; exit 1; }
/usr/bin/python3 "$script" --bytes total --out "$dir/total.png" sparse="$dir/a.jsonl" dense="$dir/b.jsonl"
[[ $(head -c 8 "$dir/total.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || { echo "not a PNG"; exit 1; }
printf '%s\n' '{"round":1,"sim_seconds":2.5,"uplink_bytes":1000,"test_accuracy":0.5}' > "$dir/t.jsonl"
/usr/bin/python3 "$script" --time --out "$dir/time.png" timed="$dir/t.jsonl" untimed="$dir/a.jsonl"
[[ $(head -c 8 "$dir/time.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || { echo "not a PNG"; exit 1; }
if /usr/bin/python3 "$script" --bytes both --out "$dir/x.png" "$dir/a.jsonl" 2>/dev/null; then echo "bad --bytes accepted"; exit 1; fi
if /usr/bin/python3 "$script" --out "$dir/x.png" "$dir/missing.jsonl" 2> "$dir/err"; then echo "missing file accepted"; exit 1; fi
grep -q "cannot read" "$dir/err"
printf '%s\n' '{"round":1,"uplink_bytes":5}' > "$dir/c.jsonl"
if /usr/bin/python3 "$script" --out "$dir/x.png" "$dir/c.jsonl" 2> "$dir/err"; then echo "no accuracy accepted"; exit 1; fi
grep -q "no round with test_accuracy" "$dir/err"
echo "plot_runs: ok"
