// SecAgg+ as pure logic (privacy/secagg.h), driven in process: the exact ring sum of the survivors
// with dropouts at every phase, through a tree of aggregators bit for bit, and each attacker's
// message refused with its own code.
#include "privacy/secagg.h"

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "check_throws.h"
#include "core/error.h"
#include "test_keys.h"

using namespace starling;
using namespace starling::privacy;

namespace {
using starling::testing::codeOf;

SecAggParams params(size_t dim, uint64_t clients, uint32_t k = 4, uint32_t t = 3,
                    bool signed_keys = false) {
  SecAggParams p;
  p.run_seed = 11;
  p.round = 3;
  p.neighbours = k;
  p.threshold = t;
  p.dim = dim;
  p.ring = RingSpec::fit(32, 1.0, clients, dim);
  p.signed_keys = signed_keys;
  return p;
}

// A round of SecAgg+ among `ids`: each client's input, who drops after which phase, whether the
// masked inputs reach the server through two aggregators, and hooks where a test plays an
// attacker. Records what the server saw.
SecAggSigner certified(const SigningKeyPair& authority, uint64_t id) {
  return SecAggSigner::certified(authority, id, randomKey());
}

struct Round {
  SecAggParams p;
  std::vector<uint64_t> ids;
  std::map<uint64_t, std::vector<float>> inputs;
  std::set<uint64_t> drop_after_advert, drop_after_shares, drop_after_masked, drop_after_sign;
  // Clients that reveal wrong shares at the unmask step (limb `lie_limb` of each moved).
  std::set<uint64_t> liars;
  size_t lie_limb = 3;
  bool tree = false;
  // The clients draw their rounding keys as deployed (a fresh randomKey() each): no expected().
  bool fresh_rounding = false;
  // Under signed keys: the federation's authority and each client's certified signing key.
  SigningKeyPair authority = SigningKeyPair::generate();
  std::map<uint64_t, SecAggSigner> signers;
  std::map<uint64_t, std::unique_ptr<SecAggClient>> clients;
  std::unique_ptr<SecAggServer> server;
  std::map<uint64_t, MaskedInput> masked;             // what the server received, per client
  std::map<uint64_t, std::vector<uint64_t>> encoded;  // each client's unmasked encoding

  Round(SecAggParams params, std::vector<uint64_t> clients_ids)
      : p(params), ids(std::move(clients_ids)) {
    for (uint64_t c : ids) {
      std::vector<float> x(p.dim);
      for (size_t i = 0; i < p.dim; ++i) x[i] = 0.5f * std::sin(static_cast<float>(c * 31 + i));
      inputs[c] = x;
    }
  }

  // A fixed rounding key per client (a deployed client draws a fresh randomKey() each round).
  static Key32 rounding(uint64_t c) { return testing::testKey(c, 0x5a); }

  SecAggServer::Result run() {
    if (p.signed_keys)
      for (uint64_t c : ids) signers[c] = certified(authority, c);
    const Key32* trust = p.signed_keys ? &authority.public_key : nullptr;
    server = std::make_unique<SecAggServer>(p, ids, trust);
    for (uint64_t c : ids)
      clients[c] = std::make_unique<SecAggClient>(p, c, ids, p.signed_keys ? &signers[c] : nullptr);
    std::set<uint64_t> alive(ids.begin(), ids.end());
    for (uint64_t c : ids) server->onAdvert(clients[c]->advertise());
    for (uint64_t c : drop_after_advert) alive.erase(c);
    std::map<uint64_t, std::vector<EncryptedShare>> sent;
    for (uint64_t c : alive) sent[c] = clients[c]->shareKeys(server->advertsFor(c), trust);
    for (auto& [c, s] : sent) server->onShares(c, s);
    for (uint64_t c : drop_after_shares) alive.erase(c);
    std::vector<MaskedInput> group[2];
    for (uint64_t c : alive) {
      MaskedInput m = fresh_rounding
                          ? clients[c]->maskedInput(server->sharesFor(c), inputs[c])
                          : clients[c]->maskedInput(server->sharesFor(c), inputs[c], rounding(c));
      masked[c] = m;
      if (!fresh_rounding) {
        std::vector<uint64_t> e(p.dim);
        encode(p.ring, inputs[c], rounding(c), p.round, e);
        encoded[c] = e;
      }
      group[c % 2].push_back(std::move(m));
    }
    for (uint64_t c : drop_after_masked) alive.erase(c);
    for (uint64_t c : drop_after_sign) alive.erase(c);
    if (tree) {
      // Two edge aggregators add their clients' masked inputs in the ring and send one each.
      for (auto& g : group) {
        if (g.empty()) continue;
        MaskedInput sum;
        sum.round = p.round;
        sum.words.assign(p.dim, 0);
        for (const MaskedInput& m : g) {
          add(p.ring, sum.words, m.words);
          sum.clients.insert(sum.clients.end(), m.clients.begin(), m.clients.end());
        }
        std::sort(sum.clients.begin(), sum.clients.end());
        server->onMaskedInput(sum);
      }
    } else {
      for (auto& g : group)
        for (const MaskedInput& m : g) server->onMaskedInput(m);
    }
    // A signed round's consistency step: every survivor signs who survived (drop_after_sign
    // sign, then go).
    if (p.signed_keys)
      for (uint64_t c : ids)
        if (masked.count(c) && (alive.count(c) || drop_after_sign.count(c)))
          server->onSurvivorsSigned(clients[c]->signSurvivors(server->survivorsFor(c)));
    for (uint64_t c : alive)
      if (masked.count(c)) {
        UnmaskResponse resp = clients[c]->unmask(server->unmaskRequestFor(c));
        if (liars.count(c))
          for (RevealedShare& s : resp.shares)
            s.share.y[lie_limb] = (s.share.y[lie_limb] + 7 + c) % kShamirPrime;
        server->onUnmask(resp);
      }
    return server->finish();
  }

