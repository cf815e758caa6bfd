#include "core/param_layout.h"

#include "core/error.h"

namespace starling {
namespace {

constexpr uint64_t kFnvPrime = 0x100000001b3ull;

uint64_t fnvBytes(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
  return h;
}

uint64_t fnvU64(uint64_t h, uint64_t v) {
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(v >> (8 * i));
  return fnvBytes(h, le, 8);
}

}  // namespace

std::string describeShape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += "x";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

size_t ParamLayout::add(std::string name, std::vector<int64_t> shape) {
  STARLING_CHECK_ARG(!name.empty(), "ParamLayout: tensor #", tensors_.size(), " has an empty name");
  STARLING_CHECK_ARG(!by_name_.count(name), "ParamLayout: duplicate tensor name '", name, "'");
  size_t numel = 1;
  for (int64_t d : shape) {
    STARLING_CHECK_ARG(d > 0, "ParamLayout: tensor '", name, "' has a non-positive dimension in ",
                       describeShape(shape));
    STARLING_CHECK_ARG(numel <= kMaxTensorNumel / static_cast<size_t>(d), "ParamLayout: tensor '",
                       name, "' ", describeShape(shape), " has more than ", kMaxTensorNumel,
                       " elements");
    numel *= static_cast<size_t>(d);
  }
  TensorSpec spec{std::move(name), std::move(shape), numel_, numel};
  // The fingerprint is extended one tensor record at a time. Records are self-delimiting
  // (length-prefixed name, rank-prefixed shape), so no two different layouts hash the same input.
  uint64_t h = fingerprint_;
  h = fnvU64(h, spec.name.size());
  h = fnvBytes(h, spec.name.data(), spec.name.size());
  h = fnvU64(h, spec.shape.size());
  for (int64_t d : spec.shape) h = fnvU64(h, static_cast<uint64_t>(d));
  fingerprint_ = h;
  numel_ += numel;
  by_name_.emplace(spec.name, tensors_.size());
  tensors_.push_back(std::move(spec));
  return tensors_.size() - 1;
}

const TensorSpec& ParamLayout::tensor(size_t i) const {
  STARLING_CHECK_ARG(i < tensors_.size(), "ParamLayout: tensor index ", i, " out of range (",
                     tensors_.size(), " tensors)");
  return tensors_[i];
}

std::optional<size_t> ParamLayout::find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

void ParamLayout::checkBuffer(size_t n) const {
  STARLING_CHECK_ARG(n == numel_, "ParamLayout: buffer has ", n, " floats, layout needs ", numel_);
}

std::span<float> ParamLayout::slice(std::span<float> flat, size_t i) const {
  checkBuffer(flat.size());
  const TensorSpec& t = tensor(i);
  return flat.subspan(t.offset, t.numel);
}

std::span<const float> ParamLayout::slice(std::span<const float> flat, size_t i) const {
  checkBuffer(flat.size());
  const TensorSpec& t = tensor(i);
  return flat.subspan(t.offset, t.numel);
}

RowMatrixMap ParamLayout::matrix(std::span<float> flat, size_t i) const {
  auto s = slice(flat, i);
  const TensorSpec& t = tensors_[i];
  return RowMatrixMap(s.data(), static_cast<Eigen::Index>(t.rows()),
                      static_cast<Eigen::Index>(t.cols()));
}

ConstRowMatrixMap ParamLayout::matrix(std::span<const float> flat, size_t i) const {
  auto s = slice(flat, i);
  const TensorSpec& t = tensors_[i];
  return ConstRowMatrixMap(s.data(), static_cast<Eigen::Index>(t.rows()),
                           static_cast<Eigen::Index>(t.cols()));
}

std::string hexFingerprint(uint64_t fingerprint) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, fingerprint >>= 4)
    out[static_cast<size_t>(i)] = kDigits[fingerprint & 15];
  return out;
}

}  // namespace starling
