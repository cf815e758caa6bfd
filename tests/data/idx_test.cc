#include "data/idx.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <limits>

#include "check_throws.h"
#include "core/error.h"
#include "data/idx_files.h"

using namespace starling;
using namespace starling::data;
using Catch::Matchers::Contains;
using starling::testing::TempDir;

namespace {

// 5 images of 3x4 whose pixels cover 0 and 255; labels use classes 0..3.
struct SmallSet {
  uint32_t n = 5, rows = 3, cols = 4;
  std::vector<uint8_t> pixels, labels{0, 3, 1, 3, 0};
  SmallSet() {
    for (uint32_t i = 0; i < n * rows * cols; ++i)
      pixels.push_back(static_cast<uint8_t>((i * 37) % 256));
    pixels[0] = 0;
    pixels[1] = 255;
  }
  std::vector<uint8_t> imageBytes() const { return testing::imageFileBytes(n, rows, cols, pixels); }
  std::vector<uint8_t> labelBytes() const { return testing::labelFileBytes(n, labels); }
};

void checkMatches(const Dataset& d, const SmallSet& s) {
  REQUIRE(d.size() == s.n);
  CHECK(d.rows == s.rows);
  CHECK(d.cols == s.cols);
  CHECK(d.features() == s.rows * s.cols);
  REQUIRE(d.images.size() == s.pixels.size());
  for (size_t i = 0; i < s.pixels.size(); ++i)
    REQUIRE(d.images[i] == static_cast<float>(s.pixels[i]) / 255.0f);
  CHECK(d.images[0] == 0.0f);
  CHECK(d.images[1] == 1.0f);
  CHECK(d.labels == s.labels);
}

// Loads images/labels written from the given bytes (plain files) and returns the error message.
std::string loadError(const std::vector<uint8_t>& images, const std::vector<uint8_t>& labels,
                      bool gzip_images = false) {
  TempDir dir;
  const std::string ip = dir.file(gzip_images ? "img.gz" : "img"), lp = dir.file("lbl");
  gzip_images ? testing::writeGzip(ip, images) : testing::writePlain(ip, images);
  testing::writePlain(lp, labels);
  try {
    loadIdx(ip, lp);
  } catch (const IoError& e) {
    return e.what();
  }
  FAIL("loadIdx accepted a malformed file");
  return {};
}

}  // namespace

TEST_CASE("IDX files round trip, plain and gzip", "[data]") {
  const SmallSet s;
  TempDir dir;
  testing::writePlain(dir.file("img"), s.imageBytes());
  testing::writePlain(dir.file("lbl"), s.labelBytes());
  testing::writeGzip(dir.file("img.gz"), s.imageBytes());
  testing::writeGzip(dir.file("lbl.gz"), s.labelBytes());
  // The format is told by content, not by the file name.
  testing::writeGzip(dir.file("img-gz-without-suffix"), s.imageBytes());

  for (const auto& [ip, lp] :
       std::vector<std::pair<std::string, std::string>>{{"img", "lbl"},
                                                        {"img.gz", "lbl.gz"},
                                                        {"img.gz", "lbl"},
                                                        {"img-gz-without-suffix", "lbl.gz"}}) {
    INFO(ip << " + " << lp);
    const Dataset d = loadIdx(dir.file(ip), dir.file(lp));
    checkMatches(d, s);
    CHECK(d.num_classes == 4);  // largest label + 1
  }
}

