// The per-peer rate limiter: a flood from one peer is dropped unread (and reported at most once a
// second), while another peer's messages all get through.
#include <catch2/catch.hpp>
#include <map>

#include "transport_util.h"

using namespace starling;
using namespace starling::transport;
using namespace starling::transport::testing;

TEST_CASE("the rate limiter drops one peer's flood and lets another peer through", "[transport]") {
  Context ctx;
  TransportLimits limits = testLimits();
  limits.max_messages_per_second = 50;
  limits.burst = 20;
  ServerSocket server(ctx, kAnyPort, insecure(), limits);
  ClientSocket flood_socket(ctx, server.endpoint(), insecure(), testLimits());
  ClientSocket calm_socket(ctx, server.endpoint(), insecure(), testLimits());
  // Each side's first message names its connection (a token of each burst).
  std::map<std::string, int> delivered, limited;
  const auto nameOf = [&](ClientSocket& c) {
    REQUIRE(c.send(pattern(64, 9999)));
    auto r = receiveMessage(server);
    REQUIRE(r);
    ++delivered[r->peer];
    return r->peer;
  };
  const std::string flood = nameOf(flood_socket), calm = nameOf(calm_socket);
  REQUIRE(flood != calm);

  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i < 500; ++i) REQUIRE(flood_socket.send(pattern(64, static_cast<uint32_t>(i))));
  const int kCalm = 15;  // under the burst
  for (int i = 1; i < kCalm; ++i)
    REQUIRE(calm_socket.send(pattern(64, 1000 + static_cast<uint32_t>(i))));

  // Drain until nothing arrives for 500 ms (bounded: at most 10 s).
  while (std::chrono::steady_clock::now() - t0 < 10s) {
    auto r = server.receive(500ms);
    if (!r) break;
    if (r->ok())
      ++delivered[r->peer];
    else if (r->error->code() == Errc::kRateLimited)
      ++limited[r->peer];
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("elapsed " << elapsed << " s, flood delivered " << delivered[flood] << ", refused "
                  << server.stats().refused_rate);
  CHECK(delivered[calm] == kCalm);
  CHECK(limited[calm] == 0);
  CHECK(delivered[flood] >= 20);
  CHECK(delivered[flood] <= 20 + 50 * elapsed + 5);
  CHECK(server.stats().refused_rate == static_cast<uint64_t>(500 - delivered[flood]));
  CHECK(limited[flood] >= 1);
  CHECK(limited[flood] <= 1 + static_cast<int>(elapsed));  // at most once a second

  // A chunked message counts one token per chunk: 30 chunks exceed a fresh burst of 20.
  ClientSocket chunky(ctx, server.endpoint(), insecure(), testLimits());
  REQUIRE(chunky.send(pattern(30 * 4096, 7)));
  auto r = receiveError(server, 3000ms);
  REQUIRE(r);
  CHECK(r->error->code() == Errc::kRateLimited);
  CHECK(r->peer != flood);
  CHECK(r->peer != calm);
}
