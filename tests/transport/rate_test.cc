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
  ClientSocket flood(ctx, server.endpoint(), insecure(), testLimits(), "flood");
  ClientSocket calm(ctx, server.endpoint(), insecure(), testLimits(), "calm");

  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 500; ++i) REQUIRE(flood.send(pattern(64, static_cast<uint32_t>(i))));
  const int kCalm = 15;  // under the burst
  for (int i = 0; i < kCalm; ++i) REQUIRE(calm.send(pattern(64, 1000 + static_cast<uint32_t>(i))));

  std::map<std::string, int> delivered, limited;
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
  INFO("elapsed " << elapsed << " s, flood delivered " << delivered["flood"] << ", refused "
                  << server.stats().refused_rate);
  CHECK(delivered["calm"] == kCalm);
  CHECK(limited["calm"] == 0);
  CHECK(delivered["flood"] >= 20);
  CHECK(delivered["flood"] <= 20 + 50 * elapsed + 5);
  CHECK(server.stats().refused_rate == static_cast<uint64_t>(500 - delivered["flood"]));
  CHECK(limited["flood"] >= 1);
  CHECK(limited["flood"] <= 1 + static_cast<int>(elapsed));  // at most once a second

  // A chunked message counts one token per chunk: 30 chunks exceed a fresh burst of 20.
  ClientSocket chunky(ctx, server.endpoint(), insecure(), testLimits(), "chunky");
  REQUIRE(chunky.send(pattern(30 * 4096, 7)));
  auto r = receiveError(server, 3000ms);
  REQUIRE(r);
  CHECK(r->peer == "chunky");
}
