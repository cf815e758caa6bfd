#pragma once
// ParamLayout: the model as an ordered list of named tensors laid out back to back in one
// contiguous float32 buffer. Every update, state and aggregate in Starling is a flat buffer read
// through a layout. The fingerprint (a hash of names and shapes, in order) lets both ends of a
// connection check that they speak about the same model before reading a single value.
#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace starling {

using RowMatrixMap =
    Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
using ConstRowMatrixMap =
    Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf>;

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // empty = scalar
  size_t offset = 0;           // into the flat buffer, in floats
  size_t numel = 0;

  // The matrix view used by low-rank compressors: [shape[0], numel / shape[0]].
  // A 1-D tensor of n is n x 1; a scalar is 1 x 1.
  size_t rows() const { return shape.empty() ? 1 : static_cast<size_t>(shape[0]); }
  size_t cols() const { return numel / rows(); }
};

class ParamLayout {
 public:
  // Largest tensor: indices travel as u32 on the wire.
  static constexpr size_t kMaxTensorNumel = 0xFFFFFFFEu;

  ParamLayout() = default;

  // Appends a tensor; returns its index. Names must be unique and non-empty, dimensions positive.
  size_t add(std::string name, std::vector<int64_t> shape);

  size_t size() const { return tensors_.size(); }
  bool empty() const { return tensors_.empty(); }
  size_t numel() const { return numel_; }
  const TensorSpec& operator[](size_t i) const { return tensors_[i]; }
  const TensorSpec& tensor(size_t i) const;
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  std::optional<size_t> find(const std::string& name) const;

  // 64-bit FNV-1a over, per tensor in order, its length-prefixed name and rank-prefixed shape.
  uint64_t fingerprint() const { return fingerprint_; }

  // Views into a flat buffer of exactly numel() floats (checked).
  std::span<float> slice(std::span<float> flat, size_t i) const;
  std::span<const float> slice(std::span<const float> flat, size_t i) const;
  RowMatrixMap matrix(std::span<float> flat, size_t i) const;
  ConstRowMatrixMap matrix(std::span<const float> flat, size_t i) const;

 private:
  void checkBuffer(size_t n) const;
  std::vector<TensorSpec> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  size_t numel_ = 0;
  uint64_t fingerprint_ = 0xcbf29ce484222325ull;  // FNV offset basis of the empty layout
};

// Human-readable "name[3x4]" for messages.
std::string describeShape(const std::vector<int64_t>& shape);

// A layout fingerprint as every program prints it: 16 hex digits (the server's banner, a refused
// registration, the client's own line), so that two of them can be compared by eye.
std::string hexFingerprint(uint64_t fingerprint);

}  // namespace starling
