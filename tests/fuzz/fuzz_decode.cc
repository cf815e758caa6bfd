// libFuzzer target for everything a server does with untrusted bytes: decode (Update or
// PartialAggregate), validate against a round of every scheme, aggregate, finish (fuzz_harness.h).
// Aborts if an accepted input makes an aggregate non-finite.
//
// A structure-aware custom mutator keeps the fuzzer inside well-formed messages half of the time:
// it decodes the input, changes one field the way an attacker would (extreme floats, lying
// counts and weights, another encoding in a tensor, shifted indices, odd metrics) and re-encodes;
// an input it cannot decode is replaced by a seed of a random encoding. So it reaches every
// encoding even from an empty corpus. Build and run: make fuzz (clang, ASan + UBSan, with
// -rss_limit_mb and -malloc_limit_mb: decoding must cost memory linear in the message).
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/overloaded.h"
#include "core/rng.h"
#include "fuzz/fuzz_harness.h"

using namespace starling;
namespace cz = starling::compression;

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

fuzz::Harness& harness() {
  static fuzz::Harness h;
  return h;
}

const std::vector<std::vector<uint8_t>>& seeds() {
  static const auto s = [] {
    auto v = fuzz::schemeSeeds(harness());
    for (const auto& u : fuzz::seedUpdates()) v.push_back(protocol::encodeUpdate(u));
    return v;
  }();
  return s;
}

constexpr float kFloats[] = {INFINITY,  -INFINITY, NAN,   FLT_MAX, -FLT_MAX, 3e38f,
                             1e20f,     1e-45f,    0.0f,  -0.0f,   65504.0f, 1e4f,
                             1.0001e4f, 3000.0f,   30.0f, 1.0f};
constexpr uint64_t kCounts[] = {0,          1,          2,          59,    61,       96,
                                10'000'000, 10'000'001, 1ull << 32, ~0ull, ~0ull - 1};

float pickFloat(RngStream& r) { return kFloats[r.below(std::size(kFloats))]; }
uint64_t pickCount(RngStream& r) { return kCounts[r.below(std::size(kCounts))]; }

template <class T>
void poke(std::vector<T>& v, RngStream& r, T x) {
  if (!v.empty()) v[r.below(v.size())] = x;
}

void mutateFloats(cz::Payload& p, RngStream& r) {
  std::visit(
      Overloaded{
          [&](cz::DenseF32& d) { poke(d.values, r, pickFloat(r)); },
          [&](cz::DenseF16& d) { poke<uint16_t>(d.values, r, static_cast<uint16_t>(r.next())); },
          [&](cz::DenseBF16& d) { poke<uint16_t>(d.values, r, static_cast<uint16_t>(r.next())); },
          [&](cz::Sparse& s) {
            if (r.below(2))
              poke(s.values, r, pickFloat(r));
            else
              poke<uint32_t>(s.indices, r, static_cast<uint32_t>(r.below(200)));
          },
          [&](cz::RandBlock& b) {
            if (r.below(2))
              poke(b.values, r, pickFloat(r));
            else
              b.offset = static_cast<uint32_t>(r.below(200));
          },
          [&](cz::LowRank& l) {
            switch (r.below(4)) {
              case 0:
                poke(l.p, r, pickFloat(r));
                break;
              case 1:
                for (auto& x : l.q) x = pickFloat(r);
                break;
              case 2:
                l.rank = static_cast<uint32_t>(r.below(16));
                break;
              default:
                (r.below(2) ? l.p : l.q).clear();
                break;
            }
          },
          [&](cz::Sign& s) {
            if (r.below(2))
              s.scale = pickFloat(r);
            else
              poke<uint8_t>(s.bits, r, static_cast<uint8_t>(r.next()));
          },
          [&](cz::Qsgd& q) {
            switch (r.below(3)) {
              case 0:
                q.norm = pickFloat(r);
                break;
              case 1:
                q.s = static_cast<uint32_t>(pickCount(r));
                break;
              default:
                poke<uint8_t>(q.packed, r, static_cast<uint8_t>(r.next()));
                break;
            }
          },
          [&](cz::Ternary& x) {
            switch (r.below(5)) {
              case 0:
                x.mu = pickFloat(r);
                break;
              case 1:
                x.count = static_cast<uint32_t>(pickCount(r));
                break;
              case 2:
                x.rice = static_cast<uint32_t>(r.below(40));
                break;
              case 3:
                poke<uint8_t>(x.signs, r, static_cast<uint8_t>(r.next()));
                break;
              default:
                poke<uint8_t>(x.positions, r, static_cast<uint8_t>(r.next()));
                break;
            }
          },
          [&](cz::BlockQ& q) {
            switch (r.below(4)) {
              case 0:
                q.bits = static_cast<uint8_t>(r.below(12));
                break;
              case 1:
                q.block = static_cast<uint32_t>(pickCount(r));
                break;
              case 2:
                poke<int8_t>(q.exps, r, static_cast<int8_t>(r.next()));
                break;
              default:
                poke<uint8_t>(q.packed, r, static_cast<uint8_t>(r.next()));
                break;
            }
          },
      },
      p);
}

