#include "data/source.h"

#include <catch2/catch.hpp>
#include <fstream>

#include "check_throws.h"
#include "core/error.h"
#include "data/idx_files.h"

using namespace starling;
using namespace starling::data;
using Catch::Matchers::Contains;
using starling::testing::TempDir;

namespace {

void writeText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// An IDX pair of n examples of rows x cols unsigned bytes, labels as given.
void writeIdxPair(const TempDir& dir, const std::string& images, const std::string& labels,
                  uint32_t rows, uint32_t cols, const std::vector<uint8_t>& y) {
  const auto n = static_cast<uint32_t>(y.size());
  std::vector<uint8_t> px(n * rows * cols);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i % 251);
  testing::writeGzip(dir.file(images), testing::imageFileBytes(n, rows, cols, px));
  testing::writePlain(dir.file(labels), testing::labelFileBytes(n, y));
}

DataSource idxSource(const TempDir& dir) {
  DataSource s;
  s.dir = dir.path().string();
  s.train = "tr-x.gz";
  s.train_labels = "tr-y";
  s.test = "te-x.gz";
  s.test_labels = "te-y";
  return s;
}

}  // namespace

TEST_CASE("the data source loads IDX and CSV splits with classes and features from the data",
          "[data]") {
  TempDir dir;
  SECTION("idx") {
    writeIdxPair(dir, "tr-x.gz", "tr-y", 4, 6, {0, 1, 2, 1});
    writeIdxPair(dir, "te-x.gz", "te-y", 4, 6, {4, 0});  // the test split has a class train lacks
    const LoadedData d = loadData(idxSource(dir));
    CHECK(d.train.size() == 4);
    REQUIRE(d.test);
    CHECK(d.test->size() == 2);
    CHECK(d.train.rows == 4);
    CHECK(d.train.cols == 6);
    CHECK(d.train.num_classes == 5);  // the largest label of either split + 1
    CHECK(d.test->num_classes == 5);
    CHECK(d.train_path == dir.file("tr-x.gz"));
    CHECK(describe(d.train) == "4 examples of 4x6 (24 features), 5 classes");
  }
  SECTION("csv, absolute names, no test set") {
    writeText(dir.file("train.csv"), "label,a,b,c,d\n3,1,2,3,4\n1,5,6,7,8\n");
    DataSource s;
    s.format = "csv";
    s.dir = "/nonexistent";  // absolute names do not use it
    s.train = dir.file("train.csv");
    s.test = "";
    const LoadedData d = loadData(s);
    CHECK_FALSE(d.test);
    CHECK(d.train.num_classes == 4);
    CHECK(d.train.features() == 4);
    CHECK(describe(d.train) == "2 examples of 4 features, 4 classes");
    // Viewed as an image for a CNN.
    s.shape = "2x2";
    const LoadedData img = loadData(s);
    CHECK(img.train.rows == 2);
    CHECK(img.train.cols == 2);
    CHECK(describe(img.train) == "2 examples of 4 as 2x2 (4 features), 4 classes");
    Dataset cube;  // a 3-dimensional example is flat
    cube.rows = 1;
    cube.cols = 3072;
    cube.shape = {3, 32, 32};
    cube.num_classes = 10;
    CHECK(describe(cube) == "0 examples of 3x32x32 (flat: 3072 features), 10 classes");
    s.shape = "3x2";
    CHECK_THROWS_MATCHING(loadData(s), ConfigError,
                          Contains("data.shape = '3x2' is 6 values") &&
                              Contains("have 4 features") && Contains(dir.file("train.csv")));
  }
  SECTION("a given number of classes is kept") {
    writeIdxPair(dir, "tr-x.gz", "tr-y", 2, 2, {0, 1});
    writeIdxPair(dir, "te-x.gz", "te-y", 2, 2, {1});
    DataSource s = idxSource(dir);
    s.num_classes = 10;
    CHECK(loadData(s).train.num_classes == 10);
    s.num_classes = 1;
    CHECK_THROWS_MATCHING(loadData(s), ConfigError, Contains("data.num_classes = 1"));
    s.num_classes = 2;
    writeIdxPair(dir, "te-x.gz", "te-y", 2, 2, {1, 2});
    CHECK_THROWS_MATCHING(
        loadData(s), IoError,
        Contains("data.test_labels: " + dir.file("te-y")) &&
            Contains("label 2 of example 1 is not below the number of classes, 2"));
  }
}

