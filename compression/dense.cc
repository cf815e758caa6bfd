#include "compression/dense.h"

#include <algorithm>

#include "core/half.h"

namespace starling::compression {

std::string DenseCompressor::name() const {
  switch (format_) {
    case DenseFormat::kF32:
      return "none";
    case DenseFormat::kF16:
      return "fp16";
    case DenseFormat::kBF16:
      return "bf16";
  }
  return "none";
}

void DenseCompressor::checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                                    const RoundContext& /*ctx*/) const {
  const bool ok = (format_ == DenseFormat::kF32 && std::holds_alternative<DenseF32View>(p)) ||
                  (format_ == DenseFormat::kF16 && std::holds_alternative<DenseF16View>(p)) ||
                  (format_ == DenseFormat::kBF16 && std::holds_alternative<DenseBF16View>(p));
  if (!ok)
    unexpected(layout, t, p,
               format_ == DenseFormat::kF32   ? "dense_f32"
               : format_ == DenseFormat::kF16 ? "dense_f16"
                                              : "dense_bf16");
}

std::vector<Payload> DenseCompressor::encode(
    const ParamLayout& layout, std::span<const float> input, std::span<float> /*residual*/,
    const ClientState& /*state*/, const RoundContext& /*ctx*/, StagedState& /*staged*/) const {
  std::vector<Payload> out;
  out.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    auto v = layout.slice(input, t);
    switch (format_) {
      case DenseFormat::kF32:
        out.emplace_back(DenseF32{{v.begin(), v.end()}});
        break;
      case DenseFormat::kF16: {
        DenseF16 d;
        d.values.resize(v.size());
        for (size_t i = 0; i < v.size(); ++i)
          d.values[i] = floatToHalf(std::clamp(v[i], -kHalfMax, kHalfMax));
        out.emplace_back(std::move(d));
        break;
      }
      case DenseFormat::kBF16: {
        DenseBF16 d;
        d.values.resize(v.size());
        // Finite floats near FLT_MAX would round up to bf16 inf: clamp to the largest finite bf16.
        constexpr float kBf16Max = 0x1.fep127f;
        for (size_t i = 0; i < v.size(); ++i)
          d.values[i] = floatToBf16(std::clamp(v[i], -kBf16Max, kBf16Max));
        out.emplace_back(std::move(d));
        break;
      }
    }
  }
  return out;
}

}  // namespace starling::compression
