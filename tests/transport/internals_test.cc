// The rate limiter and the reassembler on a synthetic clock: token arithmetic, the peer maps stay
// bounded, and every path out of a transfer (done, refused, abandoned, expired) gives its
// reservation back.
#include <catch2/catch.hpp>

#include "transport/rate_limiter.h"
#include "transport/reassembly.h"
#include "transport_util.h"

using namespace starling;
using namespace starling::transport::detail;
using namespace std::chrono_literals;

TEST_CASE("token bucket: burst, refill, report throttling, and idle peers are forgotten",
          "[transport]") {
  RateLimiter rl(/*rate=*/10, /*burst=*/5);
  const auto t0 = Steady::now();
  for (int i = 0; i < 5; ++i) CHECK(rl.allow("a", t0));
  CHECK_FALSE(rl.allow("a", t0));
  CHECK(rl.allow("b", t0));  // another peer has its own bucket
  CHECK_FALSE(rl.allow("a", t0 + 50ms));
  CHECK(rl.allow("a", t0 + 100ms));  // one token per 100 ms
  CHECK_FALSE(rl.allow("a", t0 + 100ms));
  CHECK(rl.reportDue("a", t0));
  CHECK_FALSE(rl.reportDue("a", t0 + 999ms));
  CHECK(rl.reportDue("a", t0 + 1001ms));
  // Each kind of report has its own allowance: a rate limit's report does not silence a refused
  // routing id's.
  using Report = RateLimiter::Report;
  CHECK(rl.reportDue("a", t0 + 1001ms, Report::kRoutingId));
  CHECK_FALSE(rl.reportDue("a", t0 + 1500ms, Report::kRoutingId));
  CHECK_FALSE(rl.reportDue("a", t0 + 1500ms, Report::kRate));
  CHECK(rl.reportDue("a", t0 + 2002ms, Report::kRoutingId));

  for (int i = 0; i < 10000; ++i) rl.allow("peer-" + std::to_string(i), t0 + 2s);
  CHECK(rl.peers() == 10002);
  rl.expire(t0 + 2s + 1600ms);  // refill time 0.5 s + 1 s
  CHECK(rl.peers() == 0);
  CHECK(rl.allow("a", t0 + 3s));  // a forgotten peer starts with a full bucket again
}

TEST_CASE("reassembly releases its reservation on every path", "[transport]") {
  Reassembler re(/*max_message=*/1000, /*max_total=*/1500, /*timeout=*/1s);
  const auto t0 = Steady::now();
  const auto d = starling::transport::testing::pattern(400, 1);
  const auto chunk = [](uint64_t transfer, uint32_t index, uint32_t count, uint64_t total,
                        std::span<const uint8_t> data) {
    return protocol::ChunkMsg{transfer, index, count, total, data};
  };
  // The budget counts bytes that arrived, not bytes announced.
  auto r = re.add("a", chunk(1, 0, 3, 1000, d), t0);
  CHECK_FALSE(r.error);
  CHECK(re.reservedBytes() == 400);
  r = re.add("b", chunk(2, 0, 2, 600, d), t0);  // announces 600 more: 1600 > 1500 is fine
  CHECK_FALSE(r.error);
  CHECK(re.reservedBytes() == 800);
  r = re.add("a", chunk(1, 1, 3, 1000, d), t0);
  CHECK_FALSE(r.error);
  CHECK(re.reservedBytes() == 1200);
  r = re.add("c", chunk(1, 0, 2, 800, d), t0);  // 1200 + 400 > 1500: c's transfer is refused
  REQUIRE(r.error);
  CHECK(r.error->code() == Errc::kBusy);  // nothing wrong with it: send again later
  CHECK(re.reservedBytes() == 1200);

  r = re.add("a", chunk(1, 2, 3, 1000, std::span(d).first(200)), t0);
  REQUIRE(r.complete);
  CHECK(r.size == 1000);
  CHECK(std::equal(d.begin(), d.end(), r.complete.get() + 400));
  CHECK(re.reservedBytes() == 400);  // b's first chunk

  r = re.add("b", chunk(7, 0, 1, 300, std::span(d).first(300)), t0);  // abandons transfer 2
  REQUIRE(r.abandoned);
  REQUIRE(r.complete);  // a one-chunk transfer completes at once
  CHECK(re.reservedBytes() == 0);

  re.add("c", chunk(1, 0, 3, 1000, d), t0);
  CHECK(re.abort("c"));
  CHECK(re.reservedBytes() == 0);
  CHECK(re.add("c", chunk(1, 1, 3, 1000, d), t0).ignored);  // the rest of an aborted transfer

  re.add("d", chunk(1, 0, 3, 1000, d), t0);
  CHECK(re.expire(t0 + 500ms).empty());
  const auto expired = re.expire(t0 + 2s);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].first == "d");
  CHECK(re.reservedBytes() == 0);
  CHECK(re.peers() == 0);  // idle peers are forgotten too
}

TEST_CASE("the buffer pool reuses buffers, stays within its bound, and outlives nothing",
          "[transport]") {
  using starling::transport::detail::Buffer;
  using starling::transport::detail::BufferPool;
  auto pool = std::make_shared<BufferPool>(/*max_pooled=*/10000);
  Buffer a = pool->take(4000);
  REQUIRE(a.capacity == 4000);
  uint8_t* a_data = a.data.get();
  pool->give(std::move(a));
  CHECK(pool->pooledBytes() == 4000);
  // A request that fits (and is at least half the buffer) gets the same memory back.
  Buffer b = pool->take(3000);
  CHECK(b.data.get() == a_data);
  CHECK(pool->reused() == 1);
  CHECK(pool->pooledBytes() == 0);
  // Too small a request for it: a new buffer (a 4000-byte buffer would waste over half).
  pool->give(std::move(b));
  Buffer c = pool->take(1000);
  CHECK(c.data.get() != a_data);
  CHECK(c.capacity == 1000);
  // Shared: back to the pool when the last copy goes.
  std::shared_ptr<uint8_t[]> s1 = pool->share(std::move(c));
  auto s2 = s1;
  s1.reset();
  CHECK(pool->pooledBytes() == 4000);
  s2.reset();
  CHECK(pool->pooledBytes() == 5000);
  // The bound: giving more than it keeps drops the smallest buffers first.
  pool->give(pool->take(9000));
  CHECK(pool->pooledBytes() <= 10000);
  // A buffer whose pool is gone is freed, not returned (ASan checks there is no leak or misuse).
  std::shared_ptr<uint8_t[]> orphan = pool->share(pool->take(100));
  pool.reset();
  orphan.reset();
}
