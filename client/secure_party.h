#pragma once
// A client's side of secure aggregation (SecAgg+, privacy/secagg.h) on the wire messages of
// protocol/secagg_wire.h: the one implementation the simulator's clients and a deployed client
// run. One party per client; each setup starts it afresh (fresh keys, every earlier exchange's
// secrets forgotten), except that under SecAggTrust::require_signed (or min_noise) it remembers the
// last round and phase it sent a masked input for, and refuses that phase or an earlier one again
// (a round of two-phase PowerSGD has an exchange per phase: its phase 1 after its phase 0 is
// taken).
//
//   setup(SecAggSetup)      -> SecAggKeys     its advertised keys (signed with its certified key
//                                             in a signed round); refused: a later phase before
//                                             its masked input of the phase before, in this round
//                                             (kWrongRound), or in a signed round naming other
//                                             clients than that phase's survivors it signed
//                                             (kInconsistentSurvivors); another derivation
//                                             (kUnsupportedVersion), an unsigned round under
//                                             require_signed (kUnsignedRound), a signed one
//                                             without a credential (kNoCredential), a round
//                                             and phase it masked in already (kWrongRound)
//   shareKeys(SecAggAdverts) -> SecAggShares  its key and seed shared among its neighbours
//   mask(SecAggShares, x)   -> SecAggMasked   x clipped to the ring's clip in L2, then each
//                                             coordinate to [-clip, clip], rounded into the
//                                             ring and masked
//   signSurvivors(SecAggSurvivors) -> SecAggSigned   a signed round only (kUnexpectedMessage
//                                             otherwise): its signature of who survived, once
//                                             a round (kDuplicate after); refused when a later
//                                             phase's list names anyone absent, or the list
//                                             says it is absent (kInconsistentSurvivors) or
//                                             leaves fewer than t of its neighbours
//                                             (kTooFewSurvivors)
//   unmask(SecAggUnmask)    -> SecAggReveal   answered once; both shares of one client refused;
//                                             a signed round's dropped neighbours answered with
//                                             pairwise keys, at most (neighbours - t) of them,
//                                             and only with t of its neighbours' signatures of
//                                             the list it signed (kInconsistentSurvivors)
//
// Every message is checked before its state changes: a message of another round (kWrongRound),
// shares addressed to another client (kWrongSender), a step out of order (kUnexpectedMessage),
// and privacy/secagg.h's checks. InputError, the party unchanged.
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "compression/compressor.h"
#include "core/metric.h"
#include "core/param_layout.h"
#include "privacy/secagg.h"
#include "protocol/secagg_wire.h"

namespace starling::client {

// What a client trusts in secure rounds: secagg.threat, secagg.authority and the signing key and
// credential of its key file (transport/keys.h). Under the malicious-server threat model the
// client takes part only in rounds whose adverts are signed, and checks each neighbour's against
// the authority (privacy/crypto.h's Credential): a root or aggregator that swaps a key, or answers
// for a client it invents, is refused (kBadSignature). A signed round without a credential of its
// own is refused (kNoCredential).
struct SecAggTrust {
  // secagg.threat = malicious-server: a setup whose keys are not signed is refused
  // (kUnsignedRound), and so is any fit task in the clear (client/runtime.h): its update leaves
  // it masked or not at all.
  bool require_signed = false;
  std::optional<privacy::Key32> authority;      // whose credentials it accepts
  std::optional<privacy::SecAggSigner> signer;  // its own signing key and credential
  // secagg.min_noise (distributed DP, privacy/dp.h): the least noise this client adds, over its
  // L2 sensitivity in the round's ring (RingSpec::sensitivity): a setup that asks for less (a
  // root's noise multiplier over sqrt(min_clients) below it, or no noise) is refused
  // (kTooLittleNoise), and so are a fit task in the clear (client/runtime.h) and a setup of a
  // round it already masked in (a round run again with fresh noise). 0: any.
  double min_noise = 0;
  // secagg.min_clients: the fewest clients whose inputs a sum this client helps release holds
  // (under distributed DP, whose noise it carries): a setup of fewer clients, or a survivors list
  // that leaves fewer masked inputs, is refused (kTooLittleNoise) before the client signs or
  // reveals anything. Needs require_signed: only a signed round lists who survived before the
  // unmask, so only there can a client count the inputs of the sum it would unmask. 0: any.
  uint64_t min_clients = 0;
  // ConfigError when require_signed lacks the authority or the signer, or the signer's
  // credential is not the authority's for `id` (a key file certified for another id, or by
  // another authority), or min_clients is set without require_signed.
  void validate(uint64_t id) const;
};

// A deployed client's trust: `require_signed` (secagg.threat = malicious-server), the authority's
// public file `authority_file` (secagg.authority; empty: none) and the signing lines of its own
// key file `key_file` (its NAME.key_secret, security.key; empty: none), for client `id`; then
// validate(id). ConfigError naming the file for a signing key that is not its signing-public-key's,
// a key file without signing lines under require_signed, and validate()'s refusals.
SecAggTrust loadSecAggTrust(bool require_signed, const std::string& authority_file,
                            const std::string& key_file, uint64_t id);

class SecureParty {
 public:
  explicit SecureParty(uint64_t id, SecAggTrust trust = {}, protocol::SecAggLimits limits = {});

