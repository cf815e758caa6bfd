#pragma once
// Fashion-MNIST from the Debian package dataset-fashion-mnist (gzipped IDX files). Pixels are
// scaled to [0, 1]. Throws IoError with the path and what is wrong (missing file, bad magic,
// sizes that disagree).
#include <cstdint>
#include <string>
#include <vector>

namespace starling::examples {

inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct Dataset {
  size_t rows = 0, cols = 0;   // images are rows x cols
  std::vector<float> images;   // n x (rows * cols), row-major
  std::vector<uint8_t> labels; // n, in [0, 10)
  size_t size() const { return labels.size(); }
  size_t features() const { return rows * cols; }
};

// split: "train" or "t10k".
Dataset loadFashionMnist(const std::string& dir, const std::string& split);

}  // namespace starling::examples