void mutateVectorLength(cz::Payload& p, RngStream& r) {
  auto resize = [&](auto& v) { v.resize(r.below(2) ? v.size() + 1 + r.below(8) : v.size() / 2); };
  std::visit(
      Overloaded{[&](cz::DenseF32& d) { resize(d.values); },
                 [&](cz::DenseF16& d) { resize(d.values); },
                 [&](cz::DenseBF16& d) { resize(d.values); },
                 [&](cz::Sparse& s) {
                   if (r.below(2))
                     resize(s.values);
                   else
                     resize(s.indices);
                 },
                 [&](cz::RandBlock& b) { resize(b.values); }, [&](cz::LowRank& l) { resize(l.p); },
                 [&](cz::Sign& s) { resize(s.bits); }, [&](cz::Qsgd& q) { resize(q.packed); },
                 [&](cz::Ternary& x) {
                   if (r.below(2))
                     resize(x.positions);
                   else
                     resize(x.signs);
                 },
                 [&](cz::BlockQ& q) {
                   if (r.below(2))
                     resize(q.exps);
                   else
                     resize(q.packed);
                 }},
      p);
}

// One structural change an attacker could make.
void mutate(cz::Update& u, RngStream& r) {
  const size_t t = u.tensors.empty() ? 0 : r.below(u.tensors.size());
  switch (r.below(9)) {
    case 0:
    case 1:
      if (!u.tensors.empty()) mutateFloats(u.tensors[t], r);
      break;
    case 2:
      u.header.num_examples = pickCount(r);
      break;
    case 3:
      if (r.below(2))
        u.header.round = r.below(2) ? fuzz::kRound : pickCount(r);
      else
        u.header.phase = static_cast<uint32_t>(r.below(3));
      break;
    case 4: {  // another encoding in this tensor, taken from a seed
      const auto& s = seeds()[r.below(seeds().size())];
      try {
        const cz::Update other = cz::toOwned(harness().decoder.decodeUpdate(s));
        if (!u.tensors.empty()) u.tensors[t] = other.tensors[r.below(other.tensors.size())];
      } catch (const InputError&) {
      }
      break;
    }
    case 5:
      if (!u.tensors.empty()) mutateVectorLength(u.tensors[t], r);
      break;
    case 6:
      if (r.below(2) && !u.tensors.empty())
        u.tensors.pop_back();
      else if (!u.tensors.empty())
        u.tensors.push_back(u.tensors[t]);
      break;
    case 7: {  // metrics: many, long, odd names, extreme values
      const size_t n = r.below(4) == 0 ? 40 : 1 + r.below(3);
      for (size_t i = 0; i < n; ++i) {
        std::string name = r.below(4) == 0   ? std::string(70, 'm')
                           : r.below(4) == 0 ? "bad name"
                                             : "loss";
        if (r.below(2)) name += std::to_string(i);
        u.metrics.push_back({name, static_cast<double>(pickFloat(r)) * (r.below(2) ? 1e300 : 1.0)});
      }
      break;
    }
    default:
      u.header.client_id = r.next();
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::checkInput(harness(), {data, size});
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  RngStream r(StreamKey{seed, 0, kAnyClient, StreamPurpose::kTest, 1});
  if (r.below(2) == 0) return LLVMFuzzerMutate(data, size, max_size);
  cz::Update u;
  try {
    u = cz::toOwned(harness().decoder.decodeUpdate({data, size}));
  } catch (const InputError&) {
    const auto& s = seeds()[r.below(seeds().size())];
    try {
      u = cz::toOwned(harness().decoder.decodeUpdate(s));
    } catch (const InputError&) {  // a partial aggregate seed: byte-level only
      if (s.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
      std::memcpy(data, s.data(), s.size());
      return LLVMFuzzerMutate(data, s.size(), max_size);
    }
  }
  const size_t changes = 1 + r.below(3);
  for (size_t i = 0; i < changes; ++i) mutate(u, r);
  const auto bytes = protocol::encodeUpdate(u);
  if (bytes.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, bytes.data(), bytes.size());
  return bytes.size();
}
