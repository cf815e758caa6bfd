// ops/status_server.h: the operator's HTTP endpoint on 127.0.0.1, through cpp-httplib's client and
// raw sockets: what it serves, what it refuses (configuration, tokens), and that hostile HTTP
// clients (idle connections past its threads and queue, an oversized header, a path outside it)
// are bounded and do not stop it serving.
#include "ops/status_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.h"
#include "temp_dir.h"

using namespace starling;
using namespace starling::ops;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<Registry> registryWithRound(double round) {
  auto r = std::make_shared<Registry>();
  r->gauge("starling_round", "The round.").set(round);
  return r;
}

StatusConfig loopback(int timeout_ms = 2000) {
  StatusConfig c;
  c.listen = "127.0.0.1:0";
  c.timeout_ms = timeout_ms;
  return c;
}

// A raw TCP connection to 127.0.0.1:port (closed on destruction); -1 when it failed.
struct RawConnection {
  int fd = -1;
  explicit RawConnection(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~RawConnection() {
    if (fd >= 0) ::close(fd);
  }
  void send(const std::string& s) const { (void)!::write(fd, s.data(), s.size()); }
  // Everything the server sends until it closes or `timeout` passes.
  std::string readAll(std::chrono::milliseconds timeout) const {
    timeval tv{static_cast<time_t>(timeout.count() / 1000),
               static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string out;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) return out;
      out.append(buf, static_cast<size_t>(n));
    }
  }
};

std::string writeToken(const std::filesystem::path& dir, const std::string& token, mode_t mode) {
  const auto p = dir / "token";
  std::ofstream(p) << token << "\n";
  ::chmod(p.c_str(), mode);
  return p.string();
}

}  // namespace

TEST_CASE("the status server serves /metrics in the text format on a free loopback port", "[ops]") {
  auto reg = registryWithRound(3);
  StatusServer s(loopback(), reg, "starling-server root on tcp://127.0.0.1:7700");
  REQUIRE(s.port() > 0);
  CHECK(s.url() == "http://127.0.0.1:" + std::to_string(s.port()));
  httplib::Client c("127.0.0.1", s.port());
  auto m = c.Get("/metrics");
  REQUIRE(m);
  CHECK(m->status == 200);
  CHECK(m->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0) == 0);
  CHECK(m->body.find("\nstarling_round 3\n") != std::string::npos);
  CHECK(m->body.find("process_resident_memory_bytes ") != std::string::npos);
  reg->gauge("starling_round", "The round.")
      .set(4);  // the program moves on: the next scrape sees it
  auto m2 = c.Get("/metrics");
  REQUIRE(m2);
  CHECK(m2->body.find("\nstarling_round 4\n") != std::string::npos);
  auto root = c.Get("/");
  REQUIRE(root);
  CHECK(root->status == 200);
  CHECK(root->body.find("starling-server root") != std::string::npos);
  auto none = c.Get("/nothing-here");
  REQUIRE(none);
  CHECK(none->status == 404);
  auto post = c.Post("/metrics", "x", "text/plain");
  REQUIRE(post);
  CHECK(post->status == 405);  // GET and HEAD only
  // Its own answers are counted once sent: a scrape sees the ones before it.
  auto m3 = c.Get("/metrics");
  REQUIRE(m3);
  INFO(m3->body.substr(0, m3->body.find("process_")));
  CHECK(m3->body.find("starling_http_requests_total{code=\"200\"} 3") != std::string::npos);
  CHECK(m3->body.find("starling_http_requests_total{code=\"404\"} 1") != std::string::npos);
  CHECK(m3->body.find("starling_http_requests_total{code=\"405\"} 1") != std::string::npos);
  CHECK(s.served() >= 5);
}

