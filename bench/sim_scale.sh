#!/usr/bin/env bash
# starling-sim at scale (docs/performance.md, "Simulator scale"): the peak memory of every
# worker process and the client-state store's throughput with pools of 1,000 and 100,000 stateful
# clients, a small model (softmax regression on Fashion-MNIST) and top-k with error-feedback
# residuals, the in-memory part of each worker's store bounded by state.memory_bytes.
#
# Every pool runs with 1 and 2 workers, ROUNDS rounds of pool/10 clients each, so that about
# 1 - 0.9^ROUNDS of the pool (99.5% for 50 rounds) has a residual in the store by the end. Each
# client holds SIZE examples drawn with replacement (data.partition = sampled:size=SIZE), so any
# pool fits the data set. Three runs per pool and worker count:
#   kept  state.dir and state.checkpoint set (a folder under STATE_ROOT that a resumed run
#         reopens, flushed after every round: the store keeps an undo table of the checkpoint's
#         versions); the number of states in it at the end
#         (mdb_stat from Debian's lmdb-utils, when installed) and its size are recorded, then it is
#         deleted
#   temp  no state.dir: each store spills to a fresh temporary folder it removes at exit
#   ref   kept, with ef=false: no residuals, the store stays empty. The reference for memory and
#         time, measured in the same run.
#
# Each worker runs under /usr/bin/time (its exact peak RSS, ru_maxrss): the script starts the
# workers itself with the torchrun variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) instead of
# letting rank 0 spawn them: the same program in the same roles. A sampler reads every worker's
# VmRSS, RssAnon (the process's own memory) and RssFile (pages of files mapped into it: LMDB's
# map) 20 times a second, with the number of rounds finished, so the peaks once the data set is
# loaded (after round 1) and their growth over the run can be told apart. Visits per second:
# clients trained (clients_completed) over the rounds' wall_seconds, from the metrics.
#
# Usage: bench/sim_scale.sh [BIN] [OUT]
#   BIN  starling-sim (default build/bin/starling-sim); OUT the JSON written (default sim_scale.json)
# Environment: POOLS ("1000 100000"), WORKERS ("1 2"), MODES ("kept temp ref"), ROUNDS (50),
#   SIZE (32), MEMORY (67108864), COMPRESSOR ("topk:density=0.01"; ef= is appended), STATE_ROOT
#   (/tmp; temp mode spills to TMPDIR, default /tmp).
set -euo pipefail
bin=${1:-build/bin/starling-sim}
out=${2:-sim_scale.json}
pools=${POOLS:-1000 100000}
workers_list=${WORKERS:-1 2}
modes=${MODES:-kept temp ref}
rounds=${ROUNDS:-50}
size=${SIZE:-32}
memory=${MEMORY:-67108864}
compressor=${COMPRESSOR:-topk:density=0.01}
state_root=${STATE_ROOT:-/tmp}

[[ -x $bin ]] || { echo "sim_scale.sh: $bin is not an executable (build starling-sim first)" >&2; exit 2; }
tmp=$(mktemp -d)
pids=()
state=""
cleanup() {  # the workers (children of /usr/bin/time), then the time processes, by pid
  for p in "${pids[@]}"; do
    pkill -P "$p" 2>/dev/null || true
    kill "$p" 2>/dev/null || true
  done
  [[ -n $state ]] && rm -rf "$state"
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Samples the workers (the children of the given /usr/bin/time processes) every 50 ms until the
# time processes end. Lines: "worker seconds rounds_done VmRSS_kB RssAnon_kB RssFile_kB".
sampler() {  # samples file, metrics file, time pids...
  python3 - "$@" <<'EOF'
import os, sys, time
out, metrics, tpids = sys.argv[1], sys.argv[2], [int(p) for p in sys.argv[3:]]
def children(p):
    try:
        return [int(c) for c in open(f"/proc/{p}/task/{p}/children").read().split()]
    except OSError:
        return []
t0 = time.time()
with open(out, "w") as f:
    while any(os.path.exists(f"/proc/{p}") for p in tpids):
        try:
            done = sum(1 for _ in open(metrics))
        except OSError:
            done = 0
        for rank, p in enumerate(tpids):
            for c in children(p):
                try:
                    st = dict(l.split(":", 1) for l in open(f"/proc/{c}/status").read().splitlines())
                except (OSError, ValueError):
                    continue
                kb = [st.get(k, "0 kB").split()[0] for k in ("VmRSS", "RssAnon", "RssFile")]
                f.write(f"{rank} {time.time() - t0:.2f} {done} {' '.join(kb)}\n")
        time.sleep(0.05)
EOF
}

runs=()
sep=":"
[[ $compressor == *:* ]] && sep=","
for pool in $pools; do
  cpr=$((pool / 10))
  for w in $workers_list; do
    for mode in $modes; do
      ef=true
      [[ $mode == ref ]] && ef=false
      tag="p${pool}-w${w}-${mode}"
      args=(--model.spec logreg --data.test "" --eval.every 0 --data.num_clients "$pool"
            --data.partition "sampled:size=$size" --sampling.clients_per_round "$cpr" --train.rounds "$rounds"
            --train.batch_size "$size" --compression.compressor "$compressor$sep""ef=$ef"
            --state.memory_bytes "$memory" --state.metrics "$tmp/$tag.jsonl" --sim.threads 1)
      state=""
      if [[ $mode != temp ]]; then
        state=$(mktemp -d "$state_root/starling-scale-XXXXXX")
        # With a checkpoint: the store is flushed after every round (a run without one never is).
        args+=(--state.dir "$state" --state.checkpoint "$state/checkpoint.bin")
      fi
      echo "sim_scale.sh: $tag ($rounds rounds of $cpr clients${state:+, state in $state})" >&2
      port=$(free_port)
      tpids=()
      for ((r = 0; r < w; ++r)); do
        if ((w == 1)); then
          /usr/bin/time -f "%M" -o "$tmp/$tag.rss$r" "$bin" "${args[@]}" --sim.workers 1 > "$tmp/$tag.log$r" 2>&1 &
        else
          RANK=$r WORLD_SIZE=$w LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            /usr/bin/time -f "%M" -o "$tmp/$tag.rss$r" "$bin" "${args[@]}" > "$tmp/$tag.log$r" 2>&1 &
        fi
        tpids+=($!)
        pids+=($!)
      done
      sampler "$tmp/$tag.samples" "$tmp/$tag.jsonl" "${tpids[@]}" &
      spid=$!
      for p in "${tpids[@]}"; do
        wait "$p" || { echo "sim_scale.sh: $tag failed:" >&2; cat "$tmp/$tag.log"* >&2; exit 1; }
      done
      wait "$spid"
      states=-1
      spill=0
      if [[ -n $state ]]; then
        if command -v mdb_stat > /dev/null; then
          states=0
          for d in "$state"/worker-*; do
            n=$(mdb_stat -s states "$d" 2>/dev/null | awk '/Entries:/ {print $2}')
            states=$((states + ${n:-0}))
          done
        fi
        spill=$(du -sb "$state" | cut -f1)
        rm -rf "$state"
        state=""
      fi
      rss=()
      for ((r = 0; r < w; ++r)); do rss+=("$(tail -1 "$tmp/$tag.rss$r")"); done
      runs+=("$tag $pool $w $mode $ef $cpr $states $spill ${rss[*]}")
    done
  done
done

python3 - "$tmp" "$out" "$rounds" "$size" "$memory" "$compressor" "${runs[@]}" <<'EOF'
import json, sys, platform, datetime, os
tmp, out, rounds, size, memory, compressor = sys.argv[1:7]
rounds, size, memory = int(rounds), int(size), int(memory)
result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "host": platform.node(), "cpus": os.cpu_count(), "load_average": os.getloadavg(), "rounds": rounds,
          "examples_per_client": size, "state_memory_bytes": memory, "compressor": compressor, "runs": []}
