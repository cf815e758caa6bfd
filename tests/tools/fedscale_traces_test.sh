#!/usr/bin/env bash
# tools/fedscale_traces.py: FedScale's pickled device capacities and behaviour traces into
# starling-sim's CSVs (the speed that gives FedScale's compute time, bandwidth in bytes/s, the
# online intervals per period), profiles handed out modulo their number, and clear errors.
set -euo pipefail
script=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
/usr/bin/python3 - "$dir" <<'PY'
import pickle, sys
d = sys.argv[1]
# Two device profiles: 2 ms and 0.5 ms per example, 800 and 80 kbit/s.
pickle.dump({17: {"computation": 2.0, "communication": 800.0},
             5: {"computation": 0.5, "communication": 80.0}}, open(f"{d}/cap", "wb"))
pickle.dump({9: {"active": [0, 50], "inactive": [20, 70], "finish_time": 100, "duration": 1},
             3: {"active": [10, 120], "inactive": [30, 150], "finish_time": 100, "duration": 1}},
            open(f"{d}/beh", "wb"))
pickle.dump([1, 2], open(f"{d}/list", "wb"))
pickle.dump({1: {"computation": -1, "communication": 5}}, open(f"{d}/neg", "wb"))
pickle.dump({1: {"active": 5, "inactive": 6, "finish_time": 10}}, open(f"{d}/scalar", "wb"))
pickle.dump({1: {"active": [3, 100], "inactive": [3, 120], "finish_time": 100}}, open(f"{d}/empty", "wb"))
PY
/usr/bin/python3 "$script" --capacity "$dir/cap" --behavior "$dir/beh" --clients 3 \
  --devices-out "$dir/devices.csv" --availability-out "$dir/avail.csv"
cat "$dir/devices.csv" "$dir/avail.csv"
# Sorted ids 5, 17: client 0 gets id 5 (0.5 ms: speed 1e-3 / (3 x 0.5e-3) = 0.666...; 80 kbit/s =
# 10240 bytes/s), client 1 id 17 (speed 1/6; 102400 bytes/s), client 2 id 5 again.
grep -qx '0,0.666666667,10240,1' "$dir/devices.csv"
grep -qx '1,0.166666667,102400,1' "$dir/devices.csv"
grep -qx '2,0.666666667,10240,1' "$dir/devices.csv"
grep -qx 'client,speed,bandwidth,availability' "$dir/devices.csv"
# Behaviour ids 3, 9: client 0 gets id 3 ([10, 30], and [120, 150] clipped out of the period of 100),
# client 1 id 9 ([0, 20] and [50, 70]).
grep -qx 'client,period,start,end' "$dir/avail.csv"
grep -qx '0,100,10,30' "$dir/avail.csv"
grep -qx '1,100,0,20' "$dir/avail.csv"
grep -qx '1,100,50,70' "$dir/avail.csv"
[ "$(grep -c '^0,' "$dir/avail.csv")" = 1 ]
# Errors: exit 1 with a message, nothing half-written read as good.
fail() { if /usr/bin/python3 "$script" "$@" 2>"$dir/err"; then echo "accepted: $*"; exit 1; fi; }
fail --capacity "$dir/missing" --clients 2 --devices-out "$dir/x.csv"
grep -q "cannot read" "$dir/err"
fail --capacity "$dir/list" --clients 2 --devices-out "$dir/x.csv"
grep -q "dictionary of clients" "$dir/err"
fail --capacity "$dir/neg" --clients 2 --devices-out "$dir/x.csv"
grep -q "must be positive" "$dir/err"
fail --capacity "$dir/cap" --behavior "$dir/beh" --clients 2 --devices-out "$dir/x.csv"
grep -q "go together" "$dir/err"
fail --capacity "$dir/cap" --behavior "$dir/scalar" --clients 2 --devices-out "$dir/y.csv" --availability-out "$dir/y2.csv"
grep -q "must be lists of times" "$dir/err"
# A zero-length interval and one at the period's end are never online: nothing is left, an error,
# and neither file is written.
fail --capacity "$dir/cap" --behavior "$dir/empty" --clients 2 --devices-out "$dir/z.csv" --availability-out "$dir/z2.csv"
grep -q "no interval inside its period" "$dir/err"
[ ! -e "$dir/z.csv" ] && [ ! -e "$dir/z2.csv" ]
echo "fedscale_traces: ok"
