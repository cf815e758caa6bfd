#include "apps/options.h"

#include <toml++/toml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>

#include "core/error.h"

namespace starling::apps {

// Sets an option's value from the config file; throws ConfigError naming the key.
struct Options::FromToml {
  std::function<void(const toml::node&, const std::string& where)> set;
};

struct Options::Entry {
  std::string key;
  CLI::Option* option = nullptr;
  FromToml fromToml;
  std::vector<std::string> owners;  // empty: this program's key; else the programs that use it
  bool from_file = false;           // set by the --config file
  // A choice (addChoice): the spelling given, and what stores it once parsed.
  std::unique_ptr<std::string> choice;
  std::vector<std::string> choices;
  std::function<void(size_t)> set_choice;
};

namespace {

[[noreturn]] void badType(const std::string& where, const char* expected) {
  STARLING_THROW(ConfigError, where, ": expected ", expected);
}

template <class T>
void checkRange(const std::string& where, T v, T lo, T hi) {
  if (v < lo || v > hi)
    STARLING_THROW(ConfigError, where, " = ", v, " is out of range [", lo, ", ", hi, "]");
}

// Flattens a TOML table into dotted keys (arrays are leaves).
void flatten(const toml::table& t, const std::string& prefix,
             std::map<std::string, const toml::node*>& out) {
  for (const auto& [k, node] : t) {
    const std::string key =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* sub = node.as_table())
      flatten(*sub, key, out);
    else
      out[key] = &node;
  }
}

}  // namespace

Options::Options(std::string program, std::string description)
    : program_(std::move(program)),
      app_(std::make_unique<CLI::App>(std::move(description), program_)) {
  app_->add_option("--config", config_file_,
                   "TOML file with any of the keys below (the command line wins)");
  app_->get_formatter()->column_width(34);
}

Options::~Options() = default;

// Registers `--key` (given twice, the last wins) and how the config file sets it.
template <class T>
CLI::Option* Options::option(const std::string& key, T* v, const std::string& help,
                             FromToml from_toml) {
  auto e = std::make_unique<Entry>();
  e->key = key;
  e->owners = owners_;
  e->option = app_->add_option("--" + key, *v, help)->capture_default_str();
  // A foreign key stays out of --help (its sections are listed in the footer, parse()).
  if (!owners_.empty()) e->option->group("");
  e->fromToml = std::move(from_toml);
  entries_.push_back(std::move(e));
  return entries_.back()->option;
}

namespace {

// A number from the file, checked against [lo, hi] (integers also non-negative for unsigned T).
template <class T, class Wide>
std::function<void(const toml::node&, const std::string&)> numberFromToml(T* v, Wide lo, Wide hi) {
  return [v, lo, hi](const toml::node& n, const std::string& where) {
    if constexpr (std::is_floating_point_v<T>) {
      if (!n.is_number()) badType(where, "a number");
      const double x = *n.value<double>();
      checkRange(where, x, static_cast<double>(lo), static_cast<double>(hi));
      *v = static_cast<T>(x);
    } else {
      if (!n.is_integer()) badType(where, "an integer");
      const int64_t x = *n.value<int64_t>();
      if constexpr (std::is_unsigned_v<T>) {
        if (x < 0) STARLING_THROW(ConfigError, where, " = ", x, " must not be negative");
        checkRange(where, static_cast<uint64_t>(x), static_cast<uint64_t>(lo),
                   static_cast<uint64_t>(hi));
      } else {
        checkRange(where, x, static_cast<int64_t>(lo), static_cast<int64_t>(hi));
      }
      *v = static_cast<T>(x);
    }
  };
}

}  // namespace

