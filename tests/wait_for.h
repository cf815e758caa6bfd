#pragma once
// Waiting for what a test cannot be told of through a call, on the event itself, never on a fixed
// schedule (a loaded CI machine would race a fixed pause):
// - waitForFiles: another process (or thread) writes a file in a folder: the condition is checked
//   again each time inotify reports a file there created, written, closed or renamed, and, for a
//   condition that is asked of a process rather than read from a file (a server's status over its
//   admin socket), at least every `recheck` when one is given: a question that failed once (the
//   server busy) is asked again even when no file changes;
// - waitForExit: processes end: a pidfd of each becomes readable when it terminates (a zombie
//   counts as ended), whoever its parent is.
// Both return whether the condition held within `timeout`.
#include <poll.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace starling::testing {

namespace wait_detail {

// Milliseconds left until `until`, at least 0.
inline int msLeft(std::chrono::steady_clock::time_point until) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      until - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<std::chrono::milliseconds::rep>(0, left.count()));
}

// A file descriptor closed with its scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace wait_detail

inline bool waitForFiles(const std::filesystem::path& dir, const std::function<bool()>& pred,
                         std::chrono::milliseconds timeout,
                         std::chrono::milliseconds recheck = std::chrono::milliseconds(0)) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  wait_detail::Fd in{::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)};
  if (in.fd < 0) throw std::runtime_error("inotify_init1 failed");
  // Watching starts before the first check: nothing written after it goes unseen.
  if (::inotify_add_watch(in.fd, dir.c_str(),
                          IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO) < 0)
    throw std::runtime_error("inotify_add_watch failed for " + dir.string());
  std::vector<char> events(16384);
  for (;;) {
    if (pred()) return true;
    const int left = wait_detail::msLeft(until);
    if (left == 0) return false;
    pollfd p{in.fd, POLLIN, 0};
    const int wait =
        recheck.count() > 0 ? std::min<int>(left, static_cast<int>(recheck.count())) : left;
    if (::poll(&p, 1, wait) < 0 && errno != EINTR) throw std::runtime_error("poll failed");
    while (::read(in.fd, events.data(), events.size()) > 0) {
    }  // drained: the next check sees every change so far
  }
}

inline bool waitForExit(std::span<const int> pids, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::vector<wait_detail::Fd> fds(pids.size());
  std::vector<pollfd> open;
  for (size_t i = 0; i < pids.size(); ++i) {
    fds[i].fd = static_cast<int>(::syscall(SYS_pidfd_open, pids[i], 0));
    if (fds[i].fd < 0 && errno != ESRCH) throw std::runtime_error("pidfd_open failed");
    if (fds[i].fd >= 0) open.push_back(pollfd{fds[i].fd, POLLIN, 0});  // ESRCH: already gone
  }
  while (!open.empty()) {
    const int left = wait_detail::msLeft(until);
    if (left == 0) return false;
    if (::poll(open.data(), open.size(), left) < 0 && errno != EINTR)
      throw std::runtime_error("poll failed");
    std::erase_if(open, [](const pollfd& p) { return (p.revents & (POLLIN | POLLHUP)) != 0; });
  }
  return true;
}

}  // namespace starling::testing
