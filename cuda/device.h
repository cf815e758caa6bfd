#pragma once
// starling::cuda: Starling's GPU paths, behind a plain C++ interface. No CUDA type appears here, so
// any .cc file compiled by the host compiler can include this header; only cuda/device.cu is
// compiled by nvcc. The module is built only when CUDA is enabled (STARLING_CUDA).
//
// Each function has a CPU twin that the rest of the suite tests, and tests/cuda/cuda_test.cc checks
// the two against each other on a GPU (it is reported as skipped where there is none):
//   accumulateSparse  <->  the Sparse case of compression::accumulatePayload (a scatter-add)
//   allFinite         <->  starling::allFinite (core/finite.h)
//
// Contract shared by everything here:
// - Everything runs on device 0 and is synchronous: a call returns when the device work is done
//   and its result (or error) is known. The calling thread's current CUDA device is restored.
// - Every CUDA error becomes a starling::IoError whose message names the call and carries CUDA's
//   error name and string. Bad arguments (sizes, index ranges) are InvalidArgument, checked on the
//   host before anything touches the device.
// - Results are defined bit for bit: accumulateSparse does one fused multiply-add per element
//   (std::fma(weight, value, out), rounded once), allFinite is exact. A CPU loop written as
//   out += weight * value matches it where the compiler contracts that into an FMA (GCC does by
//   default for C++ when the target has FMA, e.g. -march=native here) and is otherwise one
//   rounding away.
#include <cstddef>
#include <cstdint>
#include <span>

namespace starling::cuda {

// Number of GPUs that can run this module's kernels (a GPU older than the compiled architectures
// does not count). 0, never an exception, when there is no GPU or no driver or the driver is too
// old for this CUDA runtime. Functions below use device 0; callers check deviceCount() > 0 first.
int deviceCount() noexcept;

// n floats in device 0's memory, zeroed at construction, freed by the destructor. Move-only: a
// moved-from buffer is empty (size() == 0). Not thread-safe; one buffer, one thread at a time.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n);  // IoError when the allocation fails (or there is no device)
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  size_t size() const { return n_; }
  // Copies host.size() == size() floats to / from the device (InvalidArgument on another size).
  void upload(std::span<const float> host);
  void download(std::span<float> host) const;

  // The device address, for kernels in this module; never dereference it on the host.
  float* deviceData() { return ptr_; }
  const float* deviceData() const { return ptr_; }

 private:
  float* ptr_ = nullptr;
  size_t n_ = 0;
};

// out[indices[i]] += weight * values[i] for every i. The spans are host memory, copied to the
// device for the call. indices.size() must equal values.size() and every index must be below
// out.size() (InvalidArgument otherwise, checked on the host: a stray index on the device would
// corrupt memory and poison the whole CUDA context). Indices must be unique, which
// compression::validateUpdate guarantees for every received Sparse payload (strictly increasing):
// that is what lets one thread own each output element without atomics, and keeps the result
// deterministic. Duplicate indices are a precondition violation (some adds would be lost).
void accumulateSparse(DeviceBuffer& out, std::span<const uint32_t> indices,
                      std::span<const float> values, float weight);

// True iff b holds no NaN and no infinity (true for an empty buffer). Same test as the CPU
// starling::allFinite: the maximum over the bit patterns without the sign bit must stay below the
// exponent-all-ones pattern 0x7f800000, computed by one reduction kernel.
bool allFinite(const DeviceBuffer& b);

}  // namespace starling::cuda
