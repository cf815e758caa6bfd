#include "data/idx.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <tuple>

#include "core/error.h"
#include "data/gz_file.h"

namespace starling::data {
namespace {

using detail::GzFile;
using detail::kReadChunk;

constexpr uint8_t kUByte = 0x08, kSByte = 0x09, kInt16 = 0x0B, kInt32 = 0x0C, kFloat32 = 0x0D,
                  kFloat64 = 0x0E;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

uint64_t be64(const uint8_t* p) { return (uint64_t{be32(p)} << 32) | be32(p + 4); }

// Bytes per value of an IDX type code; 0 for a code that is none.
size_t typeSize(uint8_t type) {
  switch (type) {
    case kUByte:
    case kSByte:
      return 1;
    case kInt16:
      return 2;
    case kInt32:
    case kFloat32:
      return 4;
    case kFloat64:
      return 8;
    default:
      return 0;
  }
}

std::string dimsText(const std::vector<uint64_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(dims[i]);
  }
  return s;
}

struct Header {
  uint8_t type = 0;
  size_t value_size = 0;
  std::vector<uint64_t> dims;  // dims[0] = examples
};

constexpr const char* kFormatHint =
    "an IDX file starts with two zero bytes, a type code (0x08 unsigned byte, 0x09 signed byte, "
    "0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64) and the number of dimensions";

// Reads and checks the magic number and the sizes. The magic number is read on its own, so a
// short file of the wrong kind is named as such.
Header readHeader(GzFile& f, bool labels) {
  uint8_t m[4];
  f.readExactly(m, 4, "the IDX magic number");
  const uint32_t magic = be32(m);
  Header h;
  h.type = m[2];
  h.value_size = typeSize(h.type);
  const uint32_t nd = m[3];
  const char* kind = labels ? "a label file (1 dimension, integers)"
                            : "a features file (2 or more dimensions: examples x features)";
  if (m[0] != 0 || m[1] != 0 || h.value_size == 0 || nd == 0) {
    std::string hint;
    if ((magic >> 16) == 0x1f8b)
      hint = "; this looks like a gzip stream that is itself gzip-compressed";
    STARLING_THROW(IoError, f.path(), ": wrong magic number ", hex32(magic), ", expected ", kind,
                   ": ", kFormatHint, hint);
  }
  if (labels && nd != 1)
    STARLING_THROW(IoError, f.path(), ": wrong magic number ", hex32(magic), " (", nd,
                   " dimensions), expected ", kind, "; this is an image file, not a label file");
  if (labels && (h.type == kFloat32 || h.type == kFloat64))
    STARLING_THROW(IoError, f.path(), ": wrong magic number ", hex32(magic),
                   " (floating-point values), expected ", kind);
  if (!labels && nd == 1)
    STARLING_THROW(IoError, f.path(), ": wrong magic number ", hex32(magic),
                   " (1 dimension), expected ", kind,
                   "; this is a label file (store one feature per example as n x 1)");
  if (nd > kMaxIdxDims)
    STARLING_THROW(IoError, f.path(), ": the header announces ", nd,
                   " dimensions, more than the limit of ", kMaxIdxDims);
  uint8_t sizes[4 * kMaxIdxDims];
  f.readExactly(sizes, 4 * nd,
                labels ? "the rest of the IDX label header" : "the rest of the IDX image header");
  for (uint32_t i = 0; i < nd; ++i) h.dims.push_back(be32(sizes + 4 * i));
  return h;
}

// Reads exactly n bytes (n already checked against the limits) into a vector that grows only as
// bytes arrive, so a header that lies about n costs no memory.
std::vector<uint8_t> readBody(GzFile& f, uint64_t n, const std::string& what) {
  std::vector<uint8_t> out;
  while (out.size() < n) {
    const size_t old = out.size();
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kReadChunk, n - old));
    out.resize(old + want);
    const size_t got = f.read(out.data() + old, want);
    if (got < want) f.truncated(old + got, n, what);
  }
  return out;
}

// Value i of a body of the given type, as a double (exact for every type but float64).
double valueAt(const std::vector<uint8_t>& raw, uint8_t type, size_t i) {
  switch (type) {
    case kUByte:
      return raw[i];
    case kSByte:
      return static_cast<int8_t>(raw[i]);
    case kInt16:
      return static_cast<int16_t>((uint16_t{raw[2 * i]} << 8) | raw[2 * i + 1]);
    case kInt32:
      return static_cast<int32_t>(be32(&raw[4 * i]));
    case kFloat32: {
      const uint32_t bits = be32(&raw[4 * i]);
      float v;
      std::memcpy(&v, &bits, sizeof v);
      return v;
    }
    default: {
      const uint64_t bits = be64(&raw[8 * i]);
      double v;
      std::memcpy(&v, &bits, sizeof v);
      return v;
    }
  }
}

// rows x cols of an example of the given dimensions (docs of Dataset::shape).
std::pair<size_t, size_t> imageShape(const std::vector<size_t>& shape) {
  std::vector<size_t> kept;
  size_t all = 1;
  for (size_t d : shape) {
    all *= d;
    if (d != 1) kept.push_back(d);
  }
  if (kept.size() == 2) return {kept[0], kept[1]};
  return {1, all};
}

}  // namespace

