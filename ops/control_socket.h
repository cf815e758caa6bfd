#pragma once
// The local control socket an operator's starling-admin talks to (`admin.socket`): a Unix domain
// stream socket whose file only its owner may use (mode 0600, made so at creation), served on the
// thread that owns the object (poll() from the program's loop): each connection sends one command
// line (at most 1 KiB, within 250 ms: a caller that sends nothing holds the loop that long at
// most, and only the socket's owner can connect) and gets the handler's answer, then the
// connection is closed. Who asked is the peer's user and process, from the kernel
// (SO_PEERCRED), not from anything it says.
#include <cstdint>
#include <functional>
#include <string>

namespace starling::ops {

// The peer of one command, as the kernel knows it.
struct Caller {
  uint32_t uid = 0;
  int32_t pid = 0;
  std::string describe() const;  // "uid 1000 (pid 4242)"
};

class ControlSocket {
 public:
  // Creates the socket at `path` (IoError when it cannot; ConfigError when something other than
  // a stale socket is there, or a live program already serves it).
  explicit ControlSocket(std::string path);
  ~ControlSocket();  // closes and removes the socket file
  ControlSocket(const ControlSocket&) = delete;
  ControlSocket& operator=(const ControlSocket&) = delete;

  // Answers the commands waiting now (at most `max` of them), each with `handler(line, caller)`,
  // whose return is sent back. Never waits for a connection; a connection that sends no full line
  // within 250 ms, or one over 1 KiB, is answered with an error and closed; one whose caller has
  // hung up already (it gave up waiting) is closed without running its command.
  using Handler = std::function<std::string(const std::string& line, const Caller& caller)>;
  size_t poll(const Handler& handler, size_t max = 4);

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// starling-admin's side: sends `line` to the socket at `path` and returns the answer (IoError when
// it cannot connect, or no answer came within `timeout_ms`).
std::string sendControl(const std::string& path, const std::string& line, int timeout_ms = 10000);

}  // namespace starling::ops
