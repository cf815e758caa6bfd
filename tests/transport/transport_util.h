#pragma once
// Helpers for the transport tests: temp folders, key sets, byte patterns, and receive loops that
// are bounded in time. Every socket binds or connects on 127.0.0.1 only.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "protocol/control.h"
#include "transport/keys.h"
#include "transport/socket.h"

namespace starling::transport::testing {

using namespace std::chrono_literals;
inline constexpr const char* kAnyPort = "tcp://127.0.0.1:*";

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "starling-transport-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

inline std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

inline std::vector<uint8_t> toVec(std::span<const uint8_t> s) { return {s.begin(), s.end()}; }
inline std::span<const uint8_t> bytesOf(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Fast heartbeats so the tests notice dead peers quickly; small chunks.
inline TransportLimits testLimits() {
  TransportLimits l;
  l.chunk_bytes = 4096;
  l.max_message_bytes = 1 << 20;
  l.max_reassembly_bytes = 4 << 20;
  l.heartbeat_ivl_ms = 200;
  l.heartbeat_timeout_ms = 1000;
  l.reconnect_ivl_ms = 20;
  l.reconnect_ivl_max_ms = 200;
  return l;
}

inline SecurityConfig insecure() {
  SecurityConfig s;
  s.insecure = true;
  return s;
}

// A server pair and some client pairs; clients 0..n-1 are allowed under ids 100 + i.
struct Keys {
  CurveKeyPair server = generateKeyPair();
  std::vector<CurveKeyPair> clients;
  std::shared_ptr<AllowList> allow = std::make_shared<AllowList>();
  explicit Keys(int n) {
    for (int i = 0; i < n; ++i) {
      clients.push_back(generateKeyPair());
      allow->add(100 + i, clients.back().public_key, "client " + std::to_string(i));
    }
  }
  SecurityConfig serverSide() const { return SecurityConfig{false, server, {}, allow}; }
  SecurityConfig clientSide(const CurveKeyPair& own) const {
    return SecurityConfig{false, own, server.public_key, {}};
  }
};

// Receives until `pred` holds for a Received or `timeout` passes; returns that one.
template <class Sock>
std::optional<Received> receiveUntil(Sock& s, std::function<bool(const Received&)> pred,
                                     std::chrono::milliseconds timeout = 5000ms) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left <= 0ms) return std::nullopt;
    auto r = s.receive(left);
    if (!r) return std::nullopt;
    if (pred(*r)) return r;
  }
}
template <class Sock>
std::optional<Received> receiveMessage(Sock& s, std::chrono::milliseconds timeout = 5000ms) {
  return receiveUntil(
      s, [](const Received& r) { return r.ok(); }, timeout);
}
template <class Sock>
std::optional<Received> receiveError(Sock& s, std::chrono::milliseconds timeout = 5000ms) {
  return receiveUntil(
      s, [](const Received& r) { return !r.ok(); }, timeout);
}

// A raw DEALER on its own zmq context: sends whatever frames a hostile client would. It names no
// routing id (as Starling's clients) unless given one (then the server refuses it); `curve`, when
// given, is a client side's keys.
struct RawDealer {
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::dealer};
  explicit RawDealer(const std::string& endpoint, const std::string& routing_id = {},
                     const SecurityConfig* curve = nullptr) {
    sock.set(zmq::sockopt::linger, 0);
    if (!routing_id.empty()) sock.set(zmq::sockopt::routing_id, routing_id);
    if (curve) {
      sock.set(zmq::sockopt::curve_serverkey, curve->server_public_key);
      sock.set(zmq::sockopt::curve_publickey, curve->own.public_key);
      sock.set(zmq::sockopt::curve_secretkey, curve->own.secret_key);
    }
    sock.connect(endpoint);
  }
  void send(std::span<const uint8_t> bytes) {
    REQUIRE(sock.send(zmq::buffer(bytes.data(), bytes.size())));
  }
  void chunk(uint64_t transfer, uint32_t index, uint32_t count, uint64_t total,
             std::span<const uint8_t> data) {
    send(protocol::encodeChunk(protocol::ChunkMsg{transfer, index, count, total, data}));
  }
};

}  // namespace starling::transport::testing
