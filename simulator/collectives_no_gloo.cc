// makeGloo where the build has no LibTorch (simulator/collectives.h).
#include "core/error.h"
#include "simulator/collectives.h"

namespace starling::simulator {

std::unique_ptr<Collectives> makeGloo(const LaunchInfo& info, const CollectiveOptions& options) {
  options.validate();
  if (info.world_size == 1) return makeLocal();
  STARLING_THROW(ConfigError,
                 "collectives backend 'gloo' needs LibTorch (c10d), which this build "
                 "was configured without");
}

}  // namespace starling::simulator
