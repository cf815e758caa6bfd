#include "transport/reassembly.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace starling::transport::detail {

namespace {
constexpr size_t kRefusedKept = 4;
std::string str(uint64_t v) { return std::to_string(v); }
}  // namespace

void Reassembler::drop(Peer& p) {
  if (!p.t) return;
  reserved_ -= p.t->filled;
  pool_->give(std::move(p.t->buf));
  p.t.reset();
}

InputError Reassembler::refuse(Peer& p, uint64_t id, Errc code, const std::string& msg) {
  drop(p);
  if (std::find(p.refused.begin(), p.refused.end(), id) == p.refused.end()) {
    p.refused.push_back(id);
    if (p.refused.size() > kRefusedKept) p.refused.pop_front();
  }
  return InputError(code, msg);
}

Reassembler::Outcome Reassembler::start(Peer& p, const protocol::ChunkMsg& c) {
  Outcome out;
  const uint64_t s = c.data.size();  // decodeChunk guarantees 0 < s, index < count, total > 0
  const std::string tid = "transfer " + str(c.transfer) + ": ";
  if (c.total_bytes > max_message_) {
    out.error =
        refuse(p, c.transfer, Errc::kTooLarge,
               tid + str(c.total_bytes) + " bytes announced, the limit is " + str(max_message_));
    return out;
  }
  const uint64_t want_count = (c.total_bytes + s - 1) / s;
  if (want_count != c.count || s > c.total_bytes) {
    out.error = refuse(p, c.transfer, Errc::kBadChunk,
                       tid + str(c.count) + " chunks announced, " + str(c.total_bytes) +
                           " bytes in chunks of " + str(s) + " need " + str(want_count));
    return out;
  }
  // The budget counts bytes that arrived, not bytes announced: a transfer that announces a
  // gigabyte and sends one byte holds one byte of it (the buffer below is only address space until
  // chunks land in it), so idle announcements cannot lock honest uploads out.
  Transfer t{c.transfer, c.total_bytes, s, 0, c.count, 0, {}};
  try {
    t.buf = pool_->take(c.total_bytes);  // a new buffer's pages commit as chunks land
  } catch (const std::bad_alloc&) {
    out.error = refuse(p, c.transfer, Errc::kTooLarge,
                       tid + "cannot allocate " + str(c.total_bytes) + " bytes");
    return out;
  }
  p.t = std::move(t);
  return out;
}

Reassembler::Outcome Reassembler::add(const std::string& peer, const protocol::ChunkMsg& c,
                                      Steady::time_point now) {
  Peer& p = peers_[peer];
  p.last = now;
  Outcome out;
  if (c.index == 0) {
    if (p.t)
      out.abandoned =
          refuse(p, p.t->id, Errc::kBadChunk,
                 "transfer " + str(p.t->id) + " abandoned after " + str(p.t->next) + " of " +
                     str(p.t->count) + " chunks: transfer " + str(c.transfer) + " started");
    std::erase(p.refused, c.transfer);  // a restarted sender may reuse an id
    Outcome s = start(p, c);
    out.error = std::move(s.error);
    if (out.error) return out;
  } else if (!p.t || p.t->id != c.transfer) {
    if (std::find(p.refused.begin(), p.refused.end(), c.transfer) != p.refused.end()) {
      out.ignored = true;
      return out;
    }
    const std::string msg =
        p.t ? "chunk " + str(c.index) + " of transfer " + str(c.transfer) + " while transfer " +
                  str(p.t->id) + " is in progress"
            : "chunk " + str(c.index) + " of transfer " + str(c.transfer) + " without its start";
    if (p.t) refuse(p, p.t->id, Errc::kBadChunk, msg);
    out.error = refuse(p, c.transfer, Errc::kBadChunk, msg);
    return out;
  }
  Transfer& t = *p.t;
  const uint64_t expect_size = c.index + 1 < t.count ? t.chunk : t.total - t.chunk * (t.count - 1);
  std::string bad;
  if (c.index != t.next)
    bad = "chunk " + str(c.index) + " where " + str(t.next) + " was expected";
  else if (c.count != t.count || c.total_bytes != t.total)
    bad = "chunk " + str(c.index) + " announces " + str(c.count) + " chunks / " +
          str(c.total_bytes) + " bytes, the transfer " + str(t.count) + " / " + str(t.total);
  else if (c.data.size() != expect_size)
    bad = "chunk " + str(c.index) + " of " + str(c.count) + " carries " + str(c.data.size()) +
          " bytes, expected " + str(expect_size);
  if (!bad.empty()) {
    out.error = refuse(p, c.transfer, Errc::kBadChunk, "transfer " + str(c.transfer) + ": " + bad);
    return out;
  }
  if (c.data.size() > max_total_ - reserved_) {
    out.error = refuse(p, c.transfer, Errc::kBusy,
                       "transfer " + str(c.transfer) + ": chunk " + str(c.index) +
                           " does not fit in the reassembly budget (" +
                           str(max_total_ - reserved_) + " of " + str(max_total_) + " bytes free)");
    return out;
  }
  std::memcpy(t.buf.data.get() + t.chunk * c.index, c.data.data(), c.data.size());
  t.filled += c.data.size();
  reserved_ += c.data.size();
  if (++t.next == t.count) {
    out.size = t.total;
    out.complete = pool_->share(std::move(t.buf));
    drop(p);
  }
  return out;
}

bool Reassembler::abort(const std::string& peer) {
  const auto it = peers_.find(peer);
  if (it == peers_.end() || !it->second.t) return false;
  refuse(it->second, it->second.t->id, Errc::kBadChunk, "");
  return true;
}

std::vector<std::pair<std::string, InputError>> Reassembler::expire(Steady::time_point now) {
  std::vector<std::pair<std::string, InputError>> errors;
  for (auto it = peers_.begin(); it != peers_.end();) {
    Peer& p = it->second;
    if (now - p.last < timeout_) {
      ++it;
      continue;
    }
    if (p.t) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count();
      errors.emplace_back(
          it->first, InputError(Errc::kBadChunk, "transfer " + str(p.t->id) + " timed out after " +
                                                     str(p.t->next) + " of " + str(p.t->count) +
                                                     " chunks (no chunk for " + str(ms) + " ms)"));
      drop(p);
    }
    it = peers_.erase(it);
  }
  return errors;
}

}  // namespace starling::transport::detail
