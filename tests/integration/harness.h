#pragma once
// Real processes on 127.0.0.1 for the deployment tests: start starling-server / starling-client /
// starling-keygen with their output in a log file, wait for a condition with a time bound, and
// kill exactly what was started, by pid (a Proc kills its process when it goes out of scope).
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/bytes.h"
#include "core/file_io.h"
#include "core/framed_file.h"
#include "tests/wait_for.h"

extern char** environ;

namespace starling::testing {

inline std::string binDir() { return STARLING_BIN_DIR; }

class Proc {
 public:
  Proc() = default;
  Proc(std::vector<std::string> argv, std::string log) : log_(std::move(log)) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const int rc = posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  Proc(Proc&& o) noexcept : pid_(o.pid_), log_(std::move(o.log_)), status_(o.status_) {
    o.pid_ = -1;
  }
  Proc& operator=(Proc&& o) noexcept {
    if (this != &o) {
      stop();
      pid_ = o.pid_;
      log_ = std::move(o.log_);
      status_ = o.status_;
      o.pid_ = -1;
    }
    return *this;
  }
  ~Proc() { stop(); }

  pid_t pid() const { return pid_; }
  const std::string& log() const { return log_; }
  bool alive() {
    if (pid_ <= 0) return false;
    int st = 0;
    const pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = st;
      pid_ = -1;
      return false;
    }
    return true;
  }
  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // Waits for the process to exit; returns its exit code (128 + signal when killed), or -1 when it
  // is still running after `timeout` (it is then left running).
  int wait(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (alive()) {
      if (std::chrono::steady_clock::now() >= until) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (WIFEXITED(status_)) return WEXITSTATUS(status_);
    if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
    return -2;
  }
  // SIGKILL and reap (only this pid).
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, &status_, 0);
      pid_ = -1;
    }
  }

 private:
  pid_t pid_ = -1;
  std::string log_;
  int status_ = 0;
};

inline std::string readText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> readLines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

inline size_t countOf(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// A port free on 127.0.0.1 right now (the kernel's pick).
inline int freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    path =
        std::filesystem::temp_directory_path() /
        ("starling-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    if (!std::getenv("STARLING_KEEP_TEST_DIRS")) std::filesystem::remove_all(path);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// A root server's checkpoint (server/engine.cc's format): the next round, the model version and
// the model.
struct Checkpoint {
  uint64_t next_round = 0, version = 0;
  std::vector<float> model;
};
inline Checkpoint readCheckpoint(const std::string& path) {
  const auto bytes = readFile(path, uint64_t{1} << 30);
  // The engine's checkpoint in the files' frame (core/framed_file.h), format 8.
  ByteReader r(unframe(FileFormat{0x4b434c53, "Starling checkpoint", 8, 8, 8}, bytes, path).payload,
               path);
  Checkpoint c;
  r.u64();  // the layout's fingerprint
  c.next_round = r.u64();
  c.version = r.u64();
  r.floats(c.model);
  return c;
}

}  // namespace starling::testing
