#include "server/model_store.h"

#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "core/overloaded.h"

namespace starling::server {
namespace cz = starling::compression;

Downlink parseDownlink(std::string_view s) {
  if (s == "dense") return Downlink::kDense;
  if (s == "fp16") return Downlink::kFp16;
  if (s == "delta") return Downlink::kDelta;
  STARLING_THROW(ConfigError, "downlink must be dense, fp16 or delta, got '", s, "'");
}

const char* downlinkName(Downlink d) {
  switch (d) {
    case Downlink::kDense: return "dense";
    case Downlink::kFp16: return "fp16";
    case Downlink::kDelta: return "delta";
  }
  return "?";
}

ModelStore::ModelStore(std::shared_ptr<const ParamLayout> layout, size_t history)
    : layout_(std::move(layout)), history_(history) {
  versions_.push_back(Version{0, std::vector<float>(layout_->numel())});
}

void ModelStore::set(std::vector<float> model, uint64_t version) {
  STARLING_CHECK_ARG(model.size() == layout_->numel(), "model of ", model.size(), " values, layout has ", layout_->numel());
  STARLING_CHECK_ARG(version > versions_.back().version || versions_.size() == 1, "model version ", version,
                     " does not follow ", versions_.back().version);
  if (history_ == 0 || (versions_.size() == 1 && versions_.back().version == 0)) versions_.clear();
  versions_.push_back(Version{version, std::move(model)});
  while (versions_.size() > history_ + 1) versions_.pop_front();
}

EncodedModel ModelStore::encodeFor(uint64_t held, Downlink mode) const {
  EncodedModel out;
  const auto& cur = versions_.back().values;
  const auto& tensors = layout_->tensors();
  if (mode == Downlink::kDelta && held != 0 && held != versions_.back().version) {
    for (const auto& v : versions_) {
      if (v.version != held) continue;
      // Changed coordinates with their new values: 8 bytes each, so worth it below half changed.
      size_t changed = 0;
      for (size_t i = 0; i < cur.size(); ++i) changed += std::memcmp(&cur[i], &v.values[i], sizeof(float)) != 0;
      if (2 * changed >= cur.size()) break;
      out.base_version = held;
      for (const auto& t : tensors) {
        cz::Sparse s;
        for (size_t j = 0; j < t.numel; ++j)
          if (std::memcmp(&cur[t.offset + j], &v.values[t.offset + j], sizeof(float)) != 0) {
            s.indices.push_back(static_cast<uint32_t>(j));
            s.values.push_back(cur[t.offset + j]);
          }
        out.tensors.push_back(std::move(s));
      }
      return out;
    }
  }
  for (const auto& t : tensors) {
    const std::span<const float> src(cur.data() + t.offset, t.numel);
    if (mode == Downlink::kFp16) {
      cz::DenseF16 h;
      h.values.resize(t.numel);
      for (size_t j = 0; j < t.numel; ++j) h.values[j] = floatToHalf(src[j]);
      out.tensors.push_back(std::move(h));
    } else {
      out.tensors.push_back(cz::DenseF32{std::vector<float>(src.begin(), src.end())});
    }
  }
  return out;
}

}  // namespace starling::server
