// Central differential privacy in the round engine (EngineConfig::dp, privacy/dp.h), against a
// fleet whose clients send updates the test chooses: Poisson sampling, each update clipped and
// weighing alike, the noise's scale at the fixed denominator, epsilon in every record, the
// budget, and what is refused with the reason.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "check_throws.h"
#include "privacy/accountant.h"
#include "server/engine.h"
#include "temp_dir.h"

using namespace starling;
using Catch::Matchers::Contains;

namespace {

std::shared_ptr<const ParamLayout> layout() {
  auto l = std::make_shared<ParamLayout>();
  l->add("w", {64, 32});
  l->add("b", {64});
  return l;
}

// `n` clients, always available; client c's update in round r is update(c, r).
class VectorFleet final : public server::Fleet {
 public:
  VectorFleet(std::shared_ptr<const ParamLayout> l, size_t n,
              std::function<std::vector<float>(uint64_t, uint64_t)> update)
      : layout_(std::move(l)), n_(n), update_(std::move(update)) {}

  std::map<uint64_t, std::vector<uint64_t>> sampled;  // round -> participants
  std::set<uint64_t> aggregators;                     // these ids register as edge aggregators
  // The fleet adds its participants' updates to a partial of its own and merges that (a lying
  // edge aggregator's way past the root's clip).
  bool as_partial = false;

  server::ClientPool waitForClients(size_t, std::chrono::milliseconds, uint64_t) override {
    std::vector<server::ClientInfo> out;
    for (uint64_t c = 0; c < n_; ++c)
      out.push_back({c,
                     aggregators.count(c) ? protocol::Role::kAggregator : protocol::Role::kClient,
                     100, 10, 0});
    return out;
  }
  server::PhaseReport runPhase(const server::PhaseTask& task,
                               std::span<const server::ClientInfo> participants, size_t,
                               aggregation::PhaseAggregator& agg) override {
    server::PhaseReport rep;
    auto& s = sampled[task.header.round];
    aggregation::RoundSchemeOptions o;
    o.compressor = "none";
    o.rule = "fedavg:weight=uniform";  // as the root's under DP: its checks pass
    const aggregation::RoundScheme scheme(layout_, o);
    const auto edge = scheme.phaseAggregator(task.broadcast);
    for (const auto& p : participants) {
      s.push_back(p.id);
      const std::vector<float> x = update_(p.id, task.header.round);
      compression::Update u;
      u.header = {layout_->fingerprint(), task.header.round, 0, p.id, 100};
      for (size_t t = 0; t < layout_->size(); ++t) {
        const auto sl = layout_->slice(std::span<const float>(x), t);
        u.tensors.push_back(compression::DenseF32{{sl.begin(), sl.end()}});
      }
      u.metrics = {{"train_loss", 1.0}};
      (as_partial ? *edge : agg).add(compression::view(u));
      rep.completed.push_back(p.id);
    }
    if (as_partial) {
      const compression::PartialMessage m = edge->partial().exportDense();
      agg.merge(compression::view(m), 999);
    }
    return rep;
  }
  // Called in evaluate() (a probe of what is durable then); may throw to stop the run.
  std::function<void(uint64_t round)> on_evaluate;
  server::EvalReport evaluate(const server::PhaseTask& task, const server::ClientPool&) override {
    if (on_evaluate) on_evaluate(task.header.round);
    return {};
  }
  void finish(const std::string& reason) override { finished = reason; }
  std::string finished;

 private:
  std::shared_ptr<const ParamLayout> layout_;
  size_t n_;
  std::function<std::vector<float>(uint64_t, uint64_t)> update_;
};

server::EngineConfig dpConfig(double q, double clip, double sigma, uint64_t rounds,
                              uint64_t population) {
  server::EngineConfig c;
  c.rounds = rounds;
  c.scheme.compressor = "none";
  c.scheme.run_seed = 17;
  std::ostringstream rule;
  rule << "fedavg:weight=uniform,clip=" << clip;
  c.scheme.rule = rule.str();
  c.sampling.poisson_rate = q;
  c.dp.enabled = true;
  c.dp.clip = clip;
  c.dp.noise_multiplier = sigma;
  c.dp.seeded_noise = true;
  c.dp.population = population;
  // RDP: its epsilon is a closed sum, where PLD's composes by FFT every round (minutes under the
  // sanitizers); the test of the noise's scale runs the default, PLD.
  c.dp.accountant = privacy::DpAccountant::kRdp;
  return c;
}

std::vector<float> constant(size_t n, float v) { return std::vector<float>(n, v); }

}  // namespace

