#pragma once
// CHECK_THROWS_MATCHING(expr, Type, matcher): expr throws Type, and the exception's what()
// satisfies the string matcher (Catch2 2.x's CHECK_THROWS_MATCHES matches the exception object,
// not its message). On failure Catch prints the actual message. Evaluates expr twice.
#include <catch2/catch.hpp>
#include <functional>

#include "core/input_error.h"

#define CHECK_THROWS_MATCHING(expr, Type, matcher) \
  do {                                             \
    CHECK_THROWS_AS(expr, Type);                   \
    CHECK_THROWS_WITH(expr, matcher);              \
  } while (0)

namespace starling::testing {

// The Errc of the InputError `f` throws; the test fails when it throws none.
inline Errc codeOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.code();
  }
  FAIL("no InputError");
  return Errc::kMalformed;
}

}  // namespace starling::testing
