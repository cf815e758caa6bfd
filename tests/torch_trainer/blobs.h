#pragma once
// Synthetic image classes for the LibTorch trainer's tests: class c is a bright 6x6 square at a
// position of its own on a noisy background, so a CNN separates them in a few epochs.
#include <cstdint>

#include "core/rng.h"
#include "data/idx.h"

namespace starling::testing {

inline data::Dataset blobImages(size_t n, size_t rows, size_t cols, uint32_t classes,
                                uint64_t seed) {
  RngStream r(StreamKey{seed, 0, 0, StreamPurpose::kTest, 2});
  data::Dataset d;
  d.rows = rows;
  d.cols = cols;
  d.num_classes = classes;
  d.images.resize(n * rows * cols);
  for (size_t i = 0; i < n; ++i) {
    const auto y = static_cast<uint32_t>(i % classes);
    d.labels.push_back(static_cast<uint8_t>(y));
    // Squares on a diagonal-ish grid: top-left corner of class y.
    const size_t r0 = (y * 7) % (rows - 6), c0 = (y * 11 + 3) % (cols - 6);
    float* img = d.images.data() + i * rows * cols;
    for (size_t p = 0; p < rows * cols; ++p) img[p] = 0.2f * r.uniformFloat();
    for (size_t a = 0; a < 6; ++a)
      for (size_t b = 0; b < 6; ++b) img[(r0 + a) * cols + (c0 + b)] += 0.8f;
  }
  return d;
}

}  // namespace starling::testing
