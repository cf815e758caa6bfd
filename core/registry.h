#pragma once
// Registry<Product, Args...>: the one way Starling picks an implementation by name at run time
// (compressors, aggregation rules, server optimizers, partitioners, trainers, ...).
//
// A registry is an immutable table built once (a function-local static const in the module that
// owns the products): no global mutable state, no registration side effects. Each entry has a
// name, a one-line summary and its options ("key=default (meaning), ..."), and a factory that
// reads typed options from an OptionReader. make("name:key=value,...") parses the spec, rejects an
// unknown name (listing the registered ones), calls the factory, and rejects any option the
// factory did not read (listing the accepted ones). Every failure is a ConfigError.
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/options.h"

namespace starling {

template <class Product, class... Args>
class Registry {
 public:
  struct Entry {
    std::string name;
    std::string summary;
    std::string options;  // "key=default (meaning), ...": shown in --help and in errors
    std::function<std::unique_ptr<Product>(OptionReader&, Args...)> make;
  };

  // `what` names the kind of product in messages: "compressor", "aggregation rule", ...
  Registry(std::string what, std::vector<Entry> entries)
      : what_(std::move(what)), entries_(std::move(entries)) {
    for (size_t i = 0; i < entries_.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        STARLING_ENFORCE(entries_[i].name != entries_[j].name, what_, " '", entries_[i].name,
                         "' registered twice");
  }

  const std::string& what() const { return what_; }
  const std::vector<Entry>& entries() const { return entries_; }

  const Entry* find(std::string_view name) const {
    for (const auto& e : entries_)
      if (e.name == name) return &e;
    return nullptr;
  }

  // "a, b, c": the registered names, in registration order.
  std::string names() const {
    std::string s;
    for (const auto& e : entries_) s += (s.empty() ? "" : ", ") + e.name;
    return s;
  }

  // One line per entry: "  name: summary [options]", for --help texts.
  std::string help() const {
    std::string s;
    for (const auto& e : entries_) {
      s += "\n  " + e.name + ": " + e.summary;
      if (!e.options.empty()) s += " [" + e.options + "]";
    }
    return s;
  }

  const Entry& entry(std::string_view name) const {
    if (const Entry* e = find(name)) return *e;
    STARLING_THROW(ConfigError, "unknown ", what_, " '", name, "' (registered: ", names(), ")");
  }

  std::unique_ptr<Product> make(const Spec& spec, Args... args) const {
    const Entry& e = entry(spec.name);
    OptionReader reader(spec, what_);
    std::unique_ptr<Product> p = e.make(reader, std::forward<Args>(args)...);
    reader.finish(e.options);
    STARLING_ENFORCE(p != nullptr, what_, " factory '", e.name, "' returned nothing");
    return p;
  }

  std::unique_ptr<Product> make(std::string_view spec, Args... args) const {
    return make(Spec::parse(spec, what_), std::forward<Args>(args)...);
  }

 private:
  std::string what_;
  std::vector<Entry> entries_;
};

}  // namespace starling
