// The compressor contracts of compression/compressor.h, for every registered compressor (and the
// variants allCompressorSpecs() adds): the strong guarantee of compressWithFeedback, the read-only
// compress, the error-feedback invariant phase by phase, concurrent use of one compressor object,
// and what checkReceived accepts. Rounds are driven generically: the round's shared factors come
// from initialShared/nextShared, never from a compressor's name.
#include <catch2/catch.hpp>
#include <exception>
#include <latch>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "compression/lowrank.h"
#include "compression/registry.h"
#include "compression/sparsify.h"
#include "core/aligned.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;

namespace {

constexpr uint64_t kSeed = 17;

const ParamLayout& cnn() {
  static const ParamLayout l = testing::smallCnnLayout();
  return l;
}

std::span<const float> none() { return {}; }

// The next phase's (or round's) shared factors, from the factors that clients' one-factor payloads
// carry for the tensors with a shared factor this phase, each with weight 1.
SharedFactors advance(const Compressor& c, const RoundContext& ctx, const SharedFactors& current,
                      const std::vector<std::vector<Payload>>& clients) {
  const ParamLayout& layout = cnn();
  std::vector<std::vector<float>> sums(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    if (t >= current.factors.size() || current.factors[t].empty()) continue;
    for (const auto& p : clients) {
      const auto& l = std::get<LowRank>(p[t]);
      const auto& f = l.p.empty() ? l.q : l.p;
      if (sums[t].empty()) sums[t].assign(f.size(), 0.0f);
      for (size_t i = 0; i < f.size(); ++i) sums[t][i] += f[i];
    }
  }
  std::vector<std::span<const float>> views(sums.begin(), sums.end());
  return c.nextShared(layout, ctx, current, views, static_cast<double>(clients.size()));
}

// One client's round through every phase; `shared` is the round's broadcast on entry and the next
// round's on return.
std::vector<std::vector<Payload>> clientRound(const Compressor& c, ClientState& st, uint64_t round,
                                              uint64_t client, std::span<const float> update,
                                              SharedFactors& shared) {
  std::vector<std::vector<Payload>> out;
  for (uint32_t phase = 0; phase < c.phases(); ++phase) {
    const RoundContext ctx{kSeed, round, phase, client, &shared};
    out.push_back(c.compressWithFeedback(cnn(), phase == 0 ? update : none(), st, ctx));
    shared = advance(c, ctx, shared, {out.back()});
  }
  return out;
}

// A client algorithm's component that compression/ knows nothing of.
struct Foreign final : StateComponent {
  std::vector<float> v = {1.0f, 2.0f, 3.0f};
  uint32_t version() const override { return 4; }
  void save(ByteWriter& w) const override { w.floats(v); }
  void load(ByteReader& r, uint32_t) override { r.floats(v); }
  size_t memoryBytes() const override { return v.capacity() * 4; }
};

// name -> (version, bytes) of a serialized state (core/client_state.h's format).
std::map<std::string, std::pair<uint32_t, std::vector<uint8_t>>> components(
    const std::vector<uint8_t>& blob) {
  ByteReader r(blob, "test");
  r.u32();
  r.u32();
  r.u64();
  const uint32_t count = r.u32();
  std::map<std::string, std::pair<uint32_t, std::vector<uint8_t>>> out;
  for (uint32_t i = 0; i < count; ++i) {
    std::string name = r.str(64);
    const uint32_t version = r.u32();
    const auto bytes = r.view(r.u64());
    out[name] = {version, {bytes.begin(), bytes.end()}};
  }
  r.finish();
  return out;
}

// The blob with component `name` replaced (or added) by raw bytes: the envelope stays valid.
std::vector<uint8_t> withComponent(const std::vector<uint8_t>& blob, const std::string& name,
                                   uint32_t version, const std::vector<uint8_t>& bytes) {
  auto comps = components(blob);
  comps[name] = {version, bytes};
  std::vector<uint8_t> out(blob.begin(), blob.begin() + 16);  // magic, format, fingerprint
  ByteWriter w(out);
  w.u32(static_cast<uint32_t>(comps.size()));
  for (const auto& [n, vb] : comps) {  // std::map: in name order, as the format requires
    w.str(n);
    w.u32(vb.first);
    w.u64(vb.second.size());
    w.bytes(vb.second.data(), vb.second.size());
  }
  return out;
}

bool needsShared(const Compressor& c) { return c.initialShared(cnn(), kSeed).any(); }

std::string localFormOf(const std::string& spec) {
  return spec + (spec.find(':') == std::string::npos ? ":mode=local" : ",mode=local");
}

}  // namespace

