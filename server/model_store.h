#pragma once
// The global model, its version, and the few versions before it that a delta downlink encodes
// against. Downlink bytes matter on edge links: a task carries the model dense (f32), in fp16, or
// as the coordinates that changed since the version the client holds (exact new values, so a
// client's copy equals the server's bit for bit), whichever the configuration asks for; a delta
// falls back to dense f32 when the client's version is too old or the delta would not be smaller.
//
// Lossy downlink (mode topk, with server-side error feedback, as STC's server): the server keeps
// its model x and the broadcast model x-hat that every up-to-date client holds. Each new version
// refreshes only the k = density x numel coordinates where |x - x-hat| is largest (over the whole
// model) to x's exact values, and travels as a delta of those coordinates; x - x-hat is the
// server's residual, nothing is lost, only delayed. Clients train from x-hat and their updates are
// added to x (x <- x + step), so the round needs nothing else.
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "compression/payload.h"
#include "core/param_layout.h"

namespace starling::server {

enum class Downlink { kDense, kFp16, kDelta, kTopK };
Downlink parseDownlink(std::string_view s);  // "dense", "fp16", "delta", "topk"; ConfigError otherwise
const char* downlinkName(Downlink d);

struct EncodedModel {
  uint64_t base_version = 0;                 // 0: whole model
  std::vector<compression::Payload> tensors;
};

class ModelStore {
 public:
  // Keeps `history` earlier versions for deltas (0: none). `topk_density` in (0, 1]: the lossy
  // downlink's fraction of coordinates refreshed per version (0: the broadcast model is the model).
  ModelStore(std::shared_ptr<const ParamLayout> layout, size_t history, double topk_density = 0.0);

  const ParamLayout& layout() const { return *layout_; }
  // The broadcast model: what tasks carry and clients train from (x-hat).
  std::span<const float> current() const { return versions_.back().values; }
  // The server's model x, which the round's step updates; the broadcast one unless lossy.
  std::span<const float> server() const { return lossy() ? std::span<const float>(server_) : current(); }
  uint64_t version() const { return versions_.back().version; }
  bool lossy() const { return density_ > 0.0; }
  // Installs `model` as the server's model of `version` (> the current one, or the first). The
  // first model is broadcast as it is; later lossy versions refresh the top-k coordinates of
  // x - x-hat.
  void set(std::vector<float> model, uint64_t version);
  // Starts over from a checkpoint: the server's model of `version` (> 0), the history cleared,
  // and for a lossy store the broadcast model (`broadcast`; the model itself when a checkpoint
  // holds none, from a lossless run or an older format).
  void reset(std::vector<float> model, uint64_t version, std::vector<float> broadcast = {});

  // What a task carries for a client that holds `held` (0: nothing).
  EncodedModel encodeFor(uint64_t held, Downlink mode) const;

 private:
  struct Version {
    uint64_t version;
    std::vector<float> values;
  };
  std::shared_ptr<const ParamLayout> layout_;
  size_t history_;
  double density_;
  std::deque<Version> versions_;
  std::vector<float> server_;  // lossy: x
  std::vector<uint32_t> picked_;
};

}  // namespace starling::server
