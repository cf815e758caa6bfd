// Client state as components (core/client_state.h) with the components compression/ owns: the
// residual, PowerSGD's pending phase and factors, and a component compression/ knows nothing of.
#include <bit>
#include <catch2/catch.hpp>
#include <limits>
#include <map>

#include "compression/lowrank.h"
#include "compression/registry.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;

namespace {

// A client algorithm's own state (think SCAFFOLD's control variate), unknown to compression/.
constexpr const char* kForeign = "algo.control";
struct ControlVariate final : StateComponent {
  std::vector<float> c;
  uint64_t steps = 0;
  uint32_t version() const override { return 7; }
  void save(ByteWriter& w) const override {
    w.u64(steps);
    w.floats(c);
  }
  void load(ByteReader& r, uint32_t v) override {
    if (v != 7) r.fail("control variate version ", v);
    steps = r.u64();
    r.floats(c);
  }
  size_t memoryBytes() const override { return c.capacity() * 4; }
};

// name -> (version, bytes) of a serialized state, read with the documented format.
std::map<std::string, std::pair<uint32_t, std::vector<uint8_t>>> components(
    const std::vector<uint8_t>& blob) {
  ByteReader r(blob, "test");
  REQUIRE(r.u32() == 0x53434c53u);
  REQUIRE(r.u32() == 2u);
  r.u64();
  const uint32_t n = r.u32();
  std::map<std::string, std::pair<uint32_t, std::vector<uint8_t>>> out;
  for (uint32_t i = 0; i < n; ++i) {
    std::string name = r.str(64);
    const uint32_t v = r.u32();
    const auto bytes = r.view(r.u64());
    out[name] = {v, {bytes.begin(), bytes.end()}};
  }
  r.finish();
  return out;
}

struct TwoPhase {
  ParamLayout layout = testing::smallCnnLayout();
  std::unique_ptr<Compressor> c = makeCompressor("powersgd:rank=2");
  SharedFactors q = c->initialShared(layout, 11);
  std::vector<float> update = testing::randomVector(layout.numel(), 5);

  // P-hat for one client's phase-P payloads.
  SharedFactors phat(const std::vector<Payload>& phase_p) const {
    std::vector<std::span<const float>> sums(layout.size());
    for (size_t t = 0; t < layout.size(); ++t)
      if (const auto* l = std::get_if<LowRank>(&phase_p[t])) sums[t] = l->p;
    return c->nextShared(layout, RoundContext{11, 0, 0, 0, &q}, q, sums, 1.0);
  }
};

}  // namespace