TEST_CASE("Poisson sampling draws every client on its own with the rate", "[server][dp]") {
  const auto l = layout();
  const size_t n = 200, rounds = 200;
  const double q = 0.25;
  server::EngineConfig c = dpConfig(q, 1.0, 1.0, rounds, n);
  c.dp.enabled = false;  // Poisson sampling alone
  c.scheme.rule = "fedavg";
  VectorFleet fleet(l, n, [&](uint64_t, uint64_t) { return constant(l->numel(), 0.0f); });
  server::RoundEngine engine(l, c, std::vector<float>(l->numel(), 0.0f));
  std::vector<size_t> per_client(n, 0);
  double total = 0;
  std::set<std::vector<uint64_t>> distinct;
  for (size_t r = 1; r <= rounds; ++r) {
    const server::RoundRecord rec = engine.runRound(fleet);
    CHECK(rec.clients_selected == fleet.sampled[r].size());
    CHECK_FALSE(rec.dp_epsilon);  // no DP, no epsilon
    total += double(rec.clients_selected);
    for (uint64_t id : fleet.sampled[r]) ++per_client[id];
    distinct.insert(fleet.sampled[r]);
  }
  // The mean sample size, and every client's count, within six standard deviations.
  const double mean = total / rounds, sd_mean = std::sqrt(n * q * (1 - q) / rounds);
  CHECK(std::fabs(mean - n * q) < 6 * sd_mean);
  const double sd_client = std::sqrt(rounds * q * (1 - q));
  size_t outside = 0;
  for (size_t k : per_client) outside += std::fabs(double(k) - rounds * q) > 6 * sd_client;
  CHECK(outside == 0);
  CHECK(distinct.size() == rounds);  // no two rounds drew the same set

  // The same seed samples alike; another seed otherwise.
  VectorFleet again(l, n, [&](uint64_t, uint64_t) { return constant(l->numel(), 0.0f); });
  server::RoundEngine same(l, c, std::vector<float>(l->numel(), 0.0f));
  for (int r = 0; r < 3; ++r) same.runRound(again);
  for (uint64_t r = 1; r <= 3; ++r) CHECK(again.sampled[r] == fleet.sampled[r]);
  c.scheme.run_seed = 18;
  VectorFleet other(l, n, [&](uint64_t, uint64_t) { return constant(l->numel(), 0.0f); });
  server::RoundEngine reseeded(l, c, std::vector<float>(l->numel(), 0.0f));
  reseeded.runRound(other);
  CHECK(other.sampled[1] != fleet.sampled[1]);
}

TEST_CASE("central DP: one client's pull is the clip over the expected count, whatever it sends",
          "[server][dp]") {
  // The attacker's test: client 0 sends an update of norm ~1e4 in every coordinate's direction,
  // the others small ones. Each is clipped to C, the sum divided by q N, and the noise's standard
  // deviation is sigma C / (q N).
  const auto l = layout();
  const size_t n = 8, numel = l->numel();
  const double q = 1.0, clip = 0.5, sigma = 1e-3;
  const auto update = [&](uint64_t c, uint64_t) {
    return c == 0 ? constant(numel, 200.0f) : constant(numel, 1e-4f * float(c));
  };
  VectorFleet fleet(l, n, update);
  server::RoundEngine engine(l, dpConfig(q, clip, sigma, 3, n), std::vector<float>(numel, 0.0f));
  const server::RoundRecord rec = engine.runRound(fleet);
  REQUIRE(rec.applied);
  CHECK(rec.clients_selected == n);
  // The expected delta in double: every update clipped to C, the sum over q N.
  std::vector<double> want(numel, 0.0);
  for (uint64_t c = 0; c < n; ++c) {
    const auto u = update(c, 1);
    double norm = 0;
    for (float v : u) norm += double(v) * v;
    norm = std::sqrt(norm);
    const double s = norm > clip ? clip / norm : 1.0;
    for (size_t i = 0; i < numel; ++i) want[i] += s * u[i] / (q * n);
  }
  const double sd = sigma * clip / (q * n);
  double worst = 0;
  const auto model = engine.model().current();
  for (size_t i = 0; i < numel; ++i) worst = std::max(worst, std::fabs(model[i] - want[i]));
  CHECK(worst < 6 * sd + 1e-6);
  CHECK(worst > 0);  // noise was added
  // Without clipping client 0 alone would have moved each coordinate by 25.
  CHECK(model[0] < 0.01);
}

