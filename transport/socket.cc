#include "transport/socket.h"

#include <zmq.h>

#include <atomic>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "transport/context_impl.h"
#include "transport/socket_core.h"

namespace starling::transport {

Received Received::message(std::string peer, std::optional<uint64_t> id,
                           std::shared_ptr<const void> owner, std::span<const uint8_t> bytes) {
  Received r;
  r.peer = std::move(peer);
  r.authenticated_id = id;
  r.owner_ = std::move(owner);
  r.bytes_ = bytes;
  return r;
}

Received Received::failure(std::string peer, std::optional<uint64_t> id, InputError error) {
  Received r;
  r.peer = std::move(peer);
  r.authenticated_id = id;
  r.error = std::move(error);
  return r;
}

void SecurityConfig::validate(bool server_side) const {
  if (insecure) return;
  const char* side = server_side ? "server" : "client";
  if (!isZ85Key(own.public_key) || !isZ85Key(own.secret_key))
    STARLING_THROW(ConfigError, "CURVE ", side,
                   ": its own key pair is missing or not Z85 (40 characters each); ",
                   "load it from a NAME.key_secret file, or run insecure");
  if (publicKeyOf(own.secret_key) != own.public_key)
    STARLING_THROW(ConfigError, "CURVE ", side,
                   ": the public key does not belong to the secret key");
  if (server_side && (!allow || allow->size() == 0))
    STARLING_THROW(ConfigError, "CURVE server: no allow-list (the client keys it admits)");
  if (!server_side && !isZ85Key(server_public_key))
    STARLING_THROW(ConfigError,
                   "CURVE client: the server's public key is missing or not Z85 (40 characters)");
}

void TransportLimits::validate() const {
  const auto bad = [](auto&&... what) {
    STARLING_THROW(ConfigError, "transport limits: ", what...);
  };
  if (chunk_bytes < 64 || chunk_bytes > (size_t{1} << 30))
    bad("chunk_bytes = ", chunk_bytes, " (64 .. 2^30)");
  if (max_message_bytes == 0) bad("max_message_bytes must be > 0");
  if (max_message_bytes > (uint64_t{1} << 50))
    bad("max_message_bytes = ", max_message_bytes, " (at most 2^50)");
  if (max_reassembly_bytes < max_message_bytes)
    bad("max_reassembly_bytes = ", max_reassembly_bytes,
        " is below max_message_bytes = ", max_message_bytes,
        ": a message that large could never be reassembled");
  if (!std::isfinite(max_messages_per_second) || max_messages_per_second <= 0)
    bad("max_messages_per_second = ", max_messages_per_second, " (must be finite and > 0)");
  if (!std::isfinite(burst) || burst < 1) bad("burst = ", burst, " (must be finite and >= 1)");
  if (heartbeat_ivl_ms <= 0) bad("heartbeat_ivl_ms = ", heartbeat_ivl_ms, " (must be > 0)");
  if (heartbeat_timeout_ms < heartbeat_ivl_ms)
    bad("heartbeat_timeout_ms = ", heartbeat_timeout_ms,
        " is below heartbeat_ivl_ms = ", heartbeat_ivl_ms);
  if (heartbeat_timeout_ms > 3600 * 1000)
    bad("heartbeat_timeout_ms = ", heartbeat_timeout_ms, " (at most 1 h)");
  if (reconnect_ivl_ms <= 0) bad("reconnect_ivl_ms = ", reconnect_ivl_ms, " (must be > 0)");
  if (reconnect_ivl_max_ms < reconnect_ivl_ms)
    bad("reconnect_ivl_max_ms = ", reconnect_ivl_max_ms,
        " is below reconnect_ivl_ms = ", reconnect_ivl_ms);
  if (send_hwm < 0 || recv_hwm < 0)
    bad("send_hwm = ", send_hwm, ", recv_hwm = ", recv_hwm, " (0 = unbounded)");
  if (linger_ms < 0)
    bad("linger_ms = ", linger_ms, " (must be >= 0: -1 would make shutdown wait forever)");
  if (send_timeout_ms < 0) bad("send_timeout_ms = ", send_timeout_ms, " (must be >= 0)");
}

namespace {

// Opens a ZeroMQ monitor of `sock`'s `events` on an inproc PAIR of this context (a name of its own
// per socket). libzmq's I/O thread sends each event with a blocking send (libzmq's GitHub issue
// 3575): an unread monitor with a bounded pipe would freeze the context. No high-water mark here
// makes the pipe unbounded; events are a few per connection, and the owner's receive() drains them.
std::unique_ptr<zmq::socket_t> openMonitor(zmq::context_t& ctx, zmq::socket_t& sock, int events) {
  static std::atomic<uint64_t> monitors{0};
  const std::string addr = "inproc://starling-monitor-" + std::to_string(monitors++);
  if (zmq_socket_monitor(sock.handle(), addr.c_str(), events) != 0) throw zmq::error_t();
  auto monitor = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::pair);
  monitor->set(zmq::sockopt::linger, 0);
  monitor->set(zmq::sockopt::rcvhwm, 0);
  monitor->connect(addr);
  return monitor;
}

// The next event on `monitor` without waiting: each is two frames, 2 bytes of event and 4 of
// value, then the endpoint. False when none is queued.
bool nextEvent(zmq::socket_t& monitor, uint16_t& event, uint32_t& value) {
  for (;;) {
    zmq::message_t head, address;
    if (!monitor.recv(head, zmq::recv_flags::dontwait)) return false;
    if (head.more()) (void)monitor.recv(address, zmq::recv_flags::dontwait);
    if (head.size() < 6) continue;
    std::memcpy(&event, head.data(), 2);
    std::memcpy(&value, static_cast<const char*>(head.data()) + 2, 4);
    return true;
  }
}

}  // namespace