TEST_CASE(
    "a state stopped between PowerSGD's phases resumes exactly, and foreign components pass "
    "through",
    "[compression]") {
  TwoPhase f;
  const ParamLayout& layout = f.layout;
  ClientState a(layout.fingerprint());
  // Round 0 complete, so the residual is not trivial; then phase P of round 1.
  {
    auto p = f.c->compressWithFeedback(layout, testing::randomVector(layout.numel(), 1), a,
                                       RoundContext{11, 0, 0, 3, &f.q});
    const SharedFactors ph = f.phat(p);
    f.c->compressWithFeedback(layout, {}, a, RoundContext{11, 0, 1, 3, &ph});
  }
  auto& cv = a.get<ControlVariate>(kForeign);
  cv.c = {1.5f, -2.0f, 3.25f};
  cv.steps = 42;
  const auto phase_p =
      f.c->compressWithFeedback(layout, f.update, a, RoundContext{11, 1, 0, 3, &f.q});
  const SharedFactors ph = f.phat(phase_p);
  REQUIRE(a.find<PowerSgdState>(kPowerSgdComponent)->pending_phase == 1);
  CHECK(a.names() == std::vector<std::string>{std::string(kForeign),
                                              std::string(kPowerSgdComponent),
                                              std::string(kResidualComponent)});

  std::vector<uint8_t> blob;
  a.saveTo(blob);
  const auto stored = components(blob);
  REQUIRE(stored.size() == 3);
  CHECK(stored.at(kForeign).first == 7u);
  CHECK(stored.at(std::string(kResidualComponent)).first == 2u);
  // The pending phase is the first byte of PowerSGD's component.
  CHECK(stored.at(std::string(kPowerSgdComponent)).second.at(0) == 1);

  // What the original does next: phase Q of round 1.
  ClientState original = a.copy();
  const auto want = f.c->compressWithFeedback(layout, {}, original, RoundContext{11, 1, 1, 3, &ph});
  const auto want_bytes = testing::stateBytes(original);

  SECTION("into a fresh state") {
    ClientState b;
    b.loadFrom(blob);
    CHECK(b.layoutFingerprint() == layout.fingerprint());
    CHECK(testing::stateBytes(b) == blob);
    const auto got = f.c->compressWithFeedback(layout, {}, b, RoundContext{11, 1, 1, 3, &ph});
    CHECK(testing::samePayloads(got, want));
    CHECK(testing::stateBytes(b) == want_bytes);
    // The component compression/ never asked for went through untouched, byte for byte.
    CHECK(components(testing::stateBytes(b)).at(kForeign) == stored.at(kForeign));
    // And the program that owns it reads it back.
    const auto* back = b.find<ControlVariate>(kForeign);
    REQUIRE(back != nullptr);
    CHECK(back->c == std::vector<float>{1.5f, -2.0f, 3.25f});
    CHECK(back->steps == 42u);
  }
  SECTION("into a state reused from another client") {
    // A simulator worker's state: another client's components of other sizes, another round.
    ClientState b(layout.fingerprint());
    auto other = makeCompressor("powersgd:rank=2,mode=local");
    other->compressWithFeedback(layout, testing::randomVector(layout.numel(), 9), b,
                                RoundContext{11, 0, 0, 8});
    b.get<ResidualState>(kResidualComponent).values.reserve(layout.numel() + 100);
    const ResidualState* residual_obj = b.find<ResidualState>(kResidualComponent);
    const float* residual_buf = residual_obj->values.data();
    REQUIRE(b.find<PowerSgdState>(kPowerSgdComponent)->pending_phase == 0);
    b.loadFrom(blob);
    // Parsed into the component objects it already held, reusing their buffers.
    CHECK(b.find<ResidualState>(kResidualComponent) == residual_obj);
    CHECK(b.find<ResidualState>(kResidualComponent)->values.data() == residual_buf);
    CHECK(b.find<PowerSgdState>(kPowerSgdComponent)->pending_phase == 1);
    CHECK(testing::stateBytes(b) == blob);
    const auto got = f.c->compressWithFeedback(layout, {}, b, RoundContext{11, 1, 1, 3, &ph});
    CHECK(testing::samePayloads(got, want));
    CHECK(testing::stateBytes(b) == want_bytes);
    CHECK(components(testing::stateBytes(b)).at(kForeign) == stored.at(kForeign));
  }
  SECTION("without the PowerSGD component phase Q is refused") {
    ClientState b;
    b.loadFrom(blob);
    b.erase(kPowerSgdComponent);
    const auto before = testing::stateBytes(b);
    CHECK_THROWS_WITH(f.c->compressWithFeedback(layout, {}, b, RoundContext{11, 1, 1, 3, &ph}),
                      Catch::Contains("phase Q without phase P"));
    CHECK(testing::stateBytes(b) == before);
  }
}

TEST_CASE("a one-phase state round-trips and continues identically", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  for (const char* spec :
       {"topk:density=0.05", "powersgd:rank=2,mode=local", "sign", "randblock"}) {
    INFO(spec);
    auto c = makeCompressor(spec);
    ClientState a(layout.fingerprint());
    c->compressWithFeedback(layout, testing::randomVector(layout.numel(), 1), a,
                            RoundContext{1, 0, 0, 1});
    ClientState b;
    b.loadFrom(testing::stateBytes(a));
    CHECK(b.layoutFingerprint() == a.layoutFingerprint());
    CHECK(b.names() == a.names());
    CHECK(testing::residualOf(b, layout.numel()) == testing::residualOf(a, layout.numel()));
    const auto u = testing::randomVector(layout.numel(), 2);
    auto pa = c->compressWithFeedback(layout, u, a, RoundContext{1, 1, 0, 1});
    auto pb = c->compressWithFeedback(layout, u, b, RoundContext{1, 1, 0, 1});
    CHECK(testing::samePayloads(pa, pb));
    CHECK(testing::stateBytes(a) == testing::stateBytes(b));
  }
}

TEST_CASE("saveTo reuses the caller's buffer", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  auto c = makeCompressor("topk");
  ClientState a(layout.fingerprint());
  c->compressWithFeedback(layout, testing::randomVector(layout.numel(), 1), a,
                          RoundContext{1, 0, 0, 1});
  std::vector<uint8_t> buf;
  buf.reserve(4 * layout.numel() + 4096);
  buf.assign(17, 0xee);  // old contents are replaced, not appended to
  const uint8_t* data = buf.data();
  const size_t cap = buf.capacity();
  a.saveTo(buf);
  CHECK(buf.data() == data);
  CHECK(buf.capacity() == cap);
  CHECK(buf == testing::stateBytes(a));
  REQUIRE(buf.size() > 4);
  CHECK(std::vector<uint8_t>(buf.begin(), buf.begin() + 4) ==
        std::vector<uint8_t>{0x53, 0x4c, 0x43, 0x53});
  // The residual component (version 2) is a u64 count, the floats and the u64 round it was
  // written in, little-endian.
  const auto res = components(buf).at(std::string(kResidualComponent)).second;
  const auto values = testing::residualOf(a, layout.numel());
  REQUIRE(res.size() == 8 + 4 * values.size() + 8);
  uint64_t written = 0;
  for (int i = 0; i < 8; ++i) written |= uint64_t{res[8 + 4 * values.size() + i]} << (8 * i);
  CHECK(written == a.find<ResidualState>(kResidualComponent)->round);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{res[i]} << (8 * i);
  CHECK(n == values.size());
  bool same = true;
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits = 0;
    for (int k = 0; k < 4; ++k) bits |= uint32_t{res[8 + 4 * i + k]} << (8 * k);
    same = same && bits == std::bit_cast<uint32_t>(values[i]);
  }
  CHECK(same);
}

