#pragma once
// Small synthetic data sets for trainer tests.
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "client/trainer.h"
#include "core/aligned.h"
#include "core/rng.h"
#include "data/idx.h"

namespace starling::testing {

// n values drawn scale x N(0, 1) from the test stream (seed, tag), in a 64-byte-aligned buffer
// (what the Eigen models take).
inline AlignedVector<float> normalFloats(size_t n, double scale, uint64_t seed, uint64_t tag) {
  RngStream r(StreamKey{seed, 0, 0, StreamPurpose::kTest, tag});
  AlignedVector<float> v(n);
  for (float& x : v) x = static_cast<float>(scale * r.normal());
  return v;
}

// The value of metric `name` of a fit, or NaN (which fails any comparison) when it is missing.
inline double fitMetric(const client::FitResult& r, const std::string& name) {
  for (const auto& m : r.metrics)
    if (m.name == name) return m.value;
  return std::numeric_limits<double>::quiet_NaN();
}

// n examples of `features` values (a 1 x features "image"), drawn N(0, 1), labels uniform.
inline data::Dataset gaussianData(size_t n, size_t features, uint32_t classes, uint64_t seed) {
  RngStream r(StreamKey{seed, 0, 0, StreamPurpose::kTest, 0});
  data::Dataset d;
  d.rows = 1;
  d.cols = features;
  d.num_classes = classes;
  for (size_t i = 0; i < n * features; ++i) d.images.push_back(static_cast<float>(r.normal()));
  for (size_t i = 0; i < n; ++i) d.labels.push_back(static_cast<uint8_t>(r.below(classes)));
  return d;
}

// Linearly separable: class c sits around 3 * e_c (features >= classes), noise N(0, 0.5^2).
inline data::Dataset separableData(size_t n, size_t features, uint32_t classes, uint64_t seed) {
  RngStream r(StreamKey{seed, 0, 0, StreamPurpose::kTest, 1});
  data::Dataset d;
  d.rows = 1;
  d.cols = features;
  d.num_classes = classes;
  for (size_t i = 0; i < n; ++i) {
    const auto y = static_cast<uint8_t>(i % classes);
    d.labels.push_back(y);
    for (size_t f = 0; f < features; ++f)
      d.images.push_back(static_cast<float>((f == y ? 3.0 : 0.0) + 0.5 * r.normal()));
  }
  return d;
}

inline std::vector<size_t> allIndices(const data::Dataset& d) {
  std::vector<size_t> idx(d.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  return idx;
}

}  // namespace starling::testing
