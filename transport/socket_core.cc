#include "transport/socket_core.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "core/error.h"
#include "protocol/control.h"

namespace starling::transport::detail {

namespace {

constexpr auto kHousekeepingEvery = std::chrono::milliseconds(100);
constexpr auto kLongestPoll = std::chrono::milliseconds(500);  // so housekeeping runs while idle

bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

bool isServerRoutingId(const std::string& id) { return id.size() == 5 && id[0] == '\0'; }

// The client id the ZAP handler attached to the connection (CURVE only).
std::optional<uint64_t> userId(zmq::message_t& msg) {
  const char* v = zmq_msg_gets(msg.handle(), "User-Id");
  if (!v || !*v) return std::nullopt;
  uint64_t id = 0;
  for (const char* c = v; *c; ++c) {
    if (*c < '0' || *c > '9' || id > (UINT64_MAX - 9) / 10) return std::nullopt;
    id = id * 10 + static_cast<uint64_t>(*c - '0');
  }
  return id;
}

uint64_t randomTransferStart() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

}  // namespace

SocketCore::SocketCore(zmq::context_t& ctx, bool router, const TransportLimits& lim)
    : sock(ctx, router ? zmq::socket_type::router : zmq::socket_type::dealer),
      limits(lim),
      router_(router),
      reasm_(lim.max_message_bytes, lim.max_reassembly_bytes, lim.transferTimeout()),
      rate_(lim.max_messages_per_second, lim.burst),
      next_transfer_(randomTransferStart()) {}

void SocketCore::applyCommonOptions(const SecurityConfig& security, bool server_side) {
  sock.set(zmq::sockopt::linger, limits.linger_ms);
  sock.set(zmq::sockopt::sndhwm, limits.send_hwm);
  sock.set(zmq::sockopt::rcvhwm, limits.recv_hwm);
  // Above both the largest single frame we accept and a chunk frame: libzmq drops a connection
  // that sends more; frames between max_message_bytes and this are refused by onFrame().
  sock.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(limits.frameCeiling()));
  sock.set(zmq::sockopt::heartbeat_ivl, limits.heartbeat_ivl_ms);
  sock.set(zmq::sockopt::heartbeat_timeout, limits.heartbeat_timeout_ms);
  sock.set(zmq::sockopt::heartbeat_ttl, std::min(limits.heartbeat_timeout_ms, 6553500));
  if (security.insecure) return;
  if (server_side) {
    sock.set(zmq::sockopt::curve_server, true);
  } else {
    sock.set(zmq::sockopt::curve_serverkey, security.server_public_key);
  }
  sock.set(zmq::sockopt::curve_publickey, security.own.public_key);
  sock.set(zmq::sockopt::curve_secretkey, security.own.secret_key);
}

// ---------------------------------------------------------------- receiving

void SocketCore::fail(const std::string& peer, std::optional<uint64_t> id, InputError e) {
  ready_.push_back(Received::failure(peer, id, std::move(e)));
}

void SocketCore::housekeeping(Steady::time_point now) {
  if (now - last_expire_ < kHousekeepingEvery) return;
  last_expire_ = now;
  for (auto& [peer, err] : reasm_.expire(now)) {
    ++stats.refused_chunk;
    fail(peer, std::nullopt, std::move(err));
  }
  if (router_) rate_.expire(now);
}

std::optional<Received> SocketCore::receive(std::chrono::milliseconds timeout) {
  const auto deadline = Steady::now() + timeout;
  for (;;) {
    const auto now = Steady::now();
    housekeeping(now);
    if (!ready_.empty()) {
      Received r = std::move(ready_.front());
      ready_.pop_front();
      return r;
    }
    try {
      if (readOne(now)) continue;
      if (now >= deadline) return std::nullopt;
      const auto wait =
          std::min(std::chrono::ceil<std::chrono::milliseconds>(deadline - now), kLongestPoll);
      zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, wait);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      STARLING_THROW(IoError, "receive failed: ", e.what());
    }
  }
}