// Error feedback in federated rounds (compressor.h, ErrorFeedback): the residual's round and the
// stale-residual policy ef_max_age.
TEST_CASE("a residual records its round and one older than ef_max_age is dropped, not added",
          "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const size_t n = layout.numel();
  const auto c = makeCompressor("topk:density=0.1,ef_max_age=3");
  const auto u1 = testing::randomVector(n, 21), u2 = testing::randomVector(n, 22);
  for (const uint64_t next : {4ull, 5ull, 9ull}) {
    INFO("the client comes back in round " << next);
    ClientState st(layout.fingerprint());
    c->compressWithFeedback(layout, u1, st, RoundContext{7, 1, 0, 3});
    const auto r1 = testing::residualOf(st, n);
    REQUIRE(st.find<ResidualState>(kResidualComponent)->round == 1);
    REQUIRE(testing::maxAbs(r1) > 0);
    const bool live = next - 1 <= 3;
    CHECK((c->liveResidual(st, next) != nullptr) == live);
    const auto sent = testing::densify(
        layout, c->compressWithFeedback(layout, u2, st, RoundContext{7, next, 0, 3}));
    const auto r2 = testing::residualOf(st, n);
    CHECK(st.find<ResidualState>(kResidualComponent)->round == next);
    // What was compressed: the update plus the old residual when live, the update alone when stale.
    std::vector<float> total(n), want(n);
    for (size_t i = 0; i < n; ++i) {
      total[i] = sent[i] + r2[i];
      want[i] = u2[i] + (live ? r1[i] : 0.0f);
    }
    CHECK(testing::maxAbsDiff(total, want) == 0.0);
  }
  // ef_max_age = 0 keeps a residual forever.
  const auto forever = makeCompressor("topk:density=0.1");
  ClientState st(layout.fingerprint());
  forever->compressWithFeedback(layout, u1, st, RoundContext{7, 1, 0, 3});
  CHECK(forever->liveResidual(st, 1000000) != nullptr);
  // Without error feedback there is no live residual at all.
  CHECK(makeCompressor("topk:ef=false")->liveResidual(st, 2) == nullptr);
}

TEST_CASE("the residual's round survives a save and a version-1 residual loads as of unknown age",
          "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const auto c = makeCompressor("randblock:density=0.1,ef_max_age=2");
  ClientState st(layout.fingerprint());
  c->compressWithFeedback(layout, testing::randomVector(layout.numel(), 3), st,
                          RoundContext{7, 12, 0, 3});
  ClientState back(layout.fingerprint());
  back.loadFrom(testing::stateBytes(st));
  REQUIRE(back.find<ResidualState>(kResidualComponent) != nullptr);
  CHECK(back.find<ResidualState>(kResidualComponent)->round == 12);
  CHECK(back.find<ResidualState>(kResidualComponent)->values ==
        st.find<ResidualState>(kResidualComponent)->values);
  // The version-1 layout (floats only), as states written before the round was recorded.
  ResidualState old;
  std::vector<uint8_t> bytes;
  ByteWriter w(bytes);
  w.floats(std::vector<float>{1, 2, 3});
  ByteReader r(bytes, "test");
  old.load(r, 1);
  CHECK(old.round == 0);
  CHECK(old.values == std::vector<float>{1, 2, 3});
  ByteReader bad(bytes, "test");
  CHECK_THROWS(old.load(bad, 3));
}

TEST_CASE("error feedback's options are checked and appear in the canonical spec",
          "[compression]") {
  CHECK(makeCompressor("randk:ef_decay=0.5,ef_preview=1,ef_max_age=7")->spec() ==
        "randk:density=0.01,positions=client,ef=true,ef_decay=0.5,ef_preview=1,ef_max_age=7");
  CHECK(makeCompressor("topk:ef=false")->spec() == "topk:density=0.01,scope=layer,ef=false");
  for (const char* bad :
       {"topk:ef_decay=0", "topk:ef_decay=1.5", "randk:ef_decay=-1", "acpsgd:ef_preview=2",
        "sign:ef_preview=-0.1", "qsgd:ef_max_age=-1", "randblock:ef_decay=nan"}) {
    INFO(bad);
    CHECK_THROWS_AS(makeCompressor(bad), ConfigError);
  }
  CHECK_THROWS_AS(makeCompressor("none:ef_decay=0.5"), ConfigError);  // dense has no error feedback
}

