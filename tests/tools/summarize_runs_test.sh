#!/usr/bin/env bash
# tools/summarize_runs.py: runs over seeds into one table row each, the uplink reduction against
# the reference, and clear errors (exit 1) for a missing folder and a folder without runs.
set -euo pipefail
script=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/runs"
# dense: 2 rounds of 1000 uplink bytes each, final accuracies 0.80 and 0.84 over two seeds (means of
# the evaluations 0.65 and 0.72).
printf '%s\n' '{"round":1,"uplink_bytes":1000,"downlink_bytes":1000,"test_accuracy":0.5}' \
  '{"round":2,"uplink_bytes":1000,"downlink_bytes":1000,"test_accuracy":0.8}' > "$dir/runs/dense-s1.jsonl"
printf '%s\n' '{"round":1,"uplink_bytes":1000,"downlink_bytes":1000,"test_accuracy":0.6}' \
  '{"round":2,"uplink_bytes":1000,"downlink_bytes":1000,"test_accuracy":0.84}' > "$dir/runs/dense-s2.jsonl"
# topk: 50 uplink bytes a round, one seed.
printf '%s\n' '{"round":1,"uplink_bytes":50,"downlink_bytes":1000,"test_accuracy":0.4}' \
  '{"round":2,"uplink_bytes":50,"downlink_bytes":1000,"test_accuracy":0.7}' > "$dir/runs/topk-s1.jsonl"
out=$(/usr/bin/python3 "$script" "$dir/runs")
echo "$out"
grep -q '^| dense | 1,2 | 2 | 82.0 ± 2.0 | 68.5 | 0.0 | 0.0 | 1.0x less |$' <<<"$out"
grep -q '^| topk | 1 | 2 | 70.0 ± 0.0 | 55.0 | 0.0 | 0.0 | 20.0x less |$' <<<"$out"
# Uplink and downlink together: dense 4000 bytes, topk 2100.
out=$(/usr/bin/python3 "$script" --traffic total "$dir/runs")
grep -q '^| topk | 1 | 2 | 70.0 ± 0.0 | 55.0 | 0.0 | 0.0 | 1.9x less |$' <<<"$out"
grep -q 'traffic vs dense' <<<"$out"
# Time to a target accuracy: sync reaches 75% at its second record (10 + 30 = 40 simulated s,
# 4000 bytes), async at its second (5 + 5 = 10 s, 2000 bytes) on seed 1 and never on seed 2.
mkdir "$dir/t"
printf '%s\n' '{"round":1,"sim_seconds":10,"uplink_bytes":1000,"downlink_bytes":1000,"test_accuracy":0.5}' \
  '{"round":2,"sim_seconds":30,"uplink_bytes":1000,"downlink_bytes":1000,"test_accuracy":0.8}' > "$dir/t/sync-s1.jsonl"
printf '%s\n' '{"round":1,"sim_seconds":5,"uplink_bytes":500,"downlink_bytes":500}' \
  '{"round":2,"sim_seconds":5,"uplink_bytes":500,"downlink_bytes":500,"test_accuracy":0.76}' > "$dir/t/async-s1.jsonl"
out=$(/usr/bin/python3 "$script" --reference sync --target 75 "$dir/t")
echo "$out"
grep -q '^| sync | 1 | 2 | 80.0 ± 0.0 | 65.0 | 0.0 | 0.0 | 1.0x less | 40 | 0.0 | 1.00x |$' <<<"$out"
grep -q '^| async | 1 | 2 | 76.0 ± 0.0 | 76.0 | 0.0 | 0.0 | 2.0x less | 10 | 0.0 | 4.00x |$' <<<"$out"
printf '%s\n' '{"round":1,"sim_seconds":5,"uplink_bytes":500,"downlink_bytes":500}' \
  '{"round":2,"sim_seconds":5,"uplink_bytes":500,"downlink_bytes":500,"test_accuracy":0.70}' > "$dir/t/async-s2.jsonl"
out=$(/usr/bin/python3 "$script" --reference sync --target 75 "$dir/t")
grep -q '^| async | 1,2 | 2 | 73.0 ± 3.0 | 73.0 | 0.0 | 0.0 | 2.0x less | 10 (1/2 seeds) | 0.0 (1/2 seeds) |  |$' <<<"$out"
if /usr/bin/python3 "$script" "$dir/missing" 2> "$dir/err"; then echo "missing folder accepted"; exit 1; fi
grep -q "cannot read" "$dir/err"
mkdir "$dir/empty"
if /usr/bin/python3 "$script" "$dir/empty" 2> "$dir/err"; then echo "empty folder accepted"; exit 1; fi
grep -q "no NAME-sSEED.jsonl" "$dir/err"
echo "summarize_runs: ok"
