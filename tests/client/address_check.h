#pragma once
// A trainer's results must be functions of the model, the data, the configuration and the seed,
// never of where the caller's buffers or the trainer's own scratch happen to lie (Eigen
// peeled a different number of leading elements for each alignment, so a fresh trainer and one
// that had trained another client gave different bits on AVX2 machines).
//
// checkAddressIndependence() trains and evaluates the same client again and again, each time with
// - params, FedProx's anchor and SCAFFOLD's correction at another 4-byte offset from a 64-byte
//   boundary (4, 8, ..., 64 bytes: every alignment a float can have against the widest vector),
// - the data set's images copied, best effort, to another 16-byte residue modulo 64 (malloc gives
//   16-byte aligned blocks; the copy is retried behind other allocations; under ASan, or for a
//   block malloc takes from mmap, the residue may not move, and the check goes on with it),
// - a fresh trainer made after a different number of small allocations (so its scratch may lie
//   elsewhere), and the trainer of the first run, warmed by another client with larger batches,
// and checks that every trained model and every evaluation equals the first bit for bit.
//
// Where it can fail: only where a vector is wider than malloc's 16-byte alignment (AVX, AVX-512).
// On SSE-only x86 builds and on arm64 (NEON, 16 bytes) every malloc'd buffer is already aligned
// for the widest vector, so the bug it guards against cannot happen and the check always passes.
// The parameters, the anchor and the correction are placed exactly under any allocator.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "client/trainer.h"
#include "core/aligned.h"
#include "core/rng.h"

namespace starling::testing {

// A float buffer whose data starts `offset_bytes` past a 64-byte boundary.
class PlacedFloats {
 public:
  PlacedFloats(std::span<const float> values, size_t offset_bytes)
      : buf_(values.size() + kSimdAlign / sizeof(float)), offset_(offset_bytes / sizeof(float)) {
    std::copy(values.begin(), values.end(), buf_.begin() + static_cast<ptrdiff_t>(offset_));
    size_ = values.size();
  }
  std::span<float> span() { return {buf_.data() + offset_, size_}; }
  std::vector<float> values() const {
    return {buf_.begin() + static_cast<ptrdiff_t>(offset_),
            buf_.begin() + static_cast<ptrdiff_t>(offset_ + size_)};
  }

 private:
  AlignedVector<float> buf_;
  size_t offset_, size_ = 0;
};

// Allocations held for a while so that later ones land elsewhere.
struct HeapNoise {
  std::vector<std::unique_ptr<char[]>> blocks;
  std::vector<data::Dataset> copies;
  void add(size_t bytes) { blocks.push_back(std::make_unique<char[]>(bytes)); }
};

// A copy of d whose images start `residue` bytes past a 64-byte boundary if the allocator lets it
// (best effort: the trainers gather batches into their own buffers, so this is a second line).
// A missed copy is kept in `noise` (freed, malloc would hand its block to the next copy), with a
// block sized past malloc's per-size caches behind it, which moves the next copy by 16 bytes or so.
inline data::Dataset placedCopy(const data::Dataset& d, size_t residue, HeapNoise& noise) {
  for (size_t tries = 0; tries < 256; ++tries) {
    data::Dataset c = d;
    if (reinterpret_cast<uintptr_t>(c.images.data()) % kSimdAlign == residue) return c;
    noise.copies.push_back(std::move(c));
    noise.add(2056 + 16 * (tries % 4));
  }
  return d;
}

struct AddressCheckConfig {
  client::FitConfig fit;            // prox_anchor and correction are set by the check
  bool prox_and_correction = true;  // also run with FedProx's and SCAFFOLD's terms
};

inline void checkAddressIndependence(const std::function<std::unique_ptr<client::Trainer>()>& make,
                                     const data::Dataset& d, const AddressCheckConfig& c) {
  auto first = make();
  const size_t n = first->layout().numel();
  std::vector<float> global(n);
  first->initParameters(global, 7);
  // A correction and an anchor that differ from the start, so both terms change the steps.
  std::vector<float> correction(n), anchor(global);
  RngStream draws(StreamKey{5, 0, 0, StreamPurpose::kTest, 3});
  for (size_t i = 0; i < n; ++i) {
    correction[i] = static_cast<float>(0.01 * draws.normal());
    anchor[i] += static_cast<float>(0.05 * draws.normal());
  }
  std::vector<size_t> client, other;
  for (size_t i = 0; i < d.size(); ++i) (i % 4 == 1 ? other : client).push_back(i);

  struct Result {
    std::vector<float> model;
    double eval_loss = 0, eval_accuracy = 0, train_loss = 0;
  };
  const auto run = [&](client::Trainer& t, size_t offset, const data::Dataset& data, bool terms) {
    PlacedFloats params(global, offset), a(anchor, offset), corr(correction, offset);
    client::FitConfig cfg = c.fit;
    if (terms) {
      cfg.prox_mu = 0.1;
      cfg.prox_anchor = a.span();
      cfg.correction = corr.span();
    }
    RngStream rng(StreamKey{11, 2, 3, StreamPurpose::kTraining, 0});
    const client::FitResult fit = t.fit(params.span(), client::DataView{&data, client}, cfg, rng);
    Result r;
    r.model = params.values();
    for (const auto& m : fit.metrics)
      if (m.name == "train_loss") r.train_loss = m.value;
    // Evaluate the trained model from another placement than the one it was trained in.
    PlacedFloats eval_params(r.model, (offset + 20) % kSimdAlign);
    const client::EvalResult e = t.evaluate(eval_params.span(), client::DataView{&data, client});
    r.eval_loss = e.loss;
    r.eval_accuracy = e.accuracy;
    return r;
  };
  const auto same = [](const Result& x, const Result& y) {
    return x.model.size() == y.model.size() &&
           std::memcmp(x.model.data(), y.model.data(), x.model.size() * sizeof(float)) == 0 &&
           x.eval_loss == y.eval_loss && x.eval_accuracy == y.eval_accuracy &&
           x.train_loss == y.train_loss;
  };

  for (const bool terms : {false, true}) {
    if (terms && !c.prox_and_correction) continue;
    INFO("FedProx and SCAFFOLD terms: " << terms);
    const Result ref = run(*first, 0, d, terms);
    REQUIRE(ref.model != global);  // training moved the model
    for (size_t offset = 4; offset <= kSimdAlign; offset += 4) {
      INFO("buffers " << offset << " bytes past a 64-byte boundary");
      HeapNoise noise;
      const data::Dataset placed = placedCopy(d, offset % kSimdAlign / 16 * 16, noise);
      for (size_t i = 0; i < offset / 4; ++i) noise.add(8 + 24 * i);
      auto fresh = make();
      CHECK(same(run(*fresh, offset % kSimdAlign, placed, terms), ref));
      // The first trainer, after another client with larger batches grew its scratch.
      client::FitConfig big = c.fit;
      big.batch_size = c.fit.batch_size * 3 + 1;
      std::vector<float> scratch_model = global;
      RngStream rng(StreamKey{11, 2, 4, StreamPurpose::kTraining, 0});
      first->fit(scratch_model, client::DataView{&d, other}, big, rng);
      CHECK(same(run(*first, offset % kSimdAlign, placed, terms), ref));
    }
  }
}

}  // namespace starling::testing
