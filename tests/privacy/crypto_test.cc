// libsodium's primitives as secure aggregation uses them (privacy/crypto.h): key agreement that
// both sides compute alike and that binds its context, masks that are ChaCha20's stream (RFC 8439's
// test vector) and cancel between a pair, sealed shares that open only in their context, and
// signatures.
#include "privacy/crypto.h"

#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <vector>

#include "core/error.h"
#include "test_keys.h"

using namespace starling;
using namespace starling::privacy;

TEST_CASE("crypto: both sides of a pair agree on one key, bound to the round and purpose",
          "[privacy][crypto]") {
  const DhKeyPair a = DhKeyPair::generate(), b = DhKeyPair::generate(), c = DhKeyPair::generate();
  const Key32 ab = agree(a, b.public_key, 1, 5, KeyPurpose::kMask);
  CHECK(equalKeys(ab, agree(b, a.public_key, 1, 5, KeyPurpose::kMask)));
  // Another pair, round, run or purpose: another key.
  std::set<Key32> keys{ab, agree(a, c.public_key, 1, 5, KeyPurpose::kMask),
                       agree(a, b.public_key, 1, 6, KeyPurpose::kMask),
                       agree(a, b.public_key, 2, 5, KeyPurpose::kMask),
                       agree(a, b.public_key, 1, 5, KeyPurpose::kShareEncryption)};
  CHECK(keys.size() == 5);
  // A low-order point (all zeros) gives no shared key.
  CHECK_THROWS_AS(agree(a, Key32{}, 1, 5, KeyPurpose::kMask), InvalidArgument);
}

TEST_CASE("crypto: a mask is ChaCha20's stream (RFC 8439, 2.3.2)", "[privacy][crypto]") {
  // RFC 8439's block-function test: key 00 01 .. 1f, nonce 00 00 00 09 00 00 00 4a 00 00 00 00,
  // block counter 1. applyMask's nonce is the round's low 7 bytes, the purpose, then the index:
  // round 0x09000000 and purpose 0x4a give that nonce; block 1 is words 8 .. 15 of the stream.
  Key32 key;
  for (int i = 0; i < 32; ++i) key[i] = static_cast<uint8_t>(i);
  const uint8_t block1[64] = {0x10, 0xf1, 0xe7, 0xe4, 0xd1, 0x3b, 0x59, 0x15, 0x50, 0x0f, 0xdd,
                              0x1f, 0xa3, 0x20, 0x71, 0xc4, 0xc7, 0xd1, 0xf4, 0xc7, 0x33, 0xc0,
                              0x68, 0x03, 0x04, 0x22, 0xaa, 0x9a, 0xc3, 0xd4, 0x6c, 0x4e, 0xd2,
                              0x82, 0x64, 0x46, 0x07, 0x9f, 0xaa, 0x09, 0x14, 0xc2, 0xd7, 0x05,
                              0xd9, 0x8b, 0x02, 0xa2, 0xb5, 0x12, 0x9c, 0xd1, 0xde, 0x16, 0x4e,
                              0xb9, 0xcb, 0xd0, 0x83, 0xe8, 0xa2, 0x50, 0x3c, 0x4e};
  std::vector<uint64_t> x(16, 0);
  applyMask(x, key, 0x09000000, static_cast<MaskStream>(0x4a), 0, 64, false);
  for (int w = 0; w < 8; ++w) {
    uint64_t want = 0;
    for (int b = 0; b < 8; ++b) want |= static_cast<uint64_t>(block1[8 * w + b]) << (8 * b);
    CHECK(x[8 + w] == want);
  }
  // In a ring of more than 32 bits, the same words masked to its bits.
  std::vector<uint64_t> z(16, 0);
  applyMask(z, key, 0x09000000, static_cast<MaskStream>(0x4a), 0, 40, false);
  for (int w = 0; w < 16; ++w) CHECK(z[w] == (x[w] & ((uint64_t{1} << 40) - 1)));
  // In a ring of at most 32 bits, the stream's 4-byte words (half the stream): block 1 is words
  // 16 .. 31, each masked to the ring's bits.
  std::vector<uint64_t> y(32, 0);
  applyMask(y, key, 0x09000000, static_cast<MaskStream>(0x4a), 0, 20, false);
  for (int w = 0; w < 16; ++w) {
    uint64_t want = 0;
    for (int b = 0; b < 4; ++b) want |= static_cast<uint64_t>(block1[4 * w + b]) << (8 * b);
    CHECK(y[16 + w] == (want & ((uint64_t{1} << 20) - 1)));
  }
}

