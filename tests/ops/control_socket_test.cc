// ops/control_socket.h: the local socket starling-admin talks to. Commands and answers go both
// ways, who asked is the kernel's word, the file is the owner's only, and what is not a command
// (silence, an endless line, a path already taken) is refused without holding the owner long.
#include "ops/control_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <future>
#include <thread>

#include "core/error.h"
#include "temp_dir.h"

using namespace starling;
using namespace starling::ops;
using namespace std::chrono_literals;

namespace {

// Serves `server` on this thread until `done` is ready (polling as a program's loop would).
template <class T>
T serveUntil(ControlSocket& server, std::future<T>& done, const ControlSocket::Handler& h) {
  while (done.wait_for(10ms) != std::future_status::ready) server.poll(h);
  return done.get();
}

int rawConnect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

std::string readAll(int fd) {
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

}  // namespace

TEST_CASE("a command goes in, its answer comes back, and the caller is who the kernel says",
          "[ops]") {
  testing::TempDir dir;
  const std::string path = (dir.path / "admin.sock").string();
  ControlSocket server(path);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 0777) == 0600);  // the owner's only
  CHECK(server.poll([](const std::string&, const Caller&) { return "x"; }) == 0);  // none waiting
  Caller seen;
  std::string got;
  auto done = std::async(std::launch::async, [&] { return sendControl(path, "revoke 17"); });
  const std::string answer =
      serveUntil(server, done, [&](const std::string& line, const Caller& c) {
        got = line;
        seen = c;
        return std::string("revoked client 17");
      });
  CHECK(got == "revoke 17");
  CHECK(answer == "revoked client 17\n");
  CHECK(seen.uid == ::getuid());
  CHECK(seen.pid == ::getpid());  // std::async's thread is this process
  CHECK(seen.describe() ==
        "uid " + std::to_string(::getuid()) + " (pid " + std::to_string(::getpid()) + ")");
}

TEST_CASE("silence, an endless line and a taken path are refused", "[ops]") {
  testing::TempDir dir;
  const std::string path = (dir.path / "admin.sock").string();
  ControlSocket server(path);
  size_t handled = 0;
  const auto handler = [&](const std::string&, const Caller&) {
    ++handled;
    return std::string("ok");
  };
  {
    // Connected, says nothing: answered with an error within the line's time, the owner's loop
    // held at most that long.
    const int fd = rawConnect(path);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(server.poll(handler) == 1);
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
    CHECK(readAll(fd).rfind("error:", 0) == 0);
    ::close(fd);
  }
  {
    const int fd = rawConnect(path);
    const std::string endless(5000, 'a');
    (void)!::write(fd, endless.data(), endless.size());
    CHECK(server.poll(handler) == 1);
    CHECK(readAll(fd).rfind("error:", 0) == 0);
    ::close(fd);
  }
  {
    // A caller that gave up (hung up) before its turn: its command is not run. (A Unix socket's
    // close is seen by its peer as soon as close() returns.)
    const int fd = rawConnect(path);
    const std::string line = "drain\n";
    (void)!::write(fd, line.data(), line.size());
    ::close(fd);
    CHECK(server.poll(handler) == 1);
  }
  CHECK(handled == 0);
  // The path is served: a second server is refused, and so is a path that is not a socket.
  CHECK_THROWS_AS(ControlSocket(path), ConfigError);
  const auto file = dir.path / "plain.txt";
  std::ofstream(file) << "not a socket";
  CHECK_THROWS_AS(ControlSocket(file.string()), ConfigError);
  CHECK_THROWS_AS(ControlSocket(std::string(200, 'p')), ConfigError);  // longer than sun_path
  CHECK_THROWS_AS(sendControl((dir.path / "nobody.sock").string(), "status"), IoError);
}

TEST_CASE("a socket left by a program that died is replaced and a closed one removes its file",
          "[ops]") {
  testing::TempDir dir;
  const std::string path = (dir.path / "admin.sock").string();
  {
    // A stale socket file: bound, then its descriptor closed without unlinking (as a crash).
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    ::close(fd);
  }
  {
    ControlSocket server(path);
    auto done = std::async(std::launch::async, [&] { return sendControl(path, "status"); });
    CHECK(serveUntil(server, done, [](const std::string& l, const Caller&) { return l; }) ==
          "status\n");
  }
  CHECK_FALSE(std::filesystem::exists(path));
}
