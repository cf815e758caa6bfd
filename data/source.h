#pragma once
// Where a program's training and test data come from: the `data.*` keys of starling-sim
// (docs/simulation.md, "Data"). The defaults are Fashion-MNIST from the Debian package.
//
//   format = "idx"  train, train_labels, test, test_labels: an IDX features file and its label
//                   file per split (data/idx.h: any type, any example shape, gzip or plain)
//   format = "csv"  train, test: one CSV file per split, label first (data/csv.h)
//
// Relative file names are taken in `dir`. An IDX name ending in ".gz" that does not exist is also
// looked for without ".gz" (an unpacked copy). An empty `test` means no test set.
// The two splits must have the same feature count. The number of classes is `num_classes`, or
// else the largest label of either split + 1; both splits get it. `shape` ("ROWSxCOLS") views every
// example as an image of that many rows and columns (a CNN on CSV rows), which must multiply to the
// feature count.
//
// Errors name the key and the file: a missing file is an IoError "data.train_labels = 'x': /dir/x:
// no such file", a bad file is the loader's IoError (path first) behind the key, and a bad value or
// a mismatch between the splits is a ConfigError naming the keys.
#include <cstdint>
#include <optional>
#include <string>

#include "data/idx.h"

namespace starling::data {

struct DataSource {
  std::string format = "idx";
  std::string dir = kDefaultFashionMnistDir;
  std::string train = "train-images-idx3-ubyte.gz";
  std::string train_labels = "train-labels-idx1-ubyte.gz";
  std::string test = "t10k-images-idx3-ubyte.gz";
  std::string test_labels = "t10k-labels-idx1-ubyte.gz";
  uint32_t num_classes = 0;  // 0: from the data
  std::string shape;         // "" or "ROWSxCOLS"
  // loadData keeps unsigned-byte IDX features as bytes (Dataset::pixels): for programs that
  // train with the LibTorch trainer only (starling-sim). Not a configuration key.
  bool keep_bytes = false;

  // Checks what can be checked without reading a file (format, shape syntax, num_classes).
  void validate() const;
};

struct LoadedData {
  Dataset train;
  std::optional<Dataset> test;
  std::string train_path, test_path;  // the features files (or CSV files) read, for messages
};

LoadedData loadData(const DataSource& source);

// A deployed client's part of the data: loadData's files, checks and shape, keeping only the
// examples `train_select` and `test_select` pick from each split (data/idx.h, ExampleSelector; in
// file order, each once: subsetPositions maps the picks onto them). IDX files are streamed, so
// memory is the kept examples; a CSV file is read whole, then cut. The selectors see the classes
// loadData gives (with num_classes = 0 the largest label of either split + 1): a partition
// computed from them is the simulator's. Without a test split, `test_select` is not called.
LoadedData loadDataSubset(const DataSource& source, const ExampleSelector& train_select,
                          const ExampleSelector& test_select);

// loadData's shapes and classes without its examples (IDX: the headers and the labels; a CSV
// file is read whole): what a server needs to build its clients' model.
LoadedData loadDataShapes(const DataSource& source);

// For messages: "60000 examples of 28x28 (784 features), 10 classes", "600 examples of 16
// features, 3 classes", "50000 examples of 3x32x32 (flat: 3072 features), 10 classes".
std::string describe(const Dataset& d);

}  // namespace starling::data
