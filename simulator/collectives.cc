#include "simulator/collectives.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/shard.h"
#include "simulator/nccl_collectives.h"

namespace starling::simulator {

namespace {

class LocalCollectives final : public Collectives {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "local"; }
  void allReduceSum(std::span<float>) override {}
  void reduceScatterSum(std::span<float>) override {}
  void allGather(std::span<float>) override {}
  void barrier() override {}
};

}  // namespace

void CollectiveOptions::validate() const {
  if (bucket_bytes < sizeof(float)) {
    STARLING_THROW(ConfigError, "collectives bucket_bytes = ", bucket_bytes, " must be at least ",
                   sizeof(float), " (one float)");
  }
  if (timeout.count() <= 0) {
    STARLING_THROW(ConfigError, "collectives timeout = ", timeout.count(), " ms must be positive");
  }
}

Collectives::~Collectives() = default;

std::pair<size_t, size_t> Collectives::shardRange(size_t n, int rank, int size) {
  return starling::shardRange(n, rank, size);
}

std::vector<std::vector<uint8_t>> allGatherBytes(Collectives& c, std::span<const uint8_t> mine,
                                                 size_t batch_bytes) {
  const auto world = static_cast<size_t>(c.size()), me = static_cast<size_t>(c.rank());
  STARLING_CHECK_ARG(uint64_t{mine.size()} < (uint64_t{1} << 48), "allGatherBytes: ", mine.size(),
                     " bytes, more than 2^48");
  // The sizes, each as three 16-bit pieces: a float sums up to 2^24 exactly.
  std::vector<float> pieces(3 * world, 0.0f);
  for (size_t k = 0; k < 3; ++k)
    pieces[3 * me + k] = static_cast<float>((uint64_t{mine.size()} >> (16 * k)) & 0xffff);
  c.allReduceSum(pieces);
  std::vector<std::vector<uint8_t>> out(world);
  size_t words = 0;  // of the largest
  for (size_t r = 0; r < world; ++r) {
    uint64_t n = 0;
    for (size_t k = 0; k < 3; ++k) n |= static_cast<uint64_t>(pieces[3 * r + k]) << (16 * k);
    out[r].resize(n);
    words = std::max<size_t>(words, (n + sizeof(float) - 1) / sizeof(float));
  }
  std::copy(mine.begin(), mine.end(), out[me].begin());
  // Then the bytes as they are, four to a float, by allGather (a copy on every backend, no
  // arithmetic): each rank's words [begin, end) of a window in its own shard, padded to the
  // largest.
  const size_t window = std::max<size_t>(1, batch_bytes / sizeof(float) / world);
  std::vector<float> buf;
  const auto section = [](std::vector<uint8_t>& bytes, size_t begin, size_t end) {
    const size_t from = std::min(bytes.size(), begin * sizeof(float));
    return std::pair{from, std::min(bytes.size(), end * sizeof(float)) - from};
  };
  for (size_t begin = 0; begin < words; begin += window) {
    const size_t end = std::min(words, begin + window), len = end - begin;
    buf.assign(world * len, 0.0f);
    const auto [from, count] = section(out[me], begin, end);
    if (count > 0) std::memcpy(buf.data() + me * len, out[me].data() + from, count);
    c.allGather(buf);
    for (size_t r = 0; r < world; ++r) {
      if (r == me) continue;
      const auto [at, n] = section(out[r], begin, end);
      if (n > 0) std::memcpy(out[r].data() + at, buf.data() + r * len, n);
    }
  }
  return out;
}

std::unique_ptr<Collectives> makeLocal() { return std::make_unique<LocalCollectives>(); }

std::unique_ptr<Collectives> makeCollectives(std::string_view backend, const LaunchInfo& info,
                                             const CollectiveOptions& options) {
  options.validate();
  if (backend == "local") {
    if (info.world_size != 1) {
      STARLING_THROW(ConfigError,
                     "collectives backend 'local' is a group of one, but the launch says ",
                     info.world_size, " processes (", info.source, "): use 'gloo' or 'nccl'");
    }
    return makeLocal();
  }
  if (backend == "gloo") return makeGloo(info, options);
  if (backend == "nccl") {
    if (!ncclCompiled()) {
      STARLING_THROW(ConfigError,
                     "collectives backend 'nccl' is not in this build (it needs CUDA "
                     "and NCCL at configure time): use 'gloo'");
    }
    return makeNccl(info, options);
  }
  STARLING_THROW(ConfigError, "unknown collectives backend '", backend,
                 "' (known: local, gloo, nccl)");
}

}  // namespace starling::simulator
