// The CUDA half of cuda/device.h. Kept small on purpose: it compiles in every `make test` where
// nvcc is present, and until a GPU runs tests/cuda/cuda_test.cc its kernels are only compiled.
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "core/error.h"
#include "cuda/device.h"

namespace starling::cuda {
namespace {

constexpr int kThreads = 256;  // threads per block, a multiple of the warp size
// Grid-stride loops let a bounded grid cover any n; 4096 blocks of 256 threads keep every SM of an
// H100/H200 (132 SMs, up to 2048 resident threads each) busy several times over.
constexpr size_t kMaxBlocks = 4096;

unsigned blocksFor(size_t n) {
  return static_cast<unsigned>(std::min((n + kThreads - 1) / kThreads, kMaxBlocks));
}

// Throws IoError for a failed CUDA call, with CUDA's name and description of the error.
void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  // Reset the runtime's last-error slot so that the next, unrelated call does not report this one
  // again (sticky errors, which kill the context, stay regardless).
  (void)cudaGetLastError();
  STARLING_THROW(IoError, "CUDA: ", what, " failed: ", cudaGetErrorName(e), " (",
                 cudaGetErrorString(e), ")");
}

// Makes device 0 current for one call and restores the caller's device afterwards: the current
// device is per-thread state that belongs to the caller, not to this module.
class OnDevice0 {
 public:
  OnDevice0() noexcept {
    status_ = cudaGetDevice(&previous_);
    if (status_ == cudaSuccess && previous_ != 0) status_ = cudaSetDevice(0);
  }
  ~OnDevice0() {
    if (status_ == cudaSuccess && previous_ != 0) (void)cudaSetDevice(previous_);
  }
  OnDevice0(const OnDevice0&) = delete;
  OnDevice0& operator=(const OnDevice0&) = delete;
  // Throws when device 0 could not be made current; call before any other CUDA call.
  void check() const { cuda::check(status_, "selecting device 0"); }

 private:
  int previous_ = 0;
  cudaError_t status_ = cudaSuccess;
};

// Device memory for the duration of one call (the staging copies of host spans).
template <typename T>
class Scratch {
 public:
  explicit Scratch(size_t n) {
    if (n > 0)
      check(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)), "cudaMalloc (scratch)");
  }
  ~Scratch() { (void)cudaFree(ptr_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

// Waits for the work queued on the default stream and reports its errors: launch failures show up
// in cudaGetLastError, faults during execution only at the next synchronisation.
void finish(const char* what) {
  check(cudaGetLastError(), what);
  check(cudaStreamSynchronize(0), what);
}

// One thread per entry. Indices are unique (the caller's contract), so no two threads write the
// same element and a plain read-modify-write is exact; no atomics. __fmaf_rn spells out the one
// fused multiply-add (std::fma on the host) rather than leaving the rounding to nvcc's -fmad.
__global__ void scatterAddKernel(float* __restrict__ out, const uint32_t* __restrict__ indices,
                                 const float* __restrict__ values, size_t n, float weight) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t j = indices[i];
    out[j] = __fmaf_rn(weight, values[i], out[j]);
  }
}

__device__ unsigned warpMax(unsigned x) {
  for (int offset = 16; offset > 0; offset >>= 1)
    x = max(x, __shfl_down_sync(0xffffffffu, x, offset));
  return x;
}

// *result = max over i of (bits(v[i]) & 0x7fffffff), the same integer reduction as the CPU
// starling::allFinite: NaN and +-inf are exactly the patterns >= 0x7f800000. Each thread reduces
// its grid-stride slice, then its warp, then its block; one atomicMax per block combines blocks.
__global__ void maxAbsBitsKernel(const float* __restrict__ v, size_t n,
                                 unsigned* __restrict__ result) {
  unsigned worst = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    worst = max(worst, __float_as_uint(v[i]) & 0x7fffffffu);
  __shared__ unsigned perWarp[kThreads / 32];
  worst = warpMax(worst);
  if (threadIdx.x % 32 == 0) perWarp[threadIdx.x / 32] = worst;
  __syncthreads();
  if (threadIdx.x < 32) {
    worst = warpMax(threadIdx.x < kThreads / 32 ? perWarp[threadIdx.x] : 0u);
    if (threadIdx.x == 0) atomicMax(result, worst);
  }
}

}  // namespace

