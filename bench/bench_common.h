#pragma once
// Shared inputs and naming for starling-bench. Inputs are generated once per size from a fixed
// seed; every benchmark is single-threaded.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

namespace starling::bench {

// Seeded normal floats of length n, cached.
const std::vector<float>& input(size_t n);
std::string sizeName(size_t n);  // "1M", "25M"

// The reference set: memcpy of n floats, registered once per size.
void registerMemcpy(size_t n);

void registerCompressionBenchmarks();
void registerAggregationBenchmarks();
void registerClientFitBenchmarks();
#ifdef STARLING_BENCH_TORCH
void registerTorchReferences();
#endif

}  // namespace starling::bench
