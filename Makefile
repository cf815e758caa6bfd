# The two commands a newcomer runs: `make demo` and `make test`. Each does its own set-up.
BUILD_DIR ?= build
JOBS ?= 2

.PHONY: all bootstrap configure build arm64 test test-arm64 test-asan demo bench bench-speed fuzz \
        bench-peers bench-peers-deploy bench-peers-scale test-peers test-privacy fuzz-configure fuzz-control fuzz-reassembly clean gpu-deps gpu-check torch-wheel \
        build-torch2 test-torch2 check-format

all: build

bootstrap:
	@bash scripts/bootstrap.sh

configure: bootstrap
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then cmake --preset default; fi

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The arm64 edge build (preset arm64, build-arm64/: cross-compiled, run under qemu-aarch64 -L /).
# STARLING_SKIP_ARM64=1 skips it, here and in bootstrap. docs/edge-arm64.md.
arm64: bootstrap
	JOBS=$(JOBS) bash scripts/build-arm64.sh

# `make test` = native build, arm64 build, native ctest, arm64 ctest (under qemu).
# The arm64 tree is a separate CMake build driven from here, not an ExternalProject of the native
# build: the two builds run one after the other with -j$(JOBS) each (an ExternalProject's nested
# ninja would compete with the outer one for the 2 cores), a no-change rebuild of build-arm64 is one
# ninja no-op (well under a second; the configure step runs only for a new tree), and a machine
# without the cross packages still builds natively (STARLING_SKIP_ARM64=1). It is built before the
# native ctest because native integration tests run build-arm64/bin/starling-client under qemu
# (CMake cache variable STARLING_ARM64_BUILD_DIR). Its own tests (core, compression, protocol, data,
# transport, client as arm64 programs) take 10 to 25 s under qemu.
# Both suites run even when the first fails (a native failure hid the arm64 result), and the
# last lines say how each ended; make exits non-zero when either failed.
# The tests that need a venv outside the tree (labels peers and oracle) are their own targets'
# (test-peers, test-privacy, each making its venv): here they ran only where an earlier target had
# made the venv, and then twice in CI.
test: build
	JOBS=$(JOBS) bash scripts/build-arm64.sh
	@native=0; arm64=skipped; \
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) -LE '^(peers|oracle)$$' || native=$$?; \
	if [ "$${STARLING_SKIP_ARM64:-0}" != 1 ]; then \
	  echo "ctest: arm64 edge tests under qemu-aarch64 -L / (build-arm64)"; \
	  arm64=0; ctest --test-dir build-arm64 --output-on-failure -j $(JOBS) || arm64=$$?; \
	fi; \
	echo "make test: native suite $$( [ $$native = 0 ] && echo passed || echo FAILED), arm64 suite $$( \
	  case $$arm64 in 0) echo passed;; skipped) echo 'skipped (STARLING_SKIP_ARM64=1)';; *) echo FAILED;; esac)"; \
	[ $$native = 0 ] && { [ $$arm64 = 0 ] || [ $$arm64 = skipped ]; }

# Only the arm64 edge build and its tests under qemu.
test-arm64: arm64
	ctest --test-dir build-arm64 --output-on-failure -j $(JOBS)

# The whole suite once more under AddressSanitizer + UBSan (the `debug` preset, build-debug/).
# scripts/test-asan.sh configures if needed, builds and runs ctest; it explains its sanitizer
# settings, which apply to that run only.
test-asan: bootstrap
	JOBS=$(JOBS) bash scripts/test-asan.sh

# The simulator's demo (examples/sim/demo.toml): Fashion-MNIST, the CNN, 100 clients with
# Dirichlet(0.5), 10 per round, top-k 1% with error feedback, 2 worker processes over Gloo.
# `$(BUILD_DIR)/bin/starling-demo` is the earlier single-process demo of the round loop.
demo: build
	$(BUILD_DIR)/bin/starling-sim --config examples/sim/demo.toml

bench: build
	$(BUILD_DIR)/bin/starling-bench --benchmark_format=json --benchmark_out=$(BUILD_DIR)/bench.json

