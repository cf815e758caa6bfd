#include "core/options.h"

#include <charconv>
#include <cmath>

#include "core/error.h"

namespace starling {
namespace {

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace

Spec Spec::parse(std::string_view text, std::string_view what) {
  Spec s;
  const auto colon = text.find(':');
  s.name = trim(text.substr(0, colon));
  if (s.name.empty()) STARLING_THROW(ConfigError, what, " spec '", text, "' has no name");
  if (colon == std::string_view::npos) return s;
  std::string_view rest = text.substr(colon + 1);
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos)
      STARLING_THROW(ConfigError, what, " spec '", text, "': option '", trim(item),
                     "' is not key=value");
    std::string key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    if (key.empty() || value.empty())
      STARLING_THROW(ConfigError, what, " spec '", text, "': option '", trim(item),
                     "' has an empty key or value");
    s.options.emplace_back(std::move(key), std::move(value));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return s;
}

OptionReader::OptionReader(const Spec& spec, std::string what)
    : prefix_(what + " '" + spec.name + "'") {
  for (const auto& kv : spec.options) {
    for (const auto& seen : values_)
      if (seen.first == kv.first)
        STARLING_THROW(ConfigError, prefix_, ": option '", kv.first, "' given twice");
    values_.push_back(kv);
  }
}

void OptionReader::bad(const std::string& key, const std::string& value,
                       const std::string& why) const {
  STARLING_THROW(ConfigError, prefix_, ": option ", key, "='", value, "' ", why);
}

std::optional<std::string> OptionReader::take(const std::string& key) {
  for (auto it = values_.begin(); it != values_.end(); ++it) {
    if (it->first != key) continue;
    std::string v = it->second;
    values_.erase(it);
    return v;
  }
  return std::nullopt;
}

double OptionReader::number(const std::string& key, double def) {
  auto v = take(key);
  if (!v) return def;
  double d = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), d);
  if (ec != std::errc() || p != v->data() + v->size() || !std::isfinite(d))
    bad(key, *v, "is not a finite number");
  return d;
}

uint32_t OptionReader::count(const std::string& key, uint32_t def) {
  auto v = take(key);
  if (!v) return def;
  uint32_t d = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), d);
  if (ec != std::errc() || p != v->data() + v->size())
    bad(key, *v, "is not a non-negative integer");
  return d;
}

bool OptionReader::flag(const std::string& key, bool def) {
  auto v = take(key);
  if (!v) return def;
  if (*v == "true" || *v == "1" || *v == "on") return true;
  if (*v == "false" || *v == "0" || *v == "off") return false;
  bad(key, *v, "is not true/false");
}

std::string OptionReader::choice(const std::string& key, const std::string& def,
                                 const std::set<std::string>& allowed) {
  auto v = take(key);
  if (!v) return def;
  if (!allowed.count(*v)) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    bad(key, *v, "must be one of: " + list);
  }
  return *v;
}

std::string OptionReader::text(const std::string& key, const std::string& def) {
  auto v = take(key);
  return v ? *v : def;
}

void OptionReader::finish(const std::string& accepted) {
  if (values_.empty()) return;
  STARLING_THROW(ConfigError, prefix_, ": unknown option '", values_.front().first,
                 "' (accepted: ", accepted.empty() ? "none" : accepted, ")");
}

}  // namespace starling
