#pragma once
// Quantizers.
//   sign  EF-SignSGD (Karimireddy et al. 2019): per tensor, p = input + residual, send the sign
//         bits of p and scale = ||p||_1 / numel (the sum correctly rounded to double, exact_sum.h,
//         so the same bits on any device); residual = p - scale * sign(p). 1 bit per value.
//   qsgd  QSGD (Alistarh et al. 2017): per tensor, norm = ||v||_2 (the sum of squares correctly
//         rounded, exact_sum.h), level_i = floor(s|v_i|/norm) rounded up with probability
//         s|v_i|/norm - floor(.), value i's draw of the client's counter-based stream
//         (CounterStream, core/rng.h), so E[decoded] = v and the device draws the same. 1 +
//         ceil(log2(s+1)) bits per value plus the norm. Error feedback is off by default (the
//         estimate is unbiased) and may be turned on.
#include "compression/compressor.h"

namespace starling::compression {

struct SignOptions {
  ErrorFeedback ef{.on = true};
};

struct QsgdOptions {
  uint32_t levels = 16;  // s, in [1, 65535]
  ErrorFeedback ef{.on = false};
  void validate() const;
};

class SignCompressor final : public Compressor {
 public:
  explicit SignCompressor(SignOptions o) : opt_(o) { opt_.ef.validate("sign"); }
  std::string name() const override { return "sign"; }
  std::string spec() const override;
  const ErrorFeedback& feedback() const override { return opt_.ef; }
  void checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                     const RoundContext& ctx) const override;

 protected:
  std::vector<Payload> encode(const ParamLayout& layout, std::span<const float> input,
                              std::span<float> residual, const ClientState& state,
                              const RoundContext& ctx, StagedState& staged) const override;

 private:
  SignOptions opt_;
};

class QsgdCompressor final : public Compressor {
 public:
  explicit QsgdCompressor(QsgdOptions o);
  std::string name() const override { return "qsgd"; }
  std::string spec() const override;
  const QsgdOptions& options() const { return opt_; }
  const ErrorFeedback& feedback() const override { return opt_.ef; }
  void checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                     const RoundContext& ctx) const override;

 protected:
  std::vector<Payload> encode(const ParamLayout& layout, std::span<const float> input,
                              std::span<float> residual, const ClientState& state,
                              const RoundContext& ctx, StagedState& staged) const override;

 private:
  QsgdOptions opt_;
};

}  // namespace starling::compression
