#pragma once
// Compressors are picked at run time by a spec string: a registered name, optionally followed by
// typed options, e.g. "topk:density=0.001,scope=global" or "acpsgd:rank=8". Unknown names,
// unknown keys and bad values are ConfigErrors that list what is accepted (core/registry.h).
#include <memory>
#include <string_view>

#include "compression/compressor.h"
#include "core/registry.h"

namespace starling::compression {

using CompressorRegistry = Registry<Compressor>;

// Every registered compressor, in a stable order.
const CompressorRegistry& compressors();

std::unique_ptr<Compressor> makeCompressor(const Spec& spec);
std::unique_ptr<Compressor> makeCompressor(std::string_view spec);

}  // namespace starling::compression