TEST_CASE("central DP: the noise's scale at the fixed denominator, epsilon in every record",
          "[server][dp]") {
  const auto l = layout();
  // 40 clients online of a population of 100: the denominator is q x 100, the public number,
  // not q x 40.
  const size_t n = 40, population = 100, numel = l->numel(), rounds = 6;
  const double q = 0.5, clip = 0.25, sigma = 1.5;
  // Zero updates: the model moves by the noise alone, sd sigma C / (q N) per round.
  VectorFleet fleet(l, n, [&](uint64_t, uint64_t) { return constant(numel, 0.0f); });
  server::EngineConfig c = dpConfig(q, clip, sigma, rounds, population);
  c.dp.accountant = server::EngineConfig{}.dp.accountant;  // the default: PLD
  REQUIRE(c.dp.accountant == privacy::DpAccountant::kPld);
  server::RoundEngine engine(l, c, std::vector<float>(numel, 0.0f));
  const privacy::PldAccountant oracle(q, sigma, c.dp.delta, privacy::kRunPldGrid);
  std::vector<float> before(numel, 0.0f);
  for (uint64_t r = 1; r <= rounds; ++r) {
    const server::RoundRecord rec = engine.runRound(fleet);
    REQUIRE(rec.applied);
    REQUIRE(rec.dp_epsilon);
    CHECK(*rec.dp_epsilon == oracle.epsilon(r));
    CHECK(rec.json().find("\"dp_epsilon\":") != std::string::npos);
    const auto now = engine.model().current();
    double sum = 0, sq = 0;
    for (size_t i = 0; i < numel; ++i) {
      const double d = double(now[i]) - before[i];
      sum += d;
      sq += d * d;
    }
    const double want = sigma * clip / (q * population), m = sum / numel;
    CHECK(std::fabs(m) < 6 * want / std::sqrt(double(numel)));
    CHECK(std::fabs(std::sqrt(sq / numel - m * m) / want - 1) < 6 * std::sqrt(0.5 / numel));
    before.assign(now.begin(), now.end());
  }
  // Two engines with the run seed's noise are one run; the system's random noise is another.
  VectorFleet f2(l, n, [&](uint64_t, uint64_t) { return constant(numel, 0.0f); });
  server::RoundEngine twin(l, c, std::vector<float>(numel, 0.0f));
  twin.run(f2);
  CHECK(std::vector<float>(twin.model().current().begin(), twin.model().current().end()) == before);
  CHECK(f2.finished == "all 6 rounds done");
  c.dp.seeded_noise = false;
  VectorFleet f3(l, n, [&](uint64_t, uint64_t) { return constant(numel, 0.0f); });
  server::RoundEngine fresh(l, c, std::vector<float>(numel, 0.0f));
  fresh.runRound(f3);
  CHECK(f3.sampled[1] != fleet.sampled[1]);  // its sample is drawn with its secret key too
}

