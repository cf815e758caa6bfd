#pragma once
// InputError: untrusted input (bytes from the network, an update, a partial aggregate) that is
// not acceptable. One error-code enum covers every layer that judges input (the decoder, payload
// validation, the round's bounds and bookkeeping), so a server can log, count and answer each
// fault precisely whichever layer caught it. An InputError never leaves partial results behind:
// the object that threw is as it was before the call.
#include <cstdint>
#include <string>

#include "core/error.h"

namespace starling {

enum class Errc : uint8_t {
  // framing and structure (protocol/)
  kTruncated,           // fewer bytes than the size prefix (or the prefix itself) announces
  kTrailingBytes,       // more bytes than the size prefix announces
  kTooLarge,            // over the configured maximum message size
  kBadIdentifier,       // not a Starling message (file identifier is not "STRL")
  kMalformed,           // the FlatBuffers verifier rejected the structure (offsets, depth, tables)
  kUnsupportedVersion,  // schema_version differs from the one this build speaks
  kUnexpectedMessage,   // the body is absent or not the message type asked for
  kUnknownEncoding,     // a tensor's payload type is absent or unknown to this build
  kMissingField,        // a required vector or table is absent
  kSharedData,          // tables or vectors referenced more than once, or overlapping
  kBadMetric,           // too many metrics, a bad or repeated name, a non-finite value
  // the update against the model (compression/ payload validation)
  kFingerprintMismatch,  // the update describes another model
  kTensorCountMismatch,  // not one payload per layout tensor
  kSizeMismatch,         // a count or byte length disagrees with the tensor (a size that lies)
  kIndexOutOfRange,      // sparse index or block offset >= numel
  kIndexOrder,           // sparse indices not strictly increasing (duplicates or unsorted)
  kShapeMismatch,        // low-rank shape or rank does not fit the tensor
  kNonFinite,            // NaN or inf in a value, scale or norm, or a negative scale or norm
  kLevelOutOfRange,      // QSGD level above s, or s out of range
  kMissingSharedFactor,  // one-factor low-rank payload without a matching shared factor
  kBadPadding,           // non-zero bits after the last packed element
  // the update against the round (aggregation/ bounds and bookkeeping)
  kValueTooLarge,       // a decoded value (or a low-rank product, scale or norm) over the bound
  kNormTooLarge,        // the update's L2 norm over the bound
  kBadWeight,           // zero examples where the rule weights by them, or over the cap
  kWrongRound,          // the update is for a round or phase that has not started (or never will)
  kDuplicate,           // a second update from the same client in one phase
  kUnexpectedEncoding,  // an encoding this round's compressor never sends for that tensor
  kRoundMismatch,       // a round-determined field (random-block offset, length) differs
  kLate,                // the update is for an earlier round or phase: late, or replayed
  // the message against the deployment's session (server/)
  kBadNonce,       // not the nonce of the task this sender was given: replayed or forged
  kWrongSender,    // the sender is not who the message claims, or was given no such task
  kNotRegistered,  // a message other than Register from a peer the server does not know
  kRateLimited,    // the sender exceeded its message rate; dropped unread
  kBadChunk,       // a chunk out of order, of a wrong size, or inconsistent with its transfer
  kBusy,           // the receiver's memory bound for uploads is reached: send again later
  // asynchronous aggregation (aggregation/async_buffer.h)
  kStale,  // trained on a model version older than the staleness bound allows
  // secure aggregation (privacy/secagg.h)
  kNotNeighbour,        // a key, share or request about a client that is not a neighbour
  kBadSignature,        // an advertised key whose signature does not verify (a swapped key)
  kInconsistentShares,  // shares that rebuild no secret, or not the one its owner committed to
  kRevealBoth,          // a request for both shares of one client, or a second request
  kTooFewSurvivors,     // fewer than the threshold of neighbours to share with or rebuild from
  kUnsignedRound,  // a round whose keys are not signed, to a client that requires it (its threat)
  kNoCredential,   // a signed round, and this client has no certified signing key or authority
  kInconsistentSurvivors,  // a signed round's survivors that fewer than t neighbours signed alike
  // the connection (transport/)
  kPeerRoutingId,  // a connection whose ZeroMQ routing id its peer named (not the server's own)
  kRevoked,        // a client an operator revoked (starling-admin): nothing of it is taken
  // distributed DP (privacy/dp.h)
  kTooLittleNoise,  // a secure round asking a client for less noise than its secagg.min_noise,
                    // or holding fewer clients than its secagg.min_clients
};
// The last code: per-code counters are sized by it (update when adding a code).
inline constexpr Errc kLastErrc = Errc::kTooLittleNoise;

const char* errcName(Errc c);
// Its name as a label (metrics, JSON logs): blanks as underscores ("bad nonce" -> "bad_nonce").
std::string errcLabel(Errc c);

class InputError : public InvalidArgument {
 public:
  InputError(Errc code, const std::string& msg)
      : InvalidArgument(std::string(errcName(code)) + ": " + msg), code_(code) {}
  Errc code() const { return code_; }

 private:
  Errc code_;
};

// Throws InputError(code, concatenation of args).
template <class... A>
[[noreturn]] void failInput(Errc code, A&&... args) {
  throw InputError(code, detail::concat(std::forward<A>(args)...));
}

}  // namespace starling
