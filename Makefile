# The two commands a newcomer runs: `make demo` and `make test`. Each does its own set-up.
BUILD_DIR ?= build
JOBS ?= 2

.PHONY: all bootstrap configure build test demo bench fuzz clean

all: build

bootstrap:
	@bash scripts/bootstrap.sh

configure: bootstrap
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then cmake --preset default; fi

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

demo: build
	$(BUILD_DIR)/bin/starling-demo

bench: build
	$(BUILD_DIR)/bin/starling-bench --benchmark_format=json --benchmark_out=$(BUILD_DIR)/bench.json

# Runs the decoder fuzzer for FUZZ_SECONDS (default 60) over tests/fuzz/corpus.
FUZZ_SECONDS ?= 60
fuzz: bootstrap
	@if [ ! -f build-fuzz/build.ninja ]; then cmake --preset fuzz; fi
	cmake --build build-fuzz -j $(JOBS)
	mkdir -p build-fuzz/corpus
	build-fuzz/bin/starling-fuzz-decode -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus tests/fuzz/corpus

clean:
	rm -rf $(BUILD_DIR) build-debug build-fuzz
