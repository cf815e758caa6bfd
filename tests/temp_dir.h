#pragma once
// TempDir: a fresh folder under the system's temporary directory (mkdtemp), removed with everything
// in it when the object goes. For tests that write files (checkpoints, states, logs).
#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace starling::testing {

struct TempDir {
  explicit TempDir(const std::string& prefix = "starling-test") {
    std::string t = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + t);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path path;
};

}  // namespace starling::testing