# Speed: starling-sim (2 workers) against a plain PyTorch FedAvg loop, the bare LibTorch
# loop and two concurrent ones, 3 interleaved repetitions (about 10 min; docs/performance.md). Its
# own Release build in $(SPEED_BUILD_DIR). Needs Debian's python3-torch, which the bootstrap
# installs (scripts/bootstrap.sh); the script says so when it is missing.
SPEED_BUILD_DIR ?= build-speed
bench-speed:
	@if [ ! -f $(SPEED_BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(SPEED_BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTARLING_CUDA=OFF; fi
	cmake --build $(SPEED_BUILD_DIR) -j $(JOBS) --target starling-sim starling-torch-loop-bench
	/usr/bin/python3 bench/speed_vs_python.py --build-dir $(SPEED_BUILD_DIR) --out $(SPEED_BUILD_DIR)/speed_vs_python.json

# The same federated task (examples/sim/demo.toml) run by Starling, Flower (Ray simulation) and pfl,
# interleaved, each peer at its defaults and at its best settings for 2 cores: wall time, rounds/s,
# clients/s, peak memory of every process, accuracy per evaluated round, bytes (docs/peers.md).
# The peers live in a virtual environment outside the tree (scripts/peers-venv.sh,
# $STARLING_PEERS_VENV); nothing from PyPI is committed. PEERS_ARGS passes more options to run.py,
# e.g. PEERS_ARGS="--rounds 3" for a smoke run (about 4 min) or "--repeats 3" (30 to 40 min a
# repetition at the default 30 rounds).
PEERS_VENV ?= $(or $(STARLING_PEERS_VENV),$(HOME)/.cache/starling/peers-venv)
PEERS_ARGS ?=
# The peers benchmark's own test (tools_peers_loads: no peer is slowed by how the benchmark runs
# it), with the venv it needs: `make test` reports it skipped when the venv is absent. .ci/run runs it.
test-peers: build
	STARLING_PEERS_VENV=$(PEERS_VENV) bash scripts/peers-venv.sh
	STARLING_PEERS_VENV=$(PEERS_VENV) ctest --test-dir $(BUILD_DIR) --output-on-failure -L peers

# The privacy accountant against a fresh run of Google's dp-accounting (tools_dp_oracle), with its
# test-only venv (scripts/privacy-venv.sh, outside the tree). .ci/run runs it.
PRIVACY_VENV ?= $(or $(STARLING_PRIVACY_VENV),$(HOME)/.cache/starling/privacy-venv)
test-privacy: build
	STARLING_PRIVACY_VENV=$(PRIVACY_VENV) bash scripts/privacy-venv.sh
	STARLING_PRIVACY_VENV=$(PRIVACY_VENV) ctest --test-dir $(BUILD_DIR) --output-on-failure -L oracle

# Every tracked C++ and CUDA file as clang-format writes it (.clang-format). .ci/run runs it.
check-format: bootstrap
	bash scripts/check-format.sh

bench-peers: build
	STARLING_PEERS_VENV=$(PEERS_VENV) bash scripts/peers-venv.sh
	$(PEERS_VENV)/bin/python bench/peers/run.py --starling-bin $(BUILD_DIR)/bin --out $(BUILD_DIR)/peers.json $(PEERS_ARGS)

# Scale against the peers: the three systems with 1,000 and 100,000 clients in the
# pool, stateless and stateful: startup, s/round, peak RSS of the process tree, or the failure
# (bench/peers/scale.py). SCALE_ARGS passes more options, e.g. SCALE_ARGS="--pools 1000 --timeout 300".
SCALE_ARGS ?=
bench-peers-scale: build
	STARLING_PEERS_VENV=$(PEERS_VENV) bash scripts/peers-venv.sh
	$(PEERS_VENV)/bin/python bench/peers/scale.py --starling-bin $(BUILD_DIR)/bin --out $(BUILD_DIR)/peers-scale.json $(SCALE_ARGS)

# Deployment against Flower: Flower's SuperLink with N SuperNodes (Deployment Runtime,
# `flwr run`) against Starling's root with N Python clients on 127.0.0.1, the same dense update of
# 1,000,010 float32 values, N = 10 and 100 interleaved: updates/s, server and total peak RSS
# (bench/peers/deploy.py). DEPLOY_ARGS passes more options, e.g. DEPLOY_ARGS="--clients 2 --rounds 2".
DEPLOY_ARGS ?=
bench-peers-deploy: build
	STARLING_PEERS_VENV=$(PEERS_VENV) bash scripts/peers-venv.sh
	$(PEERS_VENV)/bin/python bench/peers/deploy.py --build-dir $(BUILD_DIR) --out $(BUILD_DIR)/peers-deploy.json $(DEPLOY_ARGS)

# Runs the server-path fuzzer (decode, validate, aggregate) for FUZZ_SECONDS (default 60) over
# tests/fuzz/corpus, under memory limits: decoding must cost memory linear in the message, so a
# malloc over FUZZ_MALLOC_MB or an RSS over FUZZ_RSS_MB is a finding.
# `make fuzz-control` runs the control-message fuzzer (peekKind and every decoder of
# protocol/control.h: Register, Welcome, Heartbeat, Task against two layouts, Evaluation, Reject,
# Shutdown, Chunk) over tests/fuzz/corpus_control, and `make fuzz-reassembly` the transport's
# reassembly of chunked messages over tests/fuzz/corpus_reassembly, the same way (their corpora
# are replayed by `make test`: test_fuzz_control). What libFuzzer finds goes to
# $(FUZZ_BUILD_DIR)/corpus*; a crash is written to the current folder (crash-<sha1>): add it to
# the target's corpus folder once fixed.
FUZZ_SECONDS ?= 60
FUZZ_RSS_MB ?= 2048
FUZZ_MALLOC_MB ?= 256
FUZZ_BUILD_DIR ?= build-fuzz
FUZZ_FLAGS = -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=$(FUZZ_RSS_MB) -malloc_limit_mb=$(FUZZ_MALLOC_MB)
fuzz-configure: bootstrap
	@if [ ! -f $(FUZZ_BUILD_DIR)/build.ninja ]; then cmake --preset fuzz -B $(FUZZ_BUILD_DIR); fi
fuzz: fuzz-configure
	cmake --build $(FUZZ_BUILD_DIR) -j $(JOBS) --target starling-fuzz-decode
	mkdir -p $(FUZZ_BUILD_DIR)/corpus
	$(FUZZ_BUILD_DIR)/bin/starling-fuzz-decode $(FUZZ_FLAGS) $(FUZZ_BUILD_DIR)/corpus tests/fuzz/corpus
fuzz-control: fuzz-configure
	cmake --build $(FUZZ_BUILD_DIR) -j $(JOBS) --target starling-fuzz-control
	mkdir -p $(FUZZ_BUILD_DIR)/corpus_control
	$(FUZZ_BUILD_DIR)/bin/starling-fuzz-control $(FUZZ_FLAGS) $(FUZZ_BUILD_DIR)/corpus_control tests/fuzz/corpus_control
fuzz-reassembly: fuzz-configure
	cmake --build $(FUZZ_BUILD_DIR) -j $(JOBS) --target starling-fuzz-reassembly
	mkdir -p $(FUZZ_BUILD_DIR)/corpus_reassembly
	$(FUZZ_BUILD_DIR)/bin/starling-fuzz-reassembly $(FUZZ_FLAGS) $(FUZZ_BUILD_DIR)/corpus_reassembly \
	  tests/fuzz/corpus_reassembly

# GPU (docs/gpu.md). `make gpu-check` runs on a machine with a GPU and PyTorch: it builds against
# that PyTorch's LibTorch in a fresh build-gpu/, runs `ctest -L gpu` and the GPU benchmarks, and
# writes build-gpu/gpu-check.json (or $$OUT/gpu-check.json). It needs no Debian package there when
# `make gpu-deps` was run on this machine first and .gpu-deps/ travels with the tree.
gpu-deps:
	bash scripts/gpu-deps.sh
gpu-check:
	bash scripts/gpu-check.sh

# Everything that compiles or links against LibTorch or the CUDA module (the target
# starling-torch-dependent), against a current CUDA-enabled LibTorch (a PyTorch wheel from PyPI,
# installed by scripts/torch-wheel.sh into ~/.cache/starling, never into the tree), in
# build-torch2/, and the LibTorch-dependent tests with it: API drift between LibTorch 1.13 and
# 2.x and every CUDA-only code path are compiled and linked without a GPU (the GPU tests report
# Skipped). .ci/run runs it.
TORCH2_BUILD_DIR ?= build-torch2
torch-wheel:
	bash scripts/torch-wheel.sh
build-torch2: bootstrap
	TORCH2_BUILD_DIR=$(TORCH2_BUILD_DIR) JOBS=$(JOBS) bash scripts/build-torch2.sh
test-torch2: bootstrap
	TORCH2_BUILD_DIR=$(TORCH2_BUILD_DIR) JOBS=$(JOBS) bash scripts/build-torch2.sh --test

clean:
	rm -rf $(BUILD_DIR) build-debug build-fuzz build-arm64 build-gpu $(TORCH2_BUILD_DIR)
