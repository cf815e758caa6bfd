// The mirrored block-scaled downlinks' copies (server/client_copies.h): a client that applies what
// it is sent, as a deployed one does (protocol::applyModel), holds the server's copy bit for bit;
// the difference from its own copy closes on the model where the whole model in the same bits
// cannot; the bounds, the refusals and the checkpoint.
#include "server/client_copies.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>

#include "compression/compressor.h"
#include "compression/payload.h"
#include "core/bytes.h"
#include "core/error.h"
#include "protocol/control.h"
#include "server/model_store.h"

namespace {
using namespace starling;
namespace cz = starling::compression;

ParamLayout twoTensors() {
  ParamLayout l;
  l.add("w", {30, 70});  // 2,100 values: 33 blocks, the last one short
  l.add("b", {50});
  return l;
}

std::vector<float> gaussian(size_t n, uint64_t seed, double sd) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(0.0, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(g));
  return v;
}

double sqDist(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += std::pow(double(a[i]) - double(b[i]), 2);
  return s;
}

bool sameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A deployed client's side: its copy and the version it holds, updated as the runtime does.
struct Client {
  std::vector<float> model;
  uint64_t held = 0;
  void apply(const ParamLayout& layout, const server::EncodedModel& m, uint64_t version) {
    protocol::applyModel(layout, held, m.base_version, m.tensors, model);
    held = version;
  }
};
}  // namespace

TEST_CASE(
    "a mirrored downlink's client holds the server's copy bit for bit, and its copy closes on "
    "the model",
    "[server][downlink]") {
  const ParamLayout layout = twoTensors();
  const size_t n = layout.numel();
  for (const uint32_t bits : {3u, 2u}) {
    CAPTURE(bits);
    server::ClientCopies copies(layout, bits, 8);
    Client c;
    c.model.assign(n, 0.0f);
    // The server's model drifts a little each version, as training moves it.
    std::vector<float> x = gaussian(n, 1, 0.1);
    const auto step = [&](uint64_t seed) {
      const auto d = gaussian(n, seed, 0.002);
      for (size_t i = 0; i < n; ++i) x[i] += d[i];
    };
    // The first task is the whole model, in the blocks' levels.
    server::EncodedModel m = copies.encode(7, 0, x, 1);
    CHECK(m.base_version == 0);
    REQUIRE(m.tensors.size() == 2);
    for (const auto& p : m.tensors) CHECK(std::holds_alternative<cz::BlockQ>(p));
    c.apply(layout, m, 1);
    REQUIRE(sameBits(c.model, copies.copy(7)));
    CHECK(copies.versionOf(7) == 1);
    const double whole_error = sqDist(c.model, x);
    CHECK(whole_error > 0);
    // Then versions 3, 6, 9, ...: each task the difference from its copy, against the version it
    // holds; the copies stay equal, and the copy's error falls far below the whole model's.
    double error = whole_error;
    for (uint64_t v = 3; v <= 30; v += 3) {
      step(v);
      step(v + 1000);
      step(v + 2000);
      m = copies.encode(7, c.held, x, v);
      CHECK(m.base_version == c.held);
      c.apply(layout, m, v);
      REQUIRE(sameBits(c.model, copies.copy(7)));
      error = sqDist(c.model, x);
    }
    // The whole model in the same bits at the last version, for comparison.
    server::ClientCopies fresh(layout, bits, 1);
    Client w;
    w.model.assign(n, 0.0f);
    w.apply(layout, fresh.encode(1, 0, x, 30), 30);
    const double whole_now = sqDist(w.model, x);
    CAPTURE(whole_error, whole_now, error);
    CHECK(error < whole_now / (bits == 3 ? 50 : 10));
    // The server's model standing still, each task takes more of the remaining gap.
    double before = error;
    for (uint64_t v = 31; v <= 34; ++v) {
      m = copies.encode(7, c.held, x, v);
      c.apply(layout, m, v);
      REQUIRE(sameBits(c.model, copies.copy(7)));
      const double now = sqDist(c.model, x);
      CHECK(now < before);
      before = now;
    }
    // A client that holds the task's version already gets an empty delta: its copy unchanged
    // whether it applies it or not (a task sent again).
    const std::vector<float> held(c.model);
    m = copies.encode(7, 34, x, 34);
    CHECK(m.base_version == 34);
    for (const auto& p : m.tensors) CHECK(std::get<cz::Sparse>(p).indices.empty());
    c.apply(layout, m, 34);
    CHECK(sameBits(c.model, held));
    CHECK(sameBits(copies.copy(7), held));
    // A client that says it holds another version than its copy's (it restarted, a task was lost)
    // gets the whole model again, and its copy is that.
    m = copies.encode(7, 31, x, 35);
    CHECK(m.base_version == 0);
    Client restarted;
    restarted.model.assign(n, 1.0f);  // whatever it held, the whole model replaces it
    restarted.held = 31;
    restarted.apply(layout, m, 35);
    CHECK(sameBits(restarted.model, copies.copy(7)));
    CHECK(sameBits(restarted.model, w.model));  // the same levels as any whole model of x
  }
}

