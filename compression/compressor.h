#pragma once
// Compressor: turns one client's model update (a flat buffer in layout order) into one Payload
// per tensor, and says what a round of it looks like so that every party (clients, edge
// aggregators, the root, simulator workers) can run it generically.
//
// A compressor object holds only its options: it is immutable after construction and may be
// shared by any number of threads, each compressing with its own ClientState (tested).
//
// Two client entry points, with the contract in their types:
//   compress(layout, update, ctx) const          read-only: compresses the update as it is; no
//                                                error feedback, no state, writes nothing.
//   compressWithFeedback(layout, update, state, ctx)
//                                                in place: adds the client's residual, compresses,
//                                                keeps what was not sent as the new residual and
//                                                any other state the compressor carries (PowerSGD's
//                                                pending phase and factors). Strong guarantee: on
//                                                any throw, `state` is exactly as before (tested
//                                                for every compressor).
// And the round's structure, derived from the spec alone:
//   phases()            1, or 2 for PowerSGD (P then Q inside one round)
//   initialShared()     the factors shared in phase 0 of the first round (low-rank ones)
//   factorsAreUpdate()  whether a phase's one-factor payloads are part of the update (PowerSGD's
//                       phase-P factors only shape P-hat)
//   nextShared()        the next phase's (or round's) shared factors from this phase's factor sums
//   checkReceived()     what a receiver accepts for a tensor: the encoding this compressor sends
//                       and the fields the round fixes (random-block offset and length)
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compression/payload.h"
#include "core/client_state.h"
#include "core/param_layout.h"

