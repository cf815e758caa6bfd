// The attacker's tests: every hostile update (updates whose every value is finite but whose
// aggregate is not, lies about weight and round, replays, a poisoned partial aggregate) is refused
// with its own code, the aggregate is left exactly as it was, and the round still finishes with a
// finite result.
#include <catch2/catch.hpp>
#include <cfloat>
#include <cstring>
#include <limits>
#include <optional>

#include "aggregation/round_scheme.h"
#include "check_throws.h"
#include "compression/bitpack.h"
#include "compression/lowrank.h"
#include "compression/registry.h"
#include "core/finite.h"
#include "protocol/codec.h"
#include "test_util.h"

using namespace starling;
using namespace starling::aggregation;
using namespace starling::compression;

namespace {

struct Setup {
  std::shared_ptr<const ParamLayout> layout =
      std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  std::unique_ptr<RoundScheme> scheme;
  std::unique_ptr<Round> round;
  explicit Setup(const std::string& compressor, const std::string& rule = "fedavg",
                 const ValidationBounds& bounds = {}, bool scaffold = false) {
    RoundSchemeOptions o;
    o.compressor = compressor;
    o.rule = rule;
    o.run_seed = 3;
    o.bounds = bounds;
    o.scaffold = scaffold;
    scheme = std::make_unique<RoundScheme>(layout, o);
    round = scheme->begin(1, scheme->initialCarry());
  }
  // An honest update of client c for the current phase.
  Update honest(uint64_t c, uint64_t examples = 20) {
    ClientState st(layout->fingerprint());
    Update u;
    u.header = {layout->fingerprint(), round->number(), round->phase(), c, examples};
    u.tensors = scheme->compressor().compressWithFeedback(
        *layout, testing::randomVector(layout->numel(), c, 0.1), st, round->broadcast().context(c));
    return u;
  }
  std::vector<float> buffer() const {
    const auto b = round->current().partial().buffer();
    return {b.begin(), b.end()};
  }
};

// Adds `u` (through the wire) and returns the code it was rejected with; fails the test if
// accepted.
Errc rejectedWith(Setup& s, const Update& u) {
  const auto before = s.buffer();
  const auto bytes = protocol::encodeUpdate(u);
  protocol::Decoder dec(*s.layout);
  try {
    s.round->current().add(dec.decodeUpdate(bytes));
  } catch (const InputError& e) {
    CHECK(s.buffer() == before);  // nothing changed
    return e.code();
  }
  FAIL("the hostile update was accepted");
  return Errc::kMalformed;
}

// Index of the first tensor the scheme factors (fc1.weight in the small CNN).
size_t factored(const Setup& s) {
  const auto shared = s.round->broadcast().shared;
  for (size_t t = 0; t < s.layout->size(); ++t)
    if (shared && !shared->factors[t].empty()) return t;
  return *s.layout->find("fc1.weight");
}

void finishesFinite(Setup& s, size_t honest_clients) {
  for (uint64_t c = 100; c < 100 + honest_clients; ++c) s.round->current().add(view(s.honest(c)));
  const RoundResult r = s.round->finish();
  CHECK(allFinite(r.delta));
  CHECK(testing::norm2(r.delta) > 0);
  CHECK(r.count == s.round->current().accepted());
  CHECK(r.count >= honest_clients);
}

}  // namespace

TEST_CASE("attack: a low-rank payload whose product overflows", "[aggregation][attack]") {
  Setup s("powersgd:mode=local");
  Update u = s.honest(1);
  const size_t t = factored(s);
  auto& lr = std::get<LowRank>(u.tensors[t]);
  std::fill(lr.p.begin(), lr.p.end(), 1e20f);  // every value finite, P Q^T is not
  std::fill(lr.q.begin(), lr.q.end(), 1e20f);
  CHECK(rejectedWith(s, u) == Errc::kValueTooLarge);
  // One factor against the round's orthonormal shared factor, as ACP-SGD sends it.
  Setup a("acpsgd");
  Update v = a.honest(1);
  auto& one = std::get<LowRank>(v.tensors[factored(a)]);
  std::fill(one.p.begin(), one.p.end(), 3e38f);
  CHECK(rejectedWith(a, v) == Errc::kValueTooLarge);
  finishesFinite(s, 3);
  finishesFinite(a, 3);
}

