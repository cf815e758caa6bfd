#include "data/csv.h"

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

std::vector<uint8_t> bytesOf(const std::string& text) { return {text.begin(), text.end()}; }

// The IoError loadCsv throws for a file holding `text`.
std::string csvError(const std::string& text, const CsvOptions& o = {}) {
  TempDir dir;
  writeText(dir.file("d.csv"), text);
  try {
    loadCsv(dir.file("d.csv"), o);
  } catch (const IoError& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Contains(dir.file("d.csv")));  // every message names the file
    return what;
  }
  FAIL("loadCsv accepted " << text);
  return {};
}

}  // namespace

TEST_CASE("CSV rows load as label then features, with or without a header", "[data]") {
  TempDir dir;
  const std::string body = "2,0.5,-1,1e-3\n0,+4,0,2.25\n1,7,8,9\n";
  writeText(dir.file("plain.csv"), body);
  writeText(dir.file("header.csv"), "label,f1,f2,f3\n" + body);
  // Windows line ends, blank lines, spaces around cells, no newline at the end, "3.0" labels.
  writeText(dir.file("messy.csv"),
            "label , a , b , c\r\n\r\n 2.0 , 0.5 ,-1, 1e-3\r\n   \n0,+4,0,2.25\r\n1,7,8,9");
  testing::writeGzip(dir.file("packed.csv.gz"), bytesOf(body));
  testing::writeGzip(dir.file("packed-without-suffix"), bytesOf(body));
  for (const char* name :
       {"plain.csv", "header.csv", "messy.csv", "packed.csv.gz", "packed-without-suffix"}) {
    INFO(name);
    const Dataset d = loadCsv(dir.file(name));
    REQUIRE(d.size() == 3);
    CHECK(d.labels == std::vector<uint8_t>{2, 0, 1});
    CHECK(d.images == std::vector<float>{0.5f, -1.0f, 1e-3f, 4.0f, 0.0f, 2.25f, 7.0f, 8.0f, 9.0f});
    CHECK(d.features() == 3);
    CHECK(d.rows == 1);
    CHECK(d.cols == 3);
    CHECK(d.shape == std::vector<size_t>{3});
    CHECK(d.num_classes == 3);
  }
  // A known number of classes is kept, even above the largest label.
  CHECK(loadCsv(dir.file("plain.csv"), CsvOptions{.num_classes = 10}).num_classes == 10);
}

TEST_CASE("a large CSV file spanning many read chunks loads every line", "[data]") {
  TempDir dir;
  std::string text = "y";
  for (int f = 0; f < 50; ++f) text.append(",x").append(std::to_string(f));
  text += "\n";
  const int lines = 3000;  // about 450 KB: lines cross the 64 KiB read chunks
  for (int i = 0; i < lines; ++i) {
    text += std::to_string(i % 7);
    for (int f = 0; f < 50; ++f) text.append(",").append(std::to_string(i * 50 + f)).append(".5");
    text += "\n";
  }
  writeText(dir.file("big.csv"), text);
  const Dataset d = loadCsv(dir.file("big.csv"));
  REQUIRE(d.size() == static_cast<size_t>(lines));
  CHECK(d.features() == 50);
  CHECK(d.num_classes == 7);
  for (int i = 0; i < lines; i += 97) {
    CHECK(d.labels[i] == i % 7);
    CHECK(d.images[static_cast<size_t>(i) * 50 + 49] == static_cast<float>(i * 50 + 49) + 0.5f);
  }
}

TEST_CASE("malformed CSV files are rejected naming the line and column", "[data]") {
  CHECK_THAT(csvError("1,2,3\n0,4,five\n"),
             Contains("line 2, column 3") && Contains("'five' is not a number"));
  CHECK_THAT(csvError("label,a\n1,2\n0,\n"),
             Contains("line 3, column 2") && Contains("'' is not a number"));
  CHECK_THAT(csvError("1,2,3\n0,4\n"),
             Contains("line 2 has 2 cells") && Contains("line 1 (the first example) has 3"));
  CHECK_THAT(csvError("1,2,3\n0,4,5,6\n"), Contains("line 2 has 4 cells"));
  CHECK_THAT(csvError("a,b,c,d\n1,2,3\n"),
             Contains("the header (line 1) has 4 cells") && Contains("has 3"));
  CHECK_THAT(csvError("1\n2\n"), Contains("line 1 has 1 cell"));
  CHECK_THAT(csvError("1,2\n1,3\nx,4\n"),
             Contains("line 3, column 1") && Contains("label 'x' is not a number"));
  CHECK_THAT(csvError("1,2\n2.5,3\n"),
             Contains("line 2, column 1") && Contains("'2.5' is not a whole number"));
  CHECK_THAT(csvError("1,2\n-1,3\n"), Contains("'-1' is not a whole number in 0..255"));
  CHECK_THAT(csvError("1,2\n256,3\n"), Contains("'256'"));
  CHECK_THAT(csvError("1,2\n5,3\n", CsvOptions{.num_classes = 5}),
             Contains("line 2, column 1") && Contains("not below the number of classes, 5"));
  CHECK_THAT(csvError("1,nan\n"), Contains("line 1, column 2") && Contains("not a finite number"));
  CHECK_THAT(csvError("1,2\n1,1e40\n"), Contains("line 2, column 2") && Contains("float range"));
  CHECK_THAT(csvError("1,2\n1,inf\n"), Contains("not a finite number"));
  CHECK_THAT(csvError("1,2 3\n"), Contains("'2 3' is not a number"));
  CHECK_THAT(csvError(""), Contains("no examples"));
  CHECK_THAT(csvError("label,a,b\n\n"), Contains("no examples"));
  CHECK_THAT(csvError("1,2\n", CsvOptions{.max_values = 0}), Contains("limit of 0"));
}

TEST_CASE("CSV file-level faults: missing, a directory, truncated gzip", "[data]") {
  TempDir dir;
  CHECK_THROWS_MATCHING(loadCsv(dir.file("nope.csv")), IoError,
                        Contains(dir.file("nope.csv")) && Contains("no such file"));
  CHECK_THROWS_MATCHING(loadCsv(dir.path().string()), IoError, Contains("is a directory"));
  std::string text;
  for (int i = 0; i < 2000; ++i) text.append(std::to_string(i % 3)).append(",1,2,3\n");
  const auto gz = testing::gzipBytes(bytesOf(text));
  testing::writePlain(dir.file("cut.csv.gz"), std::vector<uint8_t>(gz.begin(), gz.end() - 6));
  CHECK_THROWS_MATCHING(loadCsv(dir.file("cut.csv.gz")), IoError,
                        Contains(dir.file("cut.csv.gz")) && Contains("gzip"));
  CHECK_THROWS_AS(loadCsv(dir.file("x"), CsvOptions{.num_classes = 300}), InvalidArgument);
}
