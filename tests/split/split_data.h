#pragma once
// Small image data for the split tests (tests/split/): no LibTorch, no data files.
#include <cstddef>
#include <cstdint>

#include "core/rng.h"
#include "data/idx.h"

namespace starling::testing {

// 4 classes of 8x8 images, each class a bright quadrant plus noise.
inline data::Dataset quadrants(size_t n, uint64_t seed) {
  data::Dataset d;
  d.rows = d.cols = 8;
  d.num_classes = 4;
  RngStream rng(StreamKey{seed, 0, 0, StreamPurpose::kTest, 0});
  for (size_t i = 0; i < n; ++i) {
    const uint8_t label = static_cast<uint8_t>(i % 4);
    d.labels.push_back(label);
    for (size_t r = 0; r < 8; ++r)
      for (size_t c = 0; c < 8; ++c) {
        const bool lit = (r < 4) == (label < 2) && (c < 4) == (label % 2 == 0);
        d.images.push_back((lit ? 1.0f : 0.0f) + 0.2f * static_cast<float>(rng.normal()));
      }
  }
  return d;
}

}  // namespace starling::testing
