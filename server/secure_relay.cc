#include "server/secure_relay.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/error.h"
#include "privacy/ring.h"
#include "protocol/control.h"

namespace starling::server {
namespace pr = starling::protocol;
namespace pv = starling::privacy;

SecureRelay::SecureRelay(uint64_t self, pr::SecAggLimits limits) : self_(self), limits_(limits) {
  rules_.all = true;
}

void SecureRelay::take(const pr::SecAggRelayMsg& m) {
  const SecureStage stage = secureStageOf(m.stage);
  if (m.items.empty())
    throw InputError(Errc::kMissingField,
                     "secagg relay: a step for none of this aggregator's clients");
  if (stage == SecureStage::kAdvertise) {
    // A new round: every client is sent the one setup, which tells the ring and the inputs' size.
    if (m.common.empty())
      throw InputError(Errc::kMissingField, "secagg relay: an advertise step without its setup");
    const pr::SecAggSetupMsg setup = pr::decodeSecAggSetup(m.common, limits_);
    if (setup.params.round != m.round || setup.nonce != m.nonce)
      throw InputError(Errc::kWrongRound, "secagg relay: a setup of round " +
                                              std::to_string(setup.params.round) +
                                              " in a relay of round " + std::to_string(m.round));
    for (const auto& it : m.items)
      if (!std::binary_search(setup.clients.begin(), setup.clients.end(), it.client))
        throw InputError(Errc::kWrongSender, "secagg relay: client " + std::to_string(it.client) +
                                                 " is not in the round it is sent the setup of");
    params_ = setup.params;
    nonce_ = setup.nonce;
    started_ = true;
    sum_.clear();
    masked_.clear();
    metrics_.clear();
  } else {
    if (!started_)
      throw InputError(Errc::kUnexpectedMessage,
                       std::string("secagg relay: step ") + stageName(stage) + " before any setup");
    if (m.round != params_.round || m.nonce != nonce_)
      throw InputError(Errc::kWrongRound, "secagg relay: step " + std::string(stageName(stage)) +
                                              " of round " + std::to_string(m.round) +
                                              ", another exchange than round " +
                                              std::to_string(params_.round) + "'s setup");
    // Each step once, in order (a masked-input step again would leave contributors named whose
    // inputs it no longer holds).
    if (static_cast<int>(stage) <= static_cast<int>(stage_))
      throw InputError(stage == stage_ ? Errc::kDuplicate : Errc::kLate,
                       "secagg relay: step " + std::string(stageName(stage)) + " after step " +
                           stageName(stage_));
    for (const auto& it : m.items)
      if (it.message.empty())
        throw InputError(Errc::kMissingField, "secagg relay: no message of step " +
                                                  std::string(stageName(stage)) + " for client " +
                                                  std::to_string(it.client));
  }
  stage_ = stage;
  requests_.clear();
  answers_.clear();
  for (const auto& it : m.items)
    requests_[it.client] = stage == SecureStage::kAdvertise ? m.common : it.message;
  if (stage == SecureStage::kMaskedInput) sum_.assign(params_.dim, 0);
}

void SecureRelay::setMetricRules(SecureMetricRules rules) {
  rules_ = std::move(rules);
  rules_.all = true;
}

std::vector<uint64_t> SecureRelay::clients() const {
  std::vector<uint64_t> out;
  for (const auto& [c, _] : requests_) out.push_back(c);
  return out;
}

bool SecureRelay::inStep(SecureStage stage, uint64_t client) const {
  return started_ && stage == stage_ && requests_.count(client);
}

std::vector<uint8_t> SecureRelay::request(SecureStage stage, uint64_t client) {
  const auto it = requests_.find(client);
  STARLING_CHECK_ARG(stage == stage_ && it != requests_.end(), "secagg relay: no message of step ",
                     stageName(stage), " for client ", client);
  return it->second;
}

void SecureRelay::reply(SecureStage stage, uint64_t client, std::span<const uint8_t> bytes) {
  const std::string who = "client " + std::to_string(client);
  if (stage != stage_ || !requests_.count(client))
    throw InputError(Errc::kUnexpectedMessage, "secagg relay: " + who + " answered step " +
                                                   stageName(stage) + ", which it was not sent");
  if (pr::peekKind(bytes) != answerKind(stage))
    throw InputError(Errc::kUnexpectedMessage, "secagg relay: " + who + " answered step " +
                                                   stageName(stage) + " with another message");
  if (stage != SecureStage::kMaskedInput) {
    // Decoded with the round's bounds (an answer names its sender, round and exchange, and carries
    // at most one share per neighbour): what goes up is no larger than an honest answer.
    pr::SecAggLimits l = limits_;
    l.max_neighbours = std::min<uint32_t>(l.max_neighbours, params_.neighbours);
    uint64_t from = 0, round = 0, nonce = 0;
    switch (stage) {  // every step but the masked input's (below); no default: a new step is a
                      // -Wswitch error here
      case SecureStage::kAdvertise: {
        const auto k = pr::decodeSecAggKeys(bytes, l);
        std::tie(from, round, nonce) = std::tuple{k.advert.client, k.advert.round, k.nonce};
        break;
      }
      case SecureStage::kShareKeys: {
        const auto k = pr::decodeSecAggShares(bytes, l);
        std::tie(from, round, nonce) = std::tuple{k.client, k.round, k.nonce};
        break;
      }
      case SecureStage::kMaskedInput:
        break;
      case SecureStage::kSurvivors: {
        const auto k = pr::decodeSecAggSigned(bytes, l);
        std::tie(from, round, nonce) =
            std::tuple{k.signed_survivors.client, k.signed_survivors.round, k.nonce};
        break;
      }
      case SecureStage::kUnmask: {
        const auto k = pr::decodeSecAggReveal(bytes, l);
        std::tie(from, round, nonce) = std::tuple{k.response.client, k.response.round, k.nonce};
        break;
      }
    }
    if (from != client)
      throw InputError(Errc::kWrongSender, "secagg relay: " + who + " sent an answer of client " +
                                               std::to_string(from));
    if (round != params_.round || nonce != nonce_)
      throw InputError(Errc::kWrongRound,
                       "secagg relay: " + who + " answered another round or exchange");
    if (!answers_.emplace(client, std::vector<uint8_t>(bytes.begin(), bytes.end())).second)
      throw InputError(Errc::kDuplicate,
                       "secagg relay: " + who + " answered step " + stageName(stage) + " twice");
    return;
  }
  const pr::SecAggMaskedMsg m = pr::decodeSecAggMasked(bytes, params_.dim, limits_);
  if (m.client != client || m.input.clients != std::vector<uint64_t>{client})
    throw InputError(Errc::kWrongSender,
                     "secagg relay: " + who + " sent a masked input of other clients");
  if (masked_.count(client))
    throw InputError(Errc::kDuplicate, "secagg relay: " + who + "'s masked input twice");
  // Its metrics travel in the clear and go up summed: one client's must not void its subtree's,
  // and each declared one must be there (the root counts a sum's metrics by its contributors).
  checkMaskedInput(m, params_, nonce_, rules_, who, 1.0);
  pv::add(params_.ring, sum_, m.input.words);
  masked_.insert(client);
  for (const auto& x : m.metrics) metrics_[x.name] += x.value;
}

size_t SecureRelay::maskedBytes(uint64_t client, std::span<const Metric> metrics) const {
  return pr::secAggMaskedBytes(params_.dim, params_.ring.bits, client, metrics);
}

std::vector<uint8_t> SecureRelay::answerUp() const {
  pr::SecAggRelayMsg m{self_, params_.round, nonce_, relayStageOf(stage_), 0, {}, {}};
  for (const auto& [c, bytes] : answers_) m.items.push_back({c, bytes});
  return pr::encode(m);
}

std::optional<std::vector<uint8_t>> SecureRelay::maskedUp() const {
  if (masked_.empty()) return std::nullopt;
  pr::SecAggMaskedMsg m;
  m.client = self_;
  m.nonce = nonce_;
  m.bits = params_.ring.bits;
  m.input.round = params_.round;
  m.input.clients.assign(masked_.begin(), masked_.end());
  m.input.words = sum_;
  for (const auto& [name, v] : metrics_) m.metrics.push_back(Metric{name, v});
  return pr::encode(m);
}

}  // namespace starling::server
