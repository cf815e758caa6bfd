#pragma once
// AlignedVector<T>: a std::vector whose first element starts on a kSimdAlign (64-byte) boundary.
//
// Why it exists: Eigen splits a vectorised loop over a buffer of unknown alignment into a scalar
// head (up to the first aligned packet), packets and a scalar tail, and where the head ends follows
// an address (Eigen 3.4):
// - a reduction taken directly over a buffer (a Map's or a row's sum(), mean(), prod(),
//   minCoeff()) peels by that buffer's address, so its summation order follows it;
// - an assignment peels by its destination's address, which matters wherever the scalar and the
//   packet code compute differently: exp (std::exp against Eigen's packet polynomial), colwise()
//   sums of a row-major matrix, the coefficient-based products Eigen picks for small matrices.
// (A reduction over an expression, such as norm(), dot() or cwiseAbs().sum(), does not peel.)
// So the last bits of a result followed where malloc had put a std::vector<float> (16-byte
// aligned, i.e. 0, 16, 32 or 48 bytes past a 64-byte boundary): a fresh trainer and one that had
// trained another client gave different models on AVX2 machines. Buffers that start on
// a 64-byte boundary, the widest vector of every CPU we build for (AVX-512; AVX2 and NEON divide
// it), make every such choice a function of the sizes alone. Offsets inside such a buffer (a tensor
// of a flat layout, a row of a matrix) are functions of the sizes too, so they keep the property.
//
// Code that reduces over a buffer it does not own should sum over an expression or copy it into
// one of these.
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace starling {

inline constexpr size_t kSimdAlign = 64;

inline bool isSimdAligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kSimdAlign == 0;
}

// A minimal allocator over the aligned operator new; stateless, so every instance compares equal.
template <class T>
struct SimdAllocator {
  static_assert(alignof(T) <= kSimdAlign, "SimdAllocator would under-align this type");
  using value_type = T;
  SimdAllocator() noexcept = default;
  template <class U>
  SimdAllocator(const SimdAllocator<U>&) noexcept {}  // NOLINT: rebinding is implicit by design
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kSimdAlign}));
  }
  void deallocate(T* p, size_t) noexcept { ::operator delete (p, std::align_val_t{kSimdAlign}); }
  template <class U>
  bool operator==(const SimdAllocator<U>&) const noexcept {
    return true;
  }
};

template <class T>
using AlignedVector = std::vector<T, SimdAllocator<T>>;

}  // namespace starling
