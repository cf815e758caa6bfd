#pragma once
// Internal to transport/: reassembly of chunked transfers, one per peer at a time.
//
// Rules (each violation drops the peer's transfer, frees it, and returns an error; later chunks
// of that transfer id are then ignored without another error):
// - index 0 starts a transfer; it abandons (error) any transfer the peer had in progress;
// - total_bytes <= max_message (kTooLarge); the peer's reservation of total_bytes must fit in
//   max_total together with every other peer's, counted as chunks arrive (an announced total
//   costs nothing until its bytes do); over it, the transfer is refused with kBusy (send again
//   later: nothing was wrong with it);
// - chunk 0's data size S is the sender's chunk size: count must equal ceil(total / S), every
//   chunk but the last carries exactly S bytes, and the last completes exactly total_bytes;
// - later chunks: same transfer id, index == the next expected, same count and total (kBadChunk).
// expire() drops transfers idle longer than the timeout and forgets idle peers, so the peer map
// stays bounded by the peers that sent a chunk recently.
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/input_error.h"
#include "protocol/control.h"
#include "transport/buffer_pool.h"

namespace starling::transport::detail {

using Steady = std::chrono::steady_clock;  // not the injectable starling::Clock

class Reassembler {
 public:
  // Buffers come from, and go back to, a pool that keeps up to a quarter of `max_total`.
  Reassembler(uint64_t max_message, uint64_t max_total, Steady::duration timeout)
      : max_message_(max_message),
        max_total_(max_total),
        timeout_(timeout),
        pool_(std::make_shared<BufferPool>(max_total / 4)) {}

  struct Outcome {
    std::optional<InputError> abandoned;  // a transfer in progress that this chunk's start ended
    std::optional<InputError> error;      // this chunk was refused
    std::shared_ptr<uint8_t[]> complete;  // the whole message, when this chunk finished it
    uint64_t size = 0;
    bool ignored = false;  // a later chunk of a refused transfer
  };
  Outcome add(const std::string& peer, const protocol::ChunkMsg& chunk, Steady::time_point now);
  // Drops `peer`'s transfer in progress, if any (an undecodable chunk broke it); its later chunks
  // are then ignored. True when there was one.
  bool abort(const std::string& peer);
  // Errors for transfers idle past the timeout (dropped), as (peer, error) pairs.
  std::vector<std::pair<std::string, InputError>> expire(Steady::time_point now);

  uint64_t reservedBytes() const { return reserved_; }
  const BufferPool& pool() const { return *pool_; }
  size_t peers() const { return peers_.size(); }

 private:
  struct Transfer {
    uint64_t id = 0, total = 0, chunk = 0, filled = 0;
    uint32_t count = 0, next = 0;
    Buffer buf;
  };
  struct Peer {
    std::optional<Transfer> t;
    std::deque<uint64_t> refused;  // recently refused transfer ids (at most kRefusedKept)
    Steady::time_point last;
  };
  Outcome start(Peer& p, const protocol::ChunkMsg& c);
  // Drops p's transfer (if any), remembers `id` as refused, returns the error.
  InputError refuse(Peer& p, uint64_t id, Errc code, const std::string& msg);
  void drop(Peer& p);

  uint64_t max_message_, max_total_;
  Steady::duration timeout_;
  uint64_t reserved_ = 0;
  std::unordered_map<std::string, Peer> peers_;
  std::shared_ptr<BufferPool> pool_;
};

}  // namespace starling::transport::detail
