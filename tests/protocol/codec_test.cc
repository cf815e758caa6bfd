#include "protocol/codec.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <set>

#include "compression/lowrank.h"
#include "compression/registry.h"
#include "fuzz/fuzz_layout.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;
using namespace starling::protocol;

namespace {

// Every byte range a payload view points at.
std::vector<std::span<const uint8_t>> spansOf(const PayloadView& p) {
  std::vector<std::span<const uint8_t>> out;
  auto add = [&](auto s) {
    if (!s.empty()) out.push_back({reinterpret_cast<const uint8_t*>(s.data()), s.size_bytes()});
  };
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, SparseView>) {
          add(v.indices);
          add(v.values);
        } else if constexpr (std::is_same_v<T, LowRankView>) {
          add(v.p);
          add(v.q);
        } else if constexpr (std::is_same_v<T, SignView>) {
          add(v.bits);
        } else if constexpr (std::is_same_v<T, QsgdView>) {
          add(v.packed);
        } else if constexpr (std::is_same_v<T, TernaryView>) {
          add(v.positions);
          add(v.signs);
        } else if constexpr (std::is_same_v<T, BlockQView>) {
          add(v.packed);
          add(v.exps);
        } else {
          add(v.values);
        }
      },
      p);
  return out;
}

bool inside(std::span<const uint8_t> s, std::span<const uint8_t> buf) {
  return s.data() >= buf.data() && s.data() + s.size() <= buf.data() + buf.size();
}

PartialMessage samplePartial() {
  PartialMessage m;
  m.header.layout_fingerprint = fuzz::layout().fingerprint();
  m.header.round = 3;
  m.header.phase = 1;
  m.header.shared_tag = 0x1122334455667788ull;
  m.header.count = 5;
  m.header.total_weight = 12.5;
  std::vector<float> q(24);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 0.125f * static_cast<float>(i) - 1.0f;
  m.tensors = {LowRank{8, 12, 2, {}, q}, Sparse{{2, 7}, {1.5f, -2.0f}}};
  m.metrics = {{"loss", 3.0, 12.5}, {"accuracy", 6.25, 10.0}};
  return m;
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
    CHECK(back.header.layout_fingerprint == u.header.layout_fingerprint);
    CHECK(back.header.round == u.header.round);
    CHECK(back.header.phase == u.header.phase);
    CHECK(back.header.client_id == u.header.client_id);
    CHECK(back.header.num_examples == u.header.num_examples);
    REQUIRE(back.tensors.size() == u.tensors.size());
    CHECK(testing::samePayloads(back.tensors, u.tensors));
    REQUIRE(back.metrics.size() == 1);
    CHECK(back.metrics[0].name == "loss");
    CHECK(back.metrics[0].value == 0.25);
    // Encoding is deterministic.
    CHECK(encodeUpdate(back) == bytes);
  }
}

TEST_CASE("the phase travels, and phase 0 costs no bytes", "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  const SharedFactors shared = fuzz::shared();
  Update u = fuzz::seedUpdates()[0];
  const auto phase0 = encodeUpdate(u);
  u.header.phase = 1;
  const auto phase1 = encodeUpdate(u);
  CHECK(decodeUpdate(phase1, layout, &shared).header.phase == 1u);
  CHECK(decodeUpdate(phase0, layout, &shared).header.phase == 0u);
  // A field at its default is not written (old readers and old messages stay compatible).
  CHECK(phase1.size() > phase0.size());
}

