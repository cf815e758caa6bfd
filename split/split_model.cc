#include "split/split_model.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "torch_trainer/torch_trainer.h"

namespace starling::split {
namespace {

// Leaf tensors over a copy of `params` laid out by `layout`, with gradients when asked.
// Copies of the host values on `device` (copies on the CPU too: the caller's buffer stays theirs).
torch::Tensor toDevice(const torch::Tensor& host, const torch::Device& device) {
  return host.to(device, /*non_blocking=*/false, /*copy=*/true);
}

std::vector<torch::Tensor> leaves(const ParamLayout& layout, std::span<const float> params,
                                  bool grad, const torch::Device& device) {
  std::vector<torch::Tensor> out;
  out.reserve(layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    const auto& t = layout[i];
    auto v = toDevice(
        torch::from_blob(const_cast<float*>(params.data() + t.offset), t.shape, torch::kFloat32),
        device);
    if (grad) v.requires_grad_(true);
    out.push_back(std::move(v));
  }
  return out;
}

std::vector<float> flatGrads(const ParamLayout& layout, const std::vector<torch::Tensor>& ts) {
  std::vector<float> out(layout.numel(), 0.0f);
  for (size_t i = 0; i < layout.size(); ++i) {
    const auto g = ts[i].grad();
    if (!g.defined()) continue;
    const auto c = g.to(torch::kCPU).contiguous();
    std::copy_n(c.data_ptr<float>(), layout[i].numel,
                out.begin() + static_cast<std::ptrdiff_t>(layout[i].offset));
  }
  return out;
}

torch::Tensor conv(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  return torch::conv2d(x, w, b, /*stride=*/1, /*padding=*/2);
}

// The CNN in stages: 0 conv1+pool, 1 conv2+pool, 2 flatten+fc1+relu, 3 fc2. Stage s uses the
// tensors 2s and 2s+1 of the whole layout.
torch::Tensor cnnStage(int s, const torch::Tensor& h, const torch::Tensor& w,
                       const torch::Tensor& b) {
  switch (s) {
    case 0:
      return torch::max_pool2d(torch::relu(conv(h, w, b)), 2);
    case 1:
      return torch::max_pool2d(torch::relu(conv(h, w, b)), 2);
    case 2:
      return torch::relu(torch::linear(h.flatten(1), w, b));
    default:
      return torch::linear(h, w, b);
  }
}

// ---------------------------------------------------------------- architectures

// One model with cut points: its whole layout and initialization, and, for a cut (and a weight-side
// rank, and whether a skip connection across the cut is kept), the bottom and top layouts, the
// activation size and the two halves of the forward pass.
struct Arch {
  virtual ~Arch() = default;
  ParamLayout bottom, top;
  size_t act = 0;
  uint32_t rank = 0;
  // The index in full() of the projection a weight-side cut splits (SIZE_MAX: none), and of the
  // first tensor after the bottom's prefix of full() (the tensors [0, prefix) are the edge's).
  size_t split_proj = SIZE_MAX;
  size_t prefix = 0;
  virtual const ParamLayout& full() const = 0;
  virtual void init(std::span<float> p, uint64_t seed) const = 0;
  virtual torch::Tensor runBottom(const std::vector<torch::Tensor>& p,
                                  const torch::Tensor& x) const = 0;
  virtual torch::Tensor runTop(const std::vector<torch::Tensor>& p,
                               const torch::Tensor& a) const = 0;
  virtual std::string name() const = 0;

