// Streaming aggregation allocates nothing per client (PartialAggregate), and the round's
// validating add allocates nothing proportional to the model: counted with a replaced global
// operator new, for every registered compressor.
#include <catch2/catch.hpp>

#include "aggregation/round_scheme.h"
#include "compression/registry.h"
#include "counting_new.h"
#include "test_util.h"

namespace alloc = starling::testing::alloc;

using namespace starling;
using namespace starling::aggregation;
using namespace starling::compression;

TEST_CASE("adding updates allocates nothing per client, for every compressor", "[aggregation]") {
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  std::vector<std::string> specs;
  for (const auto& e : compressors().entries()) specs.push_back(e.name);
  specs.push_back("powersgd:mode=local");
  for (const auto& spec : specs) {
    RoundSchemeOptions o;
    o.compressor = spec;
    o.run_seed = 5;
    o.metrics = {"loss"};
    const RoundScheme scheme(layout, o);
    auto round = scheme.begin(1, scheme.initialCarry());
    const PhaseBroadcast& b = round->broadcast();
    std::vector<Update> updates;
    for (uint64_t i = 0; i < 8; ++i) {
      ClientState st(layout->fingerprint());
      Update u;
      u.header = {layout->fingerprint(), 1, 0, i, 5};
      u.tensors = scheme.compressor().compressWithFeedback(
          *layout, testing::randomVector(layout->numel(), i, 0.1), st, b.context(i));
      u.metrics = {{"loss", 0.5}};
      updates.push_back(std::move(u));
    }
    std::vector<UpdateView> views;
    for (const auto& u : updates) views.push_back(view(u));

    PartialAggregate agg(scheme.aggregateLayout(b));
    long before = alloc::count.load();
    for (int rep = 0; rep < 100; ++rep)
      for (const auto& v : views) agg.addValidated(v, 5.0);
    const long partial_allocs =
        alloc::count.load() - before;  // read before Catch's own macros allocate

    before = alloc::count.load();
    const long bytes_before = alloc::bytes.load();
    for (const auto& v : views) round->current().add(v);
    const long round_allocs = alloc::count.load() - before,
               round_bytes = alloc::bytes.load() - bytes_before;

    INFO(spec);
    CHECK(partial_allocs == 0);
    CHECK(agg.count() == 800);
    CHECK(round->current().accepted() == 8);
    // The round remembers each client id (a hash-set node): a couple of small allocations per
    // update, nothing that grows with the model.
    CHECK(round_allocs <= 3 * 8);
    CHECK(static_cast<size_t>(round_bytes) < 8 * 256 + 4096);
  }
}
