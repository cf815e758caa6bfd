#pragma once
// AlignedVector<T>: a std::vector whose first element starts on a kSimdAlign (64-byte) boundary.
//
// Why it exists: Eigen's vectorised reductions over a Map of unknown alignment (sum, norm, dot,
// colwise sums, the coefficient-based products it picks for small matrices) first peel scalar
// elements up to the first aligned packet, and how many they peel follows the buffer's address.
// Another split into scalar head and packets is another summation order, so the last bits of the
// result followed where malloc had put a std::vector<float> (16-byte aligned, i.e. 0, 16, 32 or 48
// bytes past a 64-byte boundary): a fresh trainer and one that had trained another client gave
// different models (issue 18). Buffers that start on a 64-byte boundary, the widest vector of
// every CPU we build for (AVX-512; AVX2 and NEON divide it), make every such choice a function of
// the sizes alone. Offsets inside such a buffer (a tensor of a flat layout, a row of a matrix) are
// functions of the sizes too, so they keep the property.
//
// Code that sums over a buffer it does not own should not rely on this: core/reduce.h sums in an
// order fixed by the index.
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
  using value_type = T;
  SimdAllocator() noexcept = default;
  template <class U>
  SimdAllocator(const SimdAllocator<U>&) noexcept {}  // NOLINT: rebinding is implicit by design
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{kSimdAlign}));
  }
  void deallocate(T* p, size_t) noexcept { ::operator delete(p, std::align_val_t{kSimdAlign}); }
  template <class U>
  bool operator==(const SimdAllocator<U>&) const noexcept {
    return true;
  }
};

template <class T>
using AlignedVector = std::vector<T, SimdAllocator<T>>;

}  // namespace starling