TEST_CASE("a task of a mirrored downlink sent again leaves the client's copy known, applied or not",
          "[server][downlink]") {
  const ParamLayout layout = twoTensors();
  const size_t n = layout.numel();
  auto x = gaussian(n, 11, 0.1);
  server::ClientCopies copies(layout, 2, 4);
  Client c;
  c.model.assign(n, 0.0f);
  c.apply(layout, copies.encode(3, 0, x, 1), 1);
  x[5] += 0.25f;
  // Version 2's task, a delta against 1; then the same task again for a client that says it holds
  // 1 (its registration crossed the first task): the same bytes, and the copy is the same whether
  // the client applies the first and skips the second (the runtime's "again"), or gets only the
  // second.
  const server::EncodedModel first = copies.encode(3, 1, x, 2);
  REQUIRE(first.base_version == 1);
  const server::EncodedModel again = copies.encode(3, 1, x, 2);
  REQUIRE(again.base_version == 1);
  REQUIRE(again.tensors.size() == first.tensors.size());
  for (size_t i = 0; i < first.tensors.size(); ++i) {
    const auto& a = std::get<cz::BlockQ>(first.tensors[i]);
    const auto& b = std::get<cz::BlockQ>(again.tensors[i]);
    CHECK(a.exps == b.exps);
    CHECK(a.packed == b.packed);
  }
  Client skipped = c, second = c;
  skipped.apply(layout, first, 2);  // and skips `again`
  second.apply(layout, again, 2);   // the first was lost
  CHECK(sameBits(skipped.model, copies.copy(3)));
  CHECK(sameBits(second.model, copies.copy(3)));
  CHECK(copies.versionOf(3) == 2);
  // Sent again to a client that says it holds the task's version: an empty delta, the copy kept.
  const server::EncodedModel held = copies.encode(3, 2, x, 2);
  CHECK(held.base_version == 2);
  CHECK(sameBits(skipped.model, copies.copy(3)));
  // Sent again claiming neither (a registration older still): the whole model, which the client
  // may apply or skip, so no copy is kept and its next task is whole too.
  const server::EncodedModel stale = copies.encode(3, 7, x, 2);
  CHECK(stale.base_version == 0);
  CHECK(copies.versionOf(3) == 0);
  CHECK(copies.copy(3).empty());
  // ... and stays unknown while version 2's task may still be sent again (the client reconnects
  // claiming 2, and skips the task it answered): whole, no copy.
  CHECK(copies.encode(3, 2, x, 2).base_version == 0);
  CHECK(copies.copy(3).empty());
  // The next version's task is whole, and its copy kept again: the client applies a new task.
  x[6] -= 0.5f;
  const server::EncodedModel next = copies.encode(3, 2, x, 3);
  CHECK(next.base_version == 0);
  CHECK(copies.versionOf(3) == 3);
  Client fresh;
  fresh.model.assign(n, 1.0f);
  fresh.held = 2;
  fresh.apply(layout, next, 3);
  CHECK(sameBits(fresh.model, copies.copy(3)));
  // A copy dropped while its client's task may be sent again: the same (capacity 1 here).
  server::ClientCopies one(layout, 2, 1);
  Client a;
  a.model.assign(n, 0.0f);
  a.apply(layout, one.encode(1, 0, x, 3), 3);
  one.encode(2, 0, x, 3);  // drops client 1's copy of version 3
  CHECK(one.versionOf(1) == 0);
  const server::EncodedModel resent = one.encode(1, 3, x, 3);  // which client 1 skips
  CHECK(resent.base_version == 0);
  CHECK(one.copy(1).empty());   // not the whole model: client 1 holds its first task's
  CHECK(!one.sent(1).empty());  // what a client applying it holds: the whole model
  x[7] += 0.125f;
  CHECK(one.encode(1, 3, x, 4).base_version == 0);
  CHECK(one.versionOf(1) == 4);
}

