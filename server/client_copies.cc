#include "server/client_copies.h"

#include <algorithm>
#include <limits>

#include "compression/payload.h"
#include "core/bytes.h"
#include "core/error.h"

namespace starling::server {
namespace cz = starling::compression;

ClientCopies::ClientCopies(ParamLayout layout, uint32_t bits, size_t capacity)
    : layout_(std::move(layout)), bits_(bits), capacity_(capacity) {
  STARLING_CHECK_ARG(layout_.numel() > 0, "client copies need a model");
  STARLING_CHECK_ARG(bits_ >= 1 && bits_ <= 8, "client copies of ", bits_, " bits a value");
  STARLING_CHECK_ARG(capacity_ >= 1, "client copies need room for one");
}

EncodedModel ClientCopies::encode(uint64_t id, uint64_t held, std::span<const float> model,
                                  uint64_t version) {
  STARLING_CHECK_ARG(model.size() == layout_.numel(), "a model of ", model.size(),
                     " values for a layout of ", layout_.numel());
  auto it = copies_.find(id);
  const bool against = held != 0 && it != copies_.end() && it->second.version == held;
  if (it == copies_.end()) {
    if (copies_.size() >= capacity_) {  // the least recently sent goes (the lowest id on a tie)
      auto oldest = copies_.begin();
      for (auto c = copies_.begin(); c != copies_.end(); ++c)
        if (c->second.used < oldest->second.used) oldest = c;
      copies_.erase(oldest);
    }
    it = copies_.emplace(id, Copy{}).first;
  }
  Copy& c = it->second;
  c.used = ++sends_;
  EncodedModel out;
  out.base_version = against ? held : 0;
  if (against && held == version) {
    // It holds this version already (an evaluation task, a round not applied, a task sent
    // again): an empty delta, its copy unchanged, whether or not it applies the task.
    out.tensors.assign(layout_.size(), cz::Sparse{});
    return out;
  }
  if (!against) c.values.assign(layout_.numel(), 0.0f);  // the client starts from zeros too
  out.tensors.reserve(layout_.size());
  for (const TensorSpec& t : layout_.tensors()) {
    const std::span<float> mine(c.values.data() + t.offset, t.numel);
    const std::span<const float> target = model.subspan(t.offset, t.numel);
    diff_.resize(t.numel);
    for (size_t i = 0; i < t.numel; ++i) diff_[i] = target[i] - mine[i];
    cz::Payload p = quantizeBlocks(diff_, bits_, kDownlinkBlock);
    // The client's own addition (protocol::applyModel): the copies stay equal bit for bit.
    cz::accumulatePayload(cz::view(p), t, mine, 1.0f);
    out.tensors.push_back(std::move(p));
  }
  c.version = version;
  return out;
}

std::span<const float> ClientCopies::copy(uint64_t id) const {
  const auto it = copies_.find(id);
  return it == copies_.end() ? std::span<const float>() : std::span<const float>(it->second.values);
}

std::vector<uint64_t> ClientCopies::ids() const {
  std::vector<uint64_t> out;
  out.reserve(copies_.size());
  for (const auto& kv : copies_) out.push_back(kv.first);
  return out;
}

uint64_t ClientCopies::versionOf(uint64_t id) const {
  const auto it = copies_.find(id);
  return it == copies_.end() ? 0 : it->second.version;
}

void ClientCopies::write(ByteWriter& w) const {
  w.u32(bits_);
  w.u64(sends_);
  w.u64(copies_.size());
  for (const auto& [id, c] : copies_) {
    w.u64(id);
    w.u64(c.version);
    w.u64(c.used);
    w.floats(c.values);
  }
}

void ClientCopies::read(ByteReader& r) {
  if (const uint32_t bits = r.u32(); bits != bits_)
    r.fail("the clients' copies are of ", bits, " bits a value, this run's of ", bits_,
           ": resume with the same downlink.mode");
  const uint64_t sends = r.u64(), n = r.u64();
  if (n > capacity_)
    r.fail("holds ", n, " clients' copies, downlink.copies keeps ", capacity_,
           ": resume with at least as many");
  std::map<uint64_t, Copy> copies;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t id = r.u64();
    Copy c;
    c.version = r.u64();
    c.used = r.u64();
    r.floats(c.values);
    if (c.values.size() != layout_.numel())
      r.fail("client ", id, "'s copy holds ", c.values.size(), " values, the model ",
             layout_.numel());
    if (c.version == 0 || c.used == 0 || c.used > sends)
      r.fail("client ", id, "'s copy is of version ", c.version, ", sent at ", c.used, " of ",
             sends);
    if (!copies.emplace(id, std::move(c)).second) r.fail("client ", id, "'s copy twice");
  }
  copies_ = std::move(copies);
  sends_ = sends;
}

}  // namespace starling::server
