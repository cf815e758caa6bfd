#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

#include "core/error.h"

namespace starling::data {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
constexpr size_t kChunk = size_t{1} << 16;     // read granularity: memory follows real bytes

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// One open IDX file, gzip or plain: zlib reads a file without a gzip header transparently.
// Every failure is an IoError that starts with the path.
class IdxFile {
 public:
  explicit IdxFile(std::string path) : path_(std::move(path)), f_(nullptr, gzclose) {
    std::error_code ec;
    const auto st = std::filesystem::status(path_, ec);
    if (!std::filesystem::exists(st)) STARLING_THROW(IoError, path_, ": no such file");
    if (std::filesystem::is_directory(st))
      STARLING_THROW(IoError, path_, ": is a directory, not an IDX file");
    errno = 0;
    f_.reset(gzopen(path_.c_str(), "rb"));
    if (!f_)
      STARLING_THROW(IoError, path_,
                     ": cannot open: ", errno ? std::strerror(errno) : "out of memory");
    gzbuffer(f_.get(), 1u << 17);  // fewer, larger reads; must precede the first read
  }

  const std::string& path() const { return path_; }

  // Reads up to n bytes; fewer only at the end of the data. A corrupt gzip stream throws; a
  // gzip stream cut short reads as an early end here and is reported by endState().
  size_t read(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      const unsigned want = static_cast<unsigned>(std::min<size_t>(n - got, kChunk));
      const int r = gzread(f_.get(), dst + got, want);
      if (r < 0) {
        int errnum = 0;
        const char* msg = gzerror(f_.get(), &errnum);
        if (errnum == Z_ERRNO)
          STARLING_THROW(IoError, path_, ": read failed: ", std::strerror(errno));
        STARLING_THROW(IoError, path_, ": corrupt gzip stream (zlib: ", zlibMessage(msg), ")");
      }
      got += static_cast<size_t>(r);
      offset_ += static_cast<uint64_t>(r);
      if (static_cast<unsigned>(r) < want) break;
    }
    return got;
  }

  // Why the data ended: "" after a complete file, otherwise the reason (a gzip stream without
  // its end, which zlib reports as Z_BUF_ERROR rather than as a read error).
  std::string endState() {
    int errnum = 0;
    const char* msg = gzerror(f_.get(), &errnum);
    if (errnum == Z_BUF_ERROR)
      return "the gzip stream is truncated (zlib: " + zlibMessage(msg) + ")";
    return {};
  }

  // Reads exactly n bytes or throws, naming `what` was being read.
  void readExactly(uint8_t* dst, size_t n, const std::string& what) {
    const size_t got = read(dst, n);
    if (got < n) truncated(got, n, what);
  }

  [[noreturn]] void truncated(uint64_t got, uint64_t need, const std::string& what) {
    const std::string why = endState();
    STARLING_THROW(IoError, path_, ": truncated: reading ", what, " needs ", need,
                   " bytes but only ", got, " remain (the data ends at byte ", offset_, ")",
                   why.empty() ? "" : "; ", why, "; the header does not match the file size");
  }

  // Checks that nothing follows the data the header announced.
  void expectEnd(uint64_t announced) {
    uint8_t probe[kChunk];
    uint64_t extra = 0;
    // Count what follows, up to a bound: a gzip bomb must not keep us here.
    for (size_t got; extra < (uint64_t{1} << 24) && (got = read(probe, sizeof probe)) > 0;)
      extra += got;
    if (extra > 0)
      STARLING_THROW(
          IoError, path_, ": ", extra >= (uint64_t{1} << 24) ? "at least " : "", extra,
          " bytes follow the ", announced,
          " bytes of data the header announces (the header does not match the file size)");
    const std::string why = endState();
    if (!why.empty()) STARLING_THROW(IoError, path_, ": ", why);
  }

 private:
  // gzerror() prefixes the path, which our messages already start with.
  std::string zlibMessage(const char* msg) const {
    std::string m = msg ? msg : "unknown error";
    const std::string prefix = path_ + ": ";
    if (m.compare(0, prefix.size(), prefix) == 0) m.erase(0, prefix.size());
    return m;
  }

  std::string path_;
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f_;
  uint64_t offset_ = 0;  // bytes read so far (after decompression)
};

// Reads exactly n bytes (n already checked against the limits) into a vector that grows only as
// bytes arrive, so a header that lies about n costs no memory.
std::vector<uint8_t> readBody(IdxFile& f, uint64_t n, const std::string& what) {
  std::vector<uint8_t> out;
  while (out.size() < n) {
    const size_t old = out.size();
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, n - old));
    out.resize(old + want);
    const size_t got = f.read(out.data() + old, want);
    if (got < want) f.truncated(old + got, n, what);
  }
  return out;
}

