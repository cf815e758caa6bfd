#pragma once
// Sparsifying compressors, all with optional error feedback (residual = input + old residual -
// what was sent, so nothing is lost, only delayed):
//   topk      exact k largest magnitudes per tensor (scope=layer) or over the whole flat buffer
//             (scope=global); sends u32 indices + f32 values.
//   stc       top-k's positions per tensor sent as +-mu (sparse ternary, Sattler et al. 2019): one
//             sign bit each, Rice-coded positions, one mu per tensor (TopKCompressor, ternary).
//   randk     k uniformly random positions per tensor from the client's own seeded stream;
//             sends indices + values; positions=shared draws them from the round's stream
//             instead, the same for every client (a support secure aggregation can sum).
//   randblock one contiguous block of k values per tensor (wrapping at the end), at an offset
//             drawn from the round's stream shared by every client, so no indices travel and a
//             server adds all clients' blocks at the same place (Eghlidi & Jaggi); offset=client
//             draws it from the client's own stream instead.
#include "compression/compressor.h"

namespace starling::compression {

struct TopKOptions {
  enum class Scope { kLayer, kGlobal };
  double density = 0.01;  // k = round(density * numel), at least 1
  Scope scope = Scope::kLayer;
  ErrorFeedback ef{.on = true};
  // STC (Sattler et al. 2019): every kept value sent as +-mu, mu the mean |value| of the tensor's
  // kept set (layer scope only).
  bool ternary = false;
  void validate() const;
};

struct RandomSparsifyOptions {
  double density = 0.01;
  ErrorFeedback ef{.on = true};
  // randblock only: one block offset per round shared by every client (the default, Eghlidi &
  // Jaggi: a server adds every block at one place and an edge aggregator's partial stays k
  // values), or one per client (offset=client: the round's blocks cover about clients x density of
  // each tensor, as rand-k's positions do, still without indices).
  bool per_client_offset = false;
  // randk only: the positions drawn from the round's stream, the same for every client
  // (positions=shared), where by default each client draws its own.
  bool shared_positions = false;
  void validate() const;
};

class TopKCompressor final : public Compressor {
 public:
  explicit TopKCompressor(TopKOptions o);
  std::string name() const override { return opt_.ternary ? "stc" : "topk"; }
  bool updateSizeVaries() const override { return opt_.ternary; }
  std::string spec() const override;
  const TopKOptions& options() const { return opt_; }
  const ErrorFeedback& feedback() const override { return opt_.ef; }
  void checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                     const RoundContext& ctx) const override;

 protected:
  std::vector<Payload> encode(const ParamLayout& layout, std::span<const float> input,
                              std::span<float> residual, const ClientState& state,
                              const RoundContext& ctx, StagedState& staged) const override;

 private:
  TopKOptions opt_;
};

class RandKCompressor final : public Compressor {
 public:
  explicit RandKCompressor(RandomSparsifyOptions o);
  std::string name() const override { return "randk"; }
  std::string spec() const override;
  bool supportIsShared() const override { return opt_.shared_positions; }
  std::string secureRefusal() const override {
    if (opt_.shared_positions) return {};
    return "each client draws its own positions, and a coordinate only one client touched is "
           "that client's value in the sum: use randk:positions=shared (the round's positions "
           "for every client)";
  }
  SharedSupport sharedSupport(const ParamLayout& layout, const RoundContext& ctx) const override;
  const ErrorFeedback& feedback() const override { return opt_.ef; }
  void checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                     const RoundContext& ctx) const override;

  // The positions tensor `tensor_index` (of numel values) sends in the round and client of `ctx`
  // (with positions=shared, in its round: every client's the same): sampleIndices' draw,
  // ascending (the round on the device draws them here too).
  std::vector<uint32_t> indicesFor(const RoundContext& ctx, size_t tensor_index,
                                   size_t numel) const;

 protected:
  std::vector<Payload> encode(const ParamLayout& layout, std::span<const float> input,
                              std::span<float> residual, const ClientState& state,
                              const RoundContext& ctx, StagedState& staged) const override;

 private:
  RandomSparsifyOptions opt_;
};

class RandBlockCompressor final : public Compressor {
 public:
  explicit RandBlockCompressor(RandomSparsifyOptions o);
  std::string name() const override { return "randblock"; }
  bool updateSizeVaries() const override { return opt_.per_client_offset; }
  std::string spec() const override;
  bool supportIsShared() const override { return !opt_.per_client_offset; }
  std::string secureRefusal() const override {
    if (!opt_.per_client_offset) return {};
    return "each client places its own block, and a coordinate only one client touched is that "
           "client's value in the sum: use the default offset=shared";
  }
  SharedSupport sharedSupport(const ParamLayout& layout, const RoundContext& ctx) const override;
  const ErrorFeedback& feedback() const override { return opt_.ef; }
  void checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                     const RoundContext& ctx) const override;

  // The block offset of tensor `tensor_index` in `round`: the same for every client, or, with
  // offset=client, `client`'s own (the client argument is ignored for a shared offset).
  static uint32_t blockOffset(uint64_t run_seed, uint64_t round, size_t tensor_index, size_t numel);
  uint32_t offsetFor(const RoundContext& ctx, size_t tensor_index, size_t numel) const;
  // The block's length in a tensor of numel values.
  size_t lengthFor(size_t numel) const { return countForDensity(opt_.density, numel); }

 protected:
  std::vector<Payload> encode(const ParamLayout& layout, std::span<const float> input,
                              std::span<float> residual, const ClientState& state,
                              const RoundContext& ctx, StagedState& staged) const override;

 private:
  RandomSparsifyOptions opt_;
};

// Random k distinct indices of [0, n), ascending, from the stream (run_seed, round, client,
// kRandK, sub): Floyd's algorithm for small k, selection sampling otherwise.
std::vector<uint32_t> sampleIndices(size_t n, size_t k, uint64_t run_seed, uint64_t round,
                                    uint64_t client, uint64_t sub);

// STC's encoding of `values` without a client: the k largest magnitudes (ties broken by
// `tie_seed`, as selectTopK does), exact zeros among them dropped, sent as +-mu with mu their mean
// magnitude (what the stc compressor sends for one tensor; the server's stc downlink refreshes
// its broadcast model with it, server/model_store.h).
Ternary ternaryTopK(std::span<const float> values, size_t k, uint64_t tie_seed);

// STC's payload of the positions top-k selected (ascending) and their values: the exact zeros
// dropped from both (in place), the rest sent as +-mu, mu their mean magnitude (summed in double in
// index order). What the stc compressor sends for a tensor, wherever the selection ran (the device
// round selects on the GPU and builds here: torch_trainer/device_compress.h). InvalidArgument when
// the sizes differ.
Ternary ternaryPayload(std::vector<uint32_t>& idx, std::vector<float>& values);

}  // namespace starling::compression
