#pragma once
// The NCCL twin of makeGloo() (simulator/collectives.h), for workers that train on GPUs.
//
// Same interface and contract as every Collectives; what differs:
// - Rendezvous: a c10d TCPStore hosted by rank 0 at info.master_addr:info.master_port, as for
//   Gloo. Rank 0 creates the ncclUniqueId and publishes it in the store; every rank reads it and
//   calls ncclCommInitRank. One GPU per rank: device info.local_rank % (visible devices). NCCL does
//   not allow two ranks of one communicator on the same GPU, so "several workers per device" needs
//   Gloo (or one NCCL rank per device with several model replicas inside it).
// - Memory: the interface takes host spans (the partial aggregate lives in host memory), so each
//   bucket is copied to a device staging buffer (bucket_bytes, allocated once), reduced there and
//   copied back on one CUDA stream. Entry points on device pointers (a partial aggregate kept on
//   the GPU) would skip both copies; they are not written yet.
// - Reduce-scatter and all-gather are ncclReduceScatter / ncclAllGather in place on the staging
//   buffer; NCCL needs equal counts per rank, so each bucket packs every rank's slice into W equal
//   slots padded with zeros (at most W - 1 padding floats per bucket on the wire).
// - Errors: NCCL and CUDA failures are IoError with ncclGetErrorString / cudaGetErrorString. Each
//   call waits for its stream with a deadline of options.timeout, polling ncclCommGetAsyncError;
//   past the deadline the communicator is aborted (ncclCommAbort) and the call throws IoError, so a
//   dead peer does not hang the others forever.
//
// Compiled only when CUDA is enabled and NCCL was found (STARLING_CUDA_ENABLED, see
// simulator/CMakeLists.txt); elsewhere ncclCompiled() is false and makeNccl throws ConfigError.
// Without a usable GPU it throws IoError.
#include <memory>

#include "simulator/collectives.h"

namespace starling::simulator {

bool ncclCompiled() noexcept;
// Number of CUDA devices this process can use; 0 (never an exception) without a GPU, driver or
// CUDA build.
int ncclDeviceCount() noexcept;
std::unique_ptr<Collectives> makeNccl(const LaunchInfo& info,
                                      const CollectiveOptions& options = {});

}  // namespace starling::simulator
