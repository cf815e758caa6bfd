#pragma once
// Typed "name:key=value,key=value" specs, shared by every registry (compressors, aggregators,
// server optimizers). Unknown keys, repeated keys and malformed values are ConfigErrors that name
// the component, the key and what is accepted.
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace starling {

struct Spec {
  std::string name;
  std::vector<std::pair<std::string, std::string>> options;
  // "name" or "name:key=value,...". Throws ConfigError on an empty name or a malformed option.
  static Spec parse(std::string_view text, std::string_view what);
};

// Reads typed options by key. Every key must be consumed: finish() rejects the rest.
class OptionReader {
 public:
  OptionReader(const Spec& spec, std::string what);
  double number(const std::string& key, double def);
  uint32_t count(const std::string& key, uint32_t def);
  bool flag(const std::string& key, bool def);
  std::string choice(const std::string& key, const std::string& def,
                     const std::set<std::string>& allowed);
  // A free-form value (a file path), trimmed; it cannot contain ',' (the option separator).
  std::string text(const std::string& key, const std::string& def);
  // Throws on any key not read; `accepted` lists the keys in the message.
  void finish(const std::string& accepted);

 private:
  std::optional<std::string> take(const std::string& key);
  [[noreturn]] void bad(const std::string& key, const std::string& value,
                        const std::string& why) const;
  std::string prefix_;
  std::vector<std::pair<std::string, std::string>> values_;
};

}  // namespace starling
