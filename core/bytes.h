#pragma once
// Little-endian, bounds-checked byte encoding for Starling's own binary formats (client state,
// server optimizer state, checkpoints). The byte order is fixed whatever the host's, so a blob
// written on x86_64 reads back on an arm64 edge device.
//
// ByteWriter appends to a caller-owned vector (reused across calls: clear() keeps the capacity).
// ByteReader reads from a span and throws IoError, naming `what` and the offset, on any read past
// the end or any count that cannot fit in what is left, before allocating anything for it.
#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace starling {

// FNV-1a over `b`, continuing from `h` (a checksum and a fingerprint for Starling's own files, not
// a MAC): fnv1a(b2, fnv1a(b1)) is the hash of b1 followed by b2.
inline uint64_t fnv1a(std::span<const uint8_t> b, uint64_t h = 1469598103934665603ull) {
  for (uint8_t x : b) h = (h ^ x) * 1099511628211ull;
  return h;
}

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>& out) : out_(out) {}

  void u8(uint8_t v) { out_.push_back(v); }
  void u32(uint32_t v) { putLe(v); }
  void u64(uint64_t v) { putLe(v); }
  void f32(float v) { putLe(std::bit_cast<uint32_t>(v)); }
  void f64(double v) { putLe(std::bit_cast<uint64_t>(v)); }
  // u32 length, then the bytes.
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  // u64 count, then count little-endian floats.
  void floats(std::span<const float> v) {
    u64(v.size());
    const size_t at = out_.size();
    out_.resize(at + v.size() * 4);
    if constexpr (std::endian::native == std::endian::little) {
      if (!v.empty()) std::memcpy(out_.data() + at, v.data(), v.size() * 4);
    } else {
      for (size_t i = 0; i < v.size(); ++i)
        store(out_.data() + at + 4 * i, std::bit_cast<uint32_t>(v[i]));
    }
  }
  void bytes(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = out_.size();
    out_.resize(at + n);
    std::memcpy(out_.data() + at, p, n);
  }
  size_t size() const { return out_.size(); }
  // Overwrites a u64 written earlier at byte `at` (for lengths known only afterwards).
  void patchU64(size_t at, uint64_t v) {
    STARLING_ENFORCE(at + 8 <= out_.size(), "patchU64 at ", at, " past ", out_.size());
    store(out_.data() + at, v);
  }

 private:
  template <class T>
  static void store(uint8_t* p, T v) {
    for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
  template <class T>
  void putLe(T v) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    store(out_.data() + at, v);
  }
  std::vector<uint8_t>& out_;
};

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> bytes, std::string what)
      : b_(bytes), what_(std::move(what)) {}

  uint8_t u8() { return static_cast<uint8_t>(getLe<uint8_t>()); }
  uint32_t u32() { return getLe<uint32_t>(); }
  uint64_t u64() { return getLe<uint64_t>(); }
  float f32() { return std::bit_cast<float>(getLe<uint32_t>()); }
  double f64() { return std::bit_cast<double>(getLe<uint64_t>()); }
  // A string of at most max_len bytes.
  std::string str(size_t max_len) {
    const uint32_t n = u32();
    if (n > max_len) fail("a string of ", n, " bytes exceeds the limit of ", max_len);
    need(n);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  // Reads a u64 count and that many floats into `out` (resized; its capacity is reused).
  void floats(std::vector<float>& out) {
    const uint64_t n = u64();
    if (n > remaining() / 4) fail("claims ", n, " floats, only ", remaining(), " bytes left");
    out.resize(n);
    if constexpr (std::endian::native == std::endian::little) {
      if (n) std::memcpy(out.data(), b_.data() + pos_, n * 4);
      pos_ += n * 4;
    } else {
      for (auto& x : out) x = f32();
    }
  }
  // The next n bytes as a view (no copy).
  std::span<const uint8_t> view(size_t n) {
    need(n);
    auto s = b_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  size_t position() const { return pos_; }
  size_t remaining() const { return b_.size() - pos_; }
  bool done() const { return pos_ == b_.size(); }
  // Throws unless every byte was read.
  void finish() const {
    if (!done()) fail(remaining(), " trailing bytes after the last field");
  }
  template <class... A>
  [[noreturn]] void fail(A&&... args) const {
    STARLING_THROW(IoError, what_, ": ", std::forward<A>(args)..., " (at byte ", pos_, " of ",
                   b_.size(), ")");
  }

 private:
  void need(size_t n) const {
    if (n > remaining()) fail("truncated: ", n, " bytes needed, ", remaining(), " left");
  }
  template <class T>
  T getLe() {
    need(sizeof(T));
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i)
      v = static_cast<T>(v | (static_cast<T>(b_[pos_ + i]) << (8 * i)));
    pos_ += sizeof(T);
    return v;
  }
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  std::string what_;
};

}  // namespace starling
