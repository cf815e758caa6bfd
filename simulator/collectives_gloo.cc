// makeGloo (simulator/collectives.h): c10d's ProcessGroupGloo over the c10d TCPStore of
// simulator/collectives_store.h. Needs the compile definition USE_C10D_GLOO
// (simulator/CMakeLists.txt).
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <functional>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "core/error.h"
#include "simulator/collectives.h"
#include "simulator/collectives_store.h"

namespace starling::simulator {

namespace {

using detail::describe;

bool isLoopback(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "localhost" || addr == "::1";
}

std::shared_ptr<::gloo::transport::Device> glooDevice(const LaunchInfo& info,
                                                      const CollectiveOptions& o) {
  std::string iface = o.gloo_interface;
  if (iface.empty()) {
    if (const char* env = std::getenv("GLOO_SOCKET_IFNAME"); env && *env) iface = env;
  }
  if (!iface.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(iface);
  if (isLoopback(info.master_addr))
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

at::Tensor view(float* p, size_t n) {
  return torch::from_blob(p, {static_cast<int64_t>(n)}, torch::kFloat32);
}

// Per-bucket slices of every rank's shard (collectives.h, "Buckets"): bucket k holds, for each
// rank j, [shard_j.begin + k c, min(shard_j.end, shard_j.begin + (k + 1) c)).
struct ShardBuckets {
  ShardBuckets(size_t n, int w, size_t bucket_floats)
      : size(w), chunk(std::max<size_t>(1, bucket_floats / w)) {
    size_t longest = 0;
    for (int j = 0; j < w; ++j) {
      shards.push_back(Collectives::shardRange(n, j, w));
      longest = std::max(longest, shards.back().second - shards.back().first);
    }
    count = (longest + chunk - 1) / chunk;
  }
  std::pair<size_t, size_t> slice(size_t k, int j) const {
    const auto [b, e] = shards[static_cast<size_t>(j)];
    const size_t lo = std::min(e, b + k * chunk);
    return {lo, std::min(e, lo + chunk)};
  }
  int size;
  size_t chunk;
  size_t count = 0;
  std::vector<std::pair<size_t, size_t>> shards;
};

class GlooCollectives final : public Collectives {
 public:
  GlooCollectives(const LaunchInfo& info, const CollectiveOptions& o)
      : rank_(info.rank),
        size_(info.world_size),
        opt_(o),
        bucket_floats_(o.bucket_bytes / sizeof(float)) {
    store_ = detail::connectStore(info, o.timeout, "gloo");
    detail::agreeOnValue(*store_, rank_, "bucket_bytes", std::to_string(o.bucket_bytes));
    try {
      auto pg_opts = c10d::ProcessGroupGloo::Options::create(o.timeout);
      pg_opts->devices.push_back(glooDevice(info, o));
      pg_opts->threads = 2;
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, rank_, size_, pg_opts);
    } catch (const std::exception& e) {
      STARLING_THROW(IoError, "gloo: connecting rank ", rank_, " of ", size_, " to its peers (via ",
                     info.master_addr, ":", info.master_port, ", timeout ", o.timeout.count(),
                     " ms) failed: ", describe(e));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "gloo"; }

  void allReduceSum(std::span<float> buf) override {
    guarded("allReduceSum", buf.size(), [&] {
      for (size_t off = 0; off < buf.size(); off += bucket_floats_) {
        std::vector<at::Tensor> t{
            view(buf.data() + off, std::min(bucket_floats_, buf.size() - off))};
        pg_->allreduce(t)->wait();
      }
    });
  }

  // Reduce-scatter per bucket, every peer at once: rank r sends slice j of bucket k to rank j and
  // receives slice r of bucket k from every peer, then adds what came from r+1, r+2, ... (mod W) in
  // that order onto its own. Per rank and
  // bucket it sends (W-1)/W of the bucket, as a ring would, in one round trip instead of W-1
  // dependent steps; kInFlight buckets are on the wire at once (bucket k+1 travels while bucket k
  // is summed), so the receive scratch is kInFlight * (W-1)/W of a bucket.
  void reduceScatterSum(std::span<float> buf) override {
    guarded("reduceScatterSum", buf.size(), [&] {
      const ShardBuckets sb(buf.size(), size_, bucket_floats_);
      const size_t longest = sb.shards[0].second - sb.shards[0].first;
      const size_t slot = std::min(sb.chunk, longest);  // floats per peer and bucket, at most
      const size_t peers = static_cast<size_t>(size_ - 1);
      scratch_.resize(kInFlight * peers * slot);
      const uint32_t base = takeTags(sb.count);
      std::deque<Bucket> flight;
      auto complete = [&] {
        Bucket& b = flight.front();
        waitAll(b);
        const auto [lo, hi] = sb.slice(b.k, rank_);
        float* dst = buf.data() + lo;
        for (size_t p = 0; p < peers; ++p) {
          const float* src = scratch_.data() + ((b.k % kInFlight) * peers + p) * slot;
          for (size_t i = 0, m = hi - lo; i < m; ++i) dst[i] += src[i];
        }
        flight.pop_front();
      };
      for (size_t k = 0; k < sb.count; ++k) {
        if (flight.size() == kInFlight) complete();
        Bucket b{k, {}};
        const auto [lo, hi] = sb.slice(k, rank_);
        for (size_t p = 0; p < peers; ++p) {
          const int j = wrap(rank_ + 1 + static_cast<int>(p));
          const int tag = tagAt(base, k);
          if (hi > lo)
            b.works.push_back(
                recv(scratch_.data() + ((k % kInFlight) * peers + p) * slot, hi - lo, j, tag));
          const auto [slo, shi] = sb.slice(k, j);
          if (shi > slo) b.works.push_back(send(buf.data() + slo, shi - slo, j, tag));
        }
        flight.push_back(std::move(b));
      }
      while (!flight.empty()) complete();
    });
  }

  // All-gather per bucket, every peer at once: rank r sends its slice of bucket k to every peer and
  // receives each peer's slice straight into place; kInFlight buckets on the wire at once.
  void allGather(std::span<float> buf) override {
    guarded("allGather", buf.size(), [&] {
      const ShardBuckets sb(buf.size(), size_, bucket_floats_);
      const uint32_t base = takeTags(sb.count);
      std::deque<Bucket> flight;
      for (size_t k = 0; k < sb.count; ++k) {
        if (flight.size() == kInFlight) {
          waitAll(flight.front());
          flight.pop_front();
        }
        Bucket b{k, {}};
        const auto [lo, hi] = sb.slice(k, rank_);
        for (int p = 1; p < size_; ++p) {
          const int j = wrap(rank_ + p);
          const int tag = tagAt(base, k);
          const auto [rlo, rhi] = sb.slice(k, j);
          if (rhi > rlo) b.works.push_back(recv(buf.data() + rlo, rhi - rlo, j, tag));
          if (hi > lo) b.works.push_back(send(buf.data() + lo, hi - lo, j, tag));
        }
        flight.push_back(std::move(b));
      }
      while (!flight.empty()) {
        waitAll(flight.front());
        flight.pop_front();
      }
    });
  }

  void barrier() override {
    guarded("barrier", 0, [&] { pg_->barrier()->wait(); });
  }

 private:
  int wrap(int r) const { return ((r % size_) + size_) % size_; }

  static constexpr size_t kInFlight = 2;  // buckets on the wire at once

  struct Bucket {
    size_t k;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
  };

  // A collective's tags: `n` consecutive ones (mod 2^31), the same on every rank because every
  // rank makes the same calls in the same order. A peer pair's messages of one bucket share a tag.
  uint32_t takeTags(size_t n) {
    const uint32_t base = tag_;
    tag_ = static_cast<uint32_t>((tag_ + n) & 0x7fffffffu);
    return base;
  }
  static int tagAt(uint32_t base, size_t k) { return static_cast<int>((base + k) & 0x7fffffffu); }

  c10::intrusive_ptr<c10d::Work> send(float* p, size_t n, int peer, int tag) {
    std::vector<at::Tensor> t{view(p, n)};
    return pg_->send(t, peer, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(float* p, size_t n, int peer, int tag) {
    std::vector<at::Tensor> t{view(p, n)};
    return pg_->recv(t, peer, tag);
  }
  void waitAll(Bucket& b) {
    for (auto& w : b.works)
      if (!w->wait(opt_.timeout))
        STARLING_THROW(IoError, "a send or receive of bucket ", b.k, " timed out");
  }

  template <class F>
  void guarded(const char* op, size_t n, F&& f) {
    if (broken_) {
      STARLING_THROW(IoError, "gloo ", op, " on rank ", rank_, " of ", size_,
                     ": the group failed earlier and cannot be used (destroy it)");
    }
    try {
      f();
    } catch (const std::exception& e) {
      broken_ = true;
      STARLING_THROW(IoError, "gloo ", op, " of ", n, " floats on rank ", rank_, " of ", size_,
                     " failed (a peer died, disconnected or stayed silent past the timeout of ",
                     opt_.timeout.count(), " ms): ", describe(e));
    }
  }

  int rank_, size_;
  CollectiveOptions opt_;
  size_t bucket_floats_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::vector<float> scratch_;
  uint32_t tag_ = 0;
  bool broken_ = false;
};

}  // namespace

std::unique_ptr<Collectives> makeGloo(const LaunchInfo& info, const CollectiveOptions& options) {
  options.validate();
  if (info.world_size == 1) return makeLocal();
  return std::make_unique<GlooCollectives>(info, options);
}

}  // namespace starling::simulator