TEST_CASE("the diagnostics: what was sent against the fresh update on the same coordinates",
          "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const size_t n = layout.numel();
  const auto c = makeCompressor("randblock:density=0.25,ef_preview=0");
  ClientState st(layout.fingerprint());
  // The same update every round: a coordinate that waited A rounds is sent as A updates (plain EF).
  const auto u = testing::randomVector(n, 4);
  FeedbackStats s;
  std::vector<float> r_before(n, 0.0f);
  for (uint64_t round = 1; round <= 4; ++round) {
    INFO("round " << round);
    const auto sent = testing::densify(
        layout, c->compressWithFeedback(layout, u, st, RoundContext{7, round, 0, 3}, nullptr, &s));
    double s2 = 0, f2 = 0, u2 = 0;
    for (size_t i = 0; i < n; ++i) {
      u2 += double(u[i]) * u[i];
      s2 += double(sent[i]) * sent[i];
      if (sent[i] != 0.0f) f2 += double(u[i]) * u[i];
    }
    CHECK(s.local_norm == Approx(std::sqrt(u2)).epsilon(1e-9));
    CHECK(s.sent_norm == Approx(std::sqrt(s2)).epsilon(1e-9));
    CHECK(s.local_on_sent == Approx(std::sqrt(f2)).epsilon(1e-9));
    CHECK(s.residual_norm == Approx(testing::norm2(testing::residualOf(st, n))).epsilon(1e-9));
    CHECK(s.residual_age == (round == 1 ? 0u : 1u));
    if (round == 1)
      CHECK(s.gain() == Approx(1.0));  // nothing waited yet
    else
      CHECK(s.gain() > 1.0);  // waiting coordinates arrive at once
  }
  // With ef_preview = 1 the local displacement includes the residual: a client whose update is
  // zero, whose model is where its residual says, sends exactly its own displacement (gain 1).
  const auto ahead = makeCompressor("randblock:density=0.25,ef_preview=1");
  ClientState st2(layout.fingerprint());
  ahead->compressWithFeedback(layout, u, st2, RoundContext{7, 1, 0, 3});
  const std::vector<float> zero(n, 0.0f);
  ahead->compressWithFeedback(layout, zero, st2, RoundContext{7, 2, 0, 3}, nullptr, &s);
  CHECK(s.gain() == Approx(1.0));
  CHECK(s.local_norm > 0.0);
}

TEST_CASE(
    "a residual from the future is stale under a bounded age, and a corrupt residual is refused on "
    "load",
    "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const auto bounded = makeCompressor("topk:density=0.1,ef_max_age=3");
  const auto forever = makeCompressor("topk:density=0.1");
  ClientState st(layout.fingerprint());
  bounded->compressWithFeedback(layout, testing::randomVector(layout.numel(), 8), st,
                                RoundContext{7, 500, 0, 3});
  CHECK(bounded->liveResidual(st, 500) != nullptr);
  CHECK(bounded->liveResidual(st, 1) == nullptr);  // another run's state: its age is unknown
  CHECK(forever->liveResidual(st, 1) != nullptr);  // no bound: kept
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 2e30f}) {
    INFO(bad);
    std::vector<uint8_t> bytes;
    ByteWriter w(bytes);
    w.floats(std::vector<float>{1.0f, bad, 3.0f});
    w.u64(4);
    ResidualState r;
    ByteReader in(bytes, "test");
    CHECK_THROWS_WITH(r.load(in, 2), Catch::Contains("residual value 1"));
  }
}

TEST_CASE("error feedback's keys need ef=true, and the canonical spec keeps every digit",
          "[compression]") {
  CHECK_THROWS_WITH(makeCompressor("topk:ef=false,ef_decay=0.5"), Catch::Contains("need ef=true"));
  CHECK_THROWS_WITH(makeCompressor("randk:ef=false,ef_preview=1"), Catch::Contains("need ef=true"));
  CHECK_THROWS_AS(makeCompressor("topk:ef_decay=1e-300"), ConfigError);
  // randblock's own default (ef_preview=1) does not count as given: ef=false turns EF off cleanly.
  CHECK(makeCompressor("randblock:ef=false")->spec() ==
        "randblock:density=0.01,offset=shared,ef=false");
  const auto c = makeCompressor("topk:ef_decay=0.12345678901234");
  CHECK(c->spec().find("ef_decay=0.12345678901234,") != std::string::npos);
  CHECK(makeCompressor(c->spec())->spec() == c->spec());  // reads back as the same compressor
}
