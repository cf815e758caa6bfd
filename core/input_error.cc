#include "core/input_error.h"

namespace starling {

std::string errcLabel(Errc c) {
  std::string s = errcName(c);
  for (char& ch : s)
    if (ch == ' ') ch = '_';
  return s;
}

const char* errcName(Errc c) {
  switch (c) {
    case Errc::kTruncated:
      return "truncated";
    case Errc::kTrailingBytes:
      return "trailing bytes";
    case Errc::kTooLarge:
      return "too large";
    case Errc::kBadIdentifier:
      return "bad identifier";
    case Errc::kMalformed:
      return "malformed";
    case Errc::kUnsupportedVersion:
      return "unsupported version";
    case Errc::kUnexpectedMessage:
      return "unexpected message";
    case Errc::kUnknownEncoding:
      return "unknown encoding";
    case Errc::kMissingField:
      return "missing field";
    case Errc::kSharedData:
      return "shared or overlapping data";
    case Errc::kBadMetric:
      return "bad metric";
    case Errc::kFingerprintMismatch:
      return "fingerprint mismatch";
    case Errc::kTensorCountMismatch:
      return "tensor count mismatch";
    case Errc::kSizeMismatch:
      return "size mismatch";
    case Errc::kIndexOutOfRange:
      return "index out of range";
    case Errc::kIndexOrder:
      return "duplicate or unsorted index";
    case Errc::kShapeMismatch:
      return "shape mismatch";
    case Errc::kNonFinite:
      return "non-finite value";
    case Errc::kLevelOutOfRange:
      return "level out of range";
    case Errc::kMissingSharedFactor:
      return "missing shared factor";
    case Errc::kBadPadding:
      return "bad padding";
    case Errc::kValueTooLarge:
      return "value too large";
    case Errc::kNormTooLarge:
      return "norm too large";
    case Errc::kBadWeight:
      return "bad weight";
    case Errc::kWrongRound:
      return "wrong round";
    case Errc::kDuplicate:
      return "duplicate update";
    case Errc::kUnexpectedEncoding:
      return "unexpected encoding";
    case Errc::kRoundMismatch:
      return "round mismatch";
    case Errc::kLate:
      return "late";
    case Errc::kBadNonce:
      return "bad nonce";
    case Errc::kWrongSender:
      return "wrong sender";
    case Errc::kNotRegistered:
      return "not registered";
    case Errc::kRateLimited:
      return "rate limited";
    case Errc::kBadChunk:
      return "bad chunk";
    case Errc::kBusy:
      return "busy";
    case Errc::kStale:
      return "stale";
    case Errc::kNotNeighbour:
      return "not a neighbour";
    case Errc::kBadSignature:
      return "bad signature";
    case Errc::kInconsistentShares:
      return "inconsistent shares";
    case Errc::kRevealBoth:
      return "asked to reveal both shares";
    case Errc::kTooFewSurvivors:
      return "too few survivors";
    case Errc::kUnsignedRound:
      return "unsigned round";
    case Errc::kTooLittleNoise:
      return "too little noise";
    case Errc::kNoCredential:
      return "no credential";
    case Errc::kInconsistentSurvivors:
      return "inconsistent survivors";
    case Errc::kPeerRoutingId:
      return "routing id named by the peer";
    case Errc::kRevoked:
      return "revoked";
  }
  return "unknown";
}

}  // namespace starling
