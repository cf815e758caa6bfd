#pragma once
// Encode and decode of Starling messages (docs/wire-format.md).
//
// Encoding is deterministic and its byte size is exact: what encodeUpdate() returns is what
// travels (size prefix included), so the simulator counts real traffic with encodedSize().
//
// Decoder treats its input as hostile and costs time and memory linear in the message, whatever
// the message claims. In order it checks: the size prefix against the bytes and the configured
// maximum, the file identifier, the FlatBuffers structure (Verifier, with a table budget derived
// from the model), the schema version, the message type, the fingerprint and the tensor count
// (before any per-tensor work), that every field is present, that no two tensors or metrics share
// or overlap data (a FlatBuffers buffer may point many offsets at one table; the verifier allows
// it), and the metrics (bounded in number and name length, unique, printable names, finite
// values). It yields views straight into the buffer: no payload value is copied or read. Payload
// values are checked against the layout by compression::validatePayload, which the round runs
// (decodeUpdate() below runs it too, for tools and tests). Every failure throws InputError with
// its own code and never leaves a partial result.
#include <cstdint>
#include <span>
#include <vector>

#include "compression/payload.h"
#include "core/input_error.h"
#include "core/param_layout.h"

namespace starling::protocol {

inline constexpr uint16_t kSchemaVersion = 1;

struct DecodeLimits {
  size_t max_bytes = size_t{1} << 30;  // FlatBuffers buffers are limited to 2 GiB; we cap lower
  size_t max_metrics = 32;
  size_t max_metric_name = 64;
  void validate() const;  // ConfigError on a zero or absurd limit
};

// Decodes messages for one model. Reuses its scratch across calls (no allocation per message
// once warm), so keep one per thread or connection. A returned view points into the decoded
// bytes, or into the decoder's own aligned copy when the bytes were not 8-byte aligned; it is
// valid until the next decode call or until the bytes are freed. Not thread-safe.
class Decoder {
 public:
  explicit Decoder(const ParamLayout& layout, DecodeLimits limits = {});

  const compression::UpdateView& decodeUpdate(std::span<const uint8_t> bytes);
  const compression::PartialView& decodePartial(std::span<const uint8_t> bytes);

  const ParamLayout& layout() const { return layout_; }
  const DecodeLimits& limits() const { return limits_; }
  // Bytes copied because a message was misaligned (for tests and metrics).
  uint64_t realignedBytes() const { return realigned_bytes_; }

 private:
  struct Region {
    const uint8_t* begin;
    const uint8_t* end;
  };
  const void* verify(std::span<const uint8_t> bytes);
  void checkRegions();
  const ParamLayout& layout_;
  DecodeLimits limits_;
  std::vector<uint64_t> aligned_;
  std::vector<Region> regions_;
  compression::UpdateView update_;
  compression::PartialView partial_;
  uint64_t realigned_bytes_ = 0;
};

std::vector<uint8_t> encodeUpdate(const compression::UpdateView& update);
inline std::vector<uint8_t> encodeUpdate(const compression::Update& u) {
  return encodeUpdate(compression::view(u));
}
size_t encodedSize(const compression::UpdateView& update);
inline size_t encodedSize(const compression::Update& u) {
  return encodedSize(compression::view(u));
}

std::vector<uint8_t> encodePartial(const compression::PartialView& partial);
inline std::vector<uint8_t> encodePartial(const compression::PartialMessage& m) {
  return encodePartial(compression::view(m));
}

// Decodes and fully validates an update (structure, then every payload against the layout with
// validatePayload), returning an owned copy. For tools and tests; servers use Decoder + the round.
compression::Update decodeUpdate(std::span<const uint8_t> bytes, const ParamLayout& layout,
                                 const compression::SharedFactors* shared = nullptr,
                                 const DecodeLimits& limits = {});

}  // namespace starling::protocol
