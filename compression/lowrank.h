#pragma once
// Low-rank compression of each tensor's matrix view M = [shape0, numel/shape0], rank
// r = min(rank, rows, cols). A tensor is compressed only if (rows + cols) * r * min_rate <
// rows * cols (1-D tensors never are); the others travel dense and exact.
//
//   powersgd (Vogels et al. 2019), mode=two_phase (the default): two phases inside one round.
//     phase P: with the round's shared Q, send P_i = M_i Q (dense tensors go whole); the
//              aggregator sums and orthogonalizes them into P-hat (nextShared).
//     phase Q: with the shared P-hat, send Q_i = M_i^T P-hat; residual_i = M_i - P-hat Q_i^T. The
//              update is P-hat (sum_i w_i Q_i)^T / W; orth(sum_i w_i Q_i) warm-starts the next
//              round (orthonormalized, unlike Vogels et al., so that its scale cannot grow and push
//              honest phase-P factors past the round's bounds; P-hat, and so the update, is
//              unchanged).
//     M_i is kept in the client's residual buffer between the phases (EF or not). A client that
//     missed phase Q starts the next round with M_i as its residual (EF) or drops it (no EF).
//   powersgd, mode=local: one phase, both factors: P = M Q; orthogonalize(P); Q = M^T P;
//     residual = M - P Q^T; send P and Q. Q warm-starts from this client's previous Q (state) or
//     the seeded factor. Each client's P differs, so a receiver densifies P Q^T.
//   acpsgd (Zhang, Shi et al., ICDCS'23): one factor per round. With the round's shared
//     orthonormal Q-hat: send P_i = M_i Q-hat; with shared P-hat: send Q_i = M_i^T P-hat;
//     residual_i = M_i - (what was sent, expanded with the shared factor). The aggregator
//     orthogonalizes the summed factor; it becomes the next round's shared (fixed) side.
// M includes the residual when error feedback is on. Orthogonalization is Gram-Schmidt for
// r <= 2 and Householder QR above. A shared factor column that the aggregate leaves zero (a zero
// update) is replaced by a column seeded from (run seed, round, tensor), identically everywhere,
// so the subspace never collapses.
#include "compression/compressor.h"

namespace starling::compression {

struct LowRankOptions {
  uint32_t rank = 4;
  double min_compression_rate = 2.0;
  ErrorFeedback ef{.on = true};
  bool warm_start = true;  // powersgd mode=local only
  bool two_phase = true;   // powersgd only: mode=two_phase (true) or mode=local
  void validate() const;
};

uint32_t effectiveRank(const TensorSpec& t, uint32_t rank);
bool lowRankCompressible(const TensorSpec& t, uint32_t rank, double min_compression_rate);

// The encodings' three products, every entry rounded once from a fixed order of exact terms, so
// that any device that follows the order computes the same bits (torch_trainer/device_compress.h
// does, on a GPU or the CPU): each term is a float times a float, exact in double, and the sum is
// rounded to float once (the residual's after subtracting it, in double, from the residual's
// float). The order: a product's n terms t_0 .. t_{n-1} go to L = kProductLanes lanes, each lane
// summing its terms in index order from +0, and the lanes are added by halvingSum. Along a row of
// M (P = M Q) the lanes interleave: lane l holds t_l, t_{l+L}, t_{l+2L}, ...; down a column
// (Q = M^T P) they are runs: lane l holds t_{lc} .. t_{lc+c-1}, c = ceil(n / L). The residual's r
// terms are added by halvingSum. M is rows x
// cols, P rows x r, Q cols x r, all row-major. P and Q must not overlap M. InvalidArgument for
// sizes that do not agree.
//   factorProduct:           P = M Q          (terms along a row of M)
//   transposedFactorProduct: Q = M^T P        (terms along a column of M)
//   subtractFactorProduct:   M = M - P Q^T    (r terms an entry)
inline constexpr size_t kProductLanes = 32;
void factorProduct(std::span<const float> m, size_t rows, size_t cols, std::span<const float> q,
                   size_t r, std::span<float> p);
void transposedFactorProduct(std::span<const float> m, size_t rows, size_t cols,
                             std::span<const float> p, size_t r, std::span<float> q);
void subtractFactorProduct(std::span<float> m, size_t rows, size_t cols, std::span<const float> p,
                           std::span<const float> q, size_t r);
// x[0] + ... + x[n-1] in double by halving, in place: while n > 1, x[j] += x[j + n/2] for
// j < n/2, an odd last term moves to x[n/2], n becomes ceil(n/2). 0 for n = 0.
double halvingSum(double* x, size_t n);

// Makes the columns of the row-major rows x rank matrix orthonormal, in place. A column that is
// (numerically) zero after removing the earlier ones stays zero.
void orthogonalize(float* data, size_t rows, size_t rank);

// The seeded factor every client starts from: side kQ, orthonormal cols x r per compressible
// tensor, drawn from (run_seed, kLowRankInit, tensor index) only.
SharedFactors initialSharedFactors(const ParamLayout& layout, const LowRankOptions& o,
                                   uint64_t run_seed);

// Two-phase PowerSGD's and local PowerSGD's per-client state (component kPowerSgdComponent):
// the warm-start Q per tensor (local mode) and whether phase Q is due.
inline constexpr std::string_view kPowerSgdComponent = "compression.powersgd";
class PowerSgdState final : public StateComponent {
 public:
  std::vector<std::vector<float>> factors;
  uint8_t pending_phase = 0;
  uint32_t version() const override { return 1; }
  void save(ByteWriter& w) const override;
  void load(ByteReader& r, uint32_t version) override;
  size_t memoryBytes() const override;
};

class PowerSgdCompressor final : public Compressor {
 public:
  explicit PowerSgdCompressor(LowRankOptions o);
  std::string name() const override { return "powersgd"; }
  // Two-phase: each phase's factor is a sum (P against the shared Q, then Q against P-hat), so
  // each phase is a secure sum of its own (the round engine runs one exchange per phase).
  std::string secureRefusal() const override {
    return opt_.two_phase
               ? std::string()
               : "mode=local sends each client's own two factors, whose product is no sum "
                 "(mode=two_phase, or acpsgd, one factor a round against the shared one, composes)";
  }
  size_t secureSize(const ParamLayout& layout, const RoundContext& ctx) const override;
  std::vector<float> secureValues(const ParamLayout& layout, const RoundContext& ctx,
                                  const std::vector<Payload>& update) const override;
  std::vector<Payload> securePayloads(const ParamLayout& layout, const RoundContext& ctx,
                                      std::span<const float> sum) const override;
  std::string spec() const override;
  const ErrorFeedback& feedback() const override { return opt_.ef; }
  const LowRankOptions& options() const { return opt_; }
  // Local mode: the Q that tensor t's P = M Q starts from, the client's warm Q from `state` (when
  // warm_start and it has one of the right size; `state` may be null) or the seeded factor.
  std::vector<float> localStartFactor(const ParamLayout& layout, size_t t, const ClientState* state,
                                      const RoundContext& ctx) const;