bool SocketCore::readOne(Steady::time_point now) {
  zmq::message_t first;
  if (!sock.recv(first, zmq::recv_flags::dontwait)) return false;
  std::string peer;
  zmq::message_t payload;
  if (router_) {
    peer = first.to_string();
    if (!first.more()) return true;  // cannot happen on a ROUTER: nothing to deliver
    (void)sock.recv(payload, zmq::recv_flags::none);  // the rest of a message arrives at once
  } else {
    payload = std::move(first);
  }
  size_t frames = 1;
  for (bool more = payload.more(); more; ++frames) {
    zmq::message_t extra;
    (void)sock.recv(extra, zmq::recv_flags::none);
    more = extra.more();
  }
  // The bucket belongs to the authenticated key when there is one (one key opening many
  // connections shares one rate), to the connection's routing id otherwise.
  if (router_ && !dead_.empty() && dead_.count(peer)) {
    ++stats.dropped_after_cut;  // queued by a connection cut since: nobody to answer
    return true;
  }
  const auto uid = router_ ? userId(payload) : std::optional<uint64_t>{};
  if (uid) noteConnection(*uid, peer, payload);
  const std::string bucket = uid ? "key:" + std::to_string(*uid) : peer;
  if (router_ && !rate_.allow(bucket, now)) {
    ++stats.refused_rate;
    if (rate_.reportDue(bucket, now))
      fail(peer, uid,
           InputError(Errc::kRateLimited, "over " + std::to_string(limits.max_messages_per_second) +
                                              " messages/s (burst " + std::to_string(limits.burst) +
                                              "): dropped unread"));
    return true;
  }
  // ZeroMQ's own routing ids are five bytes, a zero byte first (then a counter from a random
  // start). Any other id was named by the peer, and a peer naming an id in use takes that
  // connection over (ROUTER_HANDOVER): refused, never read. (A peer naming an id of ZeroMQ's form
  // must guess one in use: socket.h.)
  if (router_ && !isServerRoutingId(peer)) {
    ++stats.refused_routing_id;
    if (rate_.reportDue(bucket, now, RateLimiter::Report::kRoutingId))
      fail(peer, uid,
           InputError(Errc::kPeerRoutingId,
                      "a connection whose routing id (" + std::to_string(peer.size()) +
                          " bytes) its peer named; Starling's clients name none, and a named id "
                          "could take over another client's connection: dropped unread"));
    return true;
  }
  if (frames != 1) {
    ++stats.refused_chunk;
    fail(peer, userId(payload),
         InputError(Errc::kMalformed,
                    "a message of " + std::to_string(frames) + " frames; Starling sends one"));
    return true;
  }
  onFrame(peer, std::move(payload), now);
  return true;
}

void SocketCore::noteConnection(uint64_t id, const std::string& routing, zmq::message_t& msg) {
  const int fd = zmq_msg_get(msg.handle(), ZMQ_SRCFD);
  if (fd < 0) return;
  std::vector<Connection>& known = connections_[id];
  for (const Connection& c : known)
    if (c.fd == fd && c.routing == routing) return;  // the usual case: no system call
  // A new connection, or one that took a closed one's descriptor number (Linux gives the lowest
  // free one): its address read now replaces what that number was.
  known.erase(
      std::remove_if(known.begin(), known.end(), [fd](const Connection& c) { return c.fd == fd; }),
      known.end());
  Connection c;
  c.fd = fd;
  c.routing = routing;
  c.peer_len = sizeof c.peer;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&c.peer), &c.peer_len) != 0) return;
  if (known.size() == kConnectionsPerKey) known.erase(known.begin());
  known.push_back(c);
  if (connections_.size() > kKeysTracked) {
    std::vector<Connection> mine = std::move(known);
    connections_.clear();
    connections_[id] = std::move(mine);
  }
}

size_t SocketCore::cutConnections(uint64_t id) {
  const auto it = connections_.find(id);
  if (it == connections_.end()) return 0;
  size_t cut = 0;
  for (const Connection& c : it->second) {
    sockaddr_storage now{};
    socklen_t len = sizeof now;
    if (getpeername(c.fd, reinterpret_cast<sockaddr*>(&now), &len) != 0) continue;  // gone
    if (len != c.peer_len || std::memcmp(&now, &c.peer, len) != 0) continue;  // reused: not it
    if (shutdown(c.fd, SHUT_RDWR) == 0) ++cut;
    // Its routing id is never given again: what it queued before the cut is dropped.
    if (dead_.insert(c.routing).second) {
      dead_order_.push_back(c.routing);
      if (dead_order_.size() > kDeadKept) {
        dead_.erase(dead_order_.front());
        dead_order_.pop_front();
      }
    }
  }
  connections_.erase(it);
  return cut;
}

void SocketCore::onFrame(const std::string& peer, zmq::message_t&& msg, Steady::time_point now) {
  const auto id = userId(msg);
  const std::span<const uint8_t> raw(msg.data<uint8_t>(), msg.size());
  if (protocol::peekKind(raw) == protocol::MessageKind::kChunk) {
    ++stats.chunks_in;
    if (aligned8(raw.data())) {
      onChunk(peer, id, raw, now);
    } else {  // decodeChunk reads in place and needs 8-byte alignment
      scratch_.resize((raw.size() + 7) / 8);
      std::memcpy(scratch_.data(), raw.data(), raw.size());
      stats.realigned_bytes += raw.size();
      onChunk(peer, id, {reinterpret_cast<const uint8_t*>(scratch_.data()), raw.size()}, now);
    }
    return;
  }
  if (msg.size() > limits.max_message_bytes) {
    ++stats.refused_size;
    fail(peer, id,
         InputError(Errc::kTooLarge, "a frame of " + std::to_string(msg.size()) +
                                         " bytes, the limit is " +
                                         std::to_string(limits.max_message_bytes)));
    return;
  }
  // Moving a small message moves its inline data, so look at the pointer once it is in place.
  auto holder = std::make_shared<zmq::message_t>(std::move(msg));
  const size_t n = holder->size();
  ++stats.messages_in;
  stats.bytes_in += n;
  if (aligned8(holder->data()) || n == 0) {
    const std::span<const uint8_t> bytes(holder->data<uint8_t>(), n);
    ready_.push_back(Received::message(peer, id, std::move(holder), bytes));
    return;
  }
  auto copy = std::make_shared_for_overwrite<uint64_t[]>((n + 7) / 8);
  std::memcpy(copy.get(), holder->data(), n);
  stats.realigned_bytes += n;
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(copy.get()), n);
  ready_.push_back(Received::message(peer, id, std::move(copy), bytes));
}