void checkMagic(const IdxFile& f, uint32_t magic, uint32_t expected) {
  if (magic == expected) return;
  const char* kind = expected == kImagesMagic ? "an IDX image file (unsigned bytes, 3 dimensions)"
                                              : "an IDX label file (unsigned bytes, 1 dimension)";
  std::string hint;
  if (magic == kImagesMagic) hint = "; this is an image file";
  if (magic == kLabelsMagic) hint = "; this is a label file";
  if ((magic >> 16) == 0x1f8b)
    hint = "; this looks like a gzip stream that is itself gzip-compressed";
  STARLING_THROW(IoError, f.path(), ": wrong magic number ", hex32(magic), ", expected ",
                 hex32(expected), " for ", kind, hint);
}

}  // namespace

Dataset loadIdx(const std::string& images_path, const std::string& labels_path,
                const IdxOptions& options) {
  STARLING_CHECK_ARG(options.num_classes <= 256, "loadIdx: num_classes ", options.num_classes,
                     " is more than 256 (labels are bytes)");
  STARLING_CHECK_ARG(options.max_pixels <= kMaxIdxPixels, "loadIdx: max_pixels ",
                     options.max_pixels, " is over the limit ", kMaxIdxPixels);
  IdxFile img(images_path), lbl(labels_path);

  // Both headers first: every size is checked before any body byte is read.
  // The magic number is read on its own, so a short file of the wrong kind is named as such.
  uint8_t ih[16], lh[8];
  img.readExactly(ih, 4, "the IDX magic number");
  checkMagic(img, be32(ih), kImagesMagic);
  img.readExactly(ih + 4, sizeof ih - 4, "the rest of the IDX image header");
  lbl.readExactly(lh, 4, "the IDX magic number");
  checkMagic(lbl, be32(lh), kLabelsMagic);
  lbl.readExactly(lh + 4, sizeof lh - 4, "the rest of the IDX label header");

  const uint64_t n = be32(ih + 4), rows = be32(ih + 8), cols = be32(ih + 12),
                 n_labels = be32(lh + 4);
  if (n == 0) STARLING_THROW(IoError, images_path, ": the header announces 0 images");
  if (rows == 0 || cols == 0)
    STARLING_THROW(IoError, images_path, ": the header announces images of ", rows, "x", cols,
                   " pixels");
  // rows, cols < 2^32, so rows * cols cannot overflow 64 bits; n * features is checked by division.
  const uint64_t features = rows * cols;
  if (features > kMaxIdxFeatures)
    STARLING_THROW(IoError, images_path, ": the header announces images of ", rows, "x", cols,
                   " = ", features, " pixels, more than the limit of ", kMaxIdxFeatures);
  if (n > options.max_pixels / features)
    STARLING_THROW(IoError, images_path, ": the header announces ", n, " images of ", rows, "x",
                   cols, ", more than the limit of ", options.max_pixels, " pixels in all");
  const uint64_t pixels = n * features;
  if (pixels > std::numeric_limits<size_t>::max() / sizeof(float))
    STARLING_THROW(IoError, images_path, ": ", pixels,
                   " pixels do not fit this machine's address space");
  if (n_labels != n)
    STARLING_THROW(IoError, images_path, " announces ", n, " images but ", labels_path,
                   " announces ", n_labels, " labels");

  const std::vector<uint8_t> raw = readBody(img, pixels, std::to_string(n) + " images");
  img.expectEnd(pixels);
  Dataset d;
  d.labels = readBody(lbl, n, std::to_string(n) + " labels");
  lbl.expectEnd(n);

  const uint8_t top = *std::max_element(d.labels.begin(), d.labels.end());
  if (options.num_classes != 0 && top >= options.num_classes) {
    const size_t at =
        static_cast<size_t>(std::find_if(d.labels.begin(), d.labels.end(),
                                         [&](uint8_t y) { return y >= options.num_classes; }) -
                            d.labels.begin());
    STARLING_THROW(IoError, labels_path, ": label ", int{d.labels[at]}, " of example ", at,
                   " is not below the number of classes, ", options.num_classes);
  }
  d.num_classes = options.num_classes != 0 ? options.num_classes : uint32_t{top} + 1;
  d.rows = static_cast<size_t>(rows);
  d.cols = static_cast<size_t>(cols);
  d.images.resize(static_cast<size_t>(pixels));  // now backed by bytes really read
  for (size_t i = 0; i < d.images.size(); ++i) d.images[i] = static_cast<float>(raw[i]) / 255.0f;
  return d;
}

Dataset loadFashionMnist(const std::string& dir, const std::string& split) {
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
  const std::string images = find(split + "-images-idx3-ubyte");
  const std::string labels = find(split + "-labels-idx1-ubyte");
  Dataset d = loadIdx(images, labels, IdxOptions{.num_classes = 10});
  if (d.rows != 28 || d.cols != 28)
    STARLING_THROW(IoError, images, ": Fashion-MNIST images are 28x28, this file holds ", d.rows,
                   "x", d.cols);
  return d;
}

}  // namespace starling::data
