#include "apps/options.h"

#include <CLI/CLI.hpp>
#include <toml++/toml.h>

#include <cstdio>
#include <limits>
#include <map>

#include "core/error.h"

namespace starling::apps {

struct Options::Entry {
  std::string key;
  CLI::Option* option = nullptr;
  // Sets the value from the config file; throws ConfigError naming the key.
  std::function<void(const toml::node&, const std::string& where)> fromToml;
};

namespace {

[[noreturn]] void badType(const std::string& where, const char* expected) {
  STARLING_THROW(ConfigError, where, ": expected ", expected);
}

template <class T>
void checkRange(const std::string& where, T v, T lo, T hi) {
  if (v < lo || v > hi) STARLING_THROW(ConfigError, where, " = ", v, " is out of range [", lo, ", ", hi, "]");
}

// Flattens a TOML table into dotted keys (arrays are leaves).
void flatten(const toml::table& t, const std::string& prefix, std::map<std::string, const toml::node*>& out) {
  for (const auto& [k, node] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* sub = node.as_table())
      flatten(*sub, key, out);
    else
      out[key] = &node;
  }
}

}  // namespace

Options::Options(std::string program, std::string description)
    : program_(std::move(program)), app_(std::make_unique<CLI::App>(std::move(description), program_)) {
  app_->add_option("--config", config_file_, "TOML file with any of the keys below (the command line wins)");
  app_->get_formatter()->column_width(34);
}

Options::~Options() = default;

void Options::add(const std::string& key, std::string* v, const std::string& help) {
  auto e = std::make_unique<Entry>();
  e->key = key;
  e->option = app_->add_option("--" + key, *v, help)->capture_default_str()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  e->fromToml = [v](const toml::node& n, const std::string& where) {
    if (!n.is_string()) badType(where, "a string");
    *v = std::string(*n.value<std::string>());
  };
  entries_.push_back(std::move(e));
}

void Options::add(const std::string& key, bool* v, const std::string& help) {
  auto e = std::make_unique<Entry>();
  e->key = key;
  e->option = app_->add_option("--" + key, *v, help + " (true/false)")->capture_default_str()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  e->fromToml = [v](const toml::node& n, const std::string& where) {
    if (!n.is_boolean()) badType(where, "true or false");
    *v = *n.value<bool>();
  };
  entries_.push_back(std::move(e));
}

void Options::add(const std::string& key, double* v, const std::string& help, double lo, double hi) {
  auto e = std::make_unique<Entry>();
  e->key = key;
  e->option = app_->add_option("--" + key, *v, help)->capture_default_str()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->check(CLI::Range(lo, hi));
  e->fromToml = [v, lo, hi](const toml::node& n, const std::string& where) {
    if (!n.is_number()) badType(where, "a number");
    const double x = *n.value<double>();
    checkRange(where, x, lo, hi);
    *v = x;
  };
  entries_.push_back(std::move(e));
}

void Options::add(const std::string& key, float* v, const std::string& help, double lo, double hi) {
  auto e = std::make_unique<Entry>();
  e->key = key;
  e->option = app_->add_option("--" + key, *v, help)->capture_default_str()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->check(CLI::Range(lo, hi));
  e->fromToml = [v, lo, hi](const toml::node& n, const std::string& where) {
    if (!n.is_number()) badType(where, "a number");
    const double x = *n.value<double>();
    checkRange(where, x, lo, hi);
    *v = static_cast<float>(x);
  };
  entries_.push_back(std::move(e));
}

namespace {
template <class T>
std::function<void(const toml::node&, const std::string&)> integerFromToml(T* v, uint64_t lo, uint64_t hi) {
  return [v, lo, hi](const toml::node& n, const std::string& where) {
    if (!n.is_integer()) badType(where, "an integer");
    const int64_t x = *n.value<int64_t>();
    if (x < 0) STARLING_THROW(ConfigError, where, " = ", x, " must not be negative");
    checkRange(where, static_cast<uint64_t>(x), lo, hi);
    *v = static_cast<T>(x);
  };
}
}  // namespace

void Options::add(const std::string& key, uint64_t* v, const std::string& help, uint64_t lo, uint64_t hi) {
  auto e = std::make_unique<Entry>();
  e->key = key;
  e->option = app_->add_option("--" + key, *v, help)->capture_default_str()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->check(CLI::Range(lo, hi));
  e->fromToml = integerFromToml(v, lo, hi);
  entries_.push_back(std::move(e));
}

void Options::add(const std::string& key, uint32_t* v, const std::string& help, uint64_t lo, uint64_t hi) {
  auto e = std::make_unique<Entry>();
  e->key = key;
  e->option = app_->add_option("--" + key, *v, help)->capture_default_str()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->check(CLI::Range(lo, hi));
  e->fromToml = integerFromToml(v, lo, hi);
  entries_.push_back(std::move(e));
}

void Options::add(const std::string& key, int* v, const std::string& help, int64_t lo, int64_t hi) {
  auto e = std::make_unique<Entry>();
  e->key = key;
  e->option = app_->add_option("--" + key, *v, help)->capture_default_str()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->check(CLI::Range(lo, hi));
  e->fromToml = [v, lo, hi](const toml::node& n, const std::string& where) {
    if (!n.is_integer()) badType(where, "an integer");
    const int64_t x = *n.value<int64_t>();
    checkRange(where, x, lo, hi);
    *v = static_cast<int>(x);
  };
  entries_.push_back(std::move(e));
}

void Options::add(const std::string& key, std::vector<std::string>* v, const std::string& help) {
  auto e = std::make_unique<Entry>();
  e->key = key;
  e->option = app_->add_option("--" + key, *v, help)->capture_default_str()->delimiter(',');
  e->fromToml = [v](const toml::node& n, const std::string& where) {
    const auto* arr = n.as_array();
    if (!arr) badType(where, "an array of strings");
    v->clear();
    for (const auto& x : *arr) {
      if (!x.is_string()) badType(where, "an array of strings");
      v->push_back(std::string(*x.value<std::string>()));
    }
  };
  entries_.push_back(std::move(e));
}

int Options::parse(int argc, char** argv) {
  try {
    app_->parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app_->exit(e);
  }
  if (config_file_.empty()) return -1;
  try {
    toml::table t;
    try {
      t = toml::parse_file(config_file_);
    } catch (const toml::parse_error& e) {
      const auto& s = e.source();
      STARLING_THROW(ConfigError, config_file_, ":", s.begin.line, ":", s.begin.column, ": ", e.description());
    }
    std::map<std::string, const toml::node*> leaves;
    flatten(t, "", leaves);
    for (const auto& [key, node] : leaves) {
      Entry* entry = nullptr;
      for (auto& e : entries_)
        if (e->key == key) entry = e.get();
      if (!entry) STARLING_THROW(ConfigError, config_file_, ": unknown key '", key, "' (", program_, " --help lists them)");
      if (entry->option->count() > 0) continue;  // the command line wins
      entry->fromToml(*node, config_file_ + ": key '" + key + "'");
    }
  } catch (const starling::Error& e) {
    std::fprintf(stderr, "%s: %s\n", program_.c_str(), e.what());
    return 2;
  }
  return -1;
}

}  // namespace starling::apps
