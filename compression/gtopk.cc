#include "compression/gtopk.h"

#include "compression/topk_select.h"
#include "core/error.h"

namespace starling::compression {

Sparse sparseAdd(const Sparse& a, const Sparse& b) {
  STARLING_CHECK_ARG(a.indices.size() == a.values.size() && b.indices.size() == b.values.size(),
                     "sparseAdd: indices and values differ in length");
  Sparse s;
  s.indices.reserve(a.indices.size() + b.indices.size());
  s.values.reserve(a.indices.size() + b.indices.size());
  size_t i = 0, j = 0;
  while (i < a.indices.size() || j < b.indices.size()) {
    if (j == b.indices.size() || (i < a.indices.size() && a.indices[i] < b.indices[j])) {
      s.indices.push_back(a.indices[i]);
      s.values.push_back(a.values[i++]);
    } else if (i == a.indices.size() || b.indices[j] < a.indices[i]) {
      s.indices.push_back(b.indices[j]);
      s.values.push_back(b.values[j++]);
    } else {
      s.indices.push_back(a.indices[i]);
      s.values.push_back(a.values[i++] + b.values[j++]);
    }
    STARLING_CHECK_ARG(s.indices.size() < 2 || s.indices[s.indices.size() - 2] < s.indices.back(),
                       "sparseAdd: input indices are not strictly increasing");
  }
  return s;
}

MergeResult gtopkMerge(const Sparse& a, const Sparse& b, size_t k) {
  MergeResult r;
  Sparse sum = sparseAdd(a, b);
  if (sum.indices.size() <= k) {
    r.kept = std::move(sum);
    return r;
  }
  // Positions in `sum` are in index order, so selectTopK's tie-break by position is by index.
  std::vector<uint32_t> pos;
  selectTopK(sum.values, k, pos);
  r.kept.indices.reserve(k);
  r.kept.values.reserve(k);
  r.dropped.indices.reserve(sum.indices.size() - k);
  r.dropped.values.reserve(sum.indices.size() - k);
  size_t next = 0;
  for (size_t i = 0; i < sum.indices.size(); ++i) {
    Sparse& dst = (next < pos.size() && pos[next] == i) ? r.kept : r.dropped;
    if (&dst == &r.kept) ++next;
    dst.indices.push_back(sum.indices[i]);
    dst.values.push_back(sum.values[i]);
  }
  return r;
}

}  // namespace starling::compression
