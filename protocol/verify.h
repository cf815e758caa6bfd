#pragma once
// Internal to protocol/: the checks every received message goes through before any field is
// read (codec.cc's Decoder and control.cc's decoders share them).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "compression/payload.h"
#include "core/input_error.h"
#include "protocol/starling_generated.h"

namespace starling::protocol::detail {

// Checks, in order: `bytes` within `max_bytes`, the size prefix against the bytes (truncated,
// trailing), the file identifier, the FlatBuffers structure with at most `max_tables` tables, and
// the schema version. Realigns a misaligned buffer into `aligned` (adding its size to
// `*realigned`), since views and FlatBuffers read scalars in place. Throws InputError.
const wire::Message* verifyMessage(std::span<const uint8_t> bytes, size_t max_bytes,
                                   size_t max_tables, std::vector<uint64_t>& aligned,
                                   uint64_t* realigned = nullptr);

// The tensors of an Update, PartialAggregate or Task, one per payload, in order.
std::vector<flatbuffers::Offset<wire::Tensor>> encodeTensors(
    flatbuffers::FlatBufferBuilder& b, std::span<const compression::PayloadView> tensors);

// The name of a body type for messages ("unknown" for a value this build does not know).
const char* bodyName(wire::Body b);

// Finishes `body` as a size-prefixed Message of the current schema version: the bytes that travel.
std::vector<uint8_t> finish(flatbuffers::FlatBufferBuilder& b, wire::Body type,
                            flatbuffers::Offset<void> body);

// verifyMessage, then the body of the `expected` type (kUnexpectedMessage for another).
template <class T>
const T* body(std::span<const uint8_t> bytes, size_t max_bytes, wire::Body expected,
              size_t max_tables, std::vector<uint64_t>& aligned) {
  const wire::Message* m = verifyMessage(bytes, max_bytes, max_tables, aligned);
  if (m->body_type() != expected || !m->body())
    throw InputError(Errc::kUnexpectedMessage, std::string("expected ") + bodyName(expected) +
                                                   ", got " + bodyName(m->body_type()));
  return static_cast<const T*>(m->body());
}

}  // namespace starling::protocol::detail