  // Which tensors of full() are the edge's: [0, prefix) unless an architecture sets on_edge itself
  // (the ResNet, whose BatchNorm buffers sit at the end of its layout).
  std::vector<bool> on_edge;
  // bottom = the edge's tensors of full() in order (+ "<layer>.svd_v"), top = ("<layer>.svd_u" +)
  // the others in order, without the split projection's weight.
  void layouts(const ParamLayout& f) {
    if (on_edge.empty())
      for (size_t i = 0; i < f.size(); ++i) on_edge.push_back(i < prefix);
    for (size_t i = 0; i < f.size(); ++i)
      if (on_edge[i]) bottom.add(f[i].name, f[i].shape);
    if (rank) {
      const auto& w = f[split_proj];
      const std::string layer = w.name.substr(0, w.name.rfind('.'));
      bottom.add(layer + ".svd_v", {static_cast<int64_t>(rank), w.shape[1]});
      top.add(layer + ".svd_u", {w.shape[0], static_cast<int64_t>(rank)});
    }
    for (size_t i = 0; i < f.size(); ++i)
      if (!on_edge[i] && i != split_proj) top.add(f[i].name, f[i].shape);
  }
  void checkRank(const ParamLayout& f, uint32_t r) {
    const auto& w = f[split_proj];
    const auto out = static_cast<uint32_t>(w.shape[0]), in = static_cast<uint32_t>(w.shape[1]);
    if (r > std::min(out, in))
      STARLING_THROW(ConfigError, "split: weight rank ", r, " exceeds ", w.name, "'s ", out, " x ",
                     in);
    rank = r;
  }
};

// McMahan et al.'s CNN as torch_trainer builds it ("cnn": the same layout and initialization).
struct CnnArch : Arch {
  std::unique_ptr<client::Trainer> whole;
  size_t rows, cols;
  int cut_stage;  // stages [0, cut_stage] run on the edge

  CnnArch(int cut, size_t r, size_t c, uint32_t classes, uint32_t weight_rank, bool keep_skip)
      : rows(r), cols(c), cut_stage(cut) {
    STARLING_CHECK_ARG(rows % 4 == 0 && cols % 4 == 0 && rows > 0 && cols > 0,
                       "split: the cnn needs image sides ", "that are multiples of 4, got ", rows,
                       "x", cols);
    if (!keep_skip)
      STARLING_THROW(ConfigError,
                     "split: the cnn has no skip connection across a cut (split.skip)");
    whole = torch_trainer::makeTorchTrainer("cnn", rows, cols, classes);
    const ParamLayout& f = whole->layout();
    STARLING_ENFORCE(f.size() == 8, "split: the cnn's layout has ", f.size(),
                     " tensors, 8 expected");
    prefix = 2 * static_cast<size_t>(cut_stage + 1);
    act = cut_stage == 0   ? 32 * (rows / 2) * (cols / 2)
          : cut_stage == 1 ? 64 * (rows / 4) * (cols / 4)
                           : 512;
    if (weight_rank) {
      // The projection right after the cut is linear for conv2 (fc1) and fc1 (fc2).
      if (cut_stage == 0)
        STARLING_THROW(
            ConfigError,
            "split: a weight-side cut needs a linear layer after the cut; after conv1 comes ",
            "conv2 (cut at conv2 or fc1)");
      split_proj = prefix;
      checkRank(f, weight_rank);
      act = weight_rank;
    }
    layouts(f);
  }
  const ParamLayout& full() const override { return whole->layout(); }
  void init(std::span<float> p, uint64_t seed) const override { whole->initParameters(p, seed); }
  std::string name() const override { return "cnn"; }

  torch::Tensor runBottom(const std::vector<torch::Tensor>& p,
                          const torch::Tensor& x) const override {
    torch::Tensor h =
        x.view({x.size(0), 1, static_cast<int64_t>(rows), static_cast<int64_t>(cols)});
    for (int s = 0; s <= cut_stage; ++s) h = cnnStage(s, h, p[2 * s], p[2 * s + 1]);
    h = h.flatten(1);
    if (rank) h = torch::linear(h, p[2 * static_cast<size_t>(cut_stage + 1)]);  // S_r V_r^T
    return h;
  }
  // Top stages from the flat activations a [n, act].
  torch::Tensor runTop(const std::vector<torch::Tensor>& p, const torch::Tensor& a) const override {
    torch::Tensor h = a;
    int first = cut_stage + 1;
    size_t i = 0;
    if (rank) {
      // U_r and the projection's bias finish the layer that was split (fc1 has its ReLU).
      h = torch::linear(h, p[0], p[1]);
      if (first == 2) h = torch::relu(h);
      ++first;
      i = 2;
    } else if (cut_stage == 0) {
      h = a.view({a.size(0), 32, static_cast<int64_t>(rows / 2), static_cast<int64_t>(cols / 2)});
    }
    for (int s = first; s < 4; ++s, i += 2) h = cnnStage(s, h, p[i], p[i + 1]);
    return h;
  }
};

// A small vision transformer over 4x4 image patches (rows/4 x cols/4 tokens), width 64, 4 heads,
// two pre-LN blocks (h1 = h + Attn(LN1(h)); out = h1 + FFN(LN2(h1)), FFN(z) = down(GELU(up(z))),
// hidden 256), then LN, the mean over tokens and a linear head. Cut points: "embed" (after the
// patch embedding and the position table), "block1" (after the first block), "ffn2" (inside the
// second block, before its FFN: the edge sends h1, the cloud runs LN2, the FFN and the skip). At
// "ffn2" the weight-side cut splits the FFN's up-projection (the paper's cut): the edge runs LN2
// and S_r V_r^T and sends r values per token, plus h1 for the skip connection across the cut unless
// the skip is removed (the paper's eliminated link: out = FFN(LN2(h1)), r values per token only).
struct VitArch : Arch {
  static constexpr int64_t kPatch = 4, kWidth = 64, kHeads = 4, kHidden = 256, kBlocks = 2;
  static constexpr size_t kPerBlock = 12;
  ParamLayout layout;
  int64_t rows, cols, tokens;
  int cut;  // 0 embed, 1 block1, 2 ffn2
  bool skip;

