#pragma once
// Compressors are picked at run time by a spec string: a registered name, optionally followed by
// typed options, e.g. "topk:density=0.001,scope=global" or "acpsgd:rank=8". Unknown names,
// unknown keys and bad values are ConfigErrors that list what is accepted.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compression/compressor.h"
#include "core/options.h"

namespace starling::compression {

using CompressorSpec = Spec;

struct CompressorInfo {
  std::string name;
  std::string summary;
  std::string options;  // "key=default (meaning)", comma separated
};

// Every registered compressor, in a stable order.
const std::vector<CompressorInfo>& compressorCatalog();

std::unique_ptr<Compressor> makeCompressor(const CompressorSpec& spec);
std::unique_ptr<Compressor> makeCompressor(std::string_view spec);

}  // namespace starling::compression
