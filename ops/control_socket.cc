#include "ops/control_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"

namespace starling::ops {

namespace {

constexpr size_t kMaxLine = 1024;
constexpr int kLineTimeoutMs = 250;

sockaddr_un addressOf(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof a.sun_path)
    STARLING_THROW(ConfigError, "admin.socket = '", path, "': a path of 1 to ",
                   sizeof a.sun_path - 1, " bytes");
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

// Writes all of `s` (the peer may read slowly; bounded by the socket's send timeout).
void writeAll(int fd, const std::string& s) {
  size_t at = 0;
  while (at < s.size()) {
    const ssize_t n = ::send(fd, s.data() + at, s.size() - at, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    at += static_cast<size_t>(n);
  }
}

// One line from `fd` (without its newline), waiting at most kLineTimeoutMs in all; false when
// none came in time, the peer closed first, or it ran past kMaxLine.
bool readLine(int fd, std::string& line) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kLineTimeoutMs);
  char buf[256];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          until - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return !line.empty() && line.size() <= kMaxLine;  // closed: what came is the line
    line.append(buf, static_cast<size_t>(n));
    if (const size_t nl = line.find('\n'); nl != std::string::npos) {
      line.resize(nl);
      return line.size() <= kMaxLine;
    }
    if (line.size() > kMaxLine) return false;
  }
}

}  // namespace

std::string Caller::describe() const {
  return "uid " + std::to_string(uid) + " (pid " + std::to_string(pid) + ")";
}

ControlSocket::ControlSocket(std::string path) : path_(std::move(path)) {
  const sockaddr_un a = addressOf(path_);
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      STARLING_THROW(ConfigError, "admin.socket = '", path_,
                     "' exists and is not a socket: give another path");
    // A socket file: in use by a live program, or left by one that died.
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live =
        probe >= 0 && ::connect(probe, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
    if (probe >= 0) ::close(probe);
    if (live)
      STARLING_THROW(ConfigError, "admin.socket = '", path_,
                     "' is served by a running program already");
    ::unlink(path_.c_str());
  }
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) STARLING_THROW(IoError, "admin.socket: socket(): ", std::strerror(errno));
  // Made 0600 at creation (no moment where another user could connect), then listening.
  const mode_t old = ::umask(0177);
  const int rc = ::bind(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  const int err = errno;
  ::umask(old);
  if (rc != 0 || ::listen(fd_, 16) != 0) {
    ::close(fd_);
    fd_ = -1;
    STARLING_THROW(IoError, "admin.socket = '", path_, "': cannot bind: ", std::strerror(err));
  }
}

ControlSocket::~ControlSocket() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(path_.c_str());
}

size_t ControlSocket::poll(const Handler& handler, size_t max) {
  size_t answered = 0;
  while (answered < max) {
    const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return answered;  // none waiting (EAGAIN), or a transient error: next time
    ucred cred{};
    socklen_t len = sizeof cred;
    Caller who;
    if (::getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      who.uid = cred.uid;
      who.pid = cred.pid;
    }
    timeval tv{1, 0};
    ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    std::string line;
    if (!readLine(c, line)) {
      writeAll(c, "error: one command line of at most 1024 bytes, within 250 ms\n");
    } else if (pollfd p{c, POLLRDHUP, 0};
               ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
      // The caller gave up before its turn came (starling-admin waits 10 s; the loop may have
      // been busy longer): a command nobody waits for is not run.
    } else {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      std::string answer = handler(line, who);
      if (answer.empty() || answer.back() != '\n') answer += '\n';
      writeAll(c, answer);
    }
    ::close(c);
    ++answered;
  }
  return answered;
}

std::string sendControl(const std::string& path, const std::string& line, int timeout_ms) {
  const sockaddr_un a = addressOf(path);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) STARLING_THROW(IoError, "socket(): ", std::strerror(errno));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    const int err = errno;
    ::close(fd);
    STARLING_THROW(IoError, "cannot reach ", path, ": ", std::strerror(err),
                   " (is the server running with admin.socket = ", path,
                   ", and may this user open it?)");
  }
  writeAll(fd, line + "\n");
  std::string answer;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          until - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      ::close(fd);
      STARLING_THROW(IoError, "no answer from ", path, " within ", timeout_ms, " ms");
    }
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return answer;
}

}  // namespace starling::ops
