#pragma once
// ClientState: what one client keeps between the rounds it takes part in, as a set of named
// components. Each component is owned by the module that uses it (compression/ keeps the
// error-feedback residual and PowerSGD's factors; a client algorithm keeps SCAFFOLD control
// variates or momentum under its own names), so adding a kind of state never touches another
// module. The simulator's bounded state store and the deployed client's on-disk state use this
// one format.
//
// Serialized form (little-endian, core/bytes.h):
//   u32 magic "SLCS" | u32 format version (2) | u64 layout fingerprint | u32 component count |
//   per component, in name order: str name | u32 component version | u64 byte length | bytes
// A component the reading program never asks for passes through untouched (kept as bytes), so a
// state saved by a client with more components than this program knows loses nothing.
//
// Buffers are reused: saveTo() clears and refills the caller's vector; loadFrom() parses into
// the component objects this state already holds (a simulator worker reuses one ClientState for
// every client it trains, so its vectors keep their capacity) and keeps the others as bytes until
// get<T>() parses them.
//
// Not thread-safe; a state belongs to one client, used by one thread at a time.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/bytes.h"
#include "core/error.h"

namespace starling {

class StateComponent {
 public:
  virtual ~StateComponent() = default;
  // The version save() writes; load() receives the version that was stored.
  virtual uint32_t version() const = 0;
  virtual void save(ByteWriter& w) const = 0;
  // Replaces this component's contents with what save() wrote, reusing its buffers. Throws
  // IoError on a version it cannot read or corrupt bytes; must read every byte it is given.
  virtual void load(ByteReader& r, uint32_t version) = 0;
  virtual size_t memoryBytes() const = 0;
};

class ClientState {
 public:
  static constexpr size_t kMaxNameLength = 64;

  ClientState() = default;
  explicit ClientState(uint64_t layout_fingerprint) : fingerprint_(layout_fingerprint) {}
  ClientState(ClientState&&) noexcept = default;
  ClientState& operator=(ClientState&&) noexcept = default;
  ClientState(const ClientState&) = delete;
  ClientState& operator=(const ClientState&) = delete;
  // A deep copy (through the serialized form).
  ClientState copy() const;

  uint64_t layoutFingerprint() const { return fingerprint_; }
  // Drops every component and binds the state to a model.
  void reset(uint64_t layout_fingerprint);

  bool has(std::string_view name) const { return findEntry(name) != nullptr; }
  std::vector<std::string> names() const;
  size_t size() const { return entries_.size(); }
  void erase(std::string_view name);

  // The component `name` as a T, created (default-constructed) if absent, parsed if it is still
  // bytes. Throws IoError if the stored bytes do not parse; InternalError if `name` holds
  // another type (two modules claiming one name is a bug).
  template <class T>
  T& get(std::string_view name) {
    if (T* t = find<T>(name)) return *t;
    auto obj = std::make_unique<T>();
    T& ref = *obj;
    put(std::string(name), std::move(obj));
    return ref;
  }
  // nullptr if absent; otherwise as get<T>.
  template <class T>
  T* find(std::string_view name) {
    return const_cast<T*>(std::as_const(*this).find<T>(name));
  }
  // Read-only access. Parsing stored bytes on first access is logically const (a cache).
  template <class T>
  const T* find(std::string_view name) const {
    const Entry* e = findEntry(name);
    if (!e) return nullptr;
    if (e->is_raw) parseRaw(const_cast<Entry&>(*e), [] { return std::make_unique<T>(); });
    const T* t = dynamic_cast<const T*>(e->obj.get());
    STARLING_ENFORCE(t != nullptr, "client state component '", name, "' holds another type");
    return t;
  }

  // Installs `c` under `name`, replacing what was there. Strong guarantee: on a throw (only
  // allocation of a new entry can throw) nothing changed.
  void put(std::string name, std::unique_ptr<StateComponent> c);

  // Installs every staged component at once (replacing those of the same name): all or
  // nothing. On a throw (allocation) the state is unchanged and `staged` still holds its items.
  void commit(std::vector<std::pair<std::string, std::unique_ptr<StateComponent>>>& staged);

  // Writes the serialized form into `out` (cleared; its capacity is reused).
  void saveTo(std::vector<uint8_t>& out) const;
  // Replaces this state's contents with a serialized state. Throws IoError on a truncated,
  // corrupt or foreign blob; on a throw the state is left empty (bound to no model).
  void loadFrom(std::span<const uint8_t> bytes);

  size_t memoryBytes() const;

 private:
  struct Entry {
    std::string name;
    std::unique_ptr<StateComponent> obj;  // parsed (or parsing target kept for reuse)
    std::vector<uint8_t> raw;             // bytes not parsed yet
    uint32_t raw_version = 0;
    bool is_raw = false;
  };
  void loadChecked(std::span<const uint8_t> bytes);
  Entry* findEntry(std::string_view name);
  const Entry* findEntry(std::string_view name) const;
  template <class Make>
  static void parseRaw(Entry& e, Make make) {
    if (!e.obj) e.obj = make();
    ByteReader r(e.raw, "client state component '" + e.name + "'");
    e.obj->load(r, e.raw_version);
    r.finish();
    e.is_raw = false;
    e.raw.clear();
  }

  uint64_t fingerprint_ = 0;
  // mutable: parsing stored bytes on first read is a cache fill (see find() const).
  mutable std::vector<Entry> entries_;  // sorted by name
};

}  // namespace starling
