# The two commands a newcomer runs: `make demo` and `make test`. Each does its own set-up.
BUILD_DIR ?= build
JOBS ?= 2

.PHONY: all bootstrap configure build test test-asan demo bench fuzz clean

all: build

bootstrap:
	@bash scripts/bootstrap.sh

configure: bootstrap
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then cmake --preset default; fi

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# The whole suite once more under AddressSanitizer + UBSan (the `debug` preset, build-debug/).
# scripts/test-asan.sh configures if needed, builds and runs ctest; it explains its sanitizer
# settings, which apply to that run only.
test-asan: bootstrap
	JOBS=$(JOBS) bash scripts/test-asan.sh

demo: build
	$(BUILD_DIR)/bin/starling-demo

bench: build
	$(BUILD_DIR)/bin/starling-bench --benchmark_format=json --benchmark_out=$(BUILD_DIR)/bench.json

# Runs the server-path fuzzer (decode, validate, aggregate) for FUZZ_SECONDS (default 60) over
# tests/fuzz/corpus, under memory limits: decoding must cost memory linear in the message, so a
# malloc over FUZZ_MALLOC_MB or an RSS over FUZZ_RSS_MB is a finding.
FUZZ_SECONDS ?= 60
FUZZ_RSS_MB ?= 2048
FUZZ_MALLOC_MB ?= 256
fuzz: bootstrap
	@if [ ! -f build-fuzz/build.ninja ]; then cmake --preset fuzz; fi
	cmake --build build-fuzz -j $(JOBS) --target starling-fuzz-decode
	mkdir -p build-fuzz/corpus
	build-fuzz/bin/starling-fuzz-decode -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=$(FUZZ_RSS_MB) \
	  -malloc_limit_mb=$(FUZZ_MALLOC_MB) build-fuzz/corpus tests/fuzz/corpus

clean:
	rm -rf $(BUILD_DIR) build-debug build-fuzz
