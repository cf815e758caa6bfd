#pragma once
// What the reassembly fuzzer (fuzz_reassembly.cc) checks, shared with the corpus replay in the
// normal suite (corpus_control_test.cc), and the op sequences of its seed corpus
// (tests/fuzz/corpus_reassembly, written by make_control_seeds.cc).
//
// The input is read as a reassembly budget and a sequence of operations by four peers on one
// transport::detail::Reassembler: an honest sender's chunks (a message cut in chunks of a size
// the input picks), chunks with fields the input picks, raw bytes decoded by decodeChunk (the
// transport drops the peer's transfer when they do not decode), a repeated chunk, an abort, and
// time passing (expire). Every chunk goes through encodeChunk/decodeChunk first, as the transport
// hands the reassembler only decoded chunks. A shadow model keeps, per peer, the data of the
// chunks accepted for its transfer in progress; after every operation:
// - reservedBytes() <= max_total, and equals the bytes the shadow holds (the budget counts
//   exactly the bytes that arrived for transfers in progress);
// - a completed message has the size it announced and equals the concatenation of the chunk data
//   that built it; a refused chunk ends the peer's transfer; an abandoned transfer is reported
//   only when one was in progress; a later chunk of a refused transfer is ignored without error;
// - abort() and expire() report exactly the transfers in progress they drop (expire: those idle
//   for the timeout);
// - the peer map holds at most the four peers.
// Anything else (an exception, a sanitizer report, a broken property) aborts.
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "protocol/control.h"
#include "transport/reassembly.h"

