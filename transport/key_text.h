#pragma once
// Internal: the line parser shared by key files and allow-list files (format in keys.h).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace starling::transport::detail {

struct KeyFields {
  std::optional<uint64_t> id;
  std::optional<std::string> public_key, secret_key;
  int public_line = 0, secret_line = 0;
};

// Reads a file of at most 64 KiB (IoError if unreadable, ConfigError if larger).
std::string readSmallFile(const std::filesystem::path& path);
// Parses `name = value` lines; `where` (the file name) prefixes every ConfigError with ":line".
KeyFields parseKeyText(std::string_view text, const std::string& where);
// A decimal uint64 without sign or leading spaces; nullopt on anything else or overflow.
std::optional<uint64_t> parseU64(std::string_view s);
// s without leading and trailing blanks (space, tab, CR).
std::string_view trim(std::string_view s);

}  // namespace starling::transport::detail