mb = lambda kb: round(int(kb) / 1024, 1)
for spec in sys.argv[7:]:
    tag, pool, w, mode, ef, cpr, states, spill, *rss_kb = spec.split()
    pool, w, cpr, states = int(pool), int(w), int(cpr), int(states)
    lines = [json.loads(l) for l in open(f"{tmp}/{tag}.jsonl")]
    visits = sum(l["clients_completed"] for l in lines)
    wall = sum(l["wall_seconds"] for l in lines)
    # Per worker, once round 1 is done (the data set is loaded): the largest VmRSS, RssAnon and
    # RssFile, and the largest VmRSS / RssAnon in each quarter of the remaining rounds.
    per = {}
    for row in open(f"{tmp}/{tag}.samples"):
        rank, t, done, rss, anon, file = row.split()
        if int(done) >= 1:
            per.setdefault(int(rank), []).append((int(done), int(rss), int(anon), int(file)))
    workers = []
    for rank in sorted(per):
        s = per[rank]
        quarter = lambda i, k: mb(max([x[k] for x in s if 1 + i * (rounds - 1) / 4 <= x[0] <= 1 + (i + 1) * (rounds - 1) / 4] or [0]))
        workers.append({"peak_rss_mb": mb(rss_kb[rank]), "rss_after_round_1_mb": mb(max(x[1] for x in s)),
                        "anon_after_round_1_mb": mb(max(x[2] for x in s)), "file_after_round_1_mb": mb(max(x[3] for x in s)),
                        "rss_by_quarter_mb": [quarter(i, 1) for i in range(4)],
                        "anon_by_quarter_mb": [quarter(i, 2) for i in range(4)]})
    result["runs"].append({
        "pool": pool, "workers": w, "mode": mode, "error_feedback": ef == "true", "clients_per_round": cpr,
        "rounds": len(lines), "visits": visits, "round_wall_seconds": round(wall, 2),
        "visits_per_second": round(visits / wall), "us_per_visit_per_worker": round(1e6 * wall * w / visits, 1),
        "expected_coverage": round(1 - (1 - cpr / pool) ** len(lines), 4),
        "states_at_end": states if states >= 0 else None, "state_dir_bytes": int(spill) if mode != "temp" else None,
        "per_worker": workers})
json.dump(result, open(out, "w"), indent=1)
for r in result["runs"]:
    ws = r["per_worker"]
    print(f'{r["pool"]:>7} clients, {r["workers"]} worker(s), {r["mode"]:4}: {r["visits_per_second"]:>6} visits/s '
          f'({r["us_per_visit_per_worker"]} us/visit/worker); peak RSS {[x["peak_rss_mb"] for x in ws]} MB; after round 1: '
          f'RSS {[x["rss_after_round_1_mb"] for x in ws]}, anon {[x["anon_after_round_1_mb"] for x in ws]}, '
          f'file {[x["file_after_round_1_mb"] for x in ws]}; anon by quarter {[x["anon_by_quarter_mb"] for x in ws]}; '
          f'states {r["states_at_end"]}, dir {None if r["state_dir_bytes"] is None else round(r["state_dir_bytes"] / 1e6)} MB')
EOF