  VitArch(int c, size_t r, size_t co, uint32_t classes, uint32_t weight_rank, bool keep_skip)
      : rows(static_cast<int64_t>(r)), cols(static_cast<int64_t>(co)), cut(c), skip(keep_skip) {
    STARLING_CHECK_ARG(r % kPatch == 0 && co % kPatch == 0 && r > 0 && co > 0,
                       "split: the vit needs image sides ", "that are multiples of ", kPatch,
                       ", got ", r, "x", co);
    tokens = (rows / kPatch) * (cols / kPatch);
    layout.add("patch.weight", {kWidth, kPatch * kPatch});
    layout.add("patch.bias", {kWidth});
    layout.add("pos", {tokens, kWidth});
    for (int b = 1; b <= kBlocks; ++b) {
      const std::string k = "block" + std::to_string(b) + ".";
      layout.add(k + "ln1.weight", {kWidth});
      layout.add(k + "ln1.bias", {kWidth});
      layout.add(k + "attn.in_weight", {3 * kWidth, kWidth});
      layout.add(k + "attn.in_bias", {3 * kWidth});
      layout.add(k + "attn.out_weight", {kWidth, kWidth});
      layout.add(k + "attn.out_bias", {kWidth});
      layout.add(k + "ln2.weight", {kWidth});
      layout.add(k + "ln2.bias", {kWidth});
      layout.add(k + "ffn.up_weight", {kHidden, kWidth});
      layout.add(k + "ffn.up_bias", {kHidden});
      layout.add(k + "ffn.down_weight", {kWidth, kHidden});
      layout.add(k + "ffn.down_bias", {kWidth});
    }
    layout.add("ln.weight", {kWidth});
    layout.add("ln.bias", {kWidth});
    layout.add("head.weight", {static_cast<int64_t>(classes), kWidth});
    layout.add("head.bias", {static_cast<int64_t>(classes)});
    const size_t b2 = 3 + kPerBlock;                 // block2's first tensor
    prefix = cut == 0 ? 3 : cut == 1 ? b2 : b2 + 6;  // ffn2: block2 up to attn.out_bias on the edge
    act = static_cast<size_t>(tokens * kWidth);
    if (!keep_skip && cut != 2)
      STARLING_THROW(ConfigError,
                     "split: the vit's skip connection crosses the cut only at ffn2 (split.skip)");
    if (weight_rank) {
      if (cut != 2)
        STARLING_THROW(
            ConfigError,
            "split: the vit's weight-side cut splits the FFN's up-projection: cut at ffn2");
      prefix = b2 + 8;  // LN2 on the edge too
      split_proj = b2 + 8;
      checkRank(layout, weight_rank);
      act = static_cast<size_t>(tokens) * (weight_rank + (skip ? kWidth : 0));
    }
    layouts(layout);
  }
  const ParamLayout& full() const override { return layout; }
  std::string name() const override { return "vit"; }