  uint32_t phases() const override { return opt_.two_phase ? 2 : 1; }
  bool sharesFactors() const override { return opt_.two_phase; }
  SharedFactors initialShared(const ParamLayout& layout, uint64_t run_seed) const override;
  bool factorsAreUpdate(uint32_t phase) const override { return !opt_.two_phase || phase == 1; }
  SharedFactors nextShared(const ParamLayout& layout, const RoundContext& ctx,
                           const SharedFactors& current,
                           std::span<const std::span<const float>> factor_sums,
                           double total_weight) const override;
  void checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                     const RoundContext& ctx) const override;

 protected:
  std::vector<Payload> encode(const ParamLayout& layout, std::span<const float> input,
                              std::span<float> residual, const ClientState& state,
                              const RoundContext& ctx, StagedState& staged) const override;
  void checkRound(const ParamLayout& layout, const ClientState& state,
                  const RoundContext& ctx) const override;

 private:
  std::vector<Payload> encodeLocal(const ParamLayout& layout, std::span<const float> input,
                                   std::span<float> residual, const ClientState& state,
                                   const RoundContext& ctx, StagedState& staged) const;
  LowRankOptions opt_;
};

class AcpSgdCompressor final : public Compressor {
 public:
  explicit AcpSgdCompressor(LowRankOptions o);
  std::string name() const override { return "acpsgd"; }
  // Each round's one factor against the shared side is a sum: it composes with secure
  // aggregation, each tensor's factor (or dense values) masked (secureValues).
  std::string secureRefusal() const override { return {}; }
  size_t secureSize(const ParamLayout& layout, const RoundContext& ctx) const override;
  std::vector<float> secureValues(const ParamLayout& layout, const RoundContext& ctx,
                                  const std::vector<Payload>& update) const override;
  std::vector<Payload> securePayloads(const ParamLayout& layout, const RoundContext& ctx,
                                      std::span<const float> sum) const override;
  std::string spec() const override;
  const ErrorFeedback& feedback() const override { return opt_.ef; }
  const LowRankOptions& options() const { return opt_; }

  bool sharesFactors() const override { return true; }
  SharedFactors initialShared(const ParamLayout& layout, uint64_t run_seed) const override;
  SharedFactors nextShared(const ParamLayout& layout, const RoundContext& ctx,
                           const SharedFactors& current,
                           std::span<const std::span<const float>> factor_sums,
                           double total_weight) const override;
  void checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                     const RoundContext& ctx) const override;

 protected:
  std::vector<Payload> encode(const ParamLayout& layout, std::span<const float> input,
                              std::span<float> residual, const ClientState& state,
                              const RoundContext& ctx, StagedState& staged) const override;
  void checkRound(const ParamLayout& layout, const ClientState& state,
                  const RoundContext& ctx) const override;

 private:
  LowRankOptions opt_;
};

// The low-rank options of PowerSGD or ACP-SGD; null for any other compressor.
const LowRankOptions* lowRankOptionsOf(const Compressor& c);

// Checks that `shared` has side `side` and a factor of the right size for every compressed
// tensor (and none for the others). Throws InvalidArgument.
void checkSharedFactors(const ParamLayout& layout, const LowRankOptions& o,
                        const SharedFactors* shared, SharedFactors::Side side, const char* who);

}  // namespace starling::compression
