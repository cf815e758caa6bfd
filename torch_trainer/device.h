#pragma once
// Where LibTorch computes: the CPU or one CUDA GPU. The simulator's workers (`sim.device`,
// `sim.workers_per_gpu`) and the split cloud (`--device`) pick it here, and the LibTorch trainer
// keeps its model, optimizer state, data and training loop on it (torch_trainer.h). This header
// includes no LibTorch.
//
// Settings: "auto" (a GPU when LibTorch sees one, else the CPU; the machine's workers share the
// visible GPUs, at least workers_per_gpu on each and more when there are more workers than that
// fills), "cpu", "cuda" (the worker's GPU, chosen from its local rank with exactly
// workers_per_gpu per GPU), "cuda:N" (GPU N of those visible, every worker alike).
//
// Several workers per GPU (FedML Parrot's sequential training, several replicas sharing one GPU):
// the worker of local rank r binds GPU r / workers_per_gpu among the visible ones, so
// CUDA_VISIBLE_DEVICES decides which physical GPUs a node offers, and torchrun's LOCAL_RANK or
// srun's SLURM_LOCALID which one a worker takes (simulator/launch.h reads them).
#include <string>
#include <string_view>

namespace starling::torch_trainer {

struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // among the visible GPUs (kCuda)

  bool cuda() const { return kind == Kind::kCuda; }
  std::string str() const;  // "cpu", "cuda:1"
  bool operator==(const Device&) const = default;
};

// What LibTorch offers this process.
struct DeviceInventory {
  bool cuda_built = false;  // this LibTorch was built with CUDA (Debian's is not)
  int gpus = 0;             // GPUs LibTorch sees (0 without a driver); CUDA_VISIBLE_DEVICES applies
  std::string visible;      // CUDA_VISIBLE_DEVICES for messages ("" when unset)
  bool visible_set = false;
};
DeviceInventory deviceInventory();

// Where the worker sits on its machine (simulator/launch.h's LaunchInfo).
struct WorkerPlacement {
  int local_rank = 0;
  int local_workers = 1;  // workers on this machine; 0 when the launcher does not say
  int workers_per_gpu = 1;
};

// The device for `setting`. A pure function of its arguments (tests pass made-up inventories).
// ConfigError, naming the setting and what to change, for: an unknown setting; cuda on a LibTorch
// built without CUDA; cuda with no GPU visible (no driver, or CUDA_VISIBLE_DEVICES hiding them);
// workers_per_gpu < 1; a number of workers on the machine that workers_per_gpu does not divide;
// more workers than visible GPUs x workers_per_gpu (or a local rank past them); cuda:N past the
// visible GPUs. "auto" never fails for want of GPUs: without one it takes the CPU, with too few
// it puts more workers on each.
Device chooseDevice(std::string_view setting, const DeviceInventory& inv, const WorkerPlacement& p);

// chooseDevice with this process's inventory.
Device chooseDevice(std::string_view setting, const WorkerPlacement& p = {});

// Makes this process's CUDA arithmetic that of the CPU's to float rounding, and repeatable: cuDNN
// picks deterministic algorithms and does not benchmark, and neither cuDNN nor cuBLAS rounds
// float32 inputs to TF32 (LibTorch's default lets cuDNN convolutions do so: a 10-bit mantissa,
// about 1e-3 relative per operation, which a GPU run would carry against its CPU twin). Like
// setThreads (threads.h), a process-wide setting that the program makes once: starling-sim and
// starling-split do when their device is a GPU. Slower than the defaults; the price of a GPU run
// being the same experiment as a CPU run.
void useReproducibleCuda();

}  // namespace starling::torch_trainer
