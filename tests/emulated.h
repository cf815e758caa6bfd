#pragma once
// kEmulated: the test binary runs under an emulator (the arm64 cross build's tests run under
// qemu-aarch64, about 100x slower on Eigen's vector code than natively). A heavy test then runs a
// smaller case of the same check: the same code paths, fewer sizes or samples. Natively, false.
//
// kSanitized: the binary is built with AddressSanitizer (make test-asan's `debug` preset). Eigen's
// instrumented loops run 20 to 60x slower there than in the Release build, where a handful of
// tests spent most of the sanitizer run (the Eigen trainers' address test 352 s, the allocation
// test 266 s). What the sanitizers look for, a bad access or undefined behaviour on a code path,
// shows at any size, so those tests take the emulator's smaller case there too (kReduced). The
// Release run of `make test` keeps every full case.
namespace starling::testing {
#ifdef STARLING_TEST_EMULATED
inline constexpr bool kEmulated = true;
#else
inline constexpr bool kEmulated = false;
#endif
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif
inline constexpr bool kReduced = kEmulated || kSanitized;
}  // namespace starling::testing
