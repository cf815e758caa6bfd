#!/usr/bin/env bash
# `make gpu-check`: on a machine with a GPU and PyTorch, builds Starling against that PyTorch's
# LibTorch in a fresh folder (reusing no build output), runs every GPU test (`ctest -L gpu`: the
# cuda/ kernels against their CPU twins, NCCL, the trainer and one simulated round on cuda against
# cpu) and the GPU benchmarks, and writes one JSON summary. docs/gpu.md says how to run it and what
# it measures. Aimed at 8 minutes on a 16-core GPU machine.
#
# Where its inputs come from:
#   LibTorch    python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' (STARLING_PYTHON)
#   the rest    the system, or .gpu-deps/prefix (scripts/gpu-deps.sh: Debian packages unpacked on
#               the development machine, carried to a GPU machine that has none)
#   data        Fashion-MNIST from /usr/share/datasets/fashion-mnist or .gpu-deps/data
# Output: $OUT/gpu-check.json when OUT is set (the device tool's folder), else
# build-gpu/gpu-check.json; logs beside it. The summary is written after the tests and again after
# the benchmarks, so a run cut short still reports its tests. Exit status: 0 when every GPU test
# passed and none was skipped, 1 when one failed, 2 when there is no GPU (the summary says so), 3
# for a build failure. STARLING_GPU_CHECK_SECONDS (default 540) bounds the whole run: benchmarks
# that would start after it are left out, and each step has its own timeout;
# STARLING_GPU_CHECK_REUSE=1 then runs it again on the same machine without rebuilding (with
# STARLING_GPU_CHECK_TESTS=0, without the tests either), and
# STARLING_GPU_CHECK_BENCH picks the benchmarks (default: "python sim bare topk rounds20
# stateful100k").
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
t_start=$(date +%s)

build=${STARLING_GPU_BUILD_DIR:-build-gpu}
# A fresh folder: nothing from another machine's build is reused. STARLING_GPU_CHECK_REUSE=1 keeps
# a folder that an earlier gpu-check made on this same machine (a second call on a warm device
# machine, to finish benchmarks the first call had no time for): the build is then incremental.
if [[ ${STARLING_GPU_CHECK_REUSE:-0} != 1 || ! -f "$build/.gpu-check-built-here" ||
      "$(cat "$build/.gpu-check-built-here" 2>/dev/null)" != "$(uname -n)" ]]; then
  rm -rf "$build"
fi
out=${OUT:-$build}
mkdir -p "$out"
summary="$out/gpu-check.json"
log() { echo "gpu-check: $*" >&2; }
python=${STARLING_PYTHON:-python3}
jobs=${JOBS:-$(nproc)}
deadline=$(( t_start + ${STARLING_GPU_CHECK_SECONDS:-540} ))
left() { echo $(( deadline - $(date +%s) )); }
# A step's timeout: at most $1 seconds, and never past the budget (15 s kept for the summary).
cap() { local t=$(( $(left) - 15 )); (( t > $1 )) && t=$1; (( t < 1 )) && t=1; echo "$t"; }
# Whatever is still running when the script ends (a step cut short leaves its children) is ended.
state_dir=""
trap 'kill $(jobs -p) 2>/dev/null; [[ -n "$state_dir" ]] && rm -rf "$state_dir"' EXIT
all_bench="python sim bare topk rounds20 stateful100k"
want() { [[ " ${STARLING_GPU_CHECK_BENCH-$all_bench} " == *" $1 "* ]]; }

# ---- what this machine has ----
torch_info=$("$python" -W ignore -c '
import json, torch, torch.utils
cuda = torch.cuda.is_available()
print(json.dumps({"torch": torch.__version__, "cuda_build": torch.version.cuda,
                  "cmake_prefix": torch.utils.cmake_prefix_path,
                  "gpus": torch.cuda.device_count() if cuda else 0,
                  "gpu": torch.cuda.get_device_name(0) if cuda else None}))' 2>/dev/null) || {
  log "no PyTorch for $python (pip install torch, or set STARLING_PYTHON)"
  echo '{"ok": false, "reason": "no PyTorch"}' > "$summary"
  exit 2
}
torch_prefix=$("$python" -c "import json,sys; print(json.loads(sys.argv[1])['cmake_prefix'])" \
  "$torch_info")
log "PyTorch: $torch_info"

