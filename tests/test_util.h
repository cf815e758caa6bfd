#pragma once
// Helpers shared by the tests: layouts, seeded random vectors, dense decoding of whole updates.
#include <cmath>
#include <vector>

#include "compression/payload.h"
#include "core/param_layout.h"
#include "core/rng.h"

namespace starling::testing {

inline ParamLayout smallCnnLayout() {
  ParamLayout l;
  l.add("conv1.weight", {16, 1, 5, 5});
  l.add("conv1.bias", {16});
  l.add("fc1.weight", {64, 256});
  l.add("fc1.bias", {64});
  l.add("fc2.weight", {10, 64});
  l.add("fc2.bias", {10});
  return l;
}

inline std::vector<float> randomVector(size_t n, uint64_t seed, double scale = 1.0) {
  RngStream r(StreamKey{seed, 0, 0, StreamPurpose::kTest, 0});
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(r.normal() * scale);
  return v;
}

// Dense sum of all tensors' payloads, in layout order.
inline std::vector<float> densify(const ParamLayout& layout, const std::vector<compression::Payload>& payloads,
                                  const compression::SharedFactors* shared = nullptr) {
  std::vector<float> out(layout.numel());
  compression::densifyUpdate(layout, payloads, out, shared);
  return out;
}

inline double maxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

inline double norm2(const std::vector<float>& a) {
  double s = 0;
  for (float x : a) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

}  // namespace starling::testing