TEST_CASE("a subset holds exactly the picked examples of the whole file, once each, in file order",
          "[data]") {
  // A deployed client's shard: the same rows and labels the whole load has at those
  // indices, whatever the file's compression and the order or repeats of the picks.
  const SmallSet s;
  TempDir dir;
  testing::writeGzip(dir.file("img.gz"), s.imageBytes());
  testing::writePlain(dir.file("lbl"), s.labelBytes());
  const Dataset all = loadIdx(dir.file("img.gz"), dir.file("lbl"));
  std::vector<uint8_t> seen_labels;
  uint32_t seen_classes = 0;
  const Dataset sub = loadIdxSubset(
      dir.file("img.gz"), dir.file("lbl"), [&](const std::vector<uint8_t>& l, uint32_t c) {
        seen_labels = l;
        seen_classes = c;
        return std::vector<size_t>{4, 1, 4, 3};  // out of order, 4 twice
      });
  CHECK(seen_labels == all.labels);  // the selector sees every label
  CHECK(seen_classes == all.num_classes);
  CHECK(sub.num_classes == all.num_classes);
  CHECK(sub.rows == all.rows);
  CHECK(sub.cols == all.cols);
  CHECK(sub.shape == all.shape);
  const std::vector<size_t> want{1, 3, 4};
  REQUIRE(sub.size() == want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    INFO("kept example " << k);
    CHECK(sub.labels[k] == all.labels[want[k]]);
    const auto row = [&](const Dataset& d, size_t i) {
      return std::vector<float>(d.images.begin() + static_cast<ptrdiff_t>(i * d.features()),
                                d.images.begin() + static_cast<ptrdiff_t>((i + 1) * d.features()));
    };
    CHECK(row(sub, k) == row(all, want[k]));
  }
  // A view through subsetPositions names, over the subset, exactly what the picks named over the
  // whole file, in order and with the repeat.
  const std::vector<size_t> picks{4, 1, 4, 3};
  const std::vector<size_t> at = subsetPositions(picks);
  REQUIRE(at.size() == picks.size());
  for (size_t i = 0; i < picks.size(); ++i) {
    INFO("pick " << i);
    CHECK(sub.labels[at[i]] == all.labels[picks[i]]);
    CHECK(std::equal(sub.images.begin() + static_cast<ptrdiff_t>(at[i] * sub.features()),
                     sub.images.begin() + static_cast<ptrdiff_t>((at[i] + 1) * sub.features()),
                     all.images.begin() + static_cast<ptrdiff_t>(picks[i] * all.features())));
  }
  CHECK(at == std::vector<size_t>{2, 0, 2, 1});
  // Nothing picked: an empty data set of the file's shape; a pick past the file: InvalidArgument.
  CHECK(loadIdxSubset(dir.file("img.gz"), dir.file("lbl"), [](auto&, auto) {
          return std::vector<size_t>{};
        }).size() == 0);
  CHECK_THROWS_MATCHING(loadIdxSubset(dir.file("img.gz"), dir.file("lbl"),
                                      [](auto&, auto) { return std::vector<size_t>{5}; }),
                        InvalidArgument, Contains("example 5 picked from a file of 5"));
  // The whole file is still checked: a truncated image body fails even when only its head is kept.
  auto cut = s.imageBytes();
  cut.resize(cut.size() - 3);
  testing::writePlain(dir.file("cut"), cut);
  CHECK_THROWS_MATCHING(loadIdxSubset(dir.file("cut"), dir.file("lbl"),
                                      [](auto&, auto) { return std::vector<size_t>{0}; }),
                        IoError, Contains("truncated"));
}

TEST_CASE("a known number of classes is kept and enforced", "[data]") {
  const SmallSet s;
  TempDir dir;
  testing::writePlain(dir.file("img"), s.imageBytes());
  testing::writePlain(dir.file("lbl"), s.labelBytes());
  CHECK(loadIdx(dir.file("img"), dir.file("lbl"), IdxOptions{.num_classes = 10}).num_classes == 10);
  CHECK_THROWS_MATCHING(loadIdx(dir.file("img"), dir.file("lbl"), IdxOptions{.num_classes = 3}),
                        IoError, Contains("label 3 of example 1") && Contains(dir.file("lbl")));
  CHECK_THROWS_AS(loadIdx(dir.file("img"), dir.file("lbl"), IdxOptions{.num_classes = 257}),
                  InvalidArgument);
}

