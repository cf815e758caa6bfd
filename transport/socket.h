#pragma once
// Starling's two ZeroMQ sockets: ServerSocket (ROUTER, bound) and ClientSocket (DEALER, connects).
// Every ZeroMQ socket option in Starling is set here, nowhere above transport/.
//
// Security: CURVE (CurveZMQ) unless SecurityConfig::insecure. The server admits a client iff its
// public key is on the AllowList (ZAP, see context.h), and every message it receives carries the
// id that key is listed under (Received::authenticated_id).
//
// Framing: a message of at most chunk_bytes travels as one frame. A larger one travels as Chunk
// messages (protocol/control.h: transfer, index, count, total_bytes, data), one frame each; the
// receiver reassembles it within the limits (TransportLimits) and delivers it as one Received.
// Sizes are 64-bit: a message of tens of GB can be sent as chunks, memory bounded by the limits.
//
// Faults are values: receive() never throws for anything a peer sent. A chunk out of order, of a
// wrong size, or over a limit drops that peer's transfer, frees its memory and yields a Received
// whose `error` is set (Errc::kBadChunk, kTooLarge, or the decoder's code; kBusy when the
// reassembly budget is full: nothing was wrong, send again later); the same for a single
// frame over max_message_bytes (a frame far over it, above ZMQ_MAXMSGSIZE, makes libzmq drop the
// connection and is never seen). Later chunks of a transfer already refused are dropped silently.
//
// Threading: one thread owns each socket object (construct, send, receive, destroy). Other threads
// hand work to that thread through a queue or an inproc socket. The Context must outlive it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "core/input_error.h"

namespace zmq {
class socket_t;
}
#include "transport/context.h"
#include "transport/keys.h"

namespace starling::transport {

struct SecurityConfig {
  bool insecure = false;          // plain TCP, no authentication: tests and trusted networks only
  CurveKeyPair own;               // this side's key pair
  std::string server_public_key;  // client side: the server's Z85 public key
  std::shared_ptr<const AllowList> allow;  // server side: the admitted clients
  // ConfigError with a clear message unless insecure or the keys this side needs are valid Z85
  // (own, plus allow on a server or server_public_key on a client) and own is a matching pair.
  void validate(bool server_side) const;
};

struct TransportLimits {
  // Messages larger than this travel as chunks of this size.
  size_t chunk_bytes = size_t{1} << 20;
  // The largest message accepted, one frame or reassembled.
  size_t max_message_bytes = size_t{1} << 30;
  // All peers' partial transfers together (each reserves its whole total_bytes at its chunk 0).
  size_t max_reassembly_bytes = size_t{2} << 30;
  // Per-peer token bucket, server side; a chunk counts as a message. An honest peer sends what
  // the server asks for: the fastest round measured (softmax, 660 rounds/s with an evaluation
  // each: 1,320 messages/s, where a limit of 1,000 once failed a round) and 1 MiB chunks at
  // 10 Gb/s (1,200/s) sit well inside it.
  double max_messages_per_second = 10000;
  double burst = 2000;
  // ZMQ heartbeats (PING/PONG, ZMQ_HEARTBEAT_IVL/TIMEOUT/TTL) on both sides.
  int heartbeat_ivl_ms = 1000, heartbeat_timeout_ms = 5000;
  // Client: reconnect backoff, doubling from the first to the second.
  int reconnect_ivl_ms = 100, reconnect_ivl_max_ms = 5000;
  // Frames queued per peer (0 = unbounded).
  int send_hwm = 1000, recv_hwm = 1000;
  // Pending output kept after close.
  int linger_ms = 0;
  // The longest send() waits for queue space between two chunks of one message.
  int send_timeout_ms = 5000;

