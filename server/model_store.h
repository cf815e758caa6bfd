#pragma once
// The global model, its version, and the few versions before it that a delta downlink encodes
// against. Downlink bytes matter on edge links: a task carries the model dense (f32), in fp16, or
// as the coordinates that changed since the version the client holds (exact new values, so a
// client's copy equals the server's bit for bit), whichever the configuration asks for; a delta
// falls back to dense f32 when the client's version is too old or the delta would not be smaller.
//
// Lossy downlink (mode topk, with server-side error feedback, as STC's server): the server keeps
// its model x and the broadcast model x-hat that every up-to-date client holds. Each new version
// refreshes only the k = density x numel coordinates where |x - x-hat| is largest (over the whole
// model) to x's exact values, and travels as a delta of those coordinates; x - x-hat is the
// server's residual, nothing is lost, only delayed. Clients train from x-hat and their updates are
// added to x (x <- x + step), so the round needs nothing else.
//
// Quantised downlinks (modes q8 and q4; q3 and q2 with a step per block, below), lossy the same
// way: each new version refreshes every coordinate of x-hat by the residual x - x-hat quantised per
// tensor to 8 or 4 bits (a sign and 7 or 3 level bits: QSGD's payload with s = 127 or 7, nearest
// rounding) on a power-of-two step u = 2^ceil(log2(max|x - x-hat| / s)), so that every decoded
// value is exact in float and a client adding the refresh to its copy gets x-hat bit for bit on any
// CPU. The residual left is at most u / 2 per coordinate (the server's error feedback carries it to
// the next version). A client that holds the version before gets that refresh (a delta: 1 or 1/2
// byte per value, exact); any other gets the whole broadcast model quantised the same way (base
// version 0), its copy then within u_whole / 2 of x-hat, u_whole the step of max|x-hat| per tensor,
// and later refreshes add to it exactly. Only peers that registered the capability "downlink-qsgd"
// are sent these; the others get x-hat dense (f32).
//
// The block-scaled downlinks (modes q3 and q2) do the same with 3 or 2 bits a value and a step of
// its own for every block of kDownlinkBlock values (compression::BlockQ: 8 or 4 levels spaced u =
// 2^e apart, centred on zero, a byte for e; 3.125 or 2.125 bits a value in all). A block's step is
// the one of four candidates (the smallest that clips nothing, and 2, 4 and 8 times finer, which
// clip its largest values) whose levels are nearest its values in squared error
// (quantizeBlocks): per block and fitted rather than per tensor and set by the largest value.
// Decoded values are exact as above; the whole model's copy is within the blocks' rounding of
// x-hat (at most u / 2 a value, or the clip). docs/results.md measures what each costs.
// Only peers that registered "downlink-blockq" are sent these; the others get x-hat dense.
//
// The sparse ternary downlink (mode stc: STC's downstream, Sattler et al. 2019), lossy
// the same way, for a downlink whose cost follows how often a client takes part: each new version
// refreshes x-hat at the k = density x numel coordinates of each tensor where |x - x-hat| is
// largest, by +-mu (mu their mean magnitude): the stc compressor's payload of the residual, about
// one byte a refreshed coordinate (Rice-coded positions and a sign bit). The store keeps the
// refreshes of the last `history` versions. A client that holds one of them gets the chain of
// refreshes since, oldest first (k x tensors payloads, each added to its copy in turn, the server
// and the client doing the same float additions: a copy that was x-hat of its version is x-hat
// bit for bit, one that began as the whole model in 8 bits stays within that encoding's rounding
// of x-hat), when the chain is smaller than the whole model; any other client gets the whole of
// x-hat quantised as q8 does (base 0). A client sampled every tenth round thus downloads about ten
// refreshes, 10 x density bytes a parameter, instead of four. Only peers that registered
// "downlink-stc" are sent these; the others get x-hat dense (f32).
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compression/payload.h"
#include "core/param_layout.h"

namespace starling {
class ByteReader;
class ByteWriter;
}  // namespace starling

