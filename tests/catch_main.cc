// The main of every test binary that has none of its own: Catch2's, with failEmptyTests.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.h"

int main(int argc, char** argv) {
  if (const int skip = starling::testing::skipRepeatedIsa(); skip != 0) return skip;
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  starling::testing::failEmptyTests(session);
  return session.run();
}