TEST_CASE("every compressor's output round-trips in every phase and reports its exact size",
          "[protocol]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const auto update = testing::randomVector(layout.numel(), 1);
  for (const auto& spec : testing::allCompressorSpecs()) {
    auto c = makeCompressor(spec);
    ClientState st(layout.fingerprint());
    SharedFactors shared = c->initialShared(layout, 1);
    for (uint32_t phase = 0; phase < c->phases(); ++phase) {
      INFO(spec << " phase " << phase);
      Update u;
      u.header.layout_fingerprint = layout.fingerprint();
      u.header.phase = phase;
      u.header.num_examples = 10;
      const RoundContext ctx{1, 0, phase, 1, &shared};
      u.tensors = c->compressWithFeedback(
          layout, phase == 0 ? std::span<const float>(update) : std::span<const float>(), st, ctx);
      const auto bytes = encodeUpdate(u);
      CHECK(encodedSize(u) == bytes.size());
      const Update back = decodeUpdate(bytes, layout, &shared);
      CHECK(back.header.phase == phase);
      CHECK(testing::samePayloads(back.tensors, u.tensors));
      size_t data = 0;
      for (const auto& p : u.tensors) data += payloadDataBytes(p);
      // Framing overhead is small and bounded: a few dozen bytes per tensor.
      CHECK(bytes.size() >= data);
      CHECK(bytes.size() <= data + 64 + 48 * layout.size());
      // The next phase's shared factors, from this (only) client's factors.
      std::vector<std::span<const float>> sums(layout.size());
      for (size_t t = 0; t < layout.size(); ++t)
        if (const auto* l = std::get_if<LowRank>(&u.tensors[t]);
            l && shared.any() && !shared.factors[t].empty())
          sums[t] = l->p.empty() ? std::span<const float>(l->q) : std::span<const float>(l->p);
      shared = c->nextShared(layout, ctx, shared, sums, 1.0);
    }
  }
}

TEST_CASE("the decoder yields views into the verified buffer and copies only a misaligned one",
          "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  Decoder d(layout);
  for (const Update& u : fuzz::seedUpdates()) {
    INFO(encodingName(u.tensors[0]));
    const auto bytes = encodeUpdate(u);
    REQUIRE(reinterpret_cast<uintptr_t>(bytes.data()) % 8 == 0);
    uint64_t realigned = d.realignedBytes();
    const UpdateView& v = d.decodeUpdate(bytes);
    CHECK(d.realignedBytes() == realigned);
    REQUIRE(v.tensors.size() == u.tensors.size());
    for (size_t t = 0; t < v.tensors.size(); ++t) {
      for (auto s : spansOf(v.tensors[t])) CHECK(inside(s, bytes));
      CHECK(testing::samePayload(toOwned(v.tensors[t]), u.tensors[t]));
    }
    REQUIRE(v.metrics.size() == 1);
    CHECK(inside(
        {reinterpret_cast<const uint8_t*>(v.metrics[0].name.data()), v.metrics[0].name.size()},
        bytes));

    // The same message one byte off: decoded from the decoder's own aligned copy.
    std::vector<uint8_t> shifted(bytes.size() + 1);
    std::copy(bytes.begin(), bytes.end(), shifted.begin() + 1);
    const auto off = std::span<const uint8_t>(shifted).subspan(1);
    const UpdateView& w = d.decodeUpdate(off);
    realigned += bytes.size();
    CHECK(d.realignedBytes() == realigned);
    for (size_t t = 0; t < w.tensors.size(); ++t) {
      for (auto s : spansOf(w.tensors[t])) CHECK_FALSE(inside(s, off));
      CHECK(testing::samePayload(toOwned(w.tensors[t]), u.tensors[t]));
    }
  }
}

TEST_CASE("a misaligned buffer decodes the same", "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  const auto bytes = encodeUpdate(fuzz::seedUpdates()[0]);
  std::vector<uint8_t> shifted(bytes.size() + 1);
  std::copy(bytes.begin(), bytes.end(), shifted.begin() + 1);
  const Update u = decodeUpdate(std::span(shifted).subspan(1), layout);
  CHECK(std::get<DenseF32>(u.tensors[0]).values ==
        std::get<DenseF32>(fuzz::seedUpdates()[0].tensors[0]).values);
}

