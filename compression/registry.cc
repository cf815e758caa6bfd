#include "compression/registry.h"

#include <charconv>
#include <functional>
#include <map>
#include <set>

#include "compression/dense.h"
#include "compression/lowrank.h"
#include "compression/quantize.h"
#include "compression/sparsify.h"
#include "core/error.h"

namespace starling::compression {
namespace {

// Reads typed options by key; every key must be consumed exactly once.
class OptionReader {
 public:
  explicit OptionReader(const CompressorSpec& s) : spec_(s) {
    for (const auto& [k, v] : s.options) {
      if (!values_.emplace(k, v).second)
        STARLING_THROW(ConfigError, "compressor '", s.name, "': option '", k, "' given twice");
    }
  }
  double number(const std::string& key, double def) {
    auto v = take(key);
    if (!v) return def;
    double d = 0;
    auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), d);
    if (ec != std::errc() || p != v->data() + v->size())
      STARLING_THROW(ConfigError, "compressor '", spec_.name, "': option ", key, "='", *v, "' is not a number");
    return d;
  }
  uint32_t count(const std::string& key, uint32_t def) {
    auto v = take(key);
    if (!v) return def;
    uint32_t d = 0;
    auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), d);
    if (ec != std::errc() || p != v->data() + v->size())
      STARLING_THROW(ConfigError, "compressor '", spec_.name, "': option ", key, "='", *v,
                     "' is not a non-negative integer");
    return d;
  }
  bool flag(const std::string& key, bool def) {
    auto v = take(key);
    if (!v) return def;
    if (*v == "true" || *v == "1" || *v == "on") return true;
    if (*v == "false" || *v == "0" || *v == "off") return false;
    STARLING_THROW(ConfigError, "compressor '", spec_.name, "': option ", key, "='", *v, "' is not true/false");
  }
  std::string choice(const std::string& key, const std::string& def, const std::set<std::string>& allowed) {
    auto v = take(key);
    if (!v) return def;
    if (!allowed.count(*v)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      STARLING_THROW(ConfigError, "compressor '", spec_.name, "': option ", key, "='", *v, "' must be one of: ", list);
    }
    return *v;
  }
  void finish(const std::string& accepted) {
    if (values_.empty()) return;
    STARLING_THROW(ConfigError, "compressor '", spec_.name, "': unknown option '", values_.begin()->first,
                   "' (accepted: ", accepted.empty() ? "none" : accepted, ")");
  }

 private:
  std::optional<std::string> take(const std::string& key) {
    auto it = values_.find(key);
    if (it == values_.end()) return std::nullopt;
    std::string v = it->second;
    values_.erase(it);
    return v;
  }
  const CompressorSpec& spec_;
  std::map<std::string, std::string> values_;
};

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

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace

CompressorSpec CompressorSpec::parse(std::string_view text) {
  CompressorSpec s;
  const auto colon = text.find(':');
  s.name = trim(text.substr(0, colon));
  if (s.name.empty()) STARLING_THROW(ConfigError, "compressor spec '", text, "' has no name");
  if (colon == std::string_view::npos) return s;
  std::string_view rest = text.substr(colon + 1);
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos)
      STARLING_THROW(ConfigError, "compressor spec '", text, "': option '", trim(item), "' is not key=value");
    std::string key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    if (key.empty() || value.empty())
      STARLING_THROW(ConfigError, "compressor spec '", text, "': option '", trim(item), "' has an empty key or value");
    s.options.emplace_back(std::move(key), std::move(value));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return s;
}

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
    OptionReader reader(spec);
    auto c = e.make(reader);
    reader.finish(e.info.options);
    return c;
  }
  std::string names;
  for (const auto& e : entries()) names += (names.empty() ? "" : ", ") + e.info.name;
  STARLING_THROW(ConfigError, "unknown compressor '", spec.name, "' (registered: ", names, ")");
}

std::unique_ptr<Compressor> makeCompressor(std::string_view spec) { return makeCompressor(CompressorSpec::parse(spec)); }

}  // namespace starling::compression
