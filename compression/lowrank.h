#pragma once
// Low-rank compression of each tensor's matrix view M = [shape0, numel/shape0], rank
// r = min(rank, rows, cols). A tensor is compressed only if (rows + cols) * r * min_rate <
// rows * cols (1-D tensors never are); the others travel dense and exact.
//
//   powersgd (Vogels et al. 2019), client-local form, compress():
//     P = M Q; orthogonalize(P); Q = M^T P; residual = M - P Q^T; send P and Q.
//     Q is warm-started from this client's previous Q (state.factors), or seeded identically on
//     every client at first use. Each client's P differs, so a receiver densifies P Q^T.
//   powersgd, aggregator-driven two-phase form (compressPhaseP / compressPhaseQ):
//     phase P: send P_i = M_i Q with the round's shared Q; the aggregator sums and orthogonalizes
//     them into P-hat; phase Q: send Q_i = M_i^T P-hat, residual_i = M_i - P-hat Q_i^T; the
//     aggregate is P-hat (sum_i w_i Q_i)^T / W and sum Q / W warm-starts the next round.
//   acpsgd (Zhang, Shi et al., ICDCS'23): one factor per round. With the round's shared
//     orthonormal Q-hat: send P_i = M_i Q-hat; with shared P-hat: send Q_i = M_i^T P-hat;
//     residual_i = M_i - (what was sent, expanded with the shared factor). The aggregator
//     orthogonalizes the summed factor; it becomes the next round's shared (fixed) side.
// M includes the residual when error feedback is on. Orthogonalization is Gram-Schmidt for
// r <= 2 and Householder QR above.
#include "compression/compressor.h"

namespace starling::compression {

struct LowRankOptions {
  uint32_t rank = 4;
  double min_compression_rate = 2.0;
  bool error_feedback = true;
  bool warm_start = true;  // powersgd client-local form only
  void validate() const;
};

uint32_t effectiveRank(const TensorSpec& t, uint32_t rank);
bool lowRankCompressible(const TensorSpec& t, uint32_t rank, double min_compression_rate);

// Makes the columns of the row-major rows x rank matrix orthonormal, in place. A column that is
// (numerically) zero after removing the earlier ones stays zero.
void orthogonalize(float* data, size_t rows, size_t rank);

// The seeded factor every client starts from: side kQ, orthonormal cols x r per compressible
// tensor, drawn from (run_seed, kLowRankInit, tensor index) only.
SharedFactors initialSharedFactors(const ParamLayout& layout, const LowRankOptions& o, uint64_t run_seed);

class PowerSgdCompressor final : public Compressor {
 public:
  explicit PowerSgdCompressor(LowRankOptions o);
  std::string name() const override { return "powersgd"; }
  std::string spec() const override;
  bool usesErrorFeedback() const override { return opt_.error_feedback; }
  const LowRankOptions& options() const { return opt_; }

  // Two-phase form. Phase P needs ctx.shared with side kQ (the round's Q); it returns a P-only
  // LowRank payload per compressed tensor and the final DenseF32 payload for the others. Phase Q
  // needs ctx.shared with side kP (the orthogonalized P-hat) and returns a Q-only payload per
  // compressed tensor and an empty Sparse payload (nothing more to send) for the others.
  std::vector<Payload> compressPhaseP(const ParamLayout& layout, std::span<const float> update, ClientState& state,
                                      const RoundContext& ctx) const;
  std::vector<Payload> compressPhaseQ(const ParamLayout& layout, ClientState& state, const RoundContext& ctx) const;

 protected:
  std::vector<Payload> compressAccumulated(const ParamLayout& layout, std::span<float> acc, ClientState& state,
                                           const RoundContext& ctx) const override;
  void initState(const ParamLayout& layout, ClientState& state) const override;
  void checkRound(const ParamLayout& layout, const ClientState& state, const RoundContext& ctx) const override;

 private:
  LowRankOptions opt_;
};

class AcpSgdCompressor final : public Compressor {
 public:
  explicit AcpSgdCompressor(LowRankOptions o);
  std::string name() const override { return "acpsgd"; }
  std::string spec() const override;
  bool usesErrorFeedback() const override { return opt_.error_feedback; }
  const LowRankOptions& options() const { return opt_; }

 protected:
  std::vector<Payload> compressAccumulated(const ParamLayout& layout, std::span<float> acc, ClientState& state,
                                           const RoundContext& ctx) const override;
  void checkRound(const ParamLayout& layout, const ClientState& state, const RoundContext& ctx) const override;

 private:
  LowRankOptions opt_;
};

// Checks that `shared` has side `side` and a factor of the right size for every compressed
// tensor (and none for the others). Throws InvalidArgument.
void checkSharedFactors(const ParamLayout& layout, const LowRankOptions& o, const SharedFactors* shared,
                        SharedFactors::Side side, const char* who);

}  // namespace starling::compression