int deviceCount() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {  // no driver, no GPU, driver older than the runtime
    (void)cudaGetLastError();
    return 0;
  }
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  // A GPU counts only if this binary holds code it can run: SASS for its architecture or PTX the
  // driver can compile for it (CMAKE_CUDA_ARCHITECTURES). Otherwise every launch would fail with
  // cudaErrorNoKernelImageForDevice.
  int usable = 0;
  for (int d = 0; d < n; ++d) {
    cudaFuncAttributes attr;
    if (cudaSetDevice(d) == cudaSuccess &&
        cudaFuncGetAttributes(&attr, maxAbsBitsKernel) == cudaSuccess &&
        cudaFuncGetAttributes(&attr, scatterAddKernel) == cudaSuccess)
      ++usable;
    else
      (void)cudaGetLastError();
  }
  (void)cudaSetDevice(previous);
  return usable;
}

DeviceBuffer::DeviceBuffer(size_t n) {
  STARLING_CHECK_ARG(n <= std::numeric_limits<size_t>::max() / sizeof(float), "cuda: buffer of ", n,
                     " floats is too large");
  if (n == 0) return;
  OnDevice0 on;
  on.check();
  float* p = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float)), "cudaMalloc");
  try {
    check(cudaMemset(p, 0, n * sizeof(float)), "cudaMemset");
    finish("cudaMemset");
  } catch (...) {
    (void)cudaFree(p);  // a constructor that throws gets no destructor call
    throw;
  }
  ptr_ = p;
  n_ = n;
}

DeviceBuffer::~DeviceBuffer() {
  if (!ptr_) return;
  OnDevice0 on;  // cudaFree does not need the owning device current, but keep calls uniform
  (void)cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), n_(other.n_) {
  other.ptr_ = nullptr;
  other.n_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));  // frees what this held, at the end of the scope
    ptr_ = other.ptr_;
    n_ = other.n_;
    other.ptr_ = nullptr;
    other.n_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(std::span<const float> host) {
  STARLING_CHECK_ARG(host.size() == n_, "cuda: upload of ", host.size(),
                     " floats into a buffer of ", n_);
  if (n_ == 0) return;
  OnDevice0 on;
  on.check();
  check(cudaMemcpy(ptr_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice),
        "cudaMemcpy (upload)");
  finish("cudaMemcpy (upload)");  // a copy from pageable memory may still be in flight on return
}

void DeviceBuffer::download(std::span<float> host) const {
  STARLING_CHECK_ARG(host.size() == n_, "cuda: download of a buffer of ", n_, " floats into ",
                     host.size());
  if (n_ == 0) return;
  OnDevice0 on;
  on.check();
  check(cudaMemcpy(host.data(), ptr_, n_ * sizeof(float), cudaMemcpyDeviceToHost),
        "cudaMemcpy (download)");
}

void accumulateSparse(DeviceBuffer& out, std::span<const uint32_t> indices,
                      std::span<const float> values, float weight) {
  STARLING_CHECK_ARG(indices.size() == values.size(), "cuda: accumulateSparse with ",
                     indices.size(), " indices but ", values.size(), " values");
  // The only bounds check the kernel gets; one pass over host memory, cheap next to the copy.
  uint32_t top = 0;
  for (uint32_t i : indices) top = std::max(top, i);
  STARLING_CHECK_ARG(indices.empty() || top < out.size(), "cuda: accumulateSparse index ", top,
                     " out of range for a buffer of ", out.size());
  const size_t n = indices.size();
  if (n == 0) return;
  OnDevice0 on;
  on.check();
  // Staged per call: simple, and the copies dominate anyway at this size. A path that adds many
  // updates per round would keep the staging buffers (and pinned host memory) alive across calls.
  Scratch<uint32_t> d_indices(n);
  Scratch<float> d_values(n);
  check(cudaMemcpy(d_indices.get(), indices.data(), n * sizeof(uint32_t), cudaMemcpyHostToDevice),
        "cudaMemcpy (indices)");
  check(cudaMemcpy(d_values.get(), values.data(), n * sizeof(float), cudaMemcpyHostToDevice),
        "cudaMemcpy (values)");
  scatterAddKernel<<<blocksFor(n), kThreads>>>(out.deviceData(), d_indices.get(), d_values.get(), n,
                                               weight);
  finish("scatter-add kernel");
}

bool allFinite(const DeviceBuffer& b) {
  if (b.size() == 0) return true;
  OnDevice0 on;
  on.check();
  Scratch<unsigned> d_worst(1);
  check(cudaMemset(d_worst.get(), 0, sizeof(unsigned)), "cudaMemset (allFinite)");
  maxAbsBitsKernel<<<blocksFor(b.size()), kThreads>>>(b.deviceData(), b.size(), d_worst.get());
  check(cudaGetLastError(), "allFinite kernel launch");
  unsigned worst = 0;
  // A blocking copy on the default stream: waits for the kernel and reports a fault inside it.
  check(cudaMemcpy(&worst, d_worst.get(), sizeof(unsigned), cudaMemcpyDeviceToHost),
        "allFinite kernel");
  return worst < 0x7f800000u;
}

}  // namespace starling::cuda