TEST_CASE(
    "a mirrored downlink keeps at most its capacity of copies, the least recently sent "
    "dropped",
    "[server][downlink]") {
  const ParamLayout layout = twoTensors();
  const auto x = gaussian(layout.numel(), 3, 0.1);
  server::ClientCopies copies(layout, 2, 2);
  copies.encode(1, 0, x, 1);
  copies.encode(2, 0, x, 1);
  copies.encode(1, 1, x, 2);  // client 1 sent again: client 2 is now the least recent
  copies.encode(3, 0, x, 2);
  CHECK(copies.size() == 2);
  CHECK(copies.versionOf(2) == 0);
  CHECK(copies.copy(2).empty());
  CHECK(copies.versionOf(1) == 2);
  CHECK(copies.versionOf(3) == 2);
  // Client 2 comes back holding version 1: its copy is gone, so the whole model.
  CHECK(copies.encode(2, 1, x, 3).base_version == 0);
  CHECK(copies.versionOf(1) == 0);  // and client 1 went (sent at 3, client 3 at 4)
  CHECK_THROWS_AS(server::ClientCopies(layout, 2, 0), InvalidArgument);
  CHECK_THROWS_AS(server::ClientCopies(layout, 9, 1), InvalidArgument);
  CHECK_THROWS_AS(copies.encode(2, 0, std::vector<float>(5), 4), InvalidArgument);
}

TEST_CASE(
    "stc-mirror sends each client the largest differences from its copy as +-mu, and the copies "
    "stay equal and close on the model",
    "[server][downlink]") {
  const ParamLayout layout = twoTensors();
  const size_t n = layout.numel();
  const double density = 0.1;
  auto made = server::ClientCopies::forDownlink(layout, server::Downlink::kStcMirror, density, 8);
  REQUIRE(made.has_value());
  server::ClientCopies& copies = *made;
  CHECK(copies.bits() == 3);
  CHECK(copies.density() == density);
  Client c;
  c.model.assign(n, 0.0f);
  std::vector<float> x = gaussian(n, 1, 0.1);
  // The first task is the whole model in q3's blocks.
  server::EncodedModel m = copies.encode(7, 0, x, 1);
  CHECK(m.base_version == 0);
  for (const auto& p : m.tensors) CHECK(std::holds_alternative<cz::BlockQ>(p));
  c.apply(layout, m, 1);
  REQUIRE(sameBits(c.model, copies.copy(7)));
  const std::vector<float> first(c.model);
  // The model drifts; each task is a ternary refresh of at most the density's count a tensor,
  // against the version held, far fewer bytes than the same difference in q2's blocks.
  for (uint64_t v = 2; v <= 12; ++v) {
    const auto d = gaussian(n, v, 0.003);
    for (size_t i = 0; i < n; ++i) x[i] += d[i];
    std::vector<float> diff(n);
    for (size_t i = 0; i < n; ++i) diff[i] = x[i] - c.model[i];
    m = copies.encode(7, c.held, x, v);
    CHECK(m.base_version == c.held);
    REQUIRE(m.tensors.size() == layout.size());
    size_t tern_bytes = 0, block_bytes = 0;
    for (size_t t = 0; t < layout.size(); ++t) {
      const TensorSpec& spec = layout.tensors()[t];
      const auto* tern = std::get_if<cz::Ternary>(&m.tensors[t]);
      REQUIRE(tern != nullptr);
      CHECK(tern->count > 0);
      CHECK(tern->count <= cz::countForDensity(density, spec.numel));
      CHECK(tern->mu > 0.0f);
      const auto blocks = server::quantizeBlocks(
          std::span<const float>(diff).subspan(spec.offset, spec.numel), 2, server::kDownlinkBlock);
      tern_bytes += cz::payloadDataBytes(m.tensors[t]);
      block_bytes += cz::payloadDataBytes(cz::Payload(blocks));
    }
    CHECK(tern_bytes * 2 < block_bytes);
    c.apply(layout, m, v);
    REQUIRE(sameBits(c.model, copies.copy(7)));
  }
  // The refreshes followed the drift: the copy is nearer the model than the first one left alone.
  const double error = sqDist(c.model, x), stale = sqDist(first, x);
  CAPTURE(error, stale);
  CHECK(error < stale / 2);
  // The model standing still, every task takes some of the remaining gap (each +-mu step lowers
  // the squared error by count mu^2).
  double before = error;
  for (uint64_t v = 13; v <= 20; ++v) {
    m = copies.encode(7, c.held, x, v);
    c.apply(layout, m, v);
    REQUIRE(sameBits(c.model, copies.copy(7)));
    const double now = sqDist(c.model, x);
    CHECK(now < before);
    before = now;
  }
  // A model that did not move since the copy was made whole (zeros are exact in any blocks): the
  // difference is all zeros, each tensor a ternary payload of no values, which a client decodes
  // from the wire and applies as nothing.
  const std::vector<float> zeros(n, 0.0f);
  Client z;
  z.model.assign(n, 1.0f);
  z.apply(layout, copies.encode(3, 0, zeros, 21), 21);
  REQUIRE(sameBits(z.model, zeros));
  m = copies.encode(3, 21, zeros, 22);
  protocol::TaskMsg h;
  h.round = 22;
  h.model_version = 22;
  h.base_version = m.base_version;
  h.compressor = "none";
  h.nonce = 5;
  std::vector<cz::PayloadView> views;
  for (const auto& p : m.tensors) {
    REQUIRE(std::holds_alternative<cz::Ternary>(p));
    CHECK(std::get<cz::Ternary>(p).count == 0);
    views.push_back(cz::view(p));
  }
  const protocol::TaskMsg back = protocol::decodeTask(protocol::encodeTask(h, views), layout);
  CHECK(back.base_version == 21);
  protocol::applyModel(layout, 21, back.base_version, back.model, z.model);
  CHECK(sameBits(z.model, copies.copy(3)));
  CHECK(sameBits(z.model, zeros));
  // Another density, or the blocks, is another store; stc-mirror without a density is refused.
  CHECK_THROWS_AS(server::ClientCopies::forDownlink(layout, server::Downlink::kStcMirror, 0.0, 8),
                  ConfigError);
  CHECK_THROWS_AS(
      server::ClientCopies::forDownlink(layout, server::Downlink::kStcMirror, std::nan(""), 8),
      ConfigError);
  CHECK_FALSE(server::ClientCopies::forDownlink(layout, server::Downlink::kQ2, density, 8));
  CHECK(server::ClientCopies::forDownlink(layout, server::Downlink::kQ2Mirror, density, 8)
            ->density() == 0.0);
  CHECK_THROWS_AS(server::ClientCopies(layout, 3, 8, 1.5), InvalidArgument);
}

