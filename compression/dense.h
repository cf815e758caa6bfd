#pragma once
// Dense codecs: "none" (f32 as is), "fp16" (IEEE binary16, values clamped to +-65504), "bf16".
// Stateless; the rounding error is not fed back.
#include "compression/compressor.h"

namespace starling::compression {

enum class DenseFormat { kF32, kF16, kBF16 };

class DenseCompressor final : public Compressor {
 public:
  explicit DenseCompressor(DenseFormat format) : format_(format) {}
  std::string name() const override;
  std::string spec() const override { return name(); }
  bool supportIsShared() const override { return true; }
  std::string secureRefusal() const override {
    if (format_ == DenseFormat::kF32) return {};
    return "the masked words are secagg.bits wide whatever the format, so it would only round "
           "twice: for fewer bytes lower secagg.bits (the ring is a quantisation of one scale for "
           "the round)";
  }
  SharedSupport sharedSupport(const ParamLayout&, const RoundContext&) const override { return {}; }
  void checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                     const RoundContext& ctx) const override;

 protected:
  std::vector<Payload> encode(const ParamLayout& layout, std::span<const float> input,
                              std::span<float> residual, const ClientState& state,
                              const RoundContext& ctx, StagedState& staged) const override;

 private:
  DenseFormat format_;
};

}  // namespace starling::compression