namespace starling::compression {

// What a compressor may need to know about the round besides the update itself.
struct RoundContext {
  uint64_t run_seed = 0;
  uint64_t round = 0;
  uint32_t phase = 0;
  uint64_t client_id = 0;
  // This phase's shared low-rank factors: required by acpsgd and two-phase powersgd.
  const SharedFactors* shared = nullptr;
};

// What every party of a round phase is told before it starts (sent to clients with their task,
// to edge aggregators with the phase): the seed, round and phase, and the phase's shared
// factors (null when the compressor shares none).
struct PhaseBroadcast {
  uint64_t run_seed = 0;
  uint64_t round = 0;
  uint32_t phase = 0;
  std::shared_ptr<const SharedFactors> shared;
  RoundContext context(uint64_t client_id) const {
    return {run_seed, round, phase, client_id, shared.get()};
  }
};

// The coordinates every client of a round sends, fixed by the round alone (its seed and number),
// never by a client's values or id: what secure aggregation can add, since it sums masked vectors
// coordinate by coordinate (a coordinate only one client chose would be that client's value in the
// sum). Either every coordinate in layout order (all), or `positions`: flat layout positions,
// tensor by tensor, each tensor's in the order its payload carries them (a random block's wrap,
// rand-k's ascending draw).
struct SharedSupport {
  bool all = true;
  std::vector<uint32_t> positions;  // when !all
  size_t size(size_t numel) const { return all ? numel : positions.size(); }
  // out[j] = dense[position j] (dense: numel values, out: size(numel)); InvalidArgument on sizes.
  void gather(std::span<const float> dense, std::span<float> out) const;
  // dense[position j] = values[j], every other coordinate 0; InvalidArgument on sizes or a
  // position outside `dense`, `dense` unchanged.
  void scatter(std::span<const float> values, std::span<float> dense) const;
};

// The error-feedback residual, layout-sized (component kResidualComponent), and the round in
// which it was last written (0: unknown, a version-1 state). Two-phase PowerSGD also keeps its
// accumulated matrix here between phase P and phase Q.
inline constexpr std::string_view kResidualComponent = "compression.residual";

class ResidualState final : public StateComponent {
 public:
  std::vector<float> values;
  uint64_t round = 0;
  uint32_t version() const override { return 2; }
  void save(ByteWriter& w) const override;
  void load(ByteReader& r, uint32_t version) override;
  size_t memoryBytes() const override { return values.capacity() * sizeof(float); }
};

// Error feedback and its variants for federated rounds (docs/compression.md, "Compression in
// federated rounds"). Plain error feedback (on, decay 1, preview 0, max_age 0) compresses
// acc = update + residual and keeps residual = acc - sent. The spec keys, for every compressor
// that has error feedback:
//   ef=true|false   error feedback on or off
//   ef_decay=B      the residual kept is B (acc - sent), 1e-6 <= B <= 1 (SparseLoCo's decayed
//                   accumulator): a coordinate that waits can carry at most 1/(1-B) displacements
//   ef_preview=A    the client starts local training from global + A residual, 0 <= A <= 1
//                   (step-ahead EF, SA-PEF; local-model persistence, CSER): with A = 1 what it
//                   sends is its local model's distance from the global one, so a coordinate that
//                   waited arrives as one displacement instead of one per round waited
//   ef_max_age=R    a residual last written more than R rounds ago is dropped (0: kept forever),
//                   the stale-residual policy for clients that take part rarely
struct ErrorFeedback {
  bool on = false;
  double decay = 1.0;
  double preview = 0.0;
  uint32_t max_age = 0;
  void validate(const std::string& who) const;  // ConfigError naming the key
  // ",ef=true,ef_decay=...,ef_preview=...,ef_max_age=..." (only ",ef=false" when off).
  std::string specText() const;
};

// What compressWithFeedback measured about one call (phase 0 of a one-phase compressor with
// error feedback), the diagnostics of docs/compression.md. "Local" is the client's displacement
// from the global model, update + ef_preview x residual, for a caller that trained from
// global + ef_preview x residual as ClientAlgorithm does (the update alone without preview).
struct FeedbackStats {
  double local_norm = 0;      // ||local||
  double sent_norm = 0;       // ||sent||, sent = update + residual - kept (before decay)
  double local_on_sent = 0;   // ||local restricted to the coordinates where sent != 0||
  double residual_norm = 0;   // ||residual kept||
  uint64_t residual_age = 0;  // rounds since the residual it started from was written (0: none)
  // sent_norm / local_on_sent: how many of its own displacements a client sends at once. About 1
  // when it sends where its model is; about the rounds a coordinate waited under plain EF with a
  // shared support (the overshoot of docs/compression.md).
  double gain() const { return local_on_sent > 0 ? sent_norm / local_on_sent : 0.0; }
};

// FeedbackStats::residual_age of a call in `round` that added `live` (null: none): the rounds since
// it was written, 0 when unknown (round 0) or not older.
inline uint64_t residualAge(const ResidualState* live, uint64_t round) {
  return live && live->round != 0 && round > live->round ? round - live->round : 0;
}

// Components built while compressing, installed into the ClientState only once compression has
// succeeded (ClientState::commit is all-or-nothing).
class StagedState {
 public:
  template <class T>
  T& stage(std::string name) {
    auto p = std::make_unique<T>();
    T& ref = *p;
    items_.emplace_back(std::move(name), std::move(p));
    return ref;
  }
  std::vector<std::pair<std::string, std::unique_ptr<StateComponent>>>& items() { return items_; }

 private:
  std::vector<std::pair<std::string, std::unique_ptr<StateComponent>>> items_;
};

// Scratch a caller may keep across calls (one per thread) so compressWithFeedback allocates no
// model-sized buffer: after a call it holds the previous residual's storage.
struct Workspace {
  std::vector<float> acc;
};

class Compressor {
 public:
  virtual ~Compressor() = default;

  // Registry name, e.g. "topk".
  virtual std::string name() const = 0;
  // Canonical spec with every option, e.g.
  // "topk:density=0.01,scope=layer,ef=true,ef_decay=1,ef_preview=0,ef_max_age=0".
  virtual std::string spec() const = 0;
  // The error-feedback options (off for compressors without it).
  virtual const ErrorFeedback& feedback() const;
  bool usesErrorFeedback() const { return feedback().on; }
  // Whether phase 0 keeps a buffer in the state: with error feedback, or when a later phase
  // continues from it (two-phase PowerSGD keeps M between its phases).
  bool keepsBuffer() const { return usesErrorFeedback() || phases() > 1; }
  // The residual this state carries into round `round`: null when there is none, error feedback
  // is off, or it is older than ef_max_age rounds (it is then dropped by the next call).
  const ResidualState* liveResidual(const ClientState& state, uint64_t round) const;

