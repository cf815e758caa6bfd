#pragma once
// Encode and decode of Starling messages. Encoding is deterministic and its byte size is exact:
// what encodeUpdate() returns is what travels (size prefix included), so the simulator can count
// real traffic with encodedSize().
//
// decodeUpdate() treats its input as hostile: it checks, in order, the size prefix, the file
// identifier, the FlatBuffers structure (Verifier), the schema version, the message type, then the
// semantics against the expected layout (fingerprint, tensor count, and every payload's sizes,
// indices, shapes, levels and values). Any failure throws DecodeError with its own code; it never
// reads out of bounds and never returns a partial update.
#include <cstdint>
#include <span>
#include <vector>

#include "compression/payload.h"
#include "core/param_layout.h"
#include "protocol/errors.h"

namespace starling::protocol {

inline constexpr uint16_t kSchemaVersion = 1;

struct DecodeOptions {
  size_t max_bytes = size_t{1} << 30;  // FlatBuffers buffers are limited to 2 GiB; we cap lower
};

std::vector<uint8_t> encodeUpdate(const compression::Update& update);
size_t encodedSize(const compression::Update& update);

// `shared` is needed only for updates with one-factor low-rank payloads.
compression::Update decodeUpdate(std::span<const uint8_t> bytes, const ParamLayout& layout,
                                 const compression::SharedFactors* shared = nullptr,
                                 const DecodeOptions& options = {});

// Structural decode only (no layout checks): for tools that inspect unknown messages. Still
// verifies prefix, identifier, structure, version, message type and that every field is present.
compression::Update decodeUpdateUnchecked(std::span<const uint8_t> bytes, const DecodeOptions& options = {});

}  // namespace starling::protocol
