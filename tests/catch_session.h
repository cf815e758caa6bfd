#pragma once
// What every test binary's main does before Catch2 runs its tests (catch_main.cc, and the binaries
// with a main of their own): two warnings always on, so that a test which checks nothing fails
// instead of passing.
// - NoAssertions: a test case, or a leaf section, that made no assertion (one that returned early,
//   or whose checks all sat in a skipped branch).
// - NoTests: a name filter that matches no test. Catch2's discovery script (catch_discover_tests)
//   keeps test names in a CMake list, so a ';' in a TEST_CASE name cut it in two; ctest then ran
//   the cut name, which matched nothing, and Catch reported success (14 tests passed that way,
//   unrun, until 2026-11-28).
// Set here rather than on ctest's command line: Catch2 2.x takes one --warn there.
// Include after <catch2/catch.hpp> (with CATCH_CONFIG_RUNNER where the file defines main).
#include <catch2/catch.hpp>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace starling::testing {

// The tests registered again under a oneDNN ISA (tests/CMakeLists.txt: starling_isa_tests) run
// with DNNL_MAX_CPU_ISA set. Where that would repeat the default run -- a CPU without the ISA
// (oneDNN quietly uses a lesser one) or whose best it is (AVX2 on a CPU without AVX-512) -- the
// binary reports the test skipped instead (exit 77, ctest's SKIP_RETURN_CODE there). Returns 0 when
// the tests should run.
inline int skipRepeatedIsa() {
  const char* isa = std::getenv("DNNL_MAX_CPU_ISA");
  if (isa == nullptr) return 0;
  std::string name(isa);
  for (char& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const char* why = nullptr;
#if defined(__x86_64__) || defined(__i386__)
  if (name.rfind("AVX512", 0) == 0 && !__builtin_cpu_supports("avx512f")) {
    why = "this CPU has no AVX-512";
  } else if (name.rfind("AVX2", 0) == 0) {
    if (!__builtin_cpu_supports("avx2"))
      why = "this CPU has no AVX2";
    else if (!__builtin_cpu_supports("avx512f"))
      why = "AVX2 is this CPU's best: the default run";
  }
#endif
  if (why == nullptr) return 0;
  std::printf("skipped: DNNL_MAX_CPU_ISA=%s: %s\n", isa, why);
  return 77;
}

inline void failEmptyTests(Catch::Session& session) {
  Catch::ConfigData& c = session.configData();
  c.warnings = static_cast<Catch::WarnAbout::What>(c.warnings | Catch::WarnAbout::NoAssertions |
                                                   Catch::WarnAbout::NoTests);
}

}  // namespace starling::testing
