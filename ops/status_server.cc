#include "ops/status_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/status_assets.h"

namespace starling::ops {

namespace {

struct HostPort {
  std::string host;
  int port = -1;
};

// HOST:PORT or [IPV6]:PORT; port -1 when malformed.
HostPort splitListen(const std::string& s) {
  HostPort hp;
  size_t colon;
  if (!s.empty() && s[0] == '[') {
    const size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') return hp;
    hp.host = s.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = s.rfind(':');
    if (colon == std::string::npos) return hp;
    hp.host = s.substr(0, colon);
  }
  const std::string port = s.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return hp;
  const int p = std::stoi(port);
  if (p > 65535) return hp;
  hp.port = p;
  return hp;
}

bool isAddress(const std::string& host) {
  unsigned char buf[16];
  return host == "localhost" || inet_pton(AF_INET, host.c_str(), buf) == 1 ||
         inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

std::string readToken(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    STARLING_THROW(ConfigError, "status.token_file: cannot read ", path);
  if (st.st_mode & 077)
    STARLING_THROW(ConfigError, "status.token_file: ", path,
                   " may be read by others than its owner (chmod 600 it)");
  std::ifstream f(path);
  std::string token;
  std::getline(f, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ' || token.back() == '\t'))
    token.pop_back();
  if (token.size() < 16 || token.find_first_of(" \t") != std::string::npos)
    STARLING_THROW(ConfigError, "status.token_file: ", path,
                   " must hold one token of at least 16 characters and no blanks on its first "
                   "line");
  return token;
}

bool constantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  return diff == 0;
}

const char* reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    case 421:
      return "Misdirected Request";
    case 500:
      return "Internal Server Error";
    default:
      return "Error";
  }
}

void initLibrary() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

}  // namespace

bool isLoopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

void StatusConfig::validate() const {
  if (listen.empty()) return;
  const HostPort hp = splitListen(listen);
  if (hp.port < 0 || !isAddress(hp.host))
    STARLING_THROW(ConfigError, "status.listen = '", listen,
                   "': expected HOST:PORT with HOST an IP address or localhost (127.0.0.1:9464, "
                   "[::1]:9464; port 0 picks a free one)");
  if (!isLoopback(hp.host) && token_file.empty())
    STARLING_THROW(ConfigError, "status.listen = '", listen,
                   "' is not a loopback address: give status.token_file (a bearer token every "
                   "request must carry), or listen on 127.0.0.1");
  if (!token_file.empty()) (void)readToken(token_file);
  if (threads < 1 || threads > 64)
    STARLING_THROW(ConfigError, "status threads = ", threads, " (1..64)");
  if (max_queued < 1 || max_queued > 10000)
    STARLING_THROW(ConfigError, "status max_queued = ", max_queued, " (1..10000)");
  if (timeout_ms < 10 || timeout_ms > 600000)
    STARLING_THROW(ConfigError, "status timeout_ms = ", timeout_ms, " (10..600000)");
}

namespace {
// The page's headers: its own script, style and JSON only; not framed; types as sent.
constexpr const char* kPageHeaders =
    "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'\r\nX-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\n"
    "Referrer-Policy: no-referrer\r\n";
}  // namespace

struct StatusServer::Impl {
  std::shared_ptr<Registry> registry;  // held: the handler reads it
  std::function<std::string()> status_json;
  std::string what, token, host;
  mg_context* ctx = nullptr;
  std::atomic<uint64_t> served{0}, unauthorized{0};

