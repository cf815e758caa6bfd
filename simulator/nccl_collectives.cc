// makeNccl (simulator/nccl_collectives.h): NCCL from the CUDA toolkit, bootstrapped through the
// c10d TCPStore of simulator/collectives_store.h. Host code only (NCCL and the CUDA runtime are
// called from the host), so this is a .cc compiled by the host compiler; built only when CUDA is
// enabled and NCCL was found (simulator/CMakeLists.txt).
#include "simulator/nccl_collectives.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"
#include "simulator/collectives_store.h"

namespace starling::simulator {

namespace {

using Steady = std::chrono::steady_clock;  // not the injectable starling::Clock

void cudaCheck(cudaError_t e, const char* call, const char* op) {
  if (e != cudaSuccess) {
    STARLING_THROW(IoError, "nccl collectives: ", call, " in ", op,
                   " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  }
}

// Keeps the calling thread's current device (cuda/device.h promises the same).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    cudaCheck(cudaSetDevice(device), "cudaSetDevice", "device selection");
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(const LaunchInfo& info, const CollectiveOptions& o)
      : rank_(info.rank), size_(info.world_size), opt_(o) {
    try {
      setup(info, o);
    } catch (...) {
      release();  // a constructor that throws runs no destructor
      throw;
    }
  }

  ~NcclCollectives() override { release(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }

  void allReduceSum(std::span<float> buf) override {
    const char* op = "allReduceSum";
    DeviceGuard guard = begin(op);
    for (size_t off = 0; off < buf.size(); off += staging_n_) {
      const size_t m = std::min(staging_n_, buf.size() - off);
      upload(buf.data() + off, staging_, m, op);
      enqueue(ncclAllReduce(staging_, staging_, m, ncclFloat, ncclSum, comm_, stream_),
              "ncclAllReduce", op);
      download(staging_, buf.data() + off, m, op);
      waitStream(op);
    }
  }

  // Per bucket: every rank's slice packed into W slots of chunk_ floats (zero padding), reduced in
  // place (recvbuff = sendbuff + rank * count, as NCCL's in-place reduce-scatter requires).
  void reduceScatterSum(std::span<float> buf) override {
    const char* op = "reduceScatterSum";
    DeviceGuard guard = begin(op);
    const size_t buckets = bucketCount(buf.size());
    for (size_t k = 0; k < buckets; ++k) {
      for (int j = 0; j < size_; ++j) {
        const auto [b, e] = slice(buf.size(), k, j);
        float* slot = staging_ + static_cast<size_t>(j) * chunk_;
        upload(buf.data() + b, slot, e - b, op);
        if (e - b < chunk_) {
          check(cudaMemsetAsync(slot + (e - b), 0, (chunk_ - (e - b)) * sizeof(float), stream_),
                "cudaMemsetAsync", op);
        }
      }
      float* mine = staging_ + static_cast<size_t>(rank_) * chunk_;
      enqueue(ncclReduceScatter(staging_, mine, chunk_, ncclFloat, ncclSum, comm_, stream_),
              "ncclReduceScatter", op);
      const auto [b, e] = slice(buf.size(), k, rank_);
      download(mine, buf.data() + b, e - b, op);
      waitStream(op);
    }
  }

  void allGather(std::span<float> buf) override {
    const char* op = "allGather";
    DeviceGuard guard = begin(op);
    const size_t buckets = bucketCount(buf.size());
    for (size_t k = 0; k < buckets; ++k) {
      float* mine = staging_ + static_cast<size_t>(rank_) * chunk_;
      const auto [b, e] = slice(buf.size(), k, rank_);
      upload(buf.data() + b, mine, e - b, op);
      enqueue(ncclAllGather(mine, staging_, chunk_, ncclFloat, comm_, stream_), "ncclAllGather",
              op);
      for (int j = 0; j < size_; ++j) {
        const auto [jb, je] = slice(buf.size(), k, j);
        download(staging_ + static_cast<size_t>(j) * chunk_, buf.data() + jb, je - jb, op);
      }
      waitStream(op);
    }
  }

  // NCCL has no barrier: an all-reduce of one float does the job.
  void barrier() override {
    const char* op = "barrier";
    DeviceGuard guard = begin(op);
    enqueue(ncclAllReduce(staging_, staging_, 1, ncclFloat, ncclSum, comm_, stream_),
            "ncclAllReduce", op);
    waitStream(op);
  }

 private:
  void setup(const LaunchInfo& info, const CollectiveOptions& o) {
    int count = 0;
    cudaCheck(cudaGetDeviceCount(&count), "cudaGetDeviceCount", "setup");
    if (count == 0) STARLING_THROW(IoError, "nccl collectives: no CUDA device");
    device_ = info.local_rank % count;
    DeviceGuard guard(device_);

    ncclUniqueId id;
    if (size_ == 1) {
      ncclCheck(ncclGetUniqueId(&id), "ncclGetUniqueId", "setup");
    } else {
      store_ = detail::connectStore(info, o.timeout, "nccl");
      detail::agreeOnValue(*store_, rank_, "bucket_bytes", std::to_string(o.bucket_bytes));
      try {
        if (rank_ == 0) {
          ncclCheck(ncclGetUniqueId(&id), "ncclGetUniqueId", "setup");
          const auto* p = reinterpret_cast<const uint8_t*>(&id);
          store_->set("unique_id", std::vector<uint8_t>(p, p + sizeof(id)));
        } else {
          const std::vector<uint8_t> v = store_->get("unique_id");
          if (v.size() != sizeof(id)) {
            STARLING_THROW(IoError, "nccl collectives: the unique id in the store has ", v.size(),
                           " bytes, expected ", sizeof(id), " (another NCCL version on rank 0?)");
          }
          std::memcpy(&id, v.data(), sizeof(id));
        }
      } catch (const IoError&) {
        throw;
      } catch (const std::exception& e) {
        STARLING_THROW(IoError, "nccl collectives: exchanging the unique id (rank ", rank_,
                       ") failed: ", detail::describe(e));
      }
    }

    // Non-blocking communicator: init and every call return at once, and waitComm()/waitStream()
    // poll with a deadline, so a peer that never arrives or dies is an IoError, not a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) ncclCheck(r, "ncclCommInitRankConfig", "setup");
    waitComm("setup (ncclCommInitRankConfig)");

    cudaCheck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate",
              "setup");
    const size_t bucket_floats = std::max<size_t>(1, o.bucket_bytes / sizeof(float));
    chunk_ = std::max<size_t>(1, bucket_floats / static_cast<size_t>(size_));
    staging_n_ = std::max(bucket_floats, chunk_ * static_cast<size_t>(size_));
    cudaCheck(cudaMalloc(reinterpret_cast<void**>(&staging_), staging_n_ * sizeof(float)),
              "cudaMalloc", "setup");
  }

  // Frees what setup() made; no throw, no unbounded wait for peers.
  void release() noexcept {
    if (stream_ || staging_ || comm_) cudaSetDevice(device_);
    if (comm_) {
      if (broken_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommFinalize(comm_);
        ncclResult_t state = ncclInProgress;
        const auto deadline = Steady::now() + opt_.timeout;
        while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress &&
               Steady::now() < deadline) {
          std::this_thread::yield();
        }
        if (state == ncclSuccess) {
          ncclCommDestroy(comm_);
        } else {
          ncclCommAbort(comm_);
        }
      }
    }
    if (staging_) cudaFree(staging_);
    if (stream_) cudaStreamDestroy(stream_);
    comm_ = nullptr;
    staging_ = nullptr;
    stream_ = nullptr;
  }

  DeviceGuard begin(const char* op) {
    if (broken_) {
      STARLING_THROW(IoError, "nccl ", op, " on rank ", rank_, " of ", size_,
                     ": the communicator failed earlier and was aborted (destroy this object)");
    }
    return DeviceGuard(device_);
  }

  size_t bucketCount(size_t n) const {
    const auto [b, e] = shardRange(n, 0, size_);  // rank 0's shard is the longest
    return (e - b + chunk_ - 1) / chunk_;
  }
  std::pair<size_t, size_t> slice(size_t n, size_t k, int j) const {
    const auto [b, e] = shardRange(n, j, size_);
    const size_t lo = std::min(e, b + k * chunk_);
    return {lo, std::min(e, lo + chunk_)};
  }

  // Pageable host memory: the driver stages these copies, so they are synchronous for the host;
  // pinning the caller's span per call would cost more than it saves for one copy.
  void upload(const float* host, float* dev, size_t n, const char* op) {
    if (n == 0) return;
    check(cudaMemcpyAsync(dev, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync H2D", op);
  }
  void download(const float* dev, float* host, size_t n, const char* op) {
    if (n == 0) return;
    check(cudaMemcpyAsync(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync D2H", op);
  }

  void check(cudaError_t e, const char* call, const char* op) {
    if (e != cudaSuccess) {
      fail();
      cudaCheck(e, call, op);
    }
  }
  void ncclCheck(ncclResult_t r, const char* call, const char* op) {
    if (r != ncclSuccess) {
      const std::string detail = comm_ ? std::string(" (") + ncclGetLastError(comm_) + ")" : "";
      fail();
      STARLING_THROW(IoError, "nccl ", op, " on rank ", rank_, " of ", size_, ": ", call,
                     " failed: ", ncclGetErrorString(r), detail);
    }
  }
  void enqueue(ncclResult_t r, const char* call, const char* op) {
    if (r != ncclSuccess && r != ncclInProgress) ncclCheck(r, call, op);
    waitComm(op);
  }

  // Polls the communicator's state until it is no longer ncclInProgress (non-blocking mode).
  void waitComm(const char* op) {
    const auto deadline = Steady::now() + opt_.timeout;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclCheck(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError", op);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) ncclCheck(state, "(asynchronous error)", op);
      if (Steady::now() > deadline) timedOut(op);
      std::this_thread::yield();
    }
  }

  // Waits for the stream, checking the communicator for asynchronous (network) errors meanwhile.
  void waitStream(const char* op) {
    const auto deadline = Steady::now() + opt_.timeout;
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check(q, "cudaStreamQuery", op);
      ncclResult_t state = ncclSuccess;
      ncclCheck(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError", op);
      if (state != ncclSuccess && state != ncclInProgress)
        ncclCheck(state, "(asynchronous error)", op);
      if (Steady::now() > deadline) timedOut(op);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  [[noreturn]] void timedOut(const char* op) {
    fail();
    STARLING_THROW(IoError, "nccl ", op, " on rank ", rank_, " of ", size_, " timed out after ",
                   opt_.timeout.count(),
                   " ms (a peer died or stayed silent); the communicator was aborted");
  }

  // Aborts the communicator: after an error NCCL's state is unknown and peers may be stuck in it.
  void fail() {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    broken_ = true;
  }

  int rank_, size_;
  CollectiveOptions opt_;
  int device_ = 0;
  c10::intrusive_ptr<c10d::Store> store_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* staging_ = nullptr;
  size_t staging_n_ = 0;
  size_t chunk_ = 0;
  bool broken_ = false;
};

}  // namespace

bool ncclCompiled() noexcept { return true; }

int ncclDeviceCount() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::unique_ptr<Collectives> makeNccl(const LaunchInfo& info, const CollectiveOptions& options) {
  options.validate();
  return std::make_unique<NcclCollectives>(info, options);
}

}  // namespace starling::simulator