TEST_CASE("central DP: a round Poisson sampling leaves empty is recorded, and counted",
          "[server][dp]") {
  const auto l = layout();
  VectorFleet fleet(l, 2, [&](uint64_t, uint64_t) { return constant(l->numel(), 0.01f); });
  server::RoundEngine engine(l, dpConfig(0.02, 1.0, 2.0, 40, 100),
                             std::vector<float>(l->numel(), 0));
  size_t empty = 0;
  for (int r = 0; r < 40; ++r) {
    const server::RoundRecord rec = engine.runRound(fleet);
    REQUIRE(rec.dp_epsilon);
    CHECK(*rec.dp_epsilon == engine.dp()->epsilon(rec.round));
    if (rec.clients_selected == 0) {
      ++empty;
      CHECK_FALSE(rec.applied);
      CHECK_THAT(rec.reason, Contains("chose none of the 2 available clients"));
    }
  }
  CHECK(empty > 30);  // 0.98^2 of the rounds, about 38
}

TEST_CASE(
    "central DP: a budget the rounds would exceed is refused before round 1, with the "
    "rounds that fit, and a target alone derives the noise",
    "[server][dp]") {
  const auto l = layout();
  server::EngineConfig c = dpConfig(0.1, 1.0, 1.0, 200, 100);
  c.dp.target_epsilon = 3.0;
  const uint64_t fit = privacy::RdpAccountant(0.1, 1.0, c.dp.delta).roundsWithin(3.0, 200);
  REQUIRE(fit > 0);
  REQUIRE(fit < 200);
  CHECK_THROWS_MATCHING(server::RoundEngine(l, c, std::vector<float>(l->numel(), 0)), ConfigError,
                        Contains(std::to_string(fit) + " rounds fit that budget"));
  c.rounds = fit;
  server::RoundEngine ok(l, c, std::vector<float>(l->numel(), 0));
  CHECK(ok.dp()->epsilon(fit) <= 3.0);
  c.rounds = 200;
  c.dp.noise_multiplier = 0;
  server::RoundEngine derived(l, c, std::vector<float>(l->numel(), 0));
  CHECK(derived.dp()->noiseMultiplier() > 1.0);
  CHECK(derived.dp()->epsilon(200) <= 3.0 * (1 + 1e-9));
}

TEST_CASE("central DP refuses what its guarantee does not cover, saying why", "[server][dp]") {
  const auto l = layout();
  const auto refused = [&](const server::EngineConfig& c, const std::string& why) {
    CHECK_THROWS_MATCHING(server::RoundEngine(l, c, std::vector<float>(l->numel(), 0)), ConfigError,
                          Contains(why));
  };
  server::EngineConfig c = dpConfig(0.1, 1.0, 1.0, 10, 100);
  {
    auto x = c;
    x.sampling.poisson_rate = 0;
    refused(x, "needs sampling.poisson_rate");
  }
  {
    auto x = c;
    x.scheme.scaffold = true;
    refused(x, "does not take train.scaffold");
  }
  for (const char* rule : {"fedavg", "fedavg:weight=uniform,clip=2", "fedavg:weight=uniform",
                           "median:clip=1", "trimmed_mean:clip=1"}) {
    auto x = c;
    x.scheme.rule = rule;
    INFO(rule);
    refused(x, "needs the rule fedavg with uniform weights and clip = privacy.clip");
  }
  for (const char* comp : {"powersgd:rank=2", "acpsgd:rank=2"}) {
    auto x = c;
    x.scheme.compressor = comp;
    INFO(comp);
    refused(x, "does not take the compressor");
  }
  {
    auto x = c;
    x.sampling.overcommit = 2;
    refused(x, "sampling.overcommit");
  }
  {
    auto x = c;
    x.dp.noise_multiplier = 0;
    refused(x, "epsilon would be infinite");
  }
  // What composes runs: a one-phase sparsifier with error feedback, quantisers.
  for (const char* comp : {"topk:density=0.1", "randblock:density=0.1", "qsgd:levels=16", "sign"}) {
    auto x = c;
    x.scheme.compressor = comp;
    INFO(comp);
    CHECK_NOTHROW(server::RoundEngine(l, x, std::vector<float>(l->numel(), 0)));
  }
}