TEST_CASE("malformed IDX files are rejected with the problem named", "[data]") {
  const SmallSet s;
  const auto img = s.imageBytes(), lbl = s.labelBytes();

  SECTION("wrong magic") {
    // Type code 0x0a is no IDX type, and the first two bytes must be zero.
    CHECK_THAT(loadError(testing::imageFileBytes(s.n, s.rows, s.cols, s.pixels, 0x00000a03), lbl),
               Contains("wrong magic number 0x00000a03") && Contains("type code"));
    CHECK_THAT(loadError(testing::imageFileBytes(s.n, s.rows, s.cols, s.pixels, 0x01000803), lbl),
               Contains("wrong magic number 0x01000803"));
    CHECK_THAT(loadError(testing::imageFileBytes(s.n, s.rows, s.cols, s.pixels, 0x00000800), lbl),
               Contains("wrong magic"));
    CHECK_THAT(loadError(img, testing::labelFileBytes(s.n, s.labels, 0x00000803)),
               Contains("wrong magic") && Contains("this is an image file"));
    CHECK_THAT(loadError(lbl, img), Contains("wrong magic") && Contains("this is a label file"));
    // Labels must be integers.
    CHECK_THAT(loadError(img, testing::labelFileBytes(s.n, s.labels, 0x00000d01)),
               Contains("wrong magic number 0x00000d01") && Contains("floating-point"));
    // A gzip stream compressed twice starts with gzip's own magic after one decompression.
    CHECK_THAT(loadError(testing::gzipBytes(img), lbl, true), Contains("gzip-compressed"));
  }
  SECTION("shorter than the header") {
    CHECK_THAT(loadError({0, 0, 8, 3, 0, 0}, lbl), Contains("truncated") && Contains("header"));
    CHECK_THAT(loadError({}, lbl), Contains("truncated"));
  }
  SECTION("header announces more than the file holds") {
    auto cut = img;
    cut.pop_back();
    CHECK_THAT(loadError(cut, lbl), Contains("truncated") && Contains("5 images") &&
                                        Contains("needs 60 bytes") && Contains("only 59 remain"));
    CHECK_THAT(loadError(img, testing::labelFileBytes(s.n, {0, 1, 2})),
               Contains("truncated") && Contains("5 labels"));
  }
  SECTION("header announces less than the file holds") {
    auto more = img;
    more.insert(more.end(), 7, 0);
    CHECK_THAT(loadError(more, lbl),
               Contains("7 bytes follow") && Contains("does not match the file size"));
    CHECK_THAT(loadError(img, testing::labelFileBytes(s.n, {0, 1, 2, 1, 0, 1})),
               Contains("1 bytes follow"));
  }
  SECTION("image and label counts differ") {
    CHECK_THAT(loadError(img, testing::labelFileBytes(4, {0, 1, 2, 1})),
               Contains("announces 5 images but") && Contains("announces 4 labels"));
  }
  SECTION("empty or zero-sized images") {
    CHECK_THAT(loadError(testing::imageFileBytes(0, 3, 4, {}), testing::labelFileBytes(0, {})),
               Contains("0 images"));
    CHECK_THAT(loadError(testing::imageFileBytes(5, 0, 4, {}), lbl),
               Contains("images of 0x4 pixels"));
  }
  SECTION("hostile dimensions are refused before anything is read") {
    // rows * cols = (2^32 - 1)^2 and n * rows * cols overflows 64 bits.
    CHECK_THAT(loadError(testing::imageFileBytes(0xffffffffu, 0xffffffffu, 0xffffffffu, {}), lbl),
               Contains("more than the limit"));
    // Each image is plausible, the count is not: 2^32 - 1 images of 28x28.
    CHECK_THAT(loadError(testing::imageFileBytes(0xffffffffu, 28, 28, {}),
                         testing::labelFileBytes(0xffffffffu, {})),
               Contains("4294967295 images of 28x28") && Contains("more than the limit"));
  }
  SECTION("a lying header inside a gzip stream") {
    CHECK_THAT(loadError(testing::imageFileBytes(60000, 28, 28, s.pixels),
                         testing::labelFileBytes(60000, s.labels), true),
               Contains("truncated") && Contains("60000 images"));
  }
}

