#include "transport/buffer_pool.h"

#include <algorithm>

namespace starling::transport::detail {

Buffer BufferPool::take(uint64_t size) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The smallest pooled buffer that fits and wastes at most half of itself.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->capacity >= size && it->capacity <= 2 * size &&
          (best == free_.end() || it->capacity < best->capacity))
        best = it;
    if (best != free_.end()) {
      Buffer b = std::move(*best);
      free_.erase(best);
      pooled_ -= b.capacity;
      ++reused_;
      return b;
    }
  }
  return Buffer{std::make_unique_for_overwrite<uint8_t[]>(size), size};
}

void BufferPool::give(Buffer b) {
  if (!b.data) return;
  std::lock_guard<std::mutex> lock(mu_);
  // Full: drop the smallest buffers first (large ones save the most page faults).
  while (pooled_ + b.capacity > max_pooled_ && !free_.empty()) {
    auto smallest =
        std::min_element(free_.begin(), free_.end(),
                         [](const Buffer& x, const Buffer& y) { return x.capacity < y.capacity; });
    if (smallest->capacity > b.capacity) return;  // b is the smallest: free it instead
    pooled_ -= smallest->capacity;
    free_.erase(smallest);
  }
  if (pooled_ + b.capacity > max_pooled_) return;
  pooled_ += b.capacity;
  free_.push_back(std::move(b));
}

std::shared_ptr<uint8_t[]> BufferPool::share(Buffer b) {
  const uint64_t capacity = b.capacity;
  uint8_t* raw = b.data.release();
  std::weak_ptr<BufferPool> pool = weak_from_this();
  return std::shared_ptr<uint8_t[]>(raw, [pool, capacity](uint8_t* p) {
    Buffer back{std::unique_ptr<uint8_t[]>(p), capacity};
    if (auto live = pool.lock()) live->give(std::move(back));
  });
}

uint64_t BufferPool::pooledBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pooled_;
}

uint64_t BufferPool::reused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reused_;
}

}  // namespace starling::transport::detail