TEST_CASE("given the status page's facts, the server serves the page, its files and the JSON",
          "[ops]") {
  std::atomic<int> asked{0};
  StatusServer s(loopback(), registryWithRound(1), "starling-server root", nullptr,
                 [&asked] { return "{\"round\":{\"number\":" + std::to_string(++asked) + "}}"; });
  httplib::Client c("127.0.0.1", s.port());
  // Each GET of the JSON asks the source again (the program's snapshot of the moment).
  for (int i = 1; i <= 2; ++i) {
    auto j = c.Get("/status.json");
    REQUIRE(j);
    CHECK(j->status == 200);
    CHECK(j->get_header_value("Content-Type") == "application/json");
    CHECK(j->body == "{\"round\":{\"number\":" + std::to_string(i) + "}}");
  }
  struct Asset {
    const char* path;
    const char* type;
    const char* holds;  // something only that file has
  };
  for (const Asset& a : {Asset{"/", "text/html; charset=utf-8", "<script src=\"/status.js\""},
                         Asset{"/status.js", "text/javascript; charset=utf-8", "/status.json"},
                         Asset{"/status.css", "text/css; charset=utf-8", ".card"}}) {
    INFO(a.path);
    auto r = c.Get(a.path);
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(r->get_header_value("Content-Type") == a.type);
    CHECK(r->body.find(a.holds) != std::string::npos);
    // Nothing but this server's own script, style and JSON; never framed; no sniffing.
    const std::string csp = r->get_header_value("Content-Security-Policy");
    CHECK(csp.find("default-src 'none'") != std::string::npos);
    CHECK(csp.find("script-src 'self'") != std::string::npos);
    CHECK(csp.find("frame-ancestors 'none'") != std::string::npos);
    CHECK(r->get_header_value("X-Content-Type-Options") == "nosniff");
  }
  // The page has no inline script or style for the policy to refuse, and fetches nothing else.
  auto page = c.Get("/");
  REQUIRE(page);
  CHECK(page->body.find("<script>") == std::string::npos);
  CHECK(page->body.find("style=") == std::string::npos);
  CHECK(page->body.find("http") == std::string::npos);
  CHECK(asked == 2);

  // Without a token, a name that is not loopback's is refused (a web page whose name was made to
  // resolve to 127.0.0.1 reads nothing); loopback names with any port are served.
  for (const char* h : {"127.0.0.1:9", "localhost", "[::1]:80", "127.1.2.3"}) {
    INFO(h);
    auto r = c.Get("/status.json", {{"Host", h}});
    REQUIRE(r);
    CHECK(r->status == 200);
  }
  for (const char* h : {"evil.example:9464", "attacker.test", "[2001:db8::1]:9464", "[::1"}) {
    INFO(h);
    auto r = c.Get("/metrics", {{"Host", h}});
    REQUIRE(r);
    CHECK(r->status == 421);
  }
  // A source that throws is a 500, and the server goes on.
  StatusServer failing(loopback(), registryWithRound(1), "root", nullptr,
                       []() -> std::string { throw std::runtime_error("out of luck"); });
  httplib::Client f("127.0.0.1", failing.port());
  auto boom = f.Get("/status.json");
  REQUIRE(boom);
  CHECK(boom->status == 500);
  auto after = f.Get("/metrics");
  REQUIRE(after);
  CHECK(after->status == 200);

  // Without a source, there is no page: / says what is served, /status.json is not there.
  StatusServer plain(loopback(), registryWithRound(1), "starling-server root");
  httplib::Client p("127.0.0.1", plain.port());
  auto root = p.Get("/");
  REQUIRE(root);
  CHECK(root->get_header_value("Content-Type") == "text/plain; charset=utf-8");
  auto json = p.Get("/status.json");
  REQUIRE(json);
  CHECK(json->status == 404);
}

