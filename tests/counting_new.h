#pragma once
// Replaces the global allocation functions of ONE test binary: include this header from exactly
// one of its source files (it defines non-inline functions). It counts allocations and bytes,
// records the largest single request, and can make the n-th allocation fail with std::bad_alloc
// for fault injection (set `count` to 0, then `fail_at` to n; -1 turns it off).
//
// The aligned forms (C++17 align_val_t; core/aligned.h's AlignedVector uses them) are counted too,
// so a buffer that moved to aligned storage does not drop out of the count. The nothrow forms are
// replaced too: Catch2 allocates with new(std::nothrow) and frees with plain
// delete, so under AddressSanitizer a libasan nothrow new paired with our free() would be reported
// as an alloc-dealloc mismatch. With every form ours, the sanitizer's checks stay on.
// noinline: GCC would otherwise inline the malloc/free pairs into callers and warn about a
// new/free mismatch that is not one.
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace starling::testing::alloc {
inline std::atomic<long> count{0};    // allocations so far
inline std::atomic<long> bytes{0};    // bytes requested so far
inline std::atomic<long> largest{0};  // the largest single request so far
inline std::atomic<long> fail_at{
    -1};  // fail when `count` reaches this (before counting it); -1: never

// Records one request; false if it must fail.
inline bool record(size_t n) {
  const long c = count.fetch_add(1, std::memory_order_relaxed);
  const long f = fail_at.load(std::memory_order_relaxed);
  if (f >= 0 && c == f) return false;
  bytes.fetch_add(static_cast<long>(n), std::memory_order_relaxed);
  long seen = largest.load(std::memory_order_relaxed);
  while (static_cast<long>(n) > seen &&
         !largest.compare_exchange_weak(seen, static_cast<long>(n))) {
  }
  return true;
}
}  // namespace starling::testing::alloc

__attribute__((noinline)) void* operator new(size_t n) {
  if (!starling::testing::alloc::record(n)) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void* operator new(size_t n, const std::nothrow_t&) noexcept {
  if (!starling::testing::alloc::record(n)) return nullptr;
  return std::malloc(n ? n : 1);
}
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, size_t) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
__attribute__((noinline)) inline void* alignedAllocate(size_t n, std::align_val_t al) noexcept {
  const auto a = static_cast<size_t>(al);
  const size_t rounded = ((n ? n : 1) + a - 1) / a * a;  // aligned_alloc wants a multiple of a
  return std::aligned_alloc(a, rounded);
}
__attribute__((noinline)) void* operator new(size_t n, std::align_val_t al) {
  if (!starling::testing::alloc::record(n)) throw std::bad_alloc();
  if (void* p = alignedAllocate(n, al)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void* operator new(size_t n, std::align_val_t al,
                                             const std::nothrow_t&) noexcept {
  if (!starling::testing::alloc::record(n)) return nullptr;
  return alignedAllocate(n, al);
}
__attribute__((noinline)) void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, size_t, std::align_val_t) noexcept {
  std::free(p);
}
__attribute__((noinline)) void operator delete(void* p, std::align_val_t,
                                               const std::nothrow_t&) noexcept {
  std::free(p);
}