TEST_CASE("attack: QSGD with a huge norm and every level zero", "[aggregation][attack]") {
  // weight * norm / s overflowed float and 0 * inf gave NaN; the decoded update is zero, so
  // clipping never saw it. The stated norm is bounded now.
  Setup s("qsgd");
  Update u = s.honest(1, 2);
  for (auto& p : u.tensors) {
    auto& q = std::get<Qsgd>(p);
    q.norm = 3e38f;
    std::fill(q.packed.begin(), q.packed.end(), 0);
  }
  CHECK(rejectedWith(s, u) == Errc::kNormTooLarge);
  finishesFinite(s, 2);
}

TEST_CASE("attack: QSGD at the largest norm and weight the bounds allow, every level zero",
          "[aggregation][attack]") {
  // Bounds of max_examples 1e9 and max_update_norm 1e30 once passed validation, and one QSGD
  // update of norm 9.9e29 with every level zero made the partial NaN (weight * norm overflowed,
  // then 0 * inf), so finish() threw: one client killed the round, clipping or not. Such bounds
  // are refused now (weight * norm must stay <= 1e30), and at the edge of what is allowed the
  // update is accepted and the round finishes finite.
  ValidationBounds bad;
  bad.max_examples = 1'000'000'000;
  bad.max_update_norm = 1e30;
  CHECK_THROWS_WITH(Setup("qsgd", "fedavg", bad),
                    Catch::Contains("max_examples * max_update_norm"));
  for (const char* rule : {"fedavg", "fedavg:clip=1"}) {
    INFO(rule);
    ValidationBounds edge;
    edge.max_examples = 1'000'000'000;
    edge.max_update_norm = 1e21;  // 1e9 * 1e21 = 1e30: the largest product allowed
    Setup s("qsgd", rule, edge);
    Update u = s.honest(1, edge.max_examples);
    for (auto& p : u.tensors) {
      auto& q = std::get<Qsgd>(p);
      q.norm = 0.99e21f;
      std::fill(q.packed.begin(), q.packed.end(), 0);  // every level 0, every sign +
    }
    s.round->current().add(view(u));
    CHECK(allFinite(s.buffer()));
    finishesFinite(s, 2);
  }
}

TEST_CASE("an honest update of values near 1e19 has a finite norm", "[aggregation][attack]") {
  // The norm was once summed in float lanes, so squares of values above about 1e18
  // overflowed and an honest update read as an infinite norm (refused as too large).
  ValidationBounds wide;
  wide.max_examples = 100;
  wide.max_abs_value = 1e20;
  wide.max_update_norm = 1e26;
  Setup d("none", "fedavg", wide);
  Update v = d.honest(1, 2);
  for (auto& x : std::get<DenseF32>(v.tensors[2]).values) x = 2e19f;  // 16,384 values: norm 2.56e21
  d.round->current().add(view(v));
  CHECK(d.round->current().accepted() == 1);
  CHECK(allFinite(d.buffer()));
  const PayloadStats st = validatePayload(view(v.tensors[2]), d.layout->tensors()[2]);
  CHECK(std::isfinite(st.sq_norm));
  CHECK(std::sqrt(st.sq_norm) == Approx(2e19 * std::sqrt(16384.0)).epsilon(1e-6));
}

TEST_CASE("attack: sign with a huge scale, dense values near FLT_MAX", "[aggregation][attack]") {
  Setup s("sign");
  Update u = s.honest(1);
  std::get<Sign>(u.tensors[0]).scale = 3e38f;
  CHECK(rejectedWith(s, u) == Errc::kValueTooLarge);
  finishesFinite(s, 2);
  Setup d("none");
  Update v = d.honest(1, 2);
  std::get<DenseF32>(v.tensors[2]).values[7] = 3e38f;
  CHECK(rejectedWith(d, v) == Errc::kValueTooLarge);
  // Many moderate values: each within the value bound, the norm beyond its bound.
  Update w = d.honest(2, 2);
  for (auto& x : std::get<DenseF32>(w.tensors[2]).values) x = 9000.0f;
  CHECK(rejectedWith(d, w) == Errc::kNormTooLarge);
  finishesFinite(d, 2);
}