  std::vector<uint8_t> setup(std::span<const uint8_t> setup_msg);
  std::vector<uint8_t> shareKeys(std::span<const uint8_t> adverts_msg);
  // `x`: the round's dim values (its update, dense; with the round's clip count, dim - 1, the
  // count's value appended here: the clip when x is within it, else 0); `metrics` travel in the
  // clear. The rounding
  // into the ring draws from a fresh random key, or from `rounding_key` when given (the
  // simulator's, from the run seed: a simulated run is then a function of its seed).
  std::vector<uint8_t> mask(std::span<const uint8_t> shares_msg, std::span<const float> x,
                            std::span<const Metric> metrics = {},
                            const privacy::Key32* rounding_key = nullptr);
  // A signed round's survivors (the consistency step), signed once.
  std::vector<uint8_t> signSurvivors(std::span<const uint8_t> survivors_msg);
  std::vector<uint8_t> unmask(std::span<const uint8_t> unmask_msg);

  uint64_t id() const { return id_; }
  // The round and phase of the last setup (round 0: none).
  uint64_t round() const { return params_.round; }
  uint32_t phase() const { return params_.phase; }
  const privacy::SecAggParams& params() const { return params_; }

 private:
  void checkRound(uint64_t round, const char* what) const;

  uint64_t id_;
  SecAggTrust trust_;
  std::vector<uint64_t> round_ids_;  // the clients the last setup named, ascending
  protocol::SecAggLimits limits_;
  privacy::SecAggParams params_;
  std::optional<privacy::SecAggClient> client_;
  // Under require_signed: the round and phase of the last masked input it sent. A setup of that
  // phase or an earlier one is refused, whatever run seed it names (the server chooses that too):
  // a server that ran a phase twice, with and without this client, could subtract the two sums.
  // Kept for the party's life (a client process serves one federation run).
  std::optional<std::pair<uint64_t, uint32_t>> masked_;
  // The survivors list this client signed last (a signed round's consistency step): its round,
  // phase and survivors, ascending. A later phase's setup must name exactly them.
  struct SignedSurvivors {
    uint64_t round = 0;
    uint32_t phase = 0;
    std::vector<uint64_t> clients;
  };
  std::optional<SignedSurvivors> signed_;
};

// What a client's update adds to a secure round (compression::Compressor::secureValues): its
// coordinates on the round's shared support (compression::SharedSupport), in the support's order,
// or acpsgd's one factor a tensor, from `update`'s phase-0 payloads as `compressor` sent them in
// `ctx`'s round. The masked input is this many values, so a shared support of k coordinates sends
// k ring words, not the model's numel. InvalidArgument when the compressor composes with no
// secure sum.
std::vector<float> secureInput(const ParamLayout& layout, const compression::Compressor& compressor,
                               const compression::RoundContext& ctx,
                               const std::vector<compression::Payload>& update);

// x scaled to L2 norm at most `clip` (unchanged when within it), then each coordinate clamped to
// [-clip, clip] (the scaled values may pass it by a rounding). Non-finite values: InvalidArgument.
std::vector<float> clipForRing(std::span<const float> x, double clip);
// The largest float not above `clip`.
float clipAsFloat(double clip);

}  // namespace starling::client