  // ConfigError naming the bad field and value. Also requires max_reassembly_bytes >=
  // max_message_bytes (a message that can never be reassembled is a configuration mistake).
  void validate() const;
  // A peer's partial transfer is dropped after this long without a chunk (4 x heartbeat timeout).
  std::chrono::milliseconds transferTimeout() const {
    return std::chrono::milliseconds(4LL * heartbeat_timeout_ms);
  }
  // The largest frame ZeroMQ reads (ZMQ_MAXMSGSIZE): max_message_bytes or a chunk, whichever is
  // larger, plus 64 KiB for a chunk's header. A frame between max_message_bytes and this is read
  // and refused (kTooLarge); a larger one makes libzmq drop the connection unread.
  uint64_t frameCeiling() const {
    return std::max<uint64_t>(max_message_bytes, chunk_bytes) + 64 * 1024;
  }
};

// One received message or one refusal. bytes() is always 8-byte aligned (FlatBuffers reads in
// place). A single frame is held as the zmq message libzmq delivered, without a copy, when its
// data is 8-aligned: true for every frame that gets its own malloc'd block, i.e. any frame that
// does not fit into what is left of libzmq's 8 KiB receive batch buffer (so every large one).
// Frames libzmq decodes inside that shared buffer (zero-copy receive) start at arbitrary offsets
// -- measured with libzmq 4.3.4 on x86_64: 33, 100, 1000 and 4000-byte frames at 5, 6, 3 and 4
// mod 8 -- so the common "over 33 bytes means aligned" rule does not hold; those frames (at most
// 8 KiB each) are copied into an aligned buffer (TransportStats::realigned_bytes). A reassembled
// message is its own buffer. Copies of a Received share the bytes (read-only).
class Received {
 public:
  std::string peer;                          // server: the client's routing id; client: ""
  std::optional<uint64_t> authenticated_id;  // server under CURVE: the allow-list id; else nullopt
  std::optional<InputError> error;           // set (and bytes() empty) when the message was refused

  std::span<const uint8_t> bytes() const { return bytes_; }
  bool ok() const { return !error.has_value(); }

  static Received message(std::string peer, std::optional<uint64_t> id,
                          std::shared_ptr<const void> owner, std::span<const uint8_t> bytes);
  static Received failure(std::string peer, std::optional<uint64_t> id, InputError error);