  // Whether the wire size of a phase-0 update varies with its values or its client, not only with
  // the layout and the round: STC's (Rice-coded positions, zeros left out) and random-block's with
  // per-client offsets (an offset of 0 is left out of the message); top-k always sends k, the
  // quantizers their bits, the low-rank ones their factors. A simulated clock times such a client
  // only once its update is made.
  virtual bool updateSizeVaries() const { return false; }

  // ---- the round's structure ----
  virtual uint32_t phases() const { return 1; }
  // Whether every client of a round sends on the same coordinates, fixed by the round alone
  // (SharedSupport): the dense codecs (every coordinate), randblock with its shared offset, randk
  // with positions=shared. Top-k, STC, gTop-k, sign and QSGD choose per client (their supports or
  // scales), the low-rank ones send factors.
  virtual bool supportIsShared() const { return false; }
  // That support in ctx's round and phase (ctx.client_id is not read): the coordinates a client's
  // phase-0 payloads are nonzero on at most. InvalidArgument when !supportIsShared().
  virtual SharedSupport sharedSupport(const ParamLayout& layout, const RoundContext& ctx) const;
  // Why a secure sum (SecAgg+: masked vectors added coordinate by coordinate) cannot take this
  // compressor's updates, and what to use instead; empty when it can (a shared support, one
  // phase; or a low-rank compressor's factor against the shared one). The default: a support or
  // scale of each client's own.
  virtual std::string secureRefusal() const;
  // Secure aggregation's view of a client's update in ctx's round and phase (for a compressor whose
  // secureRefusal() is empty): a vector whose every position means the same for every client of
  // the round, so that masked vectors add up to the round's sum; and that sum back as one payload
  // per tensor, a partial aggregate's. The default: the update's coordinates on the shared support
  // (sharedSupport, in its order), the sum scattered into each tensor dense. ACP-SGD: each
  // tensor's one factor (rows x r with Q shared, cols x r with P shared; a tensor it does not
  // factor whole), in layout order; the sum is the factor sum, a one-factor LowRank payload a
  // tensor. Two-phase PowerSGD: phase P's factors and the unfactored tensors whole, then phase Q's
  // factors alone (an unfactored tensor is an empty Sparse payload there, as in the clear); each
  // phase is a secure sum of its own. InvalidArgument on sizes that do not agree with the layout
  // and the round.
  virtual size_t secureSize(const ParamLayout& layout, const RoundContext& ctx) const;
  virtual std::vector<float> secureValues(const ParamLayout& layout, const RoundContext& ctx,
                                          const std::vector<Payload>& update) const;
  virtual std::vector<Payload> securePayloads(const ParamLayout& layout, const RoundContext& ctx,
                                              std::span<const float> sum) const;
  // Whether factors are shared across rounds (initialShared() is not empty for a layout with a
  // matrix): ACP-SGD's, and two-phase PowerSGD's. A buffered step (aggregation/async_buffer.h)
  // cannot take them.
  virtual bool sharesFactors() const { return false; }
  virtual SharedFactors initialShared(const ParamLayout& layout, uint64_t run_seed) const;
  virtual bool factorsAreUpdate(uint32_t /*phase*/) const { return true; }
  // `factor_sums[t]` is sum_i w_i F_i for each tensor with a shared factor this phase (empty
  // otherwise) and `total_weight` is sum_i w_i. `ctx` names the phase that just ended.
  virtual SharedFactors nextShared(const ParamLayout& layout, const RoundContext& ctx,
                                   const SharedFactors& current,
                                   std::span<const std::span<const float>> factor_sums,
                                   double total_weight) const;
  // Throws InputError (kUnexpectedEncoding or kRoundMismatch) if tensor `t` of a received
  // update is not what this compressor sends in `ctx`'s round and phase. Validation of the
  // payload against the tensor (validatePayload) is separate.
  virtual void checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                             const RoundContext& ctx) const = 0;

  // ---- the client side ----
  // Read-only: `update` (layout.numel() floats, each |x| <= kMaxCompressMagnitude) compressed as it
  // is, in phase 0; no state, no error feedback. Two-phase compressors use their one-phase form.
  // Throws InvalidArgument.
  std::vector<Payload> compress(const ParamLayout& layout, std::span<const float> update,
                                const RoundContext& ctx) const;

