#include "data/source.h"

#include <algorithm>
#include <charconv>
#include <filesystem>

#include "core/error.h"
#include "data/csv.h"

namespace starling::data {
namespace {

namespace fs = std::filesystem;

// The default file names: Fashion-MNIST's, wherever data.dir points.
bool isDefaultFashionMnist(const DataSource& s) {
  const DataSource d;
  return s.format == d.format && s.train == d.train && s.train_labels == d.train_labels;
}

// rows x cols from "ROWSxCOLS"; nothing for a bad spelling.
std::optional<std::pair<size_t, size_t>> parseShape(const std::string& s) {
  const size_t x = s.find('x');
  if (x == std::string::npos) return std::nullopt;
  size_t r = 0, c = 0;
  const char* b = s.data();
  const auto r1 = std::from_chars(b, b + x, r);
  const auto r2 = std::from_chars(b + x + 1, b + s.size(), c);
  if (r1.ec != std::errc() || r1.ptr != b + x || r2.ec != std::errc() || r2.ptr != b + s.size() ||
      r == 0 || c == 0)
    return std::nullopt;
  return std::pair{r, c};
}

// The file `name` of key `key`, relative to dir unless absolute; IoError naming both when absent.
std::string resolve(const DataSource& s, const std::string& key, const std::string& name) {
  if (name.empty())
    STARLING_THROW(ConfigError, "data.", key, " is empty: it names the file to read");
  const fs::path p = fs::path(name).is_absolute() ? fs::path(name) : fs::path(s.dir) / name;
  std::error_code ec;
  if (fs::exists(p, ec)) return p.string();
  const std::string str = p.string();
  if (s.format == "idx" && str.size() > 3 && str.compare(str.size() - 3, 3, ".gz") == 0 &&
      fs::exists(str.substr(0, str.size() - 3), ec))
    return str.substr(0, str.size() - 3);
  std::string hint;
  if (!fs::path(name).is_absolute() && !fs::is_directory(s.dir, ec))
    hint = " (data.dir = '" + s.dir + "' is not a folder)";
  if (isDefaultFashionMnist(s))
    hint +=
        ". These are Fashion-MNIST's files: install the Debian package dataset-fashion-mnist, "
        "or set data.dir to the folder that holds them, or set data.format, data.train, ... "
        "to your own data (starling-sim --help)";
  STARLING_THROW(IoError, "data.", key, " = '", name, "': ", str, ": no such file", hint);
}

// Runs a loader; its IoError (which starts with the faulty file's path) gets the key in front.
template <class F>
Dataset keyed(F&& load, const std::string& key, const std::string& labels_key,
              const std::string& labels_path) {
  try {
    return load();
  } catch (const IoError& e) {
    const std::string what = e.what();
    const bool labels =
        !labels_path.empty() && what.compare(0, labels_path.size(), labels_path) == 0;
    STARLING_THROW(IoError, "data.", labels ? labels_key : key, ": ", what);
  }
}

Dataset loadSplit(const DataSource& s, const std::string& key, const std::string& name,
                  const std::string& labels_name, std::string* path_out) {
  const std::string path = resolve(s, key, name);
  *path_out = path;
  if (s.format == "csv")
    return keyed([&] { return loadCsv(path, CsvOptions{.num_classes = s.num_classes}); }, key, "",
                 "");
  const std::string labels_key = key + "_labels";
  const std::string labels = resolve(s, labels_key, labels_name);
  return keyed(
      [&] {
        return loadIdx(path, labels,
                       IdxOptions{.num_classes = s.num_classes, .keep_bytes = s.keep_bytes});
      },
      key, labels_key, labels);
}

// The examples `picks` names (any order, repeats) of `d`, each once, in file order.
Dataset keepOnly(const Dataset& d, std::vector<size_t> picks) {
  std::sort(picks.begin(), picks.end());
  picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
  Dataset out;
  out.rows = d.rows;
  out.cols = d.cols;
  out.shape = d.shape;
  out.num_classes = d.num_classes;
  const size_t f = d.features();
  out.images.reserve(picks.size() * f);
  for (size_t i : picks) {
    STARLING_CHECK_ARG(i < d.size(), "loadDataSubset: example ", i, " picked from ", d.size());
    out.images.insert(out.images.end(), d.images.begin() + static_cast<ptrdiff_t>(i * f),
                      d.images.begin() + static_cast<ptrdiff_t>((i + 1) * f));
    out.labels.push_back(d.labels[i]);
  }
  return out;
}

// One split of loadDataSubset (no selector: no example, loadDataShapes).
Dataset loadSplitSubset(const DataSource& s, const std::string& key, const std::string& name,
                        const std::string& labels_name, const ExampleSelector* select,
                        std::string* path_out) {
  const std::string path = resolve(s, key, name);
  *path_out = path;
  if (s.format == "csv")
    return keyed(
        [&] {
          const Dataset all = loadCsv(path, CsvOptions{.num_classes = s.num_classes});
          return keepOnly(all,
                          select ? (*select)(all.labels, all.num_classes) : std::vector<size_t>{});
        },
        key, "", "");
  const std::string labels_key = key + "_labels";
  const std::string labels = resolve(s, labels_key, labels_name);
  const IdxOptions options{.num_classes = s.num_classes};
  return keyed(
      [&] {
        return select ? loadIdxSubset(path, labels, *select, options)
                      : loadIdxShape(path, labels, options);
      },
      key, labels_key, labels);
}

// The checks and views of loadData after both splits are read.
void finish(const DataSource& s, LoadedData& out) {
  if (out.test && out.test->features() != out.train.features())
    STARLING_THROW(ConfigError, "data.test (", out.test_path, ") holds ", describe(*out.test),
                   " but data.train (", out.train_path, ") holds ", describe(out.train),
                   ": the feature counts must agree");
  if (s.num_classes == 0 && out.test) {
    const uint32_t k = std::max(out.train.num_classes, out.test->num_classes);
    out.train.num_classes = out.test->num_classes = k;
  }
  if (!s.shape.empty()) {
    const auto [rows, cols] = *parseShape(s.shape);
    if (rows * cols != out.train.features())
      STARLING_THROW(ConfigError, "data.shape = '", s.shape, "' is ", rows * cols,
                     " values, but the examples of data.train (", out.train_path, ") have ",
                     out.train.features(), " features");
    for (Dataset* d : {&out.train, out.test ? &*out.test : nullptr})
      if (d) d->rows = rows, d->cols = cols;
  }
}

}  // namespace

void DataSource::validate() const {
  if (format != "idx" && format != "csv")
    STARLING_THROW(ConfigError, "data.format = '", format, "' is neither 'idx' nor 'csv'");
  if (num_classes == 1 || num_classes > 256)
    STARLING_THROW(ConfigError, "data.num_classes = ", num_classes,
                   " must be 0 (from the labels) or in [2, 256]");
  if (!shape.empty() && !parseShape(shape))
    STARLING_THROW(ConfigError, "data.shape = '", shape,
                   "' is not ROWSxCOLS with two positive whole numbers (e.g. 28x28)");
  if (train.empty()) STARLING_THROW(ConfigError, "data.train is empty: it names the file to read");
}

LoadedData loadData(const DataSource& s) {
  s.validate();
  LoadedData out;
  out.train = loadSplit(s, "train", s.train, s.train_labels, &out.train_path);
  if (!s.test.empty()) out.test = loadSplit(s, "test", s.test, s.test_labels, &out.test_path);
  finish(s, out);
  return out;
}

LoadedData loadDataSubset(const DataSource& s, const ExampleSelector& train_select,
                          const ExampleSelector& test_select) {
  s.validate();
  LoadedData out;
  // The test split first: with num_classes = 0 its labels count towards the classes the
  // training split's selector sees, as in loadData.
  uint32_t test_classes = 0;
  if (!s.test.empty()) {
    const ExampleSelector select = [&](const std::vector<uint8_t>& labels, uint32_t k) {
      test_classes = k;
      return test_select(labels, k);
    };
    out.test = loadSplitSubset(s, "test", s.test, s.test_labels, &select, &out.test_path);
  }
  const ExampleSelector select = [&](const std::vector<uint8_t>& labels, uint32_t k) {
    return train_select(labels, s.num_classes == 0 ? std::max(k, test_classes) : k);
  };
  out.train = loadSplitSubset(s, "train", s.train, s.train_labels, &select, &out.train_path);
  finish(s, out);
  return out;
}

LoadedData loadDataShapes(const DataSource& s) {
  s.validate();
  LoadedData out;
  out.train = loadSplitSubset(s, "train", s.train, s.train_labels, nullptr, &out.train_path);
  if (!s.test.empty())
    out.test = loadSplitSubset(s, "test", s.test, s.test_labels, nullptr, &out.test_path);
  finish(s, out);
  return out;
}

std::string describe(const Dataset& d) {
  const std::string image = std::to_string(d.rows) + "x" + std::to_string(d.cols);
  const std::string features = std::to_string(d.features()) + " features";
  std::string shape;
  for (size_t i = 0; i < d.shape.size(); ++i) {
    if (i) shape += 'x';
    shape += std::to_string(d.shape[i]);
  }
  std::string s = std::to_string(d.size()) + " examples of ";
  if (d.rows == 1)
    s += d.shape.size() > 1 ? shape + " (flat: " + features + ")" : features;
  else
    s += (shape.empty() || shape == image ? image : shape + " as " + image) + " (" + features + ")";
  return s + ", " + std::to_string(d.num_classes) + " classes";
}

}  // namespace starling::data
