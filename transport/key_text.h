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
  // The signing lines (Z85 as written: 40, 40 and 80 characters).
  std::optional<std::string> signing_key, signing_public_key, certificate;
  int signing_line = 0, signing_public_line = 0, certificate_line = 0;
};

// Reads a file of at most 64 KiB (IoError if unreadable, ConfigError if larger).
std::string readSmallFile(const std::filesystem::path& path);
// Parses `name = value` lines; `where` (the file name) prefixes every ConfigError with ":line".
KeyFields parseKeyText(std::string_view text, const std::string& where);
// A decimal uint64 without sign or leading spaces; nullopt on anything else or overflow.
std::optional<uint64_t> parseU64(std::string_view s);
// The bytes of a Z85 string of `chars` characters (a multiple of 5); nullopt when it is not one.
std::optional<std::string> z85Decode(std::string_view s, size_t chars);
// s without leading and trailing blanks (space, tab, CR).
std::string_view trim(std::string_view s);

}  // namespace starling::transport::detail