TEST_CASE("crypto: a pair's masks cancel, across chunk boundaries, and look uniform",
          "[privacy][crypto]") {
  const Key32 k = randomKey();
  const size_t n = 4096 * 3 + 17;  // several of applyMask's chunks and a partial one
  std::vector<uint64_t> plain(n), a(n), b(n);
  for (size_t i = 0; i < n; ++i) plain[i] = (i * 2654435761u) & 0xffffffffu;
  a = plain;
  std::fill(b.begin(), b.end(), 0);
  applyMask(a, k, 3, MaskStream::kPairwiseMask, 0, 32, false);
  applyMask(b, k, 3, MaskStream::kPairwiseMask, 0, 32, true);
  for (size_t i = 0; i < n; ++i) CHECK(((a[i] + b[i]) & 0xffffffffu) == plain[i]);
  // The masked words' bits are balanced: each of the 32 bits set in 50% +- 5 standard errors.
  for (int bit = 0; bit < 32; ++bit) {
    size_t set = 0;
    for (uint64_t w : a) set += (w >> bit) & 1;
    CHECK(std::abs(static_cast<double>(set) / n - 0.5) < 5 * 0.5 / std::sqrt(n));
  }
  // Other streams of one key differ: another index, purpose or round.
  std::vector<uint64_t> s1(8, 0), s2(8, 0), s3(8, 0), s4(8, 0);
  applyMask(s1, k, 3, MaskStream::kPairwiseMask, 0, 64, false);
  applyMask(s2, k, 3, MaskStream::kPairwiseMask, 1, 64, false);
  applyMask(s3, k, 3, MaskStream::kSelfMask, 0, 64, false);
  applyMask(s4, k, 4, MaskStream::kPairwiseMask, 0, 64, false);
  CHECK(s1 != s2);
  CHECK(s1 != s3);
  CHECK(s1 != s4);
}

TEST_CASE("crypto: a sealed share opens only under its key and context", "[privacy][crypto]") {
  const Key32 k = randomKey(), other = randomKey();
  const std::vector<uint8_t> msg{1, 2, 3, 4, 5, 250}, ctx{7, 7, 7}, ctx2{7, 7, 8};
  const std::vector<uint8_t> sealed = seal(k, msg, ctx);
  CHECK(sealed.size() == msg.size() + 24 + 16);
  const auto opened = open(k, sealed, ctx);
  REQUIRE(opened);
  CHECK(*opened == msg);
  CHECK_FALSE(open(other, sealed, ctx));
  CHECK_FALSE(open(k, sealed, ctx2));  // moved to another sender, recipient or round
  for (size_t i = 0; i < sealed.size(); ++i) {
    std::vector<uint8_t> bad = sealed;
    bad[i] ^= 1;
    CHECK_FALSE(open(k, bad, ctx));
  }
  CHECK_FALSE(open(k, std::vector<uint8_t>(39, 0), ctx));  // shorter than nonce and tag
  CHECK(seal(k, msg, ctx) != sealed);                      // a fresh nonce each time
}

TEST_CASE("crypto: signatures verify for their key and message only", "[privacy][crypto]") {
  const SigningKeyPair s = SigningKeyPair::generate(), t = SigningKeyPair::generate();
  const std::vector<uint8_t> msg{'k', 'e', 'y', 's'}, other{'k', 'e', 'y', 'z'};
  const Signature sig = sign(s, msg);
  CHECK(verify(s.public_key, msg, sig));
  CHECK_FALSE(verify(t.public_key, msg, sig));
  CHECK_FALSE(verify(s.public_key, other, sig));
  Signature bad = sig;
  bad[10] ^= 0x40;
  CHECK_FALSE(verify(s.public_key, msg, bad));
}

