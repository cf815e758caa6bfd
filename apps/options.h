#pragma once
// Configuration for Starling's programs: every option has one dotted key ("round.deadline_ms")
// that is both its TOML key (`[round] deadline_ms = 60000` in the --config file) and its
// command-line flag (`--round.deadline_ms 60000`), which wins over the file (given twice, the
// last one wins, so a script can append overrides). Unknown keys, values
// of the wrong type and values out of range are ConfigErrors naming the key (and the file).
// --help lists every key with its default and explanation.
//
// One configuration file serves every program (apps/settings.h): a key another program uses is
// "foreign" here (declared after setOwners({"starling-sim"})). In the file it is checked like any
// key (type, range) and then ignored; on the command line it is an error naming its program;
// --help lists foreign keys only by section.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace starling::apps {

// An enum option's spellings, each with its value: the one table that Options::add (below) parses
// with and spellingOf() names a value by.
template <class E>
using Spellings = std::vector<std::pair<std::string, E>>;

// The spelling of `v` in `names`, or "?" when it has none.
template <class E>
const char* spellingOf(const Spellings<E>& names, E v) {
  for (const auto& [spelling, value] : names)
    if (value == v) return spelling.c_str();
  return "?";
}

class Options {
 public:
  // `description` is the --help header.
  explicit Options(std::string program, std::string description);
  ~Options();

  void add(const std::string& key, std::string* v, const std::string& help);
  void add(const std::string& key, bool* v, const std::string& help);
  void add(const std::string& key, double* v, const std::string& help, double lo, double hi);
  void add(const std::string& key, float* v, const std::string& help, double lo, double hi);
  // uint64_t is size_t on the LP64 targets we build for.
  void add(const std::string& key, uint64_t* v, const std::string& help, uint64_t lo, uint64_t hi);
  void add(const std::string& key, uint32_t* v, const std::string& help, uint64_t lo, uint64_t hi);
  void add(const std::string& key, int* v, const std::string& help, int64_t lo, int64_t hi);
  void add(const std::string& key, std::vector<std::string>* v, const std::string& help);
  // One of `names` (its spelling in the file and on the command line), stored as the enum value
  // paired with it: any other spelling is a ConfigError (a bad command line) listing them.
  template <class E>
  requires std::is_enum_v<E>
  void add(const std::string& key, E* v, const std::string& help,
           const std::vector<std::pair<std::string, E>>& names) {
    std::vector<std::string> spellings;
    size_t initial = names.size();
    for (size_t i = 0; i < names.size(); ++i) {
      spellings.push_back(names[i].first);
      if (names[i].second == *v) initial = i;
    }
    addChoice(key, std::move(spellings), initial, help,
              [v, names](size_t i) { *v = names[i].second; });
  }

  // The programs that use the keys added from now on: none (the default) for this program, or
  // other programs' names, which make them foreign here.
  void setOwners(std::vector<std::string> programs) { owners_ = std::move(programs); }

  // Whether `key` was set, on the command line or in the file (after parse).
  bool given(const std::string& key) const;

  // Parses the command line, then the --config file for keys the command line did not set.
  // Returns an exit code to return with (0 after --help, 2 for a bad command line or file), or -1
  // to go on. Prints errors.
  int parse(int argc, char** argv);
  const std::string& configFile() const { return config_file_; }

 private:
  struct Entry;
  struct FromToml;  // how the config file sets an option (toml++ stays out of this header)
  void addChoice(const std::string& key, std::vector<std::string> names, size_t initial,
                 const std::string& help, std::function<void(size_t)> set);
  void commitChoices();  // every choice's spelling into its enum (parse's last step)
  template <class T>
  CLI::Option* option(const std::string& key, T* v, const std::string& help, FromToml from_toml);
  std::string program_;
  std::unique_ptr<CLI::App> app_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::string config_file_;
  std::vector<std::string> owners_;
};

}  // namespace starling::apps
