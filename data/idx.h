#pragma once
// Labelled data sets in the IDX format (LeCun's MNIST files, Fashion-MNIST, and any array the
// same way): a features file and a label file, each a big-endian header (magic 0x0000TTDD: two
// zero bytes, a type code TT and the number of dimensions DD, then DD sizes as u32) followed by the
// values, row-major.
//   features file: 2 or more dimensions, n x d1 x d2 ...; example i is the d1*d2*... values after
//                  the first i of them. Types 0x08 unsigned byte (scaled by 1/255 into [0, 1], as
//                  for MNIST pixels), 0x09 signed byte, 0x0B int16, 0x0C int32, 0x0D float32,
//                  0x0E float64 (taken as they are; floats must be finite and fit a float).
//   label file:    1 dimension, n; an integer type (0x08, 0x09, 0x0B, 0x0C) with values 0..255.
// Fashion-MNIST's files are 0x00000803 (unsigned bytes, n x 28 x 28) and 0x00000801.
// Either file may be gzip-compressed or plain; the loader tells them apart by content, not by
// name.
//
// Files are input a user points the program at, so they are checked like any other untrusted
// input: every fault is an IoError naming the file and the problem (missing, corrupt or
// truncated gzip, wrong magic, a header whose sizes disagree with the bytes that follow, example
// and label counts that differ, a label out of range, a non-finite value, dimensions past the
// limits below). Memory grows only with bytes actually read, never with what a header claims, so
// a lying header costs no more memory than the file really holds.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace starling::data {

inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Limits on what a header may announce; past them a file is rejected before anything is read.
inline constexpr uint64_t kMaxIdxFeatures = uint64_t{1} << 24;  // values per example (4096 x 4096)
inline constexpr uint64_t kMaxIdxPixels = uint64_t{1} << 31;    // values in all (8 GiB as floats)
inline constexpr uint32_t kMaxIdxDims = 8;                      // dimensions of a file, n included

// A labelled data set held in memory. Example i has the features images[i * features(), ...
// (i + 1) * features()) (row-major rows x cols "pixels") and the label labels[i] < num_classes.
// Models that need an image (the CNN) read rows x cols; the others only features().
struct Dataset {
  size_t rows = 0, cols = 0;  // each example is rows x cols values
  std::vector<float> images;  // size() * features() values (unsigned-byte IDX: pixel / 255)
  // Or, loaded with IdxOptions::keep_bytes from an unsigned-byte IDX file, the same values as
  // bytes (value = pixels[i] / 255.0f, exactly images' value), a quarter of the memory, and
  // `images` empty. Only the LibTorch trainer reads them; the Eigen trainers refuse such a set.
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> labels;  // size() values, each < num_classes
  uint32_t num_classes = 0;     // at most 256
  // Each example's dimensions as its file stores them (IDX: d1 x d2 ...; CSV: the feature count),
  // for messages; empty for a data set made in code. rows x cols is this shape with dimensions of
  // size 1 dropped when two remain, and 1 x features() otherwise.
  std::vector<size_t> shape;

  size_t size() const { return labels.size(); }
  size_t features() const { return rows * cols; }
  bool holdsBytes() const { return images.empty() && !pixels.empty(); }
};

struct IdxOptions {
  // 0: num_classes = largest label + 1. Otherwise the number of classes the data set is known to
  // have (10 for Fashion-MNIST): a label >= it is an IoError, and num_classes is this value even
  // when the file happens to lack the highest classes (a small test split). At most 256.
  uint32_t num_classes = 0;
  // Largest number of values (n * features) accepted, <= kMaxIdxPixels.
  uint64_t max_pixels = kMaxIdxPixels;
  // loadIdx: an unsigned-byte features file is kept as bytes in Dataset::pixels (the simulator:
  // 47 MB for Fashion-MNIST's training set instead of 188 MB of floats). Other value types, and
  // loadIdxSubset, give floats regardless.
  bool keep_bytes = false;
};

// Loads a features file and its label file (each gzip or plain). The header of each file must
// match its size exactly and both must hold the same, non-zero number of examples.
// Throws IoError (with the path) for a bad file, InvalidArgument for bad options.
Dataset loadIdx(const std::string& images_path, const std::string& labels_path,
                const IdxOptions& options = {});

// Loads one split ("train" or "t10k") of Fashion-MNIST from `dir`, which holds the files of the
// Debian package dataset-fashion-mnist: <split>-images-idx3-ubyte.gz and
// <split>-labels-idx1-ubyte.gz (unpacked copies without .gz are accepted too). 10 classes.
// A missing file is an IoError that says how to get the data.
Dataset loadFashionMnist(const std::string& dir, const std::string& split);

// Picks the examples to keep from the whole file's labels and number of classes: indices, any
// order, repeats allowed (they are kept once, in file order).
using ExampleSelector =
    std::function<std::vector<size_t>(const std::vector<uint8_t>& labels, uint32_t num_classes)>;

// loadIdx keeping only the examples `select` picks (a deployed client's shard): the labels are
// read first, then the images are streamed and only the kept rows converted, so memory is the kept
// examples plus a read buffer, never the whole file (a client once held all of
// Fashion-MNIST, 240 MB, to cut a tenth of it). The result holds the kept examples in file order;
// `num_classes` is the whole file's. Every check of loadIdx applies to the whole file (headers,
// sizes, labels, values of every example read); an index out of range is an InvalidArgument.
Dataset loadIdxSubset(const std::string& images_path, const std::string& labels_path,
                      const ExampleSelector& select, const IdxOptions& options = {});
Dataset loadFashionMnistSubset(const std::string& dir, const std::string& split,
                               const ExampleSelector& select);

// The shape and classes of an IDX pair without its examples: the images file's header and the
// whole label file, checked as loadIdx checks them; the images are not read. For a server that
// needs its clients' model shape, not their data.
Dataset loadIdxShape(const std::string& images_path, const std::string& labels_path,
                     const IdxOptions& options = {});

// Where each pick landed in the subset loadIdxSubset kept for `picks` (its distinct indices in
// file order): the view over the subset that names the same examples, in the same order and as
// often, as `picks` did over the whole file.
std::vector<size_t> subsetPositions(const std::vector<size_t>& picks);

}  // namespace starling::data