TEST_CASE("a partial aggregate round-trips, and each decode entry refuses the other message",
          "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  const PartialMessage m = samplePartial();
  const auto bytes = encodePartial(m);
  Decoder d(layout);
  const PartialView& v = d.decodePartial(bytes);
  CHECK(v.header.layout_fingerprint == m.header.layout_fingerprint);
  CHECK(v.header.round == 3u);
  CHECK(v.header.phase == 1u);
  CHECK(v.header.shared_tag == 0x1122334455667788ull);
  CHECK(v.header.count == 5u);
  CHECK(v.header.total_weight == 12.5);
  REQUIRE(v.tensors.size() == 2);
  for (size_t t = 0; t < 2; ++t) {
    CHECK(testing::samePayload(toOwned(v.tensors[t]), m.tensors[t]));
    for (auto s : spansOf(v.tensors[t])) CHECK(inside(s, bytes));
  }
  REQUIRE(v.metrics.size() == 2);
  CHECK(v.metrics[0].name == "loss");
  CHECK(v.metrics[0].weighted_sum == 3.0);
  CHECK(v.metrics[0].weight == 12.5);
  CHECK(v.metrics[1].name == "accuracy");
  CHECK(v.metrics[1].weighted_sum == 6.25);
  CHECK(v.metrics[1].weight == 10.0);
  CHECK(encodePartial(v) == bytes);  // deterministic

  const auto update = encodeUpdate(fuzz::seedUpdates()[0]);
  CHECK(testing::errcOf([&] { d.decodePartial(update); }) == errcName(Errc::kUnexpectedMessage));
  CHECK(testing::errcOf([&] { d.decodeUpdate(bytes); }) == errcName(Errc::kUnexpectedMessage));
  CHECK(testing::errcOf([&] { decodeUpdate(bytes, layout); }) ==
        errcName(Errc::kUnexpectedMessage));
  // The decoder still works after refusing.
  CHECK(d.decodeUpdate(update).tensors.size() == 2);
  CHECK(d.decodePartial(bytes).header.count == 5u);
}

TEST_CASE("decode limits are checked", "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  DecodeLimits l;
  CHECK_NOTHROW(l.validate());
  l.max_bytes = 10;
  CHECK_THROWS_AS(Decoder(layout, l), ConfigError);
  l = {};
  l.max_metric_name = 0;
  CHECK_THROWS_AS(Decoder(layout, l), ConfigError);
  l = {};
  l.max_metrics = 100000;
  CHECK_THROWS_AS(Decoder(layout, l), ConfigError);
}

// Golden encodings: a silent wire-format change fails here. Each value is the size and the 64-bit
// FNV-1a of encodeUpdate(seed) for the eleven seeds of fuzz::seedUpdates() (one per encoding) and
// of encodePartial(samplePartial()). The bytes were checked by hand once (2026, flatc 2.0.8)
// against the schema with
//   flatc --json --strict-json --raw-binary --size-prefixed -o /tmp/x protocol/starling.fbs --
//   seed.bin
// and every field of the JSON compared equal to what fuzz_layout.h / samplePartial() put in:
// schema_version 1, body_type Update (PartialAggregate), layout_fingerprint 0x916a1118591efa2d,
// round, client id, examples (phase absent: 0 is the default and is not written), each tensor's
// payload type and every value, the metric(s). The hashes were then taken from those same files.
TEST_CASE("golden bytes of one message per encoding", "[protocol]") {
  struct Golden {
    size_t size;
    uint64_t hash;
  };
  const Golden want[] = {
      {648, 0x20d9a6368624c668ull},  // dense_f32
      {456, 0x940b38ef052197a0ull},  // dense_f16
      {456, 0xe1799f54711c2093ull},  // dense_bf16
      {304, 0x87592f1d6e9c4e84ull},  // sparse
      {304, 0xfbceae3db3c9bd8cull},  // randblock
      {448, 0xd103b70436f522cbull},  // lowrank, P and Q
      {352, 0x60809bd3969efd3bull},  // lowrank, P only
      {288, 0x45fd5a0a027aa303ull},  // sign
      {312, 0x53c2152daf0fc1c0ull},  // qsgd
      {288, 0x8fedebd89e8da70dull},  // ternary (checked by hand with flatc 2.0.8, 2026-11-22: bits
                                     // 0x02 | 0xc2 0x7c 0x04 are the signs + - + and the Rice-4
                                     // codes of gaps 1, 3, 84: 0 0001, 0 0011, 111110 0100)
      {320, 0x2de1d3e18058b83dull},  // blockq (checked by hand with flatc 2.0.8, 2026-12-01: bits
                                     // 2, block 64, exps -3 and 2, 24 bytes 0x1b; the bias dense)
  };
  const Golden want_partial = {440, 0x93c8df3ca46fa381ull};
  const auto seeds = fuzz::seedUpdates();
  REQUIRE(seeds.size() == std::size(want));
  for (size_t i = 0; i < seeds.size(); ++i) {
    const auto bytes = encodeUpdate(seeds[i]);
    INFO("seed " << i << " (" << encodingName(seeds[i].tensors[0]) << "): " << bytes.size()
                 << " bytes, fnv1a 0x" << std::hex << testing::fnv1a(bytes));
    CHECK(bytes.size() == want[i].size);
    CHECK(testing::fnv1a(bytes) == want[i].hash);
  }
  const auto partial = encodePartial(samplePartial());
  INFO("partial: " << partial.size() << " bytes, fnv1a 0x" << std::hex << testing::fnv1a(partial));
  CHECK(partial.size() == want_partial.size);
  CHECK(testing::fnv1a(partial) == want_partial.hash);
}

