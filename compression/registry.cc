#include "compression/registry.h"

#include <sstream>

#include "compression/dense.h"
#include "compression/lowrank.h"
#include "compression/quantize.h"
#include "compression/sparsify.h"

namespace starling::compression {
namespace {

// Defaults that differ from the option structs' (docs/compression.md, "Compression in federated
// rounds", measured with bench/ef_study.py and bench/learning_per_byte.sh): random-k, random-block,
// sign and the low-rank compressors train from the global model plus their residual (step-ahead
// EF); top-k keeps plain EF.
RandomSparsifyOptions aheadSparsifyDefaults() {
  RandomSparsifyOptions o;
  o.ef.preview = 1.0;
  return o;
}
LowRankOptions aheadLowRankDefaults() {
  LowRankOptions o;
  o.ef.preview = 1.0;
  return o;
}
SignOptions aheadSignDefaults() {
  SignOptions o;
  o.ef.preview = 1.0;
  return o;
}

// The error-feedback keys every compressor with error feedback accepts (compressor.h).
ErrorFeedback readFeedback(OptionReader& r, ErrorFeedback d) {
  d.on = r.flag("ef", d.on);
  if (!d.on)
    d = ErrorFeedback{};  // off: no variant applies (validate() refuses one given with ef=false)
  d.decay = r.number("ef_decay", d.decay);
  d.preview = r.number("ef_preview", d.preview);
  d.max_age = r.count("ef_max_age", d.max_age);
  return d;
}
// The help text of those keys with a compressor's defaults.
std::string feedbackHelp(const ErrorFeedback& d) {
  std::ostringstream os;
  os << "ef=" << (d.on ? "true" : "false") << ", ef_decay=" << d.decay
     << " (residual kept x this), ef_preview=" << d.preview
     << " (train from global + this x residual), ef_max_age=" << d.max_age
     << " (drop a residual older than this many rounds; 0: never)";
  return os.str();
}

LowRankOptions readLowRank(OptionReader& r, bool powersgd) {
  LowRankOptions o = aheadLowRankDefaults();
  o.rank = r.count("rank", o.rank);
  o.min_compression_rate = r.number("min_rate", o.min_compression_rate);
  o.ef = readFeedback(r, o.ef);
  if (powersgd) {
    o.two_phase = r.choice("mode", "two_phase", {"two_phase", "local"}) == "two_phase";
    o.warm_start = r.flag("warm_start", o.warm_start);
  }
  return o;
}

RandomSparsifyOptions readRandomSparsify(OptionReader& r, RandomSparsifyOptions o) {
  o.density = r.number("density", o.density);
  o.ef = readFeedback(r, o.ef);
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
           "density=0.01 (fraction kept), scope=layer|global, " + feedbackHelp(TopKOptions{}.ef),
           [](OptionReader& r) {
             TopKOptions o;
             o.density = r.number("density", o.density);
             o.scope = r.choice("scope", "layer", {"layer", "global"}) == "layer"
                           ? TopKOptions::Scope::kLayer
                           : TopKOptions::Scope::kGlobal;
             o.ef = readFeedback(r, o.ef);
             return std::make_unique<TopKCompressor>(o);
           }},
          {"stc",
           "sparse ternary (Sattler et al.): top-k, every kept value +-mu, with error feedback",
           "density=0.01, " + feedbackHelp(TopKOptions{}.ef),
           [](OptionReader& r) {
             TopKOptions o;
             o.ternary = true;
             o.density = r.number("density", o.density);
             o.ef = readFeedback(r, o.ef);
             return std::make_unique<TopKCompressor>(o);
           }},
          {"randk", "k random positions per tensor with error feedback; index + value each",
           "density=0.01, positions=client|shared (each client's own draw, or the round's for "
           "every client), " +
               feedbackHelp(aheadSparsifyDefaults().ef),
           [](OptionReader& r) {
             RandomSparsifyOptions o = readRandomSparsify(r, aheadSparsifyDefaults());
             o.shared_positions = r.choice("positions", "client", {"client", "shared"}) == "shared";
             return std::make_unique<RandKCompressor>(o);
           }},
          {"randblock", "one random contiguous block per tensor, shared offset, no indices",
           "density=0.01, offset=shared|client (one block offset per round, or per client), " +
               feedbackHelp(aheadSparsifyDefaults().ef),
           [](OptionReader& r) {
             RandomSparsifyOptions o = readRandomSparsify(r, aheadSparsifyDefaults());
             o.per_client_offset = r.choice("offset", "shared", {"shared", "client"}) == "client";
             return std::make_unique<RandBlockCompressor>(o);
           }},
          {"sign", "EF-SignSGD: 1 bit per value plus a scale per tensor",
           feedbackHelp(aheadSignDefaults().ef),
           [](OptionReader& r) {
             SignOptions o = aheadSignDefaults();
             o.ef = readFeedback(r, o.ef);
             return std::make_unique<SignCompressor>(o);
           }},
          {"qsgd", "QSGD: unbiased stochastic levels, 1+log2(s+1) bits per value",
           "levels=16 (s), " + feedbackHelp(QsgdOptions{}.ef),
           [](OptionReader& r) {
             QsgdOptions o;
             o.levels = r.count("levels", o.levels);
             o.ef = readFeedback(r, o.ef);
             return std::make_unique<QsgdCompressor>(o);
           }},
          {"powersgd",
           "PowerSGD rank-r factors: two phases per round against shared factors (mode=two_phase), "
           "or P and Q "
           "from each client (mode=local)",
           "rank=4, min_rate=2, mode=two_phase|local, warm_start=true (local mode), " +
               feedbackHelp(aheadLowRankDefaults().ef),
           [](OptionReader& r) {
             return std::make_unique<PowerSgdCompressor>(readLowRank(r, true));
           }},
          {"acpsgd", "ACP-SGD: one low-rank factor per round against the round's shared factor",
           "rank=4, min_rate=2, " + feedbackHelp(aheadLowRankDefaults().ef),
           [](OptionReader& r) {
             return std::make_unique<AcpSgdCompressor>(readLowRank(r, false));
           }},
      });
  return kRegistry;
}

std::unique_ptr<Compressor> makeCompressor(const Spec& spec) { return compressors().make(spec); }
std::unique_ptr<Compressor> makeCompressor(std::string_view spec) {
  return compressors().make(spec);
}

}  // namespace starling::compression