TEST_CASE("keep_bytes keeps an unsigned-byte file's values as bytes, other types as floats",
          "[data]") {
  const SmallSet s;
  TempDir dir;
  testing::writeGzip(dir.file("img.gz"), s.imageBytes());
  testing::writePlain(dir.file("lbl"), s.labelBytes());
  const Dataset floats = loadIdx(dir.file("img.gz"), dir.file("lbl"));
  const Dataset bytes =
      loadIdx(dir.file("img.gz"), dir.file("lbl"), IdxOptions{.keep_bytes = true});
  CHECK(bytes.holdsBytes());
  CHECK_FALSE(floats.holdsBytes());
  CHECK(bytes.images.empty());
  CHECK(bytes.pixels == s.pixels);
  REQUIRE(bytes.pixels.size() == floats.images.size());
  for (size_t i = 0; i < bytes.pixels.size(); ++i)  // the float loader's values, exactly
    REQUIRE(static_cast<float>(bytes.pixels[i]) / 255.0f == floats.images[i]);
  CHECK(bytes.labels == floats.labels);
  CHECK(bytes.rows == floats.rows);
  CHECK(bytes.cols == floats.cols);
  CHECK(bytes.shape == floats.shape);
  CHECK(bytes.num_classes == floats.num_classes);
  // A float32 file has no bytes to keep.
  testing::writePlain(dir.file("lbl3"), testing::labelFileBytes(3, {2, 0, 1}));
  const std::vector<float> v{0.5f, -1.25f, 3.0f, 0.0f, 1.0f, 7.0f};
  testing::writePlain(dir.file("f32"),
                      testing::idxFileBytes(0x00000d02, {3, 2}, testing::bigEndianBytes(v)));
  const Dataset f = loadIdx(dir.file("f32"), dir.file("lbl3"), IdxOptions{.keep_bytes = true});
  CHECK_FALSE(f.holdsBytes());
  CHECK(f.images == v);
}

TEST_CASE("IDX features of any type and shape load as floats", "[data]") {
  TempDir dir;
  const std::vector<uint8_t> labels{2, 0, 1};
  testing::writePlain(dir.file("lbl"), testing::labelFileBytes(3, labels));
  const auto load = [&](uint32_t magic, const std::vector<uint32_t>& dims,
                        const std::vector<uint8_t>& body) {
    testing::writeGzip(dir.file("x.gz"), testing::idxFileBytes(magic, dims, body));
    return loadIdx(dir.file("x.gz"), dir.file("lbl"));
  };
  SECTION("float32, 3 examples of 2 features (n x features)") {
    const std::vector<float> v{0.5f, -1.25f, 3e10f, -0.0f, 1e-20f, 7.0f};
    const Dataset d = load(0x00000d02, {3, 2}, testing::bigEndianBytes(v));
    CHECK(d.images == v);  // taken as they are, not scaled
    CHECK(d.rows == 1);
    CHECK(d.cols == 2);
    CHECK(d.shape == std::vector<size_t>{2});
    CHECK(d.labels == labels);
    CHECK(d.num_classes == 3);
  }
  SECTION("float64, int32, int16 and signed bytes") {
    const std::vector<double> f64{1.5, -2.0, 1e30, 0.25, -7.0, 8.0};
    CHECK(load(0x00000e02, {3, 2}, testing::bigEndianBytes(f64)).images ==
          std::vector<float>(f64.begin(), f64.end()));
    const std::vector<int32_t> i32{-100000, 5, 16777216, 0, -1, 2};
    CHECK(load(0x00000c02, {3, 2}, testing::bigEndianBytes(i32)).images ==
          std::vector<float>(i32.begin(), i32.end()));
    const std::vector<int16_t> i16{-32768, 32767, 0, -1, 1, 300};
    CHECK(load(0x00000b02, {3, 2}, testing::bigEndianBytes(i16)).images ==
          std::vector<float>(i16.begin(), i16.end()));
    const std::vector<int8_t> i8{-128, 127, 0, -1, 1, 3};
    CHECK(load(0x00000902, {3, 2}, testing::bigEndianBytes(i8)).images ==
          std::vector<float>(i8.begin(), i8.end()));
  }
  SECTION("dimensions of size 1 are dropped to find the image; more than two dimensions are flat") {
    std::vector<uint8_t> px(3 * 2 * 5);
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 8);
    const Dataset chw = load(0x00000804, {3, 1, 2, 5}, px);  // n x 1 channel x 2 x 5
    CHECK(chw.rows == 2);
    CHECK(chw.cols == 5);
    CHECK(chw.shape == std::vector<size_t>{1, 2, 5});
    CHECK(chw.images[9] == 72.0f / 255.0f);  // unsigned bytes are pixels: / 255
    const Dataset hwc = load(0x00000804, {3, 2, 5, 1}, px);
    CHECK(hwc.rows == 2);
    CHECK(hwc.cols == 5);
    const Dataset rgb = load(0x00000804, {3, 5, 1, 2}, px);
    CHECK(rgb.rows == 5);
    CHECK(rgb.cols == 2);
    std::vector<uint8_t> px3(3 * 24, 9);
    const Dataset cube = load(0x00000804, {3, 2, 3, 4}, px3);
    CHECK(cube.rows == 1);
    CHECK(cube.cols == 24);
    CHECK(cube.features() == 24);
    CHECK(cube.shape == std::vector<size_t>{2, 3, 4});
  }
  SECTION("non-finite or out-of-range values are refused") {
    const std::vector<float> nan{1.0f, std::numeric_limits<float>::quiet_NaN(), 0, 0, 0, 0};
    CHECK_THROWS_MATCHING(
        load(0x00000d02, {3, 2}, testing::bigEndianBytes(nan)), IoError,
        Contains("x.gz") && Contains("example 0, feature 1") && Contains("not a finite float"));
    const std::vector<double> big{0, 0, 0, 0, 0, 1e300};
    CHECK_THROWS_MATCHING(load(0x00000e02, {3, 2}, testing::bigEndianBytes(big)), IoError,
                          Contains("example 2, feature 1"));
  }
  SECTION("the body's size follows the type") {
    const std::vector<float> two{1.0f, 2.0f};
    CHECK_THROWS_MATCHING(load(0x00000d02, {3, 2}, testing::bigEndianBytes(two)), IoError,
                          Contains("truncated") && Contains("needs 24 bytes"));
  }
  SECTION("too many dimensions") {
    CHECK_THROWS_MATCHING(load(0x00000809, {3, 1, 1, 1, 1, 1, 1, 1, 1}, {1, 2, 3}), IoError,
                          Contains("9 dimensions") && Contains("limit"));
  }
}