TEST_CASE(
    "compressWithFeedback leaves the state byte-identical on every throw, for every compressor",
    "[compression]") {
  const ParamLayout& layout = cnn();
  const size_t n = layout.numel();
  for (const auto& spec : testing::allCompressorSpecs()) {
    INFO(spec);
    auto c = makeCompressor(spec);
    SharedFactors shared = c->initialShared(layout, kSeed);
    ClientState lived(layout.fingerprint());
    lived.get<Foreign>("algo.extra");
    for (uint64_t r = 0; r < 2; ++r)
      clientRound(*c, lived, r, 3, testing::randomVector(n, 50 + r), shared);
    const auto update = testing::randomVector(n, 60);

    // The states to break: after whole rounds, and (two-phase) between phase 0 and phase 1.
    struct Variant {
      std::string name;
      ClientState state;
      uint32_t phase;        // the phase a correct call would run
      SharedFactors shared;  // and its broadcast
    };
    std::vector<Variant> variants;
    variants.push_back({"after a round", lived.copy(), 0, shared});
    if (c->phases() == 2) {
      ClientState mid = lived.copy();
      const RoundContext ctx0{kSeed, 2, 0, 3, &shared};
      const auto p0 = c->compressWithFeedback(layout, update, mid, ctx0);
      variants.push_back(
          {"between the phases", std::move(mid), 1, advance(*c, ctx0, shared, {p0})});
    }
    for (auto& v : variants) {
      INFO(v.name);
      ClientState& st = v.state;
      const auto before = testing::stateBytes(st);
      auto call = [&](std::span<const float> u, uint32_t phase, const SharedFactors* sh) {
        c->compressWithFeedback(layout, u, st, RoundContext{kSeed, 2, phase, 3, sh});
      };
      auto expectThrowUnchanged = [&](const char* what, const std::function<void()>& f) {
        INFO(what);
        CHECK_THROWS_AS(f(), Error);
        CHECK(testing::stateBytes(st) == before);
      };
      const std::span<const float> good = v.phase == 0 ? std::span<const float>(update) : none();
      auto nan_last = update;
      nan_last.back() = std::nanf("");
      auto inf_first = update;
      inf_first.front() = -INFINITY;
      const std::vector<float> shorter(update.begin(), update.end() - 1);
      auto longer = update;
      longer.push_back(1.0f);
      if (v.phase == 0) {
        expectThrowUnchanged("NaN as the last value", [&] { call(nan_last, 0, &v.shared); });
        expectThrowUnchanged("-inf as the first value", [&] { call(inf_first, 0, &v.shared); });
        expectThrowUnchanged("one value short", [&] { call(shorter, 0, &v.shared); });
        expectThrowUnchanged("one value too many", [&] { call(longer, 0, &v.shared); });
        expectThrowUnchanged("no update", [&] { call(none(), 0, &v.shared); });
      } else {
        expectThrowUnchanged("an update in a phase that continues from the state",
                             [&] { call(update, 1, &v.shared); });
      }
      expectThrowUnchanged("a phase past the last", [&] { call(good, c->phases(), &v.shared); });
      expectThrowUnchanged("phase 1000", [&] { call(good, 1000, &v.shared); });
      if (c->phases() == 2 && v.phase == 0)
        expectThrowUnchanged("phase 1 without phase 0", [&] { call(none(), 1, &v.shared); });
      if (needsShared(*c)) {
        expectThrowUnchanged("no shared factors", [&] { call(good, v.phase, nullptr); });
        SharedFactors flipped = v.shared;
        flipped.fixed = flipped.fixed == SharedFactors::Side::kQ ? SharedFactors::Side::kP
                                                                 : SharedFactors::Side::kQ;
        if (c->phases() == 2)  // acpsgd takes either side; two-phase PowerSGD's side is the phase's
          expectThrowUnchanged("shared factors of the other side",
                               [&] { call(good, v.phase, &flipped); });
        LowRankOptions o;
        o.rank = 3;
        SharedFactors wrong_rank = initialSharedFactors(layout, o, kSeed);
        wrong_rank.fixed = v.shared.fixed;
        for (size_t t = 0; t < layout.size(); ++t)
          if (!wrong_rank.factors[t].empty() && v.shared.fixed == SharedFactors::Side::kP)
            wrong_rank.factors[t].resize(layout[t].rows() * 3);
        expectThrowUnchanged("shared factors of another rank",
                             [&] { call(good, v.phase, &wrong_rank); });
        SharedFactors fewer = v.shared;
        fewer.factors.pop_back();
        expectThrowUnchanged("shared factors for fewer tensors",
                             [&] { call(good, v.phase, &fewer); });
      }
      // The state itself is broken: a residual of the wrong size, or stored bytes that do not
      // parse.
      {
        ClientState bad = st.copy();
        bad.get<ResidualState>(kResidualComponent).values.assign(n - 1, 0.5f);
        const auto bad_bytes = testing::stateBytes(bad);
        CHECK_THROWS_AS(c->compressWithFeedback(layout, good, bad,
                                                RoundContext{kSeed, 2, v.phase, 3, &v.shared}),
                        Error);
        CHECK(testing::stateBytes(bad) == bad_bytes);
      }
      // Stored bytes that do not parse (a float count that lies; a pending phase that cannot be),
      // read lazily: only when compressWithFeedback asks for the component.
      for (const auto& [component, bytes] :
           std::vector<std::pair<std::string, std::vector<uint8_t>>>{
               {std::string(kResidualComponent),
                {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8),
                 static_cast<uint8_t>(n >> 16), 0, 0, 0, 0, 0, 0, 0, 0, 0}},
               {std::string(kPowerSgdComponent), {7, 0, 0, 0, 0, 0, 0, 0, 0}}}) {
        INFO("corrupt component " << component);
        const auto corrupt = withComponent(testing::stateBytes(st), component, 1, bytes);
        ClientState loaded;
        loaded.loadFrom(corrupt);
        REQUIRE(testing::stateBytes(loaded) == corrupt);
        const bool reads = component == kResidualComponent || c->name() == "powersgd";
        if (reads) {
          CHECK_THROWS_AS(c->compressWithFeedback(layout, good, loaded,
                                                  RoundContext{kSeed, 2, v.phase, 3, &v.shared}),
                          IoError);
          CHECK(testing::stateBytes(loaded) == corrupt);
        } else {
          CHECK_NOTHROW(c->compressWithFeedback(layout, good, loaded,
                                                RoundContext{kSeed, 2, v.phase, 3, &v.shared}));
          CHECK(components(testing::stateBytes(loaded)).at(component).second ==
                bytes);  // passed through
        }
      }
      // A state bound to another model.
      {
        auto blob = testing::stateBytes(st);
        blob[8] ^= 1;  // the fingerprint's low byte
        ClientState other;
        other.loadFrom(blob);
        CHECK_THROWS_WITH(c->compressWithFeedback(layout, good, other,
                                                  RoundContext{kSeed, 2, v.phase, 3, &v.shared}),
                          Catch::Contains("another model"));
        CHECK(testing::stateBytes(other) == blob);
      }
      // After all that, the correct call works and gives what the state saved before gives.
      ClientState twin;
      twin.loadFrom(before);
      const auto a =
          c->compressWithFeedback(layout, good, st, RoundContext{kSeed, 2, v.phase, 3, &v.shared});
      const auto b = c->compressWithFeedback(layout, good, twin,
                                             RoundContext{kSeed, 2, v.phase, 3, &v.shared});
      CHECK(testing::samePayloads(a, b));
      CHECK(testing::stateBytes(st) == testing::stateBytes(twin));
      CHECK(st.find<Foreign>("algo.extra")->v == std::vector<float>{1.0f, 2.0f, 3.0f});
    }
  }
}

