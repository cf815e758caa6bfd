#pragma once
// How a flat buffer of n elements is split among `size` workers: rank r's shard is
// shardRange(n, r, size), contiguous, in rank order, covering [0, n) exactly once; the first
// n % size ranks get one element more. The simulator's collectives (reduce-scatter, all-gather)
// and the round engine's sharded server step use this one definition.
#include <algorithm>
#include <cstddef>
#include <utility>

#include "core/error.h"

namespace starling {

inline std::pair<size_t, size_t> shardRange(size_t n, int rank, int size) {
  STARLING_CHECK_ARG(size > 0 && rank >= 0 && rank < size, "shardRange: rank ", rank,
                     " is not in a group of size ", size);
  const size_t w = static_cast<size_t>(size), r = static_cast<size_t>(rank);
  const size_t base = n / w, extra = n % w;
  const size_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

}  // namespace starling
