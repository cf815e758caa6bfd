#pragma once
// Secure aggregation (SecAgg+, privacy/secagg.h) as the round engine runs it: the server's side
// of one round over the wire messages of protocol/secagg_wire.h. The engine makes one per round
// for its sampled clients and drives its steps through the fleet (server/engine.h), four, or five
// in a signed round:
//
//   kAdvertise    Fleet::exchange: request(kAdvertise, c) is the round's setup, reply its keys
//   kShareKeys    Fleet::exchange: the neighbours' adverts, reply the client's sealed shares
//   kMaskedInput  Fleet::runPhase with PhaseTask::secure: the client trains; request is the
//                 shares addressed to it, reply its masked input (its update clipped to the
//                 ring's clip, client/secure_party.h) instead of an update
//   kSurvivors    a signed round only (secagg.threat = malicious-server), Fleet::exchange: who
//                 is absent from the masked inputs, reply the client's signature of that list
//   kUnmask       Fleet::exchange: what it must reveal (and, signed, its neighbours' signatures
//                 of the survivors), reply the shares
//
// then finish(): the survivors' sum, decoded from the ring, checked against n times the clip (which
// catches a gross cheat only: a client may still move the mean anywhere within that bound), or
// the reason the round has none. A client that does not answer a step drops out of the rest;
// privacy/secagg.h removes what it left behind. Every reply is checked (sender, round, this
// round's nonce, then the protocol's checks) and refused with InputError, nothing changed.
// Not thread-safe: the fleet calls it from its one thread.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/metric.h"
#include "privacy/secagg.h"
#include "protocol/control.h"
#include "protocol/secagg_wire.h"