TEST_CASE("attack: a client claiming 2^64 - 1 examples, or more than it registered",
          "[aggregation][attack]") {
  for (const char* rule : {"fedavg", "fedavg:clip=1", "median"}) {
    INFO(rule);
    Setup s("none", rule);
    Update u = s.honest(1, ~0ull);
    std::get<DenseF32>(u.tensors[0]).values[0] = 1e20f;
    CHECK(rejectedWith(s, u) == Errc::kBadWeight);
    Update honest_values = s.honest(2, ~0ull);
    CHECK(rejectedWith(s, honest_values) == Errc::kBadWeight);
    // What the server knows of a client caps it further.
    Update v = s.honest(3, 500);
    CHECK(testing::codeOf([&] { s.round->current().add(view(v), ClientLimits{100}); }) ==
          Errc::kBadWeight);
    CHECK_NOTHROW(s.round->current().add(view(s.honest(4, 100)), ClientLimits{100}));
    finishesFinite(s, 3);
  }
}

TEST_CASE("attack: a random block at another offset", "[aggregation][attack]") {
  Setup s("randblock:density=0.1");
  Update u = s.honest(1);
  auto& b = std::get<RandBlock>(u.tensors[2]);
  b.offset = (b.offset + 1) % static_cast<uint32_t>((*s.layout)[2].numel);
  CHECK(rejectedWith(s, u) == Errc::kRoundMismatch);
  Update v = s.honest(2);
  std::get<RandBlock>(v.tensors[2]).values.push_back(0.5f);  // longer than the round's block
  CHECK(rejectedWith(s, v) == Errc::kRoundMismatch);
  finishesFinite(s, 2);
}

TEST_CASE("attack: replays, duplicates, late updates and phase skipping", "[aggregation][attack]") {
  Setup s("powersgd");
  const PhaseBroadcast phase_p = s.round->broadcast();
  ClientState stranger_state(s.layout->fingerprint());  // trains phase P but never sends it
  s.scheme->compressor().compressWithFeedback(*s.layout,
                                              testing::randomVector(s.layout->numel(), 9, 0.1),
                                              stranger_state, phase_p.context(9));
  const Update u = s.honest(1);
  s.round->current().add(view(u));
  CHECK(rejectedWith(s, u) == Errc::kDuplicate);  // the same update again
  Update late = s.honest(2);
  late.header.round = 0;  // last round's
  CHECK(rejectedWith(s, late) == Errc::kLate);
  Update ahead = s.honest(3);
  ahead.header.phase = 1;
  CHECK(rejectedWith(s, ahead) == Errc::kWrongRound);
  s.round->current().add(view(s.honest(4)));
  const Update slow = s.honest(5);  // a phase-P update that will arrive after phase P ended
  s.round->nextPhase();
  // Phase Q: only clients that took part in phase P.
  Update stranger;
  stranger.header = {s.layout->fingerprint(), 1, 1, 9, 20};
  stranger.tensors = s.scheme->compressor().compressWithFeedback(*s.layout, {}, stranger_state,
                                                                 s.round->broadcast().context(9));
  CHECK(rejectedWith(s, stranger) == Errc::kWrongRound);
  CHECK(s.round->current().rejected(Errc::kWrongRound) == 1);
  // A phase-P update arriving after the round moved on to phase Q is late, not bogus.
  CHECK(rejectedWith(s, slow) == Errc::kLate);
  // The root's per-phase record stays readable after the phase ended.
  REQUIRE(s.round->phasesStarted() == 2);
  CHECK(s.round->phaseAt(0).accepted() == 2);
  CHECK(s.round->phaseAt(0).rejected(Errc::kDuplicate) == 1);
  CHECK(s.round->phaseAt(0).rejected(Errc::kLate) == 1);
  CHECK(s.round->phaseAt(1).rejected(Errc::kLate) == 1);
}

