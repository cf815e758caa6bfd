#pragma once
// What the control-message fuzzer (fuzz_control.cc) checks for every input, shared with the corpus
// replay in the normal suite (corpus_control_test.cc), and the valid encodings the seed corpus
// tests/fuzz/corpus_control is made of (make_control_seeds.cc writes them).
//
// An input goes to peekKind and then to the decoder of the kind it names (a Task against
// fuzz::layout() and against the softmax 784x10 model's layout). Whatever decodes must hold what
// protocol/control.h promises, checked here field by field:
// - every decoder but the one peekKind names refuses the bytes (routing agrees with decoding; see
//   checkControl for bytes peekKind refuses);
// - Register/Reject/Shutdown text bounded and printable, enums known, Welcome's bounds non-zero;
// - an Evaluation finite, loss >= 0 and accuracy in [0, 1];
// - a Chunk's data non-empty, within max_chunk_bytes, and lying inside the input; index < count;
// - a Task: nonce set, fit settings within epochs <= 1000, batch <= 2^20, 0 < lr <= 100,
//   0 <= prox_mu <= 1e4 with lr x prox_mu < 2, the model
//   empty or one payload per tensor, dense f32/f16 of exactly numel (whole), strictly increasing
//   in-range sparse (delta), or QSGD levels (whole or a refresh to add: s in [1, 65535], norm in
//   [0, 1e30], levels <= s), every value and shared factor finite and no larger than its tensor;
//   applyModel then applies it (for a delta, only onto its own base version: any other version is
//   refused with InvalidArgument and nothing else) and leaves the model finite with exactly the
//   coordinates the task carries;
// - memory linear in the input: what a decoder copies out is no larger than the input;
// - the same bytes one byte off alignment decode to the same message (a Chunk is refused instead:
//   it is read in place), and a bound one byte short of the input refuses them;
// - encoding the decoded message and decoding that again gives the same encoding.
// Anything else (another exception, a sanitizer report, a broken property) aborts.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compression/bitpack.h"
#include "compression/rice.h"
#include "core/half.h"
#include "core/overloaded.h"
#include "core/param_layout.h"
#include "fuzz/fuzz_layout.h"
#include "protocol/control.h"
#include "protocol/secagg_wire.h"