TEST_CASE("data source errors name the key and the file", "[data]") {
  TempDir dir;
  writeIdxPair(dir, "tr-x.gz", "tr-y", 3, 3, {0, 1, 1});
  writeIdxPair(dir, "te-x.gz", "te-y", 3, 3, {1});
  DataSource s = idxSource(dir);
  SECTION("missing files") {
    s.train_labels = "nope";
    CHECK_THROWS_MATCHING(loadData(s), IoError,
                          Contains("data.train_labels = 'nope'") && Contains(dir.file("nope")) &&
                              Contains("no such file"));
    s = idxSource(dir);
    s.test = "missing.gz";
    CHECK_THROWS_MATCHING(loadData(s), IoError, Contains("data.test = 'missing.gz'"));
    s = idxSource(dir);
    s.dir = dir.file("no-such-folder");
    CHECK_THROWS_MATCHING(loadData(s), IoError,
                          Contains("data.train = 'tr-x.gz'") && Contains("is not a folder"));
    // The defaults are Fashion-MNIST's: the message says where to get it.
    DataSource fm;
    fm.dir = dir.file("no-such-folder");
    CHECK_THROWS_MATCHING(loadData(fm), IoError,
                          Contains("dataset-fashion-mnist") && Contains("data.format"));
  }
  SECTION("an unpacked copy is found for a .gz name") {
    testing::writePlain(dir.file("plain-x"),
                        testing::imageFileBytes(1, 3, 3, std::vector<uint8_t>(9, 1)));
    s.test = "plain-x.gz";
    s.test_labels = "te-y";
    CHECK(loadData(s).test_path == dir.file("plain-x"));
  }
  SECTION("a bad file: the loader's message behind the right key") {
    testing::writePlain(dir.file("bad-y"), testing::labelFileBytes(3, {0, 1}));  // one label short
    s.train_labels = "bad-y";
    CHECK_THROWS_MATCHING(
        loadData(s), IoError,
        Contains("data.train_labels: " + dir.file("bad-y")) && Contains("truncated"));
    s = idxSource(dir);
    testing::writePlain(dir.file("bad-x"), testing::imageFileBytes(3, 3, 3, {}, 0x00000f03));
    s.train = "bad-x";
    CHECK_THROWS_MATCHING(loadData(s), IoError,
                          Contains("data.train: " + dir.file("bad-x")) && Contains("wrong magic"));
  }
  SECTION("splits with different feature counts") {
    writeIdxPair(dir, "te-x.gz", "te-y", 3, 4, {1});
    CHECK_THROWS_MATCHING(
        loadData(s), ConfigError,
        Contains("data.test (" + dir.file("te-x.gz") + ") holds 1 examples of 3x4") &&
            Contains("data.train (" + dir.file("tr-x.gz")) && Contains("must agree"));
  }
  SECTION("bad values") {
    s.format = "parquet";
    CHECK_THROWS_MATCHING(loadData(s), ConfigError, Contains("data.format = 'parquet'"));
    s = idxSource(dir);
    s.shape = "28by28";
    CHECK_THROWS_MATCHING(loadData(s), ConfigError, Contains("data.shape = '28by28'"));
    s.shape = "0x9";
    CHECK_THROWS_AS(loadData(s), ConfigError);
    s = idxSource(dir);
    s.train = "";
    CHECK_THROWS_MATCHING(loadData(s), ConfigError, Contains("data.train is empty"));
    s = idxSource(dir);
    s.test_labels = "";
    CHECK_THROWS_MATCHING(loadData(s), ConfigError, Contains("data.test_labels is empty"));
  }
  SECTION("a CSV with a bad cell") {
    writeText(dir.file("t.csv"), "1,2\n0,x\n");
    s.format = "csv";
    s.train = "t.csv";
    s.test = "";
    CHECK_THROWS_MATCHING(loadData(s), IoError,
                          Contains("data.train: " + dir.file("t.csv") + ": line 2, column 2"));
  }
}

