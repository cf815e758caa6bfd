#pragma once
// What starling-server and starling-client share: the network and security keys, the model spec,
// logging set-up and signal handling. Header-only glue for the two programs.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <memory>
#include <string>

#include "apps/options.h"
#include "transport/socket.h"

namespace starling::apps {

struct NetOptions {
  bool insecure = false;
  std::string key;         // this side's NAME.key_secret
  std::string clients;     // server: allow-list folder or file
  std::string server_key;  // client (and aggregator upstream): the server's NAME.key
  uint64_t chunk_bytes = uint64_t{1} << 20;
  uint64_t max_message_bytes = uint64_t{1} << 30;
  uint64_t max_reassembly_bytes = uint64_t{1} << 30;
  double rate = 1000, burst = 200;

  void add(Options& o) {
    o.add("security.insecure", &insecure,
          "plain TCP without CURVE authentication or encryption (tests, trusted networks only; announced loudly)");
    o.add("security.key", &key, "this side's secret key file NAME.key_secret (starling-keygen)");
    o.add("security.clients", &clients, "server: admitted client keys: a folder of NAME.key files or an 'id key' file");
    o.add("security.server_key", &server_key, "client / aggregator: the upstream server's public key file NAME.key");
    o.add("net.chunk_bytes", &chunk_bytes, "messages larger than this travel in chunks", 4096, uint64_t{1} << 30);
    o.add("net.max_message_bytes", &max_message_bytes, "largest message accepted", 1024, (uint64_t{2} << 30) - 1);
    o.add("net.max_reassembly_bytes", &max_reassembly_bytes,
          "memory for chunked uploads in flight, all peers together; beyond it peers are told to send again later",
          1024, uint64_t{1} << 40);
    o.add("net.rate", &rate, "messages per second a peer may send before it is rate-limited", 1, 1e7);
    o.add("net.burst", &burst, "messages a peer may send in a burst", 1, 1e7);
  }
  transport::TransportLimits limits() const {
    transport::TransportLimits l;
    l.chunk_bytes = chunk_bytes;
    l.max_message_bytes = max_message_bytes;
    l.max_reassembly_bytes = max_reassembly_bytes;
    l.max_messages_per_second = rate;
    l.burst = burst;
    return l;
  }
  // Throws ConfigError naming the key for a missing or unreadable key file.
  transport::SecurityConfig security(bool server_side, bool needs_upstream) const {
    transport::SecurityConfig s;
    s.insecure = insecure;
    if (insecure) return s;
    if (key.empty()) STARLING_THROW(ConfigError, "security.key is required unless security.insecure = true");
    s.own = transport::loadKeyPair(key);
    if (server_side) {
      if (clients.empty()) STARLING_THROW(ConfigError, "security.clients is required unless security.insecure = true");
      s.allow = std::make_shared<const transport::AllowList>(transport::AllowList::load(clients));
    }
    if (needs_upstream) {
      if (server_key.empty()) STARLING_THROW(ConfigError, "security.server_key is required unless security.insecure = true");
      s.server_public_key = transport::loadPublicKey(server_key);
    }
    return s;
  }
};

// A console logger; under --security.insecure every line says so.
inline std::shared_ptr<spdlog::logger> makeLogger(const std::string& name, const std::string& level, bool insecure) {
  auto log = spdlog::stderr_color_mt(name);
  log->set_pattern(insecure ? "[%H:%M:%S.%e] [%n] [INSECURE] [%^%l%$] %v" : "[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  log->set_level(spdlog::level::from_str(level));
  return log;
}

// SIGINT / SIGTERM set this flag; the programs stop at their next turn.
inline std::atomic<bool>& stopFlag() {
  static std::atomic<bool> stop{false};
  return stop;
}
inline void installStopHandlers() {
  std::signal(SIGINT, [](int) { stopFlag().store(true); });
  std::signal(SIGTERM, [](int) { stopFlag().store(true); });
}

}  // namespace starling::apps