  // Linear weights and the patch embedding uniform in +-1/sqrt(fan_in) (PyTorch's default bound),
  // biases 0, LayerNorm weights 1, the position table normal with sd 0.02.
  void init(std::span<float> p, uint64_t seed) const override {
    RngStream rng(StreamKey{seed, 0, kAnyClient, StreamPurpose::kTraining, 0x766974});
    for (size_t i = 0; i < layout.size(); ++i) {
      const auto& t = layout[i];
      float* v = p.data() + t.offset;
      const bool ln =
          t.name.find("ln") != std::string::npos && t.name.find(".weight") != std::string::npos;
      if (t.name == "pos") {
        for (size_t j = 0; j < t.numel; ++j) v[j] = static_cast<float>(0.02 * rng.normal());
      } else if (ln) {
        std::fill(v, v + t.numel, 1.0f);
      } else if (t.shape.size() == 2) {
        const double bound = 1.0 / std::sqrt(static_cast<double>(t.shape[1]));
        for (size_t j = 0; j < t.numel; ++j)
          v[j] = static_cast<float>(bound * (2.0 * rng.uniform() - 1.0));
      } else {
        std::fill(v, v + t.numel, 0.0f);
      }
    }
  }

  torch::Tensor ln(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& b) const {
    return torch::layer_norm(h, {kWidth}, w, b, 1e-5);
  }
  torch::Tensor attn(const torch::Tensor& z,
                     const torch::Tensor* p) const {  // p: in_w, in_b, out_w, out_b
    const int64_t n = z.size(0), dh = kWidth / kHeads;
    const auto qkv =
        torch::linear(z, p[0], p[1]).view({n, tokens, 3, kHeads, dh}).permute({2, 0, 3, 1, 4});
    const auto att =
        torch::softmax(torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) / std::sqrt(double(dh)), -1);
    const auto o = torch::matmul(att, qkv[2]).transpose(1, 2).reshape({n, tokens, kWidth});
    return torch::linear(o, p[2], p[3]);
  }
  torch::Tensor ffnRest(const torch::Tensor& u, const torch::Tensor& dw,
                        const torch::Tensor& db) const {
    return torch::linear(torch::gelu(u), dw, db);
  }
  // A whole block from the tensors t[0..11] (ln1 w b, attn 4, ln2 w b, up w b, down w b).
  torch::Tensor block(const torch::Tensor& h, const torch::Tensor* t) const {
    const auto h1 = h + attn(ln(h, t[0], t[1]), t + 2);
    return h1 + ffnRest(torch::linear(ln(h1, t[6], t[7]), t[8], t[9]), t[10], t[11]);
  }
  torch::Tensor head(const torch::Tensor& h, const torch::Tensor* t) const {
    return torch::linear(ln(h, t[0], t[1]).mean(1), t[2], t[3]);
  }

  torch::Tensor runBottom(const std::vector<torch::Tensor>& p,
                          const torch::Tensor& x) const override {
    const int64_t n = x.size(0), gr = rows / kPatch, gc = cols / kPatch;
    const auto patches = x.view({n, gr, kPatch, gc, kPatch})
                             .permute({0, 1, 3, 2, 4})
                             .reshape({n, tokens, kPatch * kPatch});
    torch::Tensor h = torch::linear(patches, p[0], p[1]) + p[2];
    if (cut >= 1) h = block(h, &p[3]);
    if (cut == 2) {
      const torch::Tensor* t = &p[3 + kPerBlock];
      h = h + attn(ln(h, t[0], t[1]), t + 2);  // h1
      if (rank) {
        const auto z =
            torch::linear(ln(h, t[6], t[7]), p[prefix]);  // S_r V_r^T LN2(h1): r per token
        h = skip ? torch::cat({z, h}, 2) : z;
      }
    }
    return h.reshape({n, -1});
  }
  torch::Tensor runTop(const std::vector<torch::Tensor>& p, const torch::Tensor& a) const override {
    const int64_t n = a.size(0);
    if (cut < 2) {
      torch::Tensor h = a.view({n, tokens, kWidth});
      size_t i = 0;
      if (cut == 0) {
        h = block(h, &p[0]);
        i = kPerBlock;
      }
      h = block(h, &p[i]);
      return head(h, &p[i + kPerBlock]);
    }
    torch::Tensor out;
    size_t i;
    if (!rank) {  // p: ln2 w b, up w b, down w b, head...
      const auto h1 = a.view({n, tokens, kWidth});
      const auto f = ffnRest(torch::linear(ln(h1, p[0], p[1]), p[2], p[3]), p[4], p[5]);
      out = skip ? h1 + f : f;
      i = 6;
    } else {  // p: svd_u, up bias, down w b, head...
      const int64_t r = rank;
      const auto v = a.view({n, tokens, r + (skip ? kWidth : 0)});
      const auto f = ffnRest(torch::linear(v.narrow(2, 0, r), p[0], p[1]), p[2], p[3]);
      out = skip ? v.narrow(2, r, kWidth) + f : f;
      i = 4;
    }
    return head(out, &p[i]);
  }
};

// torch_trainer's ResNet-8 ("resnet": the same layout and initialization): conv3x3 16 + BN + ReLU,
// three stages of one basic block (16, 32, 64 channels, strides 1, 2, 2), the mean over the image,
// a linear head. Cut points "layer1", "layer2", "layer3": after that stage's block (16 x rows x
// cols, 32 x rows/2 x cols/2, 64 x rows/4 x cols/4 values per example). The skip connections
// stay inside their blocks, on one side of the cut. BatchNorm normalizes with the batch's
// statistics in split steps and in evaluation alike (the running statistics, buffers at the end
// of the layout, travel with their part unchanged: each part is a flat vector the step does not
// write). No weight-side cut: a convolution follows every cut but the last, and the mean over the
// image precedes the head.
struct ResnetArch : Arch {
  std::unique_ptr<client::Trainer> whole;
  int64_t rows, cols;
  int cut;  // stages [1, cut] on the edge
  std::map<std::string, size_t> bottom_at, top_at;