TEST_CASE("the read-only compress writes nothing and keeps no state, for every compressor",
          "[compression]") {
  const ParamLayout& layout = cnn();
  const auto update = testing::randomVector(layout.numel(), 70);
  for (const auto& spec : testing::allCompressorSpecs()) {
    INFO(spec);
    auto c = makeCompressor(spec);
    const SharedFactors shared = c->initialShared(layout, kSeed);
    const SharedFactors shared_copy = shared;
    std::vector<float> input = update;
    const std::string spec_before = c->spec();
    const auto a = c->compress(layout, input, RoundContext{kSeed, 3, 0, 5, &shared});
    CHECK(testing::sameBits(input, update));  // the input, bit for bit
    CHECK(shared.factors == shared_copy.factors);
    CHECK(shared.fixed == shared_copy.fixed);
    CHECK(c->spec() == spec_before);
    REQUIRE(a.size() == layout.size());
    // Nothing is remembered between calls: the same call gives the same payloads; and it is phase 0
    // whatever the context says.
    CHECK(testing::samePayloads(c->compress(layout, input, RoundContext{kSeed, 3, 0, 5, &shared}),
                                a));
    CHECK(testing::samePayloads(c->compress(layout, input, RoundContext{kSeed, 3, 1, 5, &shared}),
                                a));
    for (size_t t = 0; t < layout.size(); ++t)
      CHECK_NOTHROW(validatePayload(view(a[t]), layout[t], &shared, t));
    // It is what the in-place entry sends for a client with no state yet (no residual to add); a
    // two-phase compressor uses its one-phase form.
    const auto one_phase =
        c->phases() == 1 ? makeCompressor(spec) : makeCompressor(localFormOf(spec));
    REQUIRE(one_phase->phases() == 1);
    ClientState fresh(layout.fingerprint());
    CHECK(testing::samePayloads(one_phase->compressWithFeedback(
                                    layout, update, fresh, RoundContext{kSeed, 3, 0, 5, &shared}),
                                a));
    // And it refuses what the in-place entry refuses, still writing nothing.
    auto bad = update;
    bad[100] = std::nanf("");
    const auto bad_copy = bad;
    CHECK_THROWS_AS(c->compress(layout, bad, RoundContext{kSeed, 3, 0, 5, &shared}),
                    InvalidArgument);
    CHECK(testing::sameBits(bad, bad_copy));
    CHECK_THROWS_AS(c->compress(layout, std::span<const float>(update).first(10),
                                RoundContext{kSeed, 3, 0, 5, &shared}),
                    InvalidArgument);
  }
}

