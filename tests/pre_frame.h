#pragma once
// A framed file (core/framed_file.h) rewritten as its format wrote it before the frame: the
// magic, `version`, then the same fields without length or checksum (tests that old files still
// read).
#include <cstdint>
#include <span>
#include <vector>

#include "core/bytes.h"
#include "core/framed_file.h"

namespace starling::testing {

inline std::vector<uint8_t> asPreFrame(std::span<const uint8_t> framed_file, uint32_t magic,
                                       uint32_t version) {
  const Unframed u = unframe(FileFormat{magic, "file", 1, 1, ~0u}, framed_file, "test file");
  std::vector<uint8_t> old;
  ByteWriter w(old);
  w.u32(magic);
  w.u32(version);
  w.bytes(u.payload.data(), u.payload.size());
  return old;
}

}  // namespace starling::testing
