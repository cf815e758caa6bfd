#pragma once
// allFinite(v): true iff no NaN or inf. An integer max over the bits without the sign vectorises;
// a float probe sum (x * 0) would be one serial add chain, several times slower.
#include <cstdint>
#include <cstring>
#include <span>

namespace starling {

inline bool allFinite(std::span<const float> v) {
  uint32_t worst = 0;
  const float* p = v.data();
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, p + i, 4);
    u &= 0x7fffffffu;
    worst = u > worst ? u : worst;
  }
  return worst < 0x7f800000u;
}

}  // namespace starling