TEST_CASE("IDX labels of wider integer types are checked against 0..255", "[data]") {
  const SmallSet s;
  TempDir dir;
  testing::writePlain(dir.file("img"), s.imageBytes());
  const auto labels = [&](uint32_t magic, const std::vector<uint8_t>& body) {
    testing::writePlain(dir.file("lbl"), testing::idxFileBytes(magic, {s.n}, body));
    return loadIdx(dir.file("img"), dir.file("lbl"));
  };
  const std::vector<int32_t> ok{0, 3, 255, 3, 0};
  const Dataset d = labels(0x00000c01, testing::bigEndianBytes(ok));
  CHECK(d.labels == std::vector<uint8_t>{0, 3, 255, 3, 0});
  CHECK(d.num_classes == 256);
  CHECK_THROWS_MATCHING(
      labels(0x00000c01, testing::bigEndianBytes(std::vector<int32_t>{0, 1, 256, 1, 0})), IoError,
      Contains("label 256 of example 2") && Contains("above 255"));
  CHECK_THROWS_MATCHING(
      labels(0x00000b01, testing::bigEndianBytes(std::vector<int16_t>{0, 1, 2, -3, 0})), IoError,
      Contains("label -3 of example 3 is negative"));
  CHECK_THROWS_MATCHING(
      labels(0x00000901, testing::bigEndianBytes(std::vector<int8_t>{0, -1, 2, 3, 0})), IoError,
      Contains("label -1 of example 1 is negative") && Contains(dir.file("lbl")));
}

