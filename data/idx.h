#pragma once
// Labelled image data sets in the IDX format (LeCun's MNIST files, Fashion-MNIST): an image file
// (magic 0x00000803: unsigned bytes, 3 dimensions n x rows x cols) and a label file (magic
// 0x00000801: unsigned bytes, n labels). Either file may be gzip-compressed or plain; the loader
// tells them apart by content, not by name.
//
// Files are input a user points the program at, so they are checked like any other untrusted
// input: every fault is an IoError naming the file and the problem (missing, corrupt or
// truncated gzip, wrong magic, a header whose sizes disagree with the bytes that follow, image
// and label counts that differ, a label out of range, dimensions past the limits below). Memory
// grows only with bytes actually read, never with what a header claims, so a lying header costs
// no more memory than the file really holds.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace starling::data {

inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Limits on what a header may announce; past them a file is rejected before anything is read.
inline constexpr uint64_t kMaxIdxFeatures = uint64_t{1} << 24;  // rows * cols (4096 x 4096)
inline constexpr uint64_t kMaxIdxPixels = uint64_t{1} << 31;    // n * rows * cols (8 GiB as floats)

// A labelled image set held in memory. Example i has the features images[i * features(), ...
// (i + 1) * features()) (row-major rows x cols pixels) and the label labels[i] < num_classes.
struct Dataset {
  size_t rows = 0, cols = 0;    // each image is rows x cols
  std::vector<float> images;    // size() * features() values, pixel / 255, in [0, 1]
  std::vector<uint8_t> labels;  // size() values, each < num_classes
  uint32_t num_classes = 0;     // at most 256

  size_t size() const { return labels.size(); }
  size_t features() const { return rows * cols; }
};

struct IdxOptions {
  // 0: num_classes = largest label + 1. Otherwise the number of classes the data set is known to
  // have (10 for Fashion-MNIST): a label >= it is an IoError, and num_classes is this value even
  // when the file happens to lack the highest classes (a small test split). At most 256.
  uint32_t num_classes = 0;
  // Largest n * rows * cols accepted, <= kMaxIdxPixels.
  uint64_t max_pixels = kMaxIdxPixels;
};

// Loads an image file and its label file (each gzip or plain). The header of each file must
// match its size exactly and both must hold the same, non-zero number of examples.
// Throws IoError (with the path) for a bad file, InvalidArgument for bad options.
Dataset loadIdx(const std::string& images_path, const std::string& labels_path,
                const IdxOptions& options = {});

// Loads one split ("train" or "t10k") of Fashion-MNIST from `dir`, which holds the files of the
// Debian package dataset-fashion-mnist: <split>-images-idx3-ubyte.gz and
// <split>-labels-idx1-ubyte.gz (unpacked copies without .gz are accepted too). 10 classes.
// A missing file is an IoError that says how to get the data.
Dataset loadFashionMnist(const std::string& dir, const std::string& split);

}  // namespace starling::data
