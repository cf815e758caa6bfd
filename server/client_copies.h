#pragma once
// The mirrored downlinks (modes q3-mirror, q2-mirror and stc-mirror): the server keeps a copy of
// the model each client holds, bit for bit, and sends each client the difference between the
// server's model and that copy, as a refresh against the version the client holds: in the
// block-scaled levels of q3 and q2 (compression::BlockQ, the same payload and the same bytes), or
// (stc-mirror) as STC's ternary payload of the difference's downlink.density largest magnitudes of
// each tensor, +-mu (compression::Ternary, the stc downlink's refresh; the whole model, for a
// client without a copy, in q3's blocks). A client adds it to its copy as it adds any
// block-scaled or ternary refresh (protocol::applyModel), so no client code changes; the server
// adds the same decoded values to its mirror with the same float additions, so the two copies
// stay equal.
//
// Why: with the shared broadcast model of q3 and q2 (server/model_store.h), a client that was not
// sampled in the round before gets the whole model in 3 or 2 bits, and with 10 of 100 clients a
// round that is nearly every task; the levels then span the weights themselves. The difference
// from the client's own copy spans only what changed since it last took part, and what its
// levels round away stays in the copy's difference and is sent with the next (error feedback per
// client). Tasks cost the same bytes as q3's and q2's. stc-mirror's refreshes move only a fraction
// of the coordinates, the largest differences first, and what they leave waits in the copy's
// difference as the levels' rounding does.
//
// The cost is memory: a model's floats per client kept (`capacity` of them at most; past that the
// least recently sent is dropped, and that client's next task is the whole model in low bits). A
// client whose copy is not of the version it holds (it restarted, a task was lost, the server
// restarted without its copies) gets the whole model too: nothing is lost but bytes.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "core/param_layout.h"
#include "server/model_store.h"

namespace starling {
class ByteReader;
class ByteWriter;
}  // namespace starling

namespace starling::server {

class ClientCopies {
 public:
  // `bits` 1..8 a value (3 or 2 for the modes; the whole model's with a density); `capacity` >= 1
  // copies kept; `density` in (0, 1]: the differences sent as ternary payloads of that fraction of
  // each tensor (stc-mirror), 0: in blocks of `bits`.
  ClientCopies(ParamLayout layout, uint32_t bits, size_t capacity, double density = 0.0);
  // The copies a mirrored downlink `mode` keeps (`density`: downlink.density, stc-mirror's;
  // capacity: downlink.copies), or none for another mode.
  static std::optional<ClientCopies> forDownlink(ParamLayout layout, Downlink mode, double density,
                                                 size_t capacity);

  // What the task of `version` (of `model`: one model a version) carries to client `id`, which
  // says it holds `held` (0: nothing), and the copy is then what the client holds once it applied
  // the task:
  // - the same claim as when this version was last encoded for it (a task sent again): the same
  //   task, the copy unchanged (the client ends with it whether it applies the task or skips it);
  // - its copy's version: the difference between `model` and the copy (an empty delta when that
  //   is `version` itself: the copy unchanged);
  // - anything else: the whole model (base 0), which becomes the copy; or, when the copy is of
  //   `version` already (the task sent again, claiming neither) or was dropped while of
  //   `version`, no copy is kept until the next version's task (whole), since the client may
  //   apply this task or skip it.
  EncodedModel encode(uint64_t id, uint64_t held, std::span<const float> model, uint64_t version);
  // The copy client `id` holds after its last encode(); empty when none is kept.
  std::span<const float> copy(uint64_t id) const;
  // What client `id` holds once it applied its last task (encoded since the last version's
  // change): its copy, or the whole model when no copy is kept (what a simulated client trains
  // from).
  std::span<const float> sent(uint64_t id) const;
  // The version of that copy (0: none kept).
  uint64_t versionOf(uint64_t id) const;
  size_t size() const { return copies_.size(); }
  size_t capacity() const { return capacity_; }
  uint32_t bits() const { return bits_; }
  double density() const { return density_; }
  std::vector<uint64_t> ids() const;  // the clients whose copy is kept, ascending

  // For a checkpoint: every copy kept, with its version and recency (not the last task sent: a
  // task sent again after a resume is encoded as a new one). read() replaces them (an IoError for
  // another bit width or density, more copies than the capacity, another model's size, or damaged
  // bytes; the copies are then as they were).
  void write(ByteWriter& w) const;
  void read(ByteReader& r);

 private:
  struct Copy {
    uint64_t version = 0;  // 0 while it is being changed: never encoded against
    uint64_t used = 0;     // the sends' counter when it was last sent: the least recent goes first
    std::vector<float> values;
    uint64_t last_held = 0;  // what the client claimed when `last` was made for `version`
    EncodedModel last;       // the task last sent (for a task sent again)
  };
  void touch(uint64_t id, Copy& c);
  // The whole model of `version` in blocks, and its decoded values (one encoding a version).
  const std::pair<EncodedModel, std::vector<float>>& whole(std::span<const float> model,
                                                           uint64_t version);

  ParamLayout layout_;
  uint32_t bits_;
  size_t capacity_;
  double density_;
  uint64_t sends_ = 0;
  std::map<uint64_t, Copy> copies_;
  std::set<std::pair<uint64_t, uint64_t>> order_;  // (used, id): the least recent first
  // Clients whose copy is not known (a task of unknown_version_ they may apply or skip), until a
  // task of a later version.
  std::map<uint64_t, uint64_t> unknown_;
  uint64_t unknown_version_ = 0;
  uint64_t whole_version_ = 0;
  std::pair<EncodedModel, std::vector<float>> whole_;
  std::vector<float> diff_;  // reused
};

}  // namespace starling::server