namespace {

// Both files opened and both headers read and checked: every size is checked before any body byte
// is read.
struct Opened {
  GzFile img, lbl;
  Header ih, lh;
  uint64_t n = 0, features = 0, values = 0;
  std::vector<uint64_t> example;
  Opened(const std::string& images_path, const std::string& labels_path, const IdxOptions& options)
      : img(images_path), lbl(labels_path) {
    STARLING_CHECK_ARG(options.num_classes <= 256, "loadIdx: num_classes ", options.num_classes,
                       " is more than 256 (labels are bytes)");
    STARLING_CHECK_ARG(options.max_pixels <= kMaxIdxPixels, "loadIdx: max_pixels ",
                       options.max_pixels, " is over the limit ", kMaxIdxPixels);
    ih = readHeader(img, false);
    lh = readHeader(lbl, true);
    n = ih.dims[0];
    const uint64_t n_labels = lh.dims[0];
    example.assign(ih.dims.begin() + 1, ih.dims.end());
    if (n == 0) STARLING_THROW(IoError, images_path, ": the header announces 0 images");
    // Each size is < 2^32 and the product is checked against the limit after every factor, so it
    // cannot overflow 64 bits; n * features is checked by division.
    features = 1;
    for (uint64_t d : example) {
      if (d == 0)
        STARLING_THROW(IoError, images_path, ": the header announces images of ", dimsText(example),
                       " pixels");
      features *= d;
      if (features > kMaxIdxFeatures)
        STARLING_THROW(IoError, images_path, ": the header announces images of ", dimsText(example),
                       ", more than the limit of ", kMaxIdxFeatures, " values each");
    }
    if (n > options.max_pixels / features)
      STARLING_THROW(IoError, images_path, ": the header announces ", n, " images of ",
                     dimsText(example), ", more than the limit of ", options.max_pixels,
                     " values in all");
    values = n * features;
    if (values > std::numeric_limits<size_t>::max() / 8)
      STARLING_THROW(IoError, images_path, ": ", values,
                     " values do not fit this machine's address space");
    if (n_labels != n)
      STARLING_THROW(IoError, images_path, " announces ", n, " images but ", labels_path,
                     " announces ", n_labels, " labels");
  }

  // Reads and checks every label; sets d's labels, num_classes and shape.
  void readLabels(Dataset& d, const IdxOptions& options) {
    const std::vector<uint8_t> raw_labels =
        readBody(lbl, n * lh.value_size, std::to_string(n) + " labels");
    lbl.expectEnd(n * lh.value_size);
    d.labels.resize(static_cast<size_t>(n));
    for (size_t i = 0; i < d.labels.size(); ++i) {
      const auto y = static_cast<int64_t>(valueAt(raw_labels, lh.type, i));  // integers: exact
      if (y < 0)
        STARLING_THROW(IoError, lbl.path(), ": label ", y, " of example ", i, " is negative");
      if (options.num_classes != 0 && y >= options.num_classes)
        STARLING_THROW(IoError, lbl.path(), ": label ", y, " of example ", i,
                       " is not below the number of classes, ", options.num_classes);
      if (y > 255)
        STARLING_THROW(IoError, lbl.path(), ": label ", y, " of example ", i,
                       " is above 255 (labels are bytes: at most 256 classes)");
      d.labels[i] = static_cast<uint8_t>(y);
    }
    const uint8_t top = *std::max_element(d.labels.begin(), d.labels.end());
    d.num_classes = options.num_classes != 0 ? options.num_classes : uint32_t{top} + 1;
    d.shape.assign(example.begin(), example.end());
    std::tie(d.rows, d.cols) = imageShape(d.shape);
  }

  // Converts `count` values of a raw body (starting at raw[first value]) into out; `base` is the
  // index of the first value in the whole file, for messages.
  void convert(const std::vector<uint8_t>& raw, size_t first, size_t count, float* out,
               uint64_t base) {
    if (ih.type == kUByte) {
      for (size_t i = 0; i < count; ++i) out[i] = static_cast<float>(raw[first + i]) / 255.0f;
      return;
    }
    for (size_t i = 0; i < count; ++i) {
      const double v = valueAt(raw, ih.type, first + i);
      if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<float>::max())
        STARLING_THROW(IoError, img.path(), ": value ", v, " (example ", (base + i) / features,
                       ", feature ", (base + i) % features, ") is not a finite float");
      out[i] = static_cast<float>(v);
    }
  }
};

}  // namespace

Dataset loadIdx(const std::string& images_path, const std::string& labels_path,
                const IdxOptions& options) {
  Opened f(images_path, labels_path, options);
  std::vector<uint8_t> raw =
      readBody(f.img, f.values * f.ih.value_size, std::to_string(f.n) + " images");
  f.img.expectEnd(f.values * f.ih.value_size);
  Dataset d;
  f.readLabels(d, options);
  if (options.keep_bytes && f.ih.type == kUByte) {
    d.pixels = std::move(raw);  // the body is the values, one byte each
    return d;
  }
  d.images.resize(static_cast<size_t>(f.values));  // now backed by bytes really read
  f.convert(raw, 0, d.images.size(), d.images.data(), 0);
  return d;
}