TEST_CASE("a mirrored downlink's copies come back from a checkpoint, or are refused",
          "[server][downlink]") {
  const ParamLayout layout = twoTensors();
  auto x = gaussian(layout.numel(), 5, 0.1);
  server::ClientCopies copies(layout, 3, 4);
  copies.encode(1, 0, x, 1);
  copies.encode(4, 0, x, 1);
  x[0] += 0.5f;
  copies.encode(1, 1, x, 2);
  std::vector<uint8_t> bytes;
  ByteWriter w(bytes);
  copies.write(w);
  server::ClientCopies resumed(layout, 3, 4);
  ByteReader r(bytes, "test");
  resumed.read(r);
  r.finish();
  CHECK(resumed.size() == 2);
  CHECK(resumed.versionOf(1) == 2);
  CHECK(sameBits(resumed.copy(1), copies.copy(1)));
  CHECK(sameBits(resumed.copy(4), copies.copy(4)));
  // The next tasks are the uninterrupted store's, recency included.
  x[1] -= 0.25f;
  const auto a = copies.encode(1, 2, x, 3), b = resumed.encode(1, 2, x, 3);
  CHECK(a.base_version == 2);
  CHECK(b.base_version == 2);
  CHECK(sameBits(resumed.copy(1), copies.copy(1)));
  // Refused, the copies as they were (one of client 9's): another bit width, a smaller
  // capacity, another model's size, cut bytes.
  const auto refused = [&](server::ClientCopies& into, std::span<const uint8_t> in) {
    ByteReader rr(in, "test");
    CHECK_THROWS_AS(into.read(rr), IoError);
    CHECK(into.size() == 1);
    CHECK(into.versionOf(9) == 5);
  };
  server::ClientCopies q2(layout, 2, 4), small(layout, 3, 1), cut(layout, 3, 4);
  ParamLayout other;
  other.add("w", {10});
  server::ClientCopies wrong(other, 3, 4);
  for (auto* into : {&q2, &small, &cut}) into->encode(9, 0, gaussian(layout.numel(), 2, 0.1), 5);
  wrong.encode(9, 0, gaussian(10, 2, 0.1), 5);
  refused(q2, bytes);
  refused(small, bytes);
  refused(wrong, bytes);
  refused(cut, std::span<const uint8_t>(bytes).first(bytes.size() - 3));
  // stc-mirror's copies carry their density: they resume into the same, and neither into q3's
  // blocks (the same bits) nor another density, nor q3's into them.
  server::ClientCopies stc(layout, 3, 4, 0.05);
  stc.encode(2, 0, x, 1);
  x[3] += 0.5f;
  stc.encode(2, 1, x, 2);
  std::vector<uint8_t> stc_bytes;
  ByteWriter sw(stc_bytes);
  stc.write(sw);
  server::ClientCopies stc_back(layout, 3, 4, 0.05);
  ByteReader sr(stc_bytes, "test");
  stc_back.read(sr);
  sr.finish();
  CHECK(sameBits(stc_back.copy(2), stc.copy(2)));
  server::ClientCopies blocks3(layout, 3, 4), other_density(layout, 3, 4, 0.1),
      stc_for_q3(layout, 3, 4, 0.05);
  for (auto* into : {&blocks3, &other_density, &stc_for_q3})
    into->encode(9, 0, gaussian(layout.numel(), 2, 0.1), 5);
  refused(blocks3, stc_bytes);
  refused(other_density, stc_bytes);
  refused(stc_for_q3, bytes);
  // A density out of (0, 1] in the file: refused, naming it.
  for (const double bad : {0.0, 1.5, std::nan("")}) {
    std::vector<uint8_t> lying(stc_bytes);
    std::memcpy(lying.data() + 4, &bad, sizeof bad);  // after the u32 of bits and flag
    ByteReader lr(lying, "test");
    CHECK_THROWS_WITH(stc_back.read(lr), Catch::Matchers::Contains("not in (0, 1]"));
  }
  CHECK(sameBits(stc_back.copy(2), stc.copy(2)));  // as it was
}

