#pragma once
// Context: one ZeroMQ context plus, once a CURVE server socket is created on it, the ZAP handler
// that authenticates that socket's clients.
//
// ZAP (ZeroMQ RFC 27): during each CURVE handshake libzmq asks the handler bound at
// inproc://zeromq.zap.01 *of the same context* whether the client's public key may connect. Our
// handler is a thread that owns that REP socket. Each CURVE ServerSocket registers its AllowList
// under its own ZAP domain; the handler admits a client iff its key is on the list of the domain
// the request names, answering status 200 with User-Id = the client's id in decimal (the server
// socket reads it back from each message's metadata), and refuses everything else (status 400),
// counting refusals. The handler is bound before any CURVE server socket binds and lives as long
// as the Context, which matters: libzmq 4.3 admits every CURVE client when no handler is bound.
//
// There is no global state: many Contexts (servers, aggregators, clients) live in one process,
// each with its own handler.
//
// Lifetime: every socket created on a Context must be destroyed before it (ZeroMQ's context
// termination waits for its sockets); the destructor aborts with a message instead of hanging
// when one is still open. The destructor stops the ZAP thread through an inproc socket and joins
// it. Thread-safety: sockets may be created from any thread; zapRefused()/zapAdmitted() are atomic.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace starling::transport {

class AllowList;

class Context {
 public:
  explicit Context(int io_threads = 1);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // CURVE handshakes the ZAP handler refused (key not on the allow-list, unknown domain, not
  // CURVE, malformed request) and admitted.
  uint64_t zapRefused() const;
  uint64_t zapAdmitted() const;
  // Blocks until pred(admitted, refused) holds, woken by each handshake the ZAP handler decides;
  // false when `timeout` passed first. (For a caller that waits on handshakes: a test, a probe.)
  bool waitZap(const std::function<bool(uint64_t admitted, uint64_t refused)>& pred,
               std::chrono::milliseconds timeout) const;

  // One refused handshake, for the server's log: the peer's address, the first bytes of the
  // public key it presented (hex), and why.
  struct Refusal {
    std::string address, key, reason;
  };

  // Internal to transport/: the zmq context (a zmq::context_t*) and the ZAP registry.
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace starling::transport
