#pragma once
// The wire messages of secure aggregation (SecAgg+, privacy/secagg.h) in the round: encode and
// decode of the nine tables of protocol/starling.fbs that carry its steps.
//
//   step 0 advertise    server -> client  SecAggSetup    (the round's parameters and clients)
//                       client -> server  SecAggKeys     (its KeyAdvert)
//   step 1 share keys   server -> client  SecAggAdverts  (its neighbours' adverts)
//                       client -> server  SecAggShares   (one sealed share pair per neighbour)
//   step 2 masked input server -> client  SecAggShares   (the shares addressed to it)
//                       client -> server  SecAggMasked   (its masked input, packed to b bits)
//   step 2b survivors   server -> client  SecAggSurvivors (signed rounds: who is absent)
//                       client -> server  SecAggSigned   (its signature of the survivors)
//   step 3 unmask       server -> client  SecAggUnmask   (with its neighbours' SecAggSigned in a
//                                                         signed round)
//                       client -> server  SecAggReveal
//
// Through an edge aggregator (one level), SecAggRelay carries a step's messages for the
// aggregator's clients, each as it is, both ways (RelayStage); the masked inputs come back as one
// SecAggMasked, their ring sum, whose contributors are the aggregator's clients.
//
// Decoders treat the bytes as hostile: the FlatBuffers structure with a table budget from the
// limits, every field present and of its exact size (keys 32 bytes, signatures 64, shares
// privacy::Share::kBytes, a revealed pairwise key 32 and only instead of a share, the packed
// words exactly ceil(dim * bits / 8) bytes), counts within the limits, client lists ascending
// without repeats, metrics finite with printable names, a setup of this build's derivation.
// InputError with its own code (kMissingField, kSizeMismatch, kUnexpectedMessage, kNonFinite,
// kDuplicate, kInconsistentShares, kUnsupportedVersion) on any failure; nothing partial is
// returned. What the protocol then checks (a neighbour, the round, a replay) is privacy/secagg.h's.
#include <cstdint>
#include <span>
#include <vector>

#include "core/metric.h"
#include "privacy/secagg.h"