TEST_CASE("an update's wire size varies only where the compressor says so",
          "[protocol][compression]") {
  // The simulated clocks time a client with one update's bytes made before it trains unless
  // Compressor::updateSizeVaries(): for every other compressor that size must be exact, whatever
  // the values and the client (client 0's id is left out of its messages: its own size). Two
  // layouts: the small CNN, and many tensors of 3 values, where random-block's per-client offsets
  // are often 0 (left out of the message: its padding does not always absorb the 4 bytes).
  ParamLayout tiny;
  for (int t = 0; t < 30; ++t) {
    std::string name = std::to_string(t);  // (GCC 12 warns on "t" + to_string: a false -Wrestrict)
    tiny.add(name.insert(0, 1, 't'), {3});
  }
  tiny.add("big", {64, 8});
  for (const ParamLayout& layout : {testing::smallCnnLayout(), tiny}) {
    const std::vector<float> zeros(layout.numel(), 0.0f);
    // The largest magnitudes side by side at the start of every tensor: top-k's positions close
    // together, which Rice codes take fewer bits for.
    std::vector<float> clustered = testing::randomVector(layout.numel(), 9, 0.01);
    for (size_t t = 0; t < layout.size(); ++t)
      for (size_t i = 0; i < layout[t].numel / 2; ++i) clustered[layout[t].offset + i] *= 100.0f;
    for (const auto& spec : testing::allCompressorSpecs()) {
      INFO(spec << " on " << layout.size() << " tensors");
      const auto c = makeCompressor(spec);
      const SharedFactors shared = c->initialShared(layout, 17);
      const auto size = [&](std::span<const float> values, uint64_t client) {
        Update u;
        u.header = {layout.fingerprint(), 3, 0, client, 10, 1};
        u.tensors = c->compress(layout, values, RoundContext{17, 3, 0, client, &shared});
        return protocol::encodedSize(u);
      };
      std::set<size_t> sizes;  // over values and clients (never client 0)
      for (uint64_t client = 1; client <= 40; ++client)
        sizes.insert(size(
            testing::randomVector(layout.numel(), client, 0.01 * double(client % 5 + 1)), client));
      sizes.insert(size(clustered, 5));
      if (!c->updateSizeVaries()) {
        // FlatBuffers leaves a field at its default out: an all-zero update's zero scale takes
        // no bytes, so the clocks time a client with an update of ones.
        CHECK(sizes.size() == 1);
        CHECK(size(zeros, 5) <= *sizes.begin());
        CHECK(size(clustered, 0) == size(testing::randomVector(layout.numel(), 3), 0));
        continue;
      }
      // It does vary: STC's on the CNN's tensors, random-block's on the tiny ones.
      const bool cnn = layout.size() == 6;
      if (cnn == (c->name() == "stc")) CHECK(sizes.size() > 1);
      if (cnn && c->name() == "stc") {
        // Scattered positions take more bits than close ones; zeros are left out: a zero update
        // is the least.
        const size_t scattered = size(testing::randomVector(layout.numel(), 4, 0.01), 5);
        CHECK(scattered > size(clustered, 5));
        CHECK(size(clustered, 5) > size(zeros, 5));
      }
    }
  }
}