 private:
  std::shared_ptr<const void> owner_;  // a zmq::message_t or an owned buffer
  std::span<const uint8_t> bytes_;
};

struct TransportStats {
  // Delivered messages (a reassembled one counts once) and their bytes.
  uint64_t messages_in = 0, bytes_in = 0;
  // Messages handed to ZeroMQ (a chunked one counts once) and their bytes.
  uint64_t messages_out = 0, bytes_out = 0;
  uint64_t chunks_in = 0, chunks_out = 0;
  // Frames dropped unread by the rate limiter.
  uint64_t refused_rate = 0;
  // Single frames or transfers over max_message_bytes.
  uint64_t refused_size = 0;
  // Transfers dropped for a chunk violation or a timeout, and multi-frame messages.
  uint64_t refused_chunk = 0;
  uint64_t refused_busy =
      0;  // transfers refused because the reassembly budget was full (kBusy: send again)
  // Later chunks of a refused transfer, dropped silently.
  uint64_t ignored_chunks = 0;
  // send() calls that returned false.
  uint64_t send_failed = 0;
  // Bytes copied because libzmq's data was not 8-aligned (frames of at most 8 KiB).
  uint64_t realigned_bytes = 0;
  // Messages dropped unread from a connection whose routing id its peer named (server).
  uint64_t refused_routing_id = 0;
  // Messages from a connection the owner had closed (cutConnections), queued before it closed:
  // dropped unread.
  uint64_t dropped_after_cut = 0;
};

// A server socket's connections, counted from ZeroMQ's events since the socket was bound. libzmq
// says what ended a connection only while its handshake runs; of an established one it says only
// that it closed: the peer left, its heartbeats stopped, or it sent a frame over the socket's
// largest (max_message_bytes, or a chunk, plus 64 KiB), which libzmq drops the connection for
// without reading it (smaller frames over max_message_bytes are read and refused, kTooLarge).
struct ConnectionCounts {
  uint64_t accepted = 0;           // TCP connections accepted
  uint64_t handshakes = 0;         // handshakes that succeeded
  uint64_t refused_mechanism = 0;  // plain TCP (ZMTP's NULL mechanism) on a CURVE port, or the
                                   // reverse
  uint64_t refused_protocol = 0;   // another ZMTP or CURVE protocol error (not a ZMTP peer, a
                                   // wrong server key)
  uint64_t refused_auth = 0;       // refused by the ZAP handler (takeRefusedHandshakes says why)
  uint64_t failed_handshake = 0;   // dropped before a handshake finished (a timeout, a reset)
  uint64_t closed = 0;             // every closed connection, whatever ended it
  // Established connections that closed: `closed` less those whose handshake failed.
  uint64_t dropped() const {
    const uint64_t failed = refused_mechanism + refused_protocol + refused_auth + failed_handshake;
    return closed > failed ? closed - failed : 0;
  }
};

namespace detail {
class SocketCore;
}

// ROUTER, bound. Each connection has its own routing id: one ZeroMQ makes (a zero byte, then a
// counter from a random start) unless the peer names one; a connection naming an id in use takes
// it over (ROUTER_HANDOVER: the alternative, libzmq parking such a connection unread, lets one
// peer hold unbounded memory). Every message of a connection whose id is not of ZeroMQ's form (five
// bytes, a zero byte first) is dropped unread and reported as an Errc::kPeerRoutingId Received
// (at most once per second per peer; TransportStats::refused_routing_id counts them all): no
// client whose id could be copied takes part, so a listed client naming another's id finds none
// to take over. libzmq lets a peer name an id of ZeroMQ's form too: it must guess one in use (a
// counter from a random start), and the ZAP handler rations each key's handshakes (20, then 5 a
// second), which makes that guessing take far longer than a federation; under CURVE every message
// carries the authenticated id, so a taken-over connection is known. A restarted client is a new
// connection with a new id; who it is, the protocol says (Register, and under CURVE its key).
// Sending to an unknown or gone peer, or one whose queue is full, returns false at once
// (ROUTER_MANDATORY with non-blocking sends). Rate limiting per peer (token bucket; under CURVE per
// authenticated key, so a key opening many connections shares one rate) drops a frame before any
// decoding or reassembly, and reports it as an Errc::kRateLimited Received at most once per second
// per peer. One thread owns it (see the top of this file).
class ServerSocket {
 public:
  ServerSocket(Context& context, const std::string& bind_endpoint, SecurityConfig security,
               TransportLimits limits = {});
  ~ServerSocket();
  ServerSocket(const ServerSocket&) = delete;
  ServerSocket& operator=(const ServerSocket&) = delete;

  // The bound endpoint as ZeroMQ reports it (e.g. tcp://127.0.0.1:41234 after binding port *).
  std::string endpoint() const;
  // The next message or refusal, waiting at most `timeout`; nullopt when none came in time.
  std::optional<Received> receive(std::chrono::milliseconds timeout);
  // Queues `bytes` for `peer` (a routing id from Received::peer). Never waits before the first
  // frame; between chunks of a large message waits at most send_timeout_ms for queue space.
  // False if the peer is unknown or gone, its queue is full, or a chunked send was cut short.
  bool send(const std::string& peer, std::span<const uint8_t> bytes);
  const TransportStats& stats() const;
  const TransportLimits& limits() const;
  // CURVE handshakes refused since the last call (a key not on the allow-list, not CURVE), oldest
  // first, at most 64; *dropped gets how many more. Nothing of them reaches receive(): the peer is
  // never connected. Empty for an insecure socket.
  std::vector<Context::Refusal> takeRefusedHandshakes(uint64_t* dropped = nullptr);
  // The connections' events as of the last receive() (they are read there).
  const ConnectionCounts& connections() const { return connections_; }
  // Admits the clients of `allow` from the next handshake on, without a restart (connections
  // already made stay: their messages still carry the id they were admitted with, which the
  // owner must judge). ConfigError for an insecure socket or an empty list.
  void setAllowList(std::shared_ptr<const AllowList> allow);
  // The list the ZAP handler admits by now (null for an insecure socket).
  std::shared_ptr<const AllowList> allowList() const;
  // Closes the TCP connections that client `id`'s messages came on (CURVE; a revoked client's, or
  // one whose key was replaced): each is shut down if its descriptor is still that connection
  // (libzmq gives a ROUTER no way to close one peer; it sees the connection end and drops it), and
  // whatever it queued before it closed is dropped unread (its routing id is never reused). How
  // many were; 0 insecure.
  size_t cutConnections(uint64_t id);
  // Whether it runs CURVE (not insecure).
  bool secure() const { return !zap_domain_.empty(); }