  // In place with error feedback, for phase ctx.phase: phase 0 takes the client's update
  // (layout-sized, each |x| <= kMaxCompressMagnitude, as is residual + update); later phases take
  // an empty span and continue from the state. `state` must be bound to this layout
  // (ClientState(layout.fingerprint())). Throws InvalidArgument on a size, fingerprint, magnitude,
  // phase or shared-factor problem; on any throw `state` is unchanged.
  // With ef_decay < 1 the kept residual is scaled after the round's last phase; the residual
  // records ctx.round. `stats`, when given, receives the diagnostics (one extra pass).
  std::vector<Payload> compressWithFeedback(const ParamLayout& layout,
                                            std::span<const float> update, ClientState& state,
                                            const RoundContext& ctx, Workspace* workspace = nullptr,
                                            FeedbackStats* stats = nullptr) const;

  // ---- error feedback formed where the data lives (a GPU: torch_trainer/device_round.h) ----
  // A caller that forms residual + update and encodes it itself brackets its work with these two,
  // so that the state changes as compressWithFeedback's call would, in phase 0. beginFeedback
  // makes that call's checks of the state and context, in its order, with `check_update` (the
  // caller's check of its update against kMaxCompressMagnitude, throwing the same
  // InvalidArgument) where that call checks the update; the caller checks residual + update
  // itself. It returns the residual to add: null when there is none (error feedback off, none
  // kept, or older than ef_max_age).
  // endFeedback commits what the encoding staged (PowerSGD's warm factors or pending phase) and,
  // when keepsBuffer(), keeps `kept` (layout.numel() floats, after the encoding and, in a
  // one-phase compressor, ef_decay) as the buffer of ctx.round, swapping buffers with the
  // state's; `kept` must be empty otherwise. InvalidArgument as compressWithFeedback, and for a
  // `kept` of another size.
  const ResidualState* beginFeedback(const ParamLayout& layout, const ClientState& state,
                                     const RoundContext& ctx,
                                     const std::function<void()>& check_update) const;
  void endFeedback(const ParamLayout& layout, ClientState& state, const RoundContext& ctx,
                   std::vector<float>& kept, StagedState& staged) const;

 protected:
  // The algorithm. `input` is what to compress. `residual` is empty when the call keeps no
  // residual; otherwise it is the same memory as `input` (a workspace, never the caller's
  // buffer) and the implementation turns it into what must be kept, in place. Reads `state`
  // only; any other state change goes into `staged`. Phases >= 1 get the kept buffer as input.
  virtual std::vector<Payload> encode(const ParamLayout& layout, std::span<const float> input,
                                      std::span<float> residual, const ClientState& state,
                                      const RoundContext& ctx, StagedState& staged) const = 0;
  // Throws InvalidArgument if the state or round context cannot serve this call (missing shared
  // factors, a phase out of order). Called before anything changes.
  virtual void checkRound(const ParamLayout& /*layout*/, const ClientState& /*state*/,
                          const RoundContext& /*ctx*/) const {}

  // Helper for checkReceived implementations.
  [[noreturn]] void unexpected(const ParamLayout& layout, size_t t, const PayloadView& p,
                               const char* want) const;

 private:
  // compressWithFeedback's checks before anything changes; `check_update` checks the update (phase
  // 0's, or a later phase's empty span) in its place among them.
  void checkFeedbackCall(const ParamLayout& layout, const ClientState& state,
                         const RoundContext& ctx, const std::function<void()>& check_update) const;
  // Installs `staged` and `kept` (as the residual of `round`) all or nothing.
  void commitKept(ClientState& state, StagedState& staged, std::vector<float>& kept,
                  uint64_t round) const;
};

// The largest |value| a compressor accepts in an update, and in residual + update. Within it,
// every compressor's arithmetic stays finite (low-rank products over dimensions up to 2^32
// included, and the residual left after it), so a client can never send, or keep, a non-finite
// value; a client whose training diverges past it gets InvalidArgument and its state unchanged.
inline constexpr float kMaxCompressMagnitude = 1e30f;

// k for a density over n elements: round(density * n), at least 1, at most n.
size_t countForDensity(double density, size_t n);

// The shortest text that reads back as the same double. A canonical spec is what travels to
// deployed clients, so its numbers must not round (a stream's default precision keeps 6 digits:
// density=0.0123456789 would reach the client as 0.0123457, another k).
std::string exactText(double v);

}  // namespace starling::compression
