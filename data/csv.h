#pragma once
// Labelled data sets as CSV text, the simplest format to bring one's own data in: one example per
// line, the label first, then the features.
//
//   label,f1,f2,...        an optional header line: the first line is a header when its first
//   3,0.0,0.5,...          cell is not a number (it is skipped, but must have as many cells)
//   0,1.25,-2,...
//
// - Cells are separated by ','; spaces and tabs around a cell are ignored; lines end in "\n" or
//   "\r\n"; blank lines are skipped. No quoting (cells are numbers).
// - The label is a whole number 0..255 ("3" or "3.0"); the number of classes is the largest label
//   + 1 unless CsvOptions::num_classes gives it (then a label >= it is an error).
// - The features are decimal numbers ("0.5", "-2", "1e-3"), finite and within float range, taken
//   as they are (no scaling). Every line has the same number of cells as the first example, at
//   least 2; the feature count is that number - 1. The examples are flat: rows = 1, cols = the
//   feature count (a program may view them as an image when rows x cols is that count).
// - The file may be gzip-compressed (told by content, not by name).
//
// Every problem is an IoError that starts with the path and names the line (and column): a
// missing file, a non-numeric cell, a label out of range, a line with another number of cells, a
// file without examples, a truncated gzip stream. Memory follows the bytes read.
#include <cstdint>
#include <string>

#include "data/idx.h"

namespace starling::data {

struct CsvOptions {
  // 0: num_classes = largest label + 1. Otherwise the number of classes; a label >= it is an
  // IoError. At most 256.
  uint32_t num_classes = 0;
  // Largest number of feature values (examples x features) accepted, <= kMaxIdxPixels.
  uint64_t max_values = kMaxIdxPixels;
};

// Throws IoError (with the path and line) for a bad file, InvalidArgument for bad options.
Dataset loadCsv(const std::string& path, const CsvOptions& options = {});

}  // namespace starling::data