namespace starling::fuzz::control {

namespace pr = starling::protocol;
namespace cz = starling::compression;

[[noreturn]] inline void bug(const std::string& what) {
  std::fprintf(stderr, "control fuzz harness: %s\n", what.c_str());
  std::abort();
}
inline void require(bool ok, const char* what) {
  if (!ok) bug(what);
}

// The model of the client example: softmax regression on MNIST (fc.weight [10, 784], fc.bias [10]).
inline ParamLayout softmaxLayout() {
  ParamLayout l;
  l.add("fc.weight", {10, 784});
  l.add("fc.bias", {10});
  return l;
}

struct Layouts {
  ParamLayout small = fuzz::layout();
  ParamLayout softmax = softmaxLayout();
};
inline const Layouts& layouts() {
  static const Layouts l;
  return l;
}

// Chunk bounds: the transport's (a chunk may be as large as a message) and a small one.
inline constexpr size_t kChunkBounds[] = {size_t{1} << 20, 64};

inline bool printable(const std::string& s, size_t min_len, size_t max_len) {
  if (s.size() < min_len || s.size() > max_len) return false;
  for (char c : s)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

inline bool finite(float x) { return std::isfinite(x); }

// Bytes a decoded task owns (payload values, factors, strings): bounded by the input's size.
inline size_t ownedBytes(const pr::TaskMsg& t) {
  size_t n = t.compressor.size();
  for (const auto& m : t.metrics) n += m.size();
  for (const auto& p : t.model) n += cz::payloadDataBytes(p);
  for (const auto& f : t.shared.factors) n += f.size() * sizeof(float);
  return n;
}

inline std::vector<uint8_t> encodeTaskMsg(const pr::TaskMsg& t) {
  std::vector<cz::PayloadView> views;
  for (const auto& p : t.model) views.push_back(cz::view(p));
  return pr::encodeTask(t, views);
}

// The same bytes at an address one byte past 8-byte alignment.
struct Misaligned {
  std::vector<uint64_t> storage;
  std::span<const uint8_t> bytes;
  explicit Misaligned(std::span<const uint8_t> in) : storage(in.size() / 8 + 2) {
    auto* p = reinterpret_cast<uint8_t*>(storage.data()) + 1;
    if (!in.empty()) std::memcpy(p, in.data(), in.size());
    bytes = {p, in.size()};
  }
};

// Decodes with `decode` (a callable taking bytes and returning the message, encoded again with
// `encode`), then: one byte off alignment it decodes to the same message, one byte short of its
// bound it is refused, and the encoding of what it gave decodes to the same encoding.
template <class Decode, class Encode>
inline void checkCommon(std::span<const uint8_t> bytes, Decode decode, Encode encode,
                        const char* what) {
  const auto first = encode(decode(bytes, bytes.size()));
  const Misaligned m(bytes);
  try {
    if (encode(decode(m.bytes, bytes.size())) != first)
      bug(std::string(what) + ": misaligned bytes decode differently");
  } catch (const InputError&) {
    bug(std::string(what) + ": misaligned bytes refused");
  }
  try {
    decode(bytes, bytes.size() - 1);
    bug(std::string(what) + ": decoded with a bound below its size");
  } catch (const InputError&) {
  }
  try {
    if (encode(decode(first, first.size())) != first)
      bug(std::string(what) + ": encode/decode round trip changed it");
  } catch (const InputError&) {
    bug(std::string(what) + ": its own encoding is refused");
  }
}

inline void checkRegister(const pr::RegisterMsg& m, size_t input) {
  require(m.role == pr::Role::kClient || m.role == pr::Role::kAggregator, "register: unknown role");
  require(m.capabilities.size() <= 16, "register: more than 16 capabilities");
  size_t n = 0;
  for (const auto& c : m.capabilities) {
    require(printable(c, 1, 32), "register: a capability empty, longer than 32 or not printable");
    n += c.size();
  }
  require(n <= input, "register: more capability bytes than input bytes");
}

inline void checkTaskFields(const pr::TaskMsg& t, const ParamLayout& layout, size_t input) {
  require(t.nonce != 0, "task: nonce 0");
  require(t.kind == pr::TaskKind::kFit || t.kind == pr::TaskKind::kEvaluate, "task: unknown kind");
  if (t.kind == pr::TaskKind::kFit) {
    require(t.fit.epochs >= 1 && t.fit.epochs <= 1000, "task: epochs outside [1, 1000]");
    require(t.fit.batch_size >= 1 && t.fit.batch_size <= (1u << 20),
            "task: batch outside [1, 2^20]");
    require(t.fit.lr > 0 && t.fit.lr <= 100 && finite(t.fit.lr), "task: lr outside (0, 100]");
    require(t.fit.prox_mu >= 0 && t.fit.prox_mu <= 1e4, "task: prox_mu outside [0, 1e4]");
    require(static_cast<double>(t.fit.lr) * t.fit.prox_mu < 2.0, "task: lr x prox_mu not below 2");
  }
  require(printable(t.compressor, 0, 512),
          "task: compressor spec longer than 512 or not printable");
  require(t.metrics.size() <= 64, "task: more than 64 metrics");
  for (const auto& m : t.metrics)
    require(printable(m, 1, 64), "task: a metric name empty, long or not printable");
  // One payload per tensor, or against a base version a chain of stc refreshes: whole multiples
  // of the tensors, every one ternary, at most kMaxRefreshChain.
  const size_t per = layout.size();
  const bool chain = t.model.size() > per;
  require(t.model.empty() || t.model.size() == per ||
              (t.base_version != 0 && t.model.size() % per == 0 &&
               t.model.size() / per <= pr::kMaxRefreshChain),
          "task: model tensor count differs from the layout");
  for (size_t i = 0; i < t.model.size(); ++i) {
    const size_t n = layout.tensors()[i % per].numel;
    require(!chain || std::holds_alternative<cz::Ternary>(t.model[i]),
            "task: a chain of refreshes holds a payload that is not ternary");
    std::visit(
        Overloaded{
            [&](const cz::DenseF32& d) {
              require(t.base_version == 0, "task: dense f32 in a delta");
              require(d.values.size() == n, "task: dense f32 size differs from its tensor");
              for (float x : d.values) require(finite(x), "task: non-finite dense f32 value");
            },
            [&](const cz::DenseF16& d) {
              require(t.base_version == 0, "task: dense f16 in a delta");
              require(d.values.size() == n, "task: dense f16 size differs from its tensor");
              for (uint16_t h : d.values)
                require(finite(halfToFloat(h)), "task: non-finite dense f16 value");
            },
            [&](const cz::Sparse& s) {
              require(t.base_version != 0, "task: sparse in a whole model");
              require(s.indices.size() == s.values.size() && s.indices.size() <= n,
                      "task: sparse sizes");
              for (size_t j = 0; j < s.indices.size(); ++j) {
                require(s.indices[j] < n, "task: sparse index out of range");
                require(j == 0 || s.indices[j] > s.indices[j - 1],
                        "task: sparse indices not increasing");
                require(finite(s.values[j]), "task: non-finite sparse value");
              }
            },
            [&](const cz::Qsgd& q) {  // a quantised downlink: whole or a refresh to add
              require(q.s >= 1 && q.s <= 0xffff, "task: QSGD s outside [1, 65535]");
              require(q.norm >= 0.0f && q.norm <= 1e30f, "task: QSGD norm outside [0, 1e30]");
              const uint32_t bits = 1 + cz::qsgdLevelBits(q.s);
              require(q.packed.size() == cz::packedBytes(n, bits),
                      "task: QSGD bytes differ from its tensor");
              cz::BitReader r(q.packed.data());
              for (size_t j = 0; j < n; ++j)
                require((r.get(bits) >> 1) <= q.s, "task: QSGD level above s");
            },
            [&](const cz::Ternary& x) {  // an stc refresh, alone or in a chain
              require(t.base_version != 0, "task: a ternary refresh in a whole model");
              require(x.count <= n, "task: more ternary positions than its tensor");
              require(x.mu >= 0.0f && x.mu <= 1e30f, "task: ternary mu outside [0, 1e30]");
              require(x.signs.size() == cz::packedBytes(x.count, 1),
                      "task: ternary sign bytes differ from its count");
              size_t seen = 0;
              int64_t last = -1;
              const bool ok = cz::riceDecode(x.positions, x.count, x.rice, n, [&](uint32_t p) {
                require(static_cast<int64_t>(p) > last && p < n,
                        "task: ternary positions not increasing within the tensor");
                last = p;
                ++seen;
              });
              require(ok && seen == x.count, "task: ternary positions do not decode");
            },
            [&](const cz::BlockQ& q) {  // a block-scaled downlink: whole or a refresh to add
              require(q.bits >= 1 && q.bits <= 8, "task: block levels outside [1, 8] bits");
              require(q.block >= 1 && q.block <= cz::kBlockQMaxBlock, "task: block size");
              require(q.exps.size() == (n + q.block - 1) / q.block,
                      "task: block exponents differ from its tensor");
              require(q.packed.size() == cz::packedBytes(n, q.bits),
                      "task: block level bytes differ from its tensor");
              for (int8_t e : q.exps)
                require(e == cz::kBlockQZero || (e >= cz::kBlockQMinExp && e <= cz::kBlockQMaxExp),
                        "task: block exponent out of range");
            },
            [&](const auto&) {
              bug("task: a model payload neither dense f32/f16, sparse, QSGD, ternary nor block "
                  "levels");
            },
        },
        t.model[i]);
  }
  require(t.shared.factors.empty() || t.shared.factors.size() == layout.size(),
          "task: shared factor count");
  for (size_t i = 0; i < t.shared.factors.size(); ++i) {
    require(t.shared.factors[i].size() <= layout.tensors()[i].numel,
            "task: shared factor larger than its tensor");
    for (float x : t.shared.factors[i]) require(finite(x), "task: non-finite shared factor");
  }
  require(ownedBytes(t) <= input, "task: decoded into more bytes than the input holds");
}

// applyModel onto a model of 0.5s: applies onto the task's own base (any version for a whole
// model), gives exactly the task's values, and refuses a delta onto another version.
inline void checkApply(const pr::TaskMsg& t, const ParamLayout& layout) {
  if (t.model.empty()) return;  // a client applies no model then
  std::vector<float> model(layout.numel(), 0.5f);
  const uint64_t held = t.base_version != 0 ? t.base_version : 12345;
  try {
    pr::applyModel(layout, held, t.base_version, t.model, model);
  } catch (const std::exception& e) {
    bug(std::string("task: applyModel refused a decoded model: ") + e.what());
  }
  std::vector<float> want(layout.numel(), 0.5f);
  // QSGD values are a product and a sum, which a compiler may fuse into one rounding where this
  // harness rounds twice (or the reverse): within a few units of the last place, not bit for bit.
  // (A server's steps are powers of two, where both give the same bits: test_server.)
  std::vector<char> rounded(layout.numel(), 0);
  // In order: a chain's refreshes add onto what the ones before left.
  for (size_t i = 0; i < t.model.size(); ++i) {
    const TensorSpec& spec = layout.tensors()[i % layout.size()];
    float* dst = want.data() + spec.offset;
    std::visit(Overloaded{
                   [&](const cz::DenseF32& d) { std::copy(d.values.begin(), d.values.end(), dst); },
                   [&](const cz::DenseF16& d) {
                     for (size_t j = 0; j < d.values.size(); ++j) dst[j] = halfToFloat(d.values[j]);
                   },
                   [&](const cz::Sparse& s) {
                     for (size_t j = 0; j < s.indices.size(); ++j) dst[s.indices[j]] = s.values[j];
                   },
                   [&](const cz::Qsgd& q) {  // sign x level x norm / s, onto 0 (whole) or the base
                     const uint32_t bits = 1 + cz::qsgdLevelBits(q.s);
                     const float unit = static_cast<float>(static_cast<double>(q.norm) / q.s);
                     cz::BitReader r(q.packed.data());
                     for (size_t j = 0; j < spec.numel; ++j) {
                       const uint32_t field = r.get(bits);
                       const float v =
                           (field >> 1) == 0 ? 0.0f : unit * static_cast<float>(field >> 1);
                       dst[j] = (t.base_version == 0 ? 0.0f : dst[j]) + ((field & 1u) ? -v : v);
                       rounded[spec.offset + j] = 1;
                     }
                   },
                   [&](const cz::BlockQ& q) {  // (2c + 1 - 2^bits) 2^(e-1), exact
                     const int top = (1 << q.bits) - 1;
                     cz::BitReader r(q.packed.data());
                     for (size_t j = 0; j < spec.numel; ++j) {
                       const int e = q.exps[j / q.block];
                       const double c = r.get(q.bits);
                       const float v = e == cz::kBlockQZero
                                           ? 0.0f
                                           : static_cast<float>(std::ldexp(2 * c - top, e - 1));
                       dst[j] = (t.base_version == 0 ? 0.0f : dst[j]) + v;
                     }
                   },
                   [&](const cz::Ternary& x) {  // +-mu added at each position, exactly
                     size_t j = 0;
                     cz::riceDecode(x.positions, x.count, x.rice, spec.numel, [&](uint32_t p) {
                       const bool negative = (x.signs[j >> 3] >> (j & 7)) & 1u;
                       dst[p] = dst[p] + (negative ? -x.mu : x.mu);
                       ++j;
                     });
                   },
                   [&](const auto&) {},
               },
               t.model[i]);
  }
  for (size_t j = 0; j < model.size(); ++j) {
    require(finite(model[j]), "task: applyModel left a non-finite value");
    require(model[j] == want[j] || (rounded[j] && std::fabs(double(model[j]) - want[j]) <=
                                                      1e-6 * (std::fabs(double(want[j])) + 1.0)),
            "task: applyModel wrote other values than the task carries");
  }
  if (t.base_version != 0) {
    try {
      pr::applyModel(layout, t.base_version ^ 1, t.base_version, t.model, model);
      bug("task: a delta applied onto another version than its base");
    } catch (const InvalidArgument&) {
    } catch (const std::exception& e) {
      bug(std::string("task: a delta onto another version failed with something else than "
                      "InvalidArgument: ") +
          e.what());
    }
  }
}

inline bool checkTask(std::span<const uint8_t> bytes, const ParamLayout& layout) {
  pr::TaskMsg t;
  try {
    t = pr::decodeTask(bytes, layout);
  } catch (const InputError&) {
    return false;
  }
  checkTaskFields(t, layout, bytes.size());
  checkApply(t, layout);
  checkCommon(
      bytes,
      [&](std::span<const uint8_t> b, size_t max) {
        return pr::decodeTask(b, layout, pr::ControlLimits{max});
      },
      [](const pr::TaskMsg& m) { return encodeTaskMsg(m); }, "task");
  return true;
}

inline bool checkChunk(std::span<const uint8_t> bytes, size_t max_chunk) {
  pr::ChunkMsg c;
  try {
    c = pr::decodeChunk(bytes, max_chunk);
  } catch (const InputError&) {
    return false;
  }
  require(!c.data.empty() && c.data.size() <= max_chunk, "chunk: data empty or above its bound");
  require(
      c.data.data() >= bytes.data() && c.data.data() + c.data.size() <= bytes.data() + bytes.size(),
      "chunk: data outside the input");
  require(c.count > 0 && c.index < c.count && c.total_bytes > 0,
          "chunk: index, count or total out of range");
  const Misaligned m(bytes);
  try {
    pr::decodeChunk(m.bytes, max_chunk);
    bug("chunk: misaligned bytes decoded (they would be read in place)");
  } catch (const InputError& e) {
    require(e.code() == Errc::kBadChunk,
            "chunk: misaligned bytes refused with another code than kBadChunk");
  }
  const auto again = pr::encodeChunk(c);
  try {
    const pr::ChunkMsg d = pr::decodeChunk(again, max_chunk);
    require(d.transfer == c.transfer && d.index == c.index && d.count == c.count &&
                d.total_bytes == c.total_bytes && d.data.size() == c.data.size() &&
                std::memcmp(d.data.data(), c.data.data(), c.data.size()) == 0,
            "chunk: encode/decode round trip changed it");
  } catch (const InputError&) {
    bug("chunk: its own encoding is refused");
  }
  return true;
}

// Every decoder that is not the one for `kind` (nullopt: every decoder) refuses `bytes`.
inline void othersRefuse(std::span<const uint8_t> bytes, std::optional<pr::MessageKind> kind) {
  using K = pr::MessageKind;
  auto refuses = [&](K k, auto decode) {
    if (kind == k) return;
    try {
      decode();
    } catch (const InputError&) {
      return;
    }
    bug(std::string("a ") + pr::kindName(k) + " decoded from bytes peekKind routes elsewhere");
  };
  refuses(K::kRegister, [&] { pr::decodeRegister(bytes); });
  refuses(K::kWelcome, [&] { pr::decodeWelcome(bytes); });
  refuses(K::kHeartbeat, [&] { pr::decodeHeartbeat(bytes); });
  refuses(K::kEvaluation, [&] { pr::decodeEvaluation(bytes); });
  refuses(K::kReject, [&] { pr::decodeReject(bytes); });
  refuses(K::kShutdown, [&] { pr::decodeShutdown(bytes); });
  refuses(K::kChunk, [&] { pr::decodeChunk(bytes, kChunkBounds[0]); });
  refuses(K::kSplitHello, [&] { pr::decodeSplitHello(bytes); });
  refuses(K::kSplitStep, [&] { pr::decodeSplitStep(bytes); });
  refuses(K::kSplitReply, [&] { pr::decodeSplitReply(bytes); });
  refuses(K::kSplitBottom, [&] { pr::decodeSplitBottom(bytes); });
  refuses(K::kSplitAverage, [&] { pr::decodeSplitAverage(bytes); });
  refuses(K::kSecAggSetup, [&] { pr::decodeSecAggSetup(bytes); });
  refuses(K::kSecAggKeys, [&] { pr::decodeSecAggKeys(bytes); });
  refuses(K::kSecAggAdverts, [&] { pr::decodeSecAggAdverts(bytes); });
  refuses(K::kSecAggShares, [&] { pr::decodeSecAggShares(bytes); });
  refuses(K::kSecAggMasked, [&] { pr::decodeSecAggMasked(bytes, 16); });
  refuses(K::kSecAggUnmask, [&] { pr::decodeSecAggUnmask(bytes); });
  refuses(K::kSecAggReveal, [&] { pr::decodeSecAggReveal(bytes); });
  refuses(K::kSecAggRelay, [&] { pr::decodeSecAggRelay(bytes); });
  refuses(K::kSecAggSurvivors, [&] { pr::decodeSecAggSurvivors(bytes); });
  refuses(K::kSecAggSigned, [&] { pr::decodeSecAggSigned(bytes); });
  refuses(K::kTask, [&] { pr::decodeTask(bytes, layouts().small); });
  refuses(K::kTask, [&] { pr::decodeTask(bytes, layouts().softmax); });
}

// Decodes `bytes` as `kind` and checks what decodes; false when refused.
inline bool checkKind(std::span<const uint8_t> bytes, pr::MessageKind kind) {
  using K = pr::MessageKind;
  const size_t n = bytes.size();
  auto common = [&](auto decode, auto encode, const char* what) {
    try {
      decode(bytes, n);
    } catch (const InputError&) {
      return false;
    }
    checkCommon(bytes, decode, encode, what);
    return true;
  };
  auto limits = [](size_t max) { return pr::ControlLimits{max}; };
  bool ok = false;
  switch (kind) {
    case K::kRegister:
      ok = common([&](auto b, size_t max) { return pr::decodeRegister(b, limits(max)); },
                  [](const auto& m) { return pr::encode(m); }, "register");
      if (ok) checkRegister(pr::decodeRegister(bytes), n);
      break;
    case K::kWelcome:
      ok = common([&](auto b, size_t max) { return pr::decodeWelcome(b, limits(max)); },
                  [](const auto& m) { return pr::encode(m); }, "welcome");
      if (ok) {
        const auto w = pr::decodeWelcome(bytes);
        require(w.heartbeat_ms != 0 && w.chunk_bytes != 0 && w.max_message_bytes != 0,
                "welcome: a zero bound");
      }
      break;
    case K::kHeartbeat:
      ok = common([&](auto b, size_t max) { return pr::decodeHeartbeat(b, limits(max)); },
                  [](const auto& m) { return pr::encode(m); }, "heartbeat");
      if (ok) {
        const auto h = pr::decodeHeartbeat(bytes);
        if (h.subtree)
          require(h.subtree->size() <= pr::kMaxSubtree, "heartbeat: a subtree over the bound");
      }
      break;
    case K::kEvaluation:
      ok = common([&](auto b, size_t max) { return pr::decodeEvaluation(b, limits(max)); },
                  [](const auto& m) { return pr::encode(m); }, "evaluation");
      if (ok) {
        const auto e = pr::decodeEvaluation(bytes);
        require(std::isfinite(e.loss) && e.loss >= 0, "evaluation: loss non-finite or negative");
        require(e.loss <= pr::ControlLimits{}.max_eval_loss, "evaluation: loss over the bound");
        require(std::isfinite(e.accuracy) && e.accuracy >= 0 && e.accuracy <= 1,
                "evaluation: accuracy outside [0, 1]");
      }
      break;
    case K::kReject:
      ok = common([&](auto b, size_t max) { return pr::decodeReject(b, limits(max)); },
                  [](const auto& m) { return pr::encode(m); }, "reject");
      if (ok) {
        const auto r = pr::decodeReject(bytes);
        require(r.kind == pr::RejectKind::kRefused || r.kind == pr::RejectKind::kNotRegistered ||
                    r.kind == pr::RejectKind::kBusy ||
                    r.kind == pr::RejectKind::kRegistrationRefused,
                "reject: unknown kind");
        require(printable(r.message, 0, 1024), "reject: message longer than 1024 or not printable");
      }
      break;
    case K::kShutdown:
      ok = common([&](auto b, size_t max) { return pr::decodeShutdown(b, limits(max)); },
                  [](const auto& m) { return pr::encode(m); }, "shutdown");
      if (ok)
        require(printable(pr::decodeShutdown(bytes).reason, 0, 1024),
                "shutdown: reason long or not printable");
      break;
    case K::kChunk:
      for (size_t max : kChunkBounds) ok |= checkChunk(bytes, max);
      break;
    case K::kSplitHello:
      ok = common([&](auto b, size_t max) { return pr::decodeSplitHello(b, limits(max)); },
                  [](const auto& m) { return pr::encode(m); }, "split hello");
      if (ok) {
        const auto h = pr::decodeSplitHello(bytes);
        require(printable(h.up, 1, 512) && printable(h.down, 1, 512),
                "split hello: a codec spec empty, long or not printable");
      }
      break;
    case K::kSplitStep:
      ok = common([&](auto b, size_t max) { return pr::decodeSplitStep(b, limits(max)); },
                  [](const auto& m) { return pr::encode(m); }, "split step");
      if (ok) {
        const auto st = pr::decodeSplitStep(bytes);
        require(st.step >= 1, "split step: step 0");
        require(st.kind == pr::SplitStepKind::kTrain || st.kind == pr::SplitStepKind::kTrainTop ||
                    st.kind == pr::SplitStepKind::kEvaluate,
                "split step: unknown kind");
        require(st.examples >= 1 && st.labels.size() == st.examples,
                "split step: examples and labels disagree");
        require(!st.activations.empty(), "split step: no activations");
        require(st.labels.size() + st.activations.size() <= n,
                "split step: more bytes decoded than the input holds");
      }
      break;
    // Secure aggregation's messages: decoded (a crash or a sanitizer's report is the finding);
    // their round trips are protocol/secagg_wire's tests' (tests/server/secure_engine_test.cc).
    case K::kSecAggSetup:
    case K::kSecAggKeys:
    case K::kSecAggAdverts:
    case K::kSecAggShares:
    case K::kSecAggMasked:
    case K::kSecAggUnmask:
    case K::kSecAggReveal:
    case K::kSecAggRelay:
    case K::kSecAggSurvivors:
    case K::kSecAggSigned:
      try {
        const pr::SecAggLimits l{n};
        if (kind == K::kSecAggSetup) (void)pr::decodeSecAggSetup(bytes, l);
        if (kind == K::kSecAggKeys) (void)pr::decodeSecAggKeys(bytes, l);
        if (kind == K::kSecAggAdverts) (void)pr::decodeSecAggAdverts(bytes, l);
        if (kind == K::kSecAggShares) (void)pr::decodeSecAggShares(bytes, l);
        if (kind == K::kSecAggMasked) (void)pr::decodeSecAggMasked(bytes, 16, l);
        if (kind == K::kSecAggUnmask) (void)pr::decodeSecAggUnmask(bytes, l);
        if (kind == K::kSecAggReveal) (void)pr::decodeSecAggReveal(bytes, l);
        if (kind == K::kSecAggSurvivors) {
          const auto m = pr::decodeSecAggSurvivors(bytes, l);
          for (size_t i = 1; i < m.request.absent.size(); ++i)
            require(m.request.absent[i] > m.request.absent[i - 1],
                    "secagg survivors: absent clients unordered");
        }
        if (kind == K::kSecAggSigned) (void)pr::decodeSecAggSigned(bytes, l);
        if (kind == K::kSecAggRelay) {
          const pr::SecAggRelayMsg m = pr::decodeSecAggRelay(bytes, l);
          for (size_t i = 1; i < m.items.size(); ++i)
            require(m.items[i].client > m.items[i - 1].client, "secagg relay: clients unordered");
          for (const auto& it : m.items)
            require(it.message.size() <= n &&
                        (m.stage == pr::RelayStage::kRoster) == it.message.empty(),
                    "secagg relay: an item's message does not fit its stage");
        }
        ok = true;
      } catch (const InputError&) {
        ok = false;
      }
      break;
    case K::kSplitReply:
      ok = common([&](auto b, size_t max) { return pr::decodeSplitReply(b, limits(max)); },
                  [](const auto& m) { return pr::encode(m); }, "split reply");
      if (ok) {
        const auto r = pr::decodeSplitReply(bytes);
        require(std::isfinite(r.loss) && r.loss >= 0, "split reply: loss non-finite or negative");
        require(r.step != 0 || r.gradient.empty(), "split reply: a hello's reply with a gradient");
        require(r.gradient.size() <= n, "split reply: more bytes decoded than the input holds");
      }
      break;
    case K::kSplitBottom:
      ok = common([&](auto b, size_t max) { return pr::decodeSplitBottom(b, limits(max)); },
                  [](const auto& m) { return pr::encode(m); }, "split bottom");
      if (ok) {
        const auto m = pr::decodeSplitBottom(bytes);
        require(m.epoch >= 1 && m.examples >= 1, "split bottom: epoch or examples 0");
        require(!m.bottom.empty() && m.bottom.size() * 4 <= n,
                "split bottom: empty or larger than the input");
        for (float x : m.bottom) require(std::isfinite(x), "split bottom: non-finite value");
      }
      break;
    case K::kSplitAverage:
      ok = common([&](auto b, size_t max) { return pr::decodeSplitAverage(b, limits(max)); },
                  [](const auto& m) { return pr::encode(m); }, "split average");
      if (ok) {
        const auto m = pr::decodeSplitAverage(bytes);
        require(m.epoch >= 1 && m.edges >= 1, "split average: epoch or edges 0");
        require(!m.bottom.empty() && m.bottom.size() * 4 <= n,
                "split average: empty or larger than the input");
        for (float x : m.bottom) require(std::isfinite(x), "split average: non-finite value");
      }
      break;
    case K::kTask:
      ok |= checkTask(bytes, layouts().small);
      ok |= checkTask(bytes, layouts().softmax);
      break;
    case K::kUpdate:
    case K::kPartial:
      break;
  }
  return ok;
}

inline constexpr pr::MessageKind kControlKinds[] = {
    pr::MessageKind::kRegister,    pr::MessageKind::kWelcome,    pr::MessageKind::kHeartbeat,
    pr::MessageKind::kTask,        pr::MessageKind::kEvaluation, pr::MessageKind::kReject,
    pr::MessageKind::kShutdown,    pr::MessageKind::kChunk,      pr::MessageKind::kSplitHello,
    pr::MessageKind::kSplitStep,   pr::MessageKind::kSplitReply, pr::MessageKind::kSplitBottom,
    pr::MessageKind::kSplitAverage};

// Returns the kind that decoded (nullopt: refused, or an Update/PartialAggregate, which are
// fuzz_decode.cc's). The bytes are read where they are; callers pass 8-byte aligned bytes, as the
// transport does.
//
// When peekKind names a kind, no other decoder accepts the bytes. peekKind may refuse bytes that
// a decoder accepts: it also requires the body type field to lie within the root table's declared
// inline size, which the FlatBuffers Verifier does not check. A receiver drops such a message as
// unknown before decoding it, so that is harmless; the harness then still checks that at most one
// decoder accepts the bytes and that what it decodes holds every property.
inline std::optional<pr::MessageKind> checkControl(std::span<const uint8_t> bytes) {
  const std::optional<pr::MessageKind> routed = pr::peekKind(bytes);
  if (routed) {
    othersRefuse(bytes, routed);
    return checkKind(bytes, *routed) ? routed : std::nullopt;
  }
  std::optional<pr::MessageKind> found;
  for (pr::MessageKind k : kControlKinds)
    if (checkKind(bytes, k)) {
      if (found)
        bug(std::string("both a ") + pr::kindName(*found) + " and a " + pr::kindName(k) +
            " decoded from the same bytes");
      found = k;
    }
  return found;
}

// ---------------------------------------------------------------- seeds

struct Seed {
  std::string name;
  std::vector<uint8_t> bytes;
};

// One valid encoding of each control message (several for a Task: each model encoding, with and
// without shared factors, against both layouts; the first and the last chunk of a transfer).
inline std::vector<Seed> controlSeeds() {
  std::vector<Seed> out;
  out.push_back({"register", pr::encode(pr::RegisterMsg{
                                 7, pr::Role::kClient, 0x1234, 60, 10, 2, {"fp16", "delta"}})});
  out.push_back({"register-aggregator",
                 pr::encode(pr::RegisterMsg{9, pr::Role::kAggregator, 0x1234, 600, 100, 0, {}})});
  out.push_back({"welcome", pr::encode(pr::WelcomeMsg{7, 99, 500, 1u << 26, 1u << 20})});
  out.push_back({"heartbeat", pr::encode(pr::HeartbeatMsg{7, 99, 3})});
  {
    pr::HeartbeatMsg h{7, 99, 3};
    h.subtree =
        std::vector<pr::SubtreePeer>{{1, true, false, 250, 12, 3, 0}, {2, false, true, 0, 0, 1, 5}};
    out.push_back({"heartbeat-subtree", pr::encode(h)});
  }
  out.push_back({"evaluation", pr::encode(pr::EvaluationMsg{7, 3, 41, 60, 0.25, 0.875})});
  out.push_back(
      {"reject", pr::encode(pr::RejectMsg{pr::RejectKind::kRefused, 4, 3, 41, "stale round"})});
  out.push_back({"reject-busy", pr::encode(pr::RejectMsg{pr::RejectKind::kBusy, 0, 0, 0, ""})});
  out.push_back({"reject-registration",
                 pr::encode(pr::RejectMsg{pr::RejectKind::kRegistrationRefused, 28, 0, 0,
                                          "registration refused: listed as client 4"})});
  out.push_back({"shutdown", pr::encode(pr::ShutdownMsg{12, "training finished"})});
  out.push_back(
      {"split-hello", pr::encode(pr::SplitHelloMsg{3, 0xfeed, "lowrank:rank=4", "int8"})});
  out.push_back(
      {"split-step",
       pr::encode(pr::SplitStepMsg{
           7, 2, pr::SplitStepKind::kTrain, 3, {1, 4, 9}, std::vector<uint8_t>(40, 0x41)})});
  out.push_back({"split-step-evaluate",
                 pr::encode(pr::SplitStepMsg{7, 3, pr::SplitStepKind::kEvaluate, 1, {2}, {0x41}})});
  out.push_back({"split-reply", pr::encode(pr::SplitReplyMsg{7, 2, 0.5, 2, 1500,
                                                             std::vector<uint8_t>(24, 0x41)})});
  out.push_back({"split-reply-hello", pr::encode(pr::SplitReplyMsg{7, 0, 0, 0, 0, {}})});
  out.push_back(
      {"split-bottom", pr::encode(pr::SplitBottomMsg{7, 2, 600, {0.5f, -1.25f, 3.0f, 0.0f}})});
  out.push_back(
      {"split-average", pr::encode(pr::SplitAverageMsg{7, 2, 3, {0.25f, -1.0f, 2.5f, 0.125f}})});
  std::vector<uint8_t> payload(200);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 37 + 1);
  out.push_back({"chunk-first", pr::encodeChunk(pr::ChunkMsg{5, 0, 4, 200, {payload.data(), 64}})});
  out.push_back(
      {"chunk-last", pr::encodeChunk(pr::ChunkMsg{5, 3, 4, 200, {payload.data() + 192, 8}})});

  auto task = [](pr::TaskKind kind, uint64_t base) {
    pr::TaskMsg t;
    t.kind = kind;
    t.round = 3;
    t.phase = 0;
    t.nonce = 41;
    t.run_seed = 1;
    t.compressor = "topk:density=0.1";
    t.model_version = base + 1;
    t.base_version = base;
    t.fit = pr::FitSettings{2, 16, 0.05f};
    t.deadline_ms = 30000;
    t.metrics = {"loss", "accuracy"};
    return t;
  };
  const ParamLayout& soft = layouts().softmax;
  {
    pr::TaskMsg t = task(pr::TaskKind::kFit, 0);
    std::vector<float> w(96), b(8);
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = 0.01f * static_cast<float>(static_cast<int>(i % 9) - 4);
    for (size_t i = 0; i < b.size(); ++i) b[i] = 0.1f * static_cast<float>(i);
    t.model = {cz::DenseF32{w}, cz::DenseF32{b}};
    out.push_back({"task-fit-f32", encodeTaskMsg(t)});
    t.model = {cz::DenseF16{std::vector<uint16_t>(96, 0x3c00)}, cz::DenseF32{b}};
    out.push_back({"task-fit-f16", encodeTaskMsg(t)});
  }
  {
    pr::TaskMsg t = task(pr::TaskKind::kFit, 4);
    t.model = {cz::Sparse{{1, 5, 90}, {1.0f, -2.0f, 3.0f}}, cz::Sparse{{0, 7}, {0.5f, -0.5f}}};
    out.push_back({"task-fit-delta", encodeTaskMsg(t)});
  }
  {  // the quantised downlinks: the whole model in 8 bits, a 4-bit refresh against version 4
    const auto levels = [](size_t n, uint32_t s, uint32_t bits) {
      cz::Qsgd q;
      q.s = s;
      q.norm = 0.25f * static_cast<float>(s);  // a power-of-two step, as a server sends
      cz::BitWriter w(q.packed, n, bits);
      for (size_t i = 0; i < n; ++i)
        w.put(static_cast<uint32_t>(((i * 5) % (s + 1)) << 1 | (i & 1)), bits);
      w.flush();
      return q;
    };
    pr::TaskMsg t = task(pr::TaskKind::kFit, 0);
    t.model = {levels(96, 127, 8), levels(8, 127, 8)};
    out.push_back({"task-fit-q8", encodeTaskMsg(t)});
    pr::TaskMsg d = task(pr::TaskKind::kFit, 4);
    d.model = {levels(96, 7, 4), levels(8, 7, 4)};
    out.push_back({"task-fit-q4-refresh", encodeTaskMsg(d)});
  }
  {  // the block-scaled downlinks: the whole model in 2 bits (a block of zeros), a 3-bit refresh
    const auto blocks = [](size_t n, uint32_t bits, std::vector<int8_t> exps) {
      cz::BlockQ q{static_cast<uint8_t>(bits), 64, std::move(exps), {}};
      cz::BitWriter w(q.packed, n, bits);
      for (size_t i = 0; i < n; ++i)
        w.put(
            q.exps[i / 64] == cz::kBlockQZero ? 0u : static_cast<uint32_t>((i * 5) % (1u << bits)),
            bits);
      w.flush();
      return q;
    };
    pr::TaskMsg t = task(pr::TaskKind::kFit, 0);
    t.model = {blocks(96, 2, {-3, cz::kBlockQZero}), blocks(8, 2, {1})};
    out.push_back({"task-fit-q2", encodeTaskMsg(t)});
    pr::TaskMsg d = task(pr::TaskKind::kFit, 4);
    d.model = {blocks(96, 3, {-7, -6}), blocks(8, 3, {-9})};
    out.push_back({"task-fit-q3-refresh", encodeTaskMsg(d)});
  }
  {  // the stc downlink: a chain of two refreshes of both tensors against version 4
    const auto refresh = [](std::vector<uint32_t> idx, float mu, uint8_t signs) {
      cz::Ternary x;
      x.count = static_cast<uint32_t>(idx.size());
      x.mu = mu;
      x.rice = static_cast<uint8_t>(cz::bestRiceParameter(idx));
      x.positions = cz::riceEncode(idx, x.rice);
      x.signs.assign(cz::packedBytes(idx.size(), 1), 0);
      if (!x.signs.empty()) x.signs[0] = static_cast<uint8_t>(signs & ((1u << idx.size()) - 1));
      return x;
    };
    pr::TaskMsg t = task(pr::TaskKind::kFit, 4);
    t.model = {refresh({3, 17, 40, 95}, 0.25f, 0x5), refresh({2}, 0.5f, 0x1),
               refresh({3, 60}, 0.125f, 0x2), refresh({0, 7}, 0.0625f, 0x0)};
    out.push_back({"task-fit-stc-chain", encodeTaskMsg(t)});
  }
  {  // PowerSGD's phase 1: no model, the shared factors (Q-hat of "w", none for "b")
    pr::TaskMsg t = task(pr::TaskKind::kFit, 0);
    t.phase = 1;
    t.compressor = "powersgd:rank=2,min_rate=1";
    t.shared = fuzz::shared();
    out.push_back({"task-fit-shared", encodeTaskMsg(t)});
  }
  {
    pr::TaskMsg t = task(pr::TaskKind::kEvaluate, 0);
    t.fit = {};
    out.push_back({"task-evaluate", encodeTaskMsg(t)});
  }
  {  // the softmax model: whole in f16 (fc.weight) and f32 (fc.bias), and a delta against it
    pr::TaskMsg t = task(pr::TaskKind::kFit, 0);
    std::vector<uint16_t> w(soft.tensors()[0].numel);
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = floatToHalf(0.001f * static_cast<float>(static_cast<int>(i % 11) - 5));
    t.model = {cz::DenseF16{w}, cz::DenseF32{std::vector<float>(10, 0.1f)}};
    out.push_back({"task-softmax-f16", encodeTaskMsg(t)});
    pr::TaskMsg d = task(pr::TaskKind::kFit, 6);
    d.model = {cz::Sparse{{0, 783, 784, 7839}, {0.25f, -0.25f, 1.0f, -1.0f}},
               cz::Sparse{{9}, {0.125f}}};
    out.push_back({"task-softmax-delta", encodeTaskMsg(d)});
  }
  return out;
}

}  // namespace starling::fuzz::control
