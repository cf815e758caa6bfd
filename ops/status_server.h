#pragma once
// The HTTP endpoint a running program serves for its operators (`status.listen`): GET /metrics
// (a Registry in Prometheus's text format) and, given a source of the status page's facts, the
// page: GET / (ops/status_page/, embedded; it fetches /status.json every 2 s and draws it),
// /status.js, /status.css and /status.json; without one, GET / says what is served, as plain
// text. The page's responses forbid anything but this server's own script, style and JSON
// (Content-Security-Policy), framing and content sniffing. Served by
// civetweb (Debian's libcivetweb-dev; no HTTP parsing of our own) on threads of its own, so nothing
// an HTTP client does reaches the thread that runs the rounds: the program's loop only changes
// metrics (atomics).
//
// Bounded by construction: `threads` workers; at most `max_queued` accepted connections wait for
// one (then the listener waits, and the kernel's backlog of as many holds the rest); a request's
// line and headers together at most 16 KiB (civetweb's max_request_size), or it is refused, and
// all of them within `timeout_ms` of the request's start (a trickle is answered 400 and closed);
// each read and write waits at most `timeout_ms`; GET and HEAD only (405 otherwise); a request that
// announces a body is refused unread (413); one request per connection; no files are served
// (civetweb has no document root here). Stopping waits for the workers, each at most `timeout_ms`
// into what it reads.
//
// Security: loopback by default. An address that is not loopback is refused unless a bearer token
// file is given (`status.token_file`: one line of at least 16 characters, readable by its owner
// only); with a token every request must carry `Authorization: Bearer TOKEN` (compared in
// constant time), else 401. Nothing served holds a secret, an update or a client's data. Plain
// HTTP: off loopback, put TLS in front (a reverse proxy) so the token does not travel in the clear.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ops/metrics.h"

namespace spdlog {
class logger;
}

namespace starling::ops {

struct StatusConfig {
  std::string listen;      // HOST:PORT (PORT 0: any free port); empty: no server
  std::string token_file;  // required for a HOST that is not loopback
  int threads = 2;
  int max_queued = 16;  // 1..10000
  int timeout_ms = 2000;
  // ConfigError naming the setting: a malformed address, a non-loopback one without a token file,
  // a token file that is missing, too short, or readable by others; limits out of range.
  void validate() const;
};

// Whether HOST (an IPv4 or IPv6 literal, or "localhost") is a loopback address.
bool isLoopback(const std::string& host);

class StatusServer {
 public:
  // Binds and starts serving (IoError when the address cannot be bound; ConfigError as
  // StatusConfig::validate). `what` names the program in GET / ("starling-server root", ...).
  // The server counts its own requests in `registry` (starling_http_requests_total{code}).
  // `status_json`, when given, answers GET /status.json (called on the server's threads, so it
  // must be safe to call from any thread) and turns GET / into the status page.
  StatusServer(StatusConfig config, std::shared_ptr<Registry> registry, std::string what,
               std::shared_ptr<spdlog::logger> log = nullptr,
               std::function<std::string()> status_json = {});
  ~StatusServer();  // stops serving and joins its threads
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  int port() const { return port_; }
  // http://HOST:PORT (IPv6 hosts in brackets).
  std::string url() const;
  // Requests answered, and refused for a missing or wrong token, so far.
  uint64_t served() const;
  uint64_t unauthorized() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace starling::ops
