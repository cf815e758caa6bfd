#include "simulator/collectives_store.h"

#include <c10/util/Exception.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/error.h"

namespace starling::simulator::detail {

std::string describe(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

c10::intrusive_ptr<c10d::Store> connectStore(const LaunchInfo& info,
                                             std::chrono::milliseconds timeout,
                                             std::string_view group) {
  if (info.master_port <= 0 || info.master_port > 65535) {
    STARLING_THROW(ConfigError, "the rendezvous store needs a port in [1, 65535], got MASTER_PORT=",
                   info.master_port, " (", info.source, ")");
  }
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(info.master_port);
  o.isServer = info.rank == 0;
  o.numWorkers = static_cast<std::size_t>(info.world_size);
  o.waitWorkers = true;
  o.timeout = timeout;
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, o);
    return c10::make_intrusive<c10d::PrefixStore>("starling/" + std::string(group), store);
  } catch (const std::exception& e) {
    STARLING_THROW(IoError, "rendezvous store ", info.master_addr, ":", info.master_port, " (rank ",
                   info.rank, " of ", info.world_size, ", ", info.source, ", ",
                   info.rank == 0 ? "hosting" : "connecting", ", timeout ", timeout.count(),
                   " ms) failed: ", describe(e));
  }
}

void agreeOnValue(c10d::Store& store, int rank, const std::string& key, const std::string& value) {
  std::string theirs;
  try {
    if (rank == 0) {
      store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
      return;
    }
    const std::vector<uint8_t> v = store.get(key);
    theirs.assign(v.begin(), v.end());
  } catch (const std::exception& e) {
    STARLING_THROW(IoError, "rendezvous store: exchanging '", key, "' (rank ", rank,
                   ") failed: ", describe(e));
  }
  if (theirs != value) {
    STARLING_THROW(ConfigError, "collectives option ", key, " differs between ranks: rank 0 has ",
                   theirs, ", rank ", rank, " has ", value,
                   " (every rank must use the same options)");
  }
}

}  // namespace starling::simulator::detail