namespace starling::protocol {

struct SecAggLimits {
  size_t max_bytes = size_t{1} << 30;
  uint64_t max_clients = uint64_t{1} << 20;  // clients a round's setup may name
  uint32_t max_neighbours = 1024;            // adverts, shares and reveals one message may carry
  size_t max_metrics = 32, max_metric_name = 64;
};

struct SecAggSetupMsg {
  uint64_t nonce = 0;
  privacy::SecAggParams params;   // round and run seed included
  std::vector<uint64_t> clients;  // ascending
};
struct SecAggKeysMsg {
  uint64_t nonce = 0;
  privacy::KeyAdvert advert;
};
struct SecAggAdvertsMsg {
  uint64_t round = 0, nonce = 0;
  std::vector<privacy::KeyAdvert> adverts;
};
struct SecAggSharesMsg {
  uint64_t client = 0, round = 0, nonce = 0;
  std::vector<privacy::EncryptedShare> shares;
};
struct SecAggMaskedMsg {
  uint64_t client = 0, nonce = 0;
  uint32_t bits = 0;
  privacy::MaskedInput input;  // round, contributors, words (each below 2^bits)
  std::vector<Metric> metrics;
};
struct SecAggUnmaskMsg {
  uint64_t nonce = 0;
  privacy::UnmaskRequest request;
};
struct SecAggRevealMsg {
  uint64_t nonce = 0;
  privacy::UnmaskResponse response;
};
struct SecAggSurvivorsMsg {
  uint64_t nonce = 0;
  privacy::SurvivorsRequest request;
};
struct SecAggSignedMsg {
  uint64_t nonce = 0;
  privacy::SurvivorsSigned signed_survivors;
};

// What a SecAggRelay carries: the clients an aggregator brings (kRoster, no messages), or one
// step's messages (the root's requests, the clients' answers).
enum class RelayStage : uint8_t {
  kRoster = 0,
  kAdvertise = 1,
  kShareKeys = 2,
  kMaskedInput = 3,  // the shares, before the secure task (answered by a SecAggMasked)
  kUnmask = 4,
  kSurvivors = 5,  // a signed round's survivors, between the masked inputs and the unmask step
};
inline constexpr RelayStage kLastRelayStage = RelayStage::kSurvivors;
struct SecAggRelayMsg {
  uint64_t from = 0;  // the aggregator on its answers, 0 from the root
  uint64_t round = 0, nonce = 0;
  RelayStage stage = RelayStage::kRoster;
  uint32_t deadline_ms = 0;  // from the root: how long the step lasts there
  struct Item {
    uint64_t client = 0;
    std::vector<uint8_t> message;  // a whole message of the step (empty for kRoster)
  };
  std::vector<Item> items;  // clients strictly ascending
  // The root's advertise step: the one setup every item's client is sent (their items carry no
  // message); empty otherwise.
  std::vector<uint8_t> common;
};

std::vector<uint8_t> encode(const SecAggSetupMsg& m);
std::vector<uint8_t> encode(const SecAggKeysMsg& m);
std::vector<uint8_t> encode(const SecAggAdvertsMsg& m);
std::vector<uint8_t> encode(const SecAggSharesMsg& m);
std::vector<uint8_t> encode(const SecAggMaskedMsg& m);
std::vector<uint8_t> encode(const SecAggUnmaskMsg& m);
std::vector<uint8_t> encode(const SecAggRevealMsg& m);
std::vector<uint8_t> encode(const SecAggSurvivorsMsg& m);
std::vector<uint8_t> encode(const SecAggSignedMsg& m);
std::vector<uint8_t> encode(const SecAggRelayMsg& m);

SecAggSetupMsg decodeSecAggSetup(std::span<const uint8_t> bytes, const SecAggLimits& l = {});
SecAggKeysMsg decodeSecAggKeys(std::span<const uint8_t> bytes, const SecAggLimits& l = {});
SecAggAdvertsMsg decodeSecAggAdverts(std::span<const uint8_t> bytes, const SecAggLimits& l = {});
SecAggSharesMsg decodeSecAggShares(std::span<const uint8_t> bytes, const SecAggLimits& l = {});
// `dim`: the words the round's inputs have (kSizeMismatch for another count, before unpacking).
SecAggMaskedMsg decodeSecAggMasked(std::span<const uint8_t> bytes, uint64_t dim,
                                   const SecAggLimits& l = {});
SecAggUnmaskMsg decodeSecAggUnmask(std::span<const uint8_t> bytes, const SecAggLimits& l = {});
SecAggRevealMsg decodeSecAggReveal(std::span<const uint8_t> bytes, const SecAggLimits& l = {});
// The absent clients within max_clients, strictly ascending (they may be none).
SecAggSurvivorsMsg decodeSecAggSurvivors(std::span<const uint8_t> bytes,
                                         const SecAggLimits& l = {});
// A signature of 64 bytes.
SecAggSignedMsg decodeSecAggSigned(std::span<const uint8_t> bytes, const SecAggLimits& l = {});
// Items within max_clients, clients strictly ascending, a stage of RelayStage; kRoster's items
// without messages and no common message; kAdvertise either the root's (a common setup, items
// without messages) or an aggregator's (a message in each item, no common one); the others' items
// each with a message and no common one (messages are not decoded here: each is its step's).
// InputError: kDuplicate, kSizeMismatch, kUnexpectedEncoding, kMissingField.
SecAggRelayMsg decodeSecAggRelay(std::span<const uint8_t> bytes, const SecAggLimits& l = {});

// The size of a masked input's message for `dim` words of `bits` bits from one client with
// `metrics` (each non-zero: FlatBuffers leaves a zero out), for a simulated clock.
size_t secAggMaskedBytes(uint64_t dim, uint32_t bits, uint64_t client,
                         std::span<const Metric> metrics);

}  // namespace starling::protocol