TEST_CASE("status settings that would expose it or cannot work are refused", "[ops]") {
  testing::TempDir dir;
  const auto refused = [](const std::string& listen, const std::string& token = {}) {
    StatusConfig c;
    c.listen = listen;
    c.token_file = token;
    try {
      c.validate();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refused("0.0.0.0:9464").find("not a loopback address") != std::string::npos);
  CHECK(refused("[::]:9464").find("status.token_file") != std::string::npos);
  CHECK(refused("192.168.1.10:9464").find("loopback") != std::string::npos);
  for (const char* bad : {"9464", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999", "example.org:80",
                          "127.0.0.1:9x", "[::1:9464"})
    CHECK(refused(bad).find("expected HOST:PORT") != std::string::npos);
  CHECK(refused("127.0.0.1:9464").empty());
  CHECK(refused("localhost:9464").empty());
  CHECK(refused("[::1]:9464").empty());
  CHECK(refused("").empty());  // off
  CHECK(refused("0.0.0.0:9464", (dir.path / "missing").string()).find("cannot read") !=
        std::string::npos);
  CHECK(refused("0.0.0.0:9464", writeToken(dir.path, "0123456789abcdef", 0644)).find("chmod 600") !=
        std::string::npos);
  CHECK(refused("0.0.0.0:9464", writeToken(dir.path, "short", 0600)).find("16 characters") !=
        std::string::npos);
  CHECK(refused("0.0.0.0:9464", writeToken(dir.path, "0123456789abcdef", 0600)).empty());
  CHECK(isLoopback("127.1.2.3"));
  CHECK_FALSE(isLoopback("128.0.0.1"));
  CHECK(isLoopback("::1"));
  CHECK_FALSE(isLoopback("::"));
  // A port in use cannot be bound: IoError, saying which setting.
  StatusServer first(loopback(), registryWithRound(1), "first");
  StatusConfig same = loopback();
  same.listen = "127.0.0.1:" + std::to_string(first.port());
  CHECK_THROWS_AS(StatusServer(same, registryWithRound(1), "second"), IoError);
}

TEST_CASE("with a token file, a request without its bearer token is refused", "[ops]") {
  testing::TempDir dir;
  const std::string token = "s3cret-token-0123456789";
  StatusConfig cfg = loopback();
  cfg.token_file = writeToken(dir.path, token, 0600);
  StatusServer s(cfg, registryWithRound(5), "root");
  httplib::Client c("127.0.0.1", s.port());
  auto bare = c.Get("/metrics");
  REQUIRE(bare);
  CHECK(bare->status == 401);
  CHECK(bare->get_header_value("WWW-Authenticate") == "Bearer");
  CHECK(bare->body.find("starling_round") == std::string::npos);
  auto wrong = c.Get("/metrics", {{"Authorization", "Bearer s3cret-token-0123456788"}});
  REQUIRE(wrong);
  CHECK(wrong->status == 401);
  auto prefix = c.Get("/metrics", {{"Authorization", "Bearer s3cret"}});
  REQUIRE(prefix);
  CHECK(prefix->status == 401);
  auto root = c.Get("/", {{"Authorization", "Basic " + token}});
  REQUIRE(root);
  CHECK(root->status == 401);
  auto right = c.Get("/metrics", {{"Authorization", "Bearer " + token}});
  REQUIRE(right);
  CHECK(right->status == 200);
  CHECK(right->body.find("\nstarling_round 5\n") != std::string::npos);
  CHECK(s.unauthorized() == 4);
}

TEST_CASE("hostile HTTP clients are bounded and the server goes on serving", "[ops]") {
  // Two threads, two queued connections, 300 ms per read: 24 idle connections hold everything
  // for at most a few seconds, after which a scrape is answered.
  StatusConfig cfg = loopback(300);
  cfg.threads = 2;
  cfg.max_queued = 2;
  StatusServer s(cfg, registryWithRound(9), "root");
  {
    std::vector<std::unique_ptr<RawConnection>> idle;
    for (int i = 0; i < 24; ++i) {
      idle.push_back(std::make_unique<RawConnection>(s.port()));
      if (i % 2) idle.back()->send("GET /metr");  // half a request line, then nothing
    }
    httplib::Client c("127.0.0.1", s.port());
    c.set_connection_timeout(20);
    c.set_read_timeout(20);
    const auto t0 = std::chrono::steady_clock::now();
    auto m = c.Get("/metrics");
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    REQUIRE(m);
    CHECK(m->status == 200);
    INFO("answered after " << took << " s behind 24 idle connections");
    CHECK(took < 15);  // bounded: (24 / 2 threads) x 300 ms, with room for a loaded machine
    for (auto& conn : idle) {
      // Each idle connection was closed by the server (its read timed out), not held open.
      CHECK(conn->readAll(3000ms).find("starling_round") == std::string::npos);
    }
  }
  // An oversized header (past cpp-httplib's 8 KiB) is refused; a path outside the endpoints is a
  // 404 that serves no file.
  {
    RawConnection big(s.port());
    big.send("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + std::string(20000, 'a') +
             "\r\n\r\n");
    const std::string answer = big.readAll(3000ms);
    CHECK(answer.find("starling_round") == std::string::npos);
  }
  {
    // Header lines of 8 KiB without end: refused once the request passes 16 KiB, not read on.
    RawConnection flood(s.port());
    flood.send("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (int i = 0; i < 40; ++i)
      flood.send("X-" + std::to_string(i) + ": " + std::string(8000, 'b') + "\r\n");
    const std::string answer = flood.readAll(3000ms);
    CHECK(answer.find("starling_round") == std::string::npos);
  }
  {
    // A body announced by chunks (whose length no header bounds): refused unread.
    RawConnection chunked(s.port());
    chunked.send(
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        "ffffff\r\n" +
        std::string(4000, 'c'));
    const std::string answer = chunked.readAll(3000ms);
    CHECK(answer.find(" 413 ") != std::string::npos);
    CHECK(answer.find("starling_round") == std::string::npos);
  }
  {
    RawConnection traversal(s.port());
    traversal.send(
        "GET /../../../../etc/passwd HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    const std::string answer = traversal.readAll(3000ms);
    CHECK(answer.find("root:") == std::string::npos);
    CHECK(answer.find(" 404 ") != std::string::npos);  // no file is served, only the routes
  }
  httplib::Client c("127.0.0.1", s.port());
  auto after = c.Get("/metrics");
  REQUIRE(after);
  CHECK(after->status == 200);
  CHECK(after->body.find("\nstarling_round 9\n") != std::string::npos);
}

TEST_CASE("a request trickled a byte at a time is cut off, and the others are served meanwhile",
          "[ops]") {
  // civetweb bounds the whole of a request's line and headers by request_timeout_ms (not only
  // each read): a client that sends a byte every 100 ms, each read well within the timeout, is
  // answered 400 and closed once the request has taken longer than that.
  StatusServer s(loopback(/*timeout_ms=*/1000), registryWithRound(2), "root");
  const std::string request =
      "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + std::string(100, 's') + "\r\n\r\n";
  RawConnection slow(s.port());
  REQUIRE(slow.fd >= 0);
  size_t sent = 0;
  bool cut = false;
  std::string answer;
  httplib::Client c("127.0.0.1", s.port());
  bool served_meanwhile = false;
  for (; sent < request.size() && !cut; ++sent) {
    if (::send(slow.fd, request.data() + sent, 1, MSG_NOSIGNAL) != 1) {
      cut = true;
      break;
    }
    // The next byte in 100 ms, unless the server answers or closes first (the event this waits
    // on; the timeout is the attack's pace).
    pollfd p{slow.fd, POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) {
      char buf[512];
      const ssize_t n = ::recv(slow.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) answer.append(buf, static_cast<size_t>(n));
      cut = true;  // an answer (400), or the connection closed
    }
    if (sent == 1) {
      auto m = c.Get("/metrics");  // another client, while the trickle holds a thread
      served_meanwhile = m && m->status == 200;
    }
  }
  INFO("sent " << sent << " of " << request.size() << " bytes; answer: " << answer);
  CHECK(cut);
  CHECK(sent < request.size() / 2);  // cut off long before it could finish
  CHECK(answer.find("starling_round") == std::string::npos);
  CHECK(served_meanwhile);
}

TEST_CASE("a status server that was never asked anything stops at once", "[ops]") {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) StatusServer s(loopback(), registryWithRound(1), "root");
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
}
