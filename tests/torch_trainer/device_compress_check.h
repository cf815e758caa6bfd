#pragma once
// The device's top-k, stc, rand-k, random-block, sign and QSGD against the CPU compressors, bit for
// bit: shared by the CPU suite (device_compress_test.cc, CPU tensors) and test_torch_gpu (the same
// on a GPU).
#include <torch/torch.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "compression/lowrank.h"
#include "compression/registry.h"
#include "compression/sparsify.h"
#include "compression/topk_select.h"
#include "core/client_state.h"
#include "core/rng.h"
#include "test_util.h"
#include "torch_trainer/device_compress.h"

namespace starling::testing {

// Values with many exact ties in magnitude (a few levels, both signs, +0, -0 and denormals among
// them), so that the tie order decides which positions are sent.
inline std::vector<float> tiedValues(size_t n, uint64_t seed) {
  RngStream r(StreamKey{seed, 0, 0, StreamPurpose::kTest, 1});
  std::vector<float> v(n);
  for (float& x : v) {
    const uint64_t level = r.below(7);  // 0..4 in quarters, 5 and 6 denormals: a seventh are zeros
    const float magnitude = level == 5   ? 1e-40f
                            : level == 6 ? 1e-45f
                                         : 0.25f * static_cast<float>(level);
    x = r.below(2) ? -magnitude : magnitude;
  }
  return v;
}

inline bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

inline std::vector<float> toVector(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kCPU).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

inline void checkPayloadsEqual(const std::vector<compression::Payload>& cpu,
                               const std::vector<compression::Payload>& dev) {
  REQUIRE(cpu.size() == dev.size());
  for (size_t t = 0; t < cpu.size(); ++t) {
    INFO("tensor " << t);
    REQUIRE(cpu[t].index() == dev[t].index());
    if (const auto* s = std::get_if<compression::Sparse>(&cpu[t])) {
      const auto& d = std::get<compression::Sparse>(dev[t]);
      CHECK(s->indices == d.indices);
      CHECK(sameBits(s->values, d.values));
    } else if (const auto* b = std::get_if<compression::RandBlock>(&cpu[t])) {
      const auto& d = std::get<compression::RandBlock>(dev[t]);
      CHECK(b->offset == d.offset);
      CHECK(sameBits(b->values, d.values));
    } else if (const auto* g = std::get_if<compression::Sign>(&cpu[t])) {
      const auto& d = std::get<compression::Sign>(dev[t]);
      CHECK(std::memcmp(&g->scale, &d.scale, 4) == 0);
      CHECK(g->bits == d.bits);
    } else if (const auto* q = std::get_if<compression::Qsgd>(&cpu[t])) {
      const auto& d = std::get<compression::Qsgd>(dev[t]);
      CHECK(q->s == d.s);
      CHECK(std::memcmp(&q->norm, &d.norm, 4) == 0);
      CHECK(q->packed == d.packed);
    } else if (const auto* l = std::get_if<compression::LowRank>(&cpu[t])) {
      const auto& d = std::get<compression::LowRank>(dev[t]);
      CHECK((l->rows == d.rows && l->cols == d.cols && l->rank == d.rank));
      CHECK(sameBits(l->p, d.p));
      CHECK(sameBits(l->q, d.q));
    } else if (const auto* f = std::get_if<compression::DenseF32>(&cpu[t])) {
      CHECK(sameBits(f->values, std::get<compression::DenseF32>(dev[t]).values));
    } else {
      const auto& x = std::get<compression::Ternary>(cpu[t]);
      const auto& d = std::get<compression::Ternary>(dev[t]);
      CHECK(x.count == d.count);
      CHECK(std::memcmp(&x.mu, &d.mu, 4) == 0);
      CHECK(x.rice == d.rice);
      CHECK(x.positions == d.positions);
      CHECK(x.signs == d.signs);
    }
  }
}

// For each spec and input: the CPU compressor with error feedback from a fresh state (its payloads
// and kept residual) against encodeTopK on `device` (payloads, and acc turned into the residual).
inline void checkDeviceTopKMatchesCpu(const torch::Device& device) {
  ParamLayout layout = smallCnnLayout();
  layout.add("big.weight", {512, 3136});  // the CNN's largest tensor: LibTorch's large-input paths
  layout.add("head.scale", {1});          // a tensor of one value: k = 1 = n
  const size_t n = layout.numel();
  const std::vector<std::vector<float>> inputs = {randomVector(n, 3), tiedValues(n, 4),
                                                  std::vector<float>(n, 0.0f)};
  for (const char* spec :
       {"topk:density=0.01", "topk:density=0.1", "topk:density=1", "topk:density=0.02,scope=global",
        "stc:density=0.05", "stc:density=0.3"}) {
    const auto comp = compression::makeCompressor(spec);
    const auto& topk = dynamic_cast<const compression::TopKCompressor&>(*comp);
    for (size_t i = 0; i < inputs.size(); ++i) {
      INFO(spec << ", input " << i);
      ClientState state(layout.fingerprint());
      const compression::RoundContext ctx{7, 1, 0, 5, nullptr};
      const auto cpu = comp->compressWithFeedback(layout, inputs[i], state, ctx);
      const auto* kept = state.find<compression::ResidualState>(compression::kResidualComponent);
      REQUIRE(kept != nullptr);
      torch::Tensor acc = torch::from_blob(const_cast<float*>(inputs[i].data()),
                                           {static_cast<int64_t>(n)}, torch::kFloat32)
                              .to(device, /*non_blocking=*/false, /*copy=*/true);
      const auto dev =
          torch_trainer::encodeTopK(topk.options(), layout, acc, /*keep_residual=*/true);
      checkPayloadsEqual(cpu, dev);
      CHECK(sameBits(kept->values, toVector(acc)));
      // Without a residual to keep, the input is left as it was.
      torch::Tensor same = acc.clone();
      checkPayloadsEqual(
          compression::TopKCompressor(topk.options()).compress(layout, toVector(same), ctx),
          torch_trainer::encodeTopK(topk.options(), layout, same, false));
      CHECK(sameBits(toVector(same), toVector(acc)));
    }
  }
}

// For rand-k, random-block, sign and QSGD: the CPU compressor with error feedback from a fresh
// state against encodeOnDevice on `device`, as above, in two rounds and for two clients (their
// streams).
inline void checkDeviceEncodeMatchesCpu(const torch::Device& device) {
  ParamLayout layout = smallCnnLayout();
  layout.add("big.weight", {512, 3136});
  layout.add("head.scale", {1});
  layout.add("odd.bias", {13});  // sign's bits: a last byte only partly used
  const size_t n = layout.numel();
  std::vector<float> wide = randomVector(n, 8);  // exponents far apart: the sum's rounding matters
  for (size_t i = 0; i < n; ++i) wide[i] *= std::ldexp(1.0f, static_cast<int>(i % 61) - 30);
  // Denormals alone (the buckets of exponent 0 decide the scale and norm), and values up to about
  // half the compressors' bound of 1e30 (the top buckets, a norm near 1e33).
  std::vector<float> denormal = randomVector(n, 9), huge = randomVector(n, 10);
  for (size_t i = 0; i < n; ++i) {
    denormal[i] *= 1e-39f;
    huge[i] = std::clamp(huge[i] * 1e29f, -9e29f, 9e29f);
  }
  const std::vector<std::vector<float>> inputs = {
      randomVector(n, 3), tiedValues(n, 4), wide, denormal, huge, std::vector<float>(n, 0.0f)};
  for (const char* spec :
       {"randk:density=0.01", "randk:density=0.3", "randblock:density=0.05",
        "randblock:density=0.5,offset=client", "randblock:density=1", "sign", "qsgd:levels=16",
        "qsgd:levels=1,ef=true", "qsgd:levels=65535,ef=true"}) {
    const auto comp = compression::makeCompressor(spec);
    REQUIRE(torch_trainer::encodesOnDevice(*comp));
    for (size_t i = 0; i < inputs.size(); ++i) {
      for (const compression::RoundContext ctx : {compression::RoundContext{7, 1, 0, 5, nullptr},
                                                  compression::RoundContext{7, 2, 0, 3, nullptr}}) {
        INFO(spec << ", input " << i << ", round " << ctx.round << ", client " << ctx.client_id);
        ClientState state(layout.fingerprint());
        const auto cpu = comp->compressWithFeedback(layout, inputs[i], state, ctx);
        const auto* kept = state.find<compression::ResidualState>(compression::kResidualComponent);
        const bool ef = comp->usesErrorFeedback();
        REQUIRE((kept != nullptr) == ef);
        torch::Tensor acc = torch::from_blob(const_cast<float*>(inputs[i].data()),
                                             {static_cast<int64_t>(n)}, torch::kFloat32)
                                .to(device, /*non_blocking=*/false, /*copy=*/true);
        checkPayloadsEqual(cpu, torch_trainer::encodeOnDevice(*comp, layout, acc, ef, ctx));
        CHECK(sameBits(ef ? kept->values : inputs[i], toVector(acc)));
        // Without a residual to keep, the input is left as it was.
        torch::Tensor same = torch::from_blob(const_cast<float*>(inputs[i].data()),
                                              {static_cast<int64_t>(n)}, torch::kFloat32)
                                 .to(device, /*non_blocking=*/false, /*copy=*/true);
        checkPayloadsEqual(comp->compress(layout, inputs[i], ctx),
                           torch_trainer::encodeOnDevice(*comp, layout, same, false, ctx));
        CHECK(sameBits(toVector(same), inputs[i]));
      }
    }
  }
}

// PowerSGD's staged state (pending phase, warm factors) in both states or in neither, the same.
inline void checkPowerSgdStatesEqual(const ClientState& a, const ClientState& b) {
  const auto* x = a.find<compression::PowerSgdState>(compression::kPowerSgdComponent);
  const auto* y = b.find<compression::PowerSgdState>(compression::kPowerSgdComponent);
  REQUIRE((x == nullptr) == (y == nullptr));
  if (!x) return;
  CHECK(x->pending_phase == y->pending_phase);
  REQUIRE(x->factors.size() == y->factors.size());
  for (size_t t = 0; t < x->factors.size(); ++t) CHECK(sameBits(x->factors[t], y->factors[t]));
}

// Shared factors of side `side` for every tensor `o` factors: seeded (random, not orthonormal: the
// products must agree for any factor), sized as checkSharedFactors wants them.
inline compression::SharedFactors randomShared(const ParamLayout& layout,
                                               const compression::LowRankOptions& o,
                                               compression::SharedFactors::Side side,
                                               uint64_t seed) {
  compression::SharedFactors s;
  s.fixed = side;
  s.factors.resize(layout.size());
  for (size_t t = 0; t < layout.size(); ++t)
    if (compression::lowRankCompressible(layout[t], o.rank, o.min_compression_rate))
      s.factors[t] = randomVector(
          (side == compression::SharedFactors::Side::kQ ? layout[t].cols() : layout[t].rows()) *
              compression::effectiveRank(layout[t], o.rank),
          seed + t);
  return s;
}

// PowerSGD (local mode with and without warm factors; two-phase's phase P) and ACP-SGD (either
// side fixed) against encodeOnDevice on `device`: the payloads, the kept buffer, and PowerSGD's
// staged state (warm factors, pending phase), bit for bit, in two rounds; a warm client's second
// round starts from the factors its first staged.
inline void checkDeviceLowRankMatchesCpu(const torch::Device& device) {
  using compression::SharedFactors;
  ParamLayout layout = smallCnnLayout();
  layout.add("big.weight", {512, 3136});  // past one chunk of product terms at rank 4 and more
  layout.add("odd.weight", {7, 5, 3});    // rows and columns of odd lengths: the halving's carry
  layout.add("head.bias", {13});          // 1-D: sent whole
  const size_t n = layout.numel();
  std::vector<float> wide = randomVector(n, 8);  // exponents far apart: every sum's order matters
  for (size_t i = 0; i < n; ++i) wide[i] *= std::ldexp(1.0f, static_cast<int>(i % 41) - 20);
  std::vector<float> huge = randomVector(n, 10);
  for (float& x : huge) x = std::clamp(x * 1e18f, -9e18f, 9e18f);
  const std::vector<std::vector<float>> inputs = {randomVector(n, 3), tiedValues(n, 4), wide, huge,
                                                  std::vector<float>(n, 0.0f)};
  for (const char* spec :
       {"acpsgd:rank=2", "acpsgd:rank=4,ef=false", "acpsgd:rank=1,ef_decay=0.5",
        "powersgd:rank=2,mode=local", "powersgd:rank=3,mode=local,warm_start=false",
        "powersgd:rank=4,mode=local,ef=false", "powersgd:rank=2", "powersgd:rank=5,ef=false"}) {
    const auto comp = compression::makeCompressor(spec);
    REQUIRE(torch_trainer::encodesOnDevice(*comp));
    const auto* acp = dynamic_cast<const compression::AcpSgdCompressor*>(comp.get());
    const compression::LowRankOptions o = *compression::lowRankOptionsOf(*comp);
    const bool two_phase = comp->phases() == 2;
    for (size_t i = 0; i < inputs.size(); ++i) {
      ClientState cpu_state(layout.fingerprint()), dev_state(layout.fingerprint());
      for (uint64_t round = 1; round <= 2; ++round) {
        INFO(spec << ", input " << i << ", round " << round);
        // ACP-SGD: Q fixed in round 1, P in round 2; PowerSGD's phase P: a shared Q.
        const SharedFactors shared = randomShared(
            layout, o, round == 2 && acp ? SharedFactors::Side::kP : SharedFactors::Side::kQ,
            20 + round);
        const bool shares = acp || two_phase;
        const compression::RoundContext ctx{7, round, 0, 5, shares ? &shared : nullptr};
        const std::vector<float> input = round == 1 ? inputs[i] : inputs[(i + 1) % inputs.size()];
        const auto cpu = comp->compressWithFeedback(layout, input, cpu_state, ctx);
        torch::Tensor acc = torch::from_blob(const_cast<float*>(input.data()),
                                             {static_cast<int64_t>(n)}, torch::kFloat32)
                                .to(device, /*non_blocking=*/false, /*copy=*/true);
        // The residual the host adds (error feedback's second round), added as the round on the
        // device adds it.
        if (const auto* live = comp->liveResidual(dev_state, round))
          acc.add_(torch::from_blob(const_cast<float*>(live->values.data()),
                                    {static_cast<int64_t>(n)}, torch::kFloat32)
                       .to(device));
        compression::StagedState staged;
        const bool keeps = comp->keepsBuffer();
        checkPayloadsEqual(cpu, torch_trainer::encodeOnDevice(*comp, layout, acc, keeps, ctx,
                                                              &dev_state, &staged));
        std::vector<float> kept = keeps ? toVector(acc) : std::vector<float>{};
        if (keeps && comp->usesErrorFeedback() && !two_phase && o.ef.decay != 1.0)
          for (float& x : kept) x *= static_cast<float>(o.ef.decay);
        comp->endFeedback(layout, dev_state, ctx, kept, staged);
        const auto* cr =
            cpu_state.find<compression::ResidualState>(compression::kResidualComponent);
        const auto* dr =
            dev_state.find<compression::ResidualState>(compression::kResidualComponent);
        REQUIRE((cr == nullptr) == (dr == nullptr));
        REQUIRE((cr != nullptr) == keeps);
        if (cr) CHECK(sameBits(cr->values, dr->values));
        checkPowerSgdStatesEqual(cpu_state, dev_state);
        if (two_phase) {
          // Phase Q on the host from either state: the same payloads and the same buffer left.
          const SharedFactors p_hat = randomShared(layout, o, SharedFactors::Side::kP, 40 + round);
          const compression::RoundContext q_ctx{7, round, 1, 5, &p_hat};
          checkPayloadsEqual(comp->compressWithFeedback(layout, {}, cpu_state, q_ctx),
                             comp->compressWithFeedback(layout, {}, dev_state, q_ctx));
        }
      }
    }
  }
}

// topKIndices against the full sort's order, on values with many ties, for k from 1 to n.
inline void checkTopKIndicesOrder(const torch::Device& device) {
  for (size_t n : {1u, 2u, 7u, 100u, 1001u}) {
    for (uint64_t seed : {1u, 2u}) {
      const std::vector<float> x = seed == 1 ? tiedValues(n, n) : randomVector(n, n);
      const torch::Tensor t =
          torch::from_blob(const_cast<float*>(x.data()), {static_cast<int64_t>(n)}, torch::kFloat32)
              .to(device, false, true);
      for (size_t k : {size_t{0}, size_t{1}, n / 3, n / 2, n - 1, n}) {
        INFO("n " << n << ", k " << k << ", seed " << seed);
        const torch::Tensor on_device = torch_trainer::topKIndices(t, static_cast<int64_t>(k));
        CHECK(on_device.device() == device);
        const torch::Tensor got = on_device.to(torch::kCPU);
        std::vector<uint32_t> want =
            k == 0 ? std::vector<uint32_t>{} : compression::selectTopKBySort(x, k);
        std::vector<uint32_t> have(got.data_ptr<int64_t>(), got.data_ptr<int64_t>() + got.numel());
        CHECK(have == want);
      }
    }
  }
}

}  // namespace starling::testing
