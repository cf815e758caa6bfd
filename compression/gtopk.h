#pragma once
// gTop-k merge (Shi et al., ICDCS'19): the building block for summing sparse updates up a tree
// in O(k log P) traffic instead of O(kP). Two sparse sets are summed (indices in both add), the
// top-k of the sum by magnitude is kept (ties to the lower index) and everything else is returned
// as `dropped`, so that kept + dropped == a + b exactly and the caller can feed the dropped mass
// back into its residual.
#include "compression/payload.h"

namespace starling::compression {

struct MergeResult {
  Sparse kept;     // ascending indices, at most k entries
  Sparse dropped;  // ascending indices, the rest of the sum
};

// a and b must have strictly increasing indices (as validatePayload checks).
MergeResult gtopkMerge(const Sparse& a, const Sparse& b, size_t k);

// Sum of two sparse sets (union of indices), ascending.
Sparse sparseAdd(const Sparse& a, const Sparse& b);

}  // namespace starling::compression