  // The ring sum of the unmasked encodings of the clients whose masked input the server took.
  std::vector<uint64_t> expected() const {
    std::vector<uint64_t> s(p.dim, 0);
    for (const auto& [c, e] : encoded) add(p.ring, s, e);
    return s;
  }
};

std::vector<uint64_t> range(uint64_t first, uint64_t n) {
  std::vector<uint64_t> v;
  for (uint64_t i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

}  // namespace

TEST_CASE("secagg: the server gets exactly the sum of the inputs, and nothing else",
          "[privacy][secagg]") {
  Round r(params(257, 12), range(100, 12));
  const auto res = r.run();
  REQUIRE(res.ok);
  CHECK(res.survivors == range(100, 12));
  CHECK(res.sum == r.expected());
  // Decoded, it is the inputs' sum within the rounding (12 clients x 1/scale).
  std::vector<float> dec(r.p.dim);
  decode(r.p.ring, res.sum, dec);
  for (size_t i = 0; i < r.p.dim; ++i) {
    double want = 0;
    for (const auto& [c, x] : r.inputs) want += x[i];
    CHECK(std::abs(dec[i] - want) <= 12.0 / r.p.ring.scale + 1e-5 * std::abs(want));
  }
  // A curious server: each masked input's words look uniform in Z_2^32 (every bit set in half
  // the words within 5 standard errors), whatever the input.
  for (const auto& [c, m] : r.masked) {
    for (int bit = 0; bit < 32; ++bit) {
      size_t set = 0;
      for (uint64_t w : m.words) set += (w >> bit) & 1;
      CHECK(std::abs(static_cast<double>(set) / m.words.size() - 0.5) <
            5 * 0.5 / std::sqrt(static_cast<double>(m.words.size())));
    }
    CHECK(m.words != r.encoded.at(c));
  }
}

TEST_CASE("secagg: clients that draw their own rounding keys give the sum within the rounding",
          "[privacy][secagg]") {
  std::vector<std::vector<uint64_t>> sums;
  for (int run = 0; run < 2; ++run) {
    Round r(params(257, 12), range(100, 12));
    r.fresh_rounding = true;
    const auto res = r.run();
    REQUIRE(res.ok);
    std::vector<float> dec(r.p.dim);
    decode(r.p.ring, res.sum, dec);
    for (size_t i = 0; i < r.p.dim; ++i) {
      double want = 0;
      for (const auto& [c, x] : r.inputs) want += x[i];
      CHECK(std::abs(dec[i] - want) <= 12.0 / r.p.ring.scale + 1e-5 * std::abs(want));
    }
    sums.push_back(res.sum);
  }
  // Fresh keys each time: the stochastic roundings (and so the sums' low bits) differ.
  CHECK(sums[0] != sums[1]);
}

TEST_CASE("secagg: dropouts at every phase leave the survivors' exact sum", "[privacy][secagg]") {
  // 16 clients, k = 6, t = 3: one drops after advertising, two after sharing, one after its
  // masked input (before unmasking). Which four: the first (in order) that leave every client at
  // least t neighbours to answer the unmasking, in the round's graph.
  const SecAggParams p = params(64, 16, 6, 3);
  const std::vector<uint64_t> ids = range(0, 16);
  const Neighbourhoods g = harary(ids, p.neighbours, p.run_seed, p.round);
  const auto enough = [&](std::set<uint64_t> gone) {
    for (uint64_t u : ids) {
      uint32_t answering = 0;
      for (uint64_t v : g.neighbours(u)) answering += gone.count(v) ? 0 : 1;
      if (answering < p.threshold) return false;
    }
    return true;
  };
  // After the advert, after the shares (two), after the masked input.
  const auto pick = [&]() -> std::optional<std::array<uint64_t, 4>> {
    for (uint64_t a = 0; a < 16; ++a)
      for (uint64_t b = 0; b < 16; ++b)
        for (uint64_t c = b + 1; c < 16; ++c)
          for (uint64_t m = 0; m < 16; ++m)
            if (std::set<uint64_t>{a, b, c, m}.size() == 4 && enough({a, b, c, m}))
              return std::array<uint64_t, 4>{a, b, c, m};
    return std::nullopt;
  };
  const auto found = pick();
  REQUIRE(found);
  const std::array<uint64_t, 4> d = *found;
  Round r(p, ids);
  r.drop_after_advert = {d[0]};
  r.drop_after_shares = {d[1], d[2]};
  r.drop_after_masked = {d[3]};
  const auto res = r.run();
  INFO(res.reason);
  REQUIRE(res.ok);
  std::vector<uint64_t> want;
  for (uint64_t c : ids)
    if (c != d[0] && c != d[1] && c != d[2]) want.push_back(c);
  CHECK(res.survivors == want);  // the last one sent its input: it is in the sum
  CHECK(res.sum == r.expected());
}

TEST_CASE("secagg: through two edge aggregators the sum is the flat one, bit for bit",
          "[privacy][secagg]") {
  Round flat(params(100, 10), range(0, 10)), tree(params(100, 10), range(0, 10));
  tree.tree = true;
  for (auto* r : {&flat, &tree}) r->drop_after_shares = {4};
  const auto a = flat.run(), b = tree.run();
  REQUIRE(a.ok);
  REQUIRE(b.ok);
  CHECK(a.sum == b.sum);  // the same inputs and rounding streams, other masks: the same sum
  CHECK(a.sum == flat.expected());
}

TEST_CASE("secagg: fewer than t survivors is a failed round that reveals nothing",
          "[privacy][secagg]") {
  // Complete graph of 5 (k = 4), t = 3: three drop after their masked inputs; the two left
  // reveal 2 shares of each secret, one short.
  Round r(params(32, 5, 4, 3), range(0, 5));
  r.drop_after_masked = {0, 1, 2};
  const auto res = r.run();
  CHECK_FALSE(res.ok);
  CHECK(res.sum.empty());
  CHECK(res.reason.find("3 needed") != std::string::npos);
}

TEST_CASE("secagg: too few neighbours' shares is refused before anything is masked",
          "[privacy][secagg]") {
  // The complete graph of 5 (k = 4), t = 4: client 0 advertises its keys and then falls silent,
  // so each other client receives 3 shares, below t, and refuses to mask (its pairwise masks with
  // too few could not be removed if more dropped).
  Round r(params(8, 5, 4, 4), range(0, 5));
  r.drop_after_advert = {0};
  REQUIRE(r.p.threshold == 4);
  CHECK(codeOf([&] { r.run(); }) == Errc::kTooFewSurvivors);
}

TEST_CASE("secagg: the attacker's messages are refused, each with its code", "[privacy][secagg]") {
  const SecAggParams p = params(16, 8, 4, 3);
  const auto ids = range(0, 8);
  SecAggServer server(p, ids);
  std::map<uint64_t, std::unique_ptr<SecAggClient>> c;
  for (uint64_t id : ids) {
    c[id] = std::make_unique<SecAggClient>(p, id, ids);
    server.onAdvert(c[id]->advertise());
  }
  const Neighbourhoods& g = server.graph();
  uint64_t stranger = 0;  // a client that is not a neighbour of client 0
  for (uint64_t id : ids)
    if (id != 0 && !g.adjacent(0, id)) stranger = id;
  REQUIRE(stranger != 0);

  SECTION("an advertised key twice, or of another round (a replay)") {
    CHECK(codeOf([&] { server.onAdvert(c[0]->advertise()); }) == Errc::kDuplicate);
    KeyAdvert old = c[1]->advertise();
    old.round = 2;
    CHECK(codeOf([&] { server.onAdvert(old); }) == Errc::kWrongRound);
  }
  std::map<uint64_t, std::vector<EncryptedShare>> shares;
  for (uint64_t id : ids) shares[id] = c[id]->shareKeys(server.advertsFor(id));

  SECTION("a key of a client that is not a neighbour, given to a client") {
    SecAggClient fresh(p, 0, ids);
    std::vector<KeyAdvert> adverts = server.advertsFor(0);
    adverts.push_back(c[stranger]->advertise());
    CHECK(codeOf([&] { fresh.shareKeys(adverts); }) == Errc::kNotNeighbour);
  }
  SECTION("a share for a peer that is not a neighbour, or for the sender itself") {
    std::vector<EncryptedShare> bad = shares[0];
    bad[0].to = stranger;
    CHECK(codeOf([&] { server.onShares(0, bad); }) == Errc::kNotNeighbour);
    bad = shares[0];
    bad[0].to = 0;
    CHECK(codeOf([&] { server.onShares(0, bad); }) == Errc::kWrongSender);
    bad = shares[0];
    bad.pop_back();  // one neighbour held back
    CHECK(codeOf([&] { server.onShares(0, bad); }) == Errc::kInconsistentShares);
  }
  for (uint64_t id : ids) server.onShares(id, shares[id]);
  SECTION("a share that was altered on the way does not open") {
    SecAggClient fresh(p, 0, ids);  // a fresh client 0 cannot open shares sealed to the real one
    (void)fresh.shareKeys(server.advertsFor(0));
    std::vector<EncryptedShare> mine = server.sharesFor(0);
    const Key32 r = Round::rounding(0);
    const std::vector<float> x(p.dim, 0.1f);
    CHECK(codeOf([&] { fresh.maskedInput(mine, x, r); }) == Errc::kInconsistentShares);
    mine[0].ciphertext[30] ^= 1;
    CHECK(codeOf([&] { c[0]->maskedInput(mine, x, r); }) == Errc::kInconsistentShares);
  }
  std::map<uint64_t, MaskedInput> masked;
  for (uint64_t id : ids) {
    const Key32 r = Round::rounding(id);
    masked[id] = c[id]->maskedInput(server.sharesFor(id), std::vector<float>(p.dim, 0.25f), r);
  }
  SECTION("a masked input of the wrong length, beyond the ring, replayed, or of another round") {
    MaskedInput m = masked[0];
    m.words.pop_back();
    CHECK(codeOf([&] { server.onMaskedInput(m); }) == Errc::kSizeMismatch);
    m = masked[0];
    m.words[3] = uint64_t{1} << 40;  // a 32-bit ring
    CHECK(codeOf([&] { server.onMaskedInput(m); }) == Errc::kSizeMismatch);
    server.onMaskedInput(masked[0]);
    CHECK(codeOf([&] { server.onMaskedInput(masked[0]); }) == Errc::kDuplicate);
    m = masked[1];
    m.round = 2;
    CHECK(codeOf([&] { server.onMaskedInput(m); }) == Errc::kWrongRound);
  }
  SECTION("a root that asks about a stranger, for both shares of one client, or asks twice") {
    UnmaskRequest stranger_req;
    stranger_req.round = p.round;
    stranger_req.survived = {stranger};
    CHECK(codeOf([&] { c[0]->unmask(stranger_req); }) == Errc::kNotNeighbour);
    UnmaskRequest both;
    both.round = p.round;
    const uint64_t v = g.neighbours(0)[0];
    both.dropped = {v};
    both.survived = {v};
    CHECK(codeOf([&] { c[0]->unmask(both); }) == Errc::kRevealBoth);
    UnmaskRequest fine;
    fine.round = p.round;
    fine.survived = {v};
    (void)c[0]->unmask(fine);
    UnmaskRequest other;
    other.round = p.round;
    other.dropped = {v};
    CHECK(codeOf([&] { c[0]->unmask(other); }) == Errc::kRevealBoth);
    UnmaskRequest about_self;
    about_self.round = p.round;
    about_self.survived = {1};
    CHECK(codeOf([&] { c[1]->unmask(about_self); }) == Errc::kRevealBoth);
  }
  SECTION("a client that sends its masked input and then lies in its shares") {
    for (uint64_t id : ids) server.onMaskedInput(masked[id]);
    for (uint64_t id : ids) {
      UnmaskResponse resp = c[id]->unmask(server.unmaskRequestFor(id));
      if (id == 2)  // client 2 alters every share it reveals
        for (RevealedShare& s : resp.shares) s.share.y[0] = (s.share.y[0] + 1) % kShamirPrime;
      server.onUnmask(resp);
    }
    const auto res = server.finish();
    CHECK_FALSE(res.ok);
    CHECK(res.sum.empty());
    CHECK(res.reason.find("inconsistent") != std::string::npos);
  }
}

TEST_CASE("secagg: wrong revealed shares among enough honest ones are decoded around and named",
          "[privacy][secagg]") {
  // 12 clients, k = 10 (each misses one), t = 6: a secret has 10 shares when all answer, 2 wrong
  // corrected; 9 when one neighbour dropped, 1 corrected.
  const SecAggParams p = params(33, 12, 10, 6);
  SECTION("two liars, every survivor's seed decoded around them") {
    Round r(p, range(0, 12));
    r.liars = {2, 9};
    const auto res = r.run();
    REQUIRE(res.ok);
    CHECK(res.liars == std::vector<uint64_t>{2, 9});
    CHECK(res.survivors == range(0, 12));
    CHECK(res.sum == r.expected());  // the honest sum, bit for bit
  }
  SECTION("a liar, and a dropped client's mask key rebuilt around it") {
    Round r(p, range(0, 12));
    r.drop_after_shares = {5};
    r.liars = {8};
    r.lie_limb = 0;
    const auto res = r.run();
    REQUIRE(res.ok);
    CHECK(res.liars == std::vector<uint64_t>{8});
    std::vector<uint64_t> survivors = range(0, 12);
    survivors.erase(survivors.begin() + 5);
    CHECK(res.survivors == survivors);
    CHECK(res.sum == r.expected());
  }
  SECTION("more liars than a secret's shares correct: the round fails, revealing nothing") {
    Round r(p, range(0, 12));
    r.liars = {1, 2, 3, 4};  // every other client has at least 3 of them as neighbours
    const auto res = r.run();
    CHECK_FALSE(res.ok);
    CHECK(res.sum.empty());
    CHECK(res.reason.find("too many inconsistent shares") != std::string::npos);
  }
}

TEST_CASE("secagg: with exactly t shares a lie is caught by the owner's commitment",
          "[privacy][secagg]") {
  // With more than t shares Shamir's consistency check catches a lie; with exactly t it cannot,
  // and the seed's hash in the advert and the mask key's public key must. 10 clients, k = 6, t = 3.
  // Case 1 (survivors' seeds): everyone survives and answers except three clients that fall
  // silent after their masked inputs, chosen so that some survivor's seed has exactly 3 answering
  // holders, one of whom lies. Case 2 (a dropped client's mask key): client v drops after
  // sharing, and three of its neighbours fall silent after masking, chosen so that v's key has
  // exactly 3 answering holders while every seed still has at least 3; one of those lies.
  const SecAggParams p = params(16, 10, 6, 3);
  const auto ids = range(0, 10);
  const Neighbourhoods g = harary(ids, p.neighbours, p.run_seed, p.round);
  const auto answering = [&](uint64_t owner, const std::set<uint64_t>& silent,
                             const std::set<uint64_t>& dropped) {
    std::vector<uint64_t> out;
    for (uint64_t h : g.neighbours(owner))
      if (!silent.count(h) && !dropped.count(h)) out.push_back(h);
    return out;
  };
  for (const bool about_dropped : {false, true}) {
    INFO((about_dropped ? "a dropped client's mask key" : "a survivor's self-mask seed"));
    // Search the graph for a dropout pattern with a secret at exactly t answering holders.
    std::set<uint64_t> dropped, silent;
    uint64_t target = 0;
    bool found = false;
    for (uint64_t v = 0; v < 10 && !found; ++v) {
      const auto nb = g.neighbours(v);
      for (size_t a = 0; a < nb.size() && !found; ++a)
        for (size_t b = a + 1; b < nb.size() && !found; ++b)
          for (size_t c = b + 1; c < nb.size() && !found; ++c) {
            std::set<uint64_t> d = about_dropped ? std::set<uint64_t>{v} : std::set<uint64_t>{};
            std::set<uint64_t> s{nb[a], nb[b], nb[c]};
            if (!about_dropped && s.count(v)) continue;
            bool ok = true, exact = false;
            for (uint64_t u : ids) {
              if (d.count(u)) continue;  // a survivor's seed: at least t
              const size_t n = answering(u, s, d).size();
              ok = ok && n >= p.threshold;
              if (!about_dropped && n == p.threshold && !s.count(u)) exact = true, target = u;
            }
            if (about_dropped) exact = answering(v, s, d).size() == p.threshold, target = v;
            if (ok && exact) {
              found = true;
              dropped = d;
              silent = s;
            }
          }
    }
    REQUIRE(found);
    SecAggServer server(p, ids);
    std::map<uint64_t, std::unique_ptr<SecAggClient>> c;
    for (uint64_t id : ids) {
      c[id] = std::make_unique<SecAggClient>(p, id, ids);
      server.onAdvert(c[id]->advertise());
    }
    std::map<uint64_t, std::vector<EncryptedShare>> sh;
    for (uint64_t id : ids) sh[id] = c[id]->shareKeys(server.advertsFor(id));
    for (uint64_t id : ids) server.onShares(id, sh[id]);
    for (uint64_t id : ids) {
      if (dropped.count(id)) continue;
      const Key32 r = Round::rounding(id);
      server.onMaskedInput(
          c[id]->maskedInput(server.sharesFor(id), std::vector<float>(p.dim, 0.1f), r));
    }
    // The liar shifts its share so that the rebuilt limb is off by exactly 1 and still 32 bits
    // (its Lagrange coefficient lambda at 0 is public: the holders' points are ids + 1), so
    // nothing but the owner's commitment can tell.
    const std::vector<uint64_t> holders = answering(target, silent, dropped);
    const uint64_t liar = holders.front();
    uint64_t lambda = 1;
    for (uint64_t h : holders)
      if (h != liar)
        lambda = privacy::detail::fieldMul(
            lambda, privacy::detail::fieldMul(
                        privacy::detail::fieldSub(0, h + 1),
                        privacy::detail::fieldInverse(privacy::detail::fieldSub(liar + 1, h + 1))));
    for (uint64_t id : ids) {
      if (dropped.count(id) || silent.count(id)) continue;
      UnmaskResponse resp = c[id]->unmask(server.unmaskRequestFor(id));
      if (id == liar)
        for (RevealedShare& s : resp.shares)
          if (s.of == target)
            s.share.y[2] =
                privacy::detail::fieldAdd(s.share.y[2], privacy::detail::fieldInverse(lambda));
      server.onUnmask(resp);
    }
    const auto res = server.finish();
    INFO(res.reason);
    CHECK_FALSE(res.ok);
    CHECK(res.sum.empty());
    CHECK(res.reason.find(about_dropped ? "another key than it advertised" : "did not commit to") !=
          std::string::npos);
  }
}

TEST_CASE("secagg: under the malicious-server threat model a signed round sums as an unsigned one",
          "[privacy][secagg]") {
  // k = 8, t = 5: with three clients lost, each survivor keeps t neighbours that sign and
  // reveal, wherever the three are.
  Round r(params(33, 12, 8, 5, /*signed_keys=*/true), range(0, 12));
  r.drop_after_shares = {4};  // a dropped client's masks removed with its neighbours' pairwise keys
  // Lost after its masked input (before it signed the survivors), and after it signed: in the
  // sum, their self masks removed. Neither beside 4: a signed round needs every survivor beside a
  // dropped client to reveal their pairwise key (docs/privacy.md).
  const Neighbourhoods g = harary(r.ids, r.p.neighbours, r.p.run_seed, r.p.round);
  std::vector<uint64_t> far;
  for (uint64_t c : r.ids)
    if (c != 4 && !g.adjacent(c, 4)) far.push_back(c);
  REQUIRE(far.size() >= 2);
  r.drop_after_masked = {far[0]};
  r.drop_after_sign = {far[1]};
  const auto res = r.run();
  INFO(res.reason);
  REQUIRE(res.ok);
  CHECK(res.sum == r.expected());
  CHECK(res.survivors == std::vector<uint64_t>{0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11});
  // Every advert the server holds carries its client's credential and verifies.
  for (uint64_t c : r.ids) {
    const KeyAdvert a = r.clients[c]->advertise();
    CHECK(a.credential.signing_key == r.signers[c].key.public_key);
    const Key32 roster = rosterHash(r.ids);
    CHECK(advertSigned(a, r.authority.public_key, r.p, roster));
    CHECK_FALSE(advertSigned(a, SigningKeyPair::generate().public_key, r.p, roster));
    // Bound to its exchange: another attempt at the round (another session), another roster.
    SecAggParams again = r.p;
    again.session = 1;
    CHECK_FALSE(advertSigned(a, r.authority.public_key, again, roster));
    std::vector<uint64_t> fewer(r.ids.begin(), r.ids.end() - 1);
    CHECK_FALSE(advertSigned(a, r.authority.public_key, r.p, rosterHash(fewer)));
    // The same clients in another order are no roster: refused, not hashed to another digest.
    std::vector<uint64_t> unordered = r.ids;
    std::swap(unordered[0], unordered[1]);
    CHECK_THROWS_AS(rosterHash(unordered), InvalidArgument);
    // ... and to the round's parameters: another threshold, ring or size does not verify.
    for (const auto& change : std::vector<std::function<void(SecAggParams&)>>{
             [](SecAggParams& q) { q.threshold += 1; }, [](SecAggParams& q) { q.neighbours += 2; },
             [](SecAggParams& q) { q.ring.scale *= 2; }, [](SecAggParams& q) { q.dim += 1; }}) {
      SecAggParams q = r.p;
      change(q);
      CHECK_FALSE(advertSigned(a, r.authority.public_key, q, roster));
    }
  }
}

TEST_CASE("secagg: a signed round deals shares of the self-mask seed only, no mask key's",
          "[privacy][secagg]") {
  std::map<bool, std::vector<size_t>> sealed;  // signed -> each share's ciphertext bytes
  for (const bool signed_keys : {false, true}) {
    const SecAggParams p = params(8, 6, 4, 3, signed_keys);
    const auto ids = range(0, 6);
    const SigningKeyPair authority = SigningKeyPair::generate();
    std::map<uint64_t, SecAggSigner> signer;
    for (uint64_t id : ids) signer[id] = certified(authority, id);
    const Key32* trust = signed_keys ? &authority.public_key : nullptr;
    SecAggServer server(p, ids, trust);
    std::map<uint64_t, std::unique_ptr<SecAggClient>> c;
    for (uint64_t id : ids) {
      c[id] = std::make_unique<SecAggClient>(p, id, ids, signed_keys ? &signer[id] : nullptr);
      server.onAdvert(c[id]->advertise());
    }
    for (uint64_t id : ids) {
      const auto shares = c[id]->shareKeys(server.advertsFor(id), trust);
      for (const EncryptedShare& e : shares) sealed[signed_keys].push_back(e.ciphertext.size());
      server.onShares(id, shares);
    }
    // Each opens at its recipient (a share of the other layout would not).
    for (uint64_t id : ids)
      CHECK_NOTHROW(c[id]->maskedInput(server.sharesFor(id), std::vector<float>(p.dim, 0.1f)));
  }
  REQUIRE(sealed[false].size() == sealed[true].size());
  for (size_t i = 0; i < sealed[true].size(); ++i)
    CHECK(sealed[true][i] + Share::kBytes == sealed[false][i]);
}

TEST_CASE("secagg: under the malicious-server threat model a swapped or invented key is caught",
          "[privacy][secagg]") {
  const SecAggParams p = params(8, 6, 4, 3, /*signed_keys=*/true);
  const auto ids = range(0, 6);
  const SigningKeyPair authority = SigningKeyPair::generate();
  std::map<uint64_t, SecAggSigner> signer;
  for (uint64_t id : ids) signer[id] = certified(authority, id);
  const Key32* trust = &authority.public_key;
  SecAggServer server(p, ids, trust);
  std::map<uint64_t, std::unique_ptr<SecAggClient>> c;
  for (uint64_t id : ids) {
    c[id] = std::make_unique<SecAggClient>(p, id, ids, &signer[id]);
    server.onAdvert(c[id]->advertise());
  }
  const std::vector<KeyAdvert> honest = server.advertsFor(0);
  REQUIRE(honest.size() >= 3);
  const auto refused = [&](const std::vector<KeyAdvert>& adverts) {
    SecAggClient fresh(p, 0, ids, &signer[0]);
    return codeOf([&] { fresh.shareKeys(adverts, trust); });
  };
  // Unaltered, they verify.
  {
    SecAggClient fresh(p, 0, ids, &signer[0]);
    CHECK_NOTHROW(fresh.shareKeys(honest, trust));
  }
  // The server (or an aggregator relaying) substitutes its own mask key for a neighbour's.
  std::vector<KeyAdvert> swapped = honest;
  swapped[0].mask_pk = DhKeyPair::generate().public_key;
  CHECK(refused(swapped) == Errc::kBadSignature);
  // ... and signs its own keys with a signing key it certified under an authority of its own.
  const SigningKeyPair rogue = SigningKeyPair::generate();
  const SecAggSigner fake = certified(rogue, swapped[0].client);
  swapped[0].credential = fake.credential;
  swapped[0].signature = sign(fake.key, advertBytes(swapped[0], p, rosterHash(ids)));
  CHECK(refused(swapped) == Errc::kBadSignature);
  // A client's own certified key used to sign the keys advertised as another's (a colluding
  // client, or a server that holds one client's key): the certificate is for another id.
  std::vector<KeyAdvert> borrowed = honest;
  const uint64_t victim = borrowed[0].client, colluder = borrowed[1].client;
  borrowed[0].mask_pk = DhKeyPair::generate().public_key;
  borrowed[0].credential = signer[colluder].credential;
  borrowed[0].signature = sign(signer[colluder].key, advertBytes(borrowed[0], p, rosterHash(ids)));
  CHECK(refused(borrowed) == Errc::kBadSignature);
  // An advert of another attempt at the round (its session), signed by its own client, replayed:
  // the root could have learnt that attempt's secrets.
  {
    SecAggParams earlier = p;
    earlier.session = 99;
    SecAggClient old_self(earlier, honest[0].client, ids, &signer[honest[0].client]);
    std::vector<KeyAdvert> replayed = honest;
    replayed[0] = old_self.advertise();
    CHECK(refused(replayed) == Errc::kBadSignature);
  }
  // The advert stripped of its signature and credential.
  std::vector<KeyAdvert> stripped = honest;
  stripped[0].signature = {};
  stripped[0].credential = {};
  CHECK(refused(stripped) == Errc::kBadSignature);
  // A client that checks nothing cannot run a signed round (no authority given).
  {
    SecAggClient fresh(p, 0, ids, &signer[0]);
    CHECK(codeOf([&] { fresh.shareKeys(honest, nullptr); }) == Errc::kBadSignature);
  }
  // The server refuses the same: another's credential, an invented client's, an unsigned advert.
  for (const KeyAdvert& bad : {borrowed[0], swapped[0], stripped[0]}) {
    SecAggServer other(p, ids, trust);
    INFO("advert of client " << bad.client << " (victim " << victim << ")");
    CHECK(codeOf([&] { other.onAdvert(bad); }) == Errc::kBadSignature);
  }
}

// The attack an attacker's review found against the first signed rounds: a server that tells u's
// neighbours that u survived (they reveal its self-mask seed) and each of u's neighbours' other
// neighbours that that neighbour dropped (they reveal its mask key), so that every pairwise mask
// in u's input can be removed. Unsigned, it reads u's input exactly. Signed, a dropped neighbour
// is answered with a pairwise key (never a mask key), which only u or that neighbour knows, and
// every client reveals only what follows from a survivors list that t of its neighbours signed
// alike (the consistency step): a server that tells u's neighbours different stories about u
// finds each story short of signatures.
namespace {

struct LyingRound {
  SecAggParams p;
  std::vector<uint64_t> ids = range(0, 10);
  SigningKeyPair authority = SigningKeyPair::generate();
  std::map<uint64_t, SecAggSigner> signer;
  std::unique_ptr<SecAggServer> server;
  std::map<uint64_t, std::unique_ptr<SecAggClient>> c;
  std::map<uint64_t, std::vector<float>> x;
  std::map<uint64_t, MaskedInput> y;

  explicit LyingRound(bool signed_keys) : p(params(16, 10, 4, 3, signed_keys)) {
    for (uint64_t id : ids) signer[id] = certified(authority, id);
    const Key32* trust = signed_keys ? &authority.public_key : nullptr;
    server = std::make_unique<SecAggServer>(p, ids, trust);
    for (uint64_t id : ids) {
      c[id] = std::make_unique<SecAggClient>(p, id, ids, signed_keys ? &signer[id] : nullptr);
      server->onAdvert(c[id]->advertise());
      x[id].assign(p.dim, 0.0f);
      for (size_t i = 0; i < p.dim; ++i) x[id][i] = 0.1f * std::sin(static_cast<float>(id + i));
    }
    std::map<uint64_t, std::vector<EncryptedShare>> sent;
    for (uint64_t id : ids) sent[id] = c[id]->shareKeys(server->advertsFor(id), trust);
    for (auto& [id, sh] : sent) server->onShares(id, sh);
    for (uint64_t id : ids)
      y[id] = c[id]->maskedInput(server->sharesFor(id), x[id], testing::testKey(id, 0x5a));
  }
  std::vector<uint64_t> want(uint64_t u) const {
    std::vector<uint64_t> w(p.dim);
    encode(p.ring, x.at(u), testing::testKey(u, 0x5a), p.round, w);
    return w;
  }
  // u's masked input less its self mask (from `seed_shares`) and the pairwise masks of `keys`
  // (u's neighbour -> their pairwise key).
  std::vector<uint64_t> unmasked(uint64_t u, const std::vector<Share>& seed_shares,
                                 const std::map<uint64_t, Key32>& keys) const {
    std::vector<uint64_t> words = y.at(u).words;
    applyMask(words, shamirRecover(seed_shares, p.threshold).secret, p.round, MaskStream::kSelfMask,
              0, p.ring.bits, /*subtract=*/true);
    for (const auto& [v, k] : keys)
      applyMask(words, k, p.round, MaskStream::kPairwiseMask, 0, p.ring.bits, /*subtract=*/u < v);
    return words;
  }
};

}  // namespace

TEST_CASE(
    "secagg: a server that lies about who dropped unmasks a client unless the round is "
    "signed",
    "[privacy][secagg]") {
  const uint64_t u = 0;
  SECTION("unsigned: it reads the client's input exactly (the semi-honest model's limit)") {
    LyingRound r(false);
    const auto nu = r.server->graph().neighbours(u);
    const std::set<uint64_t> n_u(nu.begin(), nu.end());
    std::vector<Share> seed_shares;
    std::map<uint64_t, std::vector<Share>> key_shares;
    for (uint64_t w : r.ids) {
      if (w == u) continue;
      UnmaskRequest q;
      q.round = r.p.round;
      if (n_u.count(w)) q.survived.push_back(u);  // u survived, to u's neighbours
      for (uint64_t v : r.server->graph().neighbours(w))
        if (v != u && n_u.count(v)) q.dropped.push_back(v);  // u's neighbours dropped, to theirs
      if (q.survived.empty() && q.dropped.empty()) continue;
      for (const RevealedShare& s : r.c[w]->unmask(q).shares)
        (s.mask_key ? key_shares[s.of] : seed_shares).push_back(s.share);
    }
    REQUIRE(seed_shares.size() >= r.p.threshold);
    std::map<uint64_t, Key32> keys;
    for (uint64_t v : n_u) {
      REQUIRE(key_shares[v].size() >= r.p.threshold);
      DhKeyPair mask_v;
      mask_v.secret_key = shamirRecover(key_shares[v], r.p.threshold).secret;
      mask_v.public_key = r.c[v]->advertise().mask_pk;
      keys[v] =
          agree(mask_v, r.c[u]->advertise().mask_pk, r.p.run_seed, r.p.round, KeyPurpose::kMask);
    }
    CHECK(r.unmasked(u, seed_shares, keys) == r.want(u));
  }
  SECTION("signed: no story gets both u's seed and its pairwise keys") {
    LyingRound r(true);
    const auto nu = r.server->graph().neighbours(u);
    const std::set<uint64_t> n_u(nu.begin(), nu.end());
    const size_t m = n_u.size(), t = r.p.threshold;
    // The adaptive server: t of u's neighbours (W) and every client outside u's neighbourhood are
    // told nobody dropped (W then reveals u's seed); u's other neighbours (P) that u dropped (they
    // reveal their pairwise keys with u); u that m - t of W dropped (its pairwise keys with them,
    // the most its bound allows). Each client signs the list it is told; each request then carries
    // every signature the server holds of that client's list from its neighbours.
    const std::vector<uint64_t> w_set(nu.begin(), nu.begin() + static_cast<std::ptrdiff_t>(t));
    const std::vector<uint64_t> p_set(nu.begin() + static_cast<std::ptrdiff_t>(t), nu.end());
    const std::vector<uint64_t> u_absent(w_set.begin(),
                                         w_set.begin() + static_cast<std::ptrdiff_t>(m - t));
    std::map<uint64_t, std::vector<uint64_t>> story;
    std::map<uint64_t, SurvivorsSigned> sig;
    for (uint64_t w : r.ids) {
      story[w] = w == u ? u_absent
                 : std::find(p_set.begin(), p_set.end(), w) != p_set.end()
                     ? std::vector<uint64_t>{u}
                     : std::vector<uint64_t>{};
      sig[w] = r.c[w]->signSurvivors({r.p.round, story[w]});
    }
    std::vector<Share> seed_shares;
    std::map<uint64_t, Key32> keys;
    std::map<uint64_t, Errc> refused;
    for (uint64_t w : r.ids) {
      UnmaskRequest q;
      q.round = r.p.round;
      for (uint64_t v : r.server->graph().neighbours(w)) {
        const bool absent = std::binary_search(story[w].begin(), story[w].end(), v);
        (absent ? q.dropped : q.survived).push_back(v);
        if (!absent && story[v] == story[w]) q.signatures.push_back(sig[v]);
      }
      try {
        for (const RevealedShare& s : r.c[w]->unmask(q).shares) {
          if (s.of == u && !s.mask_key) seed_shares.push_back(s.share);
          if (s.pairwise && (w == u || s.of == u)) keys[w == u ? s.of : w] = *s.pairwise;
        }
      } catch (const InputError& e) {
        refused[w] = e.code();
      }
    }
    // W may find its signatures among the clients outside u's neighbourhood and reveal u's seed
    // (as the graph has it); but P, told another story, and u, told a third, are short of
    // signatures: none of u's pairwise keys leaves anyone.
    CHECK(keys.empty());
    for (uint64_t v : p_set) {
      INFO("P's client " << v);
      CHECK(refused[v] == Errc::kInconsistentSurvivors);
    }
    CHECK(refused[u] == Errc::kInconsistentSurvivors);
  }
}

// The second attacker's review: without the survivors step, a server that tells each client a
// story within its bound reads the sum of three adjacent clients G (the pairwise masks inside G
// cancel): each g in G is told that one outside neighbour w1 dropped (g reveals their pairwise
// key) and w1 that g survived (w1 reveals a share of g's seed), and g's other outside neighbour
// that g dropped (it reveals their pairwise key). Signed, each client signs one list: G's list
// names, of the outside neighbours, a set X that leaves each member exactly t neighbours (so each
// signs it, and its own bound would let it answer); g then reveals only with t of its neighbours'
// signatures of that list, and only G's other two members hold it.
TEST_CASE("secagg: a signed round's survivors step keeps three adjacent clients' sum masked",
          "[privacy][secagg]") {
  LyingRound r(true);
  const Neighbourhoods& g = r.server->graph();
  std::vector<uint64_t> group;  // three mutually adjacent clients (consecutive in the order)
  for (uint64_t a : r.ids)
    for (uint64_t b : g.neighbours(a))
      for (uint64_t c : g.neighbours(b))
        if (group.empty() && a < b && b < c && g.adjacent(a, c)) group = {a, b, c};
  REQUIRE(group.size() == 3);
  const auto in_group = [&](uint64_t v) {
    return std::find(group.begin(), group.end(), v) != group.end();
  };
  std::set<uint64_t> outside;  // G's outside neighbours
  for (uint64_t m : group)
    for (uint64_t v : g.neighbours(m))
      if (!in_group(v)) outside.insert(v);
  // X: two of them, each member beside exactly one (its w1; the others are its w2s).
  std::vector<uint64_t> x_list;
  for (uint64_t a : outside)
    for (uint64_t b : outside) {
      if (!x_list.empty() || a >= b) continue;
      bool one_each = true;
      for (uint64_t m : group)
        one_each &= (g.adjacent(m, a) ? 1 : 0) + (g.adjacent(m, b) ? 1 : 0) == 1;
      if (one_each) x_list = {a, b};
    }
  REQUIRE(x_list.size() == 2);
  std::map<uint64_t, std::vector<uint64_t>> story;  // G: X; X: nobody dropped; the w2s: G dropped
  for (uint64_t w : r.ids)
    story[w] = in_group(w) ? x_list
               : outside.count(w) && !std::binary_search(x_list.begin(), x_list.end(), w)
                   ? group
                   : std::vector<uint64_t>{};
  std::map<uint64_t, SurvivorsSigned> sig;
  std::map<uint64_t, Errc> refused;
  for (uint64_t w : r.ids) {
    try {
      sig[w] = r.c[w]->signSurvivors({r.p.round, story[w]});
    } catch (const InputError& e) {
      refused[w] = e.code();
    }
  }
  // Each client is asked what its story gives, with every signature of that story the server
  // holds from its neighbours.
  std::map<uint64_t, std::vector<Share>> seed_shares;       // of G's members
  std::map<std::pair<uint64_t, uint64_t>, Key32> pairwise;  // (member, outsider) -> key
  for (uint64_t w : r.ids) {
    if (refused.count(w)) continue;
    UnmaskRequest q;
    q.round = r.p.round;
    for (uint64_t v : g.neighbours(w)) {
      const bool absent = std::binary_search(story[w].begin(), story[w].end(), v);
      (absent ? q.dropped : q.survived).push_back(v);
      if (!absent && sig.count(v) && story[v] == story[w]) q.signatures.push_back(sig[v]);
    }
    try {
      for (const RevealedShare& s : r.c[w]->unmask(q).shares) {
        if (!s.mask_key && in_group(s.of)) seed_shares[s.of].push_back(s.share);
        if (s.pairwise && in_group(w) != in_group(s.of))
          pairwise[in_group(w) ? std::pair{w, s.of} : std::pair{s.of, w}] = *s.pairwise;
      }
    } catch (const InputError& e) {
      refused[w] = e.code();
    }
  }
  // Every member signed its list (it keeps t neighbours), and none reveals anything: its story
  // has two signers, the other members.
  for (uint64_t m : group) {
    INFO("member " << m);
    CHECK(sig.count(m));
    REQUIRE(refused.count(m));
    CHECK(refused[m] == Errc::kInconsistentSurvivors);
  }
  // The group's sum, less every mask the server can remove, is not the group's inputs.
  std::vector<uint64_t> sum(r.p.dim, 0), want(r.p.dim, 0);
  for (uint64_t m : group) {
    add(r.p.ring, sum, r.y[m].words);
    add(r.p.ring, want, r.want(m));
    if (seed_shares[m].size() >= r.p.threshold)
      applyMask(sum, shamirRecover(seed_shares[m], r.p.threshold).secret, r.p.round,
                MaskStream::kSelfMask, 0, r.p.ring.bits, /*subtract=*/true);
  }
  size_t boundary = 0;
  for (uint64_t m : group)
    for (uint64_t v : g.neighbours(m)) {
      if (in_group(v)) continue;
      ++boundary;
      const auto k = pairwise.find({m, v});
      if (k != pairwise.end())
        applyMask(sum, k->second, r.p.round, MaskStream::kPairwiseMask, 0, r.p.ring.bits,
                  /*subtract=*/m < v);
    }
  CHECK(pairwise.size() < boundary);
  CHECK(sum != want);
}

// The consistency step's refusals, at the client and at the server: each with its code, nothing
// changed.
TEST_CASE("secagg: a signed round's survivors step refuses what a lying server or client sends",
          "[privacy][secagg]") {
  LyingRound r(true);
  const uint64_t u = 0;
  const auto nu = r.server->graph().neighbours(u);
  const std::vector<uint64_t> n_u(nu.begin(), nu.end());
  SECTION("the client") {
    // Before its masked input, in an unsigned round, with itself absent, leaving fewer than t.
    {
      SecAggClient early(r.p, u, r.ids, &r.signer[u]);
      CHECK(codeOf([&] { early.signSurvivors({r.p.round, {}}); }) == Errc::kWrongRound);
      LyingRound plain(false);
      CHECK(codeOf([&] {
              plain.c[u]->signSurvivors({plain.p.round, {}});
            }) == Errc::kUnexpectedMessage);
    }
    CHECK(codeOf([&] { r.c[u]->signSurvivors({r.p.round, {u}}); }) == Errc::kInconsistentSurvivors);
    CHECK(codeOf([&] {
            r.c[u]->signSurvivors({r.p.round, {n_u[0], n_u[1]}});
          }) == Errc::kTooFewSurvivors);
    CHECK(codeOf([&] { r.c[u]->signSurvivors({r.p.round + 1, {}}); }) == Errc::kWrongRound);
    CHECK(codeOf([&] { r.c[u]->signSurvivors({r.p.round, {5, 5}}); }) == Errc::kDuplicate);
    // Asked to unmask before it signed anything.
    UnmaskRequest before;
    before.round = r.p.round;
    before.survived = n_u;
    CHECK(codeOf([&] { r.c[u]->unmask(before); }) == Errc::kInconsistentSurvivors);
    // Every client signs the true list (nobody dropped); u then refuses a second list.
    std::map<uint64_t, SurvivorsSigned> sig;
    for (uint64_t w : r.ids) sig[w] = r.c[w]->signSurvivors({r.p.round, {}});
    CHECK(codeOf([&] { r.c[u]->signSurvivors({r.p.round, {n_u[0]}}); }) == Errc::kDuplicate);
    UnmaskRequest honest;
    honest.round = r.p.round;
    honest.survived = n_u;
    for (uint64_t v : n_u) honest.signatures.push_back(sig[v]);
    // A request that calls a neighbour dropped, where the list it signed says it survived.
    UnmaskRequest q = honest;
    q.survived.erase(q.survived.begin());
    q.dropped = {n_u[0]};
    CHECK(codeOf([&] { r.c[u]->unmask(q); }) == Errc::kInconsistentSurvivors);
    // Fewer than t signatures; a signature altered, or of another list; one of a client that is
    // not its neighbour, or its own; the same signer twice.
    q = honest;
    q.signatures.resize(r.p.threshold - 1);
    CHECK(codeOf([&] { r.c[u]->unmask(q); }) == Errc::kInconsistentSurvivors);
    q = honest;
    q.signatures[0].signature[5] ^= 1;
    CHECK(codeOf([&] { r.c[u]->unmask(q); }) == Errc::kBadSignature);
    {  // the neighbour's signature of the same list in another exchange (another session)
      SecAggParams later = r.p;
      later.session = 77;
      q = honest;
      q.signatures[0].signature =
          sign(r.signer[n_u[0]].key,
               survivorsBytes(later, rosterHash(r.ids), {}, r.c[n_u[0]]->advertise()));
      CHECK(codeOf([&] { r.c[u]->unmask(q); }) == Errc::kBadSignature);
    }
    {  // ... and in another attempt at the round that a root ran with the same session and
       // roster (an attacker's review: the signer then had other fresh keys)
      const SecAggClient earlier(r.p, n_u[0], r.ids, &r.signer[n_u[0]]);
      q = honest;
      q.signatures[0].signature = sign(
          r.signer[n_u[0]].key, survivorsBytes(r.p, rosterHash(r.ids), {}, earlier.advertise()));
      CHECK(codeOf([&] { r.c[u]->unmask(q); }) == Errc::kBadSignature);
    }
    uint64_t stranger = 0;
    for (uint64_t w : r.ids)
      if (w != u && std::find(n_u.begin(), n_u.end(), w) == n_u.end()) stranger = w;
    q = honest;
    q.signatures[0] = sig[stranger];
    CHECK(codeOf([&] { r.c[u]->unmask(q); }) == Errc::kNotNeighbour);
    q = honest;
    q.signatures[0] = sig[u];
    CHECK(codeOf([&] { r.c[u]->unmask(q); }) == Errc::kNotNeighbour);
    q = honest;
    q.signatures[1] = q.signatures[0];
    CHECK(codeOf([&] { r.c[u]->unmask(q); }) == Errc::kDuplicate);
    // Refused requests changed nothing: the honest one is answered.
    CHECK(r.c[u]->unmask(honest).shares.size() == n_u.size());
  }
  SECTION("the server: who is asked to sign") {
    const uint64_t late = 9;  // its masked input never comes
    REQUIRE(late != u);
    for (uint64_t w : r.ids)
      if (w != late) r.server->onMaskedInput(r.y[w]);
    CHECK(codeOf([&] { r.server->survivorsFor(late); }) == Errc::kWrongSender);
    CHECK(r.server->survivorsFor(u).absent == std::vector<uint64_t>{late});
    LyingRound plain(false);  // no survivors step in an unsigned round
    for (uint64_t w : plain.ids) plain.server->onMaskedInput(plain.y[w]);
    CHECK(codeOf([&] { plain.server->survivorsFor(u); }) == Errc::kUnexpectedMessage);
    CHECK(codeOf([&] {
            plain.server->onSurvivorsSigned({u, plain.p.round, {}});
          }) == Errc::kUnexpectedMessage);
  }
  SECTION("the server") {
    // Before the masked inputs close nothing is asked; a client's signature that does not verify,
    // of another list, twice, from a client it did not ask, or after the unmask step opened.
    SurvivorsSigned forged{u, r.p.round, {}};
    CHECK(codeOf([&] { r.server->onSurvivorsSigned(forged); }) == Errc::kWrongSender);
    for (uint64_t w : r.ids) r.server->onMaskedInput(r.y[w]);
    const SurvivorsRequest list = r.server->survivorsFor(u);
    CHECK(list.absent.empty());
    CHECK(codeOf([&] { r.server->onSurvivorsSigned(forged); }) == Errc::kBadSignature);
    SurvivorsSigned other_list{
        u, r.p.round,
        sign(r.signer[u].key, survivorsBytes(r.p, rosterHash(r.ids), std::vector<uint64_t>{9},
                                             r.c[u]->advertise()))};
    CHECK(codeOf([&] { r.server->onSurvivorsSigned(other_list); }) == Errc::kBadSignature);
    const SurvivorsSigned mine = r.c[u]->signSurvivors(list);
    r.server->onSurvivorsSigned(mine);
    CHECK(codeOf([&] { r.server->onSurvivorsSigned(mine); }) == Errc::kDuplicate);
    // A client that did not sign is not asked to unmask; once a signer is asked, signatures are
    // late.
    CHECK(codeOf([&] { r.server->unmaskRequestFor(n_u[0]); }) == Errc::kWrongSender);
    CHECK(r.server->unmaskRequestFor(u).signatures.empty());  // no neighbour of u signed
    // An unmask answer from a client that did not sign (asked nothing), refused.
    UnmaskResponse unasked;
    unasked.client = n_u[0];
    unasked.round = r.p.round;
    CHECK(codeOf([&] { r.server->onUnmask(unasked); }) == Errc::kWrongSender);
    const SurvivorsSigned late = r.c[n_u[0]]->signSurvivors(r.server->survivorsFor(n_u[0]));
    CHECK(codeOf([&] { r.server->onSurvivorsSigned(late); }) == Errc::kLate);
  }
}

TEST_CASE("secagg: configuration errors", "[privacy][secagg]") {
  SecAggParams p = params(8, 6);
  p.neighbours = 3;
  CHECK_THROWS_AS(p.validate(), ConfigError);
  p = params(8, 6);
  p.threshold = 1;
  CHECK_THROWS_AS(p.validate(), ConfigError);
  p.threshold = 5;  // above k = 4
  CHECK_THROWS_AS(p.validate(), ConfigError);
  p = params(8, 6, 4, 3, true);
  const auto ids = range(0, 6);
  CHECK_THROWS_AS(SecAggClient(p, 0, ids, nullptr), ConfigError);
  CHECK_THROWS_AS(SecAggServer(p, ids, nullptr), ConfigError);
  const std::vector<uint64_t> huge{0, 1, kShamirPrime - 1};
  CHECK_THROWS_AS(SecAggServer(params(8, 3), huge), InvalidArgument);
}