TEST_CASE("damaged gzip streams are rejected", "[data]") {
  const SmallSet s;
  TempDir dir;
  const auto gz = testing::gzipBytes(s.imageBytes());
  testing::writePlain(dir.file("lbl"), s.labelBytes());

  // Cut inside the compressed data and just before the trailer (CRC, size).
  for (size_t keep : {gz.size() / 2, gz.size() - 4}) {
    INFO("kept " << keep << " of " << gz.size() << " bytes");
    testing::writePlain(dir.file("img.gz"),
                        std::vector<uint8_t>(gz.begin(), gz.begin() + static_cast<long>(keep)));
    CHECK_THROWS_MATCHING(
        loadIdx(dir.file("img.gz"), dir.file("lbl")), IoError,
        Contains(dir.file("img.gz")) && (Contains("truncated") || Contains("gzip")));
  }
  // A flipped bit in the deflate data: the stream no longer decodes or fails its CRC.
  auto bad = gz;
  bad[gz.size() - 12] ^= 0x10;
  testing::writePlain(dir.file("img.gz"), bad);
  CHECK_THROWS_MATCHING(loadIdx(dir.file("img.gz"), dir.file("lbl")), IoError, Contains("gzip"));
  // The CRC itself corrupted: the data decodes but does not check.
  bad = gz;
  bad[gz.size() - 8] ^= 0xff;
  testing::writePlain(dir.file("img.gz"), bad);
  CHECK_THROWS_MATCHING(loadIdx(dir.file("img.gz"), dir.file("lbl")), IoError,
                        Contains("corrupt gzip stream") && Contains("incorrect data check"));
}

TEST_CASE("missing files say what is missing", "[data]") {
  TempDir dir;
  const SmallSet s;
  testing::writePlain(dir.file("lbl"), s.labelBytes());
  CHECK_THROWS_MATCHING(loadIdx(dir.file("nope"), dir.file("lbl")), IoError,
                        Contains(dir.file("nope")) && Contains("no such file"));
  CHECK_THROWS_MATCHING(loadIdx(dir.path().string(), dir.file("lbl")), IoError,
                        Contains("is a directory"));

  CHECK_THROWS_MATCHING(loadFashionMnist(dir.file("no-such-folder"), "train"), IoError,
                        Contains("Fashion-MNIST not found") && Contains("dataset-fashion-mnist") &&
                            Contains("--data-dir") && Contains("train-images-idx3-ubyte.gz"));
  CHECK_THROWS_MATCHING(loadFashionMnist(dir.path().string(), "t10k"), IoError,
                        Contains("t10k-images-idx3-ubyte.gz does not exist"));
  CHECK_THROWS_AS(loadFashionMnist(dir.path().string(), "validation"), InvalidArgument);
}

TEST_CASE("Fashion-MNIST files unpacked without .gz are found too", "[data]") {
  TempDir dir;
  std::vector<uint8_t> pixels(2 * 28 * 28, 7);
  testing::writePlain(dir.file("t10k-images-idx3-ubyte"),
                      testing::imageFileBytes(2, 28, 28, pixels));
  testing::writeGzip(dir.file("t10k-labels-idx1-ubyte.gz"), testing::labelFileBytes(2, {9, 0}));
  const Dataset d = loadFashionMnist(dir.path().string(), "t10k");
  CHECK(d.size() == 2);
  CHECK(d.num_classes == 10);
}

TEST_CASE("the installed Fashion-MNIST test split loads", "[data]") {
  // make test installs it (scripts/bootstrap.sh); the learning tests need it too.
  INFO(kDefaultFashionMnistDir << ": the Debian package dataset-fashion-mnist");
  REQUIRE(std::filesystem::exists(kDefaultFashionMnistDir));
  const Dataset d = loadFashionMnist(kDefaultFashionMnistDir, "t10k");
  CHECK(d.size() == 10000);
  CHECK(d.rows == 28);
  CHECK(d.cols == 28);
  CHECK(d.num_classes == 10);
  CHECK(d.images.size() == 10000u * 784u);
  const auto [lo, hi] = std::minmax_element(d.images.begin(), d.images.end());
  CHECK(*lo == 0.0f);
  CHECK(*hi == 1.0f);
  std::vector<size_t> count(10);
  for (uint8_t y : d.labels) ++count.at(y);
  for (size_t c : count) CHECK(c == 1000);  // the test split is balanced
}