TEST_CASE("a client's subset: loadData's examples, shape and classes, only those picked",
          "[data]") {
  TempDir dir;
  // What each selector was shown: the classes decide a label-skewed split, and must be
  // loadData's (the simulator partitions what loadData gives).
  uint32_t train_seen = 0, test_seen = 0;
  const auto pick = [](std::vector<size_t> picks, uint32_t* seen) {
    return [picks, seen](const std::vector<uint8_t>&, uint32_t classes) {
      *seen = classes;
      return picks;
    };
  };
  // Kept once each, in file order, whatever order and repeats the picks have.
  const auto same = [](const Dataset& all, const Dataset& sub, const std::vector<size_t>& kept) {
    REQUIRE(sub.size() == kept.size());
    const size_t f = all.features();
    for (size_t i = 0; i < kept.size(); ++i) {
      CHECK(sub.labels[i] == all.labels[kept[i]]);
      CHECK(std::equal(sub.images.begin() + static_cast<ptrdiff_t>(i * f),
                       sub.images.begin() + static_cast<ptrdiff_t>((i + 1) * f),
                       all.images.begin() + static_cast<ptrdiff_t>(kept[i] * f)));
    }
  };
  SECTION("idx: the test split's extra class counts, as in loadData") {
    writeIdxPair(dir, "tr-x.gz", "tr-y", 4, 6, {0, 1, 2, 1, 0});
    writeIdxPair(dir, "te-x.gz", "te-y", 4, 6, {4, 0, 3});
    const DataSource s = idxSource(dir);
    const LoadedData all = loadData(s);
    const LoadedData sub = loadDataSubset(s, pick({3, 0, 3}, &train_seen), pick({2}, &test_seen));
    CHECK(train_seen == 5);
    CHECK(test_seen == 5);
    same(all.train, sub.train, {0, 3});
    REQUIRE(sub.test);
    same(*all.test, *sub.test, {2});
    CHECK(sub.train.num_classes == all.train.num_classes);
    CHECK(sub.train.rows == 4);
    CHECK(sub.train.cols == 6);
    CHECK(sub.train_path == all.train_path);
  }
  SECTION("csv, viewed as images, without a test split") {
    writeText(dir.file("train.csv"), "label,a,b,c,d\n3,1,2,3,4\n1,5,6,7,8\n0,9,9,9,9\n");
    DataSource s;
    s.format = "csv";
    s.train = dir.file("train.csv");
    s.test = "";
    s.shape = "2x2";
    const LoadedData all = loadData(s);
    bool test_called = false;
    const LoadedData sub = loadDataSubset(s, pick({2, 1}, &train_seen), [&](const auto&, uint32_t) {
      test_called = true;
      return std::vector<size_t>{};
    });
    CHECK_FALSE(test_called);
    CHECK_FALSE(sub.test);
    CHECK(train_seen == 4);
    same(all.train, sub.train, {1, 2});
    CHECK(sub.train.rows == 2);
    CHECK(sub.train.cols == 2);
  }
  SECTION("a pick past the file is an error, a missing file names its key") {
    writeIdxPair(dir, "tr-x.gz", "tr-y", 2, 2, {0, 1});
    writeIdxPair(dir, "te-x.gz", "te-y", 2, 2, {1});
    const DataSource s = idxSource(dir);
    CHECK_THROWS_AS(loadDataSubset(s, pick({2}, &train_seen), pick({}, &test_seen)),
                    InvalidArgument);
    DataSource missing = s;
    missing.test_labels = "nope";
    CHECK_THROWS_MATCHING(loadDataSubset(missing, pick({0}, &train_seen), pick({}, &test_seen)),
                          IoError, Contains("data.test_labels = 'nope'"));
  }
}

TEST_CASE("the shapes and classes of a data source without its examples", "[data]") {
  TempDir dir;
  writeIdxPair(dir, "tr-x.gz", "tr-y", 4, 6, {0, 1, 2, 1, 0});
  writeIdxPair(dir, "te-x.gz", "te-y", 4, 6, {4, 0, 3});
  const DataSource s = idxSource(dir);
  const LoadedData all = loadData(s), shapes = loadDataShapes(s);
  CHECK(shapes.train.size() == 0);
  CHECK(shapes.train.images.empty());
  CHECK(shapes.train.rows == all.train.rows);
  CHECK(shapes.train.cols == all.train.cols);
  CHECK(shapes.train.num_classes == 5);  // the test split's label 4 counts, as in loadData
  REQUIRE(shapes.test);
  CHECK(shapes.test->size() == 0);
  // The label file is still checked whole: a label at or past num_classes is an error.
  DataSource two = s;
  two.num_classes = 2;
  CHECK_THROWS_MATCHING(loadDataShapes(two), IoError, Contains("data.train_labels"));
}
