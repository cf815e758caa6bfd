#pragma once
// Internal to transport/: buffers of reassembled messages, reused. A fresh multi-megabyte buffer
// costs a page fault per 4 KiB page on first touch (a fifth of the server's time at high ingest,
// docs/performance.md); a buffer that held an earlier message costs none. A message handed out
// (Received) returns its buffer here when its last copy goes, from whatever thread; the pool keeps
// at most `max_pooled` bytes and outlives none of its users' needs (a buffer returned after the
// pool is gone is simply freed).
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace starling::transport::detail {

struct Buffer {
  std::unique_ptr<uint8_t[]> data;
  uint64_t capacity = 0;
};

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  explicit BufferPool(uint64_t max_pooled) : max_pooled_(max_pooled) {}

  // A buffer of at least `size` bytes: a pooled one no more than twice that size, or a new one.
  // Throws std::bad_alloc.
  Buffer take(uint64_t size);
  // Keeps `b` for reuse (or frees it when the pool is full).
  void give(Buffer b);
  // Shares `b` read-only; when the last copy goes, the buffer returns to this pool.
  std::shared_ptr<uint8_t[]> share(Buffer b);

  uint64_t pooledBytes() const;
  uint64_t reused() const;

 private:
  uint64_t max_pooled_;
  mutable std::mutex mu_;
  std::vector<Buffer> free_;
  uint64_t pooled_ = 0, reused_ = 0;
};

}  // namespace starling::transport::detail