namespace starling::server {

// secagg.*: 0 for neighbours or threshold: chosen per round (below).
struct SecAggConfig {
  bool enabled = false;
  uint32_t neighbours = 0;  // k, even; 0: the smallest even number >= 2 log2(n), at least 4
  uint32_t threshold = 0;   // t, in [2, k]; 0: k / 2 + 1 (of the neighbours a round has)
  uint32_t bits = 32;       // the ring Z_2^bits, 8 to 64
  double clip = 0.0;        // L2 bound each client clips its update to before masking (> 0)
  // secagg.threat = malicious-server: the federation authority's public key (secagg.authority).
  // Rounds then sign their advertised keys, and every party checks each advert's credential
  // against it (privacy/crypto.h); empty: semi-honest, unsigned.
  std::optional<privacy::Key32> authority;
  // Distributed DP (privacy/dp.h; the round engine sets it from privacy.*): each client's noise
  // in the ring, sized per round by RingSpec::fit; multiplier 0: none.
  privacy::RingNoise noise{};
  // ConfigError naming the key; with `max_clients` (the most clients a round may sample) and the
  // model's `dim`, also a ring in which their sum could wrap or rounding would cost more than
  // privacy::RingSpec allows, with the bits it would take.
  void validate(uint64_t max_clients, uint64_t dim) const;
  // The round's parameters for its n clients.
  privacy::SecAggParams paramsFor(uint64_t run_seed, uint64_t round, uint64_t n,
                                  uint64_t dim) const;
};

// The steps in the order they run; kSurvivors only in a signed round (SecAggParams::signed_keys).
// One step has several numbers: the survivors step is SecureStage 3, "2b" in privacy/secagg.h,
// protocol::RelayStage::kSurvivors (5, appended to the relay's stages) and message kinds 24 and
// 25; relayStageOf and secureStageOf map the stages both ways.
enum class SecureStage : uint8_t {
  kAdvertise = 0,
  kShareKeys = 1,
  kMaskedInput = 2,
  kSurvivors = 3,
  kUnmask = 4,
};
inline constexpr size_t kSecureStages = 5;
static_assert(kSecureStages == static_cast<size_t>(SecureStage::kUnmask) + 1);
// Whether a round of `params` runs step `s`.
bool runsStage(const privacy::SecAggParams& params, SecureStage s);
const char* stageName(SecureStage s);
// The kind of message a client answers step `s` with.
protocol::MessageKind answerKind(SecureStage s);
// The relay stage of a secure step, and back (kRoster has no step: InvalidArgument).
protocol::RelayStage relayStageOf(SecureStage s);
SecureStage secureStageOf(protocol::RelayStage s);

// What the server checks of a masked input's metrics (in the clear): declared names only, and
// each within max_abs (aggregation/bounds.h's max_metric_abs) times the inputs it sums; a masked
// input whose metrics are not is refused, and its client drops out, rather than one client's
// metric voiding the round. `all`: every declared metric present (an edge aggregator's check of
// its clients, whose metrics it sends up as sums counted by contributor).
struct SecureMetricRules {
  std::vector<std::string> declared;
  double max_abs = 1e9;
  bool all = false;
};

// A masked input's checks against its round (its sender's are the caller's): the round
// (kWrongRound), the exchange's nonce (kLate), the ring's bits (kSizeMismatch), and its metrics
// against `rules` for `count` inputs (kUnexpectedEncoding, kValueTooLarge, kMissingField). The
// root's and an edge aggregator's one check. `who` names the sender in the message.
void checkMaskedInput(const protocol::SecAggMaskedMsg& m, const privacy::SecAggParams& params,
                      uint64_t nonce, const SecureMetricRules& rules, const std::string& who,
                      double count);

// One side of a round's secure steps as a fleet drives them: what each client is sent, and what is
// made of its answer. The root's is SecureRound; an edge aggregator's is SecureRelay
// (server/secure_relay.h), which forwards its upstream's messages and adds its clients' masked
// inputs in the ring. A fleet sends request(stage, c) to each participant c that is inStep and
// hands its answer to reply(stage, c, bytes); a participant that relays clients (relayedBy, one
// level of edge aggregators, the root's only) is sent relayRequest(), and each answer it relays
// goes to replyVia, its masked inputs' ring sum to replyRelayed.
class SecureSteps {
 public:
  virtual ~SecureSteps() = default;
  // `client`'s message of `stage` (InvalidArgument when it is sent none: !inStep).
  virtual std::vector<uint8_t> request(SecureStage stage, uint64_t client) = 0;
  // `client`'s answer of `stage`; InputError, nothing changed, when refused.
  virtual void reply(SecureStage stage, uint64_t client, std::span<const uint8_t> bytes) = 0;
  // The size of a masked input's message from `client` with these metrics (the simulated clock's).
  virtual size_t maskedBytes(uint64_t client, std::span<const Metric> metrics) const = 0;
  // The round and the nonce every message of its exchanges carries (0 before the first).
  virtual uint64_t round() const = 0;
  virtual uint64_t nonce() const = 0;
  // Whether `client` is sent `stage`'s request: at the root, a client of the round that answered
  // every step the round ran before it (in a signed round, the unmask step only to the clients
  // whose survivors signature it took: this is where that is decided; privacy::SecAggServer
  // refuses the others too); at an aggregator, one its upstream sent a message of the step for.
  virtual bool inStep(SecureStage stage, uint64_t client) const = 0;
  // The clients peer `peer` relays (empty: none; an edge aggregator's below the root).
  virtual std::span<const uint64_t> relayedBy(uint64_t peer) const;
  // An answer `peer` relays for `client`: refused (kWrongSender) unless `peer` relays it in this
  // step, then as reply(). The root's only (kUnexpectedMessage elsewhere).
  virtual void replyVia(uint64_t peer, SecureStage stage, uint64_t client,
                        std::span<const uint8_t> bytes);
  // The masked-input step's answer of `peer`: the ring sum of some of the clients it relays. The
  // root's only (kUnexpectedMessage elsewhere).
  virtual void replyRelayed(uint64_t peer, std::span<const uint8_t> bytes);
};

// The relay the root sends edge aggregator `peer` for `stage`: the requests of the clients it
// relays that are in the step (at kAdvertise their one setup once, as `common`), with the step's
// deadline. No items when none is in the step.
protocol::SecAggRelayMsg relayRequest(SecureSteps& round, uint64_t peer, SecureStage stage,
                                      uint32_t deadline_ms);

class SecureRound final : public SecureSteps {
 public:
  // `clients`: the round's sample (at least 3: with 2, each would learn the other's input from the
  // sum; InvalidArgument). `relayed`: edge aggregator -> the clients (among `clients`) it relays,
  // each client under one aggregator at most (InvalidArgument). `authority`: whose credentials a
  // signed round's adverts must carry (required when params.signed_keys: ConfigError).
  SecureRound(privacy::SecAggParams params, std::span<const uint64_t> clients,
              SecureMetricRules metrics = {}, protocol::SecAggLimits limits = {},
              std::map<uint64_t, std::vector<uint64_t>> relayed = {},
              const privacy::Key32* authority = nullptr);