  ResnetArch(int c, size_t r, size_t co, uint32_t classes, uint32_t weight_rank, bool keep_skip)
      : rows(static_cast<int64_t>(r)), cols(static_cast<int64_t>(co)), cut(c + 1) {
    STARLING_CHECK_ARG(r % 4 == 0 && co % 4 == 0 && r > 0 && co > 0,
                       "split: the resnet needs image sides that are ", "multiples of 4, got ", r,
                       "x", co);
    if (weight_rank)
      STARLING_THROW(
          ConfigError,
          "split: the resnet has no linear projection right after a cut (split.weight_rank)");
    if (!keep_skip)
      STARLING_THROW(ConfigError,
                     "split: the resnet has no skip connection across a cut (split.skip)");
    whole = torch_trainer::makeTorchTrainer("resnet", r, co, classes);
    const ParamLayout& f = whole->layout();
    for (size_t i = 0; i < f.size(); ++i) {
      const std::string& n = f[i].name;
      bool edge = n.rfind("conv1.", 0) == 0 || n.rfind("bn1.", 0) == 0;
      for (int s = 1; s <= cut; ++s)
        edge = edge || n.rfind("layer" + std::to_string(s) + ".", 0) == 0;
      on_edge.push_back(edge);
    }
    const int64_t ch = int64_t{16} << (cut - 1), div = int64_t{1} << (cut - 1);
    act = static_cast<size_t>(ch * (rows / div) * (cols / div));
    layouts(f);
    for (size_t i = 0; i < bottom.size(); ++i) bottom_at[bottom[i].name] = i;
    for (size_t i = 0; i < top.size(); ++i) top_at[top[i].name] = i;
  }
  const ParamLayout& full() const override { return whole->layout(); }
  void init(std::span<float> p, uint64_t seed) const override { whole->initParameters(p, seed); }
  std::string name() const override { return "resnet"; }

