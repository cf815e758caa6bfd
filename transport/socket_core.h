#pragma once
// Internal to transport/: what ServerSocket and ClientSocket share: the zmq socket and its
// options, framing (single frames and chunks), reassembly, rate limiting, stats. Owned by the
// thread that owns the public socket object.
#include <sys/socket.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include <zmq.hpp>

#include "transport/rate_limiter.h"
#include "transport/reassembly.h"
#include "transport/socket.h"

namespace starling::transport::detail {

class SocketCore {
 public:
  // `router`: frames carry the peer's routing id first; rate limiting applies.
  SocketCore(zmq::context_t& ctx, bool router, const TransportLimits& limits);

  // Options common to both sides (limits, heartbeats, CURVE keys except the server's ZAP domain).
  void applyCommonOptions(const SecurityConfig& security, bool server_side);

  std::optional<Received> receive(std::chrono::milliseconds timeout);
  // `peer` is used by a ROUTER only.
  bool send(const std::string& peer, std::span<const uint8_t> bytes);

  zmq::socket_t sock;
  TransportLimits limits;
  TransportStats stats;

 private:
  // Reads one message if one is ready (no wait); false when none was. May queue Received.
  bool readOne(Steady::time_point now);
  void onFrame(const std::string& peer, zmq::message_t&& msg, Steady::time_point now);
  void onChunk(const std::string& peer, std::optional<uint64_t> id, std::span<const uint8_t> bytes,
               Steady::time_point now);
  void fail(const std::string& peer, std::optional<uint64_t> id, InputError e);
  void housekeeping(Steady::time_point now);
  // Sends one frame (with the routing frame before it on a ROUTER). Waits for queue space until
  // `deadline` (none: no wait). False when the peer is unknown or gone or time ran out.
  bool sendFrame(const std::string& peer, zmq::message_t&& frame,
                 std::optional<Steady::time_point> deadline);

  // Under CURVE, the TCP connections each key's messages came on (their file descriptor, from
  // libzmq's ZMQ_SRCFD, and the peer's address then), for cutConnections(): at most
  // kConnectionsPerKey a key (the oldest forgotten), at most kKeysTracked keys (the map is cleared
  // past that; a key's next message brings it back).
  struct Connection {
    int fd = -1;
    std::string routing;  // libzmq's id of the connection (a new one for every connection)
    sockaddr_storage peer{};
    socklen_t peer_len = 0;
  };
  static constexpr size_t kConnectionsPerKey = 8, kKeysTracked = 200'000;
  std::unordered_map<uint64_t, std::vector<Connection>> connections_;
  // The routing ids of the connections cut (the last kDeadKept): what they queued is dropped.
  static constexpr size_t kDeadKept = 100'000;
  std::unordered_set<std::string> dead_;
  std::deque<std::string> dead_order_;
  void noteConnection(uint64_t id, const std::string& routing, zmq::message_t& msg);

 public:
  // Shuts down (SHUT_RDWR) every TCP connection key `id`'s messages came on that is still that
  // connection (the descriptor's peer address unchanged: a descriptor libzmq closed and reused for
  // another peer is left alone); libzmq then sees it closed. How many were cut.
  size_t cutConnections(uint64_t id);

 private:
  bool router_;
  Reassembler reasm_;
  RateLimiter rate_;
  std::deque<Received> ready_;
  std::vector<uint64_t> scratch_;  // an aligned copy of a misaligned chunk frame
  uint64_t next_transfer_;
  Steady::time_point last_expire_{};
};

}  // namespace starling::transport::detail
