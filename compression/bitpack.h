#pragma once
// LSB-first bit packing of fixed-width unsigned fields, shared by the sign and QSGD encodings.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace starling::compression {

inline size_t packedBytes(size_t count, uint32_t bits) { return (count * bits + 7) / 8; }

class BitWriter {
 public:
  BitWriter(std::vector<uint8_t>& out, size_t count, uint32_t bits) : out_(out) {
    out_.assign(packedBytes(count, bits), 0);
  }
  void put(uint32_t value, uint32_t bits) {
    acc_ |= static_cast<uint64_t>(value) << nbits_;
    nbits_ += bits;
    while (nbits_ >= 8) {
      out_[pos_++] = static_cast<uint8_t>(acc_);
      acc_ >>= 8;
      nbits_ -= 8;
    }
  }
  void flush() {
    if (nbits_ > 0) out_[pos_++] = static_cast<uint8_t>(acc_);
    acc_ = 0;
    nbits_ = 0;
  }

 private:
  std::vector<uint8_t>& out_;
  uint64_t acc_ = 0;
  uint32_t nbits_ = 0;
  size_t pos_ = 0;
};

class BitReader {
 public:
  explicit BitReader(const uint8_t* data) : data_(data) {}
  uint32_t get(uint32_t bits) {
    while (nbits_ < bits) {
      acc_ |= static_cast<uint64_t>(data_[pos_++]) << nbits_;
      nbits_ += 8;
    }
    const uint32_t v = static_cast<uint32_t>(acc_ & ((1ull << bits) - 1));
    acc_ >>= bits;
    nbits_ -= bits;
    return v;
  }

 private:
  const uint8_t* data_;
  uint64_t acc_ = 0;
  uint32_t nbits_ = 0;
  size_t pos_ = 0;
};

}  // namespace starling::compression
