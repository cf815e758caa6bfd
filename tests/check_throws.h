#pragma once
// CHECK_THROWS_MATCHING(expr, Type, matcher): expr throws Type, and the exception's what()
// satisfies the string matcher (Catch2 2.x's CHECK_THROWS_MATCHES matches the exception object,
// not its message). On failure Catch prints the actual message. Evaluates expr twice.
#include <catch2/catch.hpp>

#define CHECK_THROWS_MATCHING(expr, Type, matcher) \
  do {                                             \
    CHECK_THROWS_AS(expr, Type);                   \
    CHECK_THROWS_WITH(expr, matcher);              \
  } while (0)
