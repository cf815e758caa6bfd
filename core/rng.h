#pragma once
// Seeded, splittable random streams. A stream is named by what it is for, never by who happens to
// run it: (run seed, round, client id, purpose, sub-index) -> an independent xoshiro256** stream.
// So a result never depends on how clients were scheduled onto workers or threads, and two
// processes that name the same stream draw the same numbers.
#include <cstdint>
#include <limits>

namespace starling {

class ByteWriter;
class ByteReader;

enum class StreamPurpose : uint32_t {
  kTest = 0,
  kClientSampling = 1,
  kTopkSample = 2,   // threshold sampling in top-k selection (affects speed only, never the result)
  kRandK = 3,        // per-client random-k indices
  kRandBlock = 4,    // per-round block offsets, shared by every client of the round
  kQsgd = 5,         // per-client stochastic rounding
  kLowRankInit = 6,  // initial PowerSGD / ACP-SGD factors, identical on every client
  kTraining = 7,     // local training (shuffling, initialisation)
  kDataPartition = 8,  // splitting a data set among clients
  kBackoff = 9,        // a deployed client's or aggregator's jitter before sending again
  // 10 was a round's SecAgg+ graph: privacy/ draws only from libsodium (privacy/crypto.h).
};

// Use kAnyClient as the client id of a stream shared by every client of a round.
inline constexpr uint64_t kAnyClient = ~0ull;

struct StreamKey {
  uint64_t run_seed = 0;
  uint64_t round = 0;
  uint64_t client_id = kAnyClient;
  StreamPurpose purpose = StreamPurpose::kTest;
  uint64_t sub = 0;  // e.g. tensor index
};

// xoshiro256** seeded by SplitMix64 over the key. Satisfies UniformRandomBitGenerator.
class RngStream {
 public:
  using result_type = uint64_t;
  explicit RngStream(const StreamKey& key);

  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }
  result_type operator()() { return next(); }

  uint64_t next();
  // Uniform in [0, n), unbiased (Lemire's method). n must be > 0.
  uint64_t below(uint64_t n);
  // Uniform in [0, 1) with 53 (double) or 24 (float) random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  float uniformFloat() { return static_cast<float>(next() >> 40) * 0x1.0p-24f; }
  // Standard normal (Box-Muller; caches the second value).
  double normal();

  // Where the stream is, for a checkpoint: a stream load()ed from what save() wrote continues
  // with the same numbers. load() throws IoError (the reader's) for a state that is not one.
  void save(ByteWriter& w) const;
  void load(ByteReader& r);

 private:
  uint64_t s_[4];
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// A counter-based stream: draw i is SplitMix64's i-th output from a seed that RngStream(key) gives,
// so any draw is computed on its own, in any order and on any device (the round on the device
// computes the same draws with LibTorch's integer operations: torch_trainer/device_compress.cc).
// QSGD's stochastic rounding draws one per value from it.
class CounterStream {
 public:
  explicit CounterStream(const StreamKey& key);
  uint64_t seed() const { return seed_; }
  // Draw i: z = seed + (i + 1) * 0x9e3779b97f4a7c15, mixed by SplitMix64's finaliser.
  uint64_t at(uint64_t i) const {
    uint64_t z = seed_ + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 bits, as RngStream::uniform.
  double uniformAt(uint64_t i) const { return static_cast<double>(at(i) >> 11) * 0x1.0p-53; }

 private:
  uint64_t seed_;
};

}  // namespace starling