namespace starling::server {

// Appended only: the asynchronous simulation's checkpoint holds the mode as its number.
enum class Downlink {
  kDense,
  kFp16,
  kDelta,
  kTopK,
  kQ8,
  kQ4,
  kStc,
  kQ3,
  kQ2,
  kQ3Mirror,
  kQ2Mirror,
  kStcMirror
};
// "dense", "fp16", "delta", "topk", "q8", "q4", "stc", "q3", "q2", "q3-mirror", "q2-mirror",
// "stc-mirror"; ConfigError otherwise.
Downlink parseDownlink(std::string_view s);
const char* downlinkName(Downlink d);
// The QSGD levels of a quantised downlink: 127 (q8), 7 (q4), 0 for the others.
uint32_t downlinkLevels(Downlink d);
// The bits a value of a block-scaled downlink: 3 (q3, q3-mirror, and stc-mirror's whole model), 2
// (q2, q2-mirror), 0 for the others.
uint32_t downlinkBlockBits(Downlink d);
// Whether `d` is a mirrored downlink (q3-mirror, q2-mirror, stc-mirror: each client sent the
// difference from its own copy, which the fleet keeps; server/client_copies.h). Its ModelStore is
// a plain one.
bool downlinkMirrored(Downlink d);
// The values of a block-scaled downlink's block (each has a step of its own: a byte).
inline constexpr uint32_t kDownlinkBlock = 64;
// Whether a task's encoding depends on the version the client holds (delta, topk, q8, q4, stc, q3,
// q2, and the mirrored ones):
// a fleet or a simulator sizes and caches such tasks per version held.
bool downlinkPerHeld(Downlink d);
// The capabilities a client registers to be sent the quantised downlinks (q8, q4), and the sparse
// ternary one (stc); a peer without them gets the broadcast model dense.
inline constexpr const char* kQsgdDownlinkCapability = "downlink-qsgd";
inline constexpr const char* kStcDownlinkCapability = "downlink-stc";
// The capability of the block-scaled downlinks (q3, q2).
inline constexpr const char* kBlockDownlinkCapability = "downlink-blockq";
// Whether `mode` sends a client that is not up to date the whole model quantised (q8, q4, stc, q3,
// q2):
// its copy is then that encoding, not the broadcast model. An edge aggregator relays no such mode.
bool wholeModelQuantised(Downlink d);
// Whether a peer with these capabilities can decode `mode`'s tasks.
bool peerDecodes(Downlink mode, bool qsgd_capable, bool stc_capable, bool block_capable);

// A tensor's values quantised on the power-of-two step of the quantised downlinks (above): QSGD's
// payload with norm = u s, levels round(|v| / u), whose decoding is exact.
compression::Qsgd quantizePow2(std::span<const float> values, uint32_t s);
// A tensor's values in blocks of `block`, each on the power-of-two step of the four candidates
// (above) whose `bits`-bit levels are nearest its values in squared error; a block of zeros (or,
// never from a finite model, one holding a non-finite value) as zeros. Deterministic: the same
// values give the same payload on any CPU.
compression::BlockQ quantizeBlocks(std::span<const float> values, uint32_t bits, uint32_t block);

struct EncodedModel {
  uint64_t base_version = 0;  // 0: whole model
  std::vector<compression::Payload> tensors;
};
// The whole model `values` (laid out by `layout`) in blocks of `bits` a value, a payload a tensor
// (base 0): what q3 and q2 send a client that is not up to date, and what the mirrored downlinks
// send a client without a copy.
EncodedModel wholeInBlocks(std::span<const float> values, const ParamLayout& layout, uint32_t bits);

class ModelStore {
 public:
  // Keeps `history` earlier versions for deltas (0: none). `topk_density` in (0, 1]: the lossy
  // downlink's fraction of coordinates refreshed per version (0: the broadcast model is the model).
  // `quant_levels` 127 or 7: the quantised downlink's (instead of a density).
  ModelStore(std::shared_ptr<const ParamLayout> layout, size_t history, double topk_density = 0.0,
             uint32_t quant_levels = 0);
  // The store a downlink mode needs: `history` versions for delta and topk, `density` for topk,
  // the levels for q8 and q4, the bits for q3 and q2; for stc `history` refreshes of `density`
  // each.
  static ModelStore forDownlink(std::shared_ptr<const ParamLayout> layout, Downlink mode,
                                size_t history, double density);

