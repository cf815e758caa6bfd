#include "ops/status_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

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

// cpp-httplib's thread pool, bounded: at most `max_queued` connections wait; past that the
// listener thread serves the next itself (and so accepts nothing until it is done).
class BoundedPool : public httplib::TaskQueue {
 public:
  BoundedPool(size_t threads, size_t max_queued) : max_queued_(max_queued) {
    for (size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  void enqueue(std::function<void()> fn) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (jobs_.size() < max_queued_) {
        jobs_.push_back(std::move(fn));
        cv_.notify_one();
        return;
      }
    }
    fn();
  }
  void shutdown() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, nothing left
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }
  size_t max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
};

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
  if (max_queued < 0 || max_queued > 10000)
    STARLING_THROW(ConfigError, "status max_queued = ", max_queued, " (0..10000)");
  if (timeout_ms < 10 || timeout_ms > 600000)
    STARLING_THROW(ConfigError, "status timeout_ms = ", timeout_ms, " (10..600000)");
}

struct StatusServer::Impl {
  std::shared_ptr<Registry> registry;  // held: the handlers read it
  httplib::Server http;
  std::thread thread;
  std::string host;
  std::atomic<uint64_t> served{0}, unauthorized{0};
};

StatusServer::StatusServer(StatusConfig config, std::shared_ptr<Registry> registry,
                           std::string what, std::shared_ptr<spdlog::logger> log)
    : impl_(std::make_unique<Impl>()) {
  config.validate();
  STARLING_CHECK_ARG(!config.listen.empty(), "StatusServer: no status.listen address");
  STARLING_CHECK_ARG(registry != nullptr, "StatusServer: no registry");
  const HostPort hp = splitListen(config.listen);
  impl_->host = hp.host == "localhost" ? "127.0.0.1" : hp.host;
  const std::string token = config.token_file.empty() ? "" : readToken(config.token_file);
  httplib::Server& http = impl_->http;
  const size_t threads = static_cast<size_t>(config.threads);
  const size_t queued = static_cast<size_t>(config.max_queued);
  http.new_task_queue = [threads, queued] { return new BoundedPool(threads, queued); };
  const time_t sec = config.timeout_ms / 1000;
  const time_t usec = static_cast<time_t>(config.timeout_ms % 1000) * 1000;
  http.set_read_timeout(sec, usec);
  http.set_write_timeout(sec, usec);
  http.set_keep_alive_timeout(std::max<time_t>(1, sec));
  http.set_keep_alive_max_count(10);
  http.set_payload_max_length(0);
  // cpp-httplib's default sets SO_REUSEPORT too, which would let a second process bind the same
  // port beside this one and answer some of its scrapes: SO_REUSEADDR only.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  impl_->registry = std::move(registry);
  Impl* impl = impl_.get();
  Registry* reg = impl_->registry.get();
  // Every request: the token first when there is one.
  http.set_pre_routing_handler(
      [impl, token, reg](const httplib::Request& req, httplib::Response& res) {
        if (token.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const std::string auth = req.get_header_value("Authorization");
        const std::string prefix = "Bearer ";
        if (auth.rfind(prefix, 0) == 0 && constantTimeEqual(auth.substr(prefix.size()), token))
          return httplib::Server::HandlerResponse::Unhandled;
        impl->unauthorized.fetch_add(1, std::memory_order_relaxed);
        reg->counter("starling_http_requests_total", "HTTP requests answered, by status code.",
                     {{"code", "401"}})
            .inc();
        res.status = 401;
        res.set_header("WWW-Authenticate", "Bearer");
        res.set_content("a bearer token is required (status.token_file)\n", "text/plain");
        return httplib::Server::HandlerResponse::Handled;
      });
  http.Get("/metrics", [reg](const httplib::Request&, httplib::Response& res) {
    res.set_content(reg->render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/", [what](const httplib::Request&, httplib::Response& res) {
    res.set_content(what + "\n/metrics: Prometheus metrics (text format 0.0.4)\n",
                    "text/plain; charset=utf-8");
  });
  http.set_logger([impl, reg](const httplib::Request&, const httplib::Response& res) {
    impl->served.fetch_add(1, std::memory_order_relaxed);
    if (res.status != 401)
      reg->counter("starling_http_requests_total", "HTTP requests answered, by status code.",
                   {{"code", std::to_string(res.status)}})
          .inc();
  });
  if (hp.port == 0) {
    port_ = http.bind_to_any_port(impl_->host);
  } else if (http.bind_to_port(impl_->host, hp.port)) {
    port_ = hp.port;
  } else {
    port_ = -1;
  }
  if (port_ <= 0)
    STARLING_THROW(IoError, "status.listen = '", config.listen,
                   "': cannot bind (in use, or not an address of this machine)");
  impl_->thread = std::thread([impl] { impl->http.listen_after_bind(); });
  // stop() does nothing to a server not yet listening: wait until it is, so the destructor's
  // stop() always ends it.
  for (int i = 0; i < 5000 && !http.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (log)
    log->info("status: {} serves /metrics{}", url(),
              token.empty() ? "" : " (a bearer token is required)");
}

StatusServer::~StatusServer() {
  if (!impl_) return;
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::string StatusServer::url() const {
  const bool v6 = impl_->host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + impl_->host + "]" : impl_->host) + ":" + std::to_string(port_);
}

uint64_t StatusServer::served() const { return impl_->served.load(); }
uint64_t StatusServer::unauthorized() const { return impl_->unauthorized.load(); }

}  // namespace starling::ops
