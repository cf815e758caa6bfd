#pragma once
// A fixed key per number for the privacy tests: tests reproduce what a client's fresh randomKey()
// would make (a rounding, a stream), the same on every run.
#include <cstdint>

#include "privacy/crypto.h"

namespace starling::testing {

// Key bytes 0..7: n (little-endian); byte 31: `tag` (keys of two uses apart); the rest zero.
inline privacy::Key32 testKey(uint64_t n, uint8_t tag = 0) {
  privacy::Key32 k{};
  for (int i = 0; i < 8; ++i) k[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  k[31] = tag;
  return k;
}

}  // namespace starling::testing
