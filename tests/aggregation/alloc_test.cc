// Streaming FedAvg allocates nothing per client: counted with a replaced global operator new.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <new>

#include "aggregation/partial.h"
#include "compression/registry.h"
#include "test_util.h"

namespace {
std::atomic<long> g_allocs{0};
}

void* operator new(size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

using namespace starling;
using namespace starling::aggregation;
using namespace starling::compression;

TEST_CASE("adding updates to a partial aggregate performs no heap allocation", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  for (const char* spec : {"none", "topk:density=0.05", "randblock:density=0.1", "sign", "qsgd"}) {
    auto c = makeCompressor(spec);
    std::vector<Update> updates;
    for (uint64_t i = 0; i < 8; ++i) {
      ClientState st = c->initialState(layout);
      Update u;
      u.layout_fingerprint = layout.fingerprint();
      u.num_examples = 5;
      u.tensors = c->compress(layout, testing::randomVector(layout.numel(), i), st, RoundContext{1, 0, i});
      u.metrics = {{"loss", 0.5}};
      updates.push_back(std::move(u));
    }
    PartialAggregate agg(layout);
    agg.add(updates[0], 5.0);  // the first update creates the metric entry
    const long before = g_allocs.load();
    for (int rep = 0; rep < 100; ++rep)
      for (const auto& u : updates) agg.add(u, 5.0);
    const long added = g_allocs.load() - before;  // read before Catch's own macros allocate
    INFO(spec);
    CHECK(added == 0);
    CHECK(agg.count() == 801);
  }
}