TEST_CASE("attack: an encoding the round's compressor never sends", "[aggregation][attack]") {
  Setup s("topk:density=0.05");
  Update u = s.honest(1);
  u.tensors[2] = DenseF32{std::vector<float>((*s.layout)[2].numel, 0.01f)};  // dense, 20x the bytes
  CHECK(rejectedWith(s, u) == Errc::kUnexpectedEncoding);
  Update v = s.honest(2);
  auto& sp = std::get<Sparse>(v.tensors[2]);
  sp.indices.pop_back();
  sp.values.pop_back();
  CHECK(rejectedWith(s, v) == Errc::kRoundMismatch);  // not the k the spec fixes
  finishesFinite(s, 2);
  // The block-scaled downlink's encoding (a valid payload for the tensor) is no compressor's:
  // refused in an update whatever the round's compressor, QSGD's (its closest kin) included.
  for (const char* spec : {"none", "qsgd:levels=4", "topk:density=0.05", "sign"}) {
    INFO(spec);
    Setup b(spec);
    Update w = b.honest(1);
    const size_t n = (*b.layout)[2].numel;
    compression::BlockQ q{2, 64, std::vector<int8_t>((n + 63) / 64, -3), {}};
    q.packed.assign(compression::packedBytes(n, 2), 0);
    compression::validatePayload(compression::view(compression::Payload(q)), (*b.layout)[2]);
    w.tensors[2] = q;
    CHECK(rejectedWith(b, w) == Errc::kUnexpectedEncoding);
    finishesFinite(b, 1);
  }
}

TEST_CASE("attack: metrics that lie", "[aggregation][attack]") {
  Setup s("none");
  Update u = s.honest(1);
  u.metrics = {{"train_loss", 1e300}};
  CHECK(rejectedWith(s, u) == Errc::kBadMetric);
  finishesFinite(s, 1);
}

TEST_CASE("attack: a partial aggregate that lies about its weight or values",
          "[aggregation][attack]") {
  Setup s("topk:density=0.05");
  auto edge = s.scheme->phaseAggregator(s.round->broadcast());
  for (uint64_t c = 0; c < 3; ++c) edge->add(view(s.honest(c)));
  const PartialMessage good = edge->partial().exportDense();
  protocol::Decoder dec(*s.layout);
  auto merge = [&](const PartialMessage& m, uint64_t source) -> Errc {
    const auto before = s.buffer();
    const auto bytes = protocol::encodePartial(m);
    try {
      s.round->current().merge(dec.decodePartial(bytes), source);
    } catch (const InputError& e) {
      CHECK(s.buffer() == before);
      return e.code();
    }
    FAIL("the hostile partial was accepted");
    return Errc::kMalformed;
  };
  // Found by the fuzzer: a weight so small it rounds to 0 in the float aggregate left a round
  // that could never finish. Every update weighs at least 1, so W >= count.
  for (double w : {1e39, 1e300, -1.0, 0.0, 1e-50, 2.0}) {
    PartialMessage m = good;
    m.header.total_weight = w;
    CHECK(merge(m, 7) == Errc::kBadWeight);
  }
  PartialMessage many = good;
  many.header.count = ~0ull;
  CHECK(merge(many, 7) == Errc::kBadWeight);
  PartialMessage big = good;
  std::get<DenseF32>(big.tensors[2]).values[0] = 3e38f;
  CHECK(merge(big, 7) == Errc::kValueTooLarge);
  PartialMessage stale = good;
  stale.header.round = 0;
  CHECK(merge(stale, 7) == Errc::kLate);
  // A partial is bounded by its total weight, not by its count times the weight cap: one update's
  // worth of weight cannot carry a sum of a thousand maximal updates.
  PartialMessage heavy = good;
  heavy.header.count = 1;
  heavy.header.total_weight = 1;
  for (size_t t = 0; t < s.layout->size(); ++t)
    heavy.tensors[t] = DenseF32{std::vector<float>((*s.layout)[t].numel, 9000.0f)};
  CHECK(merge(heavy, 8) == Errc::kNormTooLarge);  // each value within 1 x 1e4, the norm is not
  std::get<DenseF32>(heavy.tensors[2]).values.assign((*s.layout)[2].numel, 0.0f);
  std::get<DenseF32>(heavy.tensors[0]).values.assign((*s.layout)[0].numel, 0.0f);
  std::get<DenseF32>(heavy.tensors[4]).values.assign((*s.layout)[4].numel, 0.0f);
  std::get<DenseF32>(heavy.tensors[1]).values[0] = 2e4f;  // twice what weight 1 can carry
  CHECK(merge(heavy, 8) == Errc::kValueTooLarge);
  PartialMessage metric = good;
  metric.metrics = {{"train_loss", 1e30, 1.0}};
  CHECK(merge(metric, 7) == Errc::kBadMetric);
  // The honest partial merges once; a replay is refused.
  const auto bytes = protocol::encodePartial(good);
  s.round->current().merge(dec.decodePartial(bytes), 7);
  CHECK(merge(good, 7) == Errc::kDuplicate);
  const RoundResult r = s.round->finish();
  CHECK(allFinite(r.delta));
  CHECK(r.count == 3);
}

