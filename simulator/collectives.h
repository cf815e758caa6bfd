#pragma once
// Collectives: how the simulator's workers combine their partial aggregates (global aggregation).
//
// One flat float buffer per worker (aggregation::PartialAggregate::buffer()) is summed across the
// W workers. Two ways, same result:
//   - allReduceSum(buf): every worker ends with the whole sum;
//   - reduceScatterSum(buf), then the server optimizer on the worker's own shard only, then
//     allGather(buf) (DeAR's decoupling): the optimizer's state (FedAdam's moments) is sharded, and
//     each worker steps 1/W of the model.
// The shard of rank r is shardRange(n, r, W): contiguous, sizes differ by at most one, in rank
// order, covering [0, n) exactly once. A caller that wants the small head of a PartialAggregate
// whole on every worker all-reduces buffer()[0, denseOffset()) and reduce-scatters the dense rest.
//
// Buckets (MG-WFBP's merging). The buffer is already one flat tensor, so there is nothing small to
// merge: the merging is done by construction. What the bucket size bounds instead is each
// collective's working memory (Gloo's ring keeps about one bucket in flight, our Gloo
// reduce-scatter a receive buffer of 2 (W-1)/W buckets, NCCL a device staging buffer of
// bucket_bytes), and it is the unit of pipelining (Gloo's reduce-scatter and all-gather keep two
// buckets on the wire: bucket k+1 travels while bucket k is summed). A buffer larger than a bucket
// goes as several collectives of at most bucket_bytes each; for reduce-scatter and all-gather a
// bucket holds one slice of every rank's shard (W slices of bucket_bytes / W), so shards stay
// contiguous whatever the bucket size.
//
// Contract shared by every implementation:
// - Collective calls: every rank calls the same methods in the same order with buffers of the same
//   size and the same options (bucket_bytes is checked at construction; sizes are the caller's
//   promise: a mismatch ends in an IoError or a timeout, never in a silent wrong sum).
// - Blocking: a call returns when this rank's part is done and `buf` holds its result.
// - Failure: a peer that died, a broken connection or a peer silent past options.timeout is an
//   IoError naming the backend, the operation, this rank and the cause; never a hang. After an
//   IoError the object is unusable (the group may be out of step): destroy it.
// - Sums of floats that are exactly representable (small integers) are exact and identical on every
//   rank and between the all-reduce and the reduce-scatter + all-gather paths; in general the sums'
//   rounding depends on the backend's reduction order (Gloo's ring, NCCL's ring or tree), so
//   results agree to float tolerance, and every rank ends with the same bits after all-reduce or
//   all-gather.
// - Not thread-safe: one thread drives one Collectives. Several in one process are fine (tests run
//   a local one beside Gloo ones); each Gloo or NCCL one is its own group.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "simulator/launch.h"

namespace starling::simulator {

struct CollectiveOptions {
  // Largest collective sent at once (see "Buckets" above). At least 4 * world size bytes is used.
  size_t bucket_bytes = size_t{4} << 20;
  // Rendezvous (store, connections) and each collective: a peer silent this long is an IoError.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Gloo only: the network interface to bind (e.g. "eth0"). Empty: GLOO_SOCKET_IFNAME if set (the
  // PyTorch convention), else 127.0.0.1 when the master address is a loopback address (every local
  // run), else the address this machine's hostname resolves to.
  std::string gloo_interface;
  // Throws ConfigError naming the field for a bad value (bucket_bytes < 4, timeout <= 0).
  void validate() const;
};

class Collectives {
 public:
  virtual ~Collectives();

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "local", "gloo", "nccl"

  // buf <- sum over ranks of buf.
  virtual void allReduceSum(std::span<float> buf) = 0;
  // In: this rank's full buffer. Out: buf[shardRange(n, rank, size)] holds the sum over ranks of
  // that range; the rest of buf is unspecified (scratch).
  virtual void reduceScatterSum(std::span<float> buf) = 0;
  // In: buf[shardRange(n, rank, size)] holds this rank's shard (the rest is ignored and
  // overwritten). Out: every shard, i.e. buf is equal on every rank.
  virtual void allGather(std::span<float> buf) = 0;
  // Returns when every rank has entered it.
  virtual void barrier() = 0;

  // [begin, end) of rank's shard of n elements: the first n % size ranks get one more element.
  // Requires 0 <= rank < size (InvalidArgument otherwise).
  static std::pair<size_t, size_t> shardRange(size_t n, int rank, int size);
  std::pair<size_t, size_t> shard(size_t n) const { return shardRange(n, rank(), size()); }
};

// Every rank's bytes, on every rank, in rank order: a collective call (every rank calls it, each
// with any number of bytes, up to 2^48). The sizes go by allReduceSum (exact small integers), the
// bytes by allGather, four to a float and padded to the largest rank's: a copy on every backend,
// no arithmetic, so any bit pattern arrives as it left. The all-gather buffer is at most
// batch_bytes (one word a rank at least) at a time.
std::vector<std::vector<uint8_t>> allGatherBytes(Collectives& c, std::span<const uint8_t> mine,
                                                 size_t batch_bytes = size_t{32} << 20);

// A group of one (rank 0 of 1): every operation leaves buf as it is. For single-process runs.
std::unique_ptr<Collectives> makeLocal();

// c10d's Gloo process group over a c10d TCPStore that rank 0 hosts at info.master_addr:
// info.master_port (the others connect to it; all wait up to options.timeout for each other). A
// world of one is a local group (no store, no sockets). ConfigError for bad options, IoError when
// the rendezvous fails or times out. Built only with LibTorch; elsewhere it throws ConfigError.
//
// All-reduce is c10d's (Gloo's ring), in place on the caller's memory (torch::from_blob views, no
// copy). Reduce-scatter and all-gather are c10d send/recv to every peer at once (ProcessGroupGloo
// in LibTorch 1.13 throws "does not support reduce_scatter", and its allgather needs equal
// shards): per bucket, rank r sends each peer j the slice of j's shard (reduce-scatter) or its own
// slice (all-gather), and receives the peers' slices of its shard (added onto its own in the order
// r+1, r+2, ... mod W) or theirs
// (into place). Per rank and bucket that is (W-1)/W of the bucket sent in each of the two, so
// reduce-scatter + all-gather move the same bytes as one ring all-reduce (2 (W-1)/W of the buffer
// per rank), in one round trip per bucket rather than a ring's W-1 dependent steps.
std::unique_ptr<Collectives> makeGloo(const LaunchInfo& info,
                                      const CollectiveOptions& options = {});

// By name: "local" (requires info.world_size == 1), "gloo", "nccl" (simulator/nccl_collectives.h).
// ConfigError naming the backend for an unknown or unavailable one.
std::unique_ptr<Collectives> makeCollectives(std::string_view backend, const LaunchInfo& info,
                                             const CollectiveOptions& options = {});

}  // namespace starling::simulator
