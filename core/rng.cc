#include "core/rng.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "core/bytes.h"
#include "core/error.h"

namespace starling {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

RngStream::RngStream(const StreamKey& key) {
  // Fold each key field through SplitMix64 so that nearby keys give unrelated states.
  uint64_t x = 0x5374726c696e6721ull;  // "Strling!"
  const uint64_t fields[5] = {key.run_seed, key.round, key.client_id,
                              static_cast<uint64_t>(key.purpose), key.sub};
  uint64_t h = 0;
  for (uint64_t f : fields) {
    x ^= f;
    h = splitmix64(x);
    x ^= h;
  }
  for (auto& s : s_) s = splitmix64(x);
  if ((s_[0] | s_[1] | s_[2] | s_[3]) == 0) s_[0] = 1;  // xoshiro must not be all-zero
}

CounterStream::CounterStream(const StreamKey& key) : seed_(RngStream(key).next()) {}

uint64_t RngStream::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t RngStream::below(uint64_t n) {
  STARLING_CHECK_ARG(n > 0, "RngStream::below: n must be positive");
  unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(next()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

double RngStream::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1;
  do {
    u1 = uniform();
  } while (u1 <= 0.0);
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * M_PI * u2;
  spare_ = r * std::sin(theta);
  has_spare_ = true;
  return r * std::cos(theta);
}

void RngStream::save(ByteWriter& w) const {
  for (uint64_t v : s_) w.u64(v);
  w.f64(spare_);
  w.u8(has_spare_ ? 1 : 0);
}

void RngStream::load(ByteReader& r) {
  uint64_t s[4];
  for (uint64_t& v : s) v = r.u64();
  const double spare = r.f64();
  const uint8_t has = r.u8();
  if ((s[0] | s[1] | s[2] | s[3]) == 0) r.fail("a random stream's state is all zeros");
  if (has > 1 || !std::isfinite(spare)) r.fail("a random stream's cached normal is not one");
  std::copy(std::begin(s), std::end(s), s_);
  spare_ = spare;
  has_spare_ = has == 1;
}

}  // namespace starling