TEST_CASE("central DP: every record carries epsilon, a round without enough clients too",
          "[server][dp]") {
  const auto l = layout();
  VectorFleet fleet(l, 3, [&](uint64_t, uint64_t) { return constant(l->numel(), 0.0f); });
  server::EngineConfig c = dpConfig(0.5, 1.0, 1.0, 4, 100);
  c.sampling.min_available = 5;  // never met: every round skipped
  c.sampling.wait_ms = 1;
  server::RoundEngine engine(l, c, std::vector<float>(l->numel(), 0));
  for (uint64_t r = 1; r <= 2; ++r) {
    const server::RoundRecord rec = engine.runRound(fleet);
    CHECK_FALSE(rec.applied);
    CHECK_THAT(rec.reason, Contains("clients available"));
    REQUIRE(rec.dp_epsilon);
    CHECK(*rec.dp_epsilon == engine.dp()->epsilon(r));
  }
}

TEST_CASE("central DP samples clients only, and a round with a merged partial is not applied",
          "[server][dp]") {
  const auto l = layout();
  const size_t n = 30;
  VectorFleet fleet(l, n, [&](uint64_t, uint64_t) { return constant(l->numel(), 0.01f); });
  for (uint64_t a = 0; a < n; a += 2) fleet.aggregators.insert(a);
  server::RoundEngine engine(l, dpConfig(1.0, 1.0, 1.0, 3, n), std::vector<float>(l->numel(), 0));
  REQUIRE(engine.runRound(fleet).applied);
  CHECK(fleet.sampled[1].size() == n / 2);
  for (uint64_t id : fleet.sampled[1]) CHECK(id % 2 == 1);
  {
    // At a rate below 1 too: aggregators are left out before the draws.
    VectorFleet f(l, 200, [&](uint64_t, uint64_t) { return constant(l->numel(), 0.01f); });
    for (uint64_t a = 0; a < 200; a += 2) f.aggregators.insert(a);
    server::RoundEngine e(l, dpConfig(0.5, 1.0, 1.0, 3, 200), std::vector<float>(l->numel(), 0));
    e.runRound(f);
    CHECK(f.sampled[1].size() > 20);
    for (uint64_t id : f.sampled[1]) CHECK(id % 2 == 1);
  }
  // A fleet that merges a partial (updates the root never saw, so never clipped) is refused.
  fleet.as_partial = true;
  const auto before =
      std::vector<float>(engine.model().current().begin(), engine.model().current().end());
  const server::RoundRecord rec = engine.runRound(fleet);
  CHECK_FALSE(rec.applied);
  CHECK_THAT(rec.reason, Contains("partial aggregate"));
  CHECK(std::vector<float>(engine.model().current().begin(), engine.model().current().end()) ==
        before);
  // Without DP the same partial is merged and applied.
  server::EngineConfig plain = dpConfig(1.0, 1.0, 1.0, 3, n);
  plain.dp.enabled = false;
  plain.scheme.rule = "fedavg";
  server::RoundEngine open(l, plain, std::vector<float>(l->numel(), 0));
  CHECK(open.runRound(fleet).applied);
}