  void count(int status) {
    served.fetch_add(1, std::memory_order_relaxed);
    registry
        ->counter("starling_http_requests_total", "HTTP requests answered, by status code.",
                  {{"code", std::to_string(status)}})
        .inc();
  }
  int answer(mg_connection* c, int status, const std::string& type, const std::string& body,
             bool head, const char* extra = "") {
    // Counted before it is sent: once a client has an answer, a scrape it makes next sees it
    // (counted after, another thread could serve that scrape first).
    count(status);
    mg_printf(c,
              "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
              "Cache-Control: no-store\r\nConnection: close\r\n%s\r\n",
              status, reason(status), type.c_str(), body.size(), extra);
    if (!head) mg_write(c, body.data(), body.size());
    return status;
  }
  // A Host header naming a loopback address or localhost (with any port), or this server's own
  // listening address. Absent (HTTP/1.0): allowed.
  bool hostAllowed(const char* header) const {
    if (!header) return true;
    std::string h = header;
    if (!h.empty() && h.front() == '[') {  // [v6]:port
      const auto end = h.find(']');
      if (end == std::string::npos) return false;
      h = h.substr(1, end - 1);
    } else if (const auto colon = h.rfind(':'); colon != std::string::npos) {
      h = h.substr(0, colon);
    }
    return isLoopback(h) || h == host;
  }
  // Every request, within a guard: an exception (memory, a bug) is a 500, never through civetweb's
  // C frames.
  int handle(mg_connection* c) {
    try {
      return handleRequest(c);
    } catch (const std::exception& e) {
      return answer(c, 500, "text/plain", std::string("internal error: ") + e.what() + "\n", false);
    }
  }
  // The method, a body, the host, the token, then the path.
  int handleRequest(mg_connection* c) {
    const mg_request_info* ri = mg_get_request_info(c);
    const std::string method = ri->request_method ? ri->request_method : "";
    const bool head = method == "HEAD";
    if (method != "GET" && !head)
      return answer(c, 405, "text/plain", "only GET and HEAD\n", false, "Allow: GET, HEAD\r\n");
    // Nothing here takes a body: one announced is refused unread.
    if (ri->content_length > 0 || mg_get_header(c, "Transfer-Encoding"))
      return answer(c, 413, "text/plain", "no request body is taken\n", head);
    if (token.empty() && !hostAllowed(mg_get_header(c, "Host"))) {
      // Without a token only a loopback name is answered: a web page the operator visits cannot
      // have a name of its own resolve to 127.0.0.1 (DNS rebinding) and read what is served.
      return answer(c, 421, "text/plain",
                    "this server answers requests for a loopback host only (Host: 127.0.0.1, "
                    "localhost or [::1]); give status.token_file to serve other names\n",
                    head);
    }
    if (!token.empty()) {
      const char* auth = mg_get_header(c, "Authorization");
      const std::string prefix = "Bearer ";
      const std::string a = auth ? auth : "";
      if (a.rfind(prefix, 0) != 0 || !constantTimeEqual(a.substr(prefix.size()), token)) {
        unauthorized.fetch_add(1, std::memory_order_relaxed);
        return answer(c, 401, "text/plain", "a bearer token is required (status.token_file)\n",
                      head, "WWW-Authenticate: Bearer\r\n");
      }
    }
    const std::string uri = ri->local_uri ? ri->local_uri : "";
    if (uri == "/metrics")
      return answer(c, 200, "text/plain; version=0.0.4; charset=utf-8", registry->render(), head);
    if (status_json) {
      if (uri == "/")
        return answer(c, 200, "text/html; charset=utf-8", kStatusHtml, head, kPageHeaders);
      if (uri == "/status.js")
        return answer(c, 200, "text/javascript; charset=utf-8", kStatusJs, head, kPageHeaders);
      if (uri == "/status.css")
        return answer(c, 200, "text/css; charset=utf-8", kStatusCss, head, kPageHeaders);
      if (uri == "/status.json")
        return answer(c, 200, "application/json", status_json(), head, kPageHeaders);
    }
    if (uri == "/")
      return answer(c, 200, "text/plain; charset=utf-8",
                    what + "\n/metrics: Prometheus metrics (text format 0.0.4)\n", head);
    return answer(c, 404, "text/plain", "not found\n", head);
  }
};