std::vector<size_t> subsetPositions(const std::vector<size_t>& picks) {
  std::vector<size_t> kept(picks);
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  std::vector<size_t> at(picks.size());
  for (size_t i = 0; i < picks.size(); ++i)
    at[i] =
        static_cast<size_t>(std::lower_bound(kept.begin(), kept.end(), picks[i]) - kept.begin());
  return at;
}

Dataset loadIdxSubset(const std::string& images_path, const std::string& labels_path,
                      const ExampleSelector& select, const IdxOptions& options) {
  STARLING_CHECK_ARG(static_cast<bool>(select), "loadIdxSubset: no selector");
  Opened f(images_path, labels_path, options);
  Dataset all;  // the labels only
  f.readLabels(all, options);
  std::vector<bool> keep(static_cast<size_t>(f.n), false);
  for (size_t i : select(all.labels, all.num_classes)) {
    STARLING_CHECK_ARG(i < keep.size(), "loadIdxSubset: example ", i, " picked from a file of ",
                       f.n);
    keep[i] = true;
  }
  Dataset d;
  d.num_classes = all.num_classes;
  d.shape = all.shape;
  d.rows = all.rows;
  d.cols = all.cols;
  const size_t kept = static_cast<size_t>(std::count(keep.begin(), keep.end(), true));
  d.labels.reserve(kept);
  d.images.resize(kept * static_cast<size_t>(f.features));
  // The images in blocks of whole rows: only kept rows are converted, the buffer is reused.
  const size_t row_bytes = static_cast<size_t>(f.features * f.ih.value_size);
  const size_t rows_per_block = std::max<size_t>(1, kReadChunk / row_bytes);
  std::vector<uint8_t> buf;
  size_t out = 0;
  for (size_t first = 0; first < keep.size(); first += rows_per_block) {
    const size_t rows = std::min(rows_per_block, keep.size() - first);
    buf.resize(rows * row_bytes);
    const size_t got = f.img.read(buf.data(), buf.size());
    if (got < buf.size())
      f.img.truncated(first * row_bytes + got, f.values * f.ih.value_size,
                      std::to_string(f.n) + " images");
    for (size_t r = 0; r < rows; ++r) {
      if (!keep[first + r]) continue;
      f.convert(buf, r * static_cast<size_t>(f.features), static_cast<size_t>(f.features),
                d.images.data() + out * f.features, (first + r) * f.features);
      d.labels.push_back(all.labels[first + r]);
      ++out;
    }
  }
  f.img.expectEnd(f.values * f.ih.value_size);
  return d;
}

Dataset loadIdxShape(const std::string& images_path, const std::string& labels_path,
                     const IdxOptions& options) {
  Opened f(images_path, labels_path, options);
  Dataset d;
  f.readLabels(d, options);
  d.labels.clear();
  d.labels.shrink_to_fit();
  return d;
}

namespace {

// The split's two files in `dir` (.gz or unpacked), or an IoError that says how to get them.
std::pair<std::string, std::string> fashionMnistFiles(const std::string& dir,
                                                      const std::string& split) {
  STARLING_CHECK_ARG(split == "train" || split == "t10k", "loadFashionMnist: split '", split,
                     "' is neither 'train' nor 't10k'");
  const auto find = [&](const std::string& base) {
    const std::filesystem::path p = std::filesystem::path(dir) / base;
    std::error_code ec;
    for (const auto& candidate : {p.string() + ".gz", p.string()})
      if (std::filesystem::exists(candidate, ec)) return candidate;
    STARLING_THROW(
        IoError, "Fashion-MNIST not found: ",
        std::filesystem::is_directory(dir, ec) ? "" : "folder " + dir + " does not exist, ",
        p.string(),
        ".gz does not exist. Install the Debian package dataset-fashion-mnist (it puts the files "
        "in ",
        kDefaultFashionMnistDir, "), or pass --data-dir with the folder that holds ", base, ".gz");
  };
  return {find(split + "-images-idx3-ubyte"), find(split + "-labels-idx1-ubyte")};
}

Dataset checkedFashionMnist(Dataset d, const std::string& images) {
  if (d.rows != 28 || d.cols != 28 || d.shape.size() != 2)
    STARLING_THROW(IoError, images, ": Fashion-MNIST images are 28x28, this file holds ", d.rows,
                   "x", d.cols);
  return d;
}

}  // namespace

Dataset loadFashionMnist(const std::string& dir, const std::string& split) {
  const auto [images, labels] = fashionMnistFiles(dir, split);
  return checkedFashionMnist(loadIdx(images, labels, IdxOptions{.num_classes = 10}), images);
}

Dataset loadFashionMnistSubset(const std::string& dir, const std::string& split,
                               const ExampleSelector& select) {
  const auto [images, labels] = fashionMnistFiles(dir, split);
  return checkedFashionMnist(loadIdxSubset(images, labels, select, IdxOptions{.num_classes = 10}),
                             images);
}

}  // namespace starling::data