TEST_CASE("central DP's accounting is in the checkpoint: a resume under other settings is refused",
          "[server][dp]") {
  const auto l = layout();
  const size_t n = 20;
  testing::TempDir dir;
  const auto zero = [&](uint64_t, uint64_t) { return constant(l->numel(), 0.0f); };
  server::EngineConfig c = dpConfig(0.5, 1.0, 1.2, 6, n);
  c.checkpoint = (dir.path / "ck.bin").string();
  {
    VectorFleet fleet(l, n, zero);
    server::RoundEngine engine(l, c, std::vector<float>(l->numel(), 0));
    for (int r = 0; r < 3; ++r) engine.runRound(fleet);
  }
  {
    // The same settings resume, and epsilon goes on from round 4.
    VectorFleet fleet(l, n, zero);
    server::RoundEngine engine(l, c, std::vector<float>(l->numel(), 0));
    REQUIRE(engine.resumed());
    const server::RoundRecord rec = engine.runRound(fleet);
    CHECK(rec.round == 4);
    CHECK(*rec.dp_epsilon == privacy::RdpAccountant(0.5, 1.2, c.dp.delta).epsilon(4));
  }
  const auto refused = [&](const server::EngineConfig& x, const std::string& why) {
    CHECK_THROWS_MATCHING(server::RoundEngine(l, x, std::vector<float>(l->numel(), 0)), IoError,
                          Contains(why));
  };
  auto other_sigma = c;
  other_sigma.dp.noise_multiplier = 1.5;
  refused(other_sigma, "accounted at sampling rate 0.5, noise multiplier 1.2");
  auto other_rate = c;
  other_rate.sampling.poisson_rate = 0.25;
  refused(other_rate, "accounted at");
  auto without = c;
  without.dp.enabled = false;
  without.scheme.rule = "fedavg";
  refused(without, "ran under central DP");
  // A checkpoint of rounds without DP does not resume as a DP run.
  auto plain = without;
  plain.checkpoint = (dir.path / "plain.bin").string();
  {
    VectorFleet fleet(l, n, zero);
    server::RoundEngine engine(l, plain, std::vector<float>(l->numel(), 0));
    engine.runRound(fleet);
  }
  auto dp_on_plain = c;
  dp_on_plain.checkpoint = plain.checkpoint;
  refused(dp_on_plain, "ran without central DP");
}

TEST_CASE("Poisson sampling: a client's draw is its own, whoever else is online", "[server][dp]") {
  // Each client is in or out of a round's sample by its id alone: with half the clients gone, the
  // ones left are sampled exactly as before (a stream read in id order would shift every draw).
  const auto l = layout();
  const auto zero = [&](uint64_t, uint64_t) { return constant(l->numel(), 0.0f); };
  for (const bool dp : {false, true}) {
    INFO((dp ? "central DP" : "Poisson sampling alone"));
    server::EngineConfig c = dpConfig(0.3, 1.0, 1.0, 5, 100);
    if (!dp) {
      c.dp.enabled = false;
      c.scheme.rule = "fedavg";
    }
    VectorFleet all(l, 100, zero);
    server::RoundEngine e1(l, c, std::vector<float>(l->numel(), 0));
    for (int r = 0; r < 5; ++r) e1.runRound(all);
    // The same run with clients 50..99 gone.
    VectorFleet low(l, 50, zero);
    server::RoundEngine e2(l, c, std::vector<float>(l->numel(), 0));
    for (int r = 0; r < 5; ++r) e2.runRound(low);
    for (uint64_t r = 1; r <= 5; ++r) {
      std::vector<uint64_t> want;
      for (uint64_t id : all.sampled[r])
        if (id < 50) want.push_back(id);
      CHECK(low.sampled[r] == want);
    }
  }
}

TEST_CASE("central DP: the round is checkpointed before its model is evaluated", "[server][dp]") {
  // A crash during the evaluation must not make the root run the round again with another
  // sample and other noise: when the evaluation starts, the checkpoint already resumes after it.
  const auto l = layout();
  testing::TempDir dir;
  server::EngineConfig c = dpConfig(0.5, 1.0, 1.0, 4, 20);
  c.checkpoint = (dir.path / "ck.bin").string();
  c.metrics = (dir.path / "m.jsonl").string();
  c.eval_every = 1;
  const auto lines = [&] {
    std::ifstream f(c.metrics);
    size_t k = 0;
    for (std::string s; std::getline(f, s);) ++k;
    return k;
  };
  VectorFleet fleet(l, 20, [&](uint64_t, uint64_t) { return constant(l->numel(), 0.01f); });
  std::vector<uint64_t> resumes_at;
  fleet.on_evaluate = [&](uint64_t round) {
    server::RoundEngine probe(l, c, std::vector<float>(l->numel(), 0));
    resumes_at.push_back(probe.nextRound());
    if (round == 3) throw IoError("the evaluation failed");
  };
  server::RoundEngine engine(l, c, std::vector<float>(l->numel(), 0));
  REQUIRE(engine.runRound(fleet).applied);
  REQUIRE(engine.runRound(fleet).applied);
  CHECK(resumes_at == std::vector<uint64_t>{2, 3});
  CHECK(lines() == 2);
  // An error in the evaluation: the round stays done, and its line is written once.
  CHECK_THROWS_AS(engine.runRound(fleet), IoError);
  CHECK(engine.nextRound() == 4);
  CHECK(lines() == 3);
  server::RoundEngine resumed(l, c, std::vector<float>(l->numel(), 0));
  CHECK(resumed.nextRound() == 4);
}