  struct Part {
    const std::vector<torch::Tensor>& p;
    const std::map<std::string, size_t>& at;
    const torch::Tensor& operator[](const std::string& n) const { return p[at.at(n)]; }
  };
  static torch::Tensor conv(const torch::Tensor& x, const torch::Tensor& w, int64_t stride,
                            int64_t pad) {
    return torch::conv2d(x, w, c10::nullopt, at::IntArrayRef(stride), at::IntArrayRef(pad));
  }
  static torch::Tensor bn(const torch::Tensor& x, const Part& t, const std::string& k) {
    return torch::batch_norm(x, t[k + ".weight"], t[k + ".bias"], t[k + ".running_mean"].detach(),
                             t[k + ".running_var"].detach(), /*training=*/true, 0.1, 1e-5, false);
  }
  static torch::Tensor stage(const torch::Tensor& h, const Part& t, int s) {
    const std::string k = "layer" + std::to_string(s) + ".0.";
    const int64_t stride = s == 1 ? 1 : 2;
    torch::Tensor o = torch::relu(bn(conv(h, t[k + "conv1.weight"], stride, 1), t, k + "bn1"));
    o = bn(conv(o, t[k + "conv2.weight"], 1, 1), t, k + "bn2");
    const torch::Tensor skip =
        s == 1 ? h : bn(conv(h, t[k + "downsample.0.weight"], stride, 0), t, k + "downsample.1");
    return torch::relu(o + skip);
  }
  torch::Tensor runBottom(const std::vector<torch::Tensor>& p,
                          const torch::Tensor& x) const override {
    const Part t{p, bottom_at};
    torch::Tensor h = x.view({x.size(0), 1, rows, cols});
    h = torch::relu(bn(conv(h, t["conv1.weight"], 1, 1), t, "bn1"));
    for (int s = 1; s <= cut; ++s) h = stage(h, t, s);
    return h.flatten(1);
  }
  torch::Tensor runTop(const std::vector<torch::Tensor>& p, const torch::Tensor& a) const override {
    const Part t{p, top_at};
    const int64_t ch = int64_t{16} << (cut - 1), div = int64_t{1} << (cut - 1);
    torch::Tensor h = a.view({a.size(0), ch, rows / div, cols / div});
    for (int s = cut + 1; s <= 3; ++s) h = stage(h, t, s);
    return torch::linear(h.mean({2, 3}), t["fc.weight"], t["fc.bias"]);
  }
};

std::unique_ptr<Arch> makeArch(const std::string& model, int cut, size_t rows, size_t cols,
                               uint32_t classes, uint32_t rank, bool keep_skip) {
  if (model == "cnn") return std::make_unique<CnnArch>(cut, rows, cols, classes, rank, keep_skip);
  if (model == "resnet")
    return std::make_unique<ResnetArch>(cut, rows, cols, classes, rank, keep_skip);
  return std::make_unique<VitArch>(cut, rows, cols, classes, rank, keep_skip);
}

}  // namespace

struct SplitModel::Impl {
  std::string model, cut;
  size_t rows = 0, cols = 0;
  uint32_t classes = 0;
  std::unique_ptr<Arch> arch;
  torch::Device cloud =
      torch::kCPU;  // where cloudStep and evaluate run; the edge's part runs on the CPU
  // The last edge forward pass.
  std::vector<torch::Tensor> edge_params;
  torch::Tensor edge_out;
  size_t edge_n = 0;

  torch::Tensor input(std::span<const float> x, size_t n) const {
    return torch::from_blob(
        const_cast<float*>(x.data()),
        {static_cast<int64_t>(n), 1, static_cast<int64_t>(rows), static_cast<int64_t>(cols)},
        torch::kFloat32);
  }
};

std::vector<std::string> SplitModel::cutPoints(const std::string& model) {
  if (model == "cnn") return {"conv1", "conv2", "fc1"};
  if (model == "vit") return {"embed", "block1", "ffn2"};
  if (model == "resnet") return {"layer1", "layer2", "layer3"};
  STARLING_THROW(ConfigError, "split: model '", model,
                 "' has no cut points (models with cut points: cnn, resnet, vit)");
}

SplitModel::SplitModel(const std::string& model, const std::string& cut, size_t rows, size_t cols,
                       uint32_t classes, uint32_t weight_rank, bool keep_skip)
    : impl_(std::make_unique<Impl>()) {
  const auto cuts = cutPoints(model);
  const auto it = std::find(cuts.begin(), cuts.end(), cut);
  if (it == cuts.end()) {
    std::string list;
    for (const auto& c : cuts) list += (list.empty() ? "" : ", ") + c;
    STARLING_THROW(ConfigError, "split: '", cut, "' is not a cut point of ", model, " (", list,
                   ")");
  }
  Impl& m = *impl_;
  m.model = model;
  m.cut = cut;
  m.rows = rows;
  m.cols = cols;
  m.classes = classes;
  m.arch = makeArch(model, static_cast<int>(it - cuts.begin()), rows, cols, classes, weight_rank,
                    keep_skip);
}

SplitModel::~SplitModel() = default;

const ParamLayout& SplitModel::full() const { return impl_->arch->full(); }
const ParamLayout& SplitModel::bottom() const { return impl_->arch->bottom; }
const ParamLayout& SplitModel::top() const { return impl_->arch->top; }
size_t SplitModel::activationSize() const { return impl_->arch->act; }
size_t SplitModel::features() const { return impl_->rows * impl_->cols; }
uint32_t SplitModel::classes() const { return impl_->classes; }

