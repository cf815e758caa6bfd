#include "compression/registry.h"

#include <functional>

#include "compression/dense.h"
#include "compression/lowrank.h"
#include "compression/quantize.h"
#include "compression/sparsify.h"
#include "core/error.h"
#include "core/options.h"

namespace starling::compression {
namespace {

struct Entry {
  CompressorInfo info;
  std::function<std::unique_ptr<Compressor>(OptionReader&)> make;
};

LowRankOptions readLowRank(OptionReader& r, bool warm) {
  LowRankOptions o;
  o.rank = r.count("rank", o.rank);
  o.min_compression_rate = r.number("min_rate", o.min_compression_rate);
  o.error_feedback = r.flag("ef", o.error_feedback);
  if (warm) o.warm_start = r.flag("warm_start", o.warm_start);
  return o;
}

const std::vector<Entry>& entries() {
  static const std::vector<Entry> kEntries = {
      {{"none", "dense float32, exact", ""},
       [](OptionReader&) { return std::make_unique<DenseCompressor>(DenseFormat::kF32); }},
      {{"fp16", "dense IEEE half precision (clamped to +-65504), 2 bytes/value", ""},
       [](OptionReader&) { return std::make_unique<DenseCompressor>(DenseFormat::kF16); }},
      {{"bf16", "dense bfloat16, 2 bytes/value", ""},
       [](OptionReader&) { return std::make_unique<DenseCompressor>(DenseFormat::kBF16); }},
      {{"topk", "exact top-k magnitudes with error feedback; u32 index + f32 value each",
        "density=0.01 (fraction kept), scope=layer|global, ef=true"},
       [](OptionReader& r) {
         TopKOptions o;
         o.density = r.number("density", o.density);
         o.scope = r.choice("scope", "layer", {"layer", "global"}) == "layer" ? TopKOptions::Scope::kLayer
                                                                            : TopKOptions::Scope::kGlobal;
         o.error_feedback = r.flag("ef", o.error_feedback);
         return std::make_unique<TopKCompressor>(o);
       }},
      {{"randk", "k random positions per tensor with error feedback; index + value each",
        "density=0.01, ef=true"},
       [](OptionReader& r) {
         RandomSparsifyOptions o;
         o.density = r.number("density", o.density);
         o.error_feedback = r.flag("ef", o.error_feedback);
         return std::make_unique<RandKCompressor>(o);
       }},
      {{"randblock", "one random contiguous block per tensor, shared offset, no indices",
        "density=0.01, ef=true"},
       [](OptionReader& r) {
         RandomSparsifyOptions o;
         o.density = r.number("density", o.density);
         o.error_feedback = r.flag("ef", o.error_feedback);
         return std::make_unique<RandBlockCompressor>(o);
       }},
      {{"sign", "EF-SignSGD: 1 bit per value plus a scale per tensor", "ef=true"},
       [](OptionReader& r) {
         SignOptions o;
         o.error_feedback = r.flag("ef", o.error_feedback);
         return std::make_unique<SignCompressor>(o);
       }},
      {{"qsgd", "QSGD: unbiased stochastic levels, 1+log2(s+1) bits per value", "levels=16 (s), ef=false"},
       [](OptionReader& r) {
         QsgdOptions o;
         o.levels = r.count("levels", o.levels);
         o.error_feedback = r.flag("ef", o.error_feedback);
         return std::make_unique<QsgdCompressor>(o);
       }},
      {{"powersgd", "PowerSGD rank-r factors P and Q per matrix (client-local form)",
        "rank=4, min_rate=2, ef=true, warm_start=true"},
       [](OptionReader& r) { return std::make_unique<PowerSgdCompressor>(readLowRank(r, true)); }},
      {{"acpsgd", "ACP-SGD: one low-rank factor per round against the round's shared factor",
        "rank=4, min_rate=2, ef=true"},
       [](OptionReader& r) { return std::make_unique<AcpSgdCompressor>(readLowRank(r, false)); }},
  };
  return kEntries;
}

}  // namespace

const std::vector<CompressorInfo>& compressorCatalog() {
  static const std::vector<CompressorInfo> kCatalog = [] {
    std::vector<CompressorInfo> v;
    for (const auto& e : entries()) v.push_back(e.info);
    return v;
  }();
  return kCatalog;
}

std::unique_ptr<Compressor> makeCompressor(const CompressorSpec& spec) {
  for (const auto& e : entries()) {
    if (e.info.name != spec.name) continue;
    OptionReader reader(spec, "compressor");
    auto c = e.make(reader);
    reader.finish(e.info.options);
    return c;
  }
  std::string names;
  for (const auto& e : entries()) names += (names.empty() ? "" : ", ") + e.info.name;
  STARLING_THROW(ConfigError, "unknown compressor '", spec.name, "' (registered: ", names, ")");
}

std::unique_ptr<Compressor> makeCompressor(std::string_view spec) {
  return makeCompressor(Spec::parse(spec, "compressor"));
}

}  // namespace starling::compression
