#include "server/secure_relay.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "privacy/ring.h"
#include "protocol/control.h"

namespace starling::server {
namespace pr = starling::protocol;
namespace pv = starling::privacy;

namespace {

pr::MessageKind answerKind(SecureStage s) {
  switch (s) {
    case SecureStage::kAdvertise:
      return pr::MessageKind::kSecAggKeys;
    case SecureStage::kShareKeys:
      return pr::MessageKind::kSecAggShares;
    case SecureStage::kMaskedInput:
      return pr::MessageKind::kSecAggMasked;
    case SecureStage::kUnmask:
      return pr::MessageKind::kSecAggReveal;
  }
  return pr::MessageKind::kSecAggKeys;
}

}  // namespace

pr::RelayStage relayStageOf(SecureStage s) {
  return static_cast<pr::RelayStage>(static_cast<uint8_t>(s) + 1);
}

SecureStage secureStageOf(pr::RelayStage s) {
  STARLING_CHECK_ARG(s != pr::RelayStage::kRoster, "secagg relay: the roster is no secure step");
  return static_cast<SecureStage>(static_cast<uint8_t>(s) - 1);
}

SecureRelay::SecureRelay(uint64_t self, SecureMetricRules metrics, pr::SecAggLimits limits)
    : self_(self), rules_(std::move(metrics)), limits_(limits) {}

void SecureRelay::take(const pr::SecAggRelayMsg& m) {
  const SecureStage stage = secureStageOf(m.stage);
  if (m.items.empty())
    throw InputError(Errc::kMissingField,
                     "secagg relay: a step for none of this aggregator's "
                     "clients");
  if (stage == SecureStage::kAdvertise) {
    // A new round: every client is sent the same setup, which tells the ring and the inputs' size.
    for (const auto& it : m.items)
      if (it.message != m.items.front().message)
        throw InputError(Errc::kInconsistentShares, "secagg relay: the setup for client " +
                                                        std::to_string(it.client) +
                                                        " differs from the others'");
    const pr::SecAggSetupMsg setup = pr::decodeSecAggSetup(m.items.front().message, limits_);
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
    if (static_cast<int>(stage) < static_cast<int>(stage_))
      throw InputError(Errc::kLate, "secagg relay: step " + std::string(stageName(stage)) +
                                        " after step " + stageName(stage_));
  }
  stage_ = stage;
  requests_.clear();
  answers_.clear();
  for (const auto& it : m.items) requests_[it.client] = it.message;
  if (stage == SecureStage::kMaskedInput) sum_.assign(params_.dim, 0);
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
  const std::string who = "secagg relay: client " + std::to_string(client);
  if (stage != stage_ || !requests_.count(client))
    throw InputError(Errc::kUnexpectedMessage,
                     who + " answered step " + stageName(stage) + ", which it was not sent");
  if (pr::peekKind(bytes) != answerKind(stage))
    throw InputError(Errc::kUnexpectedMessage,
                     who + " answered step " + stageName(stage) + " with another message");
  if (stage != SecureStage::kMaskedInput) {
    if (!answers_.emplace(client, std::vector<uint8_t>(bytes.begin(), bytes.end())).second)
      throw InputError(Errc::kDuplicate, who + " answered step " + stageName(stage) + " twice");
    return;
  }
  const pr::SecAggMaskedMsg m = pr::decodeSecAggMasked(bytes, params_.dim, limits_);
  if (m.client != client || m.input.clients != std::vector<uint64_t>{client})
    throw InputError(Errc::kWrongSender, who + " sent a masked input of other clients");
  if (m.input.round != params_.round || m.nonce != nonce_)
    throw InputError(Errc::kWrongRound, who + " sent a masked input of another exchange");
  if (m.bits != params_.ring.bits)
    throw InputError(Errc::kSizeMismatch, who + " masked in a ring of " + std::to_string(m.bits) +
                                              " bits, the round's has " +
                                              std::to_string(params_.ring.bits));
  if (masked_.count(client)) throw InputError(Errc::kDuplicate, who + "'s masked input twice");
  // Its metrics travel in the clear and go up summed: one client's must not void its subtree's.
  for (const auto& x : m.metrics) {
    if (std::find(rules_.declared.begin(), rules_.declared.end(), x.name) == rules_.declared.end())
      throw InputError(Errc::kUnexpectedEncoding,
                       who + " sent metric " + x.name + ", which the round did not declare");
    if (!(std::fabs(x.value) <= rules_.max_abs))
      throw InputError(Errc::kValueTooLarge, who + "'s metric " + x.name + " is beyond " +
                                                 std::to_string(rules_.max_abs));
  }
  pv::add(params_.ring, sum_, m.input.words);
  masked_.insert(client);
  for (const auto& x : m.metrics) metrics_[x.name] += x.value;
}

size_t SecureRelay::maskedBytes(uint64_t client, std::span<const Metric> metrics) const {
  return pr::secAggMaskedBytes(params_.dim, params_.ring.bits, client, metrics);
}

std::vector<uint8_t> SecureRelay::answerUp() const {
  pr::SecAggRelayMsg m{self_, params_.round, nonce_, relayStageOf(stage_), 0, {}};
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
