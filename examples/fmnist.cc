#include "examples/fmnist.h"

#include <zlib.h>

#include <memory>

#include "core/error.h"

namespace starling::examples {
namespace {

std::vector<uint8_t> readGz(const std::string& path) {
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f(gzopen(path.c_str(), "rb"), gzclose);
  if (!f)
    STARLING_THROW(IoError, "cannot open ", path,
                   " (install the Debian package dataset-fashion-mnist, or pass --data-dir)");
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  int n;
  while ((n = gzread(f.get(), buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  if (n < 0) STARLING_THROW(IoError, "cannot read ", path, ": corrupt gzip stream");
  return out;
}

uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) | b[at + 3];
}

}  // namespace

Dataset loadFashionMnist(const std::string& dir, const std::string& split) {
  const std::string img_path = dir + "/" + split + "-images-idx3-ubyte.gz";
  const std::string lbl_path = dir + "/" + split + "-labels-idx1-ubyte.gz";
  const auto img = readGz(img_path), lbl = readGz(lbl_path);
  if (img.size() < 16 || be32(img, 0) != 0x00000803) STARLING_THROW(IoError, img_path, ": not an IDX3 image file");
  if (lbl.size() < 8 || be32(lbl, 0) != 0x00000801) STARLING_THROW(IoError, lbl_path, ": not an IDX1 label file");
  Dataset d;
  const size_t n = be32(img, 4);
  d.rows = be32(img, 8);
  d.cols = be32(img, 12);
  if (be32(lbl, 4) != n) STARLING_THROW(IoError, split, ": ", n, " images but ", be32(lbl, 4), " labels");
  if (d.rows == 0 || d.cols == 0 || d.rows > 4096 || d.cols > 4096 || img.size() != 16 + n * d.rows * d.cols ||
      lbl.size() != 8 + n)
    STARLING_THROW(IoError, split, ": file sizes do not match the IDX headers");
  d.images.resize(n * d.features());
  for (size_t i = 0; i < d.images.size(); ++i) d.images[i] = static_cast<float>(img[16 + i]) / 255.0f;
  d.labels.assign(lbl.begin() + 8, lbl.end());
  for (uint8_t y : d.labels)
    if (y >= 10) STARLING_THROW(IoError, lbl_path, ": label ", int{y}, " outside [0, 10)");
  return d;
}

}  // namespace starling::examples
