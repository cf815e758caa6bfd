#include <catch2/catch.hpp>

#include "compression/lowrank.h"
#include "compression/registry.h"
#include "fuzz/fuzz_layout.h"
#include "protocol/codec.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;
using namespace starling::protocol;

namespace {
bool samePayload(const Payload& a, const Payload& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        const T& y = std::get<T>(b);
        if constexpr (std::is_same_v<T, DenseF32> || std::is_same_v<T, DenseF16> || std::is_same_v<T, DenseBF16>)
          return x.values == y.values;
        else if constexpr (std::is_same_v<T, Sparse>)
          return x.indices == y.indices && x.values == y.values;
        else if constexpr (std::is_same_v<T, RandBlock>)
          return x.offset == y.offset && x.values == y.values;
        else if constexpr (std::is_same_v<T, LowRank>)
          return x.rows == y.rows && x.cols == y.cols && x.rank == y.rank && x.p == y.p && x.q == y.q;
        else if constexpr (std::is_same_v<T, Sign>)
          return x.scale == y.scale && x.bits == y.bits;
        else
          return x.norm == y.norm && x.s == y.s && x.packed == y.packed;
      },
      a);
}
}  // namespace

TEST_CASE("every encoding round-trips through the wire", "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  const SharedFactors shared = fuzz::shared();
  for (const Update& u : fuzz::seedUpdates()) {
    const auto bytes = encodeUpdate(u);
    CHECK(encodedSize(u) == bytes.size());
    const Update back = decodeUpdate(bytes, layout, &shared);
    INFO(encodingName(u.tensors[0]));
    CHECK(back.layout_fingerprint == u.layout_fingerprint);
    CHECK(back.round == u.round);
    CHECK(back.client_id == u.client_id);
    CHECK(back.num_examples == u.num_examples);
    REQUIRE(back.tensors.size() == u.tensors.size());
    for (size_t t = 0; t < u.tensors.size(); ++t) CHECK(samePayload(back.tensors[t], u.tensors[t]));
    REQUIRE(back.metrics.size() == 1);
    CHECK(back.metrics[0].name == "loss");
    CHECK(back.metrics[0].value == 0.25);
    // Encoding is deterministic.
    CHECK(encodeUpdate(back) == bytes);
  }
}

TEST_CASE("every compressor's output round-trips and reports its exact size", "[protocol]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const auto update = testing::randomVector(layout.numel(), 1);
  for (const auto& info : compressorCatalog()) {
    auto c = makeCompressor(info.name);
    ClientState st = c->initialState(layout);
    SharedFactors shared = initialSharedFactors(layout, LowRankOptions{}, 1);
    Update u;
    u.layout_fingerprint = layout.fingerprint();
    u.num_examples = 10;
    u.tensors = c->compress(layout, update, st, RoundContext{1, 0, 1, &shared});
    const auto bytes = encodeUpdate(u);
    const Update back = decodeUpdate(bytes, layout, &shared);
    size_t data = 0;
    for (size_t t = 0; t < layout.size(); ++t) {
      CHECK(samePayload(back.tensors[t], u.tensors[t]));
      data += payloadDataBytes(u.tensors[t]);
    }
    INFO(info.name << ": " << bytes.size() << " bytes on the wire, " << data << " bytes of data");
    // Framing overhead is small and bounded: a few dozen bytes per tensor.
    CHECK(bytes.size() >= data);
    CHECK(bytes.size() <= data + 64 + 48 * layout.size());
  }
}

TEST_CASE("a misaligned buffer decodes the same", "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  const auto bytes = encodeUpdate(fuzz::seedUpdates()[0]);
  std::vector<uint8_t> shifted(bytes.size() + 1);
  std::copy(bytes.begin(), bytes.end(), shifted.begin() + 1);
  const Update u = decodeUpdate(std::span(shifted).subspan(1), layout);
  CHECK(std::get<DenseF32>(u.tensors[0]).values == std::get<DenseF32>(fuzz::seedUpdates()[0].tensors[0]).values);
}