// ---------------------------------------------------------------- ServerSocket

std::vector<Context::Refusal> ServerSocket::takeRefusedHandshakes(uint64_t* dropped) {
  if (dropped) *dropped = 0;
  if (zap_domain_.empty()) return {};
  return context_.impl().takeRefusals(zap_domain_, dropped);
}

ServerSocket::ServerSocket(Context& context, const std::string& bind_endpoint,
                           SecurityConfig security, TransportLimits limits)
    : context_(context) {
  limits.validate();
  security.validate(/*server_side=*/true);
  core_ = std::make_unique<detail::SocketCore>(context.impl().ctx, /*router=*/true, limits);
  context.impl().live_sockets.fetch_add(1);
  try {
    core_->applyCommonOptions(security, true);
    // Handover: a connection naming a routing id in use takes it over. Without it libzmq parks
    // such a connection unread, and every frame sent on it (up to the high-water mark, each up
    // to the size limit) stays in memory for good: one admitted key could fill the server. The
    // takeover this allows is closed elsewhere: Starling's peers name no routing id, so theirs
    // are ZeroMQ's own (a zero byte, then a counter from a random start), which an intruder must
    // guess, and the ZAP handler rations each key's handshakes (context.cc), which makes guessing
    // take far longer than any federation. A connection taken over anyway is known by its key:
    // every message carries the authenticated id, and the server refuses messages on a client's
    // routing id from another key.
    core_->sock.set(zmq::sockopt::router_handover, true);
    core_->sock.set(zmq::sockopt::router_mandatory, true);
    if (!security.insecure) {
      zap_domain_ = context.impl().registerDomain(security.allow);  // the handler is bound first
      core_->sock.set(zmq::sockopt::zap_domain, zap_domain_);
    }
    monitor_ =
        openMonitor(context.impl().ctx, core_->sock,
                    ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                        ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                        ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    core_->sock.bind(bind_endpoint);
  } catch (const zmq::error_t& e) {
    release();  // the destructor will not run: give back what was taken
    STARLING_THROW(IoError, "cannot bind ", bind_endpoint, ": ", e.what());
  } catch (...) {
    release();
    throw;
  }
}

ServerSocket::~ServerSocket() { release(); }

void ServerSocket::release() {
  if (!core_) return;
  if (monitor_) {
    zmq_socket_monitor(core_->sock.handle(), nullptr, 0);  // stops the events
    monitor_.reset();
  }
  core_.reset();  // closes the socket (linger applies)
  if (!zap_domain_.empty()) context_.impl().unregisterDomain(zap_domain_);
  context_.impl().live_sockets.fetch_sub(1);
}

std::shared_ptr<const AllowList> ServerSocket::allowList() const {
  return zap_domain_.empty() ? nullptr : context_.impl().lookup(zap_domain_);
}

void ServerSocket::setAllowList(std::shared_ptr<const AllowList> allow) {
  if (zap_domain_.empty())
    STARLING_THROW(ConfigError, "an insecure server has no allow-list to change");
  if (!allow || allow->size() == 0)
    STARLING_THROW(ConfigError, "an empty allow-list would admit no client");
  context_.impl().replaceDomain(zap_domain_, std::move(allow));
}

std::string ServerSocket::endpoint() const { return core_->sock.get(zmq::sockopt::last_endpoint); }
std::optional<Received> ServerSocket::receive(std::chrono::milliseconds timeout) {
  readMonitor();
  return core_->receive(timeout);
}

void ServerSocket::readMonitor() {
  if (!monitor_) return;
  uint16_t event = 0;
  uint32_t value = 0;
  while (nextEvent(*monitor_, event, value)) {
    switch (event) {
      case ZMQ_EVENT_ACCEPTED:
        ++connections_.accepted;
        break;
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        ++connections_.handshakes;
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        ++connections_.refused_auth;
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        ++(value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ? connections_.refused_mechanism
                                                               : connections_.refused_protocol);
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        ++connections_.failed_handshake;
        break;
      case ZMQ_EVENT_DISCONNECTED:
        ++connections_.closed;
        break;
      default:
        break;
    }
  }
}
size_t ServerSocket::cutConnections(uint64_t id) { return core_->cutConnections(id); }

bool ServerSocket::send(const std::string& peer, std::span<const uint8_t> bytes) {
  return core_->send(peer, bytes);
}
const TransportStats& ServerSocket::stats() const { return core_->stats; }
const TransportLimits& ServerSocket::limits() const { return core_->limits; }

// ---------------------------------------------------------------- ClientSocket

ClientSocket::ClientSocket(Context& context, const std::string& connect_endpoint,
                           SecurityConfig security, TransportLimits limits)
    : context_(context) {
  limits.validate();
  security.validate(/*server_side=*/false);
  core_ = std::make_unique<detail::SocketCore>(context.impl().ctx, /*router=*/false, limits);
  context.impl().live_sockets.fetch_add(1);
  try {
    core_->applyCommonOptions(security, false);
    core_->sock.set(zmq::sockopt::reconnect_ivl, limits.reconnect_ivl_ms);
    core_->sock.set(zmq::sockopt::reconnect_ivl_max, limits.reconnect_ivl_max_ms);
    // The connection's events.
    monitor_ =
        openMonitor(context.impl().ctx, core_->sock,
                    ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                        ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                        ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    secure_ = !security.insecure;
    core_->sock.connect(connect_endpoint);
  } catch (const zmq::error_t& e) {
    release();
    STARLING_THROW(IoError, "cannot connect to ", connect_endpoint, ": ", e.what());
  } catch (...) {
    release();
    throw;
  }
}

ClientSocket::~ClientSocket() { release(); }

void ClientSocket::release() {
  if (!core_) return;
  if (monitor_) {
    zmq_socket_monitor(core_->sock.handle(), nullptr, 0);  // stops the events
    monitor_.reset();
  }
  core_.reset();
  context_.impl().live_sockets.fetch_sub(1);
}

std::optional<Received> ClientSocket::receive(std::chrono::milliseconds timeout) {
  readMonitor();
  return core_->receive(timeout);
}

void ClientSocket::readMonitor() {
  if (!monitor_) return;
  uint16_t event = 0;
  uint32_t value = 0;
  while (nextEvent(*monitor_, event, value)) {
    using F = HandshakeReport::Failure;
    // One failure per connection: a handshake failure that comes after the connection's
    // DISCONNECTED (the order libzmq reports them in varies: seen under qemu) names the failure
    // that DISCONNECTED counted as kNoHandshake, and is not counted again.
    const auto failed = [&](F kind) {
      if (!(dropped_ && kind != F::kNoHandshake)) ++handshakes_.failed;
      dropped_ = kind == F::kNoHandshake;
      handshakes_.last = kind;
      handshakes_.status = static_cast<int>(value);
      connected_ = false;
    };
    switch (event) {
      case ZMQ_EVENT_CONNECTED:
        connected_ = true;
        dropped_ = false;
        break;
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        ++handshakes_.succeeded;
        handshakes_.failed = 0;
        handshakes_.last = F::kNone;
        connected_ = dropped_ = false;
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        failed(F::kAuth);
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        failed(value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ? F::kMechanism : F::kProtocol);
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        failed(F::kNoHandshake);
        break;
      case ZMQ_EVENT_DISCONNECTED:
        // Dropped with its handshake unfinished: the server could not read this side's HELLO (it
        // holds another key pair than the one this client was given), or was not a ZMTP peer.
        if (connected_) failed(F::kNoHandshake);
        break;
      default:
        break;
    }
  }
}

std::string HandshakeReport::advice() const {
  switch (last) {
    case Failure::kNone:
      return {};
    case Failure::kAuth:
      if (status != 400)
        return "the server's authentication answered " + std::to_string(status) +
               (status == 300 ? " (a temporary refusal: too many handshakes of this key at once)"
                              : " (an error of the server's)");
      return "the server refused this side's key (ZAP status 400): is its public key on the "
             "server's allow-list (security.clients), under this client's id?";
    case Failure::kMechanism:
      return "one side runs CURVE and the other plain TCP: the server and this side must agree "
             "on security.insecure (an insecure client cannot join a CURVE server, nor a CURVE "
             "client an insecure one)";
    case Failure::kProtocol:
      return "the connection's handshake failed (ZMTP protocol error " + std::to_string(status) +
             "): is the server's public key (security.server_key) the one the server runs with, "
             "and is the endpoint a Starling server?";
    case Failure::kNoHandshake:
      return "the connection was dropped before its handshake finished (error " +
             std::to_string(status) +
             "): is the server's public key (security.server_key) the one the server runs with, "
             "and is the endpoint a Starling server (or a proxy whose server is down)?";
  }
  return {};
}
bool ClientSocket::send(std::span<const uint8_t> bytes) { return core_->send({}, bytes); }
const TransportStats& ClientSocket::stats() const { return core_->stats; }
const TransportLimits& ClientSocket::limits() const { return core_->limits; }

}  // namespace starling::transport