TEST_CASE("attack: Krum with colluding attackers cannot select a non-finite update",
          "[aggregation][attack]") {
  // Through the round: the attackers' overflowing low-rank updates never get in.
  Setup s("powersgd:mode=local", "krum:f=2");
  for (uint64_t c = 0; c < 7; ++c) {
    Update u = s.honest(c);
    if (c < 2) {
      auto& lr = std::get<LowRank>(u.tensors[factored(s)]);
      std::fill(lr.p.begin(), lr.p.end(), 1e20f);
      std::fill(lr.q.begin(), lr.q.end(), 1e20f);
      CHECK(rejectedWith(s, u) == Errc::kValueTooLarge);
    } else {
      s.round->current().add(view(u));
    }
  }
  // 5 honest updates are too few for f = 2: the round fails cleanly rather than picking garbage.
  CHECK_THROWS_WITH(s.round->finish(), Catch::Contains("needs at least 2f+3"));
  // Called directly on raw dense updates, the rule refuses non-finite input, and NaN distances
  // (inf - inf) never tie with honest scores.
  DenseUpdates u = {{0, 0},         {0.1f, 0},     {0, 0.1f},    {0.1f, 0.1f},
                    {0.05f, 0.05f}, {INFINITY, 0}, {INFINITY, 0}};
  std::vector<double> w(u.size(), 1.0);
  CHECK_THROWS_WITH(makeRule("krum:f=2")->combine(u, w), Catch::Contains("non-finite"));
  const auto scores = krumScores(u, 2);
  for (size_t i = 0; i < 5; ++i) CHECK(scores[i] < scores[5]);
  CHECK(krumSelect(u, 2, 1)[0] < 5);
}

TEST_CASE("attack: one client's large but bounded phase-Q factor cannot stall later rounds",
          "[aggregation][attack]") {
  // Reported in review: Q filled with 3000 passes every bound in phase Q; an unnormalized mean Q
  // then made every honest phase-P factor of every later round exceed the value bound.
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  RoundSchemeOptions o;
  o.compressor = "powersgd:rank=2";
  o.run_seed = 3;
  const RoundScheme scheme(layout, o);
  constexpr uint64_t kHonest = 20, kAttacker = kHonest;
  std::vector<ClientState> states;
  for (uint64_t c = 0; c <= kAttacker; ++c) states.emplace_back(layout->fingerprint());
  RoundCarry carry = scheme.initialCarry();
  for (uint64_t r = 1; r <= 3; ++r) {
    auto round = scheme.begin(r, carry);
    for (;;) {
      const PhaseBroadcast& b = round->broadcast();
      for (uint64_t c = 0; c <= kAttacker; ++c) {
        if (c == kAttacker && r > 1) continue;  // the attacker leaves after round 1
        Update u;
        u.header = {layout->fingerprint(), r, b.phase, c, 20};
        const auto upd = b.phase == 0 ? testing::randomVector(layout->numel(), 100 * r + c, 0.1)
                                      : std::vector<float>{};
        u.tensors = scheme.compressor().compressWithFeedback(*layout, upd, states[c], b.context(c));
        if (c == kAttacker && b.phase == 1)
          for (auto& p : u.tensors)
            if (auto* lr = std::get_if<LowRank>(&p)) std::fill(lr->q.begin(), lr->q.end(), 3000.0f);
        INFO("round " << r << " phase " << b.phase << " client " << c);
        if (c == kAttacker) {
          try {
            round->current().add(view(u));
          } catch (const InputError&) {
          }
        } else {
          CHECK_NOTHROW(round->current().add(view(u)));  // honest clients always get in
        }
      }
      if (round->lastPhase()) break;
      round->nextPhase();
    }
    const RoundResult res = round->finish();
    CHECK(allFinite(res.delta));
    carry = res.next;
  }
}

