#pragma once
// The global model, its version, and the few versions before it that a delta downlink encodes
// against. Downlink bytes matter on edge links: a task carries the model dense (f32), in fp16, or
// as the coordinates that changed since the version the client holds (exact new values, so a
// client's copy equals the server's bit for bit), whichever the configuration asks for; a delta
// falls back to dense f32 when the client's version is too old or the delta would not be smaller.
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "compression/payload.h"
#include "core/param_layout.h"

namespace starling::server {

enum class Downlink { kDense, kFp16, kDelta };
Downlink parseDownlink(std::string_view s);  // "dense", "fp16", "delta"; ConfigError otherwise
const char* downlinkName(Downlink d);

struct EncodedModel {
  uint64_t base_version = 0;                 // 0: whole model
  std::vector<compression::Payload> tensors;
};

class ModelStore {
 public:
  // Keeps `history` earlier versions for deltas (0: none).
  ModelStore(std::shared_ptr<const ParamLayout> layout, size_t history);

  const ParamLayout& layout() const { return *layout_; }
  std::span<const float> current() const { return versions_.back().values; }
  uint64_t version() const { return versions_.back().version; }
  // Installs `model` as `version` (> the current one, or the first).
  void set(std::vector<float> model, uint64_t version);

  // What a task carries for a client that holds `held` (0: nothing).
  EncodedModel encodeFor(uint64_t held, Downlink mode) const;

 private:
  struct Version {
    uint64_t version;
    std::vector<float> values;
  };
  std::shared_ptr<const ParamLayout> layout_;
  size_t history_;
  std::deque<Version> versions_;
};

}  // namespace starling::server
