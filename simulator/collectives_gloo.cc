// makeGloo (simulator/collectives.h): c10d's ProcessGroupGloo over the c10d TCPStore of
// simulator/collectives_store.h. Needs the compile definition USE_C10D_GLOO (simulator/CMakeLists.txt).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <functional>

#include "core/error.h"
#include "simulator/collectives.h"
#include "simulator/collectives_store.h"

namespace starling::simulator {

namespace {

using detail::describe;

bool isLoopback(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "localhost" || addr == "::1";
}

std::shared_ptr<::gloo::transport::Device> glooDevice(const LaunchInfo& info, const CollectiveOptions& o) {
  std::string iface = o.gloo_interface;
  if (iface.empty()) {
    if (const char* env = std::getenv("GLOO_SOCKET_IFNAME"); env && *env) iface = env;
  }
  if (!iface.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(iface);
  if (isLoopback(info.master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

at::Tensor view(float* p, size_t n) {
  return torch::from_blob(p, {static_cast<int64_t>(n)}, torch::kFloat32);
}

// Per-bucket slices of every rank's shard (collectives.h, "Buckets"): bucket k holds, for each
// rank j, [shard_j.begin + k c, min(shard_j.end, shard_j.begin + (k + 1) c)).
struct ShardBuckets {
  ShardBuckets(size_t n, int w, size_t bucket_floats) : size(w), chunk(std::max<size_t>(1, bucket_floats / w)) {
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
      : rank_(info.rank), size_(info.world_size), opt_(o), bucket_floats_(o.bucket_bytes / sizeof(float)) {
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
        std::vector<at::Tensor> t{view(buf.data() + off, std::min(bucket_floats_, buf.size() - off))};
        pg_->allreduce(t)->wait();
      }
    });
  }

  // Ring reduce-scatter per bucket: at step s rank r sends its partial sum of slice r - s - 1 to
  // r + 1 and adds what r - 1 sends of slice r - s - 2; after W - 1 steps slice r holds all W
  // contributions. Each rank sends (W - 1) slices of a bucket, i.e. (W - 1)/W of the buffer.
  void reduceScatterSum(std::span<float> buf) override {
    guarded("reduceScatterSum", buf.size(), [&] {
      const ShardBuckets sb(buf.size(), size_, bucket_floats_);
      scratch_.resize(std::min(sb.chunk, sb.shards[0].second - sb.shards[0].first));
      for (size_t k = 0; k < sb.count; ++k) {
        for (int s = 0; s + 1 < size_; ++s) {
          const auto [sb0, se0] = sb.slice(k, wrap(rank_ - s - 1));
          const auto [rb0, re0] = sb.slice(k, wrap(rank_ - s - 2));
          exchange(buf.data() + sb0, se0 - sb0, scratch_.data(), re0 - rb0);
          float* dst = buf.data() + rb0;
          const float* src = scratch_.data();
          for (size_t i = 0, m = re0 - rb0; i < m; ++i) dst[i] += src[i];
        }
      }
    });
  }

  // Ring all-gather per bucket: at step s rank r forwards slice r - s to r + 1 and receives slice
  // r - s - 1 from r - 1 straight into place.
  void allGather(std::span<float> buf) override {
    guarded("allGather", buf.size(), [&] {
      const ShardBuckets sb(buf.size(), size_, bucket_floats_);
      for (size_t k = 0; k < sb.count; ++k) {
        for (int s = 0; s + 1 < size_; ++s) {
          const auto [sb0, se0] = sb.slice(k, wrap(rank_ - s));
          const auto [rb0, re0] = sb.slice(k, wrap(rank_ - s - 1));
          exchange(buf.data() + sb0, se0 - sb0, buf.data() + rb0, re0 - rb0);
        }
      }
    });
  }

  void barrier() override {
    guarded("barrier", 0, [&] { pg_->barrier()->wait(); });
  }

 private:
  int wrap(int r) const { return ((r % size_) + size_) % size_; }

  // Sends `send_n` floats at `send` to rank + 1 and receives `recv_n` floats from rank - 1 into
  // `recv`, both posted before waiting on either. The tag advances on
  // every rank in step, also when both counts are zero (then nothing is posted: the peers compute
  // the same counts, so they skip the same messages).
  void exchange(float* send, size_t send_n, float* recv, size_t recv_n) {
    const int tag = static_cast<int>(tag_);
    tag_ = (tag_ + 1) & 0x7fffffffu;
    c10::intrusive_ptr<c10d::Work> ws, wr;
    std::vector<at::Tensor> st, rt;
    if (recv_n > 0) {
      rt.push_back(view(recv, recv_n));
      wr = pg_->recv(rt, wrap(rank_ - 1), tag);
    }
    if (send_n > 0) {
      st.push_back(view(send, send_n));
      ws = pg_->send(st, wrap(rank_ + 1), tag);
    }
    if (wr && !wr->wait(opt_.timeout)) STARLING_THROW(IoError, "receive from rank ", wrap(rank_ - 1), " timed out");
    if (ws && !ws->wait(opt_.timeout)) STARLING_THROW(IoError, "send to rank ", wrap(rank_ + 1), " timed out");
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