// compressor.h: compress() is "no state, no error feedback" and "Two-phase compressors use their
// one-phase form". PowerSGD's one-phase (local) form starts from the seeded Q and needs no shared
// factor, so neither should the read-only entry.
TEST_CASE("the read-only compress of two-phase PowerSGD needs no shared factors", "[compression]") {
  const ParamLayout& layout = cnn();
  const auto update = testing::randomVector(layout.numel(), 71);
  auto two = makeCompressor("powersgd");
  auto local = makeCompressor("powersgd:mode=local");
  std::vector<Payload> got;
  CHECK_NOTHROW(got = two->compress(layout, update, RoundContext{kSeed, 3, 0, 5}));
  CHECK(testing::samePayloads(got, local->compress(layout, update, RoundContext{kSeed, 3, 0, 5})));
}

TEST_CASE("error feedback loses nothing, phase by phase, for every compressor with error feedback",
          "[compression]") {
  const ParamLayout& layout = cnn();
  const size_t n = layout.numel();
  size_t tested = 0;
  for (const auto& spec : testing::allCompressorSpecs()) {
    auto c = makeCompressor(spec);
    if (!c->usesErrorFeedback()) continue;
    ++tested;
    INFO(spec);
    // Sparsifiers send values as they are: exact. Quantizers and low-rank factors round.
    const bool exact = c->name() == "topk" || c->name() == "randk" || c->name() == "randblock";
    // With ef_decay = B < 1 the residual kept after the round's last phase is B (acc - sent).
    const double decay = c->feedback().decay;
    const double rel = exact && decay == 1.0 ? 0.0
                       : c->name() == "sign" || c->name() == "qsgd" || c->name() == "stc" || exact
                           ? 1e-6
                           : 2e-5;
    SharedFactors shared = c->initialShared(layout, kSeed);
    ClientState st(layout.fingerprint());
    for (uint64_t round = 0; round < 3; ++round) {
      INFO("round " << round);
      const auto u = testing::randomVector(n, 80 + round);
      const auto old = testing::residualOf(st, n);
      std::vector<float> expect(n);
      for (size_t i = 0; i < n; ++i) expect[i] = u[i] + old[i];
      const double tol = rel * testing::maxAbs(expect);
      // What the round's update receives from this client, over its phases.
      std::vector<float> sent(n, 0.0f);
      std::vector<float> before_phase = old;
      for (uint32_t phase = 0; phase < c->phases(); ++phase) {
        INFO("phase " << phase);
        const RoundContext ctx{kSeed, round, phase, 4, &shared};
        const auto p = c->compressWithFeedback(
            layout, phase == 0 ? std::span<const float>(u) : none(), st, ctx);
        REQUIRE(p.size() == layout.size());
        std::vector<float> decoded(n, 0.0f);
        for (size_t t = 0; t < layout.size(); ++t) {
          CHECK_NOTHROW(validatePayload(view(p[t]), layout[t], &shared, t));
          const auto* l = std::get_if<LowRank>(&p[t]);
          if (l && l->p.empty() != l->q.empty() && !c->factorsAreUpdate(phase))
            continue;  // shapes the next factor only
          accumulatePayload(view(p[t]), layout[t], layout.slice(std::span<float>(decoded), t), 1.0f,
                            &shared, t);
        }
        const auto kept = testing::residualOf(st, n);
        const bool last = phase + 1 == c->phases();
        CHECK(st.find<ResidualState>(kResidualComponent)->round == round);
        // This phase: what it sent plus what it kept (undecayed) is what it started from.
        std::vector<float> lhs(n), rhs(n);
        for (size_t i = 0; i < n; ++i) {
          lhs[i] = decoded[i] + (last ? static_cast<float>(kept[i] / decay) : kept[i]);
          rhs[i] = phase == 0 ? expect[i] : before_phase[i];
        }
        CHECK(testing::maxAbsDiff(lhs, rhs) <= (phase == 0 && c->phases() == 2 ? 0.0 : tol));
        CHECK(testing::maxAbs(decoded) > 0.0);  // not vacuous: something was sent
        for (size_t i = 0; i < n; ++i) sent[i] += decoded[i];
        before_phase = kept;
        shared = advance(*c, ctx, shared, {p});
      }
      // The whole round: decoded(sent) + new residual / B == update + old residual.
      const auto res = testing::residualOf(st, n);
      std::vector<float> total(n);
      for (size_t i = 0; i < n; ++i) total[i] = sent[i] + static_cast<float>(res[i] / decay);
      CHECK(testing::maxAbsDiff(total, expect) <= tol);
    }
  }
  CHECK(tested >= 10);
}