TEST_CASE("the mirrored downlinks' modes, names and store", "[server][downlink]") {
  using server::Downlink;
  for (const auto mode : {Downlink::kQ3Mirror, Downlink::kQ2Mirror, Downlink::kStcMirror}) {
    CHECK(server::parseDownlink(server::downlinkName(mode)) == mode);
    CHECK(server::downlinkMirrored(mode));
    CHECK(server::downlinkPerHeld(mode));
    CHECK(server::wholeModelQuantised(mode));  // refused by an edge aggregator
    CHECK(server::peerDecodes(mode, true, true, true));
    CHECK_FALSE(server::peerDecodes(mode, true, true, false));  // the others get it dense
  }
  // stc-mirror's refreshes are ternary: a peer that decodes blocks alone gets it dense.
  CHECK_FALSE(server::peerDecodes(Downlink::kStcMirror, true, false, true));
  CHECK(server::peerDecodes(Downlink::kQ2Mirror, true, false, true));
  CHECK(server::downlinkBlockBits(Downlink::kStcMirror) == 3);
  CHECK(server::downlinkBlockBits(Downlink::kQ3Mirror) == 3);
  CHECK(server::downlinkBlockBits(Downlink::kQ2Mirror) == 2);
  CHECK_FALSE(server::downlinkMirrored(Downlink::kQ2));
  // The store is the model alone; what it encodes is a client without a copy's task.
  const auto layout = std::make_shared<const ParamLayout>(twoTensors());
  auto store = server::ModelStore::forDownlink(layout, Downlink::kQ2Mirror, 4, 0.01);
  CHECK_FALSE(store.lossy());
  const auto x = gaussian(layout->numel(), 9, 0.1);
  store.set(x, 1);
  const auto m = store.encodeFor(1, Downlink::kQ2Mirror);
  CHECK(m.base_version == 0);
  server::ClientCopies copies(*layout, 2, 1);
  const auto c = copies.encode(5, 0, x, 1);
  REQUIRE(m.tensors.size() == c.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const auto& a = std::get<cz::BlockQ>(m.tensors[i]);
    const auto& b = std::get<cz::BlockQ>(c.tensors[i]);
    CHECK(a.exps == b.exps);
    CHECK(a.packed == b.packed);
  }
}
