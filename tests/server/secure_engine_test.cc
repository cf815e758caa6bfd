// Secure aggregation in the round engine (EngineConfig::secagg, server/secure_round.h), against a
// fleet whose clients are real client sides (client::SecureParty) with updates the test chooses:
// the applied model is the plain mean within the ring's rounding, dropouts at each step leave the
// survivors' mean, too few survivors or a cheating client leave the round not applied with the
// reason, hostile replies are refused with their codes, and what is refused at configuration.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <iomanip>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "check_throws.h"
#include "client/secure_party.h"
#include "compression/registry.h"
#include "privacy/accountant.h"
#include "privacy/dp.h"
#include "privacy/shamir.h"
#include "protocol/secagg_wire.h"
#include "protocol/starling_generated.h"
#include "protocol/verify.h"
#include "server/engine.h"
#include "server/secure_relay.h"
#include "temp_dir.h"
#include "test_util.h"

using namespace starling;
using Catch::Matchers::Contains;
using server::SecureStage;

namespace {

std::shared_ptr<const ParamLayout> layout() {
  auto l = std::make_shared<ParamLayout>();
  l->add("w", {16, 8});
  l->add("b", {16});
  return l;
}

// `n` clients, always available; client c's update in round r is update(c, r). drop_at[c] = s:
// client c does not answer step s (and drops out of the rest).
class SecureFleet final : public server::Fleet {
 public:
  SecureFleet(std::shared_ptr<const ParamLayout> l, size_t n,
              std::function<std::vector<float>(uint64_t, uint64_t)> update)
      : layout_(std::move(l)), n_(n), update_(std::move(update)) {}

  std::map<uint64_t, SecureStage> drop_at;
  // Clients that drop at the first step of a round's later exchange (two-phase PowerSGD's phase Q).
  std::set<uint64_t> drop_later;
  // Replaces a client's reply before the engine gets it (an attacker's).
  std::function<std::vector<uint8_t>(SecureStage, uint64_t, std::vector<uint8_t>)> tamper;
  // Replaces the engine's request before a client gets it (a malicious root's or aggregator's).
  std::function<std::vector<uint8_t>(SecureStage, uint64_t, std::vector<uint8_t>)> tamper_request;
  // Each client's trust (secagg.threat, its credential); empty: semi-honest, unsigned.
  std::function<client::SecAggTrust(uint64_t)> trust;
  // The code of each request a client refused (it then answers nothing more this round).
  std::map<uint64_t, Errc> client_refused;
  std::map<uint64_t, std::vector<uint64_t>> completed;  // round -> masked inputs taken (phase 0)
  std::map<uint64_t, std::vector<uint64_t>> completed_later;  // the same, phase 1
  uint64_t refused = 0;
  std::map<uint64_t, Errc> root_refused;  // the code of each client's answer the round refused

  server::ClientPool waitForClients(size_t, std::chrono::milliseconds, uint64_t) override {
    std::vector<server::ClientInfo> out;
    for (uint64_t c = 0; c < n_; ++c) out.push_back({c, protocol::Role::kClient, 100, 10, 0});
    return out;
  }
  server::PhaseReport exchange(SecureStage stage, server::SecureSteps& round,
                               std::span<const server::ClientInfo> participants,
                               uint32_t) override {
    server::PhaseReport rep;
    if (stage == SecureStage::kAdvertise) {
      // A later phase's exchange: each client's party remembers its masked input of the phase
      // before, which that setup requires.
      later_ = round.round() == exchange_round_;
      exchange_round_ = round.round();
      if (!later_) parties_.clear();
    }
    for (const auto& c : participants) {
      if (dropsAt(c.id, stage)) {
        rep.failed.push_back(c.id);
        continue;
      }
      auto req = round.request(stage, c.id);
      if (tamper_request) req = tamper_request(stage, c.id, std::move(req));
      std::vector<uint8_t> ans;
      try {
        if (stage == SecureStage::kAdvertise)
          ans = parties_.try_emplace(c.id, c.id, trust ? trust(c.id) : client::SecAggTrust{})
                    .first->second.setup(req);
        else if (stage == SecureStage::kShareKeys)
          ans = parties_.at(c.id).shareKeys(req);
        else if (stage == SecureStage::kSurvivors)
          ans = parties_.at(c.id).signSurvivors(req);
        else
          ans = parties_.at(c.id).unmask(req);
      } catch (const InputError& e) {  // the client refuses the request: it answers nothing
        client_refused[c.id] = e.code();
        rep.failed.push_back(c.id);
        continue;
      }
      deliver(stage, round, c.id, std::move(ans), rep);
    }
    return rep;
  }
  server::PhaseReport runPhase(const server::PhaseTask& task,
                               std::span<const server::ClientInfo> participants, size_t,
                               aggregation::PhaseAggregator&) override {
    REQUIRE(task.secure != nullptr);  // under secagg no plain phase is run
    server::PhaseReport rep;
    for (const auto& c : participants) {
      if (dropsAt(c.id, SecureStage::kMaskedInput)) {
        rep.failed.push_back(c.id);
        continue;
      }
      const auto req = task.secure->request(SecureStage::kMaskedInput, c.id);
      // The metric only where the round declares it (not under distributed DP).
      std::vector<Metric> metrics;
      if (std::find(task.header.metrics.begin(), task.header.metrics.end(), "train_loss") !=
          task.header.metrics.end())
        metrics.push_back({"train_loss", 1.0 + static_cast<double>(c.id)});
      // The update as the round's compressor sends it, on the round's shared support.
      // (A compressor of several phases from the client's state: two-phase PowerSGD keeps M.)
      const auto comp = compression::makeCompressor(task.header.compressor);
      const auto ctx = task.broadcast.context(c.id);
      std::vector<compression::Payload> sent;
      if (comp->phases() > 1) {
        auto& st = states_.try_emplace(c.id, layout_->fingerprint()).first->second;
        sent = comp->compressWithFeedback(
            *layout_,
            task.header.phase == 0 ? update_(c.id, task.header.round) : std::vector<float>{}, st,
            ctx);
      } else {
        sent = comp->compress(*layout_, update_(c.id, task.header.round), ctx);
      }
      const auto x = client::secureInput(*layout_, *comp, ctx, sent);
      auto ans = parties_.at(c.id).mask(req, x, metrics);
      deliver(SecureStage::kMaskedInput, *task.secure, c.id, std::move(ans), rep);
    }
    if (task.header.phase == 0)
      for (uint64_t id : rep.completed) completed[task.header.round].push_back(id);
    else
      for (uint64_t id : rep.completed) completed_later[task.header.round].push_back(id);
    return rep;
  }
  server::EvalReport evaluate(const server::PhaseTask&, const server::ClientPool&) override {
    return {};
  }
  void finish(const std::string&) override {}

  std::map<uint64_t, client::SecureParty>& parties() { return parties_; }

 private:
  bool dropsAt(uint64_t id, SecureStage s) const {
    if (later_ && drop_later.count(id)) return true;
    const auto it = drop_at.find(id);
    return it != drop_at.end() && static_cast<int>(s) >= static_cast<int>(it->second);
  }
  void deliver(SecureStage stage, server::SecureSteps& round, uint64_t id, std::vector<uint8_t> ans,
               server::PhaseReport& rep) {
    if (tamper) ans = tamper(stage, id, std::move(ans));
    try {
      round.reply(stage, id, ans);
      rep.completed.push_back(id);
    } catch (const InputError& e) {
      ++rep.refused;
      ++refused;
      root_refused[id] = e.code();
      rep.failed.push_back(id);
    }
  }

  std::shared_ptr<const ParamLayout> layout_;
  std::map<uint64_t, ClientState> states_;  // a several-phase compressor's, per client
  uint64_t exchange_round_ = 0;             // the round of the last exchange
  bool later_ = false;                      // it is not the round's first
  size_t n_;
  std::function<std::vector<float>(uint64_t, uint64_t)> update_;
  std::map<uint64_t, client::SecureParty> parties_;
};

// The same clients in the clear: each update added to the round as it is sent (the root clips).
class PlainFleet final : public server::Fleet {
 public:
  PlainFleet(std::shared_ptr<const ParamLayout> l, size_t n,
             std::function<std::vector<float>(uint64_t, uint64_t)> update)
      : layout_(std::move(l)), n_(n), update_(std::move(update)) {}
  server::ClientPool waitForClients(size_t, std::chrono::milliseconds, uint64_t) override {
    std::vector<server::ClientInfo> out;
    for (uint64_t c = 0; c < n_; ++c) out.push_back({c, protocol::Role::kClient, 100, 10, 0});
    return out;
  }
  server::PhaseReport runPhase(const server::PhaseTask& task,
                               std::span<const server::ClientInfo> participants, size_t,
                               aggregation::PhaseAggregator& agg) override {
    REQUIRE(task.secure == nullptr);
    server::PhaseReport rep;
    for (const auto& p : participants) {
      const std::vector<float> x = update_(p.id, task.header.round);
      compression::Update u;
      u.header = {layout_->fingerprint(), task.header.round, 0, p.id, 100};
      for (size_t t = 0; t < layout_->size(); ++t) {
        const auto sl = layout_->slice(std::span<const float>(x), t);
        u.tensors.push_back(compression::DenseF32{{sl.begin(), sl.end()}});
      }
      agg.add(compression::view(u));
      rep.completed.push_back(p.id);
    }
    return rep;
  }
  server::EvalReport evaluate(const server::PhaseTask&, const server::ClientPool&) override {
    return {};
  }
  void finish(const std::string&) override {}

