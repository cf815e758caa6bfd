#include "transport/key_text.h"

#include <zmq.h>

#include <fstream>
#include <iterator>

#include "core/error.h"
#include "transport/keys.h"

namespace starling::transport::detail {

namespace {
constexpr size_t kMaxKeyFileBytes = 64 * 1024;
}

std::string readSmallFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) STARLING_THROW(IoError, "cannot read ", path.string());
  std::string text;
  char buf[4096];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxKeyFileBytes)
      STARLING_THROW(ConfigError, path.string(), ": larger than ", kMaxKeyFileBytes,
                     " bytes: not a key file");
  }
  if (in.bad()) STARLING_THROW(IoError, "error reading ", path.string());
  return text;
}

std::string_view trim(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

std::optional<uint64_t> parseU64(std::string_view s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

std::optional<std::string> z85Decode(std::string_view s, size_t chars) {
  if (s.size() != chars || chars % 5 != 0) return std::nullopt;
  const std::string z(s);
  std::string bin(chars / 5 * 4, '\0');
  if (zmq_z85_decode(reinterpret_cast<uint8_t*>(bin.data()), z.c_str()) == nullptr)
    return std::nullopt;
  return bin;
}

KeyFields parseKeyText(std::string_view text, const std::string& where) {
  KeyFields f;
  int id_line = 0;
  int line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const size_t nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.empty() || line.front() == '#') continue;
    const auto bad = [&](auto&&... what) -> void {
      STARLING_THROW(ConfigError, where, ":", line_no, ": ", what...);
    };
    // The name is a token of [a-z0-9_-] (Z85 keys may contain '=', so no plain split at '=').
    size_t end = 0;
    while (end < line.size() &&
           ((line[end] >= 'a' && line[end] <= 'z') || (line[end] >= '0' && line[end] <= '9') ||
            line[end] == '-' || line[end] == '_'))
      ++end;
    const std::string_view name = line.substr(0, end);
    const std::string_view after = trim(line.substr(end));
    if (name.empty() || after.empty() || after.front() != '=')
      bad("expected `name = value`, got \"", line, "\"");
    const std::string_view value = trim(after.substr(1));
    if (name == "id") {
      if (id_line) bad("second id (first on line ", id_line, ")");
      f.id = parseU64(value);
      if (!f.id) bad("id must be a decimal integer in [0, 2^64), got \"", value, "\"");
      id_line = line_no;
    } else if (name == "public-key" || name == "secret-key") {
      const bool pub = name == "public-key";
      int& seen = pub ? f.public_line : f.secret_line;
      if (seen) bad("second ", name, " (first on line ", seen, ")");
      if (value.size() < 2 || value.front() != '"' || value.back() != '"')
        bad(name, " must be a quoted Z85 string: ", name, " = \"...\"");
      const std::string_view key = value.substr(1, value.size() - 2);
      if (!isZ85Key(key)) bad(name, " is not a 40-character Z85 CURVE key");
      (pub ? f.public_key : f.secret_key) = std::string(key);
      seen = line_no;
    } else if (name == "signing-key" || name == "signing-public-key" || name == "certificate") {
      const bool cert = name == "certificate";
      int& seen = cert                    ? f.certificate_line
                  : name == "signing-key" ? f.signing_line
                                          : f.signing_public_line;
      if (seen) bad("second ", name, " (first on line ", seen, ")");
      if (value.size() < 2 || value.front() != '"' || value.back() != '"')
        bad(name, " must be a quoted Z85 string: ", name, " = \"...\"");
      const std::string_view z85 = value.substr(1, value.size() - 2);
      const size_t chars = cert ? 80 : 40;
      if (!z85Decode(z85, chars))
        bad(name, " is not a ", chars, "-character Z85 string (", cert ? 64 : 32, " bytes)");
      (cert                    ? f.certificate
       : name == "signing-key" ? f.signing_key
                               : f.signing_public_key) = std::string(z85);
      seen = line_no;
    } else {
      bad("unknown name \"", name,
          "\" (expected id, public-key, secret-key, signing-key, signing-public-key or "
          "certificate)");
    }
  }
  return f;
}

}  // namespace starling::transport::detail
