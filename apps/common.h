#pragma once
// What starling-server and starling-client share: the transport's limits and CURVE from their
// keys (apps/settings.h), logging set-up and signal handling. Header-only glue for the two
// programs.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <memory>
#include <string>

#include "apps/settings.h"
#include "core/error.h"
#include "transport/socket.h"

namespace starling::apps {

// The transport's limits from the net.* keys.
inline transport::TransportLimits transportLimits(const Settings::Net& n) {
  transport::TransportLimits l;
  l.chunk_bytes = n.chunk_bytes;
  l.max_message_bytes = n.max_message_bytes;
  l.max_reassembly_bytes = n.max_reassembly_bytes;
  l.max_messages_per_second = n.rate;
  l.burst = n.burst;
  return l;
}

// CURVE from the security.* keys. Throws ConfigError naming the key for a missing or unreadable
// key file.
inline transport::SecurityConfig security(const Settings::Net& n, bool server_side,
                                          bool needs_upstream) {
  transport::SecurityConfig s;
  s.insecure = n.insecure;
  if (n.insecure) return s;
  if (n.key.empty())
    STARLING_THROW(ConfigError, "security.key is required unless security.insecure = true");
  s.own = transport::loadKeyPair(n.key);
  if (server_side) {
    if (n.clients.empty())
      STARLING_THROW(ConfigError, "security.clients is required unless security.insecure = true");
    s.allow = std::make_shared<const transport::AllowList>(transport::AllowList::load(n.clients));
  }
  if (needs_upstream) {
    if (n.server_key.empty())
      STARLING_THROW(ConfigError,
                     "security.server_key is required unless security.insecure = true");
    s.server_public_key = transport::loadPublicKey(n.server_key);
  }
  return s;
}

// A console logger; under --security.insecure every line says so.
inline std::shared_ptr<spdlog::logger> makeLogger(const std::string& name, const std::string& level,
                                                  bool insecure) {
  auto log = spdlog::stderr_color_mt(name);
  log->set_pattern(insecure ? "[%H:%M:%S.%e] [%n] [INSECURE] [%^%l%$] %v"
                            : "[%H:%M:%S.%e] [%n] [%^%l%$] %v");
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
