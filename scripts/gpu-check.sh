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
# that would start after it are left out, and each step has its own timeout.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
t_start=$(date +%s)

build=${STARLING_GPU_BUILD_DIR:-build-gpu}
# A fresh folder: nothing from another machine's build is reused.
rm -rf "$build"
out=${OUT:-$build}
mkdir -p "$out"
summary="$out/gpu-check.json"
log() { echo "gpu-check: $*" >&2; }
python=${STARLING_PYTHON:-python3}
jobs=${JOBS:-$(nproc)}
deadline=$(( t_start + ${STARLING_GPU_CHECK_SECONDS:-540} ))
left() { echo $(( deadline - $(date +%s) )); }

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
targets=(test_cuda test_nccl test_torch_gpu test_torch_trainer starling-sim)
log "building ${targets[*]} with -j$jobs"
if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" > "$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -30 >&2
  echo '{"ok": false, "reason": "build failed", "log": "build.log"}' > "$summary"
  exit 3
fi
build_s=$(( $(date +%s) - t0 ))

# ---- GPU tests ----
t0=$(date +%s)
timeout 300 ctest --test-dir "$build" -L gpu --output-on-failure > "$out/ctest-gpu.log" 2>&1
ctest_rc=$?
# The CPU side of the device-generic trainer, against this LibTorch.
timeout 120 ctest --test-dir "$build" -R '^test_torch_trainer:' > "$out/ctest-trainer.log" 2>&1
trainer_rc=$?
tests_s=$(( $(date +%s) - t0 ))
summarize() {
  "$python" - "$summary" "$out" "$torch_info" "$ctest_rc" "$trainer_rc" "$build_s" "$tests_s" \
    "$t_start" "$1" \
    <<'PY' || echo '{"ok": false, "reason": "the summary could not be written"}' > "$summary"
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
py_rate = ((bench.get("python_fedavg_cuda") or {}).get("steady_clients_per_s")
           or (bench.get("python_fedavg_cuda") or {}).get("clients_per_s"))
ratios = {}
for k, v in bench.items():
    if k.startswith("starling_sim") and v.get("clients_per_s") and py_rate:
        ratios[k + "_over_python"] = v["clients_per_s"] / py_rate
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
}
summarize tests > /dev/null

# ---- benchmarks: starling-sim on the GPU against a plain PyTorch FedAvg loop on the same GPU ----
bench_json="$out/bench"
mkdir -p "$bench_json"
gpus=$("$python" -c "import json,sys; print(json.loads(sys.argv[1])['gpus'])" "$torch_info")
if [[ "$gpus" -gt 0 && -f "$data_dir/train-images-idx3-ubyte.gz" ]]; then
  log "benchmarks on Fashion-MNIST from $data_dir"
  if (( $(left) > 60 )); then
    timeout 90 "$python" -W ignore bench/baselines/fedavg_loop.py --data-dir "$data_dir" \
      --device cuda --rounds 6 \
      > "$bench_json/python_cuda.json" 2> "$bench_json/python_cuda.err" \
      || log "the PyTorch loop failed"
  fi
  for w in 1 2 4; do
    if (( $(left) < 60 )); then log "no time left for starling-sim with $w workers"; continue; fi
    rm -f "$bench_json/sim_w$w.jsonl"
    timeout 90 "$build/bin/starling-sim" --config bench/baselines/speed.toml \
      --data.dir "$data_dir" --sim.device cuda --sim.workers "$w" --sim.workers_per_gpu "$w" \
      --state.metrics "$bench_json/sim_w$w.jsonl" \
      > "$bench_json/sim_w$w.out" 2>&1 \
      || log "starling-sim with $w workers on one GPU failed (sim_w$w.out)"
  done
fi

# ---- summary ----
summarize benchmarks
status_py="import json,sys; d=json.load(open(sys.argv[1]));"
status_py+=" print(0 if d['ok'] else (2 if d.get('torch', {}).get('gpus', 0) == 0 else 1))"
status=$("$python" -c "$status_py" "$summary" 2>/dev/null)
log "summary in $summary"
exit "${status:-1}"