 private:
  void release();
  void readMonitor();
  Context& context_;
  std::string zap_domain_;
  std::unique_ptr<detail::SocketCore> core_;
  std::unique_ptr<zmq::socket_t> monitor_;  // PAIR: the socket's connection events
  ConnectionCounts connections_;
};

// DEALER, connects (ZeroMQ reconnects on its own, backing off exponentially from
// reconnect_ivl_ms to reconnect_ivl_max_ms; heartbeats detect a dead server). Messages sent
// before the connection is up are queued (up to send_hwm). It names no routing id: the server's
// ZeroMQ picks one (a ServerSocket refuses a connection whose peer named its own). One thread owns
// it (see the top of this file).
//
// Handshakes: ZeroMQ retries a refused connection forever and tells the socket's owner nothing, so
// a client whose key the server does not admit, or that runs without CURVE against a CURVE server,
// would wait in silence. The socket watches its own connection's events (a ZeroMQ socket
// monitor, read by receive()) and counts the handshakes that failed since the last one that
// succeeded, with the kind of the last failure: handshakes() says what an owner should tell the
// user (client/upstream_link.h gives up after a few).
struct HandshakeReport {
  enum class Failure : uint8_t {
    kNone = 0,
    kAuth,         // the server's authentication refused (ZAP status: 400 the key is not on its
                   // allow-list; 300 too many handshakes at once, 500 its own error)
    kMechanism,    // one side runs CURVE, the other plain TCP (security.insecure)
    kProtocol,     // another ZMTP or CURVE protocol error (a non-Starling peer)
    kNoHandshake,  // connected, then dropped before any handshake finished (a wrong server
                   // key, or a proxy whose server is down)
  };
  uint64_t succeeded = 0;  // handshakes that succeeded, in all
  uint64_t failed = 0;     // failed since the last success (0 after one)
  Failure last = Failure::kNone;
  int status = 0;  // the last failure's ZAP status (kAuth), ZMTP protocol error or errno
  // What a user should check, for the last failure (empty when there is none).
  std::string advice() const;
};

class ClientSocket {
 public:
  ClientSocket(Context& context, const std::string& connect_endpoint, SecurityConfig security,
               TransportLimits limits = {});
  ~ClientSocket();
  ClientSocket(const ClientSocket&) = delete;
  ClientSocket& operator=(const ClientSocket&) = delete;

  std::optional<Received> receive(std::chrono::milliseconds timeout);
  // Queues `bytes` for the server; false if the queue is full or a chunked send was cut short.
  bool send(std::span<const uint8_t> bytes);
  const TransportStats& stats() const;
  const TransportLimits& limits() const;
  // The connection's handshakes as of the last receive() (events are read there).
  const HandshakeReport& handshakes() const { return handshakes_; }
  bool secure() const { return secure_; }

 private:
  void release();
  void readMonitor();
  Context& context_;
  std::unique_ptr<detail::SocketCore> core_;
  std::unique_ptr<zmq::socket_t> monitor_;  // PAIR: the socket's connection events
  HandshakeReport handshakes_;
  bool connected_ = false;  // a TCP connection is up and its handshake has not finished
  bool dropped_ = false;    // the last failure counted was that connection's DISCONNECTED
  bool secure_ = false;
};

}  // namespace starling::transport