TEST_CASE("crypto: KeyStream's words are applyMask's, and its draws are uniform",
          "[privacy][crypto]") {
  Key32 k{};
  k[0] = 9;
  // The words applyMask adds, in order (the RFC vector above pins the stream itself), over three
  // of its chunks and a part: one stream, never restarted at a chunk (a restart would reuse the
  // stream within one vector, and the difference of two masked values would show).
  std::vector<uint64_t> x(3 * 4096 + 17, 0);
  applyMask(x, k, 7, MaskStream::kRounding, 0, 64, false);
  KeyStream s(k, 7, MaskStream::kRounding, 0);
  for (uint64_t w : x) REQUIRE(s.next() == w);
  // In a ring of at most 32 bits, the stream's 32-bit words: the halves of KeyStream's, low first.
  std::vector<uint64_t> h(3 * 4096 + 17, 0);
  applyMask(h, k, 7, MaskStream::kRounding, 0, 32, false);
  KeyStream s32(k, 7, MaskStream::kRounding, 0);
  for (size_t i = 0; i < h.size(); i += 2) {
    const uint64_t w = s32.next();
    REQUIRE(h[i] == (w & 0xffffffffu));
    if (i + 1 < h.size()) REQUIRE(h[i + 1] == (w >> 32));
  }
  // Another purpose, another stream.
  KeyStream graph(k, 7, MaskStream::kGraph, 0);
  CHECK(graph.next() != x[0]);
  // below(n): in range, each value about 1/n of the time (6 standard deviations), and below(1)
  // is 0; uniform() in [0, 1).
  KeyStream d(k, 1, MaskStream::kGraph, 0);
  const uint64_t n = 3, draws = 30'000;
  std::array<uint64_t, 3> seen{};
  for (uint64_t i = 0; i < draws; ++i) {
    const uint64_t v = d.below(n);
    REQUIRE(v < n);
    ++seen[v];
  }
  const double mean = double(draws) / n, sd = std::sqrt(draws * (1.0 / n) * (1 - 1.0 / n));
  for (uint64_t c : seen) CHECK(std::abs(double(c) - mean) < 6 * sd);
  CHECK(d.below(1) == 0);
  // n = 2^63 + 1: the largest multiple of n below 2^64 is n itself, so almost half the words are
  // redrawn (header's contract), which a twin of the stream shows word by word.
  const uint64_t big = (uint64_t{1} << 63) + 1;
  KeyStream e(k, 2, MaskStream::kGraph, 0), twin(k, 2, MaskStream::kGraph, 0);
  uint64_t redrawn = 0;
  const uint64_t big_draws = 4'000;
  for (uint64_t i = 0; i < big_draws; ++i) {
    uint64_t w = twin.next();
    for (; w >= big; w = twin.next()) ++redrawn;
    REQUIRE(e.below(big) == w);
  }
  CHECK(std::abs(double(redrawn) / double(big_draws + redrawn) - 0.5) <
        6 * 0.5 / std::sqrt(double(big_draws + redrawn)));
  for (int i = 0; i < 1000; ++i) {
    const double u = d.uniform();
    CHECK((u >= 0.0 && u < 1.0));
  }
  // The same public values give every party the same key; other values another.
  CHECK(publicKey("l", 1, 2) == publicKey("l", 1, 2));
  CHECK(publicKey("l", 1, 2) != publicKey("l", 1, 3));
  CHECK(publicKey("l", 1, 2) != publicKey("m", 1, 2));
}

TEST_CASE("crypto: a seed gives one signing pair, and a credential holds for its id and key only",
          "[privacy][crypto]") {
  const Key32 seed = testing::testKey(9, 0x33);
  const SigningKeyPair a = SigningKeyPair::fromSeed(seed), b = SigningKeyPair::fromSeed(seed);
  CHECK(a.public_key == b.public_key);
  CHECK(a.secret_key == b.secret_key);
  CHECK(SigningKeyPair::fromSeed(testing::testKey(10, 0x33)).public_key != a.public_key);
  const std::vector<uint8_t> msg{1, 2, 3};
  CHECK(verify(a.public_key, msg, sign(b, msg)));

  const SigningKeyPair authority = SigningKeyPair::generate(), rogue = SigningKeyPair::generate();
  const Credential c{a.public_key, certify(authority, 42, a.public_key)};
  CHECK(credentialValid(authority.public_key, 42, c));
  CHECK_FALSE(credentialValid(authority.public_key, 43, c));  // another id
  CHECK_FALSE(credentialValid(rogue.public_key, 42, c));      // another authority
  Credential other_key = c;
  other_key.signing_key = SigningKeyPair::generate().public_key;
  CHECK_FALSE(credentialValid(authority.public_key, 42, other_key));  // another key
  Credential flipped = c;
  flipped.certificate[17] ^= 0x04;
  CHECK_FALSE(credentialValid(authority.public_key, 42, flipped));
  // The certificate is no signature of the key alone: it cannot pass as one.
  CHECK_FALSE(verify(authority.public_key, a.public_key, c.certificate));
}
