#pragma once
// An edge aggregator's side of a secure round it relays (SecAgg+ through one level of
// aggregators, docs/privacy.md): its upstream sends, in one SecAggRelay per step, the message of
// each of its clients in the round; the aggregator's fleet (server/zmq_fleet.h) sends each client
// its own, as it is, and hands back each answer, which goes up in one SecAggRelay. At the
// masked-input step it adds its clients' masked inputs in the ring and sends up one SecAggMasked,
// their sum, whose contributors are those clients. It reads the round's setup (the ring and the
// size of the inputs) and checks each masked input's sender, round, exchange, ring and size before
// adding it; every other check is the root's, which sees each client's answer as the client sent
// it. It learns what the root learns of its clients: their advertised public keys, shares sealed
// between clients (which it cannot open), and masked inputs, not their updates.
//
//   take(relay)        a step's messages from upstream (kAdvertise starts a round: the setup
//                      is read from its one common message; a later step must be the same round's
//                      and exchange's, and come after the last)
//   setMetricRules     the round's declared metrics (from the secure task), before its inputs
//   request / reply    SecureSteps, for its fleet: each answer decoded with the round's bounds and
//                      checked (sender, round, exchange) before it is kept or added
//   answerUp()         the step's answers, for upstream
//   maskedUp()         the masked inputs' ring sum (none when no client's arrived)
//
// Not thread-safe: the aggregator's one thread runs it.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "protocol/secagg_wire.h"
#include "server/secure_round.h"

namespace starling::server {

class SecureRelay final : public SecureSteps {
 public:
  // `self`: the aggregator's id upstream (its answers name it).
  explicit SecureRelay(uint64_t self, protocol::SecAggLimits limits = {});

  // A step's relay from upstream (not kRoster: InvalidArgument). InputError, nothing changed: no
  // items (kMissingField); at kAdvertise no setup (kMissingField), one that does not decode (its
  // codes), of another round or exchange (kWrongRound), or an item's client not in it
  // (kWrongSender); a later step before any setup (kUnexpectedMessage), of another round or
  // exchange (kWrongRound), again (kDuplicate), before the last (kLate), or an item without its
  // message (kMissingField).
  void take(const protocol::SecAggRelayMsg& m);
  // What a client's masked input may carry in the clear, from the round's secure task: declared
  // metrics, each within max_abs, and every declared one (checked per client: one client's metric
  // must not void the subtree's sum at the root, and the root counts a sum's metrics by its
  // contributors).
  void setMetricRules(SecureMetricRules rules);
  // The step the last take() opened, and the clients it carries a message for.
  SecureStage stage() const { return stage_; }
  std::vector<uint64_t> clients() const;

  std::vector<uint8_t> request(SecureStage stage, uint64_t client) override;
  // An exchange step's answer is decoded with the round's bounds (at most one share per
  // neighbour) and kept as it is; a masked input is checked (checkMaskedInput) and added to the
  // ring sum. InputError, nothing changed: a step or client it was not sent, or another kind
  // (kUnexpectedMessage), another sender (kWrongSender), round or exchange (kWrongRound for an
  // exchange step's answer; checkMaskedInput's codes for a masked input), twice (kDuplicate), and
  // the decoders' codes.
  void reply(SecureStage stage, uint64_t client, std::span<const uint8_t> bytes) override;
  size_t maskedBytes(uint64_t client, std::span<const Metric> metrics) const override;
  uint64_t round() const override { return params_.round; }
  uint64_t nonce() const override { return nonce_; }
  bool inStep(SecureStage stage, uint64_t client) const override;

  // The answers of the open exchange step, for upstream (a SecAggRelay from this aggregator).
  std::vector<uint8_t> answerUp() const;
  // The ring sum of the masked inputs taken, for upstream; none when no input arrived.
  std::optional<std::vector<uint8_t>> maskedUp() const;
  // Clients whose masked input is in the sum.
  const std::set<uint64_t>& masked() const { return masked_; }

 private:
  uint64_t self_;
  SecureMetricRules rules_;
  protocol::SecAggLimits limits_;
  privacy::SecAggParams params_;
  uint64_t nonce_ = 0;
  bool started_ = false;
  SecureStage stage_ = SecureStage::kAdvertise;
  std::map<uint64_t, std::vector<uint8_t>> requests_;  // this step's, by client
  std::map<uint64_t, std::vector<uint8_t>> answers_;   // this step's, by client
  std::vector<uint64_t> sum_;                          // the masked inputs' ring sum
  std::set<uint64_t> masked_;
  std::map<std::string, double> metrics_;  // their sums
};

}  // namespace starling::server
