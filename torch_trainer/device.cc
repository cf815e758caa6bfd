#include "torch_trainer/device.h"

#include <ATen/Context.h>
#include <torch/cuda.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "core/error.h"

namespace starling::torch_trainer {
namespace {

std::string visibleNote(const DeviceInventory& inv) {
  if (!inv.visible_set) return "";
  return " (CUDA_VISIBLE_DEVICES='" + inv.visible + "')";
}

}  // namespace

std::string Device::str() const { return cuda() ? "cuda:" + std::to_string(index) : "cpu"; }

DeviceInventory deviceInventory() {
  DeviceInventory inv;
#ifdef STARLING_TORCH_CUDA
  inv.cuda_built = true;
#endif
  // Without a driver a CUDA LibTorch reports 0 devices (and warns once); a CPU LibTorch always 0.
  inv.gpus = static_cast<int>(torch::cuda::device_count());
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    inv.visible_set = true;
    inv.visible = v;
  }
  return inv;
}

Device chooseDevice(std::string_view setting, const DeviceInventory& inv,
                    const WorkerPlacement& p) {
  const std::string s(setting);
  int explicit_index = -1;
  if (s == "cpu") return {};
  if (s == "auto") {
    if (!inv.cuda_built || inv.gpus == 0) return {};
  } else if (s.rfind("cuda:", 0) == 0) {
    const char* first = s.data() + 5;
    const char* last = s.data() + s.size();
    const auto [end, ec] = std::from_chars(first, last, explicit_index);
    if (ec != std::errc() || end != last || first == last || explicit_index < 0)
      STARLING_THROW(ConfigError, "device '", s,
                     "': the GPU index must be a number >= 0 (cuda:0, cuda:1, ...)");
  } else if (s != "cuda") {
    STARLING_THROW(ConfigError, "device '", s, "' is not one of auto, cpu, cuda, cuda:N");
  }
  if (!inv.cuda_built)
    STARLING_THROW(
        ConfigError, "device = ", s,
        ": this build's LibTorch has no CUDA (Debian's libtorch is CPU-only). Build against a CUDA "
        "LibTorch, such as the one in a PyTorch wheel (docs/gpu.md), or use device = cpu or auto");
  if (inv.gpus == 0)
    STARLING_THROW(
        ConfigError, "device = ", s, ": LibTorch has CUDA but sees no GPU", visibleNote(inv),
        ": no NVIDIA driver, no GPU, or CUDA_VISIBLE_DEVICES hides them. Use device = cpu or auto");
  if (explicit_index >= 0) {
    if (explicit_index >= inv.gpus)
      STARLING_THROW(ConfigError, "device = ", s, ": only ", inv.gpus, " GPU",
                     inv.gpus == 1 ? " is" : "s are", " visible", visibleNote(inv),
                     " (cuda:0 to cuda:", inv.gpus - 1, ")");
    return {Device::Kind::kCuda, explicit_index};
  }
  if (p.workers_per_gpu < 1)
    STARLING_THROW(ConfigError, "workers_per_gpu = ", p.workers_per_gpu, " must be at least 1");
  if (s == "auto") {
    // Never fails for want of GPUs: the machine's workers share the visible GPUs, at least
    // workers_per_gpu on each and as few as fit (2 workers on 1 GPU: both on it).
    if (p.local_workers <= 0)
      return {Device::Kind::kCuda, (p.local_rank / p.workers_per_gpu) % inv.gpus};
    const int per_gpu = std::max(p.workers_per_gpu, (p.local_workers + inv.gpus - 1) / inv.gpus);
    return {Device::Kind::kCuda, p.local_rank / per_gpu};
  }
  if (p.local_workers > 0 && p.local_workers % p.workers_per_gpu != 0)
    STARLING_THROW(ConfigError, "workers_per_gpu = ", p.workers_per_gpu, " does not divide the ",
                   p.local_workers,
                   " workers on this machine: every GPU must get the same number of workers (set "
                   "workers_per_gpu "
                   "to a divisor of ",
                   p.local_workers, ", or start a multiple of ", p.workers_per_gpu, " workers)");
  const int index = p.local_rank / p.workers_per_gpu;
  if (p.local_workers > 0 && p.local_workers / p.workers_per_gpu > inv.gpus)
    STARLING_THROW(ConfigError, "device = ", s, ": ", p.local_workers,
                   " workers on this machine at workers_per_gpu = ", p.workers_per_gpu, " need ",
                   p.local_workers / p.workers_per_gpu, " GPUs, but ", inv.gpus,
                   inv.gpus == 1 ? " is" : " are", " visible", visibleNote(inv),
                   ": raise workers_per_gpu or start fewer workers");
  if (index >= inv.gpus)
    STARLING_THROW(ConfigError, "device = ", s, ": the worker of local rank ", p.local_rank,
                   " at workers_per_gpu = ", p.workers_per_gpu, " needs GPU ", index, ", but ",
                   inv.gpus, inv.gpus == 1 ? " is" : " are", " visible", visibleNote(inv),
                   ": raise workers_per_gpu or start fewer workers");
  return {Device::Kind::kCuda, p.local_rank / p.workers_per_gpu};
}

Device chooseDevice(std::string_view setting, const WorkerPlacement& p) {
  return chooseDevice(setting, deviceInventory(), p);
}

void useReproducibleCuda() {
  at::Context& c = at::globalContext();
  c.setDeterministicCuDNN(true);
  c.setBenchmarkCuDNN(false);
  c.setAllowTF32CuDNN(false);
  c.setAllowTF32CuBLAS(false);
}

}  // namespace starling::torch_trainer
