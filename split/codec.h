#pragma once
// Activation codecs for split fine-tuning (Shi et al., "An Efficient Split Fine-tuning Framework
// for Edge and Cloud Collaborative Learning", arXiv 2211.16703): what crosses the cut.
// The edge sends the bottom part's activations up, the cloud sends their gradients down; each
// direction has its own codec, picked by spec like compressors ("topk:density=0.05").
//
// A codec encodes a rows x cols row-major float matrix (rows = examples of the batch, or tokens;
// cols = the activation's features) into bytes, and decode() turns bytes back into such a matrix,
// checking everything a sender could lie about. No LibTorch here: an edge device links it with any
// model runtime, and the tests need none.
//
//   none      f32 values, exact
//   int8      per-row scale (max |x| / 127) and one signed byte per value, rounded to nearest:
//             error at most scale / 2 per value
//   topk      the k = round(density x rows x cols) largest magnitudes of the matrix: u32 flat
//             indices (strictly increasing) and f32 values
//   lowrank   rank r by `iters` power iterations (Vogels et al.'s PowerSGD step): Q (cols x r)
//             warm-started across calls of the same shape from the state (a seeded orthonormal
//             matrix at first), P = orth(M Q), Q = M^T P; sends P (rows x r) and Q (cols x r),
//             M ~= P Q^T. Exact for a matrix of rank <= r. With ef=true the residual M - P Q^T is
//             added to the next matrix of the same shape (error feedback).
//
// Wire format (little-endian): u8 'A', u8 kind (0 none, 1 int8, 2 topk, 3 lowrank), u32 rows,
// u32 cols, then the kind's body:
//   none     rows x cols f32
//   int8     rows f32 scales, rows x cols int8
//   topk     u32 k, k u32 indices, k f32 values
//   lowrank  u32 r, rows x r f32 (P), cols x r f32 (Q)
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/registry.h"

namespace starling::split {

// What a codec keeps between calls (per direction and per edge device): the low-rank warm start
// and the error-feedback residual, both reset when the matrix shape changes.
struct CodecState {
  size_t rows = 0, cols = 0;
  std::vector<float> q;         // lowrank: cols x r, the last Q (orthonormalized)
  std::vector<float> residual;  // lowrank with ef: rows x cols
  uint64_t calls = 0;
};

class ActivationCodec {
 public:
  virtual ~ActivationCodec() = default;
  virtual std::string name() const = 0;
  virtual std::string spec() const = 0;
  // Encodes `m` (rows x cols, finite values). Throws InvalidArgument on a size mismatch or a
  // non-finite value; `state` is then unchanged.
  virtual std::vector<uint8_t> encode(std::span<const float> m, size_t rows, size_t cols,
                                      CodecState& state) const = 0;
};

const Registry<ActivationCodec>& activationCodecs();
std::unique_ptr<ActivationCodec> makeActivationCodec(std::string_view spec);

// Decodes `bytes` into `out` (rows x cols, overwritten), for a receiver that expects exactly that
// shape. Throws InputError (kTruncated, kTrailingBytes, kBadIdentifier, kUnknownEncoding,
// kShapeMismatch, kSizeMismatch, kIndexOutOfRange, kIndexOrder, kNonFinite, kValueTooLarge) for a
// message that is not a well-formed encoding of such a matrix, or whose decoded values exceed
// `max_abs`; `out` may then hold anything.
void decodeActivation(std::span<const uint8_t> bytes, size_t rows, size_t cols,
                      std::span<float> out, double max_abs = 1e30);

// The kind byte of an encoding, and its name, for logs ("none", "int8", "topk", "lowrank").
const char* activationKindName(uint8_t kind);

}  // namespace starling::split