void Options::add(const std::string& key, std::string* v, const std::string& help) {
  option(key, v, help, {[v](const toml::node& n, const std::string& where) {
           if (!n.is_string()) badType(where, "a string");
           *v = std::string(*n.value<std::string>());
         }})
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

void Options::add(const std::string& key, bool* v, const std::string& help) {
  option(key, v, help + " (true/false)", {[v](const toml::node& n, const std::string& where) {
           if (!n.is_boolean()) badType(where, "true or false");
           *v = *n.value<bool>();
         }})
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

void Options::add(const std::string& key, double* v, const std::string& help, double lo,
                  double hi) {
  option(key, v, help, {numberFromToml(v, lo, hi)})
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->check(CLI::Range(lo, hi));
}

void Options::add(const std::string& key, float* v, const std::string& help, double lo, double hi) {
  option(key, v, help, {numberFromToml(v, lo, hi)})
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->check(CLI::Range(lo, hi));
}

void Options::add(const std::string& key, uint64_t* v, const std::string& help, uint64_t lo,
                  uint64_t hi) {
  option(key, v, help, {numberFromToml(v, lo, hi)})
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->check(CLI::Range(lo, hi));
}

void Options::add(const std::string& key, uint32_t* v, const std::string& help, uint64_t lo,
                  uint64_t hi) {
  option(key, v, help, {numberFromToml(v, lo, hi)})
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->check(CLI::Range(lo, hi));
}

void Options::add(const std::string& key, int* v, const std::string& help, int64_t lo, int64_t hi) {
  option(key, v, help, {numberFromToml(v, lo, hi)})
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->check(CLI::Range(lo, hi));
}

void Options::add(const std::string& key, std::vector<std::string>* v, const std::string& help) {
  option(key, v, help, {[v](const toml::node& n, const std::string& where) {
           const auto* arr = n.as_array();
           if (!arr) badType(where, "an array of strings");
           v->clear();
           for (const auto& x : *arr) {
             if (!x.is_string()) badType(where, "an array of strings");
             v->push_back(std::string(*x.value<std::string>()));
           }
         }})
      ->delimiter(',');
}

void Options::addChoice(const std::string& key, std::vector<std::string> names, size_t initial,
                        const std::string& help, std::function<void(size_t)> set) {
  STARLING_CHECK_ARG(initial < names.size(), "option ", key,
                     ": its default is not one of its names");
  auto holder = std::make_unique<std::string>(names[initial]);
  std::string* shadow = holder.get();
  std::string listed;
  for (const auto& n : names) listed += (listed.empty() ? "" : ", ") + n;
  CLI::Option* opt =
      option(key, shadow, help + " (" + listed + ")",
             {[shadow, names, listed](const toml::node& n, const std::string& where) {
               if (!n.is_string()) badType(where, "a string");
               const std::string x(*n.value<std::string>());
               if (std::find(names.begin(), names.end(), x) == names.end())
                 STARLING_THROW(ConfigError, where, " = '", x, "' is not one of ", listed);
               *shadow = x;
             }});
  opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->check(CLI::Validator(
          [names, listed](std::string& x) -> std::string {
            if (std::find(names.begin(), names.end(), x) != names.end()) return {};
            return "'" + x + "' is not one of " + listed;
          },
          "", "choice"));
  Entry& e = *entries_.back();
  e.choice = std::move(holder);
  e.choices = std::move(names);
  e.set_choice = std::move(set);
}

void Options::commitChoices() {
  for (const auto& e : entries_)
    if (e->set_choice) {
      const auto it = std::find(e->choices.begin(), e->choices.end(), *e->choice);
      e->set_choice(static_cast<size_t>(it - e->choices.begin()));
    }
}

bool Options::given(const std::string& key) const {
  for (const auto& e : entries_)
    if (e->key == key) return e->from_file || e->option->count() > 0;
  STARLING_THROW(InvalidArgument, "Options::given: no key '", key, "'");
}

int Options::parse(int argc, char** argv) {
  // The footer of --help: which sections belong to which other program.
  std::map<std::string, std::vector<std::string>> foreign;  // program -> "section.*" or keys
  for (const auto& e : entries_) {
    if (e->owners.empty()) continue;
    const std::string section = e->key.substr(0, e->key.find('.'));
    bool mine = false;  // does this program use any key of the section?
    for (const auto& o : entries_)
      if (o->owners.empty() && o->key.compare(0, section.size() + 1, section + ".") == 0)
        mine = true;
    // A key without a section (starling-split's role and device) is named as it is.
    const bool sectioned = e->key.find('.') != std::string::npos;
    const std::string name = mine || !sectioned ? e->key : section + ".*";
    for (const auto& program : e->owners) {  // listed under each program that uses it
      auto& v = foreign[program];
      if (std::find(v.begin(), v.end(), name) == v.end()) v.push_back(name);
    }
  }
  if (!foreign.empty()) {
    std::string footer =
        "\nOne configuration file serves the simulation and the deployment "
        "(docs/configuration.md). "
        "These keys of the other programs are accepted in --config (checked, then ignored here), "
        "not on the command line:";
    for (const auto& [program, names] : foreign) {
      footer += "\n  " + program + ":";
      for (const auto& n : names) footer += " " + n;
    }
    app_->footer(footer);
  }
  try {
    app_->parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help: CLI11 prints it. A mistake is printed as every other error of the program is (its
    // name first), and every bad command line exits 2, like a bad configuration file (CLI11's own
    // codes, e.g. 105 for a value out of range, would differ by the kind of mistake).
    if (e.get_exit_code() == 0) return app_->exit(e);
    std::fprintf(stderr, "%s: %s\nRun with --help for more information.\n", program_.c_str(),
                 e.what());
    return 2;
  }
  for (const auto& e : entries_)
    if (!e->owners.empty() && e->option->count() > 0) {
      std::string owners;
      for (const auto& p : e->owners) owners += (owners.empty() ? "" : " and ") + p;
      std::fprintf(stderr,
                   "%s: --%s is a key of %s, which %s does not use (it may stay in a "
                   "shared --config file)\n",
                   program_.c_str(), e->key.c_str(), owners.c_str(), program_.c_str());
      return 2;
    }
  if (config_file_.empty()) {
    commitChoices();
    return -1;
  }
  try {
    toml::table t;
    try {
      t = toml::parse_file(config_file_);
    } catch (const toml::parse_error& e) {
      const auto& s = e.source();
      STARLING_THROW(ConfigError, config_file_, ":", s.begin.line, ":", s.begin.column, ": ",
                     e.description());
    }
    std::map<std::string, const toml::node*> leaves;
    flatten(t, "", leaves);
    for (const auto& [key, node] : leaves) {
      Entry* entry = nullptr;
      for (auto& e : entries_)
        if (e->key == key) entry = e.get();
      if (!entry)
        STARLING_THROW(ConfigError, config_file_, ": unknown key '", key, "' (", program_,
                       " --help lists them)");
      if (entry->option->count() > 0) continue;  // the command line wins
      entry->fromToml.set(*node, config_file_ + ": key '" + key + "'");
      entry->from_file = true;
    }
  } catch (const starling::Error& e) {
    std::fprintf(stderr, "%s: %s\n", program_.c_str(), e.what());
    return 2;
  }
  commitChoices();
  return -1;
}

}  // namespace starling::apps
