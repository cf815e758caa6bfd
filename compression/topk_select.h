#pragma once
// Exact top-k selection by magnitude without a full sort (DGC / MSTopK style).
//
// The order is total: a before b iff |a| > |b|, or |a| == |b| and a's index is lower. The result
// is exactly the first k elements of that order, i.e. what a full sort would select, returned as
// ascending indices. A strided sample estimates a threshold a little below the k-th magnitude; one
// pass collects the candidates at or above it (a vectorised test of 16 values at a time, scalar
// work only where a block holds a candidate); nth_element on the candidates finishes the job. If
// the estimate misses (too few or far too many candidates), the threshold moves and the pass
// repeats; after a few misses the selection falls back to nth_element over everything.
#include <cstdint>
#include <span>
#include <vector>

namespace starling::compression {

struct TopKSelectStats {
  size_t passes = 0;      // candidate passes over the input
  size_t candidates = 0;  // candidates in the final pass
  bool fallback = false;  // exact selection over the whole input was needed
};

// Writes the k selected indices, ascending, into `out` (resized). `seed` only moves the sample's
// start; the selected set never depends on it. Requires x.size() < 2^32.
void selectTopK(std::span<const float> x, size_t k, std::vector<uint32_t>& out, uint64_t seed = 0,
                TopKSelectStats* stats = nullptr);

// Plain reference: full sort by the same order. O(n log n); for tests.
std::vector<uint32_t> selectTopKBySort(std::span<const float> x, size_t k);

}  // namespace starling::compression
