#include "compression/registry.h"

#include "compression/dense.h"
#include "compression/lowrank.h"
#include "compression/quantize.h"
#include "compression/sparsify.h"

namespace starling::compression {
namespace {

LowRankOptions readLowRank(OptionReader& r, bool powersgd) {
  LowRankOptions o;
  o.rank = r.count("rank", o.rank);
  o.min_compression_rate = r.number("min_rate", o.min_compression_rate);
  o.error_feedback = r.flag("ef", o.error_feedback);
  if (powersgd) {
    o.two_phase = r.choice("mode", "two_phase", {"two_phase", "local"}) == "two_phase";
    o.warm_start = r.flag("warm_start", o.warm_start);
  }
  return o;
}

RandomSparsifyOptions readRandomSparsify(OptionReader& r) {
  RandomSparsifyOptions o;
  o.density = r.number("density", o.density);
  o.error_feedback = r.flag("ef", o.error_feedback);
  return o;
}

}  // namespace

const CompressorRegistry& compressors() {
  static const CompressorRegistry kRegistry(
      "compressor",
      {
          {"none", "dense float32, exact", "",
           [](OptionReader&) { return std::make_unique<DenseCompressor>(DenseFormat::kF32); }},
          {"fp16", "dense IEEE half precision (clamped to +-65504), 2 bytes/value", "",
           [](OptionReader&) { return std::make_unique<DenseCompressor>(DenseFormat::kF16); }},
          {"bf16", "dense bfloat16, 2 bytes/value", "",
           [](OptionReader&) { return std::make_unique<DenseCompressor>(DenseFormat::kBF16); }},
          {"topk", "exact top-k magnitudes with error feedback; u32 index + f32 value each",
           "density=0.01 (fraction kept), scope=layer|global, ef=true",
           [](OptionReader& r) {
             TopKOptions o;
             o.density = r.number("density", o.density);
             o.scope = r.choice("scope", "layer", {"layer", "global"}) == "layer" ? TopKOptions::Scope::kLayer
                                                                                : TopKOptions::Scope::kGlobal;
             o.error_feedback = r.flag("ef", o.error_feedback);
             return std::make_unique<TopKCompressor>(o);
           }},
          {"randk", "k random positions per tensor with error feedback; index + value each", "density=0.01, ef=true",
           [](OptionReader& r) { return std::make_unique<RandKCompressor>(readRandomSparsify(r)); }},
          {"randblock", "one random contiguous block per tensor, shared offset, no indices", "density=0.01, ef=true",
           [](OptionReader& r) { return std::make_unique<RandBlockCompressor>(readRandomSparsify(r)); }},
          {"sign", "EF-SignSGD: 1 bit per value plus a scale per tensor", "ef=true",
           [](OptionReader& r) {
             SignOptions o;
             o.error_feedback = r.flag("ef", o.error_feedback);
             return std::make_unique<SignCompressor>(o);
           }},
          {"qsgd", "QSGD: unbiased stochastic levels, 1+log2(s+1) bits per value", "levels=16 (s), ef=false",
           [](OptionReader& r) {
             QsgdOptions o;
             o.levels = r.count("levels", o.levels);
             o.error_feedback = r.flag("ef", o.error_feedback);
             return std::make_unique<QsgdCompressor>(o);
           }},
          {"powersgd",
           "PowerSGD rank-r factors: two phases per round against shared factors (mode=two_phase), or P and Q "
           "from each client (mode=local)",
           "rank=4, min_rate=2, ef=true, mode=two_phase|local, warm_start=true (local mode)",
           [](OptionReader& r) { return std::make_unique<PowerSgdCompressor>(readLowRank(r, true)); }},
          {"acpsgd", "ACP-SGD: one low-rank factor per round against the round's shared factor",
           "rank=4, min_rate=2, ef=true",
           [](OptionReader& r) { return std::make_unique<AcpSgdCompressor>(readLowRank(r, false)); }},
      });
  return kRegistry;
}

std::unique_ptr<Compressor> makeCompressor(const Spec& spec) { return compressors().make(spec); }
std::unique_ptr<Compressor> makeCompressor(std::string_view spec) { return compressors().make(spec); }

}  // namespace starling::compression
