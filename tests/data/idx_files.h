#pragma once
// Test helpers: IDX files written byte by byte (plain or gzip) into a private temporary folder.
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace starling::testing {

// A fresh folder under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("starling-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void putBe32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

// The bytes of an IDX3 image file: header (magic, n, rows, cols) then the pixels as given.
inline std::vector<uint8_t> imageFileBytes(uint32_t n, uint32_t rows, uint32_t cols,
                                           const std::vector<uint8_t>& pixels,
                                           uint32_t magic = 0x00000803) {
  std::vector<uint8_t> out;
  putBe32(out, magic);
  putBe32(out, n);
  putBe32(out, rows);
  putBe32(out, cols);
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

// The bytes of an IDX1 label file: header (magic, n) then the labels as given.
inline std::vector<uint8_t> labelFileBytes(uint32_t n, const std::vector<uint8_t>& labels,
                                           uint32_t magic = 0x00000801) {
  std::vector<uint8_t> out;
  putBe32(out, magic);
  putBe32(out, n);
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

// The bytes of any IDX file: magic, one u32 per dimension, then the body as given.
inline std::vector<uint8_t> idxFileBytes(uint32_t magic, const std::vector<uint32_t>& dims,
                                         const std::vector<uint8_t>& body) {
  std::vector<uint8_t> out;
  putBe32(out, magic);
  for (uint32_t d : dims) putBe32(out, d);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

// Values as the big-endian bytes IDX stores (int16_t, int32_t, float, double, int8_t).
template <class T>
std::vector<uint8_t> bigEndianBytes(const std::vector<T>& values) {
  std::vector<uint8_t> out;
  for (T v : values) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    for (size_t i = 0; i < sizeof(T); ++i)
      out.push_back(std::endian::native == std::endian::little ? b[sizeof(T) - 1 - i] : b[i]);
  }
  return out;
}

inline void writePlain(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// gzip-compressed with zlib (as gzip(1) would write it).
inline std::vector<uint8_t> gzipBytes(const std::vector<uint8_t>& bytes) {
  z_stream s{};
  deflateInit2(&s, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // +16: gzip wrapper
  std::vector<uint8_t> out(deflateBound(&s, static_cast<uLong>(bytes.size())) + 64);
  s.next_in = const_cast<Bytef*>(bytes.data());
  s.avail_in = static_cast<uInt>(bytes.size());
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  deflate(&s, Z_FINISH);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

inline void writeGzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  writePlain(path, gzipBytes(bytes));
}

}  // namespace starling::testing