std::pair<std::vector<float>, std::vector<float>> SplitModel::cutParameters(
    std::span<const float> whole) const {
  const Arch& a = *impl_->arch;
  const ParamLayout& f = full();
  STARLING_CHECK_ARG(whole.size() == f.numel(), "split: ", whole.size(),
                     " parameters, the model has ", f.numel());
  std::vector<float> bottom, top;
  auto append = [&](std::vector<float>& to, size_t i) {
    to.insert(to.end(), whole.begin() + static_cast<std::ptrdiff_t>(f[i].offset),
              whole.begin() + static_cast<std::ptrdiff_t>(f[i].offset + f[i].numel));
  };
  for (size_t i = 0; i < f.size(); ++i)
    if (a.on_edge[i]) append(bottom, i);
  if (!a.rank) {
    for (size_t i = 0; i < f.size(); ++i)
      if (!a.on_edge[i]) append(top, i);
    return {std::move(bottom), std::move(top)};
  }
  // W = U S V^T, truncated: the edge gets S_r V_r^T, the cloud U_r, then the rest of the top
  // without W.
  const auto& ws = f[a.split_proj];
  torch::NoGradGuard no_grad;
  const auto w =
      torch::from_blob(const_cast<float*>(whole.data() + ws.offset), ws.shape, torch::kFloat32)
          .to(torch::kFloat64);
  // The ATen op: LibTorch 2.x removed the torch::linalg:: wrappers (torch/linalg.h).
  const auto [u, sv, vh] = torch::linalg_svd(w, /*full_matrices=*/false);
  const int64_t r = a.rank;
  const auto v_part =
      (sv.slice(0, 0, r).unsqueeze(1) * vh.slice(0, 0, r)).to(torch::kFloat32).contiguous();
  const auto u_part = u.slice(1, 0, r).to(torch::kFloat32).contiguous();
  bottom.insert(bottom.end(), v_part.data_ptr<float>(), v_part.data_ptr<float>() + v_part.numel());
  top.assign(u_part.data_ptr<float>(), u_part.data_ptr<float>() + u_part.numel());
  for (size_t i = 0; i < f.size(); ++i)
    if (!a.on_edge[i] && i != a.split_proj) append(top, i);
  STARLING_ENFORCE(bottom.size() == a.bottom.numel() && top.size() == a.top.numel(),
                   "split: weight-side cut sizes");
  return {std::move(bottom), std::move(top)};
}

std::string SplitModel::describe() const {
  const Arch& a = *impl_->arch;
  std::string s = impl_->model + " cut at " + impl_->cut;
  if (a.rank) s += " with the next projection split at rank " + std::to_string(a.rank);
  if (const auto* v = dynamic_cast<const VitArch*>(&a); v && !v->skip)
    s += ", the skip connection across it removed";
  return s + ": " + std::to_string(a.act) + " values per example, " +
         std::to_string(a.bottom.numel()) + " parameters on the edge, " +
         std::to_string(a.top.numel()) + " in the cloud";
}

void SplitModel::setCloudDevice(const torch_trainer::Device& device) {
  impl_->cloud = device.cuda()
                     ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device.index))
                     : torch::Device(torch::kCPU);
}

torch_trainer::Device SplitModel::cloudDevice() const {
  return impl_->cloud.is_cuda()
             ? torch_trainer::Device{torch_trainer::Device::Kind::kCuda, impl_->cloud.index()}
             : torch_trainer::Device{};
}

std::vector<float> SplitModel::initParameters(uint64_t seed) const {
  std::vector<float> p(full().numel());
  impl_->arch->init(p, seed);
  return p;
}

std::vector<float> SplitModel::edgeForward(std::span<const float> bottom_params,
                                           std::span<const float> x, size_t n) {
  Impl& m = *impl_;
  const Arch& a = *m.arch;
  STARLING_CHECK_ARG(bottom_params.size() == a.bottom.numel(), "split edge: ", bottom_params.size(),
                     " bottom parameters, the cut needs ", a.bottom.numel());
  STARLING_CHECK_ARG(n > 0 && x.size() == n * features(), "split edge: ", x.size(),
                     " input values for ", n, " examples of ", features());
  m.edge_params = leaves(a.bottom, bottom_params, true, torch::kCPU);
  m.edge_out = a.runBottom(m.edge_params, m.input(x, n));
  m.edge_n = n;
  const auto c = m.edge_out.detach().contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + n * a.act);
}

