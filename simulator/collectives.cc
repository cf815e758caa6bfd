#include "simulator/collectives.h"

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

std::unique_ptr<Collectives> makeLocal() { return std::make_unique<LocalCollectives>(); }

std::unique_ptr<Collectives> makeCollectives(std::string_view backend, const LaunchInfo& info,
                                             const CollectiveOptions& options) {
  options.validate();
  if (backend == "local") {
    if (info.world_size != 1) {
      STARLING_THROW(ConfigError, "collectives backend 'local' is a group of one, but the launch says ",
                     info.world_size, " processes (", info.source, "): use 'gloo' or 'nccl'");
    }
    return makeLocal();
  }
  if (backend == "gloo") return makeGloo(info, options);
  if (backend == "nccl") {
    if (!ncclCompiled()) {
      STARLING_THROW(ConfigError, "collectives backend 'nccl' is not in this build (it needs CUDA "
                                  "and NCCL at configure time): use 'gloo'");
    }
    return makeNccl(info, options);
  }
  STARLING_THROW(ConfigError, "unknown collectives backend '", backend, "' (known: local, gloo, nccl)");
}

}  // namespace starling::simulator
