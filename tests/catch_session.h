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

namespace starling::testing {

inline void failEmptyTests(Catch::Session& session) {
  Catch::ConfigData& c = session.configData();
  c.warnings = static_cast<Catch::WarnAbout::What>(c.warnings | Catch::WarnAbout::NoAssertions |
                                                   Catch::WarnAbout::NoTests);
}

}  // namespace starling::testing