namespace starling::fuzz::reassembly {

namespace pr = starling::protocol;
using transport::detail::Reassembler;
using transport::detail::Steady;

[[noreturn]] inline void bug(const std::string& what) {
  std::fprintf(stderr, "reassembly fuzz harness: %s\n", what.c_str());
  std::abort();
}
inline void require(bool ok, const char* what) {
  if (!ok) bug(what);
}

inline constexpr uint64_t kMaxMessage[] = {64, 1000, 4096, 65536};
inline constexpr uint64_t kMaxTotal[] = {64, 1000, 5000, 1u << 17};
inline constexpr auto kTimeout = std::chrono::milliseconds(100);
inline constexpr size_t kPeers = 4;

enum Op : uint8_t {
  kPlan = 0,
  kNext = 1,
  kRaw = 2,
  kEncoded = 3,
  kTick = 4,
  kAbort = 5,
  kRepeat = 6,
  kOps = 7
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  bool empty() const { return pos_ >= in_.size(); }
  uint8_t u8() { return pos_ < in_.size() ? in_[pos_++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  // n bytes, the input's as far as it goes, then a pattern.
  std::vector<uint8_t> bytes(size_t n) {
    std::vector<uint8_t> out(n);
    const size_t have = std::min(n, in_.size() - std::min(pos_, in_.size()));
    if (have) std::memcpy(out.data(), in_.data() + pos_, have);
    pos_ += have;
    for (size_t i = have; i < n; ++i) out[i] = static_cast<uint8_t>(i * 131 + 7);
    return out;
  }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

struct Stats {
  size_t ops = 0, accepted = 0, refused = 0, ignored = 0, completed = 0, expired = 0;
};

class Run {
 public:
  Run(uint64_t max_message, uint64_t max_total)
      : max_message_(max_message), max_total_(max_total), re_(max_message, max_total, kTimeout) {
    for (size_t i = 0; i < kPeers; ++i) names_[i] = "peer-" + std::to_string(i);
  }

  Stats run(Reader& r) {
    while (!r.empty()) {
      const uint8_t op = r.u8();
      const size_t peer = op & 3;
      switch ((op >> 2) % kOps) {
        case kPlan: {
          Plan p;
          p.transfer = r.u8();
          p.data = r.bytes(1 + r.u16() % (max_message_ + 8));
          p.chunk = 1 + r.u16() % p.data.size();
          p.count = static_cast<uint32_t>((p.data.size() + p.chunk - 1) / p.chunk);
          plans_[peer] = std::move(p);
          break;
        }
        case kNext:
        case kRepeat: {
          if (!plans_[peer]) break;
          Plan& p = *plans_[peer];
          if ((op >> 2) % kOps == kRepeat) {
            if (p.next == 0) break;
            --p.next;
          }
          if (p.next >= p.count) break;
          const size_t at = p.chunk * p.next, len = std::min<size_t>(p.chunk, p.data.size() - at);
          deliver(peer,
                  pr::encodeChunk(pr::ChunkMsg{
                      p.transfer, p.next, p.count, p.data.size(), {p.data.data() + at, len}}));
          ++p.next;
          break;
        }
        case kRaw: {
          const uint64_t transfer = r.u8();
          const uint32_t index = r.u8(), count = r.u8();
          const uint64_t total = r.u16();
          const auto data = r.bytes(1 + r.u8());
          deliver(peer, pr::encodeChunk(pr::ChunkMsg{transfer, index, count, total, data}));
          break;
        }
        case kEncoded: {
          const auto raw = r.bytes(r.u16() % 512);
          std::vector<uint64_t> aligned(raw.size() / 8 + 1);
          if (!raw.empty()) std::memcpy(aligned.data(), raw.data(), raw.size());
          deliver(peer, {reinterpret_cast<const uint8_t*>(aligned.data()), raw.size()});
          break;
        }
        case kTick: {
          now_ += std::chrono::milliseconds(r.u8());
          auto errors = re_.expire(now_);
          for (auto& [name, err] : errors) {
            const size_t i = index(name);
            require(shadow_[i].has_value(),
                    "expire reported a peer without a transfer in progress");
            require(now_ - last_[i] >= kTimeout, "expire dropped a transfer before its timeout");
            shadow_[i].reset();
            ++stats_.expired;
          }
          for (size_t i = 0; i < kPeers; ++i)
            require(!shadow_[i] || now_ - last_[i] < kTimeout,
                    "expire kept a transfer idle past its timeout");
          break;
        }
        case kAbort: {
          const bool had = re_.abort(names_[peer]);
          require(had == shadow_[peer].has_value(), "abort() disagrees on a transfer in progress");
          shadow_[peer].reset();
          break;
        }
        default:
          break;
      }
      ++stats_.ops;
      invariants();
    }
    return stats_;
  }

 private:
  struct Plan {
    uint64_t transfer = 0;
    std::vector<uint8_t> data;
    size_t chunk = 1;
    uint32_t count = 0, next = 0;
  };
  struct Shadow {
    uint64_t transfer = 0, total = 0;
    std::vector<uint8_t> data;
  };

  size_t index(const std::string& name) const {
    for (size_t i = 0; i < kPeers; ++i)
      if (names_[i] == name) return i;
    bug("an unknown peer " + name);
  }

  // As the transport: decode, on failure drop the peer's transfer, else hand it to the reassembler.
  void deliver(size_t peer, std::span<const uint8_t> bytes) {
    pr::ChunkMsg c;
    try {
      c = pr::decodeChunk(bytes, max_message_);
    } catch (const InputError&) {
      const bool had = re_.abort(names_[peer]);
      require(had == shadow_[peer].has_value(), "abort() disagrees on a transfer in progress");
      shadow_[peer].reset();
      return;
    }
    const bool had = shadow_[peer].has_value();
    const auto out = re_.add(names_[peer], c, now_);
    last_[peer] = now_;
    require(!out.abandoned || (had && c.index == 0),
            "an abandoned transfer without one in progress");
    if (had && c.index == 0)
      require(out.abandoned.has_value(), "a new transfer did not report the one it abandoned");
    if (out.ignored) {
      require(!out.error && !out.complete && c.index != 0,
              "an ignored chunk with an outcome, or a start ignored");
      ++stats_.ignored;
      return;
    }
    if (out.error) {
      require(!out.complete, "a refused chunk completed a message");
      shadow_[peer].reset();
      ++stats_.refused;
      return;
    }
    ++stats_.accepted;
    if (c.index == 0) {
      shadow_[peer] = Shadow{c.transfer, c.total_bytes, {}};
    } else {
      require(had && shadow_[peer]->transfer == c.transfer && shadow_[peer]->total == c.total_bytes,
              "a later chunk accepted for another transfer");
    }
    Shadow& s = *shadow_[peer];
    s.data.insert(s.data.end(), c.data.begin(), c.data.end());
    require(s.data.size() <= s.total && s.total <= max_message_,
            "a transfer holds more than it announced or allowed");
    if (out.complete) {
      require(out.size == s.total && s.data.size() == s.total,
              "a completed message of another size than announced");
      require(std::memcmp(out.complete.get(), s.data.data(), s.total) == 0,
              "a completed message differs from the chunk data that built it");
      shadow_[peer].reset();
      ++stats_.completed;
    } else {
      require(s.data.size() < s.total, "a transfer with every byte did not complete");
    }
  }

  void invariants() const {
    uint64_t held = 0;
    for (const auto& s : shadow_)
      if (s) held += s->data.size();
    require(re_.reservedBytes() <= max_total_, "the reassembly budget was exceeded");
    require(re_.reservedBytes() == held,
            "reservedBytes() differs from the bytes of the transfers in progress");
    require(re_.peers() <= kPeers, "more peers than ever sent");
  }

  uint64_t max_message_, max_total_;
  Reassembler re_;
  Steady::time_point now_{};
  std::array<std::string, kPeers> names_;
  std::array<std::optional<Plan>, kPeers> plans_;
  std::array<std::optional<Shadow>, kPeers> shadow_;
  std::array<Steady::time_point, kPeers> last_{};
  Stats stats_;
};

inline Stats checkReassembly(std::span<const uint8_t> in) {
  Reader r(in);
  const uint8_t config = r.u8();
  Run run(kMaxMessage[config & 3], kMaxTotal[(config >> 2) & 3]);
  return run.run(r);
}

// ---------------------------------------------------------------- seeds

// Writes the op sequences checkReassembly reads.
class Writer {
 public:
  explicit Writer(uint8_t max_message_index, uint8_t max_total_index) {
    out_.push_back(static_cast<uint8_t>(max_message_index | (max_total_index << 2)));
  }
  Writer& plan(size_t peer, uint8_t transfer, uint16_t size_minus_1, uint16_t chunk_minus_1) {
    op(kPlan, peer);
    out_.push_back(transfer);
    u16(size_minus_1);
    for (size_t i = 0; i <= size_minus_1; ++i) out_.push_back(static_cast<uint8_t>(i * 7 + peer));
    u16(chunk_minus_1);
    return *this;
  }
  Writer& next(size_t peer, size_t times = 1) {
    for (size_t i = 0; i < times; ++i) op(kNext, peer);
    return *this;
  }
  Writer& repeat(size_t peer) { return op(kRepeat, peer); }
  Writer& raw(size_t peer, uint8_t transfer, uint8_t index, uint8_t count, uint16_t total,
              uint8_t len_minus_1) {
    op(kRaw, peer);
    for (uint8_t b : {transfer, index, count}) out_.push_back(b);
    u16(total);
    out_.push_back(len_minus_1);
    for (size_t i = 0; i <= len_minus_1; ++i) out_.push_back(static_cast<uint8_t>(i + 1));
    return *this;
  }
  Writer& encoded(size_t peer, std::span<const uint8_t> bytes) {
    op(kEncoded, peer);
    u16(static_cast<uint16_t>(bytes.size()));
    out_.insert(out_.end(), bytes.begin(), bytes.end());
    return *this;
  }
  Writer& tick(uint8_t ms) {
    op(kTick, 0);
    out_.push_back(ms);
    return *this;
  }
  Writer& abort(size_t peer) { return op(kAbort, peer); }
  std::vector<uint8_t> bytes() const { return out_; }

 private:
  Writer& op(Op o, size_t peer) {
    out_.push_back(static_cast<uint8_t>((o << 2) | peer));
    return *this;
  }
  void u16(uint16_t v) {
    out_.push_back(static_cast<uint8_t>(v));
    out_.push_back(static_cast<uint8_t>(v >> 8));
  }
  std::vector<uint8_t> out_;
};

struct Seed {
  std::string name;
  std::vector<uint8_t> bytes;
};

inline std::vector<Seed> reassemblySeeds() {
  std::vector<Seed> out;
  // Two peers' messages interleaved to completion (4 and 3 chunks), then one in a single chunk.
  out.push_back({"interleaved", Writer(2, 3)
                                    .plan(0, 1, 999, 299)
                                    .plan(1, 2, 699, 255)
                                    .next(0)
                                    .next(1)
                                    .next(0)
                                    .next(1, 2)
                                    .next(0, 2)
                                    .plan(2, 3, 63, 63)
                                    .next(2)
                                    .bytes()});
  // Two transfers of 900 bytes against a budget of 1000: the second runs out of budget.
  out.push_back({"budget", Writer(2, 1)
                               .plan(0, 1, 899, 299)
                               .plan(1, 2, 899, 299)
                               .next(0)
                               .next(1)
                               .next(0)
                               .next(1)
                               .next(0)
                               .next(1)
                               .bytes()});
  // A transfer idle past the timeout is dropped; its next chunk is refused, the one after ignored.
  out.push_back(
      {"expire", Writer(2, 3).plan(0, 9, 499, 99).next(0, 2).tick(60).tick(60).next(0, 2).bytes()});
  // A repeated chunk, a restart of the same transfer, an abort, a chunk too large.
  out.push_back({"repeat-restart-abort", Writer(1, 2)
                                             .plan(0, 4, 299, 99)
                                             .next(0)
                                             .repeat(0)
                                             .plan(0, 4, 299, 99)
                                             .next(0, 2)
                                             .abort(0)
                                             .next(0)
                                             .plan(1, 5, 1005, 99)
                                             .next(1)
                                             .bytes()});
  // Chunks with chosen fields, and a chunk message given as bytes.
  const std::vector<uint8_t> data(40, 0x5a);
  const auto chunk = pr::encodeChunk(pr::ChunkMsg{7, 0, 1, 40, data});
  out.push_back({"raw-encoded", Writer(2, 2)
                                    .raw(0, 3, 0, 2, 100, 49)
                                    .raw(0, 3, 1, 2, 100, 49)
                                    .raw(1, 3, 1, 2, 100, 49)
                                    .encoded(2, chunk)
                                    .encoded(3, std::span(chunk).first(chunk.size() - 1))
                                    .bytes()});
  return out;
}

}  // namespace starling::fuzz::reassembly