TEST_CASE(
    "central DP with adaptive clipping: the clip follows the median update norm, each record "
    "says it, and a resume goes on from it",
    "[server][dp][adaptive]") {
  const auto l = layout();
  const size_t n = 40;
  // Client c's update: norm (c + 1) / 20, from 0.05 to 2; its median is about 1.
  const auto normed = [&](uint64_t c, uint64_t) {
    std::vector<float> x(l->numel(), 0.0f);
    x[c % l->numel()] = static_cast<float>((c + 1) / 20.0);
    return x;
  };
  testing::TempDir dir;
  server::EngineConfig c = dpConfig(1.0, 0.05, 1.0, 80, n);
  c.dp.adaptive_clip = true;
  c.checkpoint = (dir.path / "ck.bin").string();
  std::vector<double> clips;
  double after = 0;
  {
    VectorFleet fleet(l, n, normed);
    server::RoundEngine engine(l, c, std::vector<float>(l->numel(), 0));
    for (int r = 0; r < 60; ++r) {
      const server::RoundRecord rec = engine.runRound(fleet);
      REQUIRE(rec.applied);
      REQUIRE(rec.dp_clip.has_value());
      clips.push_back(*rec.dp_clip);
      CHECK(rec.metrics.count(server::kClipIndicator) == 0);  // the exact count is not released
    }
    after = engine.dp()->clip();
  }
  CHECK(clips.front() == 0.05);
  // Nearly every update over the clip at first: it grows every round until it nears the median.
  for (size_t i = 1; i < 15; ++i) CHECK(clips[i] > clips[i - 1]);
  // Then it stays near it: the count's noise (q N / 20 = 2 over 40 updates) and the steps of 0.2
  // keep it between 0.7 and 1.4 (the median is 1.025; 2,000 simulated walks of this noise never
  // left that band after round 45).
  for (size_t i = 45; i < 60; ++i) {
    CHECK(clips[i] > 0.7);
    CHECK(clips[i] < 1.4);
  }
  {
    VectorFleet fleet(l, n, normed);
    server::RoundEngine engine(l, c, std::vector<float>(l->numel(), 0));
    REQUIRE(engine.resumed());
    const server::RoundRecord rec = engine.runRound(fleet);
    CHECK(rec.round == 61);
    CHECK(*rec.dp_clip == after);  // where round 60 left it, not privacy.clip
  }
  auto fixed = c;
  fixed.dp.adaptive_clip = false;
  CHECK_THROWS_MATCHING(server::RoundEngine(l, fixed, std::vector<float>(l->numel(), 0)), IoError,
                        Contains("resume with it"));
  // And the other way: a run of fixed clips does not resume adapting.
  fixed.checkpoint = (dir.path / "fixed.bin").string();
  {
    VectorFleet fleet(l, n, normed);
    server::RoundEngine engine(l, fixed, std::vector<float>(l->numel(), 0));
    REQUIRE_FALSE(engine.runRound(fleet).dp_clip.has_value());
  }
  auto adapting = c;
  adapting.checkpoint = fixed.checkpoint;
  CHECK_THROWS_MATCHING(server::RoundEngine(l, adapting, std::vector<float>(l->numel(), 0)),
                        IoError, Contains("resume without privacy.adaptive_clip"));
  // Under secure aggregation each client masks its count (test_server [secagg][adaptive]).
  auto secure = dpConfig(1.0, 0.05, 1.0, 80, n);
  secure.dp.adaptive_clip = true;
  secure.secagg.enabled = true;
  secure.secagg.clip = 0.05;
  secure.scheme.rule = "fedavg:weight=uniform,clip=0.05";
  CHECK_NOTHROW(server::RoundEngine(l, secure, std::vector<float>(l->numel(), 0)));
}