deps="$root/.gpu-deps/prefix"
cmake_prefix="$torch_prefix"
deps_args=()
if [[ -f "$deps/.complete" ]]; then
  log "build dependencies from $deps ($(wc -l < "$deps/packages.txt") Debian packages)"
  u="$deps/usr"
  cmake_prefix="$torch_prefix;$u"
  export PATH="$u/bin:$PATH"
  # Some packages install into /lib rather than /usr/lib (libnl, keyutils, com_err: libgloo's and
  # libzmq's own dependencies).
  l="$deps/lib/x86_64-linux-gnu"
  export LD_LIBRARY_PATH="$u/lib/x86_64-linux-gnu:$u/lib:$l${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LIBRARY_PATH="$u/lib/x86_64-linux-gnu:$u/lib:$l${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export CPATH="$u/include${CPATH:+:$CPATH}"
  # .pc files say prefix=/usr: the sysroot puts the unpacked folder in front of their paths.
  export PKG_CONFIG_LIBDIR="$u/lib/x86_64-linux-gnu/pkgconfig:$u/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$root/.gpu-deps/prefix"
  # Debian's multiarch folders (lib/x86_64-linux-gnu, and the CMake packages in it): CMake searches
  # them under every prefix only where it detects a Debian-like system, so say it.
  deps_args=(-DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu)
fi
# The CUDA libraries of the PyTorch wheel first: the binaries' run path may name an older toolkit's
# runtime with the same soname.
for d in "$torch_prefix"/../../../nvidia/*/lib; do
  [[ -d "$d" ]] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
data_dir=/usr/share/datasets/fashion-mnist
[[ -f "$root/.gpu-deps/data/train-images-idx3-ubyte.gz" ]] && data_dir="$root/.gpu-deps/data"

# ---- build ----
log "configuring $build against $torch_prefix"
t0=$(date +%s)
# STARLING_GPU_CHECK_CMAKE_ARGS: more -D options (for instance -DCMAKE_IGNORE_PREFIX_PATH=/usr, to
# try on the development machine that nothing is taken from its Debian packages).
# shellcheck disable=SC2086
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$cmake_prefix" -DSTARLING_CUDA=ON -DSTARLING_BUILD_TESTS=ON \
    "${deps_args[@]}" ${STARLING_GPU_CHECK_CMAKE_ARGS:-} \
    > "$out/configure.log" 2>&1; then
  tail -30 "$out/configure.log" >&2
  echo '{"ok": false, "reason": "configure failed", "log": "configure.log"}' > "$summary"
  exit 3
fi
# Configured here: a later STARLING_GPU_CHECK_REUSE=1 call may go on from this folder, even from a
# build this call had no time to finish.
uname -n > "$build/.gpu-check-built-here"
targets=(test_cuda test_nccl test_torch_gpu test_torch_trainer starling-sim)
# The bare LibTorch loop (the compute limit) and the top-k benchmark, when bench/ is configured.
grep -q '^build bench/CMakeFiles/starling-torch-loop-bench' "$build/build.ninja" 2>/dev/null &&
  targets+=(starling-torch-loop-bench)
log "building ${targets[*]} with -j$jobs"
if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" > "$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -30 >&2
  echo '{"ok": false, "reason": "build failed", "log": "build.log"}' > "$summary"
  exit 3
fi
build_s=$(( $(date +%s) - t0 ))

# ---- GPU tests ----
t0=$(date +%s)
if [[ ${STARLING_GPU_CHECK_TESTS:-1} == 0 ]]; then
  # A second call for the benchmarks only: its summary says the tests did not run (ok is false).
  log "tests not run (STARLING_GPU_CHECK_TESTS=0)"
  echo "tests not run (STARLING_GPU_CHECK_TESTS=0)" > "$out/ctest-gpu.log"
  ctest_rc=0 trainer_rc=0
else
  timeout "$(cap 300)" ctest --test-dir "$build" -L gpu --output-on-failure \
    > "$out/ctest-gpu.log" 2>&1
  ctest_rc=$?
  # The CPU side of the device-generic trainer, against this LibTorch.
  timeout "$(cap 120)" ctest --test-dir "$build" -R '^test_torch_trainer:' \
    > "$out/ctest-trainer.log" 2>&1
  trainer_rc=$?
fi
tests_s=$(( $(date +%s) - t0 ))
# Written to a temporary file first: a summary that fails keeps the last good one (the tests'),
# with the reason beside it.
summarize() {
  "$python" - "$summary.tmp" "$out" "$torch_info" "$ctest_rc" "$trainer_rc" "$build_s" "$tests_s" \
    "$t_start" "$1" > "$out/summary-$1.log" 2>&1 <<'PY'
import json, os, re, sys, time
summary, out, torch_info, ctest_rc, trainer_rc, build_s, tests_s, t_start, stage = sys.argv[1:]
log = open(os.path.join(out, "ctest-gpu.log"), errors="replace").read()
tests = {"passed": [], "failed": [], "skipped": []}
for m in re.finditer(r"Test\s+#\d+: (\S+.*?) \.+\s*(\*\*\*)?"
                     r"(Passed|Failed|Skipped|Not Run|Exception|Timeout)", log):
    state = m.group(3)
    tests["passed" if state == "Passed" else "skipped" if state in ("Skipped", "Not Run")
          else "failed"].append(m.group(1).strip())
def read_json(path):
    try:
        return json.load(open(path))
    except Exception:
        return None
def read_jsonl(path):
    rows = []
    for line in open(path, errors="replace"):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass  # a line cut short by a timeout
    return rows
bench = {}
py = read_json(os.path.join(out, "bench", "python_cuda.json"))
if py:
    bench["python_fedavg_cuda"] = {k: py.get(k) for k in ("clients_per_s", "steady_clients_per_s",
                                                          "test_accuracy", "torch")}
for w in (1, 2, 4):
    path = os.path.join(out, "bench", f"sim_w{w}.jsonl")
    if not os.path.exists(path):
        continue
    rounds = read_jsonl(path)
    # Round 1 pays the one-off costs (CUDA and cuDNN set-up, the data set's upload), as the
    # Python loop's steady rate leaves its first round out; evaluation rounds are left out too.
    timed = [r for r in rounds[1:] if r.get("test_accuracy") is None and r.get("wall_seconds")]
    clients = sum(r.get("clients_completed", 0) for r in timed)
    wall = sum(r["wall_seconds"] for r in timed)
    acc = [r["test_accuracy"] for r in rounds if r.get("test_accuracy") is not None]
    bench[f"starling_sim_cuda_w{w}"] = {"workers_per_gpu": w,
                                        "clients_per_s": clients / wall if wall else None,
                                        "rounds_timed": len(timed),
                                        "test_accuracy": acc[-1] if acc else None}
# The compute limit: W bare LibTorch loops side by side on the GPU, their samples/s summed.
for w in (1, 2, 4):
    rates = []
    for i in range(w):
        b = read_json(os.path.join(out, "bench", f"bare_w{w}_{i}.json")) or {}
        rates += [x.get("samples_per_s") for x in b.get("benchmarks", [])
                  if x.get("name", "").startswith("cnn_fit/bare_loop")]
    if len(rates) == w and all(rates):
        bench[f"bare_loops_cuda_w{w}"] = {"copies": w, "samples_per_s": sum(rates),
                                          "clients_per_s": sum(rates) / 600,
                                          "per_loop_samples_per_s": rates}
# Top-k 1% of a CNN-sized update: the host's compressor against encodeTopK on the GPU.
topk = {x.get("name", "").split("/real_time")[0]: x.get("real_time")
        for x in (read_json(os.path.join(out, "bench", "topk.json")) or {}).get("benchmarks", [])}
if topk.get("topk_encode/host") and topk.get("topk_encode/device"):
    bench["topk_encode_ms"] = {"host": topk["topk_encode/host"], "cuda": topk["topk_encode/device"],
                               "cuda_speedup": (topk["topk_encode/host"]
                                                / topk["topk_encode/device"])}
# 20 rounds on cuda against the same 20 rounds on cpu.
curves = {}
for dev in ("cuda", "cpu"):
    path = os.path.join(out, "bench", f"rounds20_{dev}.jsonl")
    if os.path.exists(path):
        curves[dev] = {r["round"]: r["test_accuracy"] for r in read_jsonl(path)
                       if r.get("test_accuracy") is not None and "round" in r}
if curves.get("cuda") and curves.get("cpu"):
    last = max(set(curves["cuda"]) & set(curves["cpu"]), default=None)
    bench["rounds20_cuda_vs_cpu"] = {
        "accuracy_cuda": curves["cuda"], "accuracy_cpu": curves["cpu"], "last_round": last,
        "final_gap_points": (100 * abs(curves["cuda"][last] - curves["cpu"][last])
                             if last is not None else None)}
# 100,000 stateful clients: the GPU's used memory while starling-sim runs.
mem = os.path.join(out, "bench", "stateful100k_mem.txt")
if os.path.exists(mem):
    used = []
    for l in open(mem, errors="replace"):
        try:
            used.append(float(l.split()[1]))
        except (IndexError, ValueError):
            pass  # a line cut short when the sampler was ended
    rounds = read_jsonl(os.path.join(out, "bench", "stateful100k.jsonl")) \
        if os.path.exists(os.path.join(out, "bench", "stateful100k.jsonl")) else []
    if used:
        half = len(used) // 2
        first, second = max(used[:half] or used), max(used[half:])
        bench["stateful100k_device_memory"] = {
            "samples": len(used), "rounds": len(rounds),
            # each trained client keeps a residual (clients drawn twice among 100,000 are few)
            "clients_trained": sum(r.get("clients_completed", 0) for r in rounds),
            "peak_used_mib_first_half": first, "peak_used_mib_second_half": second,
            "flat": second <= first + 64}
py_rate = ((bench.get("python_fedavg_cuda") or {}).get("steady_clients_per_s")
           or (bench.get("python_fedavg_cuda") or {}).get("clients_per_s"))
ratios = {}
for k, v in bench.items():
    if k.startswith("starling_sim") and v.get("clients_per_s") and py_rate:
        ratios[k + "_over_python"] = v["clients_per_s"] / py_rate
    limit = bench.get("bare_loops_cuda_w" + k[len("starling_sim_cuda_w"):]) \
        if k.startswith("starling_sim_cuda_w") else None
    if limit and v.get("clients_per_s"):
        ratios[k + "_over_compute_limit"] = v["clients_per_s"] / limit["clients_per_s"]
result = {
    "ok": (ctest_rc == "0" and trainer_rc == "0" and not tests["failed"] and not tests["skipped"]
           and bool(tests["passed"])),
    "stage": stage,
    "torch": json.loads(torch_info),
    "gpu_tests": {k: len(v) for k, v in tests.items()},
    "failed": tests["failed"], "skipped": tests["skipped"],
    "ctest_exit": int(ctest_rc),
    "trainer_tests_on_this_libtorch": "passed" if trainer_rc == "0" else "failed",
    "benchmarks": bench, "ratios": ratios,
    "seconds": {"build": int(build_s), "tests": int(tests_s),
                "total": int(time.time()) - int(t_start)},
}
json.dump(result, open(summary, "w"), indent=2)
print(json.dumps(result, indent=2))
PY
  if [[ $? -eq 0 && -s "$summary.tmp" ]]; then mv "$summary.tmp" "$summary"; else
    log "the $1 summary could not be written (summary-$1.log); $summary is the last good one"
    [[ -f "$summary" ]] ||
      echo '{"ok": false, "reason": "the summary could not be written"}' > "$summary"
  fi
}
summarize tests

# ---- benchmarks: starling-sim on the GPU against a plain PyTorch FedAvg loop on the same GPU ----
bench_json="$out/bench"
mkdir -p "$bench_json"
gpus=$("$python" -c "import json,sys; print(json.loads(sys.argv[1])['gpus'])" "$torch_info")
if [[ "$gpus" -gt 0 && -f "$data_dir/train-images-idx3-ubyte.gz" ]]; then
  log "benchmarks on Fashion-MNIST from $data_dir"
  if want python && (( $(left) > 60 )); then
    timeout "$(cap 90)" "$python" -W ignore bench/baselines/fedavg_loop.py --data-dir "$data_dir" \
      --device cuda --rounds 6 \
      > "$bench_json/python_cuda.json" 2> "$bench_json/python_cuda.err" \
      || log "the PyTorch loop failed"
  fi
  for w in 1 2 4; do
    want sim || break
    if (( $(left) < 60 )); then log "no time left for starling-sim with $w workers"; continue; fi
    rm -f "$bench_json/sim_w$w.jsonl"
    timeout "$(cap 90)" "$build/bin/starling-sim" --config bench/baselines/speed.toml \
      --data.dir "$data_dir" --sim.device cuda --sim.workers "$w" --sim.workers_per_gpu "$w" \
      --state.metrics "$bench_json/sim_w$w.jsonl" \
      > "$bench_json/sim_w$w.out" 2>&1 \
      || log "starling-sim with $w workers on one GPU failed (sim_w$w.out)"
  done
  # The compute limit: as many bare LibTorch loops side by side on the GPU as workers, each on one
  # LibTorch thread like the simulator's workers (bench/torch_loop_bench.cc, --device=cuda).
  if want bare && [[ -x "$build/bin/starling-torch-loop-bench" ]]; then
    for w in 1 2 4; do
      if (( $(left) < 45 )); then log "no time left for $w bare loops"; continue; fi
      pids=()
      for ((i = 0; i < w; ++i)); do
        # 8 s each: the copies start within a few seconds of each other (CUDA's set-up), so
        # most of each one's measured time overlaps the others'.
        timeout "$(cap 60)" "$build/bin/starling-torch-loop-bench" --device=cuda --threads=1 \
          --benchmark_filter='^cnn_fit/bare_loop/' --benchmark_min_time=8 \
          --benchmark_format=json \
          > "$bench_json/bare_w${w}_$i.json" 2> "$bench_json/bare_w${w}_$i.err" &
        pids+=($!)
      done
      for p in "${pids[@]}"; do wait "$p" || log "a bare loop of $w failed (bare_w${w}_*.err)"; done
    done
  fi
  # Top-k 1% of a CNN-sized update on the GPU (torch_trainer/device_compress.h) against the host's
  # compressor: what the round on the device would save.
  if want topk && [[ -x "$build/bin/starling-torch-loop-bench" ]] && (( $(left) > 45 )); then
    timeout "$(cap 60)" "$build/bin/starling-torch-loop-bench" --device=cuda --threads=1 \
      --benchmark_filter='^topk_encode/' --benchmark_format=json \
      > "$bench_json/topk.json" 2> "$bench_json/topk.err" ||
      log "the top-k benchmark failed (topk.err)"
  fi
  # 20 rounds on cuda against the same 20 rounds on cpu (same seed): test accuracy every 5 rounds.
  cpu_threads=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
  for dev in cuda cpu; do
    want rounds20 || break
    if (( $(left) < 90 )); then log "no time left for 20 rounds on $dev"; continue; fi
    extra=(--sim.workers_per_gpu 2)
    [[ $dev == cpu ]] && extra=(--sim.threads "$cpu_threads")
    rm -f "$bench_json/rounds20_$dev.jsonl"
    timeout "$(cap 150)" "$build/bin/starling-sim" --config bench/baselines/speed.toml \
      --data.dir "$data_dir" --sim.device "$dev" --sim.workers 2 "${extra[@]}" \
      --train.rounds 20 --eval.every 5 --state.metrics "$bench_json/rounds20_$dev.jsonl" \
      > "$bench_json/rounds20_$dev.out" 2>&1 || log "20 rounds on $dev failed (rounds20_$dev.out)"
  done
  # 100,000 clients with top-k residuals (the bounded client-state store, 256 MiB in memory, the
  # rest in LMDB): the GPU's used memory, sampled every 0.2 s, must stay flat as states pile up.
  if want stateful100k && (( $(left) > 60 )); then
    rm -f "$bench_json/stateful100k.jsonl" "$bench_json/stateful100k_mem.txt"
    state_dir=$(mktemp -d "${TMPDIR:-/tmp}/starling-gpu-state-XXXXXX")
    timeout "$(cap 300)" "$build/bin/starling-sim" --config bench/baselines/speed.toml \
      --data.dir "$data_dir" --sim.device cuda --sim.workers 1 --data.num_clients 100000 \
      --data.partition sampled:size=60 --sampling.clients_per_round 100 --train.rounds 8 \
      --eval.every 0 --data.test "" --compression.compressor topk:density=0.01 \
      --state.memory_bytes 268435456 --state.dir "$state_dir" \
      --state.metrics "$bench_json/stateful100k.jsonl" > "$bench_json/stateful100k.out" 2>&1 &
    sim_pid=$!
    "$python" -W ignore -c '
import sys, time, torch
end = time.time() + float(sys.argv[2])
with open(sys.argv[1], "w") as f:
    while time.time() < end:
        free, total = torch.cuda.mem_get_info()
        print(f"{time.time():.2f} {(total - free) / 2**20:.1f}", file=f, flush=True)
        time.sleep(0.2)' "$bench_json/stateful100k_mem.txt" $(( $(left) - 15 )) &
    mem_pid=$!
    wait "$sim_pid" || log "100,000 stateful clients failed (stateful100k.out)"
    kill "$mem_pid" 2>/dev/null; wait "$mem_pid" 2>/dev/null
    rm -rf "$state_dir"
  fi
fi

# ---- summary ----
summarize benchmarks
status_py="import json,sys; d=json.load(open(sys.argv[1]));"
status_py+=" print(0 if d.get('ok') else (2 if json.loads(sys.argv[2])['gpus'] == 0 else 1))"
status=$("$python" -c "$status_py" "$summary" "$torch_info" 2>/dev/null)
log "summary in $summary"
exit "${status:-1}"