 private:
  std::shared_ptr<const ParamLayout> layout_;
  size_t n_;
  std::function<std::vector<float>(uint64_t, uint64_t)> update_;
};

server::EngineConfig secureConfig(uint64_t clients_per_round, double clip) {
  server::EngineConfig c;
  c.rounds = 1;
  c.scheme.compressor = "none";
  c.scheme.rule = "fedavg:weight=uniform";
  c.scheme.run_seed = 5;
  c.scheme.metrics = {"train_loss"};
  c.sampling.clients_per_round = clients_per_round;
  c.server_opt = "fedavg";
  c.secagg.enabled = true;
  c.secagg.clip = clip;
  return c;
}

// The ConfigError an engine of `c` is refused with at construction, or "accepted".
std::string engineRefusal(const std::shared_ptr<const ParamLayout>& l,
                          const server::EngineConfig& c) {
  try {
    server::RoundEngine engine(l, c, std::vector<float>(l->numel(), 0.0f));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

// Client c's update: distinct values of either sign, norm below 1.
std::vector<float> updateOf(uint64_t c, size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i)
    x[i] = static_cast<float>(0.02 * std::sin(0.7 * static_cast<double>(i) + 1.3 * c));
  return x;
}

// The low-rank tests' update of client c in round r: updateOf's sine, ten times larger (its
// factors of norm about 1).
std::vector<float> factorUpdate(uint64_t c, uint64_t r, size_t n) {
  auto x = updateOf(c + 7 * r, n);
  for (float& v : x) v *= 10;
  return x;
}

// The model after `rounds` FedAvg steps (server lr 1) of the dense mean of 12 clients'
// factorUpdates: what the low-rank runs must not reach (they move within the factors' span).
std::vector<double> denseFactorRuns(uint64_t rounds, size_t n) {
  std::vector<double> m(n, 0.0);
  for (uint64_t r = 1; r <= rounds; ++r)
    for (uint64_t id = 0; id < 12; ++id) {
      const auto x = factorUpdate(id, r, n);
      for (size_t i = 0; i < n; ++i) m[i] += x[i] / 12.0;
    }
  return m;
}

// The model after one FedAvg step (server lr 1) from zeros: the mean of `who`'s updates, in double.
std::vector<double> meanOf(const std::vector<uint64_t>& who, size_t n) {
  std::vector<double> m(n, 0.0);
  for (uint64_t c : who) {
    const auto x = updateOf(c, n);
    for (size_t i = 0; i < n; ++i) m[i] += x[i];
  }
  for (double& v : m) v /= static_cast<double>(who.size());
  return m;
}

double maxDiff(std::span<const float> a, const std::vector<double>& b) {
  double d = 0.0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

}  // namespace

TEST_CASE("secure aggregation: the engine applies the clients' mean, within the ring's rounding",
          "[secagg]") {
  const auto l = layout();
  const size_t n = l->numel();
  SecureFleet fleet(l, 12, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
  server::RoundEngine engine(l, secureConfig(12, 1.0), std::vector<float>(n, 0.0f));
  const server::RoundRecord rec = engine.runRound(fleet);
  REQUIRE(rec.applied);
  CHECK(rec.clients_completed == 12);
  CHECK(rec.uplink_bytes == 0);  // this fleet counts none; the simulator's do (sim test)
  std::vector<uint64_t> all(12);
  for (uint64_t c = 0; c < 12; ++c) all[c] = c;
  // The ring's scale for 12 clients of this model: a mean off by more than 12 / (12 scale) per
  // value would be a wrong sum, not rounding.
  const auto p = server::SecAggConfig{true, 0, 0, 32, 1.0, {}}.paramsFor(5, 1, 12, n);
  const double tol = 1.0 / p.ring.scale + 1e-7;
  CHECK(maxDiff(engine.model().server(), meanOf(all, n)) <= tol);
  // Not the plain sum's bits: the model is the ring's mean, so the check above is not vacuous:
  // another client's update out of the mean moves it far beyond the tolerance.
  std::vector<uint64_t> eleven(all.begin(), all.end() - 1);
  CHECK(maxDiff(engine.model().server(), meanOf(eleven, n)) > 100 * tol);
  // The declared metric is the survivors' plain mean (in the clear).
  REQUIRE(rec.train_loss.has_value());
  CHECK(*rec.train_loss == Approx(1.0 + 5.5));
}

namespace {

// Client c's trust under the malicious-server threat model: a signing key `authority` certified.
client::SecAggTrust certifiedTrust(const privacy::SigningKeyPair& authority, uint64_t c,
                                   bool require_signed = true) {
  client::SecAggTrust t;
  t.require_signed = require_signed;
  t.authority = authority.public_key;
  t.signer = privacy::SecAggSigner::certified(authority, c, privacy::randomKey());
  return t;
}

}  // namespace

TEST_CASE(
    "secure aggregation under the malicious-server threat model: signed rounds apply the mean, "
    "and the clients refuse a root that swaps a key or does not sign",
    "[secagg]") {
  const auto l = layout();
  const size_t n = l->numel();
  const privacy::SigningKeyPair authority = privacy::SigningKeyPair::generate();
  std::vector<uint64_t> all(12);
  for (uint64_t c = 0; c < 12; ++c) all[c] = c;
  const auto p = server::SecAggConfig{true, 0, 0, 32, 1.0, {}}.paramsFor(5, 1, 12, n);
  const double tol = 1.0 / p.ring.scale + 1e-7;
  server::EngineConfig config = secureConfig(12, 1.0);
  config.secagg.authority = authority.public_key;

  SECTION("signed, the round is the plain one") {
    SecureFleet fleet(l, 12, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    fleet.trust = [&](uint64_t c) { return certifiedTrust(authority, c); };
    server::RoundEngine engine(l, config, std::vector<float>(n, 0.0f));
    const server::RoundRecord rec = engine.runRound(fleet);
    REQUIRE(rec.applied);
    CHECK(rec.clients_completed == 12);
    CHECK(fleet.client_refused.empty());
    CHECK(maxDiff(engine.model().server(), meanOf(all, n)) <= tol);
  }
  SECTION(
      "signed, a client lost after sharing its keys: its neighbours reveal their pairwise "
      "keys with it, and the round is the others' mean") {
    SecureFleet fleet(l, 12, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    fleet.trust = [&](uint64_t c) { return certifiedTrust(authority, c); };
    fleet.drop_at[5] = SecureStage::kMaskedInput;
    // The unmask requests carry pairwise keys for client 5, never a share of its mask key.
    size_t pairwise = 0;
    fleet.tamper = [&](SecureStage st, uint64_t, std::vector<uint8_t> ans) {
      if (st == SecureStage::kUnmask)
        for (const auto& r : protocol::decodeSecAggReveal(ans).response.shares) {
          if (r.of == 5) CHECK(r.pairwise.has_value());
          pairwise += r.pairwise.has_value();
        }
      return ans;
    };
    server::RoundEngine engine(l, config, std::vector<float>(n, 0.0f));
    const server::RoundRecord rec = engine.runRound(fleet);
    REQUIRE(rec.applied);
    CHECK(rec.clients_completed == 11);
    CHECK(pairwise > 0);
    std::vector<uint64_t> others;
    for (uint64_t c : all)
      if (c != 5) others.push_back(c);
    CHECK(maxDiff(engine.model().server(), meanOf(others, n)) <= tol);
  }
  SECTION(
      "signed, a client lost after its masked input, before it signs the survivors: in the mean, "
      "its self mask removed by its neighbours") {
    SecureFleet fleet(l, 12, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    fleet.trust = [&](uint64_t c) { return certifiedTrust(authority, c); };
    fleet.drop_at[5] = SecureStage::kSurvivors;
    size_t lists = 0, signatures = 0;
    fleet.tamper_request = [&](SecureStage st, uint64_t, std::vector<uint8_t> req) {
      if (st == SecureStage::kSurvivors) {
        CHECK(protocol::decodeSecAggSurvivors(req).request.absent.empty());  // 5's input came
        ++lists;
      }
      if (st == SecureStage::kUnmask)
        for (const auto& sg : protocol::decodeSecAggUnmask(req).request.signatures) {
          CHECK(sg.client != 5);
          ++signatures;
        }
      return req;
    };
    server::RoundEngine engine(l, config, std::vector<float>(n, 0.0f));
    const server::RoundRecord rec = engine.runRound(fleet);
    REQUIRE(rec.applied);
    CHECK(lists == 11);
    CHECK(signatures >= 11 * p.threshold);
    CHECK(rec.clients_completed == 12);
    CHECK(maxDiff(engine.model().server(), meanOf(all, n)) <= tol);
  }
  SECTION(
      "a root that tells one client another survivors list: its signature is not of the "
      "others' list, it is asked nothing more, and the round goes on") {
    SecureFleet fleet(l, 12, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    fleet.trust = [&](uint64_t c) { return certifiedTrust(authority, c); };
    const uint64_t victim = 4;
    fleet.tamper_request = [&](SecureStage s, uint64_t c, std::vector<uint8_t> req) {
      if (s != SecureStage::kSurvivors || c != victim) return req;
      protocol::SecAggSurvivorsMsg m = protocol::decodeSecAggSurvivors(req);
      m.request.absent = {victim == 0 ? 1u : 0u};  // "client 0 dropped", to the victim alone
      return protocol::encode(m);
    };
    size_t unmasked = 0;
    fleet.tamper = [&](SecureStage s, uint64_t c, std::vector<uint8_t> ans) {
      if (s == SecureStage::kUnmask) {
        CHECK(c != victim);
        ++unmasked;
      }
      return ans;
    };
    server::RoundEngine engine(l, config, std::vector<float>(n, 0.0f));
    const server::RoundRecord rec = engine.runRound(fleet);
    CHECK(fleet.refused == 1);  // the victim's signature, by the root
    CHECK(fleet.root_refused.at(victim) == Errc::kBadSignature);
    CHECK(fleet.client_refused.empty());
    CHECK(unmasked == 11);
    REQUIRE(rec.applied);
    CHECK(rec.clients_completed == 12);  // its masked input is in the sum
    CHECK(maxDiff(engine.model().server(), meanOf(all, n)) <= tol);
  }
  SECTION("a root that swaps a neighbour's key is caught by the client it sends it to") {
    SecureFleet fleet(l, 12, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    fleet.trust = [&](uint64_t c) { return certifiedTrust(authority, c); };
    const uint64_t victim = 7;
    fleet.tamper_request = [&](SecureStage s, uint64_t c, std::vector<uint8_t> req) {
      if (s != SecureStage::kShareKeys || c != victim) return req;
      protocol::SecAggAdvertsMsg m = protocol::decodeSecAggAdverts(req, {});
      REQUIRE(!m.adverts.empty());
      m.adverts[0].mask_pk = privacy::DhKeyPair::generate().public_key;  // the root's own key
      return protocol::encode(m);
    };
    server::RoundEngine engine(l, config, std::vector<float>(n, 0.0f));
    const server::RoundRecord rec = engine.runRound(fleet);
    REQUIRE(fleet.client_refused.count(victim));
    CHECK(fleet.client_refused.at(victim) == Errc::kBadSignature);
    CHECK(fleet.client_refused.size() == 1);
    // It shares nothing with the swapped key; the round goes on without it.
    REQUIRE(rec.applied);
    CHECK(rec.clients_completed == 11);
    std::vector<uint64_t> others;
    for (uint64_t c : all)
      if (c != victim) others.push_back(c);
    CHECK(maxDiff(engine.model().server(), meanOf(others, n)) <= tol);
  }
  SECTION("a client that answers with keys signed under a key of its own is refused by the root") {
    SecureFleet fleet(l, 12, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    const privacy::SigningKeyPair rogue = privacy::SigningKeyPair::generate();
    fleet.trust = [&](uint64_t c) {
      // Client 4's credential is the rogue authority's (an invented client, a Sybil); it trusts
      // the real authority's for the others.
      client::SecAggTrust t = certifiedTrust(c == 4 ? rogue : authority, c);
      if (c == 4) t.authority = rogue.public_key;
      return t;
    };
    server::RoundEngine engine(l, config, std::vector<float>(n, 0.0f));
    const server::RoundRecord rec = engine.runRound(fleet);
    CHECK(fleet.refused == 1);  // its advert, at the root
    REQUIRE(rec.applied);
    CHECK(rec.clients_completed == 11);
  }
  SECTION("a root that does not sign its rounds is refused by every client that requires it") {
    SecureFleet fleet(l, 12, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    fleet.trust = [&](uint64_t c) { return certifiedTrust(authority, c); };
    server::RoundEngine engine(l, secureConfig(12, 1.0), std::vector<float>(n, 0.0f));
    const server::RoundRecord rec = engine.runRound(fleet);
    CHECK_FALSE(rec.applied);
    CHECK(fleet.client_refused.size() == 12);
    for (const auto& [c, code] : fleet.client_refused) CHECK(code == Errc::kUnsignedRound);
    CHECK(std::all_of(engine.model().server().begin(), engine.model().server().end(),
                      [](float v) { return v == 0.0f; }));
  }
  SECTION("a client that does not require signatures still runs them when it can") {
    SecureFleet fleet(l, 12, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    fleet.trust = [&](uint64_t c) { return certifiedTrust(authority, c, /*required=*/false); };
    server::RoundEngine engine(l, config, std::vector<float>(n, 0.0f));
    CHECK(engine.runRound(fleet).applied);
    // ... and one without a credential cannot: it refuses the signed setup.
    SecureFleet bare(l, 12, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    server::RoundEngine engine2(l, config, std::vector<float>(n, 0.0f));
    CHECK_FALSE(engine2.runRound(bare).applied);
    REQUIRE(bare.client_refused.size() == 12);
    CHECK(bare.client_refused.begin()->second == Errc::kNoCredential);
  }
}

TEST_CASE(
    "secure aggregation: a client under the malicious-server model takes no round or phase twice "
    "once it sent its masked input",
    "[secagg]") {
  const auto l = layout();
  const size_t n = l->numel();
  const privacy::SigningKeyPair authority = privacy::SigningKeyPair::generate();
  const std::vector<uint64_t> ids{0, 1, 2, 3, 4};
  std::map<uint64_t, client::SecureParty> parties;
  for (uint64_t c : ids) parties.try_emplace(c, c, certifiedTrust(authority, c));
  // A signed round of `clients`, driven by hand through the root's side (server/secure_round.h)
  // to its survivors step; `skip` send no masked input.
  const auto run = [&](uint64_t round, uint32_t phase, std::vector<uint64_t> clients = {},
                       std::set<uint64_t> skip = {}) {
    if (clients.empty()) clients = ids;
    privacy::SecAggParams params =
        server::SecAggConfig{true, 4, 3, 32, 1.0, authority.public_key}.paramsFor(
            5, round, clients.size(), n);
    params.phase = phase;
    server::SecureRound sr(params, clients, {}, {}, {}, &authority.public_key);
    std::map<uint64_t, Errc> refused;
    const auto step = [&](SecureStage st, auto&& answer) {
      for (uint64_t c : clients) {
        if (refused.count(c) || !sr.inStep(st, c)) continue;
        if (st == SecureStage::kMaskedInput && skip.count(c)) continue;
        try {
          sr.reply(st, c, answer(c, sr.request(st, c)));
        } catch (const InputError& e) {
          refused[c] = e.code();
        }
      }
    };
    step(SecureStage::kAdvertise, [&](uint64_t c, auto req) { return parties.at(c).setup(req); });
    step(SecureStage::kShareKeys,
         [&](uint64_t c, auto req) { return parties.at(c).shareKeys(req); });
    step(SecureStage::kMaskedInput, [&](uint64_t c, auto req) {
      return parties.at(c).mask(req, std::vector<float>(n, 0.01f * static_cast<float>(c)));
    });
    step(SecureStage::kSurvivors,
         [&](uint64_t c, auto req) { return parties.at(c).signSurvivors(req); });
    return refused;
  };
  const auto all = [](const std::map<uint64_t, Errc>& refused, size_t count, Errc code) {
    CHECK(refused.size() == count);
    for (const auto& [c, got] : refused) CHECK(got == code);
  };
  CHECK(run(7, 0).empty());
  // The round's next phase (two-phase PowerSGD's exchange for Q) among other clients than the
  // phase before's survivors (all five, as each signed): refused by the four asked.
  all(run(7, 1, {0, 1, 2, 3}), 4, Errc::kInconsistentSurvivors);
  // Among them, it is taken, once.
  CHECK(run(7, 1).empty());
  // The same phase again (a new nonce: another attempt), an earlier phase of the round, and an
  // earlier round: refused by all.
  for (const auto& [again, phase] :
       std::vector<std::pair<uint64_t, uint32_t>>{{7, 1}, {7, 0}, {6, 0}, {6, 1}}) {
    INFO("round " << again << " phase " << phase);
    all(run(again, phase), ids.size(), Errc::kWrongRound);
  }
  CHECK(run(8, 0).empty());  // the next round is taken
  // Its phase Q without client 4's masked input: the others sign no survivors list that names it
  // absent (a sum of four would differ from phase P's five by client 4's update).
  all(run(8, 1, ids, {4}), 4, Errc::kInconsistentSurvivors);
  // A phase-Q setup before the client masked phase P of the round (here, in an unsigned round):
  // refused, whatever the trust.
  std::map<uint64_t, client::SecureParty> fresh;
  for (uint64_t c : ids) fresh.try_emplace(c, c);
  privacy::SecAggParams p1 =
      server::SecAggConfig{true, 4, 3, 32, 1.0, {}}.paramsFor(5, 3, ids.size(), n);
  p1.phase = 1;
  server::SecureRound sr(p1, ids);
  for (uint64_t c : ids)
    CHECK(testing::codeOf([&] {
            (void)fresh.at(c).setup(sr.request(SecureStage::kAdvertise, c));
          }) == Errc::kWrongRound);
}

TEST_CASE("secure aggregation: a client's trust refuses what cannot protect it", "[secagg]") {
  const privacy::SigningKeyPair authority = privacy::SigningKeyPair::generate();
  client::SecAggTrust t = certifiedTrust(authority, 3);
  CHECK_NOTHROW(t.validate(3));
  // Certified for client 3, used by client 4.
  CHECK_THROWS_MATCHING(t.validate(4), ConfigError,
                        Contains("not the authority's for client id 4"));
  CHECK_THROWS_AS(client::SecureParty(4, t), ConfigError);
  // By another authority.
  client::SecAggTrust other = t;
  other.authority = privacy::SigningKeyPair::generate().public_key;
  CHECK_THROWS_AS(other.validate(3), ConfigError);
  // A certificate of another key than the one it signs with.
  client::SecAggTrust mixed = t;
  mixed.signer->key = privacy::SigningKeyPair::generate();
  CHECK_THROWS_MATCHING(mixed.validate(3), ConfigError, Contains("not of its signing key"));
  // Required, without an authority or a signing key.
  client::SecAggTrust no_authority = t;
  no_authority.authority.reset();
  CHECK_THROWS_MATCHING(no_authority.validate(3), ConfigError, Contains("secagg.authority"));
  client::SecAggTrust no_key = t;
  no_key.signer.reset();
  CHECK_THROWS_MATCHING(no_key.validate(3), ConfigError, Contains("signing key"));
}

TEST_CASE("secure aggregation of a shared support: the compressed mean from k ring words a client",
          "[secagg]") {
  const auto l = layout();
  const size_t n = l->numel();
  for (const char* spec : {"randblock:density=0.25", "randk:density=0.25,positions=shared"}) {
    DYNAMIC_SECTION(spec) {
      SecureFleet fleet(l, 12, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
      const auto comp = compression::makeCompressor(spec);
      // A quarter of each tensor: 32 of w's 128 values and 4 of b's 16.
      const uint64_t dim = server::secureDim(*comp, *l, 5, 1);
      CHECK(dim == 36);
      std::map<uint64_t, std::vector<uint8_t>> inputs;  // per client, what the root received
      fleet.tamper = [&](SecureStage s, uint64_t id, std::vector<uint8_t> ans) {
        if (s == SecureStage::kMaskedInput) inputs[id] = ans;
        return ans;
      };
      auto c = secureConfig(12, 1.0);
      c.scheme.compressor = spec;
      server::RoundEngine engine(l, c, std::vector<float>(n, 0.0f));
      const server::RoundRecord rec = engine.runRound(fleet);
      REQUIRE(rec.applied);
      REQUIRE(inputs.size() == 12);
      for (const auto& [id, bytes] : inputs) {
        // dim words, not the model's n: a masked input of n words would not decode, and the
        // message is smaller than the n words alone.
        CHECK(protocol::decodeSecAggMasked(bytes, dim).input.words.size() == dim);
        CHECK(testing::codeOf([&] { (void)protocol::decodeSecAggMasked(bytes, n); }) ==
              Errc::kSizeMismatch);
        CHECK(bytes.size() < 4 * n);
      }
      // The mean of what each client's compressor sent (its own block or positions of the
      // round), in double, within the ring's rounding for 12 clients of dim values.
      std::vector<double> want(n, 0.0);
      for (uint64_t id = 0; id < 12; ++id) {
        const compression::RoundContext ctx{5, 1, 0, id, nullptr};
        const auto sent = testing::densify(*l, comp->compress(*l, updateOf(id, n), ctx), nullptr);
        for (size_t i = 0; i < n; ++i) want[i] += sent[i] / 12.0;
      }
      const auto p = server::SecAggConfig{true, 0, 0, 32, 1.0, {}}.paramsFor(5, 1, 12, dim);
      const double tol = 1.0 / p.ring.scale + 1e-7;
      CHECK(maxDiff(engine.model().server(), want) <= tol);
      // Off the support nothing moved; on it the mean is not the dense one (the check above is
      // not the dense test's again).
      size_t moved = 0;
      for (size_t i = 0; i < n; ++i) moved += engine.model().server()[i] != 0.0f;
      CHECK(moved <= dim);
      std::vector<uint64_t> all(12);
      for (uint64_t id = 0; id < 12; ++id) all[id] = id;
      CHECK(maxDiff(engine.model().server(), meanOf(all, n)) > 100 * tol);
    }
  }
}

TEST_CASE(
    "secure aggregation of acpsgd: each round's one factor a client, summed securely, moves the "
    "model as the factor sums in the clear do",
    "[secagg]") {
  const auto l = layout();
  const size_t n = l->numel();
  const std::string spec = "acpsgd:rank=2,ef=false";
  const auto comp = compression::makeCompressor(spec);
  const auto update = [&](uint64_t c, uint64_t r) { return factorUpdate(c, r, n); };
  SecureFleet fleet(l, 12, update);
  std::map<uint64_t, std::vector<uint8_t>> last;  // per client, its last masked input
  fleet.tamper = [&](SecureStage s, uint64_t id, std::vector<uint8_t> ans) {
    if (s == SecureStage::kMaskedInput) last[id] = ans;
    return ans;
  };
  auto c = secureConfig(12, 5.0);
  c.scheme.compressor = spec;
  c.rounds = 3;
  server::RoundEngine engine(l, c, std::vector<float>(n, 0.0f));
  // w (16 x 8) is factored at rank 2, b (16) goes whole: the shared side alternates, Q first.
  CHECK(server::secureDim(*comp, *l, 5, 1) == 16 * 2 + 16);
  {
    // A wider matrix (8 x 16): the second side is the larger, and the one the ring must hold.
    auto wide = std::make_shared<ParamLayout>();
    wide->add("w", {8, 16});
    wide->add("b", {16});
    CHECK(server::secureDim(*comp, *wide, 5, 1) == 16 * 2 + 16);
    compression::SharedFactors first = comp->initialShared(*wide, 5);
    CHECK(comp->secureSize(*wide, compression::RoundContext{5, 1, 0, 0, &first}) == 8 * 2 + 16);
  }
  // The same three rounds in the clear, in double: each client's factor against the round's
  // shared one (the compressor's own encoding), their mean applied, their sum the next shared.
  compression::SharedFactors shared = comp->initialShared(*l, 5);
  std::vector<double> want(n, 0.0);
  for (uint64_t r = 1; r <= 3; ++r) {
    INFO("round " << r);
    last.clear();
    const server::RoundRecord rec = engine.runRound(fleet);
    REQUIRE(rec.applied);
    const compression::RoundContext ctx{5, r, 0, 0, &shared};
    const size_t dim = comp->secureSize(*l, ctx);
    CHECK(dim == (r % 2 == 1 ? 16 * 2 + 16 : 8 * 2 + 16));  // P (16 x 2), then Q (8 x 2)
    REQUIRE(last.size() == 12);
    for (const auto& [id, bytes] : last)
      CHECK(protocol::decodeSecAggMasked(bytes, dim).input.words.size() == dim);
    std::vector<double> sum(dim, 0.0);
    for (uint64_t id = 0; id < 12; ++id) {
      const compression::RoundContext cc{5, r, 0, id, &shared};
      const auto sent = comp->compress(*l, update(id, r), cc);
      const auto x = comp->secureValues(*l, cc, sent);
      for (size_t i = 0; i < dim; ++i) sum[i] += x[i];
      const auto dense = testing::densify(*l, sent, &shared);
      for (size_t i = 0; i < n; ++i) want[i] += dense[i] / 12.0;
    }
    // The engine's model: the mean of the clients' P Q-hat^T (or P-hat Q^T), within the ring's
    // rounding carried through the factors.
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::fabs(v));
    REQUIRE(scale > 0);
    CHECK(maxDiff(engine.model().server(), want) <= 1e-4 * scale);
    std::vector<float> fsum(sum.begin(), sum.end());
    const auto payloads = comp->securePayloads(*l, ctx, fsum);
    std::vector<std::vector<float>> factor_sums(l->size());
    for (size_t t = 0; t < l->size(); ++t)
      if (const auto* lr = std::get_if<compression::LowRank>(&payloads[t]))
        factor_sums[t] = lr->p.empty() ? lr->q : lr->p;
    std::vector<std::span<const float>> spans(factor_sums.begin(), factor_sums.end());
    shared = comp->nextShared(*l, ctx, shared, spans, 12.0);
  }
  // Not the dense mean: the model moved within the factors' span only.
  CHECK(maxDiff(engine.model().server(), denseFactorRuns(3, n)) > 1e-2);
}

TEST_CASE(
    "secure aggregation of two-phase powersgd: phase P and phase Q each a secure sum of its own, "
    "the model as the phase sums in the clear move it, and a client lost between the phases voids "
    "the round before phase Q is unmasked",
    "[secagg]") {
  const auto l = layout();
  const size_t n = l->numel();
  // Rank 1: every client's update is a sine across the flattened w, of rank 2 as a matrix, so
  // rank 2 would send it whole and the model would be the dense mean.
  const std::string spec = "powersgd:rank=1,ef=false";
  const auto comp = compression::makeCompressor(spec);
  const auto update = [&](uint64_t c, uint64_t r) { return factorUpdate(c, r, n); };
  // w (16 x 8) is factored at rank 1, b (16) goes whole in phase P: P and b, then Q alone.
  CHECK(server::secureDim(*comp, *l, 5, 1) == 16 + 16);
  {
    {
      SecureFleet fleet(l, 12, update);
      // Each exchange's setup, per client: its round and phase, and its nonce.
      std::map<uint64_t, std::vector<std::pair<uint32_t, uint64_t>>> setups;
      std::map<std::pair<uint64_t, uint32_t>, size_t> words;  // (client, phase) -> masked words
      uint32_t phase_now = 0;
      fleet.tamper_request = [&](SecureStage st, uint64_t id, std::vector<uint8_t> req) {
        if (st == SecureStage::kAdvertise) {
          const auto m = protocol::decodeSecAggSetup(req);
          setups[id].emplace_back(m.params.phase, m.nonce);
          phase_now = m.params.phase;
        }
        return req;
      };
      fleet.tamper = [&](SecureStage st, uint64_t id, std::vector<uint8_t> ans) {
        if (st == SecureStage::kMaskedInput)
          words[{id, phase_now}] =
              protocol::decodeSecAggMasked(ans, phase_now == 0 ? 32 : 8).input.words.size();
        return ans;
      };
      auto c = secureConfig(12, 5.0);
      c.scheme.compressor = spec;
      c.rounds = 3;
      server::RoundEngine engine(l, c, std::vector<float>(n, 0.0f));
      // The same three rounds in the clear, in double: each client's P against the shared Q, their
      // sum orthonormalized to P-hat; each (but the lost) client's Q against P-hat, their mean
      // times P-hat, and b's mean, applied; the mean Q, orthonormalized, the next shared.
      compression::SharedFactors shared = comp->initialShared(*l, 5);
      std::map<uint64_t, ClientState> states;
      std::vector<double> want(n, 0.0);
      for (uint64_t r = 1; r <= 3; ++r) {
        INFO("round " << r);
        setups.clear();
        words.clear();
        const server::RoundRecord rec = engine.runRound(fleet);
        REQUIRE(rec.applied);
        CHECK(rec.clients_failed == 0);
        CHECK(rec.clients_completed == 12);
        // Two exchanges a round, phase 0 then phase 1, each with a nonce of its own.
        for (uint64_t id = 0; id < 12; ++id) {
          INFO("client " << id);
          REQUIRE(setups[id].size() == 2);
          CHECK(setups[id][0].first == 0);
          CHECK(words[{id, 0}] == 16 + 16);
          CHECK(setups[id][1].first == 1);
          CHECK(setups[id][1].second != setups[id][0].second);
          CHECK(words[{id, 1}] == 8);
        }
        const compression::RoundContext c0{5, r, 0, 0, &shared};
        std::vector<double> sum0(comp->secureSize(*l, c0), 0.0);
        for (uint64_t id = 0; id < 12; ++id) {
          const compression::RoundContext cc{5, r, 0, id, &shared};
          auto& st = states.try_emplace(id, l->fingerprint()).first->second;
          const auto x =
              comp->secureValues(*l, cc, comp->compressWithFeedback(*l, update(id, r), st, cc));
          for (size_t i = 0; i < x.size(); ++i) sum0[i] += x[i];
        }
        const auto p0 = comp->securePayloads(*l, c0, std::vector<float>(sum0.begin(), sum0.end()));
        std::vector<std::vector<float>> psums(l->size());
        for (size_t t = 0; t < l->size(); ++t)
          if (const auto* lr = std::get_if<compression::LowRank>(&p0[t])) psums[t] = lr->p;
        std::vector<std::span<const float>> pspans(psums.begin(), psums.end());
        const compression::SharedFactors phat = comp->nextShared(*l, c0, shared, pspans, 12.0);
        const compression::RoundContext c1{5, r, 1, 0, &phat};
        std::vector<double> sum1(comp->secureSize(*l, c1), 0.0);
        double in1 = 0;
        for (uint64_t id = 0; id < 12; ++id) {
          const compression::RoundContext cc{5, r, 1, id, &phat};
          const auto x =
              comp->secureValues(*l, cc, comp->compressWithFeedback(*l, {}, states.at(id), cc));
          for (size_t i = 0; i < x.size(); ++i) sum1[i] += x[i];
          ++in1;
        }
        std::vector<float> mean1(sum1.size());
        for (size_t i = 0; i < sum1.size(); ++i) mean1[i] = static_cast<float>(sum1[i] / in1);
        const auto p1 = comp->securePayloads(*l, c1, mean1);
        const auto step = testing::densify(*l, p1, &phat);  // P-hat times the mean Q; b: nothing
        for (size_t i = 0; i < n; ++i) want[i] += step[i];
        const auto& bsum = std::get<compression::DenseF32>(p0[1]).values;
        for (size_t i = 0; i < bsum.size(); ++i) want[(*l)[1].offset + i] += bsum[i] / 12.0;
        std::vector<std::vector<float>> qsums(l->size());
        for (size_t t = 0; t < l->size(); ++t)
          if (const auto* lr = std::get_if<compression::LowRank>(&p1[t])) qsums[t] = lr->q;
        std::vector<std::span<const float>> qspans(qsums.begin(), qsums.end());
        shared = comp->nextShared(*l, c1, phat, qspans, in1);
        double scale = 0;
        for (double v : want) scale = std::max(scale, std::fabs(v));
        REQUIRE(scale > 0);
        CHECK(maxDiff(engine.model().server(), want) <= 1e-4 * scale);
      }
      // Not the dense mean: the model moved within the factors' span only.
      CHECK(maxDiff(engine.model().server(), denseFactorRuns(3, n)) > 1e-2);
    }
  }
  // Client 3 sends its masked P and is lost before phase Q: a phase-Q sum of the other eleven
  // would differ from phase P's clients' by P-hat^T M_3 Q, r x r values of client 3's update
  // alone. The round stops before anything of phase Q is unmasked, and is not applied.
  SecureFleet fleet(l, 12, update);
  fleet.drop_later = {3};
  std::map<uint32_t, int> unmask_requests;  // phase -> unmask requests sent
  uint32_t phase_now = 0;
  fleet.tamper_request = [&](SecureStage st, uint64_t, std::vector<uint8_t> req) {
    if (st == SecureStage::kAdvertise) phase_now = protocol::decodeSecAggSetup(req).params.phase;
    if (st == SecureStage::kUnmask) ++unmask_requests[phase_now];
    return req;
  };
  auto c = secureConfig(12, 5.0);
  c.scheme.compressor = spec;
  c.rounds = 1;
  server::RoundEngine engine(l, c, std::vector<float>(n, 0.0f));
  const server::RoundRecord rec = engine.runRound(fleet);
  INFO(rec.reason);
  CHECK_FALSE(rec.applied);
  CHECK_THAT(rec.reason, Contains("phase 1") && Contains("nothing of it is unmasked"));
  CHECK(rec.clients_failed == 1);
  CHECK(unmask_requests[0] == 12);  // phase P's sum was unmasked (the P sum alone: A Q)
  CHECK(unmask_requests[1] == 0);   // phase Q's never
  CHECK(fleet.completed_later.at(1).size() == 11);
  CHECK(std::all_of(engine.model().server().begin(), engine.model().server().end(),
                    [](float v) { return v == 0.0f; }));
}

TEST_CASE("secure aggregation: dropouts at each step leave the survivors' mean", "[secagg]") {
  const auto l = layout();
  const size_t n = l->numel();
  for (const SecureStage s : {SecureStage::kAdvertise, SecureStage::kShareKeys,
                              SecureStage::kMaskedInput, SecureStage::kUnmask}) {
    DYNAMIC_SECTION("a client drops at " << server::stageName(s)) {
      SecureFleet fleet(l, 12, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
      fleet.drop_at[3] = s;
      fleet.drop_at[7] = s;
      server::RoundEngine engine(l, secureConfig(12, 1.0), std::vector<float>(n, 0.0f));
      const server::RoundRecord rec = engine.runRound(fleet);
      REQUIRE(rec.applied);
      // A client lost at the unmask step is in the sum: not failed.
      CHECK(rec.clients_failed == (s == SecureStage::kUnmask ? 0u : 2u));
      // Who is in the sum: everyone who sent a masked input (a client lost after it is unmasked
      // by its neighbours' shares of its seed).
      std::vector<uint64_t> in = fleet.completed.at(1);
      CHECK(in.size() == (s == SecureStage::kUnmask ? 12u : 10u));
      CHECK(rec.clients_completed == in.size());
      const auto p = server::SecAggConfig{true, 0, 0, 32, 1.0, {}}.paramsFor(5, 1, 12, n);
      CHECK(maxDiff(engine.model().server(), meanOf(in, n)) <= 1.0 / p.ring.scale + 1e-7);
    }
  }
}

TEST_CASE("secure aggregation: too few survivors, too few clients, or a cheat apply nothing",
          "[secagg]") {
  const auto l = layout();
  const size_t n = l->numel();
  SECTION("most clients drop after masking: their masks cannot be removed") {
    SecureFleet fleet(l, 8, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    for (uint64_t c = 0; c < 6; ++c) fleet.drop_at[c] = SecureStage::kUnmask;
    server::RoundEngine engine(l, secureConfig(8, 1.0), std::vector<float>(n, 0.0f));
    const server::RoundRecord rec = engine.runRound(fleet);
    CHECK_FALSE(rec.applied);
    CHECK_THAT(rec.reason, Contains("secure aggregation"));
    CHECK(engine.model().version() == 1);
    for (float v : engine.model().server()) REQUIRE(v == 0.0f);
  }
  SECTION("a threshold the round's clients cannot meet") {
    SecureFleet fleet(l, 4, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    auto c = secureConfig(4, 1.0);
    c.secagg.threshold = 4;  // each of 4 clients has 3 neighbours
    server::RoundEngine engine(l, c, std::vector<float>(n, 0.0f));
    const server::RoundRecord rec = engine.runRound(fleet);
    CHECK_FALSE(rec.applied);
    CHECK_THAT(rec.reason, Contains("secagg.threshold = 4 does not fit a round of 4 clients"));
  }
  SECTION("a round of two clients") {
    SecureFleet fleet(l, 2, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    server::RoundEngine engine(l, secureConfig(2, 1.0), std::vector<float>(n, 0.0f));
    const server::RoundRecord rec = engine.runRound(fleet);
    CHECK_FALSE(rec.applied);
    CHECK_THAT(rec.reason, Contains("at least 3 clients"));
  }
  SECTION("a client masks an update far beyond the clip: the sum's norm gives it away") {
    SecureFleet fleet(l, 6, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    // Client 2 encodes, not its clipped update, but words for values of the clip everywhere
    // (each within the ring's per-value bound, far over its L2 bound).
    fleet.tamper = [&](SecureStage s, uint64_t id, std::vector<uint8_t> ans) {
      if (s != SecureStage::kMaskedInput || id != 2) return ans;
      protocol::SecAggMaskedMsg m = protocol::decodeSecAggMasked(ans, n);
      const auto& p = fleet.parties().at(2).params();
      const uint64_t big = static_cast<uint64_t>(std::floor(p.ring.scale * p.ring.clip));
      for (auto& w : m.input.words) w = (w + big) & p.ring.mask();
      return protocol::encode(m);
    };
    server::RoundEngine engine(l, secureConfig(6, 1.0), std::vector<float>(n, 0.0f));
    const server::RoundRecord rec = engine.runRound(fleet);
    CHECK_FALSE(rec.applied);
    CHECK_THAT(rec.reason, Contains("a client masked an update it had not clipped"));
  }
}

TEST_CASE("secure aggregation: a client revealing wrong shares is decoded around and counted",
          "[secagg]") {
  const auto l = layout();
  const size_t n = l->numel();
  // 12 clients: 8 neighbours each, threshold 5, so one wrong share of a secret's 8 is corrected.
  SecureFleet fleet(l, 12, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
  fleet.tamper = [&](SecureStage s, uint64_t id, std::vector<uint8_t> ans) {
    if (s != SecureStage::kUnmask || id != 3) return ans;
    protocol::SecAggRevealMsg m = protocol::decodeSecAggReveal(ans);
    for (auto& r : m.response.shares) r.share.y[2] = (r.share.y[2] + 1) % privacy::kShamirPrime;
    return protocol::encode(m);
  };
  server::RoundEngine engine(l, secureConfig(12, 1.0), std::vector<float>(n, 0.0f));
  const server::RoundRecord rec = engine.runRound(fleet);
  REQUIRE(rec.applied);
  CHECK(rec.secagg_wrong_shares == std::vector<uint64_t>{3});  // decoded around, named
  CHECK(rec.json().find("\"secagg_wrong_shares\":[3]") != std::string::npos);
  CHECK(rec.updates_rejected == 0);
  CHECK(rec.clients_completed == 12);  // its update is in the sum
  std::vector<uint64_t> all(12);
  for (uint64_t c = 0; c < 12; ++c) all[c] = c;
  const auto p = server::SecAggConfig{true, 0, 0, 32, 1.0, {}}.paramsFor(5, 1, 12, n);
  CHECK(maxDiff(engine.model().server(), meanOf(all, n)) <= 1.0 / p.ring.scale + 1e-7);
}

TEST_CASE("secure aggregation: hostile replies are refused with their codes", "[secagg]") {
  const auto l = layout();
  const size_t n = l->numel();
  const auto p = server::SecAggConfig{true, 0, 0, 32, 1.0, {}}.paramsFor(5, 1, 6, n);
  const std::vector<uint64_t> ids{0, 1, 2, 3, 4, 5};
  server::SecureRound round(p, ids, server::SecureMetricRules{{"train_loss"}, 1e9});
  std::map<uint64_t, client::SecureParty> parties;
  std::map<uint64_t, std::vector<uint8_t>> keys;
  for (uint64_t c : ids)
    keys[c] =
        parties.try_emplace(c, c).first->second.setup(round.request(SecureStage::kAdvertise, c));
  // Client 1's keys claimed by client 0's connection.
  CHECK(testing::codeOf([&] { round.reply(SecureStage::kAdvertise, 0, keys[1]); }) ==
        Errc::kWrongSender);
  // Keys from another exchange of this round (a restarted root's earlier run): another nonce.
  server::SecureRound earlier(p, ids);
  client::SecureParty other(0);
  const auto old_keys = other.setup(earlier.request(SecureStage::kAdvertise, 0));
  CHECK(testing::codeOf([&] { round.reply(SecureStage::kAdvertise, 0, old_keys); }) == Errc::kLate);
  // Another step's message in its place.
  CHECK(testing::codeOf([&] {
          round.reply(SecureStage::kAdvertise, 0, round.request(SecureStage::kAdvertise, 0));
        }) == Errc::kUnexpectedMessage);
  for (uint64_t c : ids) round.reply(SecureStage::kAdvertise, c, keys[c]);
  CHECK(testing::codeOf([&] { round.reply(SecureStage::kAdvertise, 0, keys[0]); }) ==
        Errc::kDuplicate);
  for (uint64_t c : ids)
    round.reply(SecureStage::kShareKeys, c,
                parties.at(c).shareKeys(round.request(SecureStage::kShareKeys, c)));
  // A masked input while the share-keys step is still open: unexpected, and it closes nothing.
  protocol::SecAggMaskedMsg early;
  early.client = 5;
  early.bits = p.ring.bits;
  early.input.round = 1;
  early.input.clients = {5};
  early.input.words.assign(n, 0);
  CHECK(testing::codeOf([&] {
          round.reply(SecureStage::kMaskedInput, 5, protocol::encode(early));
        }) == Errc::kUnexpectedMessage);
  // A masked input of another length is refused before it is unpacked (the step now open).
  (void)round.request(SecureStage::kMaskedInput, 0);
  protocol::SecAggMaskedMsg bad;
  bad.client = 0;
  bad.bits = p.ring.bits;
  bad.input.round = 1;
  bad.input.clients = {0};
  bad.input.words.assign(n - 1, 0);
  CHECK(testing::codeOf([&] {
          round.reply(SecureStage::kMaskedInput, 0, protocol::encode(bad));
        }) == Errc::kSizeMismatch);
  // Shares addressed to client 1 given to client 0: its side refuses them.
  const auto to1 = round.request(SecureStage::kMaskedInput, 1);
  CHECK(testing::codeOf([&] { (void)parties.at(0).mask(to1, updateOf(0, n)); }) ==
        Errc::kWrongSender);
  // A masked input naming other contributors than its sender.
  auto m0 = parties.at(0).mask(round.request(SecureStage::kMaskedInput, 0), updateOf(0, n));
  protocol::SecAggMaskedMsg two = protocol::decodeSecAggMasked(m0, n);
  two.input.clients = {0, 1};
  CHECK(testing::codeOf([&] {
          round.reply(SecureStage::kMaskedInput, 0, protocol::encode(two));
        }) == Errc::kWrongSender);
  // Metrics in the clear: a name the round did not declare, or a value beyond the bound.
  const auto withMetric = [&](const std::string& name, double v) {
    protocol::SecAggMaskedMsg x = protocol::decodeSecAggMasked(m0, n);
    x.metrics = {{name, v}};
    return protocol::encode(x);
  };
  CHECK(testing::codeOf([&] {
          round.reply(SecureStage::kMaskedInput, 0, withMetric("accuracy", 0.5));
        }) == Errc::kUnexpectedEncoding);
  CHECK(testing::codeOf([&] {
          round.reply(SecureStage::kMaskedInput, 0, withMetric("train_loss", 1e300));
        }) == Errc::kValueTooLarge);
  round.reply(SecureStage::kMaskedInput, 0, m0);
  CHECK(testing::codeOf([&] { round.reply(SecureStage::kMaskedInput, 0, m0); }) ==
        Errc::kDuplicate);
  // A reply of a step already past is late.
  CHECK(testing::codeOf([&] { round.reply(SecureStage::kAdvertise, 0, keys[0]); }) == Errc::kLate);
  // The early masked input closed nothing: the others' honest inputs, the unmasking, the sum.
  for (uint64_t c : ids)
    if (c != 0)
      round.reply(SecureStage::kMaskedInput, c,
                  parties.at(c).mask(round.request(SecureStage::kMaskedInput, c), updateOf(c, n)));
  for (uint64_t c : ids)
    round.reply(SecureStage::kUnmask, c,
                parties.at(c).unmask(round.request(SecureStage::kUnmask, c)));
  const server::SecureRound::Outcome out = round.finish();
  REQUIRE(out.ok);
  CHECK(out.survivors == ids);
}

TEST_CASE("secure aggregation: a low-order advertised key is refused before a neighbour sees it",
          "[secagg]") {
  const size_t n = 40;
  const auto p = server::SecAggConfig{true, 0, 0, 32, 1.0, {}}.paramsFor(5, 1, 4, n);
  const std::vector<uint64_t> ids{0, 1, 2, 3};
  server::SecureRound round(p, ids);
  client::SecureParty party(2);
  protocol::SecAggKeysMsg k =
      protocol::decodeSecAggKeys(party.setup(round.request(SecureStage::kAdvertise, 2)));
  for (const bool cipher : {true, false}) {
    protocol::SecAggKeysMsg bad = k;
    (cipher ? bad.advert.cipher_pk : bad.advert.mask_pk).fill(0);  // the identity: low order
    CHECK(testing::codeOf([&] {
            round.reply(SecureStage::kAdvertise, 2, protocol::encode(bad));
          }) == Errc::kMalformed);
  }
  round.reply(SecureStage::kAdvertise, 2, protocol::encode(k));  // its own keys still taken
  CHECK(round.answered(SecureStage::kAdvertise).count(2) == 1);
}

TEST_CASE("secure aggregation: one client's metric beyond the bound drops that client only",
          "[secagg]") {
  const auto l = layout();
  const size_t n = l->numel();
  SecureFleet fleet(l, 8, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
  fleet.tamper = [&](SecureStage s, uint64_t id, std::vector<uint8_t> ans) {
    if (s != SecureStage::kMaskedInput || id != 4) return ans;
    protocol::SecAggMaskedMsg m = protocol::decodeSecAggMasked(ans, n);
    m.metrics = {{"train_loss", 1e300}};
    return protocol::encode(m);
  };
  server::RoundEngine engine(l, secureConfig(8, 1.0), std::vector<float>(n, 0.0f));
  const server::RoundRecord rec = engine.runRound(fleet);
  REQUIRE(rec.applied);
  CHECK(rec.clients_completed == 7);
  CHECK(rec.updates_rejected == 1);
  CHECK(rec.clients_failed == 1);
  const std::vector<uint64_t> in{0, 1, 2, 3, 5, 6, 7};
  const auto p = server::SecAggConfig{true, 0, 0, 32, 1.0, {}}.paramsFor(5, 1, 8, n);
  CHECK(maxDiff(engine.model().server(), meanOf(in, n)) <= 1.0 / p.ring.scale + 1e-7);
}

TEST_CASE("secure aggregation: masked words pack to their bits and back, 8 to 64 bits",
          "[secagg]") {
  for (const uint32_t bits : {8u, 31u, 32u, 33u, 63u, 64u}) {
    const uint64_t mask = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
    protocol::SecAggMaskedMsg m;
    m.client = 3;
    m.nonce = 1;
    m.bits = bits;
    m.input.round = 2;
    m.input.clients = {3};
    for (uint64_t i = 0; i < 257; ++i) m.input.words.push_back((i * 0x9e3779b97f4a7c15ull) & mask);
    m.input.words[0] = mask;  // every bit set
    m.input.words[1] = 0;
    const auto bytes = protocol::encode(m);
    CHECK(protocol::decodeSecAggMasked(bytes, 257).input.words == m.input.words);
  }
}

TEST_CASE("secure aggregation: the wire messages round-trip and refuse malformed ones",
          "[secagg]") {
  protocol::SecAggMaskedMsg m;
  m.client = 9;
  m.nonce = 77;
  m.bits = 37;
  m.input.round = 4;
  m.input.clients = {9};
  const uint64_t mask = (uint64_t{1} << 37) - 1;
  for (uint64_t i = 0; i < 101; ++i) m.input.words.push_back((i * 0x9e3779b97f4a7c15ull) & mask);
  m.metrics = {{"train_loss", 0.25}};
  const auto bytes = protocol::encode(m);
  // 101 words of 37 bits: 468 bytes of payload, not 808 as 64-bit words would take.
  CHECK(bytes.size() < 101 * 5 + 200);
  const protocol::SecAggMaskedMsg back = protocol::decodeSecAggMasked(bytes, 101);
  CHECK(back.input.words == m.input.words);
  CHECK(back.client == 9);
  CHECK(back.nonce == 77);
  CHECK(back.input.round == 4);
  CHECK(back.metrics.size() == 1);
  CHECK(protocol::secAggMaskedBytes(101, 37, 9, m.metrics) == bytes.size());
  CHECK(testing::codeOf([&] { (void)protocol::decodeSecAggMasked(bytes, 100); }) ==
        Errc::kSizeMismatch);
  m.metrics = {{"train_loss", std::nan("")}};
  CHECK(testing::codeOf([&] { (void)protocol::decodeSecAggMasked(protocol::encode(m), 101); }) ==
        Errc::kNonFinite);
  m.metrics.clear();
  m.input.clients = {9, 9};
  CHECK(testing::codeOf([&] { (void)protocol::decodeSecAggMasked(protocol::encode(m), 101); }) ==
        Errc::kDuplicate);
  // A setup whose threshold exceeds its neighbours is refused by the client's decoder.
  const auto p = server::SecAggConfig{true, 4, 0, 32, 1.0, {}}.paramsFor(5, 1, 10, 100);
  protocol::SecAggSetupMsg s{1, p, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}};
  // The phase travels (two-phase PowerSGD's second exchange of a round); absent, it is 0.
  s.params.phase = 1;
  CHECK(protocol::decodeSecAggSetup(protocol::encode(s)).params.phase == 1);
  s.params.phase = 0;
  CHECK(protocol::decodeSecAggSetup(protocol::encode(s)).params.phase == 0);
  // And whether the input's last value is the clip count (adaptive clipping).
  s.params.clip_count = true;
  CHECK(protocol::decodeSecAggSetup(protocol::encode(s)).params.clip_count);
  s.params.clip_count = false;
  CHECK_FALSE(protocol::decodeSecAggSetup(protocol::encode(s)).params.clip_count);
  s.params.threshold = 9;
  CHECK(testing::codeOf([&] { (void)protocol::decodeSecAggSetup(protocol::encode(s)); }) ==
        Errc::kMissingField);
  // A setup of another derivation of the keys and masks (another build's) is refused, not run to
  // a wrong sum; an older root's, which names none, too.
  s.params.threshold = 3;
  REQUIRE_NOTHROW(protocol::decodeSecAggSetup(protocol::encode(s)));
  for (const uint32_t derivation : {0u, privacy::kSecAggDerivation + 1}) {
    flatbuffers::FlatBufferBuilder b(512);
    const auto& q = s.params;
    auto clients = b.CreateVector(s.clients);
    auto body = wire::CreateSecAggSetup(b, q.round, s.nonce, q.run_seed, q.neighbours, q.threshold,
                                        q.ring.bits, q.ring.scale, q.ring.clip, q.ring.max_clients,
                                        q.ring.dim, q.signed_keys, clients, derivation);
    const auto other = protocol::detail::finish(b, wire::Body::SecAggSetup, body.Union());
    INFO(derivation);
    CHECK(testing::codeOf([&] { (void)protocol::decodeSecAggSetup(other); }) ==
          Errc::kUnsupportedVersion);
    client::SecureParty party(3);
    CHECK(testing::codeOf([&] { (void)party.setup(other); }) == Errc::kUnsupportedVersion);
  }
  // A client left out of the round's clients refuses its setup.
  client::SecureParty outsider(42);
  CHECK(testing::codeOf([&] { (void)outsider.setup(protocol::encode(s)); }) == Errc::kWrongSender);
}

TEST_CASE("secure aggregation: a signed advert carries its credential whole on the wire",
          "[secagg]") {
  const privacy::SigningKeyPair authority = privacy::SigningKeyPair::generate();
  const auto p =
      server::SecAggConfig{true, 4, 0, 32, 1.0, authority.public_key}.paramsFor(5, 1, 10, 100);
  REQUIRE(p.signed_keys);
  const std::vector<uint64_t> ids{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const privacy::SecAggSigner signer = certifiedTrust(authority, 3).signer.value();
  privacy::SecAggClient c(p, 3, ids, &signer);
  const protocol::SecAggKeysMsg m{77, c.advertise()};
  const protocol::SecAggKeysMsg back = protocol::decodeSecAggKeys(protocol::encode(m));
  CHECK(back.advert.signature == m.advert.signature);
  CHECK(back.advert.credential.signing_key == signer.key.public_key);
  CHECK(back.advert.credential.certificate == signer.credential.certificate);
  CHECK(privacy::advertSigned(back.advert, authority.public_key, p, privacy::rosterHash(ids)));
  // A signature without its credential, or a credential without its signature, is refused.
  const auto raw = [&](bool sig, bool key, bool cert) {
    flatbuffers::FlatBufferBuilder b(512);
    const auto& a = m.advert;
    const auto vec = [&](const auto& x) { return b.CreateVector(x.data(), x.size()); };
    auto ck = vec(a.cipher_pk), mk = vec(a.mask_pk), h = vec(a.self_mask_hash);
    flatbuffers::Offset<flatbuffers::Vector<uint8_t>> sv, kv, cv;
    if (sig) sv = vec(a.signature);
    if (key) kv = vec(a.credential.signing_key);
    if (cert) cv = vec(a.credential.certificate);
    auto k = wire::CreateSecAggKeys(b, a.client, a.round, 77, ck, mk, h, sv, kv, cv);
    return protocol::detail::finish(b, wire::Body::SecAggKeys, k.Union());
  };
  CHECK(protocol::decodeSecAggKeys(raw(true, true, true)).advert.credential.certificate ==
        signer.credential.certificate);
  {  // a revealed pairwise key round-trips; one for a survivor is refused (the encoder cannot
     // write one beside a share, and the decoder refuses that too: decodeSecAggReveal)
    protocol::SecAggRevealMsg rv;
    rv.nonce = 5;
    rv.response.client = 2;
    rv.response.round = 1;
    privacy::RevealedShare key{4, true, {}, privacy::Key32{}};
    key.pairwise->fill(7);
    rv.response.shares = {key};
    const auto ok = protocol::decodeSecAggReveal(protocol::encode(rv));
    REQUIRE(ok.response.shares.size() == 1);
    CHECK(ok.response.shares[0].pairwise == key.pairwise);
    rv.response.shares[0].mask_key = false;
    CHECK(testing::codeOf([&] { (void)protocol::decodeSecAggReveal(protocol::encode(rv)); }) ==
          Errc::kInconsistentShares);
  }
  {  // unsigned: decodes, with no signature and no credential
    const privacy::KeyAdvert u = protocol::decodeSecAggKeys(raw(false, false, false)).advert;
    CHECK(u.signature == privacy::Signature{});
    CHECK(u.credential.signing_key == privacy::Key32{});
    CHECK(u.credential.certificate == privacy::Signature{});
  }
  for (const auto& [sig, key, cert] :
       {std::tuple{true, false, false}, std::tuple{true, true, false},
        std::tuple{false, true, true}, std::tuple{false, false, true}})
    CHECK(testing::codeOf([&] { (void)protocol::decodeSecAggKeys(raw(sig, key, cert)); }) ==
          Errc::kMissingField);
}

TEST_CASE("secure aggregation: the survivors step's messages round-trip and refuse malformed ones",
          "[secagg]") {
  const protocol::SecAggSurvivorsMsg list{77, {3, {2, 5, 9}}};
  const auto back = protocol::decodeSecAggSurvivors(protocol::encode(list));
  CHECK(back.nonce == 77);
  CHECK(back.request.round == 3);
  CHECK(back.request.absent == std::vector<uint64_t>{2, 5, 9});
  CHECK(protocol::decodeSecAggSurvivors(protocol::encode(protocol::SecAggSurvivorsMsg{77, {3, {}}}))
            .request.absent.empty());  // nobody absent
  protocol::SecAggSurvivorsMsg bad = list;
  bad.request.absent = {5, 2};
  CHECK(testing::codeOf([&] { (void)protocol::decodeSecAggSurvivors(protocol::encode(bad)); }) ==
        Errc::kDuplicate);
  bad.request.absent = {1, 2, 3, 4, 5};
  CHECK(testing::codeOf([&] {
          (void)protocol::decodeSecAggSurvivors(protocol::encode(bad),
                                                protocol::SecAggLimits{1 << 20, 4});
        }) == Errc::kSizeMismatch);

  privacy::SurvivorsSigned sg{4, 3, {}};
  for (size_t i = 0; i < sg.signature.size(); ++i) sg.signature[i] = static_cast<uint8_t>(i);
  const auto sb = protocol::decodeSecAggSigned(protocol::encode(protocol::SecAggSignedMsg{77, sg}));
  CHECK(sb.nonce == 77);
  CHECK(sb.signed_survivors.client == 4);
  CHECK(sb.signed_survivors.round == 3);
  CHECK(sb.signed_survivors.signature == sg.signature);
  {  // a signature of 63 bytes
    flatbuffers::FlatBufferBuilder b(256);
    auto body = wire::CreateSecAggSigned(b, 4, 3, 77, b.CreateVector(sg.signature.data(), 63));
    const auto short_sig = protocol::detail::finish(b, wire::Body::SecAggSigned, body.Union());
    CHECK(testing::codeOf([&] { (void)protocol::decodeSecAggSigned(short_sig); }) ==
          Errc::kSizeMismatch);
  }
  // The unmask request carries its neighbours' signatures, by ascending client.
  protocol::SecAggUnmaskMsg u{77, {3, {1}, {4, 6}, {}}};
  CHECK(protocol::decodeSecAggUnmask(protocol::encode(u)).request.signatures.empty());
  privacy::SurvivorsSigned sg6 = sg;
  sg6.client = 6;
  u.request.signatures = {sg, sg6};
  const auto ub = protocol::decodeSecAggUnmask(protocol::encode(u));
  REQUIRE(ub.request.signatures.size() == 2);
  CHECK(ub.request.signatures[1].client == 6);
  CHECK(ub.request.signatures[1].signature == sg.signature);
  u.request.signatures = {sg6, sg};
  CHECK(testing::codeOf([&] { (void)protocol::decodeSecAggUnmask(protocol::encode(u)); }) ==
        Errc::kDuplicate);
  // The relay's survivors stage, and none beyond it.
  protocol::SecAggRelayMsg r{0, 3, 77, protocol::RelayStage::kSurvivors, 100, {{1, {1}}}, {}};
  CHECK(protocol::decodeSecAggRelay(protocol::encode(r)).stage == protocol::RelayStage::kSurvivors);
  CHECK(server::secureStageOf(protocol::RelayStage::kSurvivors) == SecureStage::kSurvivors);
  CHECK(server::relayStageOf(SecureStage::kSurvivors) == protocol::RelayStage::kSurvivors);
  r.stage = static_cast<protocol::RelayStage>(6);
  CHECK(testing::codeOf([&] { (void)protocol::decodeSecAggRelay(protocol::encode(r)); }) ==
        Errc::kUnexpectedEncoding);
}

TEST_CASE("secure aggregation: what the engine refuses, with the reason", "[secagg]") {
  const auto l = layout();
  const auto refused = [&](const server::EngineConfig& c) { return engineRefusal(l, c); };
  auto c = secureConfig(10, 1.0);
  c.scheme.compressor = "topk:density=0.1";
  CHECK_THAT(refused(c), Contains("a coordinate only one client touched"));
  // Per-client supports of the shared-support families, each with what to use instead; PowerSGD's
  // local mode (each client's own two factors); a dense format that would only round twice.
  for (const auto& [spec, why] : std::vector<std::pair<std::string, std::string>>{
           {"randblock:density=0.1,offset=client", "use the default offset=shared"},
           {"randk:density=0.1", "use randk:positions=shared"},
           {"stc:density=0.1", "a coordinate only one client touched"},
           {"sign", "a coordinate only one client touched"},
           {"powersgd:rank=2,mode=local", "whose product is no sum"},
           {"fp16", "lower secagg.bits"}}) {
    INFO(spec);
    c = secureConfig(10, 1.0);
    c.scheme.compressor = spec;
    CHECK_THAT(refused(c), Contains(why));
  }
  for (const char* spec : {"randblock:density=0.1", "randk:density=0.1,positions=shared",
                           "acpsgd:rank=2", "powersgd:rank=2"}) {
    c = secureConfig(10, 1.0);
    c.scheme.compressor = spec;
    CHECK(refused(c) == "accepted");
  }
  c = secureConfig(10, 1.0);
  c.scheme.rule = "fedavg";
  CHECK_THAT(refused(c), Contains("uniform weights"));
  c = secureConfig(10, 1.0);
  c.scheme.rule = "median";
  CHECK_THAT(refused(c), Contains("uniform weights"));
  c = secureConfig(10, 1.0);
  c.secagg.clip = 0;
  CHECK_THAT(refused(c), Contains("secagg.clip"));
  c = secureConfig(10, 1.0);
  c.secagg.neighbours = 5;
  CHECK_THAT(refused(c), Contains("secagg.neighbours"));
  c = secureConfig(10, 1.0);
  c.secagg.neighbours = 8;
  c.secagg.threshold = 4;  // half: a server could unmask one client alone
  CHECK_THAT(refused(c), Contains("must exceed half"));
  c = secureConfig(10, 1.0);
  c.secagg.clip = 2e5;  // beyond bounds.max_norm: honest sums would be refused
  CHECK_THAT(refused(c), Contains("bounds.max_norm"));
  // 10,000 clients a round of a model of 144 values do not fit 16 bits: the bits it takes.
  c = secureConfig(10000, 1.0);
  c.secagg.bits = 16;
  CHECK_THAT(refused(c), Contains("it takes secagg.bits"));
  c = secureConfig(10, 1.0);
  CHECK(refused(c) == "accepted");
}

TEST_CASE("secure aggregation: a curious root sees masked inputs that look uniform, and the sum",
          "[secagg]") {
  const auto l = layout();
  const size_t n = l->numel();
  SecureFleet fleet(l, 10, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
  std::map<uint64_t, std::vector<uint64_t>> seen;  // what the root received, per client
  fleet.tamper = [&](SecureStage s, uint64_t id, std::vector<uint8_t> ans) {
    if (s == SecureStage::kMaskedInput) seen[id] = protocol::decodeSecAggMasked(ans, n).input.words;
    return ans;
  };
  server::RoundEngine engine(l, secureConfig(10, 1.0), std::vector<float>(n, 0.0f));
  REQUIRE(engine.runRound(fleet).applied);
  REQUIRE(seen.size() == 10);
  const auto p = server::SecAggConfig{true, 0, 0, 32, 1.0, {}}.paramsFor(5, 1, 10, n);
  // Each masked input looks like uniform words, by two simple tests: its bits are balanced (144 x
  // 32 bits, the share of ones within 5 standard errors of 1/2), and few of its words have
  // their top 9 bits all equal (a uniform word does with probability 2^-8: 0.56 of 144 expected;
  // 9 or more has a probability of about 1e-9). The input itself, encoded without masks, fails
  // the second: its values are small (|v| scale < 2^22), so every word's top bits repeat its sign.
  const auto onesShare = [&](const std::vector<uint64_t>& words) {
    uint64_t ones = 0;
    for (uint64_t w : words) ones += static_cast<uint64_t>(__builtin_popcountll(w));
    return static_cast<double>(ones) / static_cast<double>(words.size() * p.ring.bits);
  };
  const auto signLike = [&](const std::vector<uint64_t>& words) {
    size_t count = 0;
    for (uint64_t w : words) {
      const uint64_t top = (w >> (p.ring.bits - 9)) & 0x1ff;
      count += top == 0 || top == 0x1ff;
    }
    return count;
  };
  const double se = std::sqrt(0.25 / static_cast<double>(n * p.ring.bits));
  for (const auto& [id, words] : seen) {
    CHECK(std::fabs(onesShare(words) - 0.5) <= 5 * se);
    CHECK(signLike(words) <= 8);
  }
  std::vector<uint64_t> plain(n);
  const std::vector<float> x = client::clipForRing(updateOf(3, n), p.ring.clip);
  privacy::encode(p.ring, x, privacy::randomKey(), 1, plain);
  CHECK(signLike(plain) == n);
}

namespace {

// One round of 8 clients, 0-2 relayed by edge aggregator 100 and 3-5 by 101 (server::SecureRelay),
// 6 and 7 the root's own, each client's rounding fixed: the protocol driven by hand, as the
// fleets drive it (server/zmq_fleet.cc).
// With `authority`, a signed round (the malicious-server model), its survivors step relayed too.
struct RelayedRound {
  static constexpr uint64_t kDim = 100;
  std::map<uint64_t, std::vector<uint64_t>> relayed{{100, {0, 1, 2}}, {101, {3, 4, 5}}};
  std::optional<privacy::SigningKeyPair> authority;
  privacy::SecAggParams params;
  std::vector<uint64_t> ids{0, 1, 2, 3, 4, 5, 6, 7};
  server::SecureMetricRules rules{{"train_loss"}, 10.0};
  server::SecureRound round;
  std::map<uint64_t, server::SecureRelay> relays;
  std::map<uint64_t, client::SecureParty> parties;

  explicit RelayedRound(std::optional<privacy::SigningKeyPair> signing = std::nullopt)
      : authority(std::move(signing)),
        params(server::SecAggConfig{true, 0, 0, 32, 1.0,
                                    authority ? std::optional(authority->public_key) : std::nullopt}
                   .paramsFor(5, 1, 8, kDim)),
        round(params, ids, rules, {}, relayed, authority ? &authority->public_key : nullptr) {
    for (uint64_t a : {100, 101}) relays.try_emplace(a, a);
  }
  // The steps this round runs, in order.
  std::vector<SecureStage> stages() const {
    std::vector<SecureStage> out;
    for (const SecureStage s :
         {SecureStage::kAdvertise, SecureStage::kShareKeys, SecureStage::kMaskedInput,
          SecureStage::kSurvivors, SecureStage::kUnmask})
      if (server::runsStage(params, s)) out.push_back(s);
    return out;
  }
  std::vector<uint8_t> answer(SecureStage s, uint64_t c, const std::vector<uint8_t>& req) {
    if (s == SecureStage::kAdvertise)
      return parties
          .try_emplace(c, c, authority ? certifiedTrust(*authority, c) : client::SecAggTrust{})
          .first->second.setup(req);
    auto& p = parties.at(c);
    if (s == SecureStage::kShareKeys) return p.shareKeys(req);
    if (s == SecureStage::kSurvivors) return p.signSurvivors(req);
    if (s == SecureStage::kUnmask) return p.unmask(req);
    const privacy::Key32 key = privacy::publicKey("relay test rounding", c, 1);
    const std::vector<Metric> metrics{{"train_loss", 1.0 + static_cast<double>(c)}};
    return p.mask(req, updateOf(c, kDim), metrics, &key);
  }
  // What the root sends aggregator `a` for step `s`.
  protocol::SecAggRelayMsg down(uint64_t a, SecureStage s) {
    return protocol::decodeSecAggRelay(protocol::encode(server::relayRequest(round, a, s, 1000)));
  }
  // Aggregator `a` relays step `s` to its clients; what it sends up (a relay, or the ring sum).
  std::vector<uint8_t> relay(uint64_t a, SecureStage s) {
    server::SecureRelay& r = relays.at(a);
    r.take(down(a, s));
    if (s == SecureStage::kMaskedInput) r.setMetricRules(rules);  // from the secure task
    for (uint64_t c : r.clients()) r.reply(s, c, answer(s, c, r.request(s, c)));
    return s == SecureStage::kMaskedInput ? *r.maskedUp() : r.answerUp();
  }
  void up(uint64_t a, SecureStage s, const std::vector<uint8_t>& bytes) {
    if (s == SecureStage::kMaskedInput) {
      round.replyRelayed(a, bytes);
      return;
    }
    for (const auto& it : protocol::decodeSecAggRelay(bytes).items)
      round.reply(s, it.client, it.message);
  }
  void direct(SecureStage s) {
    for (uint64_t c : {6, 7}) round.reply(s, c, answer(s, c, round.request(s, c)));
  }
};

}  // namespace

TEST_CASE(
    "secure aggregation through edge aggregators: their ring sums give the flat sum bit for bit",
    "[secagg]") {
  const bool signed_keys = GENERATE(false, true);
  INFO((signed_keys ? "signed (malicious-server)" : "semi-honest"));
  const auto authority = signed_keys ? std::optional(privacy::SigningKeyPair::generate())
                                     : std::optional<privacy::SigningKeyPair>();
  RelayedRound tree(authority);
  CHECK(tree.stages().size() == (signed_keys ? 5u : 4u));
  for (const SecureStage s : tree.stages()) {
    tree.direct(s);
    for (uint64_t a : {100, 101}) tree.up(a, s, tree.relay(a, s));
  }
  // The same clients, roundings and updates, every one answering the root itself.
  RelayedRound flat(authority);
  server::SecureRound plain(flat.params, flat.ids, flat.rules, {}, {},
                            authority ? &authority->public_key : nullptr);
  for (const SecureStage s : flat.stages())
    for (uint64_t c : flat.ids) plain.reply(s, c, flat.answer(s, c, plain.request(s, c)));
  const auto t = tree.round.finish(), f = plain.finish();
  INFO(t.reason << f.reason);
  REQUIRE(t.ok);
  REQUIRE(f.ok);
  CHECK(t.survivors == f.survivors);
  CHECK(t.survivors.size() == 8);
  CHECK(t.sum == f.sum);  // bit for bit: the same integers, added in another grouping
  CHECK(maxDiff(t.sum, [&] {
          auto m = meanOf(tree.ids, RelayedRound::kDim);
          for (double& v : m) v *= 8;
          return m;
        }()) <= 8.0 / tree.params.ring.scale + 1e-6);
  CHECK(t.metrics.at("train_loss") == f.metrics.at("train_loss"));
  CHECK(t.metrics.at("train_loss").second == 8);
}

TEST_CASE("secure aggregation through edge aggregators: a lying aggregator's sums are refused",
          "[secagg]") {
  RelayedRound tree;
  for (const SecureStage s : {SecureStage::kAdvertise, SecureStage::kShareKeys}) {
    tree.direct(s);
    for (uint64_t a : {100, 101}) tree.up(a, s, tree.relay(a, s));
  }
  const SecureStage m = SecureStage::kMaskedInput;
  tree.direct(m);
  const std::vector<uint8_t> sum100 = tree.relay(100, m), sum101 = tree.relay(101, m);
  const auto code = [&](uint64_t a, const std::vector<uint8_t>& bytes) {
    return testing::codeOf([&] { tree.round.replyRelayed(a, bytes); });
  };
  // Aggregator 100 passes off 101's clients' inputs as its own.
  protocol::SecAggMaskedMsg stolen = protocol::decodeSecAggMasked(sum101, RelayedRound::kDim);
  stolen.client = 100;
  CHECK(code(100, protocol::encode(stolen)) == Errc::kWrongSender);
  // A sum named for another aggregator, of another exchange, with metrics beyond what its three
  // clients can sum to (10 each).
  CHECK(code(101, sum100) == Errc::kWrongSender);
  protocol::SecAggMaskedMsg replay = protocol::decodeSecAggMasked(sum100, RelayedRound::kDim);
  replay.nonce ^= 1;
  CHECK(code(100, protocol::encode(replay)) == Errc::kLate);
  protocol::SecAggMaskedMsg loud = protocol::decodeSecAggMasked(sum100, RelayedRound::kDim);
  loud.metrics = {{"train_loss", 31.0}};
  CHECK(code(100, protocol::encode(loud)) == Errc::kValueTooLarge);
  // A root client's input sent through an aggregator: not its to send.
  protocol::SecAggMaskedMsg direct = protocol::decodeSecAggMasked(sum100, RelayedRound::kDim);
  direct.input.clients = {0, 1, 6};
  CHECK(code(100, protocol::encode(direct)) == Errc::kWrongSender);
  // None of it counted: the honest sums are taken once, a second time refused.
  REQUIRE_NOTHROW(tree.round.replyRelayed(100, sum100));
  CHECK(code(100, sum100) == Errc::kDuplicate);
  REQUIRE_NOTHROW(tree.round.replyRelayed(101, sum101));
  tree.direct(SecureStage::kUnmask);
  for (uint64_t a : {100, 101})
    tree.up(a, SecureStage::kUnmask, tree.relay(a, SecureStage::kUnmask));
  const auto out = tree.round.finish();
  INFO(out.reason);
  CHECK(out.ok);
  CHECK(out.survivors.size() == 8);
}

TEST_CASE("secure aggregation's relay refuses what an aggregator must not forward or add",
          "[secagg]") {
  RelayedRound tree;
  server::SecureRelay& r = tree.relays.at(100);
  // A step before the round's setup.
  tree.direct(SecureStage::kAdvertise);
  protocol::SecAggRelayMsg early = tree.down(100, SecureStage::kAdvertise);
  early.stage = protocol::RelayStage::kShareKeys;
  CHECK(testing::codeOf([&] { r.take(early); }) == Errc::kUnexpectedMessage);
  // An advertise step without its setup, or with a setup of another round.
  protocol::SecAggRelayMsg bare = tree.down(100, SecureStage::kAdvertise);
  REQUIRE(bare.common.size() > 0);
  for (const auto& it : bare.items) CHECK(it.message.empty());  // the setup travels once
  bare.common.clear();
  CHECK(testing::codeOf([&] { r.take(bare); }) == Errc::kMissingField);
  protocol::SecAggRelayMsg other = tree.down(100, SecureStage::kAdvertise);
  protocol::SecAggSetupMsg setup = protocol::decodeSecAggSetup(other.common);
  setup.params.round = 2;
  other.common = protocol::encode(setup);
  CHECK(testing::codeOf([&] { r.take(other); }) == Errc::kWrongRound);
  r.take(tree.down(100, SecureStage::kAdvertise));
  // An answer of another kind, or of a client it was not sent the step of.
  CHECK(testing::codeOf([&] {
          r.reply(SecureStage::kAdvertise, 0, r.request(SecureStage::kAdvertise, 0));
        }) == Errc::kUnexpectedMessage);
  const auto keys0 = tree.answer(SecureStage::kAdvertise, 0, r.request(SecureStage::kAdvertise, 0));
  CHECK(testing::codeOf([&] { r.reply(SecureStage::kAdvertise, 6, keys0); }) ==
        Errc::kUnexpectedMessage);
  // Another client's keys as its own.
  CHECK(testing::codeOf([&] { r.reply(SecureStage::kAdvertise, 1, keys0); }) == Errc::kWrongSender);
  r.reply(SecureStage::kAdvertise, 0, keys0);
  CHECK(testing::codeOf([&] { r.reply(SecureStage::kAdvertise, 0, keys0); }) == Errc::kDuplicate);
  // The same step's relay again, once it moved on: refused.
  for (uint64_t c : {1, 2})
    r.reply(SecureStage::kAdvertise, c,
            tree.answer(SecureStage::kAdvertise, c, r.request(SecureStage::kAdvertise, c)));
  tree.up(100, SecureStage::kAdvertise, r.answerUp());
  for (uint64_t a : {101})
    tree.up(a, SecureStage::kAdvertise, tree.relay(a, SecureStage::kAdvertise));
  const protocol::SecAggRelayMsg share = tree.down(100, SecureStage::kShareKeys);
  r.take(share);
  CHECK(testing::codeOf([&] { r.take(share); }) == Errc::kDuplicate);
}

TEST_CASE("secure aggregation's relay message: round trip and hostile bytes", "[secagg]") {
  protocol::SecAggRelayMsg m{
      100, 3, 77, protocol::RelayStage::kShareKeys, 1500, {{1, {1, 2, 3}}, {4, {9}}}, {}};
  const auto back = protocol::decodeSecAggRelay(protocol::encode(m));
  CHECK(back.from == 100);
  CHECK(back.round == 3);
  CHECK(back.nonce == 77);
  CHECK(back.stage == protocol::RelayStage::kShareKeys);
  CHECK(back.deadline_ms == 1500);
  REQUIRE(back.items.size() == 2);
  CHECK(back.items[1].client == 4);
  CHECK(back.items[0].message == std::vector<uint8_t>{1, 2, 3});
  const auto code = [](const protocol::SecAggRelayMsg& x) {
    return testing::codeOf([&] { (void)protocol::decodeSecAggRelay(protocol::encode(x)); });
  };
  auto bad = m;
  std::swap(bad.items[0], bad.items[1]);
  CHECK(code(bad) == Errc::kDuplicate);
  bad = m;
  bad.items[1].message.clear();
  CHECK(code(bad) == Errc::kMissingField);
  bad = m;
  bad.stage = protocol::RelayStage::kRoster;
  CHECK(code(bad) == Errc::kUnexpectedEncoding);  // a roster carries ids only
  bad = m;
  bad.common = {5, 5};  // a common message outside the advertise step
  CHECK(code(bad) == Errc::kUnexpectedEncoding);
  bad.stage = protocol::RelayStage::kAdvertise;  // beside items with messages of their own
  CHECK(code(bad) == Errc::kUnexpectedEncoding);
  for (auto& it : bad.items) it.message.clear();
  CHECK(protocol::decodeSecAggRelay(protocol::encode(bad)).common == std::vector<uint8_t>{5, 5});
  bad = m;
  bad.stage = static_cast<protocol::RelayStage>(9);
  CHECK(code(bad) == Errc::kUnexpectedEncoding);
  bad = m;
  bad.items.resize(5, {});
  for (size_t i = 0; i < 5; ++i) bad.items[i] = {i, {1}};
  CHECK(testing::codeOf([&] {
          (void)protocol::decodeSecAggRelay(protocol::encode(bad),
                                            protocol::SecAggLimits{1 << 20, 4});
        }) == Errc::kSizeMismatch);
}

namespace {

// Distributed DP (privacy/dp.h) over secure aggregation: Poisson sampling at `rate` of `n`
// clients, clip 1, noise multiplier z, each client adding its share of the noise.
server::EngineConfig distributedConfig(uint64_t n, double rate, double z, uint64_t min_clients) {
  server::EngineConfig c = secureConfig(0, 1.0);
  c.sampling.clients_per_round = 0;
  c.sampling.poisson_rate = rate;
  c.scheme.rule = "fedavg:weight=uniform,clip=1";
  c.dp.enabled = true;
  c.dp.mechanism = privacy::DpMechanism::kDistributed;
  c.dp.accountant = privacy::DpAccountant::kRdp;
  c.dp.clip = 1.0;
  c.dp.noise_multiplier = z;
  c.dp.population = n;
  c.dp.min_clients = min_clients;
  c.dp.seeded_noise = true;
  c.scheme.metrics.clear();  // per-client metrics would reach the root in the clear
  return c;
}

}  // namespace

TEST_CASE(
    "distributed DP: each client's noise is in the ring sum, and the model moves by the sum's "
    "noise over q N",
    "[secagg][ddg]") {
  const auto l = layout();
  const size_t n = l->numel();
  // Every client sends zeros: the applied model is the survivors' noise alone, over q N.
  SecureFleet fleet(l, 40, [&](uint64_t, uint64_t) { return std::vector<float>(n, 0.0f); });
  std::set<SecureStage> asked;
  fleet.tamper_request = [&](SecureStage s, uint64_t, std::vector<uint8_t> req) {
    asked.insert(s);
    return req;
  };
  const double z = 1.0, q = 0.5;
  server::RoundEngine engine(l, distributedConfig(40, q, z, 10), std::vector<float>(n, 0.0f));
  const server::RoundRecord rec = engine.runRound(fleet);
  INFO(rec.reason);
  REQUIRE(rec.applied);
  const double survivors = static_cast<double>(rec.clients_completed);
  REQUIRE(survivors >= 10);
  // What each client was told to add: z times one client's sensitivity, over sqrt(min_clients).
  const privacy::RingSpec& ring = fleet.parties().begin()->second.params().ring;
  CHECK(ring.noise ==
        Approx(z * (ring.scale * (1 + 0x1p-20) + std::sqrt(double(n))) / std::sqrt(10.0)));
  // Each value of the model: the sum of the survivors' discrete Gaussians, decoded and divided by
  // q N: variance survivors noise^2 / (scale q N)^2. 144 values: within 5 standard errors of the
  // sample variance (sqrt(2 / 144) each).
  double sq = 0;
  for (float v : engine.model().server()) sq += double(v) * v;
  const double var = sq / double(n);
  const double want = survivors * ring.noise * ring.noise / std::pow(ring.scale * q * 40, 2);
  CHECK(std::fabs(var / want - 1) < 5 * std::sqrt(2.0 / double(n)));
  // Epsilon is the distributed accountant's, over the shared support's size.
  REQUIRE(rec.dp_epsilon.has_value());
  CHECK(*rec.dp_epsilon ==
        Approx(privacy::DdgAccountant(q, z, privacy::ddgTau(privacy::kMinClientNoise, 40), n, 1e-5)
                   .epsilon(1)));
  CHECK(asked.count(SecureStage::kUnmask));
}

TEST_CASE(
    "distributed DP: a round with fewer masked inputs than privacy.min_clients is stopped before "
    "its unmask",
    "[secagg][ddg]") {
  const auto l = layout();
  const size_t n = l->numel();
  SecureFleet fleet(l, 40, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
  std::set<SecureStage> asked;
  fleet.tamper_request = [&](SecureStage s, uint64_t, std::vector<uint8_t> req) {
    asked.insert(s);
    return req;
  };
  // All but 5 of the 40 drop before their masked input; 10 are needed.
  for (uint64_t c = 5; c < 40; ++c) fleet.drop_at[c] = SecureStage::kMaskedInput;
  server::RoundEngine engine(l, distributedConfig(40, 1.0, 1.0, 10), std::vector<float>(n, 0.0f));
  const server::RoundRecord rec = engine.runRound(fleet);
  CHECK_FALSE(rec.applied);
  CHECK_THAT(rec.reason, Contains("privacy.min_clients = 10") && Contains("nothing is unmasked"));
  CHECK_FALSE(asked.count(SecureStage::kUnmask));  // no client was asked to reveal anything
  CHECK(engine.model().version() == 1);
  for (float v : engine.model().server()) REQUIRE(v == 0.0f);
  REQUIRE(rec.dp_epsilon.has_value());  // the round is counted all the same
  CHECK(*rec.dp_epsilon > 0);
}

TEST_CASE("distributed DP: what the engine refuses, with the reason", "[secagg][ddg]") {
  const auto l = layout();
  const auto refused = [&](const server::EngineConfig& c) { return engineRefusal(l, c); };
  CHECK(refused(distributedConfig(40, 0.5, 1.0, 10)) == "accepted");
  auto c = distributedConfig(40, 0.5, 1.0, 10);
  c.secagg.enabled = false;
  CHECK_THAT(refused(c), Contains("needs secagg.enabled"));
  c = distributedConfig(40, 0.5, 1.0, 10);
  c.dp.accountant = privacy::DpAccountant::kPld;
  CHECK_THAT(refused(c), Contains("privacy.accountant"));
  c = distributedConfig(40, 0.5, 1.0, 25);  // 20 expected a round
  CHECK_THAT(refused(c), Contains("privacy.min_clients = 25"));
  c = distributedConfig(40, 0.5, 1.0, 10);
  c.scheme.metrics = {"train_loss"};
  CHECK_THAT(refused(c), Contains("takes no declared metrics"));
  // Poisson sampling of a population: the ring is checked for the rounds it will see (the
  // expected count and 7 deviations), not for one client. 20 bits hold one client's update of
  // 144 values and its noise, not 33 clients'.
  c = distributedConfig(40, 0.5, 1.0, 10);
  c.secagg.bits = 20;
  CHECK_THAT(refused(c), Contains("it takes secagg.bits"));
  // A ring too narrow for the sum and its noise: the bits it takes.
  c = distributedConfig(40, 0.5, 1.0, 10);
  c.secagg.bits = 16;
  CHECK_THAT(refused(c), Contains("and their noise") && Contains("it takes secagg.bits"));
}

TEST_CASE(
    "central DP with adaptive clipping under secure aggregation: each client masks whether it was "
    "within the round's clip, and the clip moves as in the clear, round for round",
    "[secagg][adaptive]") {
  const auto l = layout();
  const size_t n = l->numel();
  const uint64_t clients = 20;
  // Client c's update: norm (c + 1) / 10, from 0.1 to 2, on a coordinate of its own.
  const auto normed = [&](uint64_t c, uint64_t r) {
    std::vector<float> x(n, 0.0f);
    x[(c + 7 * r) % n] = static_cast<float>((c + 1) / 10.0);
    return x;
  };
  server::EngineConfig c = distributedConfig(clients, 1.0, 1.0, 0);
  c.dp.mechanism = privacy::DpMechanism::kCentral;
  c.dp.clip = 0.2;
  c.secagg.clip = 0.2;
  c.scheme.rule = "fedavg:weight=uniform,clip=0.2";
  c.dp.adaptive_clip = true;
  c.rounds = 8;
  SecureFleet secure_fleet(l, clients, normed);
  std::set<size_t> masked_words;
  secure_fleet.tamper = [&](SecureStage st, uint64_t, std::vector<uint8_t> ans) {
    if (st == SecureStage::kMaskedInput)
      masked_words.insert(protocol::decodeSecAggMasked(ans, n + 1).input.words.size());
    return ans;
  };
  server::RoundEngine secure(l, c, std::vector<float>(n, 0.0f));
  // The same run in the clear: the root clips each update and counts those within the clip.
  auto clear_config = c;
  clear_config.secagg.enabled = false;
  PlainFleet plain_fleet(l, clients, normed);
  server::RoundEngine clear(l, clear_config, std::vector<float>(n, 0.0f));
  std::vector<double> clips;
  for (uint64_t r = 1; r <= 8; ++r) {
    INFO("round " << r);
    const server::RoundRecord a = secure.runRound(secure_fleet), b = clear.runRound(plain_fleet);
    REQUIRE(a.applied);
    REQUIRE(b.applied);
    CHECK(a.clients_completed == clients);
    REQUIRE(a.dp_clip.has_value());
    REQUIRE(b.dp_clip.has_value());
    // The count is exact in the ring: the same count, the same seeded count noise, the same clip.
    CHECK(*a.dp_clip == *b.dp_clip);
    CHECK(a.dp_epsilon == b.dp_epsilon);
    CHECK(a.metrics.count(server::kClipIndicator) == 0);  // the exact count is not released
    clips.push_back(*a.dp_clip);
    // The model: the clear run's within the ring's rounding (the seeded noise is the same).
    double scale = 0;
    for (float v : clear.model().server()) scale = std::max(scale, std::fabs(double(v)));
    CHECK(maxDiff(secure.model().server(), std::vector<double>(clear.model().server().begin(),
                                                               clear.model().server().end())) <=
          1e-5 * scale);
  }
  // Each masked input: the update's 144 values and the count's one.
  CHECK(masked_words == std::set<size_t>{n + 1});
  // Most updates are over 0.2 at first: the clip grows, round after round.
  CHECK(clips.front() == 0.2);
  for (size_t i = 1; i < clips.size(); ++i) CHECK(clips[i] > clips[i - 1]);
  // Under distributed DP the root never sees a noiseless count: refused, saying why.
  auto ddg = distributedConfig(clients, 1.0, 1.0, 5);
  ddg.dp.adaptive_clip = true;
  CHECK_THAT(engineRefusal(l, ddg), Contains("privacy.adaptive_clip needs privacy.dp = central"));
}

TEST_CASE(
    "adaptive clipping under secure aggregation: rounds with every client within the clip apply, "
    "a lying client's count is clamped to the round's clients, and the clip stays within the "
    "bounds",
    "[secagg][adaptive]") {
  const auto l = layout();
  const size_t n = l->numel();
  const uint64_t clients = 21;
  const auto normed = [&](uint64_t c, uint64_t r) {
    std::vector<float> x(n, 0.0f);
    x[(c + 7 * r) % n] = static_cast<float>((c + 1) / 10.0);  // norms 0.1 to 2.1
    return x;
  };
  const auto config = [&](double clip) {
    server::EngineConfig c = distributedConfig(clients, 1.0, 1.0, 0);
    c.dp.mechanism = privacy::DpMechanism::kCentral;
    c.dp.clip = clip;
    c.secagg.clip = clip;
    std::ostringstream rule;
    rule << std::setprecision(17) << "fedavg:weight=uniform,clip=" << clip;
    c.scheme.rule = rule.str();
    c.dp.adaptive_clip = true;
    c.rounds = 6;
    return c;
  };
  SECTION("every client within a clip of a full mantissa: as in the clear") {
    // The count is n C in the ring, and its float may round a little past n C: still n.
    const double clip = 10.123456789012345;
    SecureFleet fleet(l, clients, normed);
    server::RoundEngine secure(l, config(clip), std::vector<float>(n, 0.0f));
    auto clear_config = config(clip);
    clear_config.secagg.enabled = false;
    PlainFleet plain(l, clients, normed);
    server::RoundEngine clear(l, clear_config, std::vector<float>(n, 0.0f));
    for (int r = 1; r <= 6; ++r) {
      INFO("round " << r);
      const server::RoundRecord a = secure.runRound(fleet), b = clear.runRound(plain);
      INFO(a.reason);
      REQUIRE(a.applied);
      REQUIRE(b.applied);
      CHECK(*a.dp_clip == *b.dp_clip);
    }
    // Every update within the clip: it shrank, round after round, as in the clear.
    CHECK(secure.dp()->clip() < clip);
  }
  SECTION("a lying client's count moves it anywhere the ring holds, clamped to [0, n]") {
    // Clip 0.25: two clients within (norms 0.1 and 0.2). Client 20 (norm 2.1, outside) takes 5 C
    // off its count word (the masks cancel, so it can): the sum's count is -3 C. The round applies,
    // with a count of 0, and says nothing of the exact count; the clip moves as a count of 0 moves
    // it. One client biases the count as it can bias the update's sum within n C; an honest
    // client's effect on it stays one.
    SecureFleet fleet(l, clients, normed);
    privacy::SecAggParams setup;
    fleet.tamper_request = [&](SecureStage st, uint64_t, std::vector<uint8_t> req) {
      if (st == SecureStage::kAdvertise) setup = protocol::decodeSecAggSetup(req).params;
      return req;
    };
    fleet.tamper = [&](SecureStage st, uint64_t id, std::vector<uint8_t> ans) {
      if (st != SecureStage::kMaskedInput || id != 20) return ans;
      protocol::SecAggMaskedMsg m = protocol::decodeSecAggMasked(ans, n + 1);
      const uint64_t mask =
          setup.ring.bits == 64 ? ~uint64_t{0} : (uint64_t{1} << setup.ring.bits) - 1;
      m.input.words.back() =
          (m.input.words.back() -
           static_cast<uint64_t>(std::llround(5 * setup.ring.clip * setup.ring.scale))) &
          mask;
      return protocol::encode(m);
    };
    const server::EngineConfig c = config(0.25);
    server::RoundEngine secure(l, c, std::vector<float>(n, 0.0f));
    const server::RoundRecord first = secure.runRound(fleet);
    INFO(first.reason);
    REQUIRE(first.applied);
    CHECK(first.reason.empty());
    // The clip a count of 0 of 21 gives (the engine's accountant replayed: its seeded count noise).
    privacy::DpConfig replay = c.dp;
    replay.max_clip = std::min(c.scheme.bounds.max_update_norm, c.scheme.bounds.max_abs_value);
    privacy::ClientDp dp(replay, 1.0, c.rounds, c.scheme.run_seed);
    const double want = dp.adaptClip(0, clients, 1);
    CHECK(secure.dp()->clip() == want);
    // And not the honest count's (2 of 21).
    privacy::ClientDp honest(replay, 1.0, c.rounds, c.scheme.run_seed);
    CHECK(honest.adaptClip(2, clients, 1) != want);
  }
  SECTION("a clip that would grow past bounds.max_norm stops there, and every round applies") {
    auto c = config(0.2);
    c.scheme.bounds.max_update_norm = 0.5;
    c.rounds = 30;
    SecureFleet fleet(l, clients, normed);
    server::RoundEngine secure(l, c, std::vector<float>(n, 0.0f));
    double top = 0;
    for (int r = 1; r <= 30; ++r) {
      const server::RoundRecord a = secure.runRound(fleet);
      INFO("round " << r << ": " << a.reason);
      REQUIRE(a.applied);
      top = std::max(top, *a.dp_clip);
    }
    // The median norm is 1.1: without the cap the clip would pass 0.5 within these rounds.
    CHECK(top <= 0.5);
    CHECK(secure.dp()->clip() == 0.5);
  }
}

TEST_CASE("distributed DP's mechanism is in the checkpoint: a resume as central DP is refused",
          "[secagg][ddg]") {
  const auto l = layout();
  const size_t n = l->numel();
  testing::TempDir dir;
  server::EngineConfig c = distributedConfig(20, 1.0, 1.0, 10);
  c.checkpoint = (dir.path / "ck.bin").string();
  {
    SecureFleet fleet(l, 20, [&](uint64_t cl, uint64_t) { return updateOf(cl, n); });
    server::RoundEngine engine(l, c, std::vector<float>(n, 0.0f));
    REQUIRE(engine.runRound(fleet).applied);
  }
  {
    // The same settings resume, epsilon going on from round 2.
    SecureFleet fleet(l, 20, [&](uint64_t cl, uint64_t) { return updateOf(cl, n); });
    server::RoundEngine engine(l, c, std::vector<float>(n, 0.0f));
    REQUIRE(engine.resumed());
    const server::RoundRecord rec = engine.runRound(fleet);
    CHECK(rec.round == 2);
    CHECK(*rec.dp_epsilon ==
          Approx(privacy::DdgAccountant(1.0, 1.0, privacy::ddgTau(privacy::kMinClientNoise, 20), n,
                                        1e-5)
                     .epsilon(2)));
  }
  auto central = c;
  central.dp.mechanism = privacy::DpMechanism::kCentral;
  central.dp.min_clients = 0;
  CHECK_THROWS_MATCHING(server::RoundEngine(l, central, std::vector<float>(n, 0.0f)), IoError,
                        Contains("ran under distributed DP"));
  auto without = c;
  without.dp.enabled = false;
  without.scheme.rule = "fedavg:weight=uniform";
  CHECK_THROWS_MATCHING(server::RoundEngine(l, without, std::vector<float>(n, 0.0f)), IoError,
                        Contains("ran under distributed DP"));
}

TEST_CASE("distributed DP: a setup's noise round-trips, and a noise a client cannot use is refused",
          "[secagg][ddg]") {
  server::SecAggConfig sc{true, 0, 0, 32, 1.0, {}, privacy::RingNoise{1.0, 5}};
  protocol::SecAggSetupMsg m;
  m.nonce = 3;
  m.params = sc.paramsFor(5, 2, 10, 144);
  m.params.session = 3;
  for (uint64_t c = 0; c < 10; ++c) m.clients.push_back(c);
  REQUIRE(m.params.ring.noise > privacy::kMinClientNoise);
  const auto back = protocol::decodeSecAggSetup(protocol::encode(m), {});
  CHECK(back.params.ring.noise == m.params.ring.noise);
  CHECK(back.params.ring.scale == m.params.ring.scale);
  // Negative, not a number, under the floor the accountant assumes, beyond what the ring holds
  // beside the sum: each refused with its code, as a malformed setup.
  for (double bad : {-1.0, double(NAN), double(INFINITY), 1.0, 1e15}) {
    CAPTURE(bad);
    protocol::SecAggSetupMsg x = m;
    x.params.ring.noise = bad;
    try {
      protocol::decodeSecAggSetup(protocol::encode(x), {});
      FAIL("accepted a noise of " << bad);
    } catch (const InputError& e) {
      CHECK(e.code() == Errc::kMissingField);
    }
  }
}

TEST_CASE(
    "distributed DP: a root that crashes during the unmask resumes past the round, which it "
    "counts and never runs again",
    "[secagg][ddg]") {
  const auto l = layout();
  const size_t n = l->numel();
  testing::TempDir dir;
  server::EngineConfig c = distributedConfig(20, 1.0, 1.0, 10);
  c.checkpoint = (dir.path / "ck.bin").string();
  struct Crash {};
  {
    SecureFleet fleet(l, 20, [&](uint64_t cl, uint64_t) { return updateOf(cl, n); });
    // The root goes down once it has asked for the unmask (its requests are out; a client's
    // answer may already have reached an eavesdropper on the root).
    fleet.tamper_request = [](SecureStage s, uint64_t, std::vector<uint8_t> req) {
      if (s == SecureStage::kUnmask) throw Crash{};
      return req;
    };
    server::RoundEngine engine(l, c, std::vector<float>(n, 0.0f));
    CHECK_THROWS_AS(engine.runRound(fleet), Crash);
  }
  SecureFleet fleet(l, 20, [&](uint64_t cl, uint64_t) { return updateOf(cl, n); });
  server::RoundEngine engine(l, c, std::vector<float>(n, 0.0f));
  REQUIRE(engine.resumed());
  CHECK(engine.nextRound() == 2);  // round 1 is spent: not run again with fresh noise
  CHECK(engine.model().version() == 1);
  for (float v : engine.model().server()) REQUIRE(v == 0.0f);
  const server::RoundRecord rec = engine.runRound(fleet);
  CHECK(rec.round == 2);
  CHECK(rec.applied);
  CHECK(*rec.dp_epsilon ==
        Approx(
            privacy::DdgAccountant(1.0, 1.0, privacy::ddgTau(privacy::kMinClientNoise, 20), n, 1e-5)
                .epsilon(2)));
}

TEST_CASE(
    "distributed DP: a client's secagg.min_noise holds the root to its noise: less, or none, is "
    "refused",
    "[secagg][ddg]") {
  const auto l = layout();
  const size_t n = l->numel();
  // The root asks each client for z / sqrt(m) = 1 / sqrt(10) of its sensitivity.
  const double asked = 1.0 / std::sqrt(10.0);
  const auto runWith = [&](double floor, bool dp) {
    SecureFleet fleet(l, 20, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    fleet.trust = [floor](uint64_t) {
      client::SecAggTrust t;
      t.min_noise = floor;
      return t;
    };
    server::EngineConfig c = dp ? distributedConfig(20, 1.0, 1.0, 10) : secureConfig(20, 1.0);
    server::RoundEngine engine(l, c, std::vector<float>(n, 0.0f));
    const server::RoundRecord rec = engine.runRound(fleet);
    return std::make_pair(rec, fleet.client_refused);
  };
  {
    const auto [rec, refused] = runWith(asked * (1 - 1e-6), true);
    CHECK(rec.applied);
    CHECK(refused.empty());
  }
  {
    // A root that asks for 60% of what its clients hold it to: every client refuses at the setup.
    const auto [rec, refused] = runWith(asked / 0.6, true);
    CHECK_FALSE(rec.applied);
    REQUIRE(refused.size() == 20);
    for (const auto& [c, code] : refused) CHECK(code == Errc::kTooLittleNoise);
  }
  {
    // A round without distributed DP asks for no noise: refused by a client that wants some.
    const auto [rec, refused] = runWith(0.01, false);
    CHECK_FALSE(rec.applied);
    REQUIRE(refused.size() == 20);
    for (const auto& [c, code] : refused) CHECK(code == Errc::kTooLittleNoise);
  }
  client::SecAggTrust bad;
  bad.min_noise = -1;
  CHECK_THROWS_AS(bad.validate(1), ConfigError);
}

TEST_CASE(
    "distributed DP: in signed rounds a client's secagg.min_clients holds the root to its m: no "
    "sum of fewer masked inputs is unmasked with its help",
    "[secagg][ddg]") {
  const auto l = layout();
  const size_t n = l->numel();
  const privacy::SigningKeyPair authority = privacy::SigningKeyPair::generate();
  // A root that runs m = 3 (it would unmask a sum of three clients' noise), clients whose floor
  // is `floor`; `lost` clients drop before their masked input.
  const auto runWith = [&](uint64_t floor, uint64_t lost) {
    SecureFleet fleet(l, 20, [&](uint64_t c, uint64_t) { return updateOf(c, n); });
    fleet.trust = [&](uint64_t c) {
      client::SecAggTrust t = certifiedTrust(authority, c);
      t.min_clients = floor;
      return t;
    };
    for (uint64_t c = 0; c < lost; ++c) fleet.drop_at[c] = SecureStage::kMaskedInput;
    std::set<SecureStage> asked;
    fleet.tamper_request = [&](SecureStage s, uint64_t, std::vector<uint8_t> req) {
      asked.insert(s);
      return req;
    };
    server::EngineConfig c = distributedConfig(20, 1.0, 1.0, 3);
    c.secagg.authority = authority.public_key;
    server::RoundEngine engine(l, c, std::vector<float>(n, 0.0f));
    const server::RoundRecord rec = engine.runRound(fleet);
    bool moved = false;
    for (float v : engine.model().server()) moved = moved || v != 0.0f;
    return std::make_tuple(rec, fleet.client_refused, asked.count(SecureStage::kUnmask) > 0, moved);
  };
  for (const uint64_t lost : {3, 5}) {
    // 17 and 15 masked inputs, floor 15 (a sum of exactly the floor is allowed): applied.
    const auto [rec, refused, unmasked, moved] = runWith(15, lost);
    INFO(lost << " lost: " << rec.reason);
    CHECK(rec.applied);
    CHECK(rec.clients_completed == 20 - lost);
    CHECK(refused.empty());
    CHECK(unmasked);
    CHECK(moved);
  }
  {
    // 14 masked inputs: the root's m = 3 lets it go on, but every survivor refuses to sign a list
    // of 14 against its floor of 15, so no one is asked to unmask and nothing is applied.
    const auto [rec, refused, unmasked, moved] = runWith(15, 6);
    CHECK_FALSE(rec.applied);
    REQUIRE(refused.size() == 14);
    for (const auto& [id, code] : refused) {
      CHECK(id >= 6);
      CHECK(code == Errc::kTooLittleNoise);
    }
    CHECK_FALSE(unmasked);
    CHECK_FALSE(moved);
  }
  {
    // A round of 20 clients, a floor of 21: refused at the setup by every client.
    const auto [rec, refused, unmasked, moved] = runWith(21, 0);
    CHECK_FALSE(rec.applied);
    REQUIRE(refused.size() == 20);
    for (const auto& [id, code] : refused) CHECK(code == Errc::kTooLittleNoise);
    CHECK_FALSE(moved);
  }
  {
    // A floor of 20 the round of 20 meets: no refusal.
    const auto [rec, refused, unmasked, moved] = runWith(20, 0);
    CHECK(rec.applied);
    CHECK(refused.empty());
  }
  // Only a signed round lists who survived: the floor without the threat model is refused.
  client::SecAggTrust unsigned_floor;
  unsigned_floor.min_clients = 10;
  CHECK_THROWS_MATCHING(unsigned_floor.validate(1), ConfigError,
                        Catch::Matchers::Contains("needs secagg.threat = malicious-server"));
}