std::vector<float> SplitModel::edgeBackward(std::span<const float> grad_activations) {
  Impl& m = *impl_;
  STARLING_CHECK_ARG(m.edge_out.defined(), "split edge: a backward pass without a forward pass");
  const Arch& a = *m.arch;
  STARLING_CHECK_ARG(grad_activations.size() == m.edge_n * a.act,
                     "split edge: an activation gradient of ", grad_activations.size(),
                     " values, the forward pass produced ", m.edge_n * a.act);
  const auto g = torch::from_blob(const_cast<float*>(grad_activations.data()),
                                  {static_cast<int64_t>(m.edge_n), static_cast<int64_t>(a.act)},
                                  torch::kFloat32);
  m.edge_out.backward(g);
  auto out = flatGrads(a.bottom, m.edge_params);
  m.edge_out = torch::Tensor();
  m.edge_params.clear();
  return out;
}

SplitModel::CloudResult SplitModel::cloudStep(std::span<const float> top_params,
                                              std::span<const float> activations,
                                              std::span<const uint8_t> labels, size_t n) {
  Impl& m = *impl_;
  const Arch& ar = *m.arch;
  STARLING_CHECK_ARG(top_params.size() == ar.top.numel(), "split cloud: ", top_params.size(),
                     " top parameters, the cut needs ", ar.top.numel());
  STARLING_CHECK_ARG(n > 0 && activations.size() == n * ar.act && labels.size() == n,
                     "split cloud: ", activations.size(), " activation values and ", labels.size(),
                     " labels for ", n, " examples of ", ar.act);
  for (uint8_t l : labels)
    STARLING_CHECK_ARG(l < m.classes, "split cloud: label ", int{l}, " of ", m.classes, " classes");
  auto params = leaves(ar.top, top_params, true, m.cloud);
  auto a = toDevice(torch::from_blob(const_cast<float*>(activations.data()),
                                     {static_cast<int64_t>(n), static_cast<int64_t>(ar.act)},
                                     torch::kFloat32),
                    m.cloud)
               .requires_grad_(true);
  std::vector<int64_t> y(labels.begin(), labels.end());
  const auto target = torch::tensor(y, torch::kInt64).to(m.cloud);
  const auto logits = ar.runTop(params, a);
  const auto loss = torch::nn::functional::cross_entropy(logits, target);
  loss.backward();
  CloudResult r;
  r.loss = loss.item<double>();
  r.correct = static_cast<size_t>(logits.argmax(1).eq(target).sum().item<int64_t>());
  r.grad_top = flatGrads(ar.top, params);
  const auto ga = a.grad().to(torch::kCPU).contiguous();
  r.grad_activations.assign(ga.data_ptr<float>(), ga.data_ptr<float>() + n * ar.act);
  return r;
}

SplitModel::CloudResult SplitModel::evaluate(std::span<const float> bottom_params,
                                             std::span<const float> top_params,
                                             std::span<const float> x,
                                             std::span<const uint8_t> labels, size_t n) {
  Impl& m = *impl_;
  const Arch& ar = *m.arch;
  STARLING_CHECK_ARG(
      bottom_params.size() == ar.bottom.numel() && top_params.size() == ar.top.numel(),
      "split evaluate: parameter sizes do not fit the cut");
  STARLING_CHECK_ARG(x.size() == n * features() && labels.size() == n, "split evaluate: ", x.size(),
                     " inputs and ", labels.size(), " labels for ", n, " examples");
  torch::NoGradGuard no_grad;
  const auto bp = leaves(ar.bottom, bottom_params, false, m.cloud),
             tp = leaves(ar.top, top_params, false, m.cloud);
  std::vector<int64_t> y(labels.begin(), labels.end());
  const auto target = torch::tensor(y, torch::kInt64).to(m.cloud);
  const auto logits = ar.runTop(tp, ar.runBottom(bp, toDevice(m.input(x, n), m.cloud)));
  CloudResult r;
  r.loss = torch::nn::functional::cross_entropy(logits, target).item<double>();
  r.correct = static_cast<size_t>(logits.argmax(1).eq(target).sum().item<int64_t>());
  return r;
}

}  // namespace starling::split