void SocketCore::onChunk(const std::string& peer, std::optional<uint64_t> id,
                         std::span<const uint8_t> bytes, Steady::time_point now) {
  protocol::ChunkMsg chunk;
  try {
    chunk = protocol::decodeChunk(bytes, limits.max_message_bytes);
  } catch (const InputError& e) {
    reasm_.abort(peer);
    ++(e.code() == Errc::kTooLarge ? stats.refused_size : stats.refused_chunk);
    fail(peer, id, e);
    return;
  }
  auto out = reasm_.add(peer, chunk, now);
  if (out.abandoned) {
    ++stats.refused_chunk;
    fail(peer, id, std::move(*out.abandoned));
  }
  if (out.error) {
    const Errc code = out.error->code();
    ++(code == Errc::kTooLarge ? stats.refused_size
       : code == Errc::kBusy   ? stats.refused_busy
                               : stats.refused_chunk);
    fail(peer, id, std::move(*out.error));
  }
  if (out.ignored) ++stats.ignored_chunks;
  if (out.complete) {
    ++stats.messages_in;
    stats.bytes_in += out.size;
    const std::span<const uint8_t> whole(out.complete.get(), out.size);
    ready_.push_back(Received::message(peer, id, std::move(out.complete), whole));
  }
}

// ---------------------------------------------------------------- sending

bool SocketCore::sendFrame(const std::string& peer, zmq::message_t&& frame,
                           std::optional<Steady::time_point> deadline) {
  for (;;) {
    try {
      if (router_) {
        // With ROUTER_MANDATORY the routing frame fails with EHOSTUNREACH for an unknown peer and
        // EAGAIN for a full queue; once it is accepted the payload frame goes to the same pipe.
        if (sock.send(zmq::buffer(peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
          return sock.send(frame, zmq::send_flags::dontwait).has_value();
      } else if (sock.send(frame, zmq::send_flags::dontwait)) {
        return true;
      }
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) return false;  // EHOSTUNREACH: unknown or gone peer
      continue;
    }
    const auto now = Steady::now();
    if (!deadline || now >= *deadline) return false;
    if (router_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // ROUTER POLLOUT is not per peer
    } else {
      zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLOUT, 0};
      try {
        zmq::poll(&item, 1,
                  std::min(std::chrono::ceil<std::chrono::milliseconds>(*deadline - now),
                           std::chrono::milliseconds(50)));
      } catch (const zmq::error_t&) {
      }
    }
  }
}

bool SocketCore::send(const std::string& peer, std::span<const uint8_t> bytes) {
  bool ok = true;
  if (bytes.size() <= limits.chunk_bytes) {
    ok = sendFrame(peer, zmq::message_t(bytes.data(), bytes.size()), std::nullopt);
  } else {
    const uint64_t chunk = limits.chunk_bytes;
    const uint64_t count = (bytes.size() + chunk - 1) / chunk;
    ok = count <= UINT32_MAX;
    const uint64_t transfer = next_transfer_++;
    for (uint64_t i = 0; ok && i < count; ++i) {
      const uint64_t at = i * chunk;
      const protocol::ChunkMsg m{transfer, static_cast<uint32_t>(i), static_cast<uint32_t>(count),
                                 bytes.size(),
                                 bytes.subspan(at, std::min<uint64_t>(chunk, bytes.size() - at))};
      // The encoded chunk becomes the frame without another copy: libzmq frees it when sent.
      auto enc = std::make_unique<std::vector<uint8_t>>(protocol::encodeChunk(m));
      zmq::message_t frame(
          enc->data(), enc->size(),
          [](void*, void* hint) { delete static_cast<std::vector<uint8_t>*>(hint); }, enc.get());
      enc.release();  // owned by the frame now
      const auto deadline = Steady::now() + std::chrono::milliseconds(limits.send_timeout_ms);
      ok = sendFrame(peer, std::move(frame), i == 0 ? std::nullopt : std::optional(deadline));
      if (ok) ++stats.chunks_out;
    }
  }
  if (!ok) {
    ++stats.send_failed;
    return false;
  }
  ++stats.messages_out;
  stats.bytes_out += bytes.size();
  return true;
}

}  // namespace starling::transport::detail