StatusServer::StatusServer(StatusConfig config, std::shared_ptr<Registry> registry,
                           std::string what, std::shared_ptr<spdlog::logger> log,
                           std::function<std::string()> status_json)
    : impl_(std::make_unique<Impl>()) {
  config.validate();
  STARLING_CHECK_ARG(!config.listen.empty(), "StatusServer: no status.listen address");
  STARLING_CHECK_ARG(registry != nullptr, "StatusServer: no registry");
  initLibrary();
  const HostPort hp = splitListen(config.listen);
  impl_->registry = std::move(registry);
  impl_->what = std::move(what);
  impl_->status_json = std::move(status_json);
  impl_->host = hp.host == "localhost" ? "127.0.0.1" : hp.host;
  impl_->token = config.token_file.empty() ? "" : readToken(config.token_file);
  const bool v6 = impl_->host.find(':') != std::string::npos;
  const std::string ports =
      (v6 ? "[" + impl_->host + "]" : impl_->host) + ":" + std::to_string(hp.port);
  const std::string threads = std::to_string(config.threads);
  const std::string queued = std::to_string(config.max_queued);
  const std::string timeout = std::to_string(config.timeout_ms);
  // No document_root: nothing but the handler below is served (no files, no directories).
  const char* options[] = {"listening_ports",
                           ports.c_str(),
                           "num_threads",
                           threads.c_str(),
                           "connection_queue",
                           queued.c_str(),
                           "listen_backlog",
                           queued.c_str(),
                           "request_timeout_ms",
                           timeout.c_str(),
                           "max_request_size",
                           "16384",
                           "enable_keep_alive",
                           "no",
                           nullptr};
  mg_callbacks callbacks{};
  // civetweb's own complaints (a malformed request, a timeout) are not the program's log; the
  // first one while it starts says why it could not.
  static thread_local std::string start_error;
  start_error.clear();
  callbacks.log_message = [](const mg_connection*, const char* m) {
    if (start_error.empty() && m) start_error = m;
    return 1;
  };
  impl_->ctx = mg_start(&callbacks, nullptr, options);
  if (!impl_->ctx) {
    const bool no_threads = start_error.find("threads") != std::string::npos;
    STARLING_THROW(IoError, "status.listen = '", config.listen, "': the HTTP server (civetweb) ",
                   "did not start: ", start_error.empty() ? "cannot bind" : start_error,
                   no_threads ? " (civetweb's fixed 100 KiB thread stack is refused by "
                                "pthread_create in a program whose libraries' thread-local storage "
                                "is larger, LibTorch's: such a program must link "
                                "ops/thread_stack_floor.cc)"
                              : " (the port in use, or not an address of this machine)");
  }
  mg_server_port sp[4] = {};
  const int n = mg_get_server_ports(impl_->ctx, 4, sp);
  port_ = n > 0 ? sp[0].port : -1;
  if (port_ <= 0) {
    mg_stop(impl_->ctx);
    impl_->ctx = nullptr;
    STARLING_THROW(IoError, "status.listen = '", config.listen, "': no port was bound");
  }
  mg_set_request_handler(
      impl_->ctx, "/",
      [](mg_connection* c, void* self) { return static_cast<Impl*>(self)->handle(c); },
      impl_.get());
  if (log)
    log->info("status: {} serves /metrics{}{}", url(),
              impl_->status_json ? " and the status page (/, /status.json)" : "",
              impl_->token.empty() ? "" : " (a bearer token is required)");
}

StatusServer::~StatusServer() {
  if (impl_ && impl_->ctx) mg_stop(impl_->ctx);  // joins its threads (each read waits timeout_ms)
}

std::string StatusServer::url() const {
  const bool v6 = impl_->host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + impl_->host + "]" : impl_->host) + ":" + std::to_string(port_);
}

uint64_t StatusServer::served() const { return impl_->served.load(); }
uint64_t StatusServer::unauthorized() const { return impl_->unauthorized.load(); }

}  // namespace starling::ops
