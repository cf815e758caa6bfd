#include "server/client_copies.h"

#include <algorithm>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>

#include "compression/compressor.h"
#include "compression/payload.h"
#include "compression/sparsify.h"
#include "core/bytes.h"
#include "core/error.h"

namespace starling::server {
namespace cz = starling::compression;

namespace {
// In the checkpoint, beside the bits: the differences are ternary, and their density follows.
constexpr uint32_t kTernaryFlag = 0x100;
}  // namespace

ClientCopies::ClientCopies(ParamLayout layout, uint32_t bits, size_t capacity, double density)
    : layout_(std::move(layout)), bits_(bits), capacity_(capacity), density_(density) {
  STARLING_CHECK_ARG(layout_.numel() > 0, "client copies need a model");
  STARLING_CHECK_ARG(bits_ >= 1 && bits_ <= 8, "client copies of ", bits_, " bits a value");
  STARLING_CHECK_ARG(capacity_ >= 1, "client copies need room for one");
  STARLING_CHECK_ARG(density_ >= 0.0 && density_ <= 1.0,
                     "client copies' ternary density must be in (0, 1] (0: blocks), got ",
                     density_);
}

std::optional<ClientCopies> ClientCopies::forDownlink(ParamLayout layout, Downlink mode,
                                                      double density, size_t capacity) {
  if (!downlinkMirrored(mode)) return std::nullopt;
  if (mode == Downlink::kStcMirror && !(density > 0.0 && density <= 1.0))
    STARLING_THROW(ConfigError, "downlink.mode = stc-mirror needs downlink.density in (0, 1], got ",
                   density);
  return ClientCopies(std::move(layout), downlinkBlockBits(mode), capacity,
                      mode == Downlink::kStcMirror ? density : 0.0);
}

void ClientCopies::touch(uint64_t id, Copy& c) {
  order_.erase({c.used, id});
  c.used = ++sends_;
  order_.insert({c.used, id});
}

const std::pair<EncodedModel, std::vector<float>>& ClientCopies::whole(std::span<const float> model,
                                                                       uint64_t version) {
  if (whole_version_ != version || whole_.second.empty()) {
    whole_version_ = 0;
    whole_.first = wholeInBlocks(model, layout_, bits_);
    whole_.second.assign(layout_.numel(), 0.0f);  // the client starts from zeros too
    for (size_t i = 0; i < layout_.size(); ++i) {
      const TensorSpec& t = layout_.tensors()[i];
      cz::accumulatePayload(cz::view(whole_.first.tensors[i]), t,
                            std::span<float>(whole_.second).subspan(t.offset, t.numel), 1.0f);
    }
    whole_version_ = version;
  }
  return whole_;
}

EncodedModel ClientCopies::encode(uint64_t id, uint64_t held, std::span<const float> model,
                                  uint64_t version) {
  STARLING_CHECK_ARG(model.size() == layout_.numel(), "a model of ", model.size(),
                     " values for a layout of ", layout_.numel());
  STARLING_CHECK_ARG(version != 0, "a task of version 0");
  if (version > unknown_version_) {  // a new version's tasks: every client's are fresh
    unknown_.clear();
    unknown_version_ = version;
  }
  if (const auto u = unknown_.find(id); u != unknown_.end() && u->second == version)
    return whole(model, version).first;  // still not known: whole, and no copy kept
  auto it = copies_.find(id);
  if (it != copies_.end() && it->second.version == version && held != version &&
      held == it->second.last_held && !it->second.last.tensors.empty()) {
    touch(id, it->second);  // the same claim for the same version: the same task
    return it->second.last;
  }
  const bool against = held != 0 && it != copies_.end() && it->second.version == held;
  if (!against && it != copies_.end() && it->second.version == version) {
    // Sent again, claiming neither the first task's base nor its version: the client may apply
    // this one or skip it, so its copy is not known until its next version's task.
    order_.erase({it->second.used, id});
    copies_.erase(it);
    unknown_[id] = version;
    return whole(model, version).first;
  }
  if (it == copies_.end()) {
    if (copies_.size() >= capacity_) {  // the least recently sent goes
      const uint64_t oldest = order_.begin()->second;
      order_.erase(order_.begin());
      // A task of this version may still be sent to it again: not known until the next one.
      if (const auto o = copies_.find(oldest); o->second.version == version)
        unknown_[oldest] = version;
      copies_.erase(oldest);
    }
    it = copies_.emplace(id, Copy{}).first;
    it->second.used = ++sends_;
    order_.insert({it->second.used, id});
  } else {
    touch(id, it->second);
  }
  Copy& c = it->second;
  EncodedModel out;
  c.version = 0;  // until the copy is whole again (an exception leaves it never encoded against)
  c.last = EncodedModel{};
  if (!against) {
    const auto& [task, values] = whole(model, version);
    out = task;
    c.values = values;
  } else if (held == version) {
    // It holds this version already (an evaluation task, a round not applied): an empty delta,
    // its copy unchanged whether or not it applies the task.
    out.base_version = held;
    out.tensors.assign(layout_.size(), cz::Sparse{});
  } else {
    out.base_version = held;
    out.tensors.reserve(layout_.size());
    for (const TensorSpec& t : layout_.tensors()) {
      const std::span<float> mine(c.values.data() + t.offset, t.numel);
      const std::span<const float> target = model.subspan(t.offset, t.numel);
      diff_.resize(t.numel);
      for (size_t i = 0; i < t.numel; ++i) diff_[i] = target[i] - mine[i];
      // (The ternary payload's tie-break seeded by the version, as the stc downlink's.)
      cz::Payload p =
          density_ > 0.0
              ? cz::Payload(cz::ternaryTopK(diff_, cz::countForDensity(density_, t.numel), version))
              : cz::Payload(quantizeBlocks(diff_, bits_, kDownlinkBlock));
      // The client's own addition (protocol::applyModel): the copies stay equal bit for bit.
      cz::accumulatePayload(cz::view(p), t, mine, 1.0f);
      out.tensors.push_back(std::move(p));
    }
  }
  c.last = out;
  c.last_held = held;
  c.version = version;
  return out;
}

std::span<const float> ClientCopies::sent(uint64_t id) const {
  const std::span<const float> c = copy(id);
  return c.empty() ? std::span<const float>(whole_.second) : c;
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
  // (Block-scaled copies write the bits alone, as before stc-mirror.)
  w.u32(density_ > 0.0 ? bits_ | kTernaryFlag : bits_);
  if (density_ > 0.0) w.f64(density_);
  w.u64(sends_);
  // (A copy of version 0 was left by an encode that threw: not written, its client's next task
  // is whole.)
  w.u64(static_cast<uint64_t>(std::count_if(
      copies_.begin(), copies_.end(), [](const auto& kv) { return kv.second.version != 0; })));
  for (const auto& [id, c] : copies_) {
    if (c.version == 0) continue;
    w.u64(id);
    w.u64(c.version);
    w.u64(c.used);
    w.floats(c.values);
  }
}

void ClientCopies::read(ByteReader& r) {
  const uint32_t tag = r.u32();
  const uint32_t bits = tag & ~kTernaryFlag;
  const bool ternary = (tag & kTernaryFlag) != 0;
  const double density = ternary ? r.f64() : 0.0;
  if (ternary && !(density > 0.0 && density <= 1.0))
    r.fail("the clients' copies have ternary refreshes of density ", density, ", not in (0, 1]");
  const auto what = [](uint32_t b, double d) {
    std::ostringstream s;
    s << b << " bits a value";
    if (d > 0.0) s << " with ternary refreshes of density " << std::setprecision(17) << d;
    return s.str();
  };
  if (bits != bits_ || density != density_)
    r.fail("the clients' copies are of ", what(bits, density), ", this run's of ",
           what(bits_, density_), ": resume with the same downlink.mode and downlink.density");
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
  std::set<std::pair<uint64_t, uint64_t>> order;
  for (const auto& [id, copy] : copies)
    if (!order.insert({copy.used, id}).second) r.fail("two copies sent at ", copy.used);
  copies_ = std::move(copies);
  order_ = std::move(order);
  sends_ = sends;
}

}  // namespace starling::server
