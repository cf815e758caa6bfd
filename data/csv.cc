#include "data/csv.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "data/gz_file.h"

namespace starling::data {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// The whole cell as a number, or nothing (empty, trailing characters, not a number at all).
std::optional<double> parseNumber(std::string_view cell) {
  if (!cell.empty() && cell.front() == '+') cell.remove_prefix(1);  // from_chars refuses '+'
  double v = 0;
  const auto [end, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), v);
  if (cell.empty() || end != cell.data() + cell.size()) return std::nullopt;
  if (ec == std::errc::result_out_of_range) return std::numeric_limits<double>::infinity();
  if (ec != std::errc()) return std::nullopt;
  return v;
}

// Shown in a message: at most 40 characters of a cell.
std::string quote(std::string_view cell) {
  std::string q = "'";
  q.append(cell.substr(0, 40));
  q.append(cell.size() > 40 ? "...'" : "'");
  return q;
}

class Parser {
 public:
  Parser(std::string path, const CsvOptions& o) : path_(std::move(path)), o_(o) {}

  void line(std::string_view text) {
    ++line_no_;
    if (trim(text).empty()) return;
    cells_.clear();
    for (size_t start = 0;;) {
      const size_t comma = text.find(',', start);
      cells_.push_back(
          trim(text.substr(start, comma == std::string_view::npos ? comma : comma - start)));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (!seen_first_) {
      seen_first_ = true;
      if (!parseNumber(cells_[0])) {  // a header: its first cell is a name
        header_line_ = line_no_;
        header_cells_ = cells_.size();
        return;
      }
    }
    if (width_ == 0) {
      width_ = cells_.size();
      first_line_ = line_no_;
      if (width_ < 2)
        fail("has 1 cell; a line is label,feature1,feature2,... (at least one feature)");
      if (width_ - 1 > kMaxIdxFeatures)
        fail("has ", width_ - 1, " features, more than the limit of ", kMaxIdxFeatures);
      if (header_cells_ != 0 && header_cells_ != width_)
        STARLING_THROW(IoError, path_, ": the header (line ", header_line_, ") has ", header_cells_,
                       " cells but line ", line_no_, ", the first example, has ", width_);
    }
    if (cells_.size() != width_)
      fail("has ", cells_.size(), " cells, line ", first_line_, " (the first example) has ", width_,
           "; every line is label,feature1,...,feature", width_ - 1);
    if (d_.images.size() + (width_ - 1) > o_.max_values)
      fail("is past the limit of ", o_.max_values, " feature values in all");
    label(cells_[0]);
    for (size_t c = 1; c < width_; ++c) {
      const auto v = parseNumber(cells_[c]);
      if (!v) failAt(c, quote(cells_[c]), " is not a number");
      if (!std::isfinite(*v) || std::fabs(*v) > std::numeric_limits<float>::max())
        failAt(c, quote(cells_[c]), " is not a finite number within float range");
      d_.images.push_back(static_cast<float>(*v));
    }
  }

  Dataset finish() {
    if (d_.labels.empty())
      STARLING_THROW(IoError, path_, ": no examples (", line_no_,
                     " lines, none of them label,feature1,...)");
    const uint8_t top = *std::max_element(d_.labels.begin(), d_.labels.end());
    d_.num_classes = o_.num_classes != 0 ? o_.num_classes : uint32_t{top} + 1;
    d_.rows = 1;
    d_.cols = width_ - 1;
    d_.shape = {width_ - 1};
    d_.images.shrink_to_fit();
    d_.labels.shrink_to_fit();
    return std::move(d_);
  }

 private:
  void label(std::string_view cell) {
    const auto y = parseNumber(cell);
    if (!y) failAt(0, "the label ", quote(cell), " is not a number");
    if (!(*y >= 0 && *y <= 255 && *y == std::floor(*y)))
      failAt(0, "the label ", quote(cell),
             " is not a whole number in 0..255 (at most 256 classes)");
    if (o_.num_classes != 0 && *y >= o_.num_classes)
      failAt(0, "the label ", quote(cell), " is not below the number of classes, ", o_.num_classes);
    d_.labels.push_back(static_cast<uint8_t>(*y));
  }

  template <class... Args>
  [[noreturn]] void fail(Args&&... args) const {
    STARLING_THROW(IoError, path_, ": line ", line_no_, " ", std::forward<Args>(args)...);
  }
  template <class... Args>
  [[noreturn]] void failAt(size_t column, Args&&... args) const {
    STARLING_THROW(IoError, path_, ": line ", line_no_, ", column ", column + 1, ": ",
                   std::forward<Args>(args)...);
  }

  std::string path_;
  CsvOptions o_;
  Dataset d_;
  std::vector<std::string_view> cells_;
  uint64_t line_no_ = 0, header_line_ = 0, first_line_ = 0;
  size_t header_cells_ = 0, width_ = 0;
  bool seen_first_ = false;
};

}  // namespace

Dataset loadCsv(const std::string& path, const CsvOptions& options) {
  STARLING_CHECK_ARG(options.num_classes <= 256, "loadCsv: num_classes ", options.num_classes,
                     " is more than 256 (labels are bytes)");
  STARLING_CHECK_ARG(options.max_values <= kMaxIdxPixels, "loadCsv: max_values ",
                     options.max_values, " is over the limit ", kMaxIdxPixels);
  detail::GzFile f(path);
  Parser p(path, options);
  std::string pending;  // the bytes after the last complete line
  std::vector<uint8_t> chunk(detail::kReadChunk);
  for (;;) {
    const size_t got = f.read(chunk.data(), chunk.size());
    const size_t old = pending.size();  // holds no newline: search only the new bytes
    pending.append(reinterpret_cast<const char*>(chunk.data()), got);
    size_t start = 0;
    for (size_t nl = pending.find('\n', old); nl != std::string::npos;
         nl = pending.find('\n', start)) {
      p.line(std::string_view(pending).substr(start, nl - start));
      start = nl + 1;
    }
    pending.erase(0, start);
    if (got < chunk.size()) break;
  }
  if (const std::string why = f.endState(); !why.empty()) STARLING_THROW(IoError, path, ": ", why);
  if (!pending.empty()) p.line(pending);  // the last line without its newline
  return p.finish();
}

}  // namespace starling::data
