#pragma once
// Decoding errors: every way an untrusted buffer can be wrong has its own code, so a server can
// log, count and answer each precisely. A DecodeError never leaves partial results behind.
#include <cstdint>
#include <string>

#include "core/error.h"

namespace starling::protocol {

enum class DecodeErrc : uint8_t {
  kTruncated,             // fewer bytes than the size prefix (or the prefix itself) announces
  kTrailingBytes,         // more bytes than the size prefix announces
  kTooLarge,              // over DecodeOptions::max_bytes
  kBadIdentifier,         // not a Starling message (file identifier is not "STRL")
  kMalformed,             // the FlatBuffers verifier rejected the structure (bad offsets, depth)
  kUnsupportedVersion,    // schema_version differs from kSchemaVersion
  kUnexpectedMessage,     // the body is absent or not the message type asked for
  kUnknownEncoding,       // a tensor's payload type is absent or unknown to this build
  kMissingField,          // a required vector (values, indices, bits, ...) is absent
  kFingerprintMismatch,   // the update describes another model
  kTensorCountMismatch,   // not one payload per layout tensor
  kSizeMismatch,          // a count or byte length disagrees with the tensor (a size that lies)
  kIndexOutOfRange,       // sparse index or block offset >= numel
  kDuplicateIndex,        // sparse indices not strictly increasing (duplicates or unsorted)
  kShapeMismatch,         // low-rank shape or rank does not fit the tensor
  kNonFinite,             // NaN or inf in a value, scale or norm
  kLevelOutOfRange,       // QSGD level above s, or s out of range
  kMissingSharedFactor,   // one-factor low-rank payload but no matching shared factor
  kBadPadding,            // non-zero bits after the last packed element
};

const char* decodeErrcName(DecodeErrc c);

class DecodeError : public Error {
 public:
  DecodeError(DecodeErrc code, const std::string& msg)
      : Error(std::string("decode error (") + decodeErrcName(code) + "): " + msg), code_(code) {}
  DecodeErrc code() const { return code_; }

 private:
  DecodeErrc code_;
};

}  // namespace starling::protocol
