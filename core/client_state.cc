#include "core/client_state.h"

#include <algorithm>

namespace starling {
namespace {

constexpr uint32_t kMagic = 0x53434c53;  // "SLCS"
constexpr uint32_t kFormatVersion = 2;

void checkName(std::string_view name) {
  STARLING_CHECK_ARG(!name.empty() && name.size() <= ClientState::kMaxNameLength,
                     "client state: component name '", name, "' must have 1 to ",
                     ClientState::kMaxNameLength, " characters");
}

}  // namespace

ClientState ClientState::copy() const {
  std::vector<uint8_t> bytes;
  saveTo(bytes);
  ClientState s;
  s.loadFrom(bytes);
  return s;
}

void ClientState::reset(uint64_t layout_fingerprint) {
  fingerprint_ = layout_fingerprint;
  entries_.clear();
}

std::vector<std::string> ClientState::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

ClientState::Entry* ClientState::findEntry(std::string_view name) {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const Entry& e, std::string_view n) { return e.name < n; });
  return it != entries_.end() && it->name == name ? &*it : nullptr;
}

const ClientState::Entry* ClientState::findEntry(std::string_view name) const {
  return const_cast<ClientState*>(this)->findEntry(name);
}

void ClientState::erase(std::string_view name) {
  if (Entry* e = findEntry(name)) entries_.erase(entries_.begin() + (e - entries_.data()));
}

void ClientState::put(std::string name, std::unique_ptr<StateComponent> c) {
  checkName(name);
  STARLING_CHECK_ARG(c != nullptr, "client state: component '", name, "' is null");
  if (Entry* e = findEntry(name)) {
    e->obj = std::move(c);  // noexcept from here on
    e->raw.clear();
    e->is_raw = false;
    return;
  }
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const Entry& e, std::string_view n) { return e.name < n; });
  Entry e;
  e.name = std::move(name);
  e.obj = std::move(c);
  entries_.insert(it, std::move(e));  // vector::insert of a movable type: strong guarantee
}

void ClientState::commit(
    std::vector<std::pair<std::string, std::unique_ptr<StateComponent>>>& staged) {
  size_t added = 0;
  for (size_t i = 0; i < staged.size(); ++i) {
    checkName(staged[i].first);
    STARLING_CHECK_ARG(staged[i].second != nullptr, "client state: staged component '",
                       staged[i].first, "' is null");
    for (size_t j = 0; j < i; ++j)
      STARLING_CHECK_ARG(staged[j].first != staged[i].first, "client state: component '",
                         staged[i].first, "' staged twice");
    added += findEntry(staged[i].first) == nullptr;
  }
  // The only step that allocates: the new entry list, built aside.
  std::vector<Entry> next(entries_.size() + added);
  // Nothing below throws: moves of strings, vectors and unique_ptrs, and an in-place sort.
  size_t k = 0;
  for (auto& e : entries_) next[k++] = std::move(e);
  const size_t old = k;
  for (auto& item : staged) {
    auto end = next.begin() + static_cast<ptrdiff_t>(old);
    auto it = std::find_if(next.begin(), end, [&](const Entry& e) { return e.name == item.first; });
    if (it == end) {
      it = next.begin() + static_cast<ptrdiff_t>(k++);
      it->name = std::move(item.first);
    }
    it->obj = std::move(item.second);
    it->raw.clear();
    it->is_raw = false;
  }
  std::sort(next.begin(), next.end(),
            [](const Entry& a, const Entry& b) { return a.name < b.name; });
  entries_.swap(next);
  staged.clear();
}

void ClientState::saveTo(std::vector<uint8_t>& out) const {
  out.clear();
  ByteWriter w(out);
  w.u32(kMagic);
  w.u32(kFormatVersion);
  w.u64(fingerprint_);
  w.u32(static_cast<uint32_t>(entries_.size()));
  for (const auto& e : entries_) {
    w.str(e.name);
    if (e.is_raw) {
      w.u32(e.raw_version);
      w.u64(e.raw.size());
      w.bytes(e.raw.data(), e.raw.size());
      continue;
    }
    w.u32(e.obj->version());
    const size_t len_at = w.size();
    w.u64(0);
    e.obj->save(w);
    w.patchU64(len_at, w.size() - len_at - 8);
  }
}

void ClientState::loadFrom(std::span<const uint8_t> bytes) {
  try {
    loadChecked(bytes);
  } catch (...) {
    reset(0);  // never half-loaded: a failed load leaves the state empty, bound to no model
    throw;
  }
}

void ClientState::loadChecked(std::span<const uint8_t> bytes) {
  struct Stored {
    std::string name;
    uint32_t version;
    std::span<const uint8_t> bytes;
  };
  // Read and check the whole envelope before touching anything.
  ByteReader r(bytes, "client state");
  if (r.u32() != kMagic) r.fail("bad magic (not a Starling client state)");
  const uint32_t format = r.u32();
  if (format != kFormatVersion)
    r.fail("format version ", format, " not supported (this build reads ", kFormatVersion, ")");
  const uint64_t fingerprint = r.u64();
  const uint32_t count = r.u32();
  if (count > r.remaining() / 16) r.fail("claims ", count, " components");
  std::vector<Stored> stored;
  stored.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    Stored s;
    s.name = r.str(kMaxNameLength);
    if (s.name.empty()) r.fail("component ", i, " has an empty name");
    if (!stored.empty() && s.name <= stored.back().name)
      r.fail("component '", s.name, "' is out of order or repeated");
    s.version = r.u32();
    const uint64_t len = r.u64();
    if (len > r.remaining()) r.fail("component '", s.name, "' claims ", len, " bytes");
    s.bytes = r.view(len);
    stored.push_back(std::move(s));
  }
  r.finish();

  {
    fingerprint_ = fingerprint;
    std::vector<Entry> next;
    next.reserve(stored.size());
    for (auto& s : stored) {
      Entry e;
      if (Entry* old = findEntry(s.name)) e = std::move(*old);  // keeps the object and its buffers
      e.name = s.name;
      e.raw_version = s.version;
      if (e.obj) {
        ByteReader cr(s.bytes, "client state component '" + s.name + "'");
        e.obj->load(cr, s.version);
        cr.finish();
        e.is_raw = false;
        e.raw.clear();
      } else {
        e.raw.assign(s.bytes.begin(), s.bytes.end());
        e.is_raw = true;
      }
      next.push_back(std::move(e));
    }
    entries_ = std::move(next);
  }
}

size_t ClientState::memoryBytes() const {
  size_t b = 0;
  for (const auto& e : entries_)
    b += e.raw.capacity() + (e.obj ? e.obj->memoryBytes() : 0) + e.name.capacity();
  return b;
}

}  // namespace starling
