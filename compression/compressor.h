#pragma once
// Compressor: turns one client's model update (a flat buffer in layout order) into one Payload
// per tensor, reading and updating the client's ClientState (error-feedback residual, warm-start
// factors). A compressor object holds only its options: it is immutable after construction and
// may be shared by any number of threads, each compressing with its own ClientState.
//
// Decoding is not the compressor's business: every Payload is self-describing and
// accumulatePayload() (payload.h) adds any of them into a dense accumulator.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compression/payload.h"
#include "core/param_layout.h"

namespace starling::compression {

// What a compressor may need to know about the round besides the update itself.
struct RoundContext {
  uint64_t run_seed = 0;
  uint64_t round = 0;
  uint64_t client_id = 0;
  // The round's shared low-rank factors: required by acpsgd, ignored by the others.
  const SharedFactors* shared = nullptr;
};

// What must survive between the rounds a client takes part in. Plain data, serializable, so the
// simulator can keep hundreds of thousands of them in a bounded store that spills to disk.
struct ClientState {
  uint64_t layout_fingerprint = 0;
  std::vector<float> residual;               // error feedback, layout-sized; empty without EF
  std::vector<std::vector<float>> factors;   // per-tensor warm-start factors (local PowerSGD)
  uint8_t pending_phase = 0;                 // two-phase PowerSGD: 1 between phase P and phase Q

  size_t memoryBytes() const;
  std::vector<uint8_t> serialize() const;
  // Throws IoError on a truncated or corrupt blob.
  static ClientState deserialize(std::span<const uint8_t> bytes);
};

class Compressor {
 public:
  virtual ~Compressor() = default;

  // Registry name, e.g. "topk".
  virtual std::string name() const = 0;
  // Canonical spec with every option, e.g. "topk:density=0.01,scope=layer,ef=true".
  virtual std::string spec() const = 0;
  virtual bool usesErrorFeedback() const = 0;

  // A fresh state for one client of `layout`.
  ClientState initialState(const ParamLayout& layout) const;

  // Compresses `update` (layout.numel() floats, all finite). Throws InvalidArgument on a size or
  // fingerprint mismatch or a non-finite value; on a throw the state is unchanged.
  std::vector<Payload> compress(const ParamLayout& layout, std::span<const float> update, ClientState& state,
                                const RoundContext& ctx) const;

 protected:
  // `acc` is the vector to compress. With EF it is update + residual and *is* the residual
  // buffer, which the implementation turns into the new residual in place. Without EF it is the
  // caller's update itself and must not be written (contract: implementations write `acc` only
  // when usesErrorFeedback()).
  virtual std::vector<Payload> compressAccumulated(const ParamLayout& layout, std::span<float> acc,
                                                   ClientState& state, const RoundContext& ctx) const = 0;
  virtual void initState(const ParamLayout& /*layout*/, ClientState& /*state*/) const {}
  // Throws InvalidArgument if the state or round context cannot serve this compressor (missing
  // shared factors, a phase out of order). Called before the state is touched.
  virtual void checkRound(const ParamLayout& /*layout*/, const ClientState& /*state*/,
                          const RoundContext& /*ctx*/) const {}
};

// k for a density over n elements: round(density * n), at least 1, at most n.
size_t countForDensity(double density, size_t n);

}  // namespace starling::compression
