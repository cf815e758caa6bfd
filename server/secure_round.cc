#include "server/secure_round.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "privacy/crypto.h"
#include "privacy/ring.h"

namespace starling::server {
namespace pr = starling::protocol;
namespace pv = starling::privacy;

namespace {

uint32_t autoNeighbours(uint64_t n) {
  uint32_t lg = 0;
  while ((uint64_t{1} << lg) < n) ++lg;
  uint32_t k = std::max<uint32_t>(4, 2 * lg);
  return k + (k % 2);
}

uint64_t freshNonce() {
  const pv::Key32 k = pv::randomKey();
  uint64_t n = 0;
  std::memcpy(&n, k.data(), sizeof n);
  return n == 0 ? 1 : n;  // never 0: a zero field is left out, and every message's size is fixed
}

const pv::SecAggParams& atLeastThree(const pv::SecAggParams& p, std::span<const uint64_t> clients) {
  if (clients.size() < 3)
    STARLING_THROW(InvalidArgument,
                   "secure aggregation needs at least 3 clients a round (with 2, each would learn "
                   "the other's update from the sum), got ",
                   clients.size());
  return p;
}

}  // namespace

void SecAggConfig::validate(uint64_t max_clients, uint64_t dim) const {
  if (!enabled) return;
  if (neighbours != 0 && (neighbours < 2 || neighbours % 2 != 0))
    STARLING_THROW(ConfigError,
                   "secagg.neighbours must be 0 (chosen per round) or even and at "
                   "least 2, got ",
                   neighbours);
  if (threshold != 0 && (threshold < 2 || (neighbours != 0 && threshold > neighbours)))
    STARLING_THROW(ConfigError,
                   "secagg.threshold must be 0 (half the neighbours and one) or in "
                   "[2, secagg.neighbours], got ",
                   threshold);
  if (threshold != 0 && neighbours != 0 && 2 * threshold <= neighbours)
    STARLING_THROW(ConfigError, "secagg.threshold (", threshold,
                   ") must exceed half of "
                   "secagg.neighbours (",
                   neighbours,
                   "): with fewer, a server could ask half of "
                   "a client's neighbours for its seed and the other half for its mask key, and "
                   "unmask its update alone");
  if (!(std::isfinite(clip) && clip > 0))
    STARLING_THROW(ConfigError,
                   "secagg.clip must be finite and > 0 (the L2 bound each client "
                   "clips its update to before masking), got ",
                   clip);
  (void)pv::RingSpec::fit(bits, clip, std::max<uint64_t>(max_clients, 1), dim,
                          noise.multiplier > 0 ? &noise : nullptr);
}

pv::SecAggParams SecAggConfig::paramsFor(uint64_t run_seed, uint64_t round, uint64_t n,
                                         uint64_t dim) const {
  pv::SecAggParams p;
  p.run_seed = run_seed;
  p.round = round;
  p.neighbours = neighbours != 0 ? neighbours : autoNeighbours(n);
  // The neighbours a client really has: all the others when the graph is complete.
  const uint64_t have = std::min<uint64_t>(p.neighbours, n > 0 ? n - 1 : 0);
  p.threshold = threshold != 0 ? threshold : static_cast<uint32_t>(have / 2 + 1);
  // t > half the neighbours a client has: with fewer, a server could ask one half for a client's
  // seed and the other for its mask key, and unmask it alone. And no more than it has.
  if (p.threshold > have || 2 * static_cast<uint64_t>(p.threshold) <= have)
    STARLING_THROW(InvalidArgument, "secagg.threshold = ", p.threshold, " does not fit a round of ",
                   n, " clients, where each has ", have,
                   " neighbours: it must exceed half of them and not exceed them");
  p.ring = pv::RingSpec::fit(bits, clip, n, dim, noise.multiplier > 0 ? &noise : nullptr);
  p.dim = dim;
  p.signed_keys = authority.has_value();
  return p;
}

const char* stageName(SecureStage s) {
  switch (s) {
    case SecureStage::kAdvertise:
      return "advertise keys";
    case SecureStage::kShareKeys:
      return "share keys";
    case SecureStage::kMaskedInput:
      return "masked input";
    case SecureStage::kSurvivors:
      return "survivors";
    case SecureStage::kUnmask:
      return "unmask";
  }
  return "unknown";
}

bool runsStage(const pv::SecAggParams& params, SecureStage s) {
  return s != SecureStage::kSurvivors || params.signed_keys;
}

pr::MessageKind answerKind(SecureStage s) {
  switch (s) {
    case SecureStage::kAdvertise:
      return pr::MessageKind::kSecAggKeys;
    case SecureStage::kShareKeys:
      return pr::MessageKind::kSecAggShares;
    case SecureStage::kMaskedInput:
      return pr::MessageKind::kSecAggMasked;
    case SecureStage::kSurvivors:
      return pr::MessageKind::kSecAggSigned;
    case SecureStage::kUnmask:
      return pr::MessageKind::kSecAggReveal;
  }
  return pr::MessageKind::kSecAggKeys;
}

pr::RelayStage relayStageOf(SecureStage s) {
  switch (s) {
    case SecureStage::kAdvertise:
      return pr::RelayStage::kAdvertise;
    case SecureStage::kShareKeys:
      return pr::RelayStage::kShareKeys;
    case SecureStage::kMaskedInput:
      return pr::RelayStage::kMaskedInput;
    case SecureStage::kSurvivors:
      return pr::RelayStage::kSurvivors;
    case SecureStage::kUnmask:
      return pr::RelayStage::kUnmask;
  }
  STARLING_THROW(InvalidArgument, "secagg: no such step");
}

SecureStage secureStageOf(pr::RelayStage s) {
  switch (s) {
    case pr::RelayStage::kRoster:
      break;
    case pr::RelayStage::kAdvertise:
      return SecureStage::kAdvertise;
    case pr::RelayStage::kShareKeys:
      return SecureStage::kShareKeys;
    case pr::RelayStage::kMaskedInput:
      return SecureStage::kMaskedInput;
    case pr::RelayStage::kSurvivors:
      return SecureStage::kSurvivors;
    case pr::RelayStage::kUnmask:
      return SecureStage::kUnmask;
  }
  STARLING_THROW(InvalidArgument, "secagg relay: the roster is no secure step");
}

void checkMaskedInput(const pr::SecAggMaskedMsg& m, const pv::SecAggParams& params, uint64_t nonce,
                      const SecureMetricRules& rules, const std::string& who, double count) {
  if (m.input.round != params.round)
    throw InputError(Errc::kWrongRound, "secagg: " + who + " sent a masked input of round " +
                                            std::to_string(m.input.round) + " in round " +
                                            std::to_string(params.round));
  if (m.nonce != nonce)
    throw InputError(Errc::kLate, "secagg: " + who + " answered another exchange (a replay)");
  if (m.bits != params.ring.bits)
    throw InputError(Errc::kSizeMismatch, "secagg: " + who + " masked in a ring of " +
                                              std::to_string(m.bits) + " bits, the round's has " +
                                              std::to_string(params.ring.bits));
  for (const auto& x : m.metrics) {
    if (std::find(rules.declared.begin(), rules.declared.end(), x.name) == rules.declared.end())
      throw InputError(Errc::kUnexpectedEncoding, "secagg: " + who + " sent metric " + x.name +
                                                      ", which the round did not declare");
    if (!(std::fabs(x.value) <= rules.max_abs * count))
      throw InputError(Errc::kValueTooLarge, "secagg: " + who + "'s metric " + x.name + " is " +
                                                 std::to_string(x.value) + ", beyond " +
                                                 std::to_string(rules.max_abs * count));
  }
  if (rules.all)
    for (const auto& name : rules.declared)
      if (std::none_of(m.metrics.begin(), m.metrics.end(),
                       [&](const Metric& x) { return x.name == name; }))
        throw InputError(Errc::kMissingField, "secagg: " + who + " sent no metric " + name +
                                                  ", which the round declared");
}

std::span<const uint64_t> SecureSteps::relayedBy(uint64_t) const { return {}; }

void SecureSteps::replyVia(uint64_t peer, SecureStage, uint64_t, std::span<const uint8_t>) {
  throw InputError(Errc::kUnexpectedMessage,
                   "secagg: " + std::to_string(peer) +
                       " relayed a client's answer, which only the root takes (secure "
                       "aggregation runs through one level of aggregators)");
}

void SecureSteps::replyRelayed(uint64_t peer, std::span<const uint8_t>) {
  throw InputError(Errc::kUnexpectedMessage,
                   "secagg: " + std::to_string(peer) +
                       " sent a ring sum of masked inputs, which only the root takes (secure "
                       "aggregation runs through one level of aggregators)");
}

pr::SecAggRelayMsg relayRequest(SecureSteps& round, uint64_t peer, SecureStage stage,
                                uint32_t deadline_ms) {
  pr::SecAggRelayMsg m{0, round.round(), round.nonce(), relayStageOf(stage), deadline_ms, {}, {}};
  for (uint64_t c : round.relayedBy(peer)) {
    if (!round.inStep(stage, c)) continue;
    if (stage != SecureStage::kAdvertise) {
      m.items.push_back({c, round.request(stage, c)});
    } else {  // every client is sent the same setup: once
      if (m.common.empty()) m.common = round.request(stage, c);
      m.items.push_back({c, {}});
    }
  }
  return m;
}

SecureRound::SecureRound(pv::SecAggParams params, std::span<const uint64_t> clients,
                         SecureMetricRules metrics, pr::SecAggLimits limits,
                         std::map<uint64_t, std::vector<uint64_t>> relayed,
                         const pv::Key32* authority)
    : params_(std::move(params)),
      rules_(std::move(metrics)),
      limits_(limits),
      nonce_(freshNonce()),
      probe_(pv::DhKeyPair::generate()),
      server_(atLeastThree(params_, clients), clients, authority),
      clients_(clients.begin(), clients.end()),
      relayed_(std::move(relayed)) {
  params_.session = nonce_;
  server_.setSession(nonce_);
  std::set<uint64_t> seen;
  for (auto& [peer, cs] : relayed_) {
    std::sort(cs.begin(), cs.end());
    for (uint64_t c : cs) {
      STARLING_CHECK_ARG(clients_.count(c), "secagg: aggregator ", peer, " relays client ", c,
                         ", which is not in the round");
      STARLING_CHECK_ARG(seen.insert(c).second, "secagg: client ", c,
                         " is relayed by two aggregators");
    }
  }
}

void SecureRound::replyVia(uint64_t peer, SecureStage stage, uint64_t client,
                           std::span<const uint8_t> bytes) {
  const std::span<const uint64_t> mine = relayedBy(peer);
  if (!std::binary_search(mine.begin(), mine.end(), client) || !inStep(stage, client))
    throw InputError(Errc::kWrongSender,
                     "secagg: " + std::to_string(peer) + " relayed an answer of client " +
                         std::to_string(client) + ", which it does not relay in this step");
  reply(stage, client, bytes);
}

std::span<const uint64_t> SecureRound::relayedBy(uint64_t peer) const {
  const auto it = relayed_.find(peer);
  return it == relayed_.end() ? std::span<const uint64_t>{} : it->second;
}

bool SecureRound::inStep(SecureStage stage, uint64_t client) const {
  if (!clients_.count(client) || !runsStage(params_, stage)) return false;
  for (int s = 0; s < static_cast<int>(stage); ++s)
    if (runsStage(params_, static_cast<SecureStage>(s)) && !answered_[s].count(client))
      return false;
  return true;
}

void SecureRound::setNonce(uint64_t nonce) {
  STARLING_CHECK_ARG(open_ == -1, "secagg: the nonce is set before the exchange's first request");
  nonce_ = nonce;
  params_.session = nonce;
  server_.setSession(nonce);
}

std::vector<uint8_t> SecureRound::request(SecureStage stage, uint64_t client) {
  STARLING_CHECK_ARG(clients_.count(client), "secagg: a request for ", client,
                     ", which is not a client of the round");
  STARLING_CHECK_ARG(static_cast<int>(stage) >= open_, "secagg: step ", stageName(stage),
                     " requested after a later one");
  STARLING_CHECK_ARG(runsStage(params_, stage), "secagg: step ", stageName(stage),
                     " requested in a round that does not run it");
  open_ = static_cast<int>(stage);
  switch (stage) {
    case SecureStage::kAdvertise:
      // The same setup for every client: encoded once (n clients each, O(n) bytes).
      if (setup_.empty())
        setup_ = pr::encode(pr::SecAggSetupMsg{
            nonce_, params_, std::vector<uint64_t>(clients_.begin(), clients_.end())});
      return setup_;
    case SecureStage::kShareKeys:
      return pr::encode(pr::SecAggAdvertsMsg{params_.round, nonce_, server_.advertsFor(client)});
    case SecureStage::kMaskedInput:
      return pr::encode(
          pr::SecAggSharesMsg{client, params_.round, nonce_, server_.sharesFor(client)});
    case SecureStage::kSurvivors: {
      // One list for every client (survivorsFor refuses one without a masked input): encoded
      // once, as the setup is, not n times its absent clients.
      const pv::SurvivorsRequest list = server_.survivorsFor(client);
      if (survivors_.empty()) survivors_ = pr::encode(pr::SecAggSurvivorsMsg{nonce_, list});
      return survivors_;
    }
    case SecureStage::kUnmask:
      return pr::encode(pr::SecAggUnmaskMsg{nonce_, server_.unmaskRequestFor(client)});
  }
  STARLING_THROW(InvalidArgument, "secagg: no such step");
}

void SecureRound::reply(SecureStage stage, uint64_t client, std::span<const uint8_t> bytes) {
  const auto check = [&](uint64_t from, uint64_t round, uint64_t nonce) {
    if (from != client)
      throw InputError(Errc::kWrongSender, "secagg: client " + std::to_string(client) +
                                               " sent a message of client " + std::to_string(from));
    if (round != params_.round)
      throw InputError(Errc::kWrongRound, "secagg: client " + std::to_string(client) +
                                              " answered for round " + std::to_string(round) +
                                              " in round " + std::to_string(params_.round));
    if (nonce != nonce_)
      throw InputError(Errc::kLate, "secagg: client " + std::to_string(client) +
                                        " answered another exchange (a replay)");
    if (answered_[static_cast<size_t>(stage)].count(client))
      throw InputError(Errc::kDuplicate, "secagg: client " + std::to_string(client) +
                                             " answered step " + stageName(stage) + " twice");
  };
  if (static_cast<int>(stage) != open_)
    throw InputError(static_cast<int>(stage) < open_ ? Errc::kLate : Errc::kUnexpectedMessage,
                     std::string("secagg: client ") + std::to_string(client) + "'s reply of step " +
                         stageName(stage) + ", which is not open");
  switch (stage) {
    case SecureStage::kAdvertise: {
      const pr::SecAggKeysMsg m = pr::decodeSecAggKeys(bytes, limits_);
      check(m.advert.client, m.advert.round, m.nonce);
      // A low-order point would make every neighbour's key agreement fail (or give a key anyone
      // knows): refused here, before a neighbour sees it.
      for (const pv::Key32* pk : {&m.advert.cipher_pk, &m.advert.mask_pk}) {
        try {
          (void)pv::agree(probe_, *pk, params_.run_seed, params_.round, pv::KeyPurpose::kMask);
        } catch (const InvalidArgument&) {
          throw InputError(Errc::kMalformed, "secagg: client " + std::to_string(client) +
                                                 " advertised a low-order public key");
        }
      }
      server_.onAdvert(m.advert);
      break;
    }
    case SecureStage::kShareKeys: {
      const pr::SecAggSharesMsg m = pr::decodeSecAggShares(bytes, limits_);
      check(m.client, m.round, m.nonce);
      server_.onShares(client, m.shares);
      break;
    }
    case SecureStage::kMaskedInput: {
      const pr::SecAggMaskedMsg m = pr::decodeSecAggMasked(bytes, params_.dim, limits_);
      check(m.client, m.input.round, m.nonce);
      if (m.input.clients != std::vector<uint64_t>{client})
        throw InputError(Errc::kWrongSender, "secagg: client " + std::to_string(client) +
                                                 " sent a masked input of other clients");
      checkMaskedInput(m, params_, nonce_, rules_, "client " + std::to_string(client), 1.0);
      server_.onMaskedInput(m.input);
      for (const auto& x : m.metrics) metrics_[x.name][client] = {x.value, 1.0};
      break;
    }
    case SecureStage::kSurvivors: {
      const pr::SecAggSignedMsg m = pr::decodeSecAggSigned(bytes, limits_);
      check(m.signed_survivors.client, m.signed_survivors.round, m.nonce);
      server_.onSurvivorsSigned(m.signed_survivors);
      break;
    }
    case SecureStage::kUnmask: {
      const pr::SecAggRevealMsg m = pr::decodeSecAggReveal(bytes, limits_);
      check(m.response.client, m.response.round, m.nonce);
      server_.onUnmask(m.response);
      break;
    }
  }
  answered_[static_cast<size_t>(stage)].insert(client);
}

void SecureRound::replyRelayed(uint64_t peer, std::span<const uint8_t> bytes) {
  const std::string who = "aggregator " + std::to_string(peer);
  if (open_ != static_cast<int>(SecureStage::kMaskedInput))
    throw InputError(open_ < static_cast<int>(SecureStage::kMaskedInput) ? Errc::kUnexpectedMessage
                                                                         : Errc::kLate,
                     "secagg: " + who + "'s masked inputs when that step is not open");
  const pr::SecAggMaskedMsg m = pr::decodeSecAggMasked(bytes, params_.dim, limits_);
  if (m.client != peer)
    throw InputError(Errc::kWrongSender, "secagg: " + who + " sent masked inputs named for " +
                                             std::to_string(m.client));
  const std::span<const uint64_t> mine = relayedBy(peer);
  auto& done = answered_[static_cast<size_t>(SecureStage::kMaskedInput)];
  for (uint64_t c : m.input.clients) {
    if (!std::binary_search(mine.begin(), mine.end(), c) || !inStep(SecureStage::kMaskedInput, c))
      throw InputError(Errc::kWrongSender, "secagg: " + who + " sent the masked input of client " +
                                               std::to_string(c) +
                                               ", which it does not relay in this step");
    if (done.count(c))
      throw InputError(Errc::kDuplicate,
                       "secagg: client " + std::to_string(c) + "'s masked input arrived twice");
  }
  checkMaskedInput(m, params_, nonce_, rules_, who, static_cast<double>(m.input.clients.size()));
  server_.onMaskedInput(m.input);
  for (const auto& x : m.metrics) {
    auto& [sum, count] = metrics_[x.name][peer];  // an aggregator may send several sums
    sum += x.value;
    count += static_cast<double>(m.input.clients.size());
  }
  done.insert(m.input.clients.begin(), m.input.clients.end());
}

size_t SecureRound::maskedBytes(uint64_t client, std::span<const Metric> metrics) const {
  return pr::secAggMaskedBytes(params_.dim, params_.ring.bits, client, metrics);
}

SecureRound::Outcome SecureRound::finish() {
  STARLING_ENFORCE(!finished_, "secagg: a round finished twice");
  finished_ = true;
  Outcome out;
  pv::SecAggServer::Result r;
  try {
    r = server_.finish();
  } catch (const Error& e) {  // a secret rebuilt from revealed shares that is no key, ...
    out.reason = std::string("secure aggregation: the unmasking failed: ") + e.what();
    return out;
  }
  if (!r.ok) {
    out.reason = "secure aggregation: " + r.reason;
    return out;
  }
  if (r.survivors.empty()) {
    out.reason = "secure aggregation: no client's masked input arrived";
    return out;
  }
  out.survivors = std::move(r.survivors);
  out.liars = std::move(r.liars);
  out.sum.resize(params_.dim);
  pv::decode(params_.ring, r.sum, out.sum);
  // The one bound the server can still check: each survivor clipped to C, so the sum's norm is
  // at most n C, plus each coordinate's rounding (at most n / scale), plus under distributed DP
  // the noise: n clients' discrete Gaussians, sub-Gaussian with sqrt(n) noise per value, whose
  // norm is about sqrt(n d) noise; the check allows sqrt(n) noise (1.05 sqrt(d) + kNoiseTails)
  // (Laurent and Massart's bound for a Gaussian vector at e^-72 needs sqrt(d) + 12), which a sum of
  // honest clients passes but for a vanishing chance, and which still catches a gross cheat.
  const double n = static_cast<double>(out.survivors.size());
  // With the clip count (adaptive clipping) the last value is the count of updates within the
  // clip, times the clip, beside the update's sum: the norm's check is the update's (the count is
  // clamped to [0, n] by the engine, never refused: a refusal, or a message with the count, would
  // tell a client the exact count).
  const size_t values = params_.clip_count ? params_.dim - 1 : params_.dim;
  double sq = 0.0;
  for (size_t i = 0; i < values; ++i) sq += static_cast<double>(out.sum[i]) * out.sum[i];
  const double root_d = std::sqrt(static_cast<double>(values));
  const double bound = n * (params_.ring.clip + root_d / params_.ring.scale) +
                       std::sqrt(n) * params_.ring.noise *
                           (1.05 * root_d + pv::RingSpec::kNoiseTails) / params_.ring.scale;
  if (!(std::sqrt(sq) <= bound * (1 + 1e-6))) {
    out.reason = "secure aggregation: the unmasked sum's norm " + std::to_string(std::sqrt(sq)) +
                 " exceeds the survivors' count times the clip (" + std::to_string(bound) +
                 "): a client masked an update it had not clipped, or (a signed round) revealed "
                 "a wrong pairwise key";
    out.sum.clear();
    return out;
  }
  for (const auto& [name, by_sender] : metrics_) {
    auto& [sum, count] = out.metrics[name];
    for (const auto& [sender, v] : by_sender) {
      sum += v.first;
      count += v.second;
    }
  }
  out.ok = true;
  return out;
}

}  // namespace starling::server