  const privacy::SecAggParams& params() const { return params_; }
  uint64_t round() const override { return params_.round; }
  uint64_t nonce() const override { return nonce_; }
  // Another nonce for the exchange, before its first request (InvalidArgument after): the one
  // every worker of a simulation agrees on (FleetWorkers::agreeNonce).
  void setNonce(uint64_t nonce);
  // Opens `stage` (the steps open in order; an earlier one again is an InvalidArgument) and gives
  // `client`'s request of it.
  std::vector<uint8_t> request(SecureStage stage, uint64_t client) override;
  // A reply of the open step only: one of an earlier step is late (kLate), of a later one
  // unexpected (kUnexpectedMessage), and neither changes anything.
  void reply(SecureStage stage, uint64_t client, std::span<const uint8_t> bytes) override;
  // An aggregator's ring sum of the masked inputs of clients it relays: refused when the
  // masked-input step is not open (kUnexpectedMessage before, kLate after), when it names another
  // sender (kWrongSender), when a contributor is not a client it relays in the step
  // (kWrongSender) or answered already (kDuplicate), and by checkMaskedInput (its metrics within
  // max_abs times its contributors: they are sums); the decoder's codes. Nothing changes when
  // refused.
  void replyRelayed(uint64_t peer, std::span<const uint8_t> bytes) override;
  void replyVia(uint64_t peer, SecureStage stage, uint64_t client,
                std::span<const uint8_t> bytes) override;
  std::span<const uint64_t> relayedBy(uint64_t peer) const override;
  bool inStep(SecureStage stage, uint64_t client) const override;
  // The clients whose reply of `stage` was taken.
  const std::set<uint64_t>& answered(SecureStage stage) const {
    return answered_[static_cast<size_t>(stage)];
  }
  size_t maskedBytes(uint64_t client, std::span<const Metric> metrics) const override;

  struct Outcome {
    bool ok = false;
    std::string reason;  // why not, when !ok
    // The survivors' clipped updates summed (dim values; with the clip count the last is the
    // count of updates within the clip times the clip).
    std::vector<float> sum;
    std::vector<uint64_t> survivors;                           // whose inputs the sum holds
    std::map<std::string, std::pair<double, double>> metrics;  // name -> (sum, count)
    // Whose revealed share at the unmask step was wrong (decoded around: the sum is the honest
    // one): the revealer, or the owner that dealt it (privacy::SecAggServer::Result::liars).
    std::vector<uint64_t> liars;
  };
  // Once, after the unmask step.
  Outcome finish();

 private:
  privacy::SecAggParams params_;
  SecureMetricRules rules_;
  protocol::SecAggLimits limits_;
  uint64_t nonce_;
  privacy::DhKeyPair probe_;  // agrees with every advertised key once: a low-order one is refused
  privacy::SecAggServer server_;
  int open_ = -1;                   // the step open (SecureStage), -1 before the first request
  std::vector<uint8_t> setup_;      // the advertise step's request, every client's alike
  std::vector<uint8_t> survivors_;  // the survivors step's request, every client's alike too
  std::set<uint64_t> clients_;
  std::map<uint64_t, std::vector<uint64_t>> relayed_;
  std::set<uint64_t> answered_[kSecureStages];
  // Per metric, each sender's (sum, count) by sender id (a client, or an aggregator for its
  // ring sum): summed in id order at finish(), so that the order the replies came in (the
  // network's, or the simulator's workers') does not change the round's bits.
  std::map<std::string, std::map<uint64_t, std::pair<double, double>>> metrics_;
  bool finished_ = false;
};

}  // namespace starling::server