TEST_CASE("attack: a client cannot send or keep non-finite values from finite but huge inputs",
          "[compression][attack]") {
  const ParamLayout layout = testing::smallCnnLayout();
  for (const char* spec : {"qsgd", "powersgd:mode=local", "topk", "sign", "acpsgd"}) {
    auto c = makeCompressor(spec);
    const SharedFactors q = c->initialShared(layout, 1);
    const RoundContext ctx{1, 1, 0, 1, q.any() ? &q : nullptr};
    ClientState st(layout.fingerprint());
    INFO(spec);
    // 1e20 per value is within the compressor's input bound: every payload is finite.
    const std::vector<float> big(layout.numel(), 1e20f);
    const auto p = c->compressWithFeedback(layout, big, st, ctx);
    for (size_t t = 0; t < layout.size(); ++t)
      CHECK_NOTHROW(validatePayload(view(p[t]), layout[t], q.any() ? &q : nullptr, t));
    // Beyond the bound, or a residual that would pass it, is refused and the state is unchanged.
    const std::vector<float> huge(layout.numel(), 2e38f);
    std::vector<uint8_t> before;
    st.saveTo(before);
    CHECK_THROWS_WITH(c->compressWithFeedback(layout, huge, st, ctx), Catch::Contains("exceeds"));
    std::vector<uint8_t> after;
    st.saveTo(after);
    CHECK(before == after);
  }
}

