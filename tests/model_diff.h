#pragma once
// How far two models are apart: the largest |a - b| and the largest |a|, for checks of the form
// diff <= tolerance * scale. Sizes must agree (std::invalid_argument otherwise).
#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>

namespace starling::testing {

struct ModelDiff {
  double diff = 0, scale = 0;
};

inline ModelDiff modelDiff(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) throw std::invalid_argument("modelDiff: the models differ in size");
  ModelDiff d;
  for (size_t i = 0; i < a.size(); ++i) {
    d.diff = std::max(d.diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    d.scale = std::max(d.scale, std::fabs(static_cast<double>(a[i])));
  }
  return d;
}

}  // namespace starling::testing