TEST_CASE("threads sharing one compressor give exactly the serial payloads, for every compressor",
          "[compression]") {
  const ParamLayout& layout = cnn();
  constexpr size_t kClients = 8, kThreads = 4, kRounds = 2;
  std::vector<std::vector<float>> updates;
  for (size_t i = 0; i < kClients * kRounds; ++i)
    updates.push_back(testing::randomVector(layout.numel(), 90 + i));
  for (const auto& spec : testing::allCompressorSpecs()) {
    INFO(spec);
    const auto c = makeCompressor(spec);
    const uint32_t phases = c->phases();
    // Serial: every client of every phase in turn; the broadcasts follow from the payloads.
    std::vector<std::vector<SharedFactors>> broadcasts(kRounds);
    std::vector<std::vector<std::vector<std::vector<Payload>>>> serial(
        kClients);  // [client][round][phase]
    std::vector<ClientState> states;
    for (size_t i = 0; i < kClients; ++i) states.emplace_back(layout.fingerprint());
    SharedFactors shared = c->initialShared(layout, kSeed);
    for (size_t r = 0; r < kRounds; ++r) {
      for (size_t i = 0; i < kClients; ++i) serial[i].emplace_back();
      for (uint32_t phase = 0; phase < phases; ++phase) {
        broadcasts[r].push_back(shared);
        const RoundContext ctx{kSeed, r, phase, 0, &broadcasts[r].back()};
        std::vector<std::vector<Payload>> all;
        for (size_t i = 0; i < kClients; ++i) {
          RoundContext ci = ctx;
          ci.client_id = i;
          all.push_back(c->compressWithFeedback(
              layout, phase == 0 ? std::span<const float>(updates[r * kClients + i]) : none(),
              states[i], ci));
          serial[i][r].push_back(all.back());
        }
        shared = advance(*c, ctx, shared, all);
      }
    }
    // Threaded: each thread runs its clients through every round with its own workspace.
    std::vector<std::vector<std::vector<std::vector<Payload>>>> threaded(kClients);
    std::vector<ClientState> tstates;
    for (size_t i = 0; i < kClients; ++i) tstates.emplace_back(layout.fingerprint());
    std::vector<std::exception_ptr> errors(kThreads);
    std::latch start(kThreads);
    std::vector<std::thread> threads;
    for (size_t th = 0; th < kThreads; ++th) {
      threads.emplace_back([&, th] {
        try {
          Workspace ws;
          start.arrive_and_wait();
          for (size_t r = 0; r < kRounds; ++r)
            for (size_t i = th; i < kClients; i += kThreads) {
              threaded[i].emplace_back();
              for (uint32_t phase = 0; phase < phases; ++phase)
                threaded[i][r].push_back(c->compressWithFeedback(
                    layout, phase == 0 ? std::span<const float>(updates[r * kClients + i]) : none(),
                    tstates[i], RoundContext{kSeed, r, phase, i, &broadcasts[r][phase]}, &ws));
            }
        } catch (...) {
          errors[th] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    bool same = true;
    for (size_t i = 0; i < kClients; ++i) {
      REQUIRE(threaded[i].size() == kRounds);
      for (size_t r = 0; r < kRounds; ++r) {
        REQUIRE(threaded[i][r].size() == phases);
        for (uint32_t phase = 0; phase < phases; ++phase)
          same = same && testing::samePayloads(threaded[i][r][phase], serial[i][r][phase]);
      }
      same = same && testing::stateBytes(tstates[i]) == testing::stateBytes(states[i]);
    }
    CHECK(same);
  }
}

TEST_CASE(
    "payloads and residuals are functions of the values, not of where the buffers lie, for every "
    "compressor",
    "[compression]") {
  // A vectorised reduction over a buffer of unknown alignment sums in an order that
  // follows the address. The update is placed at every 4-byte offset from a 64-byte boundary, and
  // the heap is disturbed by a different number of allocations each time, so the compressor's own
  // buffers (state, workspace) may land elsewhere too (not under ASan, whose allocator places them
  // alike); every payload and state byte must stay the same.
  const ParamLayout& layout = cnn();
  constexpr size_t kRounds = 2;
  std::vector<std::vector<float>> updates;
  for (size_t r = 0; r < kRounds; ++r)
    updates.push_back(testing::randomVector(layout.numel(), 310 + r));
  for (const auto& spec : testing::allCompressorSpecs()) {
    INFO(spec);
    const auto c = makeCompressor(spec);
    const auto run = [&](size_t offset_floats, size_t noise) {
      std::vector<std::unique_ptr<char[]>> heap_noise;
      for (size_t i = 0; i < noise; ++i) heap_noise.push_back(std::make_unique<char[]>(8 + 24 * i));
      std::vector<std::vector<std::vector<Payload>>> out;
      ClientState st(layout.fingerprint());
      SharedFactors shared = c->initialShared(layout, kSeed);
      AlignedVector<float> buf(layout.numel() + kSimdAlign / sizeof(float));
      for (size_t r = 0; r < kRounds; ++r) {
        std::copy(updates[r].begin(), updates[r].end(),
                  buf.begin() + static_cast<ptrdiff_t>(offset_floats));
        out.push_back(clientRound(
            *c, st, r, 3, std::span<const float>(buf).subspan(offset_floats, layout.numel()),
            shared));
      }
      return std::make_pair(out, testing::stateBytes(st));
    };
    const auto [ref, ref_state] = run(0, 0);
    for (size_t offset = 1; offset <= kSimdAlign / sizeof(float); ++offset) {
      INFO("update " << offset * sizeof(float) << " bytes past a 64-byte boundary");
      const auto [got, got_state] = run(offset % (kSimdAlign / sizeof(float)), offset);
      bool same = true;
      for (size_t r = 0; r < kRounds; ++r)
        for (size_t phase = 0; phase < got[r].size(); ++phase)
          same = same && testing::samePayloads(got[r][phase], ref[r][phase]);
      CHECK(same);
      CHECK(got_state == ref_state);
    }
  }
}

TEST_CASE("checkReceived accepts what a compressor sends and refuses other encodings",
          "[compression]") {
  const ParamLayout& layout = cnn();
  struct Sent {
    std::string spec;
    std::unique_ptr<Compressor> c;
    std::vector<SharedFactors> broadcast;        // per phase of round 1
    std::vector<std::vector<Payload>> payloads;  // per phase of round 1
    std::vector<std::set<size_t>> encodings;     // per tensor: encodings sent (any phase)
  };
  std::vector<Sent> all;
  for (const auto& spec : testing::allCompressorSpecs()) {
    Sent s{spec, makeCompressor(spec), {}, {}, std::vector<std::set<size_t>>(layout.size())};
    SharedFactors shared = s.c->initialShared(layout, kSeed);
    ClientState st(layout.fingerprint());
    clientRound(*s.c, st, 0, 2, testing::randomVector(layout.numel(), 100), shared);
    const auto u = testing::randomVector(layout.numel(), 101);
    for (uint32_t phase = 0; phase < s.c->phases(); ++phase) {
      s.broadcast.push_back(shared);
      const RoundContext ctx{kSeed, 1, phase, 2, &s.broadcast.back()};
      s.payloads.push_back(s.c->compressWithFeedback(
          layout, phase == 0 ? std::span<const float>(u) : none(), st, ctx));
      shared = advance(*s.c, ctx, shared, {s.payloads.back()});
    }
    all.push_back(std::move(s));
  }
  for (const auto& a : all) {
    INFO("receiver " << a.spec);
    for (uint32_t phase = 0; phase < a.c->phases(); ++phase) {
      const RoundContext ctx{kSeed, 1, phase, 2, &a.broadcast[phase]};
      std::vector<size_t> own(layout.size());
      for (size_t t = 0; t < layout.size(); ++t) {
        own[t] = a.payloads[phase][t].index();
        INFO("own tensor " << t << " phase " << phase);
        CHECK(testing::errcOf([&] {
                a.c->checkReceived(layout, t, view(a.payloads[phase][t]), ctx);
              }) == "no error");
      }
      for (const auto& b : all) {
        for (const auto& bp : b.payloads) {
          for (size_t t = 0; t < layout.size(); ++t) {
            const std::string got =
                testing::errcOf([&] { a.c->checkReceived(layout, t, view(bp[t]), ctx); });
            INFO("from " << b.spec << ", tensor " << t << " as " << encodingName(bp[t])
                         << ", phase " << phase);
            if (bp[t].index() != own[t]) {
              CHECK(got == errcName(Errc::kUnexpectedEncoding));
            } else {
              // The same encoding: accepted, or refused for a field the round fixes (or, for
              // two-phase PowerSGD's phase Q of a dense tensor, anything but the empty sparse
              // placeholder).
              CHECK((got == "no error" || got == errcName(Errc::kRoundMismatch) ||
                     got == errcName(Errc::kUnexpectedEncoding)));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("checkReceived refuses the fields a round fixes", "[compression]") {
  const ParamLayout& layout = cnn();
  const auto u = testing::randomVector(layout.numel(), 110);
  const RoundContext ctx{kSeed, 4, 0, 1};
  auto code = [&](const Compressor& c, size_t t, const Payload& p, const RoundContext& x) {
    return testing::errcOf([&] { c.checkReceived(layout, t, view(p), x); });
  };
  const std::string ok = "no error", mismatch = errcName(Errc::kRoundMismatch);
  SECTION("randblock: the round's offset and length") {
    auto c = makeCompressor("randblock:density=0.05");
    const auto p = c->compress(layout, u, ctx);
    for (size_t t = 0; t < layout.size(); ++t) {
      INFO("tensor " << t);
      const auto& b = std::get<RandBlock>(p[t]);
      CHECK(code(*c, t, p[t], ctx) == ok);
      CHECK(b.offset == RandBlockCompressor::blockOffset(kSeed, 4, t, layout[t].numel));
      RandBlock moved = b;
      moved.offset = static_cast<uint32_t>((b.offset + 1) % layout[t].numel);
      CHECK(code(*c, t, moved, ctx) == mismatch);
      RandBlock longer = b;
      longer.values.push_back(0.0f);
      CHECK(code(*c, t, longer, ctx) == mismatch);
      RandBlock shorter = b;
      shorter.values.pop_back();
      if (!shorter.values.empty()) CHECK(code(*c, t, shorter, ctx) == mismatch);
      // Another round's block is at another offset (for these tensors and rounds).
      RoundContext next = ctx;
      next.round = 5;
      if (RandBlockCompressor::blockOffset(kSeed, 5, t, layout[t].numel) != b.offset)
        CHECK(code(*c, t, p[t], next) == mismatch);
    }
  }
  SECTION("randblock with offset=client: each client's own offset, another client's refused") {
    auto shared = makeCompressor("randblock:density=0.05");
    auto own = makeCompressor("randblock:density=0.05,offset=client");
    size_t differ = 0, tensors = 0;
    for (uint64_t client : {1u, 2u, 3u}) {
      RoundContext mine = ctx;
      mine.client_id = client;
      const auto p = own->compress(layout, u, mine);
      for (size_t t = 0; t < layout.size(); ++t) {
        INFO("client " << client << ", tensor " << t);
        CHECK(code(*own, t, p[t], mine) == ok);
        const auto& b = std::get<RandBlock>(p[t]);
        ++tensors;
        if (b.offset != RandBlockCompressor::blockOffset(kSeed, 4, t, layout[t].numel)) {
          ++differ;
          CHECK(code(*shared, t, p[t], mine) == mismatch);  // not the round's shared block
        }
        RoundContext other = mine;
        other.client_id = client + 10;
        const auto q = own->compress(layout, u, other);
        if (std::get<RandBlock>(q[t]).offset != b.offset)
          CHECK(code(*own, t, p[t], other) == mismatch);
      }
    }
    CHECK(differ * 2 > tensors);  // per-client offsets are not the shared one
  }
  SECTION("qsgd: the compressor's s") {
    auto c4 = makeCompressor("qsgd:levels=4");
    auto c16 = makeCompressor("qsgd:levels=16");
    const auto p4 = c4->compress(layout, u, ctx);
    const auto p16 = c16->compress(layout, u, ctx);
    for (size_t t = 0; t < layout.size(); ++t) {
      CHECK(code(*c4, t, p4[t], ctx) == ok);
      CHECK(code(*c4, t, p16[t], ctx) == mismatch);
      CHECK(code(*c16, t, p4[t], ctx) == mismatch);
    }
  }
  SECTION("topk: k per tensor (layer scope), at most k overall (global scope)") {
    auto layer = makeCompressor("topk:density=0.05");
    const auto p = layer->compress(layout, u, ctx);
    for (size_t t = 0; t < layout.size(); ++t) {
      INFO("tensor " << t);
      const auto& s = std::get<Sparse>(p[t]);
      CHECK(s.indices.size() == countForDensity(0.05, layout[t].numel));
      CHECK(code(*layer, t, p[t], ctx) == ok);
      Sparse fewer = s;
      fewer.indices.pop_back();
      fewer.values.pop_back();
      CHECK(code(*layer, t, fewer, ctx) == mismatch);
      Sparse more = s;
      uint32_t extra = 0;
      while (std::binary_search(s.indices.begin(), s.indices.end(), extra)) ++extra;
      more.indices.insert(std::lower_bound(more.indices.begin(), more.indices.end(), extra), extra);
      more.values.push_back(0.0f);
      CHECK(code(*layer, t, more, ctx) == mismatch);
    }
    auto global = makeCompressor("topk:density=0.01,scope=global");
    const size_t k = countForDensity(0.01, layout.numel());
    const size_t t = *layout.find("fc1.weight");
    CHECK(code(*global, t, Sparse{{1, 2}, {1.0f, 1.0f}}, ctx) == ok);
    Sparse too_many;
    for (uint32_t i = 0; i <= k; ++i) {
      too_many.indices.push_back(i);
      too_many.values.push_back(1.0f);
    }
    CHECK(code(*global, t, too_many, ctx) == mismatch);
  }
  SECTION("randk: k per tensor") {
    auto c = makeCompressor("randk:density=0.05");
    const auto p = c->compress(layout, u, ctx);
    const size_t t = *layout.find("fc1.weight");
    Sparse fewer = std::get<Sparse>(p[t]);
    fewer.indices.pop_back();
    fewer.values.pop_back();
    CHECK(code(*c, t, p[t], ctx) == ok);
    CHECK(code(*c, t, fewer, ctx) == mismatch);
  }
  SECTION("low-rank: the rank and the factors of the phase") {
    auto two = makeCompressor("powersgd");
    const SharedFactors q = two->initialShared(layout, kSeed);
    const RoundContext p0{kSeed, 4, 0, 1, &q}, p1{kSeed, 4, 1, 1, &q};
    const size_t fc1 = *layout.find("fc1.weight"), bias = *layout.find("fc1.bias");
    const auto local = makeCompressor("powersgd:mode=local")->compress(layout, u, ctx);  // P and Q
    const auto rank2 = makeCompressor("powersgd:mode=local,rank=2")->compress(layout, u, ctx);
    const LowRank& both = std::get<LowRank>(local[fc1]);
    const LowRank p_only{both.rows, both.cols, both.rank, both.p, {}};
    const LowRank q_only{both.rows, both.cols, both.rank, {}, both.q};
    CHECK(code(*two, fc1, p_only, p0) == ok);
    CHECK(code(*two, fc1, q_only, p1) == ok);
    CHECK(code(*two, fc1, q_only, p0) == mismatch);
    CHECK(code(*two, fc1, p_only, p1) == mismatch);
    CHECK(code(*two, fc1, local[fc1], p0) == mismatch);
    CHECK(code(*two, fc1, LowRank{both.rows, both.cols, 2, std::get<LowRank>(rank2[fc1]).p, {}},
               p0) == mismatch);
    // A tensor too small to factor goes whole in phase P and as an empty sparse payload in phase Q.
    CHECK(code(*two, bias, local[bias], p0) == ok);
    CHECK(code(*two, bias, Sparse{}, p1) == ok);
    CHECK(code(*two, bias, Sparse{{0}, {1.0f}}, p1) == errcName(Errc::kUnexpectedEncoding));
    CHECK(code(*two, bias, local[bias], p1) == errcName(Errc::kUnexpectedEncoding));
    auto loc = makeCompressor("powersgd:mode=local");
    CHECK(code(*loc, fc1, local[fc1], ctx) == ok);
    CHECK(code(*loc, fc1, p_only, ctx) == mismatch);
    auto acp = makeCompressor("acpsgd");
    CHECK(code(*acp, fc1, p_only, p0) == ok);  // shared Q: P only
    CHECK(code(*acp, fc1, q_only, p0) == mismatch);
    CHECK(code(*acp, fc1, local[fc1], p0) == mismatch);
  }
}
