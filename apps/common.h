#pragma once
// What starling-server and starling-client share: the transport's limits and CURVE from their
// keys (apps/settings.h), logging set-up and signal handling. Header-only glue for the two
// programs.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>

#include "apps/settings.h"
#include "core/error.h"
#include "core/json_text.h"
#include "core/log_fields.h"
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

// log.format = json: one JSON object per line, {"ts", "level", "program", "msg"} and, where the
// logging thread set them (core/log_fields.h), "round", "peer" and "code" (an error code's name,
// as docs/errors.md and the metrics' `code` label spell it); "insecure": true under
// --security.insecure.
class JsonLogFormatter : public spdlog::formatter {
 public:
  explicit JsonLogFormatter(bool insecure) : insecure_(insecure) {}
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto t = msg.time.time_since_epoch();
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t).count();
    const std::time_t secs = static_cast<std::time_t>(ms / 1000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char ts[96];  // room for any int the compiler cannot bound
    std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(ms % 1000));
    std::string out = std::string("{\"ts\":\"") + ts + "\",\"level\":\"";
    const auto level = spdlog::level::to_string_view(msg.level);
    out.append(level.data(), level.size());
    out += "\",\"program\":";
    appendJsonString(out, std::string_view(msg.logger_name.data(), msg.logger_name.size()));
    out += ",\"msg\":";
    appendJsonString(out, std::string_view(msg.payload.data(), msg.payload.size()));
    const LogFields& f = logFields();
    if (f.round) out += ",\"round\":" + std::to_string(*f.round);
    if (f.peer) out += ",\"peer\":" + std::to_string(*f.peer);
    if (f.code) {
      out += ",\"code\":";
      appendJsonString(out, errcLabel(*f.code));
    }
    if (insecure_) out += ",\"insecure\":true";
    out += "}\n";
    dest.append(out.data(), out.data() + out.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonLogFormatter>(insecure_);
  }

 private:
  bool insecure_;
};

// A console logger; under --security.insecure every line says so. `format`: text or json.
inline std::shared_ptr<spdlog::logger> makeLogger(const std::string& name, const std::string& level,
                                                  bool insecure,
                                                  LogFormat format = LogFormat::kText) {
  auto log = spdlog::stderr_color_mt(name);
  if (format == LogFormat::kJson)
    log->set_formatter(std::make_unique<JsonLogFormatter>(insecure));
  else
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
