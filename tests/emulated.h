#pragma once
// kEmulated: the test binary runs under an emulator (the arm64 cross build's tests run under
// qemu-aarch64, about 100x slower on Eigen's vector code than natively). A heavy test then runs a
// smaller case of the same check: the same code paths, fewer sizes or samples. Natively, false.
namespace starling::testing {
#ifdef STARLING_TEST_EMULATED
inline constexpr bool kEmulated = true;
#else
inline constexpr bool kEmulated = false;
#endif
}  // namespace starling::testing