TEST_CASE("attack: SCAFFOLD control vectors that are missing, lie, or do not belong",
          "[aggregation][attack][scaffold]") {
  {  // A round without SCAFFOLD takes none.
    Setup plain("none");
    Update u = plain.honest(1);
    u.control.assign(plain.layout->numel(), 0.1f);
    CHECK(rejectedWith(plain, u) == Errc::kUnexpectedEncoding);
  }
  Setup s("topk:density=0.1", "fedavg", {}, true);
  const size_t n = s.layout->numel();
  const auto with = [&](uint64_t c, float v) {
    Update u = s.honest(c);
    u.control.assign(n, v);
    return u;
  };
  CHECK(rejectedWith(s, s.honest(1)) == Errc::kMissingField);
  Update short_one = with(2, 0.1f);
  short_one.control.pop_back();
  CHECK(rejectedWith(s, short_one) == Errc::kSizeMismatch);
  Update nan = with(3, 0.1f);
  nan.control[5] = std::numeric_limits<float>::quiet_NaN();
  CHECK(rejectedWith(s, nan) == Errc::kNonFinite);
  Update big = with(4, 0.0f);
  big.control[0] = 2e4f;  // max_abs_value is 1e4
  CHECK(rejectedWith(s, big) == Errc::kValueTooLarge);
  Update heavy = with(5, 9e3f);  // every value within 1e4, the norm far past 1e5
  CHECK(rejectedWith(s, heavy) == Errc::kNormTooLarge);
  // In process (no decoder), the round's own checks refuse the same.
  const auto inprocCode = [&](const Update& u) -> std::optional<Errc> {
    try {
      s.round->current().add(view(u));
    } catch (const InputError& e) {
      return e.code();
    }
    return std::nullopt;
  };
  Update inproc = with(8, 0.1f);
  inproc.control.resize(n + 3, 0.0f);
  CHECK(inprocCode(inproc) == Errc::kSizeMismatch);
  inproc = with(9, 0.1f);
  inproc.control[1] = std::numeric_limits<float>::infinity();
  CHECK(inprocCode(inproc) == Errc::kNonFinite);

  // Honest changes are summed unweighted (20 and 30 examples), through the wire.
  protocol::Decoder dec(*s.layout);
  s.round->current().add(dec.decodeUpdate(protocol::encodeUpdate(with(6, 0.5f))));
  Update u7 = with(7, 0.25f);
  u7.header.num_examples = 30;
  s.round->current().add(dec.decodeUpdate(protocol::encodeUpdate(u7)));
  for (float x : s.round->current().partial().controlSum()) REQUIRE(x == 0.75f);

  // An edge's partial carries its sum; the root merges it, and refuses one without it, or one past
  // count x the bounds.
  auto edge = s.scheme->phaseAggregator(s.round->broadcast());
  edge->add(view(with(20, 1.0f)));
  edge->add(view(with(21, 2.0f)));
  const PartialMessage good = edge->partial().exportDense();
  REQUIRE(good.control.size() == n);
  // The code a partial is refused with; nullopt when merged.
  const auto merge = [&](const PartialMessage& m, uint64_t source) -> std::optional<Errc> {
    const auto bytes = protocol::encodePartial(m);
    try {
      s.round->current().merge(dec.decodePartial(bytes), source);
    } catch (const InputError& e) {
      return e.code();
    }
    return std::nullopt;
  };
  PartialMessage none = good;
  none.control.clear();
  CHECK(merge(none, 40) == Errc::kMissingField);
  PartialMessage past = good;
  past.control[0] = 2.5e4f;  // two changes sum to at most 2e4
  CHECK(merge(past, 41) == Errc::kValueTooLarge);
  CHECK_FALSE(merge(good, 42).has_value());
  for (float x : s.round->current().partial().controlSum()) REQUIRE(x == 3.75f);
  // A partial whose control sum is within each value's bound but past count x the norm bound.
  PartialMessage heavy_sum = good;
  std::fill(heavy_sum.control.begin(), heavy_sum.control.end(), 1.9e4f);
  CHECK(merge(heavy_sum, 43) == Errc::kNormTooLarge);
  const RoundResult r = s.round->finish();
  CHECK(allFinite(r.delta));
}

TEST_CASE("attack: SCAFFOLD control where the phase takes none",
          "[aggregation][attack][scaffold]") {
  // Phase 1 of two-phase PowerSGD (control travels in phase 0 only), and a partial of a round
  // without SCAFFOLD.
  Setup s("powersgd:rank=2", "fedavg", {}, true);
  const size_t n = s.layout->numel();
  ClientState st(s.layout->fingerprint());  // the client's state carries phase 0 into phase 1
  const auto phaseUpdate = [&](std::span<const float> values) {
    Update u;
    u.header = {s.layout->fingerprint(), s.round->number(), s.round->phase(), 1, 20};
    u.tensors = s.scheme->compressor().compressWithFeedback(*s.layout, values, st,
                                                            s.round->broadcast().context(1));
    u.control.assign(n, 0.1f);
    return u;
  };
  const std::vector<float> local = testing::randomVector(n, 1, 0.1);
  s.round->current().add(view(phaseUpdate(local)));
  s.round->nextPhase();
  CHECK(rejectedWith(s, phaseUpdate({})) == Errc::kUnexpectedEncoding);

  Setup plain("none");
  auto edge = plain.scheme->phaseAggregator(plain.round->broadcast());
  edge->add(view(plain.honest(2)));
  PartialMessage m = edge->partial().exportDense();
  REQUIRE(m.control.empty());
  m.control.assign(n, 0.5f);
  protocol::Decoder dec(*plain.layout);
  const auto bytes = protocol::encodePartial(m);
  CHECK(testing::codeOf([&] { plain.round->current().merge(dec.decodePartial(bytes), 7); }) ==
        Errc::kUnexpectedEncoding);
}