  const ParamLayout& layout() const { return *layout_; }
  // The broadcast model: what tasks carry and clients train from (x-hat).
  std::span<const float> current() const { return versions_.back().values; }
  // The server's model x, which the round's step updates; the broadcast one unless lossy.
  std::span<const float> server() const {
    return lossy() ? std::span<const float>(server_) : current();
  }
  uint64_t version() const { return versions_.back().version; }
  bool lossy() const { return density_ > 0.0 || levels_ > 0 || block_bits_ > 0; }
  // The stc downlink's store (forDownlink(..., kStc, ...)).
  bool ternary() const { return ternary_; }
  // What a task spends on each payload besides its data (its Tensor and payload tables, vector
  // lengths and offsets: about 40 bytes in FlatBuffers), counted when the stc downlink weighs a
  // chain against the whole model.
  static constexpr size_t kTensorOverheadBytes = 40;
  // Installs `model` as the server's model of `version` (> the current one, or the first). The
  // first model is broadcast as it is; later lossy versions refresh the top-k coordinates of
  // x - x-hat.
  void set(std::vector<float> model, uint64_t version);
  // Starts over from a checkpoint: the server's model of `version` (> 0), the history cleared,
  // and for a lossy store the broadcast model (`broadcast`; the model itself when a checkpoint
  // holds none, from a lossless run or an older format).
  void reset(std::vector<float> model, uint64_t version, std::vector<float> broadcast = {});

  // What a task carries for a client that holds `held` (0: nothing).
  EncodedModel encodeFor(uint64_t held, Downlink mode) const;
  // The version encodeFor(held, mode) can encode against: `held` when it is one the store knows
  // for `mode`, else 0 (the same task as for a client that holds nothing). A fleet caches one
  // encoding per base, so a peer that claims arbitrary versions cannot grow its cache.
  uint64_t baseFor(uint64_t held, Downlink mode) const;
  // A quantised downlink's whole model, decoded once per version for every client that gets it.
  struct WholeModelCache {
    uint64_t version = 0;  // 0: nothing decoded yet
    std::vector<float> values;
  };
  // The model a client holding `held` trains from once it applied encodeFor(held, mode): current()
  // but for a quantised or stc downlink's whole model, decoded into `cache` when it holds another
  // version's (the simulator's clients train from what a deployed client would hold). Not
  // modelled: after a whole model in 8, 4, 3 or 2 bits, a deployed client's copy keeps that
  // encoding's rounding (at most half its step per value; with q3 and q2 also what a block's step
  // clipped) under the refreshes it adds; the simulator's client trains from x-hat itself from its
  // next task on (a client one version behind: with 10 of 100 clients a round, few).
  std::span<const float> clientModel(uint64_t held, Downlink mode, WholeModelCache& cache) const;

  // The quantised and stc downlinks' refreshes (what encodeFor sends a client one version or a
  // chain behind), for a checkpoint, so that a resumed run sends the tasks the uninterrupted one
  // would. saveRefreshes' bytes go into the checkpoint (empty for the other downlinks, whose
  // delta and topk histories are whole models and are not saved); loadRefreshes, after reset()
  // with the checkpoint's model, takes them back: IoError (naming `what`) for refreshes of another
  // downlink or levels, more than the store keeps (one for q8 and q4, the history for stc), base
  // versions not increasing or not below the current one, a payload that does not fit its tensor,
  // or truncated or trailing bytes; the store is then as reset() left it.
  std::vector<uint8_t> saveRefreshes() const;
  void loadRefreshes(std::span<const uint8_t> bytes, const std::string& what);
  // As a checkpoint field: saveRefreshes' bytes after their count (u64); readRefreshes takes them
  // from `r` (its IoError for a count past what is left), for loadRefreshes once the rest is read.
  void writeRefreshes(ByteWriter& w) const;
  static std::vector<uint8_t> readRefreshes(ByteReader& r);

 private:
  struct Version {
    uint64_t version;
    std::vector<float> values;
  };
  std::shared_ptr<const ParamLayout> layout_;
  size_t history_;
  double density_;
  std::deque<Version> versions_;
  std::vector<float> server_;  // lossy: x
  std::vector<uint32_t> picked_;
  uint32_t levels_ = 0;      // quantised downlink: s (stc: q8's, for the whole model)
  uint32_t block_bits_ = 0;  // block-scaled downlink: bits a value
  // The quantised downlinks' refreshes that made the last versions, oldest first, each the version
  // it was made from, one payload per tensor (Qsgd; Ternary for stc; BlockQ for q3 and q2), and
  // their bytes: the last one for q8, q4, q3 and q2, `history` of them for stc.
  struct Refresh {
    uint64_t from = 0;
    std::vector<compression::Payload> tensors;
    size_t bytes = 0;
  };
  size_t refresh_history_ = 0;
  bool ternary_ = false;
  std::deque<Refresh> refreshes_;
  // The refreshes from `held` on (their first index in refreshes_), when the chain is smaller than
  // the whole model in q8, both counted with kTensorOverheadBytes a payload; refreshes_.size()
  // otherwise.
  size_t chainStart(uint64_t held) const;
};

}  // namespace starling::server
