// makeNccl where the build has no CUDA or no NCCL (simulator/nccl_collectives.h).
#include "core/error.h"
#include "simulator/nccl_collectives.h"

namespace starling::simulator {

bool ncclCompiled() noexcept { return false; }
int ncclDeviceCount() noexcept { return 0; }
std::unique_ptr<Collectives> makeNccl(const LaunchInfo&, const CollectiveOptions&) {
  STARLING_THROW(ConfigError,
                 "collectives backend 'nccl' is not in this build (configure with CUDA "
                 "and NCCL: STARLING_CUDA=ON and nccl.h / libnccl in the CUDA toolkit)");
}

}  // namespace starling::simulator
