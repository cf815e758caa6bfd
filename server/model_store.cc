#include "server/model_store.h"

#include <cstring>

#include "compression/compressor.h"
#include "compression/topk_select.h"
#include "core/error.h"
#include "core/half.h"
#include "core/overloaded.h"

namespace starling::server {
namespace cz = starling::compression;

Downlink parseDownlink(std::string_view s) {
  if (s == "dense") return Downlink::kDense;
  if (s == "fp16") return Downlink::kFp16;
  if (s == "delta") return Downlink::kDelta;
  if (s == "topk") return Downlink::kTopK;
  STARLING_THROW(ConfigError, "downlink must be dense, fp16, delta or topk, got '", s, "'");
}

const char* downlinkName(Downlink d) {
  switch (d) {
    case Downlink::kDense: return "dense";
    case Downlink::kFp16: return "fp16";
    case Downlink::kDelta: return "delta";
    case Downlink::kTopK: return "topk";
  }
  return "?";
}

ModelStore::ModelStore(std::shared_ptr<const ParamLayout> layout, size_t history, double topk_density)
    : layout_(std::move(layout)), history_(history), density_(topk_density) {
  STARLING_CHECK_ARG(density_ >= 0.0 && density_ <= 1.0, "downlink density must be in (0, 1], got ", density_);
  versions_.push_back(Version{0, std::vector<float>(layout_->numel())});
}

void ModelStore::set(std::vector<float> model, uint64_t version) {
  STARLING_CHECK_ARG(model.size() == layout_->numel(), "model of ", model.size(), " values, layout has ", layout_->numel());
  const bool first = versions_.size() == 1 && versions_.back().version == 0;
  if (first) return reset(std::move(model), version);
  STARLING_CHECK_ARG(version > versions_.back().version, "model version ", version, " does not follow ",
                     versions_.back().version);
  std::vector<float> next;
  if (!lossy()) {
    next = std::move(model);
  } else {
    // x-hat refreshed where it is furthest from x: the residual x - x-hat, top-k over the model.
    server_ = std::move(model);
    next = versions_.back().values;
    std::vector<float> residual(server_.size());
    for (size_t i = 0; i < residual.size(); ++i) residual[i] = server_[i] - next[i];
    compression::selectTopK(residual, compression::countForDensity(density_, residual.size()), picked_, version);
    for (uint32_t i : picked_) next[i] = server_[i];
  }
  if (history_ == 0) versions_.clear();
  versions_.push_back(Version{version, std::move(next)});
  while (versions_.size() > history_ + 1) versions_.pop_front();
}

void ModelStore::reset(std::vector<float> model, uint64_t version, std::vector<float> broadcast) {
  STARLING_CHECK_ARG(model.size() == layout_->numel(), "model of ", model.size(), " values, layout has ", layout_->numel());
  STARLING_CHECK_ARG(version > 0, "model version 0 is reserved for 'none'");
  STARLING_CHECK_ARG(broadcast.empty() || (lossy() && broadcast.size() == model.size()),
                     "a broadcast model is only given to a lossy store, and of the model's size");
  versions_.clear();
  if (lossy()) {
    versions_.push_back(Version{version, broadcast.empty() ? model : std::move(broadcast)});
    server_ = std::move(model);
  } else {
    versions_.push_back(Version{version, std::move(model)});
  }
}

EncodedModel ModelStore::encodeFor(uint64_t held, Downlink mode) const {
  EncodedModel out;
  const auto& cur = versions_.back().values;
  const auto& tensors = layout_->tensors();
  // A client that holds the current version gets an empty delta (an evaluation task, a round that
  // was not applied), not the whole model.
  if ((mode == Downlink::kDelta || mode == Downlink::kTopK) && held != 0) {
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
